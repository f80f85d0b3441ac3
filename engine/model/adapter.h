/*
 * adapter.h - what a loaded adapter holds, and its application inside the
 * forward pass. Private to the engine: lora.c loads adapters (and owns the
 * public API of engine/lora.h), forward.c calls the apply functions.
 *
 * The matrices keep their file's type when it is f32, f16 or bf16 (anything
 * else is converted to f32 at load), and the update runs as two thin
 * products per chunk of tokens sharing an adapter:
 *   LoRA, per projection:  y[t] += B (s A x[t]),  s = alpha / r (rsLoRA: / sqrt r);
 *                          B's rows are in the base's row order (RoPE-permuted
 *                          for the q/k of a llama base when the file is PEFT's)
 *   bottleneck, per sub-layer output h (attention after wo, FFN after down):
 *                          h[t] += U (s act(D h[t] + bd)) + s bu
 * A (and D) are rows [r][n_in] multiplied by row dots, one token at a time;
 * B (and U) are stored in the panel layout of kernels.h ([n_out] rows packed
 * by 16) and multiplied by the panel products over all tokens of a chunk (up
 * to 8 tokens of one adapter) at once, so each weight is read once per chunk.
 *
 * Batch invariance: a token's rank vector is r dots in a fixed order over
 * its own activations, and every element of B's product is one accumulator
 * over k = r in order (the panel products' guarantee), then one addition into
 * y: a token's result does not depend on the other tokens of the batch, their
 * adapters, how they are cut into chunks or the number of threads, bit for
 * bit. Tokens without an adapter are never touched.
 */
#ifndef LLMSERVE_ADAPTER_H
#define LLMSERVE_ADAPTER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model/lora.h"
#include "engine/format/quant.h"

struct threadpool;

/* The projections a LoRA can change, in a layer's order. */
enum adapter_proj {
    ADAPTER_PROJ_Q,     // attn_q      HF q_proj
    ADAPTER_PROJ_K,     // attn_k      HF k_proj
    ADAPTER_PROJ_V,     // attn_v      HF v_proj
    ADAPTER_PROJ_O,     // attn_output HF o_proj
    ADAPTER_PROJ_GATE,  // ffn_gate    HF gate_proj
    ADAPTER_PROJ_UP,    // ffn_up      HF up_proj
    ADAPTER_PROJ_DOWN,  // ffn_down    HF down_proj
    ADAPTER_PROJ_COUNT,
};

/* Where a bottleneck module sits: after a layer's attention or FFN output. */
enum adapter_pos {
    ADAPTER_POS_ATTN,
    ADAPTER_POS_FFN,
    ADAPTER_POS_COUNT,
};

enum adapter_act {
    ADAPTER_ACT_RELU,
    ADAPTER_ACT_GELU,  // exact GELU, x * Phi(x) with erf (PyTorch's default nn.GELU)
    ADAPTER_ACT_SILU,
};

/* Most projections one adapter_apply_lora() call updates (q, k and v share
 * their input). */
#define ADAPTER_MAX_TARGETS 3

/* One projection's low-rank update; rank 0: the adapter leaves it alone. */
struct adapter_lora {
    int32_t rank;
    int32_t n_in;
    int32_t n_out;
    float scale;              // s: alpha / rank, or alpha / sqrt(rank) (rsLoRA)
    enum quant_type a_type;   // QUANT_F32, QUANT_F16 or QUANT_BF16
    enum quant_type b_type;
    void *a;                  // [rank][n_in] rows, owned
    void *b;                  // B [n_out][rank] in panels (kernels.h), owned, 64-byte aligned
};

/* One bottleneck module; width 0: none at this place. */
struct adapter_bottleneck {
    int32_t width;            // m
    int32_t n_embd;
    enum quant_type down_type;
    enum quant_type up_type;
    void *down;               // D [m][n_embd] rows, owned
    float *down_b;            // [m], owned (zeros when the file has no bias)
    void *up;                 // U [n_embd][m] in panels, owned, 64-byte aligned
    float *up_b;              // [n_embd], owned: s * bu (zeros without a bias)
    float scale;              // s, folded into the rank vector (and into up_b)
};

struct engine_adapter {
    atomic_int n_refs;
    const struct engine_model *model;  // borrowed: the model it was checked against
    struct engine_adapter_info info;   // info.path points at path
    char *path;                        // owned
    int32_t n_layer;
    enum adapter_act act;              // bottleneck only
    struct adapter_lora *lora;         // [n_layer * ADAPTER_PROJ_COUNT], owned, or NULL
    struct adapter_bottleneck *bn;     // [n_layer * ADAPTER_POS_COUNT], owned, or NULL
    int32_t max_rank;                  // largest LoRA rank (0: none)
    int32_t max_width;                 // largest bottleneck width (0: none)
};

/* Floats of rank-vector scratch one token needs for adapter a (see
 * struct adapter_batch.tmp): ADAPTER_MAX_TARGETS rank vectors, or one
 * bottleneck width. */
int32_t adapter_tmp_floats(const struct engine_adapter *a);

/* Tokens an apply item handles at most: one tile of the AVX-512 panel
 * product, so a chunk's B product reads each weight once. */
#define ADAPTER_CHUNK_TOKENS 8

/* Up to ADAPTER_CHUNK_TOKENS consecutive adapter tokens (in adapter_batch
 * order) under one adapter: the unit of work of an apply. */
struct adapter_chunk {
    const struct engine_adapter *adapter;
    int32_t k0;  // first token of the chunk in adapter_batch order
    int32_t n;   // tokens in the chunk
};

