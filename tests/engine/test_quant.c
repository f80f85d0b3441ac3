/*
 * test_quant.c - the type traits table and the f16/bf16 conversions.
 *
 * Oracles: f16 values are computed from the IEEE 754 binary16 definition
 * with ldexp; rounding cases are built from exact midpoints between adjacent
 * f16/bf16 values, which round to the even neighbour (round to nearest even);
 * block sizes come from the ggml block structs as the GGUF spec lists them;
 * dequantization of every block format against scripts/quants.py (numpy,
 * written from the layouts) over random blocks; quantize -> dequantize round
 * trips within the per-format bounds of docs/quantization.md.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/format/quant.h"
#include "tests/helpers/testutil.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The binary16 value of h from its definition: (-1)^s * 2^(e-15) * 1.m, or
 * 2^-14 * 0.m for subnormals. NaN and inf are handled by the caller. */
static double f16_value(uint16_t h) {
    int s = h >> 15;
    int e = (h >> 10) & 0x1f;
    int m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

static void test_quant_f16_to_f32_matches_the_definition(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        if ((h & 0x7c00) == 0x7c00) {
            if (h & 0x3ff) {
                assert_true(isnan(f));
            } else {
                assert_true(isinf(f));
            }
            assert_int_equal(signbit(f) != 0, (h >> 15) != 0);
            continue;
        }
        double want = f16_value((uint16_t)h);
        if ((double)f != want) {
            print_message("h=%#06x: got %a, want %a\n", h, (double)f, want);
            fail();
        }
        assert_int_equal(signbit(f) != 0, (h >> 15) != 0);  // -0 stays -0
    }
}

static void test_quant_f16_round_trips_every_value(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t back = quant_f32_to_f16(quant_f16_to_f32((uint16_t)h));
        if (f16_is_nan((uint16_t)h)) {
            // Payloads may be normalised, but a NaN stays a NaN of that sign.
            assert_true(f16_is_nan(back));
            assert_int_equal(back & 0x8000, h & 0x8000);
            continue;
        }
        if (back != h) {
            print_message("h=%#06x came back as %#06x\n", h, back);
            fail();
        }
    }
}

static void test_quant_f32_to_f16_rounds_to_nearest_even(void **state) {
    (void)state;
    // Every pair of adjacent finite f16 values (subnormals, the subnormal to
    // normal step, and normals), both signs: the exact midpoint goes to the
    // even one, anything just above or below it to the nearer one.
    for (uint32_t h = 0; h < 0x7bff; h++) {
        for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
            double lo = f16_value((uint16_t)h);
            double hi = f16_value((uint16_t)(h + 1));
            float mid = (float)((lo + hi) / 2);  // exact: 12 significant bits
            assert_true((double)mid == (lo + hi) / 2);
            if (sign) mid = -mid;
            uint16_t even = (uint16_t)((h & 1 ? h + 1 : h) | sign);
            uint16_t got = quant_f32_to_f16(mid);
            if (got != even) {
                print_message("midpoint %a of %#06x/%#06x: got %#06x want %#06x\n", (double)mid,
                              h | sign, (h + 1) | sign, got, even);
                fail();
            }
            float toward0 = nextafterf(mid, 0.0f);
            float away = nextafterf(mid, sign ? -INFINITY : INFINITY);
            assert_int_equal(quant_f32_to_f16(toward0), h | sign);
            assert_int_equal(quant_f32_to_f16(away), (h + 1) | sign);
        }
    }
}

