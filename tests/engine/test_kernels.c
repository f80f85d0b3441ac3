/*
 * test_kernels.c - every SIMD path present on this machine against the
 * portable reference, and kern_matmul (panels, as loaded models use; and the
 * row-dot and sgemm paths of unpacked f32/f16/bf16 weights) against a float64
 * matrix product. Panel products: every level bit-identical to the portable
 * one and batch-invariant bit for bit.
 * Quantized weights: every vec_dot level the CPU has (portable, AVX2, AVX-512,
 * VNNI) against the portable one and against float64 over the dequantized
 * operands; kern_matmul on quantized weights (row dots, sgemm and q-panel
 * paths) against float64 over dequant(W) and dequant(q8(x)), and against the
 * f32 product within the per-format tolerance of docs/quantization.md.
 * kern_matmul_group against the same float64 product and, bit for bit,
 * against kern_matmul on each weight alone.
 * (The q-panel kernels themselves: tests/engine/kernels/test_qpanel.c.)
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/kernels/kernels.h"
#include "engine/format/quant.h"
#include "engine/kernels/threadpool.h"

static uint32_t rng_state = 1;
static float frand(void) {  // uniform in [-1, 1)
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / (float)(1u << 23) - 1.0f;
}

static void test_kernels_simd_dots_match_reference(void **state) {
    (void)state;
    const struct kern_dispatch *kd = kern_dispatch_init(false);
    print_message("isa: %s\n", kd->isa);
    for (int64_t n = 1; n <= 300; n += 7) {
        float *a = malloc((size_t)n * sizeof(float));
        float *b = malloc((size_t)n * sizeof(float));
        uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
        uint16_t *bf = malloc((size_t)n * sizeof(uint16_t));
        double exact = 0.0, exact_h = 0.0, exact_bf = 0.0, mag = 0.0;
        for (int64_t i = 0; i < n; i++) {
            a[i] = frand();
            b[i] = frand();
            h[i] = quant_f32_to_f16(a[i]);
            bf[i] = quant_f32_to_bf16(a[i]);
            exact += (double)a[i] * b[i];
            exact_h += (double)quant_f16_to_f32(h[i]) * b[i];
            exact_bf += (double)quant_bf16_to_f32(bf[i]) * b[i];
            mag += fabs((double)a[i] * b[i]);
        }
        const double tol = 1e-5 * (mag + 1.0);
        assert_true(fabs(kd->dot_f32(a, b, n) - exact) <= tol);
        assert_true(fabs(kern_ref_dot_f32(a, b, n) - exact) <= tol);
        assert_true(fabs(kd->dot_f16(h, b, n) - exact_h) <= tol);
        assert_true(fabs(kern_ref_dot_f16(h, b, n) - exact_h) <= tol);
        assert_true(fabs(kd->dot_bf16(bf, b, n) - exact_bf) <= tol);
        assert_true(fabs(kern_ref_dot_bf16(bf, b, n) - exact_bf) <= tol);

        // Conversions are exact, so SIMD and reference agree bit for bit.
        float *c1 = malloc((size_t)n * sizeof(float));
        float *c2 = malloc((size_t)n * sizeof(float));
        kd->f16_to_f32(h, c1, n);
        kern_ref_f16_to_f32(h, c2, n);
        assert_memory_equal(c1, c2, (size_t)n * sizeof(float));
        kd->bf16_to_f32(bf, c1, n);
        kern_ref_bf16_to_f32(bf, c2, n);
        assert_memory_equal(c1, c2, (size_t)n * sizeof(float));
        free(c1);
        free(c2);
        free(a);
        free(b);
        free(h);
        free(bf);
    }
}

/* W: [k, n] tensor of type t over random data; checks y = x W^T for n_tokens,
 * through the weight's panels when `panels` (the loaded-model path), else
 * through its rows (row dots and sgemm). */