/* The tokens of one batch that have an adapter, ordered by slot so tokens
 * sharing an adapter are adjacent and cut into chunks, and the scratch of
 * the applies. The arrays are the ctx's (sized at creation, tmp grown by
 * engine_ctx_set_adapter()); adapter_batch_build() fills the counts.
 * n_tokens 0 makes every apply a no-op. */
struct adapter_batch {
    int32_t n_tokens;
    int32_t *token;                 // [T] batch index of each adapter token
    int32_t n_chunks;
    struct adapter_chunk *chunks;   // [T]
    float *tmp;                     // [T][width]: a chunk's rank vectors at tmp + k0 * width
    int32_t width;                  // floats per token in tmp (>= adapter_tmp_floats of any slot)
    float *out;                     // [T][out_floats]: B products before they are added to y
    int64_t out_floats;             // floats per token in out (>= the summed n_out of one apply)
};

/* Allocates ab's arrays for batches of up to max_tokens tokens, out_floats
 * floats of products per token; tmp stays empty until
 * adapter_batch_reserve(). Returns 0 or ERR_NOMEM (ab then needs only
 * adapter_batch_deinit()). */
int adapter_batch_init(struct adapter_batch *ab, int32_t max_tokens, int64_t out_floats);

/* Grows tmp to at least width floats per token (max_tokens as at init).
 * Returns 0 or ERR_NOMEM (ab unchanged). */
int adapter_batch_reserve(struct adapter_batch *ab, int32_t max_tokens, int32_t width);

/* Frees the arrays; safe on a zeroed or partly initialised ab. */
void adapter_batch_deinit(struct adapter_batch *ab);

/* Fills ab from the batch's adapter slots (adapter may be NULL: no
 * adapters). slots holds n_slots entries; every slot a token names is full
 * (engine_forward checked). count is scratch of n_slots + 1 ints. */
void adapter_batch_build(struct adapter_batch *ab, const int32_t *adapter, int32_t n_tokens,
                         const struct engine_adapter *const *slots, int32_t n_slots,
                         int32_t *count);

/* One output of adapter_apply_lora(): projection p writes y [T][n_out]. */
struct adapter_target {
    enum adapter_proj proj;
    float *y;
    int32_t n_out;
};

/* For up to ADAPTER_MAX_TARGETS projections of layer il sharing the input x
 * [T][n_in]: y[t] += B (s A x[t]) for every token of ab whose adapter changes
 * the projection (rows indexed by batch position). One parallel region over
 * the chunks; none when no chunk's adapter changes these projections. */
void adapter_apply_lora(struct threadpool *pool, const struct adapter_batch *ab, int32_t il,
                        const float *x, int32_t n_in, const struct adapter_target *targets,
                        int32_t n_targets);

/* h[t] += U (s act(D h[t] + bd)) + s bu for every token of ab whose adapter
 * has a module at (il, pos); h is [T][n_embd]. */
void adapter_apply_bottleneck(struct threadpool *pool, const struct adapter_batch *ab,
                              int32_t il, enum adapter_pos pos, float *h, int32_t n_embd);

/* Frees a's matrices and a itself (the last reference was dropped). NULL-safe;
 * accepts a partly built adapter. */
void adapter_free(struct engine_adapter *a);

/* Bytes of the element type of an adapter matrix (f32: 4, f16/bf16: 2). */
size_t adapter_elem_size(enum quant_type t);

/* Bytes of a [n_rows][k] matrix of type t in panels (64-byte multiple). */
size_t adapter_panel_bytes(enum quant_type t, int64_t n_rows, int64_t k);

/* Bytes of each matrix of one projection's update or one bottleneck module,
 * in the layout above (the panels' with their padding). */
static inline size_t adapter_lora_a_bytes(const struct adapter_lora *l) {
    return (size_t)l->rank * (size_t)l->n_in * adapter_elem_size(l->a_type);
}
static inline size_t adapter_lora_b_bytes(const struct adapter_lora *l) {
    return adapter_panel_bytes(l->b_type, l->n_out, l->rank);
}
static inline size_t adapter_bn_down_bytes(const struct adapter_bottleneck *b) {
    return (size_t)b->width * (size_t)b->n_embd * adapter_elem_size(b->down_type);
}
static inline size_t adapter_bn_up_bytes(const struct adapter_bottleneck *b) {
    return adapter_panel_bytes(b->up_type, b->n_embd, b->width);
}

/* rows [n_rows][k] of type t (f32/f16/bf16, row-major) packed into new
 * panels (64-byte aligned; the caller frees them); adds their bytes to
 * *bytes. NULL when out of memory. */
void *adapter_panels_from_rows(enum quant_type t, const void *rows, int64_t n_rows, int64_t k,
                               size_t *bytes);

/* *out: a copy of full (the adapter as loaded, for the whole model) cut to
 * the slice of model m (m->shard, model/shard.h), the same way as the
 * matrices it changes: under tensor parallelism B keeps the rows of this
 * rank's heads or FFN columns for the column-parallel projections (q, k, v,
 * gate, up) and A the matching columns for the row-parallel ones (o, down),
 * whose partial updates the layer's allreduce sums with the base's; a
 * pipeline stage keeps its own layers; bottleneck modules, which act on the
 * whole residual stream after the allreduce, are kept whole. m is the
 * copy's model (another process's twin of full's under MPI). Without a cut
 * (TP 1, PP 1; sequence parallelism keeps everything) *out is full with one
 * more reference. Returns 0 or ERR_NOMEM (*out NULL). */
int adapter_cut(struct engine_adapter *full, const struct engine_model *m,
                struct engine_adapter **out);

#endif