static void test_quant_f32_to_f16_overflow_and_underflow(void **state) {
    (void)state;
    assert_int_equal(quant_f32_to_f16(65504.0f), 0x7bff);   // largest finite half
    assert_int_equal(quant_f32_to_f16(-65504.0f), 0xfbff);
    // 65520 is halfway between 65504 and 65536 (= inf's place); 0x7bff is odd,
    // so it rounds up to infinity; just below stays finite.
    assert_int_equal(quant_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(quant_f32_to_f16(nextafterf(65520.0f, 0.0f)), 0x7bff);
    assert_int_equal(quant_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(quant_f32_to_f16(FLT_MAX), 0x7c00);
    assert_int_equal(quant_f32_to_f16(-FLT_MAX), 0xfc00);
    assert_int_equal(quant_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(quant_f32_to_f16(-INFINITY), 0xfc00);
    uint16_t n = quant_f32_to_f16(NAN);
    assert_true(f16_is_nan(n));
    n = quant_f32_to_f16(bits_f32(0xff800001u));  // a NaN with only a low payload bit
    assert_true(f16_is_nan(n));
    assert_int_equal(n & 0x8000, 0x8000);

    const float tiny = ldexpf(1.0f, -24);  // smallest subnormal half
    assert_int_equal(quant_f32_to_f16(tiny), 0x0001);
    assert_int_equal(quant_f32_to_f16(tiny / 2), 0x0000);  // halfway to 0: even is 0
    assert_int_equal(quant_f32_to_f16(nextafterf(tiny / 2, 1.0f)), 0x0001);
    assert_int_equal(quant_f32_to_f16(-tiny / 2), 0x8000);  // keeps the sign
    assert_int_equal(quant_f32_to_f16(tiny * 1.5f), 0x0002);  // halfway 1..2: even is 2
    assert_int_equal(quant_f32_to_f16(ldexpf(1.0f, -14)), 0x0400);  // smallest normal
    assert_int_equal(quant_f32_to_f16(FLT_MIN), 0x0000);
    assert_int_equal(quant_f32_to_f16(bits_f32(1)), 0x0000);  // f32 subnormal
    assert_int_equal(quant_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(quant_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(quant_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(quant_f32_to_f16(0.1f), 0x2e66);
}

static void test_quant_bf16_conversions(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_bf16_to_f32((uint16_t)h);
        assert_int_equal(f32_bits(f), h << 16);  // bf16 is the top half of an f32
        bool is_nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        uint16_t back = quant_f32_to_bf16(f);
        if (is_nan) {
            assert_true((back & 0x7f80) == 0x7f80 && (back & 0x7f));
            assert_int_equal(back & 0x8000, h & 0x8000);
            continue;
        }
        assert_int_equal(back, h);
        if ((h & 0x7fff) >= 0x7f80) continue;  // inf: no upper neighbour
        // Midpoint to the next bf16 rounds to even; either side to the nearer.
        uint32_t mid = (h << 16) | 0x8000;
        uint16_t even = (uint16_t)(h & 1 ? h + 1 : h);
        assert_int_equal(quant_f32_to_bf16(bits_f32(mid)), even);
        assert_int_equal(quant_f32_to_bf16(bits_f32(mid - 1)), h);
        assert_int_equal(quant_f32_to_bf16(bits_f32(mid + 1)), (uint16_t)(h + 1));
    }
    assert_int_equal(quant_f32_to_bf16(FLT_MAX), 0x7f80);  // past max + half ulp: inf
    assert_int_equal(quant_f32_to_bf16(-FLT_MAX), 0xff80);
    assert_int_equal(quant_f32_to_bf16(bits_f32(0x7f800001u)), 0x7fc0);  // NaN stays NaN
    assert_int_equal(quant_f32_to_bf16(bits_f32(0xff800001u)) & 0xff80, 0xff80);
    assert_int_equal(quant_f32_to_bf16(1.0f), 0x3f80);
}

static void test_quant_row_converters_match_scalar(void **state) {
    (void)state;
    const uint16_t h[6] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x8000, 0x3555};
    float out[6];
    const struct quant_traits *f16 = quant_traits(QUANT_F16);
    const struct quant_traits *bf16 = quant_traits(QUANT_BF16);
    const struct quant_traits *f32 = quant_traits(QUANT_F32);
    assert_non_null(f16->to_f32);
    f16->to_f32(h, out, 6);
    for (int i = 0; i < 6; i++) assert_true(out[i] == (float)f16_value(h[i]));
    bf16->to_f32(h, out, 6);
    for (int i = 0; i < 6; i++) assert_int_equal(f32_bits(out[i]), (uint32_t)h[i] << 16);
    const float src[3] = {1.5f, -0.0f, 3e38f};
    f32->to_f32(src, out, 3);
    assert_memory_equal(out, src, sizeof(src));
}

static void test_quant_traits_of_known_types(void **state) {
    (void)state;
    // Bytes per block from ggml's block structs, e.g. q4_K: 2 f16 (d, dmin) +
    // 12 packed scale bytes + 128 nibble bytes = 144 per 256 elements.
    const struct {
        uint32_t id;
        const char *name;
        int32_t block_size;
        size_t type_size;
    } want[] = {
        {0, "f32", 1, 4},          {1, "f16", 1, 2},          {2, "q4_0", 32, 18},
        {3, "q4_1", 32, 20},       {6, "q5_0", 32, 22},       {7, "q5_1", 32, 24},
        {8, "q8_0", 32, 34},       {9, "q8_1", 32, 36},       {10, "q2_K", 256, 84},
        {11, "q3_K", 256, 110},    {12, "q4_K", 256, 144},    {13, "q5_K", 256, 176},
        {14, "q6_K", 256, 210},    {15, "q8_K", 256, 292},    {16, "iq2_xxs", 256, 66},
        {17, "iq2_xs", 256, 74},   {18, "iq3_xxs", 256, 98},  {19, "iq1_s", 256, 50},
        {20, "iq4_nl", 32, 18},    {21, "iq3_s", 256, 110},   {22, "iq2_s", 256, 82},
        {23, "iq4_xs", 256, 136},  {24, "i8", 1, 1},          {25, "i16", 1, 2},
        {26, "i32", 1, 4},         {27, "i64", 1, 8},         {28, "f64", 1, 8},
        {29, "iq1_m", 256, 56},    {30, "bf16", 1, 2},        {34, "tq1_0", 256, 54},
        {35, "tq2_0", 256, 66},    {39, "mxfp4", 32, 17},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const struct quant_traits *tr = quant_traits(want[i].id);
        assert_non_null(tr);
        assert_string_equal(tr->name, want[i].name);
        assert_string_equal(quant_name(want[i].id), want[i].name);
        assert_int_equal(tr->block_size, want[i].block_size);
        assert_int_equal(tr->type_size, want[i].type_size);
    }
    assert_int_equal(quant_row_size(QUANT_Q8_0, 64), 68);
    assert_int_equal(quant_row_size(QUANT_Q4_K, 512), 288);
    assert_int_equal(quant_row_size(QUANT_F32, 10), 40);
    assert_int_equal(quant_row_size(QUANT_F16, 0), 0);
    assert_true(quant_is_supported(QUANT_F32));
    assert_true(quant_is_supported(QUANT_F16));
    assert_true(quant_is_supported(QUANT_BF16));
}

static void test_quant_traits_reject_removed_and_unknown_ids(void **state) {
    (void)state;
    // 4, 5: Q4_2/Q4_3; 31..33: Q4_0_4_4/_4_8/_8_8; 36..38: IQ4_NL_4_4/_4_8/_8_8.
    const uint32_t bad[] = {4, 5, 31, 32, 33, 36, 37, 38, 40, 41, 200, 0x80000000u, UINT32_MAX};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_null(quant_traits(bad[i]));
        assert_string_equal(quant_name(bad[i]), "unknown");
        assert_false(quant_is_supported(bad[i]));
    }
}

/* Every block format against the numpy oracle, over random blocks (build
 * product tests/models/quant_vectors.bin, scripts/quants.py vectors). */
static void test_quant_dequant_matches_numpy_oracle(void **state) {
    (void)state;
    const char *path = testutil_path(testutil_build_dir(), "tests/models/quant_vectors.bin");
    size_t len = 0;
    char *buf = testutil_read_file(path, &len);
    assert_non_null(buf);
    size_t off = 0;
    int n_formats = 0;
    while (off < len) {
        uint32_t hdr[2];
        assert_true(off + 8 <= len);
        memcpy(hdr, buf + off, 8);
        off += 8;
        const struct quant_traits *tr = quant_traits(hdr[0]);
        assert_non_null(tr);
        assert_non_null(tr->to_f32);
        const size_t raw_bytes = hdr[1] * tr->type_size;
        const int64_t n = (int64_t)hdr[1] * tr->block_size;
        assert_true(off + raw_bytes + (size_t)n * 4 <= len);
        const void *raw = buf + off;
        float *want = malloc((size_t)n * sizeof(float));
        float *got = malloc((size_t)n * sizeof(float));
        memcpy(want, buf + off + raw_bytes, (size_t)n * 4);
        tr->to_f32(raw, got, n);
        for (int64_t i = 0; i < n; i++) {
            // numpy computes in float64: allow a few float32 roundings
            double tol = 4e-7 * fabs((double)want[i]) + 1e-9;
            if (fabs((double)got[i] - want[i]) > tol) {
                fail_msg("%s element %lld: got %.9g, numpy %.9g", tr->name, (long long)i,
                         (double)got[i], (double)want[i]);
            }
        }
        free(want);
        free(got);
        off += raw_bytes + (size_t)n * 4;
        n_formats++;
    }
    assert_int_equal(n_formats, 10);
    free(buf);
}

static uint64_t rt_state = 42;
static double gauss(void) {  // Box-Muller over a 64-bit LCG
    rt_state = rt_state * 6364136223846793005ull + 1442695040888963407ull;
    double u1 = ((double)(rt_state >> 11) + 0.5) / 9007199254740992.0;
    rt_state = rt_state * 6364136223846793005ull + 1442695040888963407ull;
    double u2 = (double)(rt_state >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Relative RMS error bounds of a quantize -> dequantize round trip of
 * Gaussian data (docs/quantization.md): about 1.2x the measured values. */
static const struct {
    enum quant_type type;
    double max_rel_rmse;
} round_trip_bounds[] = {
    {QUANT_Q8_0, 0.0065}, {QUANT_Q8_1, 0.0065}, {QUANT_Q8_K, 0.0085},
    {QUANT_Q6_K, 0.0215}, {QUANT_Q5_0, 0.0490}, {QUANT_Q5_1, 0.0450},
    {QUANT_Q5_K, 0.0440}, {QUANT_Q4_0, 0.0980}, {QUANT_Q4_1, 0.0930},
    {QUANT_Q4_K, 0.0870}, {QUANT_Q3_K, 0.1750}, {QUANT_Q2_K, 0.3300},
    {QUANT_F16, 0.0003},  {QUANT_BF16, 0.0020}, {QUANT_F32, 0.0},
};

static void test_quant_round_trip_error_within_bounds(void **state) {
    (void)state;
    const int64_t n = 256 * 64;
    float *x = malloc((size_t)n * sizeof(float));
    float *y = malloc((size_t)n * sizeof(float));
    void *q = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = (float)gauss();
    for (size_t k = 0; k < sizeof(round_trip_bounds) / sizeof(round_trip_bounds[0]); k++) {
        const struct quant_traits *tr = quant_traits(round_trip_bounds[k].type);
        assert_non_null(tr->from_f32);
        tr->from_f32(x, q, n);
        tr->to_f32(q, y, n);
        double se = 0, sx = 0;
        for (int64_t i = 0; i < n; i++) {
            se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        double rel = sqrt(se / sx);
        print_message("%-5s relative rmse %.5f (bound %.4f)\n", tr->name, rel,
                      round_trip_bounds[k].max_rel_rmse);
        assert_true(rel <= round_trip_bounds[k].max_rel_rmse);
    }
    free(x);
    free(y);
    free(q);
}

/* Zeros, constants and one outlier per block: no NaN, zeros stay zero, and
 * the extreme element of a symmetric format comes back within its step. */
static void test_quant_round_trip_edge_blocks(void **state) {
    (void)state;
    const int64_t n = 256;
    float x[256], y[256];
    uint8_t q[256 * 4];
    for (int t = 0; t < QUANT_TYPE_COUNT; t++) {
        const struct quant_traits *tr = quant_traits((uint32_t)t);
        if (!tr || !tr->from_f32) continue;
        for (int pattern = 0; pattern < 3; pattern++) {
            for (int64_t i = 0; i < n; i++) {
                x[i] = pattern == 0 ? 0.0f : pattern == 1 ? 0.75f : (i % 37 == 0 ? 50.0f : 0.01f);
            }
            tr->from_f32(x, q, n);
            tr->to_f32(q, y, n);
            for (int64_t i = 0; i < n; i++) {
                assert_false(isnan(y[i]));
                if (pattern == 0) assert_true(y[i] == 0.0f);
                if (pattern == 2 && x[i] == 50.0f) assert_true(fabsf(y[i] - 50.0f) < 0.6f * 50.0f);
            }
        }
    }
}

static void test_quant_type_from_name(void **state) {
    (void)state;
    assert_int_equal(quant_type_from_name("q4_K"), QUANT_Q4_K);
    assert_int_equal(quant_type_from_name("Q4_K"), QUANT_Q4_K);
    assert_int_equal(quant_type_from_name("F16"), QUANT_F16);
    assert_int_equal(quant_type_from_name("q8_0"), QUANT_Q8_0);
    assert_int_equal(quant_type_from_name("q4_K_M"), -1);
    assert_int_equal(quant_type_from_name(""), -1);
    const enum quant_type weights[] = {QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1,
                                       QUANT_Q8_0, QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K,
                                       QUANT_Q5_K, QUANT_Q6_K};
    for (size_t i = 0; i < sizeof(weights) / sizeof(weights[0]); i++) {
        assert_true(quant_is_supported(weights[i]));
        const struct quant_traits *vd = quant_traits(quant_traits(weights[i])->vec_dot_type);
        assert_int_equal(vd->block_size, quant_traits(weights[i])->block_size);
    }
    assert_false(quant_is_supported(QUANT_Q8_K));  // activations only
    assert_false(quant_is_supported(QUANT_IQ2_XXS));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quant_f16_to_f32_matches_the_definition),
        cmocka_unit_test(test_quant_f16_round_trips_every_value),
        cmocka_unit_test(test_quant_f32_to_f16_rounds_to_nearest_even),
        cmocka_unit_test(test_quant_f32_to_f16_overflow_and_underflow),
        cmocka_unit_test(test_quant_bf16_conversions),
        cmocka_unit_test(test_quant_row_converters_match_scalar),
        cmocka_unit_test(test_quant_traits_of_known_types),
        cmocka_unit_test(test_quant_traits_reject_removed_and_unknown_ids),
        cmocka_unit_test(test_quant_dequant_matches_numpy_oracle),
        cmocka_unit_test(test_quant_round_trip_error_within_bounds),
        cmocka_unit_test(test_quant_round_trip_edge_blocks),
        cmocka_unit_test(test_quant_type_from_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
