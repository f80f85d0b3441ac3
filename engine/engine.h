/*
 * engine.h - THE public engine API: load a model, create a compute context
 * with its paged KV storage, run one forward pass over a batch of tokens from
 * many sequences.
 *
 * What the engine owns and what it does not: the engine owns the weights (a
 * view into the GGUF file's bytes, read into memory), the activation scratch (sized once, at
 * context creation, for the largest batch) and the KV block storage (one pool
 * of n_blocks blocks allocated once). It does NOT decide which block belongs to
 * which sequence: the caller (the scheduler) passes each sequence's block
 * table in every batch. The engine never allocates a block.
 *
 * Threads: an engine_model is immutable after loading and may be read from
 * any thread (tokenizer and chat queries come from the HTTP thread). An
 * engine_ctx belongs to one thread, the step thread: engine_forward() is not
 * thread-safe. The ctx's kernel worker pool is internal.
 */
#ifndef LLMSERVE_ENGINE_H
#define LLMSERVE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The engine's other public parts: the communicator of tensor parallelism,
// the KV storage types, adapters (LoRA, bottleneck), the model's tokenizer,
// the per-sequence sampler, grammars for constrained decoding and the
// stop-string matcher. engine.h is the umbrella header the scheduler and the
// server include; each of these includes nothing of the engine but
// engine/base/.
#include "engine/comm/comm.h"
#include "engine/format/kv_type.h"
#include "engine/model/lora.h"
#include "engine/text/gbnf.h"
#include "engine/text/grammar.h"
#include "engine/text/sampler.h"
#include "engine/text/stop.h"
#include "engine/text/tokenizer.h"

struct engine_model;
struct engine_ctx;

/* ---- model ------------------------------------------------------------ */

struct engine_model_params {
    const char *path;    // GGUF file
    bool show_progress;  // show the weight packing's progress on the log fd
                         // (engine/base/progress.h); default false
    int32_t tp_rank;     // tensor parallelism: this process's rank, 0 <= tp_rank < tp_size
    int32_t tp_size;     // ranks the model is split over (default 1: all of it here); each
                         // rank keeps its own heads and FFN columns only, rank 0 also the
                         // classifier (engine/model/shard.h, docs/parallelism.md)
    int32_t pp_rank;     // pipeline parallelism: this process's stage, 0 <= pp_rank < pp_size
    int32_t pp_size;     // stages the layers are split over (default 1); each stage keeps a
                         // contiguous range of layers only (and its KV pool only those)
    int32_t sp_rank;     // sequence parallelism: this process's rank, 0 <= sp_rank < sp_size
    int32_t sp_size;     // ranks a step's tokens are split over (default 1); each holds the
                         // whole model and KV cache and computes its share of the tokens;
                         // not with tp_size or pp_size > 1
};

struct engine_model_params engine_model_default_params(void);

/* Loads and validates a GGUF model (with tp_size > 1: rank tp_rank's slice
 * of it). On success *out is owned by the caller (free with
 * engine_model_free()). Returns 0, ERR_IO, ERR_FORMAT (corrupt file,
 * missing or mis-shaped tensor: the message names it), ERR_UNSUPPORTED
 * (architecture or weight type not supported, or a model that cannot be
 * split over tp_size ranks: the message names it), ERR_INVAL (tp_rank out
 * of range) or ERR_NOMEM. Loading involves no other rank: under tensor
 * parallelism, pass the result through comm_agree() before going on.
 * [any thread] */
int engine_model_load(const struct engine_model_params *p, struct engine_model **out);

/* NULL-safe. No ctx of this model may outlive it. */
void engine_model_free(struct engine_model *m);

/* Read-only facts about a loaded model. Valid for the model's life. */
struct engine_model_info {
    const char *arch;          // "llama", "qwen2", "qwen3"
    const char *name;          // general.name, or the file's base name
    const char *weight_type;   // most common type of the 2-D weights: "f32", "f16", ...
    int32_t n_vocab;
    int32_t n_ctx_train;       // <arch>.context_length
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_ff;
    int32_t sliding_window;    // 0: none
    int64_t n_params;          // elements of all tensors
    size_t weight_bytes;       // bytes of all tensors
    size_t file_bytes_read;    // bytes of tensor data read from the file: only this rank's
                               //   slices in a parallel job (engine_model_load)
};

