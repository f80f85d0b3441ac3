/*
 * test_qpanel.c - the q-panels of quantized weights (engine/kernels/qpanel*.c):
 *   - activation rows hold exactly the partner type's quantization, and every
 *     level's quantizer writes the same bytes;
 *   - the portable q-panel product equals the row dots (kern_vec_dot_fn) and
 *     float64 over the dequantized operands within 1e-5 of sum |w x|;
 *   - every SIMD level the CPU has equals the portable product bit for bit,
 *     and a token's outputs are the same bits alone or at any position of a
 *     batch of 1..40 tokens, over any split of the panels;
 *   - random raw blocks (every quant value, extremes included) as well as
 *     blocks quantized from floats; row counts not a multiple of 16.
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

static uint32_t rng_state = 1;
static uint32_t rnd(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}
static float frand(void) {  // uniform in [-1, 1)
    return (float)rnd() / (float)(1u << 23) - 1.0f;
}

static const enum quant_type types[] = {QUANT_Q8_0, QUANT_Q4_0, QUANT_Q4_K, QUANT_Q6_K, QUANT_Q5_0,
                                        QUANT_Q4_1, QUANT_Q5_1, QUANT_Q2_K, QUANT_Q3_K, QUANT_Q5_K};
#define N_TYPES (sizeof(types) / sizeof(types[0]))

/* Overwrites the f16 scale fields of a raw random block with finite values. */
static void fix_scales(enum quant_type t, uint8_t *blk) {
    uint16_t d = quant_f32_to_f16(frand() * 0.01f);
    uint16_t dmin = quant_f32_to_f16(frand() * 0.01f);
    switch (t) {
        case QUANT_Q8_0:
        case QUANT_Q4_0:
        case QUANT_Q5_0:
            memcpy(blk, &d, 2);
            break;
        case QUANT_Q4_1:
        case QUANT_Q5_1:  // d, then m
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dmin, 2);
            break;
        case QUANT_Q5_K:
            memcpy(blk + offsetof(struct block_q5_K, d), &d, 2);
            memcpy(blk + offsetof(struct block_q5_K, dmin), &dmin, 2);
            break;
        case QUANT_Q3_K:
            memcpy(blk + offsetof(struct block_q3_K, d), &d, 2);
            break;
        case QUANT_Q2_K:
            memcpy(blk + offsetof(struct block_q2_K, d), &d, 2);
            memcpy(blk + offsetof(struct block_q2_K, dmin), &dmin, 2);
            break;
        case QUANT_Q4_K:
            memcpy(blk + offsetof(struct block_q4_K, d), &d, 2);
            memcpy(blk + offsetof(struct block_q4_K, dmin), &dmin, 2);
            break;
        case QUANT_Q6_K:
            memcpy(blk + offsetof(struct block_q6_K, d), &d, 2);
            break;
        default:
            fail();
    }
}

/* A [k, n] weight of type t: quantized from random floats, or raw random
 * blocks (`raw`) with finite scales. */
struct qweight {
    struct tensor w;
    uint8_t *data;
    void *panels;
};

static void make_weight(struct qweight *qw, enum quant_type t, int64_t k, int64_t n, bool raw) {
    const struct quant_traits *tr = quant_traits(t);
    const size_t row = quant_row_size(t, k);
    qw->data = malloc(row * (size_t)n);
    float *f = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < n; r++) {
        uint8_t *dst = qw->data + (size_t)r * row;
        if (raw) {
            for (size_t i = 0; i < row; i++) dst[i] = (uint8_t)rnd();
            for (int64_t ib = 0; ib < k / tr->block_size; ib++) {
                fix_scales(t, dst + (size_t)ib * tr->type_size);
            }
        } else {
            for (int64_t i = 0; i < k; i++) f[i] = frand();
            tr->from_f32(f, dst, k);
        }
    }
    free(f);
    qw->w = (struct tensor){
        .type = t, .n_dims = 2, .ne = {k, n, 1, 1}, .row_bytes = row, .data = qw->data};
    const size_t bytes = kern_panel_bytes(&qw->w);
    assert_int_equal(bytes % 64, 0);
    qw->panels = aligned_alloc(64, bytes);
    kern_panel_pack(&qw->w, qw->panels);
    qw->w.panels = qw->panels;
}

