/*
 * kernels.h - the kern_* entry points the forward pass calls, and the
 * dispatch table of SIMD paths chosen once at start-up from CPUID.
 *
 * Every kernel has a portable reference (kernels/ref.c) that is the oracle in
 * tests; SIMD versions live in kernels/avx2.c and kernels/avx512.c and are
 * picked by kern_dispatch_init(). OpenBLAS is used only by kernels/blas.c.
 *
 * Threads: kern_matmul() runs on a threadpool (the ctx's); the row-level
 * functions are pure and may run on any thread.
 */
#ifndef LLMSERVE_KERNELS_H
#define LLMSERVE_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/format/tensor.h"

struct threadpool;

/* Batches up to this many tokens multiply unpacked f32/f16/bf16 weights (no
 * panels) by row dots instead of sgemm. */
#define KERN_GEMV_MAX_TOKENS 4

/* Rows of a weight matrix per panel of the packed layout (see "panels"). */
#define KERN_PANEL_ROWS 16

/* y[t][16 p0 .. min(16 p1, n)) = x[t] . W^T for t < n_tokens over panels
 * [p0, p1) of pw, a [k, n] weight packed by kern_panel_pack(); x is
 * [n_tokens][k] and y [n_tokens][n] (row strides k and n). */
typedef void (*kern_panel_fn)(const float *restrict x, int64_t n_tokens, const void *restrict pw,
                              int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);

/* The panel products of one level, by weight type. */
struct kern_panel {
    kern_panel_fn f32;
    kern_panel_fn f16;
    kern_panel_fn bf16;
};

/* y[t][16 p0 .. min(16 p1, n)) = W . act[t] for t < n_tokens over q-panels
 * [p0, p1) of pw, a quantized [k, n] weight packed by kern_panel_pack(); xq
 * holds n_tokens activation rows of kern_qpanel_act_bytes(type, k) bytes
 * written by a kern_qpanel_act_fn, y is [n_tokens][n]. */
typedef void (*kern_qpanel_fn)(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                               int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);

/* Writes the activation row of x[k] for q-panel products over weights of
 * type t (see "q-panels": kern_qpanel_ref_act and its SIMD twins). */
typedef void (*kern_qpanel_act_fn)(enum quant_type t, const float *restrict x, int64_t k,
                                   void *restrict dst);

/* Converts n elements of a row of type t (f32, f16, bf16) to f32. */
typedef void (*kern_to_f32_fn)(const void *restrict src, float *restrict dst, int64_t n);
/* f32 -> f16, rounded to nearest even (quant_f32_to_f16's bits in every path,
 * NaN included: it becomes quant_f32_to_f16's quiet NaN of the same sign). */
typedef void (*kern_from_f32_fn)(const float *restrict src, void *restrict dst, int64_t n);

/* g[i] = silu(g[i]) * u[i] for i < n, silu(z) = z sigmoid(z) (SwiGLU's
 * gate times its up projection), sigmoid from e = exp(-|z|): 1 / (1 + e) for
 * z >= 0, e / (1 + e) below, exp by one degree-6 polynomial after a
 * reduction by ln 2 (relative error below 3e-7). kern_ref_swiglu's bits in
 * every path: each element sees the same IEEE operations in the same order,
 * so no element depends on where in a row or a batch it is. */
typedef void (*kern_swiglu_fn)(float *restrict g, const float *restrict u, int64_t n);

/* Dot product of one weight row of n elements (n a multiple of the type's
 * block size) with one activation row quantized to the weight type's partner
 * (quant_traits(t)->vec_dot_type: q8_0, q8_1 or q8_K). */
typedef float (*kern_vec_dot_fn)(const void *restrict w, const void *restrict xq, int64_t n);

/* Instruction-set levels for the quantized kernels, lowest first. */
enum kern_isa {
    KERN_ISA_PORTABLE = 0,
    KERN_ISA_AVX2 = 1,     // AVX2 + FMA + F16C
    KERN_ISA_AVX512 = 2,   // + AVX-512 F, BW, VL
    KERN_ISA_VNNI = 3,     // + AVX-512 VNNI
    KERN_ISA_AMX = 4,      // + AMX-TILE and AMX-INT8, which the kernel let us use
};

