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

#include "engine/tensor.h"

struct threadpool;

/* Batches up to this many tokens multiply by row dots instead of sgemm. */
#define KERN_GEMV_MAX_TOKENS 4

/* Converts n elements of a row of type t (f32, f16, bf16) to f32. */
typedef void (*kern_to_f32_fn)(const void *restrict src, float *restrict dst, int64_t n);

/* The chosen paths; filled once by kern_dispatch_init(), then read-only. */
struct kern_dispatch {
    const char *isa;              // "avx512", "avx2", "portable"
    kern_to_f32_fn f16_to_f32;
    kern_to_f32_fn bf16_to_f32;
    float (*dot_f32)(const float *restrict a, const float *restrict b, int64_t n);
    // dot of a weight row of f16 / bf16 elements with f32 activations
    float (*dot_f16)(const void *restrict w, const float *restrict x, int64_t n);
    float (*dot_bf16)(const void *restrict w, const float *restrict x, int64_t n);
};

/* Detects the CPU and returns the table (idempotent; thread-safe after the first
 * call returns; call it once at start-up). force_portable selects the reference
 * paths (tests). */
const struct kern_dispatch *kern_dispatch_init(bool force_portable);

/* The table chosen by the last kern_dispatch_init(). */
const struct kern_dispatch *kern_get(void);

/* Reference implementations (kernels/ref.c). */
void kern_ref_f16_to_f32(const void *restrict src, float *restrict dst, int64_t n);
void kern_ref_bf16_to_f32(const void *restrict src, float *restrict dst, int64_t n);
float kern_ref_dot_f32(const float *restrict a, const float *restrict b, int64_t n);
float kern_ref_dot_f16(const void *restrict w, const float *restrict x, int64_t n);
float kern_ref_dot_bf16(const void *restrict w, const float *restrict x, int64_t n);

/* AVX2 + F16C + FMA paths (kernels/avx2.c); call only when the CPU has them. */
void kern_avx2_f16_to_f32(const void *restrict src, float *restrict dst, int64_t n);
void kern_avx2_bf16_to_f32(const void *restrict src, float *restrict dst, int64_t n);
float kern_avx2_dot_f32(const float *restrict a, const float *restrict b, int64_t n);
float kern_avx2_dot_f16(const void *restrict w, const float *restrict x, int64_t n);
float kern_avx2_dot_bf16(const void *restrict w, const float *restrict x, int64_t n);

/* ---- matrix products (kernels/blas.c) -------------------------------------- */

/* Per-thread conversion tiles for f16/bf16 weights; owned by the ctx. */
struct kern_scratch {
    int32_t n_threads;
    int32_t tile_rows;   // weight rows converted per tile
    int64_t max_k;       // longest weight row (elements)
    float **tiles;       // [n_threads][tile_rows * max_k], owned
};

/* Allocates tiles for rows of up to max_k elements. Returns 0 or ERR_NOMEM. */
int kern_scratch_init(struct kern_scratch *s, int32_t n_threads, int64_t max_k);
void kern_scratch_free(struct kern_scratch *s);  // safe on a zeroed struct

/* y[n_tokens][n_out] = x[n_tokens][n_in] * W^T, with W a [n_in, n_out] tensor
 * (n_out rows of n_in elements) of type f32, f16 or bf16. The output rows of W
 * are split across the pool's threads. Up to KERN_GEMV_MAX_TOKENS tokens (decode)
 * use our own row-dot kernels, which read each weight row once straight from
 * the mapping in its own type (memory-bound: fewer bytes is faster); more
 * tokens (prefill) go to OpenBLAS sgemm, f16/bf16 rows converted tile by tile
 * into the scratch first (the model is never copied whole). x and y must not
 * alias. */
void kern_matmul(struct threadpool *pool, struct kern_scratch *scratch, const struct tensor *w,
                 const float *x, int64_t n_tokens, float *y);

/* Tells OpenBLAS to use one thread (our pool parallelises) and returns its core
 * name ("SkylakeX", "Prescott", ...) for the start-up log. */
const char *kern_blas_init(void);

/* True when OpenBLAS picked a generic kernel on a CPU that has AVX-512 or
 * AVX2 and OPENBLAS_CORETYPE is not set: *out_coretype then names the value
 * to set (read by OpenBLAS only when it loads, so the process must re-exec). */
bool kern_blas_wants_coretype(const char **out_coretype);

#endif