static void free_weight(struct qweight *qw) {
    free(qw->data);
    free(qw->panels);
}

/* n_tokens activation rows of random floats (every 7th element larger, so
 * blocks reach +-127), as q-panel rows (act) and as partner blocks (xq). */
static void make_acts(enum quant_type t, int64_t k, int64_t n_tokens, uint8_t **act, uint8_t **xq) {
    const enum quant_type vt = quant_traits(t)->vec_dot_type;
    const size_t act_row = kern_qpanel_act_bytes(t, k);
    const size_t xq_row = quant_row_size(vt, k);
    *act = malloc(act_row * (size_t)n_tokens);
    *xq = malloc(xq_row * (size_t)n_tokens);
    float *x = malloc((size_t)k * sizeof(float));
    for (int64_t tt = 0; tt < n_tokens; tt++) {
        for (int64_t i = 0; i < k; i++) x[i] = frand() * (i % 7 == 0 ? 4.0f : 1.0f);
        kern_qpanel_ref_act(t, x, k, *act + (size_t)tt * act_row);
        quant_traits(vt)->from_f32(x, *xq + (size_t)tt * xq_row, k);
    }
    free(x);
}

static void test_qpanel_act_rows_hold_the_partner_quantization(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const enum quant_type t = types[ti];
        const enum quant_type vt = quant_traits(t)->vec_dot_type;
        const int64_t k = 768;
        uint8_t *act, *xq;
        make_acts(t, k, 3, &act, &xq);
        for (int64_t tt = 0; tt < 3; tt++) {
            struct kern_qact a = kern_qact_view(t, act + tt * kern_qpanel_act_bytes(t, k), k);
            const uint8_t *row = xq + tt * quant_row_size(vt, k);
            if (vt == QUANT_Q8_K) {
                for (int64_t ib = 0; ib < k / QK_K; ib++) {
                    const struct block_q8_K *b = (const struct block_q8_K *)row + ib;
                    assert_memory_equal(a.qs + ib * QK_K, b->qs, QK_K);
                    assert_true(a.d[ib] == b->d);
                    for (int j = 0; j < 16; j++) {
                        assert_int_equal(a.b16[16 * ib + j], b->bsums[j]);
                        assert_int_equal(a.n32[16 * ib + j], -32 * b->bsums[j]);
                        assert_int_equal(a.n4[16 * ib + j], -4 * b->bsums[j]);
                    }
                    for (int j = 0; j < 8; j++) {
                        assert_int_equal(a.b32[8 * ib + j], b->bsums[2 * j] + b->bsums[2 * j + 1]);
                    }
                }
            } else {
                for (int64_t ib = 0; ib < k / QK8_0; ib++) {
                    // q8_1 (the partner of q4_1, q5_1) is q8_0 with a sum field
                    const int8_t *bqs;
                    uint16_t bd;
                    if (vt == QUANT_Q8_1) {
                        const struct block_q8_1 *b = (const struct block_q8_1 *)row + ib;
                        bqs = b->qs, bd = b->d;
                    } else {
                        const struct block_q8_0 *b = (const struct block_q8_0 *)row + ib;
                        bqs = b->qs, bd = b->d;
                    }
                    assert_memory_equal(a.qs + ib * QK8_0, bqs, QK8_0);
                    assert_true(a.d[ib] == quant_f16_to_f32(bd));
                    int32_t s = 0;
                    for (int l = 0; l < QK8_0; l++) s += bqs[l];
                    assert_int_equal(a.n8[ib], -8 * s);
                    assert_int_equal(a.n16[ib], -16 * s);
                    assert_int_equal(a.n128[ib], -128 * s);
                    assert_true(a.fs[ib] == (float)s);
                }
            }
        }
        free(act);
        free(xq);
    }
}

/* Every level's activation quantizer writes the portable one's bytes, on
 * random rows with zero blocks, a lone large value, and halfway ties. */