const struct engine_model_info *engine_model_get_info(const struct engine_model *m);

/* The model's tokenizer; borrowed, valid for the model's life. [any thread] */
const struct tokenizer *engine_model_tokenizer(const struct engine_model *m);

/* Loads only the vocabulary of the GGUF file at path (its tokenizer.* keys;
 * no tensors read, none needed: vocab-only files such as ggml-vocab-*.gguf
 * work), for tools that tokenize. *out is owned by the caller
 * (tokenizer_free()). Returns 0, ERR_NOTFOUND (the file has no tokenizer) or
 * the open/parse error; each is logged with the path. [any thread] */
int engine_tokenizer_load(const char *path, struct tokenizer **out);

/* True when token ends generation (eos, eot and the other end-of-turn tokens
 * of the vocabulary); false when the model has no tokenizer. [any thread] */
bool engine_model_is_eog(const struct engine_model *m, int32_t token);

/* The model's tokenizer.chat_template text (NUL-terminated, borrowed for the
 * model's life), or NULL when the file has none. [any thread] */
const char *engine_model_chat_template(const struct engine_model *m);

/* ---- context and KV storage -------------------------------------------- */

/* How K and V are stored in the KV pool (enum engine_kv_type, its names and
 * their parser): engine/format/kv_type.h, included above. */

#define ENGINE_MAX_ADAPTERS 1024  // most adapter slots of one ctx

struct engine_ctx_params {
    int32_t n_threads;         // kernel threads (and OpenBLAS threads); 0: all cores
    int32_t max_batch_tokens;  // most tokens in one engine_forward()
    int32_t max_seqs;          // most sequences in one engine_forward()
    int32_t max_outputs;       // most logits rows per engine_forward(); 0: max_seqs
    int32_t block_size;        // tokens per KV block (default 16)
    int32_t n_blocks;          // KV blocks in the pool, block 0 included (block 0 is the
                               // null block: never written, never read)
    int32_t max_adapters;      // adapter slots (engine/lora.h), 0..ENGINE_MAX_ADAPTERS;
                               // 0: adapters not used
    enum engine_kv_type kv_type;  // storage of the KV pool (default F32)
    bool kv_divided;           // sequence parallelism only: the pool divided over the SP
                               // ranks, each holding n_blocks / SP of them (compute/kv.h;
                               // n_blocks a multiple of SP); false: each holds all (default)
    struct comm *comm;         // tensor parallelism: the job's ranks (borrowed; outlives the
                               // ctx); NULL: this process alone (default)
    struct engine_ctx *pool_of; // NULL: a worker pool of its own (default); else run on this
                               // ctx's pool (n_threads is its), as a speculative-decoding
                               // draft model does beside the model it drafts for: two pools
                               // would spin against each other on the same cores. Borrowed:
                               // it outlives this ctx, and both are used from one thread.
                               // Not with comm.
};

struct engine_ctx_params engine_ctx_default_params(void);

/* Bytes one KV block of kv_type takes for this model (K and V of every
 * layer; under tensor parallelism of this rank's kv heads only). Lets the
 * caller turn a memory budget into n_blocks. */
size_t engine_kv_block_bytes(const struct engine_model *m, int32_t block_size,
                             enum engine_kv_type kv_type);

/* Creates a context: worker pool, scratch for max_batch_tokens, the KV pool.
 * *out is owned by the caller (engine_ctx_free()). Returns 0, ERR_INVAL (bad
 * params, or a comm whose rank and size are not the model's tp_rank and
 * tp_size; logged), ERR_UNSUPPORTED (adapters under tensor parallelism;
 * logged) or ERR_NOMEM (KV pool or scratch too big; logged with the sizes).
 * Retains m until engine_ctx_free(). [any thread, before use]
 *
 * Tensor parallelism (comm of more than one rank): a collective. Every rank
 * calls it; the ranks other than 0 take every limit (all but n_threads and
 * comm) from rank 0's params, and all of them return the same code (if it
 * fails anywhere, it fails everywhere). Then rank 0 runs engine_forward()
 * and the others engine_follow() on their ctx, until rank 0 frees its own. */
int engine_ctx_create(const struct engine_model *m, const struct engine_ctx_params *p,
                      struct engine_ctx **out);

/* NULL-safe. On rank 0 of a tensor-parallel job, tells the other ranks to
 * return from engine_follow() (on the thread that ran the steps, or after it
 * was joined). */