static void check_matmul(struct threadpool *pool, enum quant_type t, int64_t k, int64_t n,
                         int64_t n_tokens, bool panels) {
    size_t esz = t == QUANT_F32 ? 4 : 2;
    void *data = malloc((size_t)(k * n) * esz);
    float *wf = malloc((size_t)(k * n) * sizeof(float));  // the values W holds
    for (int64_t i = 0; i < k * n; i++) {
        float v = frand();
        if (t == QUANT_F32) {
            ((float *)data)[i] = v;
            wf[i] = v;
        } else if (t == QUANT_F16) {
            ((uint16_t *)data)[i] = quant_f32_to_f16(v);
            wf[i] = quant_f16_to_f32(((uint16_t *)data)[i]);
        } else {
            ((uint16_t *)data)[i] = quant_f32_to_bf16(v);
            wf[i] = quant_bf16_to_f32(((uint16_t *)data)[i]);
        }
    }
    struct tensor w = {.type = t, .n_dims = 2, .ne = {k, n, 1, 1},
                       .row_bytes = (size_t)k * esz, .data = data};
    void *pw = NULL;
    if (panels) {
        pw = aligned_alloc(64, (kern_panel_bytes(&w) + 63) / 64 * 64);
        kern_panel_pack(&w, pw);
        w.panels = pw;
    }
    float *x = malloc((size_t)(n_tokens * k) * sizeof(float));
    float *y = malloc((size_t)(n_tokens * n) * sizeof(float));
    for (int64_t i = 0; i < n_tokens * k; i++) x[i] = frand();
    struct kern_scratch ks;
    assert_int_equal(kern_scratch_init(&ks, threadpool_n_threads(pool), k), 0);
    kern_matmul(pool, &ks, &w, x, n_tokens, y);
    for (int64_t tt = 0; tt < n_tokens; tt++) {
        for (int64_t r = 0; r < n; r++) {
            double e = 0.0, mag = 0.0;
            for (int64_t i = 0; i < k; i++) {
                e += (double)x[tt * k + i] * wf[r * k + i];
                mag += fabs((double)x[tt * k + i] * wf[r * k + i]);
            }
            double got = y[tt * n + r];
            if (fabs(got - e) > 1e-5 * (mag + 1.0)) {
                fail_msg("%s k=%lld n=%lld tokens=%lld panels=%d: y[%lld][%lld] = %g, expected %g",
                         quant_name(t), (long long)k, (long long)n, (long long)n_tokens,
                         (int)panels, (long long)tt, (long long)r, got, e);
            }
        }
    }
    kern_scratch_free(&ks);
    free(pw);
    free(data);
    free(wf);
    free(x);
    free(y);
}

/* SwiGLU's kernel (kernels.h): the portable one within 1e-6 relative (plus
 * 1e-35 absolute: its exp is 0 below -87) of float64 silu(z) * u, z over
 * [-100, 100] and its small values; infinities as the formula has them
 * (silu(+inf) = +inf, silu(-inf) * u = NaN, silu(-88) rounds to about 0);
 * the dispatched path (AVX2 where the CPU has it) gives the portable bits at
 * every length mod 8, NaNs and random bit patterns included. */
static void test_kernels_swiglu_float64_and_bit_identical(void **state) {
    (void)state;
    const struct kern_dispatch *kd = kern_dispatch_init(false);
    enum { N = 4096 + 64 };
    float *z = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float));
    float *got = malloc(N * sizeof(float)), *want = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        rng_state = rng_state * 1664525u + 1013904223u;
        const float r = (float)(rng_state >> 8) / (float)(1u << 24);  // [0, 1)
        z[i] = i < 2048 ? -100.0f + 200.0f * (float)i / 2048.0f : (r - 0.5f) * (i % 3 ? 8.0f : 1e-3f);
        u[i] = 0.25f + r;
    }
    for (int i = 0; i < N; i++) want[i] = z[i];
    kern_ref_swiglu(want, u, N);
    for (int i = 0; i < N; i++) {
        const double zd = z[i];
        const double ref = zd / (1.0 + exp(-zd)) * (double)u[i];
        if (fabs(want[i] - ref) > 1e-6 * fabs(ref) + 1e-35) {
            fail_msg("swiglu(%.9g) * %.9g: %.9g, float64 %.17g", z[i], u[i], want[i], ref);
        }
    }
    float inf_z[3] = {INFINITY, -INFINITY, -88.0f}, inf_u[3] = {2.0f, 2.0f, 1.0f};
    kern_ref_swiglu(inf_z, inf_u, 3);
    assert_true(isinf(inf_z[0]) && inf_z[0] > 0);
    assert_true(isnan(inf_z[1]));
    assert_true(fabsf(inf_z[2]) < 1e-30f);
    // Bit patterns: NaNs, infinities, subnormals, huge values.
    for (int i = 2048; i < 2048 + 256; i++) {
        rng_state = rng_state * 1664525u + 1013904223u;
        uint32_t bits = rng_state ^ (rng_state << 13);
        if (i % 4 == 0) bits |= 0x7f800000;
        memcpy(&z[i], &bits, 4);
    }
    for (int64_t len = N - 7; len <= N; len++) {
        memcpy(got, z, N * sizeof(float));
        memcpy(want, z, N * sizeof(float));
        kd->swiglu(got, u, len);
        kern_ref_swiglu(want, u, len);
        if (memcmp(got, want, (size_t)len * sizeof(float)) != 0) {
            for (int64_t i = 0; i < len; i++) {
                if (memcmp(&got[i], &want[i], 4) != 0) {
                    fail_msg("swiglu (%s) of %.9g at %lld of %lld: %.9g, portable %.9g", kd->isa,
                             z[i], (long long)i, (long long)len, got[i], want[i]);
                }
            }
        }
    }
    free(z);
    free(u);
    free(got);
    free(want);
}

