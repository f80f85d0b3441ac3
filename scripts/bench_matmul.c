/*
 * bench_matmul.c - one quantized matrix product through kern_matmul by its
 * three paths, at several batch sizes (a benchmark, not a test): q-panels
 * (what a loaded model uses), integer row dots over the GGUF rows, and
 * dequantized weight tiles into OpenBLAS sgemm. Random weights, best of
 * several runs; the matrix stays in the caches, so the figures are the
 * kernels' speed, not the memory's.
 *
 * usage: bench_matmul [threads] [type] [k] [n] [tokens,tokens,...] [copies]
 *   defaults: 2 q8_0 2048 2048 1,4,16,64,256,512 1
 * With copies > 1 the q-panel products also run over that many copies of
 * the matrix in turn (a decode-like stream from memory when their total
 * exceeds the caches) and print ms per product and GB/s.
 * Prints a markdown table: tokens, ms per product for each path, and the
 * q-panel rate in GMAC/s (and GB/s of weights at one token).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/kernels/kernels.h"
#include "engine/format/quant.h"
#include "engine/kernels/threadpool.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best seconds per kern_matmul over repetitions filling about 0.3 s. */
static double time_matmul(struct threadpool *pool, struct kern_scratch *ks, const struct tensor *w,
                          const float *x, int64_t n_tokens, float *y) {
    kern_matmul(pool, ks, w, x, n_tokens, y);  // warm-up, grows the scratch
    double best = 1e30, total = 0.0;
    for (int r = 0; r < 200 && (r < 3 || total < 0.3); r++) {
        double t0 = now_s();
        kern_matmul(pool, ks, w, x, n_tokens, y);
        double dt = now_s() - t0;
        total += dt;
        if (dt < best) best = dt;
    }
    return best;
}