void engine_ctx_free(struct engine_ctx *ctx);

/* ---- batch and forward ---------------------------------------------------- */

/* One sequence of a batch: where its KV lives. Block i of the table holds the
 * positions [i * block_size, (i + 1) * block_size). Entries of blocks wholly
 * outside a sliding window may be 0 (the null block); they are not read. */
struct engine_seq {
    const int32_t *block_table;  // [n_blocks] block ids; borrowed for the call
    int32_t n_blocks;
};

/* A batch: parallel arrays, one entry per token (as llama_batch), plus the
 * sequences they belong to. Every array is borrowed for the call.
 *
 * The token at position pos of sequence s writes its K/V into slot
 * pos % block_size of block block_table[pos / block_size] and attends to the
 * positions [max(0, pos - window + 1), pos] of s, which must all be in the KV
 * pool already or be written by this batch. Tokens may come in any order. */
struct engine_batch {
    int32_t n_tokens;
    const int32_t *token;    // [n_tokens] token ids, 0 <= id < n_vocab
    const int32_t *pos;      // [n_tokens] positions, 0 <= pos < n_blocks * block_size of its seq
    const int32_t *seq;      // [n_tokens] index into seqs
    const int32_t *adapter;  // [n_tokens] adapter slot, -1 = none; NULL = none for all
    const int8_t *output;    // [n_tokens] 1 = compute this token's logits
    int32_t n_seqs;
    const struct engine_seq *seqs;  // [n_seqs]
};

/* Runs the decoder over the batch (under tensor parallelism: on rank 0, with
 * the other ranks in engine_follow()). Indices, positions and block ids are our
 * own promises and are ASSERTed. On success *out_logits points at
 * [n_outputs][n_vocab] floats, one row per token whose output flag is set, in
 * batch order; owned by ctx, valid until the next engine_forward() on ctx.
 * Returns 0, or ERR_INVAL if the batch exceeds the ctx's limits or a token
 * names an adapter slot that is out of range or empty (logged). [step thread] */
int engine_forward(struct engine_ctx *ctx, const struct engine_batch *batch,
                   const float **out_logits);

/* Tensor parallelism, ranks other than 0: runs, on ctx's slice of the model,
 * every forward pass rank 0's ctx runs (the batch comes from rank 0 in a
 * step descriptor, engine/compute/step_desc.h), and returns 0 when rank 0
 * frees its ctx. Waiting for a step costs no CPU. [the thread that created
 * ctx] */
int engine_follow(struct engine_ctx *ctx);

/* One rank's figures (tensor parallelism; at TP 1 this process's). */
struct engine_rank_stats {
    int64_t peak_rss_bytes;  // peak resident memory of the process (getrusage)
    int64_t forward_ns;      // time spent in forward passes since the ctx was created
    int64_t n_steps;         // forward passes (steps) since then: forward_ns / n_steps is
                             //   the mean step time of this rank
    int64_t comm_bytes;      // bytes handed to collectives (comm_bytes_sent)
    int64_t rss_bytes;       // resident memory of the process now (/proc/self/statm)
    int64_t model_read_bytes;  // tensor data the rank read from the model file (its slices)
};

/* Peak resident memory of this process in bytes (getrusage). [any thread] */
int64_t engine_peak_rss_bytes(void);

/* Resident memory of this process now, in bytes (/proc/self/statm; 0 where
 * it cannot be read). [any thread] */
int64_t engine_rss_bytes(void);

/* Every rank's figures, rank 0 first, into out[0 .. min(n, max)); returns n,
 * the number of ranks. The other ranks' figures are those of their last
 * report: rank 0 asks for one with a step at most once a second
 * (ENGINE_RANK_REPORT_MS), so they are up to a second and a step old; rank
 * 0's own are fresh. Rank 0 only. [step thread] */
#define ENGINE_RANK_REPORT_MS 1000
int32_t engine_ctx_rank_stats(const struct engine_ctx *ctx, struct engine_rank_stats *out,
                              int32_t max);

/* The model a ctx was created with. */
const struct engine_model *engine_ctx_model(const struct engine_ctx *ctx);

/* Tokens per block and blocks in the pool, as created. */
int32_t engine_ctx_block_size(const struct engine_ctx *ctx);
int32_t engine_ctx_n_blocks(const struct engine_ctx *ctx);

#endif
