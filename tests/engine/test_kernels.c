/*
 * test_kernels.c - every SIMD path present on this machine against the
 * portable reference, and kern_matmul (row-dot decode path and sgemm prefill
 * path, f32/f16/bf16 weights) against a float64 matrix product.
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
#include "engine/quant.h"
#include "engine/threadpool.h"

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

/* W: [k, n] tensor of type t over random data; checks y = x W^T for n_tokens. */
static void check_matmul(struct threadpool *pool, enum quant_type t, int64_t k, int64_t n,
                         int64_t n_tokens) {
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
                fail_msg("%s k=%lld n=%lld tokens=%lld: y[%lld][%lld] = %g, expected %g",
                         quant_name(t), (long long)k, (long long)n, (long long)n_tokens,
                         (long long)tt, (long long)r, got, e);
            }
        }
    }
    kern_scratch_free(&ks);
    free(data);
    free(wf);
    free(x);
    free(y);
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
                // Odd sizes: rows not a multiple of the thread split or the tile.
                check_matmul(pool, types[ti], 67, 131, tokens[ni]);
                check_matmul(pool, types[ti], 128, 200, tokens[ni]);
            }
        }
    }
    kern_dispatch_init(false);
    threadpool_free(pool);
}

int main(void) {
    kern_blas_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_simd_dots_match_reference),
        cmocka_unit_test(test_kernels_matmul_matches_float64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