static void test_qpanel_act_every_isa_writes_the_same_bytes(void **state) {
    (void)state;
    const int64_t k = 1024;
    float *x = malloc((size_t)k * sizeof(float));
    for (int64_t i = 0; i < k; i++) x[i] = frand() * (i % 7 == 0 ? 4.0f : 1.0f);
    for (int64_t i = 0; i < 32; i++) x[i] = 0.0f;  // a zero q8_0 block
    x[300] = 1e4f;                                 // one value dominates its block
    for (int64_t i = 512; i < 544; i++) x[i] = (float)(i - 528) * 0.25f;  // x / d on .5 ties
    x[543] = 127.0f / 2.0f;
    const enum kern_isa top = kern_isa_detect();
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const enum quant_type t = types[ti];
        const size_t bytes = kern_qpanel_act_bytes(t, k);
        uint8_t *want = calloc(1, bytes);
        uint8_t *got = malloc(bytes);
        kern_qpanel_ref_act(t, x, k, want);
        for (int isa = KERN_ISA_AVX2; isa <= (int)top; isa++) {
            memset(got, 0, bytes);
            kern_qpanel_act_select((enum kern_isa)isa)(t, x, k, got);
            if (memcmp(got, want, bytes) != 0) {
                fail_msg("%s %s: activation rows differ from the portable ones", quant_name(t),
                         kern_isa_name((enum kern_isa)isa));
            }
        }
        free(want);
        free(got);
    }
    free(x);
}

/* The portable q-panel product against the portable row dots and float64
 * over the dequantized operands. */
static void check_ref(enum quant_type t, int64_t k, int64_t n, int64_t n_tokens, bool raw) {
    const struct quant_traits *tr = quant_traits(t);
    const struct quant_traits *vd = quant_traits(tr->vec_dot_type);
    struct qweight qw;
    make_weight(&qw, t, k, n, raw);
    uint8_t *act, *xq;
    make_acts(t, k, n_tokens, &act, &xq);
    float *y = malloc((size_t)(n_tokens * n) * sizeof(float));
    kern_qpanel_fn ref[QUANT_TYPE_COUNT];
    kern_qpanel_table(KERN_ISA_PORTABLE, ref);
    const int64_t n_panels = (n + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
    ref[t](act, n_tokens, qw.panels, k, n, 0, n_panels, y);
    kern_vec_dot_fn dots[QUANT_TYPE_COUNT];
    kern_vec_dot_table(KERN_ISA_PORTABLE, dots);
    float *wd = malloc((size_t)k * sizeof(float));
    float *xd = malloc((size_t)k * sizeof(float));
    for (int64_t tt = 0; tt < n_tokens; tt++) {
        const uint8_t *xrow = xq + (size_t)tt * quant_row_size(tr->vec_dot_type, k);
        vd->to_f32(xrow, xd, k);
        for (int64_t r = 0; r < n; r++) {
            tr->to_f32(tensor_row(&qw.w, r), wd, k);
            double e = 0.0, mag = 0.0;
            for (int64_t i = 0; i < k; i++) {
                e += (double)wd[i] * xd[i];
                mag += fabs((double)wd[i] * xd[i]);
            }
            const double tol = 1e-5 * (mag + 1e-3);
            const double got = y[tt * n + r];
            const double dot = dots[t](tensor_row(&qw.w, r), xrow, k);
            if (fabs(got - e) > tol || fabs(got - dot) > tol) {
                fail_msg(
                    "%s k=%lld n=%lld tokens=%lld raw=%d: y[%lld][%lld] = %.9g, row dot "
                    "%.9g, float64 %.9g",
                    tr->name, (long long)k, (long long)n, (long long)n_tokens, (int)raw,
                    (long long)tt, (long long)r, got, dot, e);
            }
        }
    }
    free(wd);
    free(xd);
    free(y);
    free(act);
    free(xq);
    free_weight(&qw);
}

static void test_qpanel_portable_matches_row_dots_and_float64(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const int64_t bs = quant_traits(types[ti])->block_size;
        for (int raw = 0; raw < 2; raw++) {
            check_ref(types[ti], bs, 17, 3, raw);
            check_ref(types[ti], 3 * bs, 40, 5, raw);
            check_ref(types[ti], bs == QK_K ? 512 : 96, 1, 1, raw);
            check_ref(types[ti], bs == QK_K ? 768 : 320, 67, 2, raw);
        }
    }
}

/* Every level the CPU has against the portable product of each token alone,
 * bit for bit, for batches of min..max tokens (1..40 for every format) at
 * varying offsets and panel splits. */