/* f32 -> f16 of the dispatched path (F16C on AVX2 machines) equals the
 * portable quant_f32_to_f16 bit for bit: around every half (the value, its
 * float neighbours, the midpoints to the next half and theirs: the ties of
 * round-to-nearest-even), subnormals, overflow, infinities, NaNs of every
 * sign and payload, and random bit patterns; at every length mod 8 (tails). */
static void test_kernels_f32_to_f16_bit_identical(void **state) {
    (void)state;
    const struct kern_dispatch *kd = kern_dispatch_init(false);
    enum { N = 65536 * 9 + 4096 };
    float *x = malloc(N * sizeof(float));
    uint16_t *got = malloc(N * sizeof(uint16_t));
    uint16_t *want = malloc(N * sizeof(uint16_t));
    int64_t n = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = quant_f16_to_f32((uint16_t)h);
        const float g = quant_f16_to_f32((uint16_t)(h + 1));  // wraps into NaN/-0: fine
        const float mid = (isfinite(f) && isfinite(g)) ? f + (g - f) / 2.0f : f;
        const float vals[9] = {f, nextafterf(f, INFINITY), nextafterf(f, -INFINITY), mid,
                               nextafterf(mid, INFINITY), nextafterf(mid, -INFINITY), -mid,
                               f * 1.5f, f / 3.0f};
        for (int i = 0; i < 9; i++) x[n++] = vals[i];
    }
    for (int i = 0; i < 4096; i++) {
        rng_state = rng_state * 1664525u + 1013904223u;
        uint32_t bits = rng_state ^ (rng_state << 13);
        if (i % 4 == 0) bits |= 0x7f800000;  // inf / NaN with a random payload
        memcpy(&x[n++], &bits, 4);
    }
    assert_int_equal(n, N);
    for (int64_t len = N - 7; len <= N; len++) {
        memset(got, 0, N * sizeof(uint16_t));
        kd->f32_to_f16(x, got, len);
        kern_ref_f32_to_f16(x, want, len);
        for (int64_t i = 0; i < len; i++) {
            if (got[i] != want[i]) {
                uint32_t bits;
                memcpy(&bits, &x[i], 4);
                fail_msg("f32_to_f16 (%s) of 0x%08x: 0x%04x, portable 0x%04x", kd->isa, bits,
                         got[i], want[i]);
            }
        }
    }
    free(x);
    free(got);
    free(want);
}

static void test_kernels_matmul_matches_float64(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    assert_non_null(pool);
    const enum quant_type types[] = {QUANT_F32, QUANT_F16, QUANT_BF16};
    const int64_t tokens[] = {1, 2, KERN_GEMV_MAX_TOKENS, KERN_GEMV_MAX_TOKENS + 1, 9, 33};
    for (int portable = 0; portable < 2; portable++) {
        kern_dispatch_init(portable == 1);
        for (size_t ti = 0; ti < 3; ti++) {
            for (size_t ni = 0; ni < sizeof(tokens) / sizeof(tokens[0]); ni++) {
                // Odd sizes: rows not a multiple of the thread split, the tile or a panel.
                for (int panels = 0; panels < 2; panels++) {
                    check_matmul(pool, types[ti], 67, 131, tokens[ni], panels);
                    check_matmul(pool, types[ti], 128, 200, tokens[ni], panels);
                }
            }
        }
    }
    kern_dispatch_init(false);
    threadpool_free(pool);
}