/* The chosen paths; filled once by kern_dispatch_init(), then read-only. */
struct kern_dispatch {
    const char *isa;              // "avx512", "avx2", "portable"
    kern_to_f32_fn f16_to_f32;
    kern_to_f32_fn bf16_to_f32;
    kern_from_f32_fn f32_to_f16;  // the KV cache's f16 writes
    kern_swiglu_fn swiglu;        // the FFN's activation
    float (*dot_f32)(const float *restrict a, const float *restrict b, int64_t n);
    // dot of a weight row of f16 / bf16 elements with f32 activations
    float (*dot_f16)(const void *restrict w, const float *restrict x, int64_t n);
    float (*dot_bf16)(const void *restrict w, const float *restrict x, int64_t n);
    enum kern_isa isa_quant;                       // level of the vec_dot entries
    kern_vec_dot_fn vec_dot[QUANT_TYPE_COUNT];     // by weight type; NULL: none
    enum kern_isa isa_panel;                       // level of the panel products
    struct kern_panel panel;
    enum kern_isa isa_qpanel;                      // level of the q-panel products
    kern_qpanel_fn qpanel[QUANT_TYPE_COUNT];       // by weight type; NULL: no q-panels
    kern_qpanel_act_fn qpanel_act;                 // activations for the q-panel products
};

/* The highest level this CPU supports (CPUID), whatever was dispatched. */
enum kern_isa kern_isa_detect(void);

/* The vec_dot table of one level (tests run every level the CPU has against
 * KERN_ISA_PORTABLE); entries a level lacks fall back to the level below. */
void kern_vec_dot_table(enum kern_isa isa, kern_vec_dot_fn out[QUANT_TYPE_COUNT]);

/* The panel products of one level (tests compare every level the CPU has);
 * VNNI uses the AVX-512 ones. */
void kern_panel_table(enum kern_isa isa, struct kern_panel *out);

/* A busy-wait's pause (x86 PAUSE; nothing elsewhere): the thread pool calls it
 * on every turn of its spins, so a waiting thread leaves the core's pipeline
 * and memory ports to the one doing the work (engine/threadpool.c). */
void kern_spin_pause(void);

/* Name of a level: "portable", "avx2", "avx512", "avx512-vnni", "amx". */
const char *kern_isa_name(enum kern_isa isa);

/* Detects the CPU and returns the table (idempotent; thread-safe after the first
 * call returns; call it once at start-up). force_portable selects the reference
 * paths (tests). */
const struct kern_dispatch *kern_dispatch_init(bool force_portable);

/* The table chosen by the last kern_dispatch_init(). */
const struct kern_dispatch *kern_get(void);

/* Reference implementations (kernels/ref.c). */
void kern_ref_f16_to_f32(const void *restrict src, float *restrict dst, int64_t n);
void kern_ref_f32_to_f16(const float *restrict src, void *restrict dst, int64_t n);
void kern_ref_bf16_to_f32(const void *restrict src, float *restrict dst, int64_t n);
void kern_ref_swiglu(float *restrict g, const float *restrict u, int64_t n);
float kern_ref_dot_f32(const float *restrict a, const float *restrict b, int64_t n);
float kern_ref_dot_f16(const void *restrict w, const float *restrict x, int64_t n);
float kern_ref_dot_bf16(const void *restrict w, const float *restrict x, int64_t n);

float kern_ref_vec_dot_q4_0(const void *restrict w, const void *restrict xq, int64_t n);
float kern_ref_vec_dot_q4_1(const void *restrict w, const void *restrict xq, int64_t n);
float kern_ref_vec_dot_q5_0(const void *restrict w, const void *restrict xq, int64_t n);
float kern_ref_vec_dot_q5_1(const void *restrict w, const void *restrict xq, int64_t n);
float kern_ref_vec_dot_q8_0(const void *restrict w, const void *restrict xq, int64_t n);
float kern_ref_vec_dot_q2_K(const void *restrict w, const void *restrict xq, int64_t n);
float kern_ref_vec_dot_q3_K(const void *restrict w, const void *restrict xq, int64_t n);
float kern_ref_vec_dot_q4_K(const void *restrict w, const void *restrict xq, int64_t n);
float kern_ref_vec_dot_q5_K(const void *restrict w, const void *restrict xq, int64_t n);
float kern_ref_vec_dot_q6_K(const void *restrict w, const void *restrict xq, int64_t n);