static void check_levels_upto(enum quant_type t, int64_t k, int64_t n, bool raw, int64_t min_tokens,
                              int64_t max_tokens) {
    struct qweight qw;
    make_weight(&qw, t, k, n, raw);
    uint8_t *act, *xq;
    make_acts(t, k, max_tokens, &act, &xq);
    const size_t act_row = kern_qpanel_act_bytes(t, k);
    const int64_t n_panels = (n + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
    float *want = malloc((size_t)(max_tokens * n) * sizeof(float));
    float *got = malloc((size_t)(max_tokens * n) * sizeof(float));
    kern_qpanel_fn ref[QUANT_TYPE_COUNT];
    kern_qpanel_table(KERN_ISA_PORTABLE, ref);
    for (int64_t tt = 0; tt < max_tokens; tt++) {
        ref[t](act + (size_t)tt * act_row, 1, qw.panels, k, n, 0, n_panels, want + tt * n);
    }
    const enum kern_isa top = kern_isa_detect();
    for (int isa = KERN_ISA_PORTABLE; isa <= (int)top; isa++) {
        kern_qpanel_fn tab[QUANT_TYPE_COUNT];
        kern_qpanel_table((enum kern_isa)isa, tab);
        for (int64_t m = min_tokens; m <= max_tokens; m++) {
            const int64_t first = (m * 7) % (max_tokens - m + 1);
            const int64_t split = (m % 3) * n_panels / 3;
            memset(got, 0xff, (size_t)(m * n) * sizeof(float));
            tab[t](act + (size_t)first * act_row, m, qw.panels, k, n, 0, split, got);
            tab[t](act + (size_t)first * act_row, m, qw.panels, k, n, split, n_panels, got);
            if (memcmp(got, want + first * n, (size_t)(m * n) * sizeof(float)) != 0) {
                for (int64_t i = 0; i < m * n; i++) {
                    if (memcmp(&got[i], &want[first * n + i], sizeof(float)) != 0) {
                        fail_msg(
                            "%s k=%lld n=%lld raw=%d %s: batch of %lld tokens from %lld: "
                            "y[%lld][%lld] = %.9g, portable alone %.9g",
                            quant_name(t), (long long)k, (long long)n, (int)raw,
                            kern_isa_name((enum kern_isa)isa), (long long)m, (long long)first,
                            (long long)(i / n), (long long)(i % n), (double)got[i],
                            (double)want[first * n + i]);
                    }
                }
            }
        }
    }
    free(want);
    free(got);
    free(act);
    free(xq);
    free_weight(&qw);
}

static void check_levels(enum quant_type t, int64_t k, int64_t n, bool raw) {
    check_levels_upto(t, k, n, raw, 1, 40);
}

/* Batches of 60..100 tokens: past the AMX kernel's switch from running a
 * decode-sized batch panel by panel to running groups of 16 over all panels
 * (qpanel_amx.c), so both orders and the VNNI tail meet the portable bits. */
static void test_qpanel_large_batches_bit_identical(void **state) {
    (void)state;
    const enum quant_type big[] = {QUANT_Q8_0, QUANT_Q4_0};
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
        check_levels_upto(big[i], 96, 35, false, 60, 100);
    }
}

static void test_qpanel_every_isa_bit_identical_and_batch_invariant(void **state) {
    (void)state;
    print_message("q-panels: cpu has up to %s\n", kern_isa_name(kern_isa_detect()));
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const int64_t bs = quant_traits(types[ti])->block_size;
        for (int raw = 0; raw < 2; raw++) {
            check_levels(types[ti], bs, 16, raw);
            check_levels(types[ti], 2 * bs, 67, raw);
            check_levels(types[ti], bs == QK_K ? 768 : 5 * bs, 40, raw);
            check_levels(types[ti], bs == QK_K ? 256 : 64, 3, raw);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qpanel_act_rows_hold_the_partner_quantization),
        cmocka_unit_test(test_qpanel_act_every_isa_writes_the_same_bytes),
        cmocka_unit_test(test_qpanel_portable_matches_row_dots_and_float64),
        cmocka_unit_test(test_qpanel_every_isa_bit_identical_and_batch_invariant),
        cmocka_unit_test(test_qpanel_large_batches_bit_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