/* Panel products: every level the CPU has equals the portable one bit for
 * bit, and a token's row is the same bits alone, at any position of any
 * batch, and over any split of the panels (kernels.h, "Batch invariance"). */
static void test_kernels_panels_every_isa_bit_identical_and_batch_invariant(void **state) {
    (void)state;
    const enum kern_isa top = kern_isa_detect();
    const enum quant_type types[] = {QUANT_F32, QUANT_F16, QUANT_BF16};
    const int64_t shapes[][2] = {{67, 131}, {128, 200}, {768, 48}, {5, 16}};
    const int64_t max_tokens = 37;
    for (size_t ti = 0; ti < 3; ti++) {
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            const enum quant_type t = types[ti];
            const int64_t k = shapes[si][0];
            const int64_t n = shapes[si][1];
            const size_t esz = t == QUANT_F32 ? 4 : 2;
            void *data = malloc((size_t)(k * n) * esz);
            for (int64_t i = 0; i < k * n; i++) {
                float v = frand();
                if (t == QUANT_F32) ((float *)data)[i] = v;
                if (t == QUANT_F16) ((uint16_t *)data)[i] = quant_f32_to_f16(v);
                if (t == QUANT_BF16) ((uint16_t *)data)[i] = quant_f32_to_bf16(v);
            }
            struct tensor w = {.type = t, .n_dims = 2, .ne = {k, n, 1, 1},
                               .row_bytes = (size_t)k * esz, .data = data};
            void *pw = aligned_alloc(64, (kern_panel_bytes(&w) + 63) / 64 * 64);
            kern_panel_pack(&w, pw);
            const int64_t n_panels = (n + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
            float *x = malloc((size_t)(max_tokens * k) * sizeof(float));
            float *want = malloc((size_t)(max_tokens * n) * sizeof(float));
            float *got = malloc((size_t)(max_tokens * n) * sizeof(float));
            for (int64_t i = 0; i < max_tokens * k; i++) x[i] = frand();
            struct kern_panel ref;
            kern_panel_table(KERN_ISA_PORTABLE, &ref);
            kern_panel_fn ref_fn = t == QUANT_F32 ? ref.f32 : t == QUANT_F16 ? ref.f16 : ref.bf16;
            // every token alone, by the portable code: the oracle of every row
            for (int64_t tt = 0; tt < max_tokens; tt++) {
                ref_fn(x + tt * k, 1, pw, k, n, 0, n_panels, want + tt * n);
            }
            for (int isa = KERN_ISA_PORTABLE; isa <= (int)top; isa++) {
                struct kern_panel tab;
                kern_panel_table((enum kern_isa)isa, &tab);
                kern_panel_fn fn = t == QUANT_F32 ? tab.f32 : t == QUANT_F16 ? tab.f16 : tab.bf16;
                for (int64_t m = 1; m <= max_tokens; m += (m < 18 ? 1 : 9)) {
                    // tokens [first, first + m) as one batch, panels in two uneven parts
                    const int64_t first = (m * 7) % (max_tokens - m + 1);
                    const int64_t split = n_panels / 3;
                    memset(got, 0xff, (size_t)(m * n) * sizeof(float));
                    fn(x + first * k, m, pw, k, n, 0, split, got);
                    fn(x + first * k, m, pw, k, n, split, n_panels, got);
                    if (memcmp(got, want + first * n, (size_t)(m * n) * sizeof(float)) != 0) {
                        fail_msg("%s k=%lld n=%lld %s: a batch of %lld tokens from %lld differs "
                                 "from the tokens alone (portable)", quant_name(t), (long long)k,
                                 (long long)n, kern_isa_name((enum kern_isa)isa), (long long)m,
                                 (long long)first);
                    }
                }
            }
            free(data);
            free(pw);
            free(x);
            free(want);
            free(got);
        }
    }
}

static const enum quant_type qtypes[] = {QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1,
                                         QUANT_Q8_0, QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K,
                                         QUANT_Q5_K, QUANT_Q6_K};