/* AVX2 + F16C + FMA paths (kernels/avx2.c); call only when the CPU has them. */
void kern_avx2_f16_to_f32(const void *restrict src, float *restrict dst, int64_t n);
void kern_avx2_f32_to_f16(const float *restrict src, void *restrict dst, int64_t n);
void kern_avx2_bf16_to_f32(const void *restrict src, float *restrict dst, int64_t n);
void kern_avx2_swiglu(float *restrict g, const float *restrict u, int64_t n);
float kern_avx2_dot_f32(const float *restrict a, const float *restrict b, int64_t n);
float kern_avx2_dot_f16(const void *restrict w, const float *restrict x, int64_t n);
float kern_avx2_dot_bf16(const void *restrict w, const float *restrict x, int64_t n);
float kern_avx2_vec_dot_q4_0(const void *restrict w, const void *restrict xq, int64_t n);
float kern_avx2_vec_dot_q4_1(const void *restrict w, const void *restrict xq, int64_t n);
float kern_avx2_vec_dot_q5_0(const void *restrict w, const void *restrict xq, int64_t n);
float kern_avx2_vec_dot_q5_1(const void *restrict w, const void *restrict xq, int64_t n);
float kern_avx2_vec_dot_q8_0(const void *restrict w, const void *restrict xq, int64_t n);
float kern_avx2_vec_dot_q4_K(const void *restrict w, const void *restrict xq, int64_t n);
float kern_avx2_vec_dot_q6_K(const void *restrict w, const void *restrict xq, int64_t n);

/* AVX-512 F/BW/VL paths and their VNNI twins (kernels/avx512.c, built twice). */
float kern_avx512_vec_dot_q4_0(const void *restrict w, const void *restrict xq, int64_t n);
float kern_avx512_vec_dot_q8_0(const void *restrict w, const void *restrict xq, int64_t n);
float kern_vnni_vec_dot_q4_0(const void *restrict w, const void *restrict xq, int64_t n);
float kern_vnni_vec_dot_q8_0(const void *restrict w, const void *restrict xq, int64_t n);

/* ---- panels: f32/f16/bf16 weights repacked for batches (kernels/panel*.c) ----
 *
 * A [k, n] weight (n rows of k elements) is stored as ceil(n / 16) panels of
 * KERN_PANEL_ROWS rows interleaved by column, pw[p][j][r] = W[16 p + r][j]
 * (rows past n zero), in the weight's own type. One k step of a panel is one
 * 64-byte line (f32) or half of one (f16/bf16), so a SIMD register holds the
 * weights of 16 outputs and a tile of tokens x panels reuses each weight load
 * for every token of the tile: the weights stream from memory once per
 * matmul whatever the batch size, and the product runs at the FMA rate, not
 * at the rate OpenBLAS's per-call packing leaves for small batches.
 *
 * Batch invariance: every output y[t][i] is one accumulator taking
 * fma(W[i][j], x[t][j], acc) for j = 0 .. k-1 in that order, in every
 * implementation (portable with fmaf, AVX2, AVX-512) and every tile shape. A
 * token's result therefore depends only on its own activations, bit for bit,
 * at any batch size and position, and all levels agree exactly. */

/* True for the types that have a panel layout: f32, f16, bf16, and the
 * quantized types with q-panels (kern_qpanel_supports(), see "q-panels"). */
bool kern_panel_supports(enum quant_type t);

/* Bytes of w's panels (a 2-D tensor of a type kern_panel_supports()); a
 * multiple of 64 for q-panels. */
size_t kern_panel_bytes(const struct tensor *w);

/* Writes w's panels (or q-panels) into dst (kern_panel_bytes(w), 64-byte
 * aligned). Reads every row of w once. */
void kern_panel_pack(const struct tensor *w, void *dst);