int main(int argc, char **argv) {
    const int32_t n_threads = argc > 1 ? atoi(argv[1]) : 2;
    const char *tname = argc > 2 ? argv[2] : "q8_0";
    const int64_t k = argc > 3 ? atoll(argv[3]) : 2048;
    const int64_t n = argc > 4 ? atoll(argv[4]) : 2048;
    const char *tlist = argc > 5 ? argv[5] : "1,4,16,64,256,512";
    const int32_t type = quant_type_from_name(tname);
    if (type < 0 || !kern_panel_supports((enum quant_type)type) ||
        k % quant_traits((uint32_t)type)->block_size != 0) {
        fprintf(stderr,
                "bench_matmul: type %s with q-panels and k a multiple of its block, please\n",
                tname);
        return 2;
    }
    kern_blas_init();
    const struct kern_dispatch *kd = kern_dispatch_init(false);
    struct threadpool *pool = threadpool_create(n_threads);
    const struct quant_traits *tr = quant_traits((uint32_t)type);
    const size_t row = quant_row_size((enum quant_type)type, k);
    uint8_t *data = malloc(row * (size_t)n);
    float *f = malloc((size_t)k * sizeof(float));
    uint32_t s = 1;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t i = 0; i < k; i++) {
            s = s * 1664525u + 1013904223u;
            f[i] = (float)(s >> 8) / (float)(1u << 23) - 1.0f;
        }
        tr->from_f32(f, data + (size_t)r * row, k);
    }
    struct tensor w = {.type = (enum quant_type)type,
                       .n_dims = 2,
                       .ne = {k, n, 1, 1},
                       .row_bytes = row,
                       .data = data};
    struct tensor wp = w;
    void *panels = aligned_alloc(64, kern_panel_bytes(&w));
    kern_panel_pack(&w, panels);
    wp.panels = panels;

    int64_t max_tokens = 1;
    for (const char *p = tlist; *p;) {
        int64_t v = atoll(p);
        if (v > max_tokens) max_tokens = v;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    float *x = malloc((size_t)(max_tokens * k) * sizeof(float));
    float *y = malloc((size_t)(max_tokens * n) * sizeof(float));
    for (int64_t i = 0; i < max_tokens * k; i++) x[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
    struct kern_scratch ks;
    if (kern_scratch_init(&ks, n_threads, k) != 0) return 1;

    printf("%s [%lld x %lld], %d threads, %s (q-panels %s)\n\n", tr->name, (long long)n,
           (long long)k, n_threads, kd->isa, kern_isa_name(kd->isa_qpanel));
    printf("| tokens | q-panels ms | row dots ms | dequant + sgemm ms | q-panels GMAC/s |\n");
    printf("|---:|---:|---:|---:|---:|\n");
    for (const char *p = tlist; *p;) {
        const int64_t m = atoll(p);
        const double tq = time_matmul(pool, &ks, &wp, x, m, y);
        ks.qdot_max_tokens = KERN_QDOT_MAX_TOKENS;
        const double td = time_matmul(pool, &ks, &w, x, m, y);
        ks.qdot_max_tokens = 0;
        const double tg = time_matmul(pool, &ks, &w, x, m, y);
        ks.qdot_max_tokens = KERN_QDOT_MAX_TOKENS;
        const double gmac = (double)m * (double)k * (double)n / tq * 1e-9;
        printf("| %lld | %.3f | %.3f | %.3f | %.1f", (long long)m, tq * 1e3, td * 1e3, tg * 1e3,
               gmac);
        if (m == 1) printf(" (%.1f GB/s)", (double)row * (double)n / tq * 1e-9);
        printf(" |\n");
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }

    // Each level's q-panel kernel on one thread, called directly over all panels.
    printf("\nq-panel kernels by level, 1 thread, ms per product:\n\n| tokens |");
    const enum kern_isa top = kern_isa_detect();
    for (int isa = KERN_ISA_AVX2; isa <= (int)top; isa++)
        printf(" %s |", kern_isa_name((enum kern_isa)isa));
    printf("\n|---:|");
    for (int isa = KERN_ISA_AVX2; isa <= (int)top; isa++) printf("---:|");
    printf("\n");
    const size_t act_row = kern_qpanel_act_bytes((enum quant_type)type, k);
    uint8_t *act = malloc(act_row * (size_t)max_tokens);
    for (int64_t t = 0; t < max_tokens; t++) {
        kern_qpanel_ref_act((enum quant_type)type, x + t * k, k, act + (size_t)t * act_row);
    }
    const int64_t n_panels = (n + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
    for (const char *p = tlist; *p;) {
        const int64_t m = atoll(p);
        printf("| %lld |", (long long)m);
        for (int isa = KERN_ISA_AVX2; isa <= (int)top; isa++) {
            kern_qpanel_fn tab[QUANT_TYPE_COUNT];
            kern_qpanel_table((enum kern_isa)isa, tab);
            double best = 1e30, total = 0.0;
            for (int r = 0; r < 200 && (r < 3 || total < 0.3); r++) {
                double t0 = now_s();
                tab[type](act, m, panels, k, n, 0, n_panels, y);
                double dt = now_s() - t0;
                total += dt;
                if (dt < best) best = dt;
            }
            printf(" %.3f |", best * 1e3);
        }
        printf("\n");
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    free(act);

    const int copies = argc > 6 ? atoi(argv[6]) : 1;
    if (copies > 1) {
        const size_t bytes = kern_panel_bytes(&w);
        uint8_t *many = aligned_alloc(64, bytes * (size_t)copies);
        for (int c = 0; c < copies; c++) memcpy(many + (size_t)c * bytes, panels, bytes);
        printf("\n%d copies (%.0f MiB), q-panels through kern_matmul:\n\n", copies,
               (double)bytes * copies / 1048576.0);
        printf("| tokens | ms per product | GB/s |\n|---:|---:|---:|\n");
        for (const char *p = tlist; *p;) {
            const int64_t m = atoll(p);
            double best = 1e30;
            for (int r = 0; r < 5; r++) {
                double t0 = now_s();
                for (int c = 0; c < copies; c++) {
                    struct tensor wc = w;
                    wc.panels = many + (size_t)c * bytes;
                    kern_matmul(pool, &ks, &wc, x, m, y);
                }
                double dt = (now_s() - t0) / copies;
                if (dt < best) best = dt;
            }
            printf("| %lld | %.4f | %.1f |\n", (long long)m, best * 1e3,
                   (double)bytes / best * 1e-9);
            p = strchr(p, ',');
            if (!p) break;
            p++;
        }
        free(many);
    }
    kern_scratch_free(&ks);
    threadpool_free(pool);
    free(panels);
    free(data);
    free(f);
    free(x);
    free(y);
    return 0;
}