#define N_QTYPES (sizeof(qtypes) / sizeof(qtypes[0]))

static void test_kernels_vec_dots_every_isa_match_portable(void **state) {
    (void)state;
    const enum kern_isa top = kern_isa_detect();
    print_message("quantized kernels: cpu has up to %s\n", kern_isa_name(top));
    kern_vec_dot_fn ref[QUANT_TYPE_COUNT];
    kern_vec_dot_table(KERN_ISA_PORTABLE, ref);
    const int64_t sizes[] = {256, 512, 768, 2048 + 256};
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const enum quant_type t = qtypes[ti];
        const struct quant_traits *tr = quant_traits(t);
        const struct quant_traits *vd = quant_traits(tr->vec_dot_type);
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
            const int64_t n = sizes[si];
            float *w = malloc((size_t)n * sizeof(float));
            float *x = malloc((size_t)n * sizeof(float));
            float *wd = malloc((size_t)n * sizeof(float));
            float *xd = malloc((size_t)n * sizeof(float));
            void *wq = malloc(quant_row_size(t, n));
            void *xq = malloc(quant_row_size(tr->vec_dot_type, n));
            for (int64_t i = 0; i < n; i++) {
                w[i] = frand();
                x[i] = frand() * (i % 7 == 0 ? 4.0f : 1.0f);
            }
            tr->from_f32(w, wq, n);
            vd->from_f32(x, xq, n);
            tr->to_f32(wq, wd, n);
            vd->to_f32(xq, xd, n);
            double exact = 0.0, mag = 0.0;
            for (int64_t i = 0; i < n; i++) {
                exact += (double)wd[i] * xd[i];
                mag += fabs((double)wd[i] * xd[i]);
            }
            const float want = ref[t](wq, xq, n);
            // the same integer sums: only the float order of block sums differs
            if (fabs(want - exact) > 1e-5 * (mag + 1.0)) {
                fail_msg("%s n=%lld portable %g, float64 %g", tr->name, (long long)n,
                         (double)want, exact);
            }
            for (int isa = KERN_ISA_AVX2; isa <= (int)top; isa++) {
                kern_vec_dot_fn tab[QUANT_TYPE_COUNT];
                kern_vec_dot_table((enum kern_isa)isa, tab);
                const float got = tab[t](wq, xq, n);
                if (fabs(got - want) > 1e-5 * (mag + 1.0)) {
                    fail_msg("%s n=%lld %s %g, portable %g", tr->name, (long long)n,
                             kern_isa_name((enum kern_isa)isa), (double)got, (double)want);
                }
            }
            free(w);
            free(x);
            free(wd);
            free(xd);
            free(wq);
            free(xq);
        }
    }
}

/* Largest |y - y_f32| / rms(y_f32) of a quantized matmul against the f32
 * product of the unquantized weights (docs/quantization.md). */
static double matmul_tolerance(enum quant_type t) {
    switch (t) {
    case QUANT_Q8_0: return 0.03;
    case QUANT_Q6_K: return 0.08;
    case QUANT_Q5_0: case QUANT_Q5_1: case QUANT_Q5_K: return 0.18;
    case QUANT_Q4_0: case QUANT_Q4_1: case QUANT_Q4_K: return 0.35;
    case QUANT_Q3_K: return 0.6;
    case QUANT_Q2_K: return 1.2;
    default: return 0.0;
    }
}