void kern_panel_ref_f32(const float *restrict x, int64_t n_tokens, const void *restrict pw,
                        int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_panel_ref_f16(const float *restrict x, int64_t n_tokens, const void *restrict pw,
                        int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_panel_ref_bf16(const float *restrict x, int64_t n_tokens, const void *restrict pw,
                         int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_panel_avx2_f32(const float *restrict x, int64_t n_tokens, const void *restrict pw,
                         int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_panel_avx2_f16(const float *restrict x, int64_t n_tokens, const void *restrict pw,
                         int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_panel_avx2_bf16(const float *restrict x, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_panel_avx512_f32(const float *restrict x, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_panel_avx512_f16(const float *restrict x, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_panel_avx512_bf16(const float *restrict x, int64_t n_tokens, const void *restrict pw,
                            int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);

/* ---- q-panels: quantized weights repacked for integer SIMD (kernels/qpanel*.c)
 *
 * A quantized [k, n] weight is stored as ceil(n / 16) panels of
 * KERN_PANEL_ROWS rows. Along k a panel is cut into the type's blocks (32
 * elements for q8_0/q4_0, 256 for the K-quants); each panel-block holds the
 * 16 rows' quants in 64-byte chunks, one per group of 4 consecutive k
 * (or two groups for 4-bit and 6-bit quants, in the low and high nibbles):
 *
 *     chunk byte 4 r + b = the quant of row r at k = 4 g + b    (r < 16, b < 4)
 *
 * so one zmm holds 16 output rows x 4 k, and vpdpbusd against the 4
 * activation bytes of group g broadcast to every lane makes 64 products, one
 * int32 sum per row. Quants are stored unsigned (q8_0 as w + 128, the others
 * as GGUF keeps them, 0..2^bits-1); the offset is folded in per token from
 * the sum of its activations in the block, so every integer sum is the
 * exact one of the GGUF dot product. The 16 rows' scales (and mins) follow,
 * unpacked to one byte or f16 per row. A panel is
 *
 *     [quants of block 0][block 1]...[block nb-1][meta of block 0]...[meta nb-1]
 *
 * padded to 64 bytes; kernels/qpanel.c documents each type's chunk order
 * and meta fields. About as many bytes as the GGUF rows (q4_K and q6_K
 * +2-3% for their unpacked scales); the loader drops the file's copy.
 *
 * Activations are quantized per token to the weight's partner type exactly
 * as the row dots do (q8_0 qs and d for q8_0/q4_0, q8_K for the K-quants),
 * and laid out with float scales and the per-block sums the offsets need.
 *
 * Batch invariance and exactness: per (row, token) the integer sum of each
 * block (or sub-block) is exact, and the float work is one fixed sequence of
 * IEEE operations over the blocks in k order (kernels/qpanel.c, per type),
 * the same in the portable, AVX2, AVX-512 and VNNI kernels and at every tile
 * shape. A token's outputs are therefore the same bits whatever its batch,
 * and every level equals the portable one bit for bit. Against the row dots
 * (kern_vec_dot_fn) the result differs only by the float order over blocks. */

/* True for the quantized types that have a q-panel layout. */
bool kern_qpanel_supports(enum quant_type t);

/* Bytes of one panel of a [k, *] weight of type t (a multiple of 64). */
size_t kern_qpanel_stride(enum quant_type t, int64_t k);

/* Writes w's q-panels into dst (ceil(n / 16) * kern_qpanel_stride() bytes,
 * 64-byte aligned); kern_panel_pack() calls it for quantized types. */
void kern_qpanel_pack(const struct tensor *w, void *dst);

/* Bytes of one activation row of k elements for weights of type t (a
 * multiple of 64) that a kern_qpanel_act_fn writes. */
size_t kern_qpanel_act_bytes(enum quant_type t, int64_t k);

/* The fields of one activation row. q8_0 partners (q8_0, q4_0, q5_0, q4_1,
 * q5_1 weights; blocks of 32): d and the block sums s of the qs, times the
 * offsets the unsigned quants need. q8_K partners (K-quants; blocks of 256):
 * d and GGUF's bsums (sums of 16) in the forms the kernels consume. */
struct kern_qact {
    const int8_t *qs;     // [k] activations, k order
    const float *d;       // [nb] block scales
    const int32_t *n8;    // [nb] q8_0: -8 s
    const int32_t *n16;   // [nb] q8_0: -16 s
    const int32_t *n128;  // [nb] q8_0: -128 s
    const float *fs;      // [nb] q8_0: (float)s
    const int32_t *n32;   // [nb][16] q8_K: -32 bsums
    const int32_t *n4;    // [nb][16] q8_K: -4 bsums
    const int16_t *b16;   // [nb][16] q8_K: bsums
    const int16_t *b32;   // [nb][8] q8_K: sums of 32 (bsums in pairs)
};

/* The view of an activation row of k elements for weights of type t. */
static inline struct kern_qact kern_qact_view(enum quant_type t, const void *row, int64_t k) {
    struct kern_qact a = {.qs = (const int8_t *)row};
    const uint8_t *p = (const uint8_t *)row + k;
    if (quant_traits(t)->vec_dot_type == QUANT_Q8_K) {
        const int64_t nb = k / QK_K;
        a.d = (const float *)p;
        a.n32 = (const int32_t *)(p + 4 * nb);
        a.n4 = a.n32 + 16 * nb;
        a.b16 = (const int16_t *)(a.n4 + 16 * nb);
        a.b32 = a.b16 + 16 * nb;
    } else {
        const int64_t nb = k / QK8_0;
        a.d = (const float *)p;
        a.n8 = (const int32_t *)(p + 4 * nb);
        a.n16 = a.n8 + nb;
        a.n128 = a.n16 + nb;
        a.fs = (const float *)(a.n128 + nb);
    }
    return a;
}

/* Quantizes x[k] to the partner type of weight type t (per block, exactly as
 * quant_traits(vec_dot_type)->from_f32 rounds) into the activation row dst
 * (kern_qpanel_act_bytes()). Every level writes the same bytes. */
void kern_qpanel_ref_act(enum quant_type t, const float *restrict x, int64_t k,
                         void *restrict dst);
void kern_qpanel_avx2_act(enum quant_type t, const float *restrict x, int64_t k,
                          void *restrict dst);
void kern_qpanel_avx512_act(enum quant_type t, const float *restrict x, int64_t k,
                            void *restrict dst);

/* The activation quantizer of one level (VNNI uses the AVX-512 one). */
kern_qpanel_act_fn kern_qpanel_act_select(enum kern_isa isa);

/* The q-panel products of one level, by weight type (NULL where a type has
 * none; levels without their own kernel for a type use the level below). */
void kern_qpanel_table(enum kern_isa isa, kern_qpanel_fn out[QUANT_TYPE_COUNT]);

void kern_qpanel_ref_q8_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_ref_q4_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_ref_q4_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_ref_q6_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx2_q5_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx2_q4_1(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx2_q5_1(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx2_q2_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx2_q3_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx2_q5_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx512_q5_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                             int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx512_q4_1(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                             int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx512_q5_1(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                             int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx512_q2_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                             int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx512_q3_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                             int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx512_q5_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                             int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_vnni_q5_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_vnni_q4_1(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_vnni_q5_1(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_vnni_q2_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_vnni_q3_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_vnni_q5_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_ref_q5_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_ref_q4_1(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_ref_q5_1(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_ref_q2_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_ref_q3_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_ref_q5_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx2_q8_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx2_q4_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx2_q4_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx2_q6_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx512_q8_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                             int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx512_q4_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                             int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx512_q4_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                             int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_avx512_q6_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                             int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_vnni_q8_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_vnni_q4_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
/* AMX-INT8 tiles for groups of 16 tokens, the rest through the VNNI ones. */
void kern_qpanel_amx_q8_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_amx_q4_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_vnni_q4_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);
void kern_qpanel_vnni_q6_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y);

/* ---- matrix products (kernels/blas.c) -------------------------------------- */

/* Quantized weights without q-panels (tensors built outside the loader)
 * multiply by integer row dots against activations rounded to 8 bits per
 * block, at every batch size by default: each (row, token) result is then
 * computed by the same code from the same operands, whatever else is in the
 * batch, so greedy outputs are batch-invariant. The alternative, dequantizing
 * weight tiles into sgemm, gives the same product up to float rounding, but a
 * rounding difference before an activation is cut to 8 bits moves it a whole
 * step, which can flip a near-tie between tokens. It is kept for batches above
 * kern_scratch.qdot_max_tokens. A loaded model's quantized matrices have
 * q-panels, which are faster than both at every batch size
 * (docs/quantization.md) and use no switch on the batch size at all. */
#define KERN_QDOT_MAX_TOKENS INT32_MAX

/* Per-thread conversion tiles for f16/bf16/quantized weights, and the
 * activations of quantized matmuls; owned by the ctx. */
struct kern_scratch {
    int32_t n_threads;
    int32_t tile_rows;   // weight rows converted per tile
    int64_t max_k;       // longest weight row (elements)
    float **tiles;       // [n_threads][tile_rows * max_k], owned
    // [n_tokens] rows of quantized activations, or of f32 activations rounded
    // through the quantized type (prefill); owned. Grown by kern_matmul() on the
    // first batch that needs more (bounded by the ctx's batch size), so a
    // running server stops allocating after its largest step.
    void *act;
    size_t act_bytes;
    int32_t qdot_max_tokens;  // integer path up to this many tokens (KERN_QDOT_MAX_TOKENS)
};

/* Allocates tiles for rows of up to max_k elements. Returns 0 or ERR_NOMEM. */
int kern_scratch_init(struct kern_scratch *s, int32_t n_threads, int64_t max_k);
void kern_scratch_free(struct kern_scratch *s);  // safe on a zeroed struct

/* y[n_tokens][n_out] = x[n_tokens][n_in] * W^T, with W a [n_in, n_out] tensor
 * (n_out rows of n_in elements) of type f32, f16 or bf16, or a quantized type
 * (quant_is_supported()). Weights with panels (w->panels, as a loaded model's
 * matrices have) use the panel products (f32/f16/bf16, see "panels") or the
 * q-panel products (quantized, see "q-panels": every token's activations are
 * first quantized to the weight's partner type, per token) at every batch
 * size, split by panels across the pool's threads; both are batch-invariant
 * bit for bit. Without panels: quantized weights use the same per-token
 * activations with integer row dots (kern_get()->vec_dot) up to
 * scratch->qdot_max_tokens tokens and, above, those activations in f32
 * against dequantized weight tiles in sgemm (the same product up to float
 * rounding); f32/f16/bf16 weights use our own row dots up to
 * KERN_GEMV_MAX_TOKENS tokens and OpenBLAS sgemm above, f16/bf16 rows
 * converted tile by tile into the scratch first. x and y must not alias. */
void kern_matmul(struct threadpool *pool, struct kern_scratch *scratch, const struct tensor *w,
                 const float *x, int64_t n_tokens, float *y);

/* One product of a group: y [n_tokens][w->ne[1]] = x * w^T. */
struct kern_product {
    const struct tensor *w;
    float *y;
};

#define KERN_GROUP_MAX 4

/* Rows [r0, r1) of a group's outputs, for every token, are final. */
typedef void (*kern_rows_fn)(void *arg, int64_t r0, int64_t r1);

/* The n <= KERN_GROUP_MAX products p[i].y = x * p[i].w^T of one input x
 * [n_tokens][k] (every w has k columns): the same results, bit for bit, as n
 * kern_matmul() calls, in one parallel region instead of n when every w has
 * panels, with x quantized once per weight type. A decode step is a few
 * milliseconds of ~100 regions, and between regions the pool's other threads
 * wait, so fewer regions is time back (Q/K/V, gate/up). If epilogue is set,
 * every w must have the same rows n_out, and epilogue(arg, r0, r1) runs on
 * the thread that computed rows [r0, r1) of every product, right after them
 * (without panels: in a region of its own after the products), with ranges
 * that cover [0, n_out) once. kern_matmul() on a weight with panels is a
 * group of one. */
void kern_matmul_group(struct threadpool *pool, struct kern_scratch *scratch, const float *x,
                       int64_t n_tokens, const struct kern_product *p, int32_t n,
                       kern_rows_fn epilogue, void *arg);

/* Tells OpenBLAS to use one thread (our pool parallelises) and returns its core
 * name ("SkylakeX", "Prescott", ...) for the start-up log. */
const char *kern_blas_init(void);

/* True when OpenBLAS picked a generic kernel on a CPU that has AVX-512 or
 * AVX2 and OPENBLAS_CORETYPE is not set: *out_coretype then names the value
 * to set (read by OpenBLAS only when it loads, so the process must re-exec). */
bool kern_blas_wants_coretype(const char **out_coretype);

#endif