/* qdot_max_tokens < 0: through the weight's q-panels (as a loaded model). */
static void check_qmatmul(struct threadpool *pool, enum quant_type t, int64_t k, int64_t n,
                          int64_t n_tokens, int32_t qdot_max_tokens) {
    const struct quant_traits *tr = quant_traits(t);
    const struct quant_traits *vd = quant_traits(tr->vec_dot_type);
    // the same data for every path of a case, whatever ran before it
    rng_state = (uint32_t)(t * 7919 + k * 31 + n * 17 + n_tokens);
    float *wf = malloc((size_t)(k * n) * sizeof(float));
    float *wd = malloc((size_t)(k * n) * sizeof(float));
    uint8_t *data = malloc(quant_row_size(t, k) * (size_t)n);
    for (int64_t i = 0; i < k * n; i++) wf[i] = frand();
    for (int64_t r = 0; r < n; r++) {
        tr->from_f32(wf + r * k, data + (size_t)r * quant_row_size(t, k), k);
        tr->to_f32(data + (size_t)r * quant_row_size(t, k), wd + r * k, k);
    }
    struct tensor w = {.type = t, .n_dims = 2, .ne = {k, n, 1, 1},
                       .row_bytes = quant_row_size(t, k), .data = data};
    void *pw = NULL;
    if (qdot_max_tokens < 0) {
        pw = aligned_alloc(64, kern_panel_bytes(&w));
        kern_panel_pack(&w, pw);
        w.panels = pw;
        qdot_max_tokens = KERN_QDOT_MAX_TOKENS;
    }
    float *x = malloc((size_t)(n_tokens * k) * sizeof(float));
    float *xd = malloc((size_t)(n_tokens * k) * sizeof(float));
    void *xq = malloc(quant_row_size(tr->vec_dot_type, k));
    float *y = malloc((size_t)(n_tokens * n) * sizeof(float));
    for (int64_t i = 0; i < n_tokens * k; i++) x[i] = frand();
    for (int64_t tt = 0; tt < n_tokens; tt++) {
        vd->from_f32(x + tt * k, xq, k);
        vd->to_f32(xq, xd + tt * k, k);
    }
    struct kern_scratch ks;
    assert_int_equal(kern_scratch_init(&ks, threadpool_n_threads(pool), k), 0);
    ks.qdot_max_tokens = qdot_max_tokens;
    kern_matmul(pool, &ks, &w, x, n_tokens, y);
    double se = 0.0, s2 = 0.0, max_dev = 0.0;
    for (int64_t tt = 0; tt < n_tokens; tt++) {
        for (int64_t r = 0; r < n; r++) {
            double e = 0.0, mag = 0.0, f = 0.0;
            for (int64_t i = 0; i < k; i++) {
                e += (double)xd[tt * k + i] * wd[r * k + i];
                mag += fabs((double)xd[tt * k + i] * wd[r * k + i]);
                f += (double)x[tt * k + i] * wf[r * k + i];
            }
            double got = y[tt * n + r];
            if (fabs(got - e) > 1e-5 * (mag + 1.0)) {
                fail_msg("%s k=%lld n=%lld tokens=%lld: y[%lld][%lld] = %g, expected %g",
                         tr->name, (long long)k, (long long)n, (long long)n_tokens,
                         (long long)tt, (long long)r, got, e);
            }
            se += (got - f) * (got - f);
            s2 += f * f;
            if (fabs(got - f) > max_dev) max_dev = fabs(got - f);
        }
    }
    const double rms = sqrt(s2 / (double)(n_tokens * n));
    if (max_dev / rms > matmul_tolerance(t)) {
        fail_msg("%s: max deviation from f32 %.4f of rms, tolerance %.4f", tr->name,
                 max_dev / rms, matmul_tolerance(t));
    }
    kern_scratch_free(&ks);
    free(pw);
    free(wf);
    free(wd);
    free(data);
    free(x);
    free(xd);
    free(xq);
    free(y);
}

static void test_kernels_quantized_matmul_matches_float64(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    assert_non_null(pool);
    const int64_t tokens[] = {1, 3, 16, 17, 40};  // sgemm path: from 1 token (qmax 0) or 17
    for (int portable = 0; portable < 2; portable++) {
        kern_dispatch_init(portable == 1);
        for (size_t ti = 0; ti < N_QTYPES; ti++) {
            for (size_t ni = 0; ni < sizeof(tokens) / sizeof(tokens[0]); ni++) {
                // integer row dots at every size, the sgemm path, and q-panels
                for (int path = 0; path < 3; path++) {
                    if (path == 2 && !kern_qpanel_supports(qtypes[ti])) continue;
                    int32_t qmax = path == 0   ? KERN_QDOT_MAX_TOKENS
                                   : path == 1 ? (tokens[ni] < 16 ? 0 : 16)
                                               : -1;
                    check_qmatmul(pool, qtypes[ti], 256, 67, tokens[ni], qmax);
                    check_qmatmul(pool, qtypes[ti], 512, 130, tokens[ni], qmax);
                }
            }
        }
    }
    kern_dispatch_init(false);
    threadpool_free(pool);
}

/* One weight of a group test: random rows of type t, packed into panels,
 * and its dequantized rows (the float64 oracle's operand). */
struct gweight {
    struct tensor w;
    void *data, *pw;
    float *wd;  // [n][k] dequantized
};

static void gweight_make(struct gweight *g, enum quant_type t, int64_t k, int64_t n) {
    const bool is_f16 = t == QUANT_F16;
    const size_t row = is_f16 ? (size_t)k * 2 : quant_row_size(t, k);
    g->data = malloc(row * (size_t)n);
    g->wd = malloc((size_t)(k * n) * sizeof(float));
    float *wf = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < n; r++) {
        for (int64_t i = 0; i < k; i++) wf[i] = frand();
        uint8_t *dst = (uint8_t *)g->data + (size_t)r * row;
        if (is_f16) {
            for (int64_t i = 0; i < k; i++) {
                ((uint16_t *)dst)[i] = quant_f32_to_f16(wf[i]);
                g->wd[r * k + i] = quant_f16_to_f32(((uint16_t *)dst)[i]);
            }
        } else {
            quant_traits(t)->from_f32(wf, dst, k);
            quant_traits(t)->to_f32(dst, g->wd + r * k, k);
        }
    }
    free(wf);
    g->w = (struct tensor){.type = t, .n_dims = 2, .ne = {k, n, 1, 1}, .row_bytes = row,
                           .data = g->data};
    g->pw = aligned_alloc(64, (kern_panel_bytes(&g->w) + 63) / 64 * 64);
    kern_panel_pack(&g->w, g->pw);
    g->w.panels = g->pw;
}

static void gweight_free(struct gweight *g) {
    free(g->data);
    free(g->pw);
    free(g->wd);
}

/* y [T][n] of weight g against float64 over its dequantized rows and x
 * rounded through the weight's partner type (f16 weights: x as it is). */
static void check_group_float64(const struct gweight *g, const float *x, int64_t T,
                                const float *y) {
    const int64_t k = g->w.ne[0], n = g->w.ne[1];
    const enum quant_type t = g->w.type;
    float *xd = malloc((size_t)k * sizeof(float));
    void *xq = t == QUANT_F16 ? NULL : malloc(quant_row_size(quant_traits(t)->vec_dot_type, k));
    for (int64_t tt = 0; tt < T; tt++) {
        memcpy(xd, x + tt * k, (size_t)k * sizeof(float));
        if (xq) {
            const struct quant_traits *vd = quant_traits(quant_traits(t)->vec_dot_type);
            vd->from_f32(x + tt * k, xq, k);
            vd->to_f32(xq, xd, k);
        }
        for (int64_t r = 0; r < n; r++) {
            double e = 0.0, mag = 0.0;
            for (int64_t j = 0; j < k; j++) {
                e += (double)xd[j] * g->wd[r * k + j];
                mag += fabs((double)xd[j] * g->wd[r * k + j]);
            }
            if (fabs(y[tt * n + r] - e) > 1e-5 * (mag + 1.0)) {
                fail_msg("%s: y[%lld][%lld] = %g, expected %g", quant_traits(t)->name,
                         (long long)tt, (long long)r, y[tt * n + r], e);
            }
        }
    }
    free(xd);
    free(xq);
}

/* The epilogue's record: how often each row was handed over, and the rows'
 * values at that moment (they must be final then). */
struct rows_seen {
    int32_t count[256];
    const float *y[2];  // the paired products' outputs [T][n]
    float *snap[2];
    int64_t n_tokens, n;
};

static void record_rows(void *arg, int64_t r0, int64_t r1) {
    struct rows_seen *rs = arg;
    for (int64_t r = r0; r < r1; r++) {
        rs->count[r]++;
        for (int32_t i = 0; i < 2; i++) {
            for (int64_t t = 0; t < rs->n_tokens; t++) {
                rs->snap[i][t * rs->n + r] = rs->y[i][t * rs->n + r];
            }
        }
    }
}

/* kern_matmul_group: each product the same bits as kern_matmul on its own,
 * which is within float rounding of a float64 product over the dequantized
 * weights and activations (rounded through the weight's partner type), for a
 * group mixing weight types as Q4_K_M files do (Q4_K beside Q6_K) and f16; an
 * epilogue sees every row once, when the rows of both products are final. */
static void test_kernels_group_matches_float64_and_separate_products(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    assert_non_null(pool);
    const int64_t k = 256;
    const enum quant_type types[][3] = {{QUANT_Q8_0, QUANT_Q8_0, QUANT_Q8_0},
                                        {QUANT_Q4_K, QUANT_Q4_K, QUANT_Q6_K},
                                        {QUANT_F16, QUANT_Q8_0, QUANT_Q4_0}};
    const int64_t rows[3] = {64, 32, 48};
    const int64_t tokens[] = {1, 3, 17};
    for (size_t gi = 0; gi < sizeof(types) / sizeof(types[0]); gi++) {
        for (size_t ni = 0; ni < sizeof(tokens) / sizeof(tokens[0]); ni++) {
            const int64_t T = tokens[ni];
            rng_state = (uint32_t)(gi * 101 + ni);
            struct gweight gw[3];
            struct kern_product p[3];
            float *want[3];
            float *x = malloc((size_t)(T * k) * sizeof(float));
            for (int64_t i = 0; i < T * k; i++) x[i] = frand();
            struct kern_scratch ks;
            assert_int_equal(kern_scratch_init(&ks, 2, k), 0);
            for (int32_t i = 0; i < 3; i++) {
                gweight_make(&gw[i], types[gi][i], k, rows[i]);
                p[i] = (struct kern_product){&gw[i].w, malloc((size_t)(T * rows[i]) * 4)};
                want[i] = malloc((size_t)(T * rows[i]) * sizeof(float));
                kern_matmul(pool, &ks, &gw[i].w, x, T, want[i]);
            }
            kern_matmul_group(pool, &ks, x, T, p, 3, NULL, NULL);
            for (int32_t i = 0; i < 3; i++) {
                assert_memory_equal(p[i].y, want[i], (size_t)(T * rows[i]) * sizeof(float));
                check_group_float64(&gw[i], x, T, p[i].y);
            }
            // Paired with an epilogue: the first two products over the same rows
            struct gweight pair[2];
            struct kern_product pp[2];
            struct rows_seen rs = {.n_tokens = T, .n = 48};
            float *pair_want[2];
            for (int32_t i = 0; i < 2; i++) {
                gweight_make(&pair[i], types[gi][i], k, 48);
                pp[i] = (struct kern_product){&pair[i].w, malloc((size_t)(T * 48) * 4)};
                rs.y[i] = pp[i].y;
                rs.snap[i] = malloc((size_t)(T * 48) * sizeof(float));
                pair_want[i] = malloc((size_t)(T * 48) * sizeof(float));
                kern_matmul(pool, &ks, &pair[i].w, x, T, pair_want[i]);
            }
            kern_matmul_group(pool, &ks, x, T, pp, 2, record_rows, &rs);
            for (int64_t r = 0; r < 48; r++) assert_int_equal(rs.count[r], 1);
            for (int32_t i = 0; i < 2; i++) {
                assert_memory_equal(pp[i].y, pair_want[i], (size_t)(T * 48) * sizeof(float));
                assert_memory_equal(rs.snap[i], pair_want[i], (size_t)(T * 48) * sizeof(float));
                check_group_float64(&pair[i], x, T, pp[i].y);
                free(pair_want[i]);
                gweight_free(&pair[i]);
                free(pp[i].y);
                free(rs.snap[i]);
            }
            for (int32_t i = 0; i < 3; i++) {
                gweight_free(&gw[i]);
                free(p[i].y);
                free(want[i]);
            }
            free(x);
            kern_scratch_free(&ks);
        }
    }
    threadpool_free(pool);
}

int main(void) {
    kern_blas_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_simd_dots_match_reference),
        cmocka_unit_test(test_kernels_f32_to_f16_bit_identical),
        cmocka_unit_test(test_kernels_swiglu_float64_and_bit_identical),
        cmocka_unit_test(test_kernels_matmul_matches_float64),
        cmocka_unit_test(test_kernels_vec_dots_every_isa_match_portable),
        cmocka_unit_test(test_kernels_panels_every_isa_bit_identical_and_batch_invariant),
        cmocka_unit_test(test_kernels_quantized_matmul_matches_float64),
        cmocka_unit_test(test_kernels_group_matches_float64_and_separate_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
