/*
 * lora.h - adapters on a frozen base model: LoRA (PEFT directories and GGUF
 * LoRA files) and bottleneck adapters, loaded beside the base weights (which
 * are never changed), and the ctx's adapter slots that a batch's tokens name.
 *
 * Two stages, so that the slow part never runs on the step thread:
 *   engine_adapter_load()   any thread: parse, validate every name and shape
 *                           against the model, convert to f32 (seconds at most).
 *   engine_ctx_set_adapter() step thread: put a loaded adapter into one of the
 *                           ctx's max_adapters slots (no file I/O, no parsing).
 * A loaded adapter is immutable and reference-counted: the registry that loaded
 * it and every slot holding it keep a reference, so an adapter unloaded from
 * the registry while requests still use it lives until the last slot lets go.
 *
 * Identity: engine_adapter_load() gives each adapter object it creates an id
 * from a counter its model owns (1, 2, 3, ...; never reused while the model
 * lives), so an id names one set of weights for good: two loads of the same
 * file are two ids. The scheduler keys prefix-cache blocks by it, so the same
 * object hits its cached blocks in any slot at any time, and nothing computed
 * under other weights is ever reused. Ids of different models may coincide;
 * they are never compared (a ctx takes only its own model's adapters).
 *
 * Part of the engine's public API (engine.h includes this header).
 */
#ifndef LLMSERVE_LORA_H
#define LLMSERVE_LORA_H

#include <stddef.h>
#include <stdint.h>

struct engine_model;
struct engine_ctx;
struct engine_adapter;

enum engine_adapter_kind {
    ENGINE_ADAPTER_LORA = 0,        // y += scale * B (A x) on chosen projections
    ENGINE_ADAPTER_BOTTLENECK = 1,  // h += U act(D h) after a layer's attention / FFN output
};

struct engine_adapter_info {
    enum engine_adapter_kind kind;
    const char *format;   // "peft", "gguf" or "bottleneck"
    const char *path;     // as given to engine_adapter_load
    int32_t rank;         // LoRA: the largest r of its projections; bottleneck: the width
    float scale;          // LoRA: alpha / r (alpha / sqrt(r) with rsLoRA) of the config (PEFT;
                          //   rank/alpha patterns may give projections others) or of
                          //   the first tensor pair (GGUF); bottleneck: its scaling (1)
    int32_t n_targets;    // projections (LoRA) or modules (bottleneck) the adapter changes
    size_t bytes;         // memory the converted weights take
    uint64_t id;          // this loaded object's identity, >= 1: unique among the adapters
                          //   loaded for its model and never reused (see below)
};

/* Loads an adapter for base model m from path, which is one of:
 *   - a PEFT LoRA directory: adapter_config.json (r, lora_alpha, target_modules,
 *     use_rslora, fan_in_fan_out) and adapter_model.safetensors (F32/F16/BF16);
 *     lora_B of q_proj/k_proj is permuted to the GGUF rotary row order when the
 *     base architecture stores Q/K rows permuted (llama);
 *   - a GGUF file with general.type = adapter, adapter.type = lora;
 *   - a bottleneck adapter directory (layout in docs/adapters.md).
 * Every tensor's name and shape is checked against m; a mismatch is rejected
 * and the message names the file and the tensor. On success *out holds one
 * reference (release with engine_adapter_release()) and has a new info.id (a
 * failed load takes none). Returns 0, ERR_IO,
 * ERR_FORMAT, ERR_UNSUPPORTED or ERR_NOMEM. [any thread] */
int engine_adapter_load(const struct engine_model *m, const char *path,
                        struct engine_adapter **out);

/* engine_adapter_load_fd() flags. */
#define ENGINE_ADAPTER_LOAD_NO_SYMLINKS 1u  // a directory's files may not be symlinks (ERR_PERM)

/* As engine_adapter_load(), from fd: an open directory (PEFT, bottleneck),
 * whose files are opened in it with openat(), or an open GGUF file, read
 * through fd. Nothing is opened by path, so what is loaded is what fd
 * names, whatever happens to the names meanwhile (server/lora_path.h).
 * fd is borrowed (not closed); path names the adapter in messages and
 * info.path. With ENGINE_ADAPTER_LOAD_NO_SYMLINKS, a directory's
 * adapter_config.json or adapter_model.safetensors that is a symlink is
 * refused with ERR_PERM (logged). Returns what engine_adapter_load() does,
 * or ERR_PERM. [any thread] */
int engine_adapter_load_fd(const struct engine_model *m, int fd, const char *path,
                           unsigned flags, struct engine_adapter **out);

/* Takes one more reference; returns a. [any thread] */
struct engine_adapter *engine_adapter_retain(struct engine_adapter *a);

/* Drops one reference; the last one frees it. NULL-safe. [any thread] */
void engine_adapter_release(struct engine_adapter *a);

/* Read-only facts; valid while a reference is held. [any thread] */
const struct engine_adapter_info *engine_adapter_get_info(const struct engine_adapter *a);

/* Slots of a ctx: engine_ctx_params.max_adapters of them, numbered
 * 0..max_adapters-1; a batch token's adapter field names one (or -1). Puts a
 * into slot (retaining it and releasing what the slot held), or empties the
 * slot when a is NULL. a must have been loaded for the ctx's model. Tokens of
 * later batches that name the slot get a's update; a batch naming an empty
 * slot is ERR_INVAL in engine_forward(). In a job of several ranks (TP, PP,
 * SP) it is collective: rank 0 calls it, the ranks in engine_follow() take
 * part, a is sent to each (compute/adapter_share.h), and every rank's slot
 * holds its own cut of it (model/adapter.h, adapter_cut: only rank 0 ever
 * reads the adapter's file). Returns 0, ERR_INVAL (slot out of range,
 * adapter of another model) or ERR_NOMEM (under a job: on any rank, and the
 * slot is unchanged on all). [step thread] */
int engine_ctx_set_adapter(struct engine_ctx *ctx, int32_t slot, struct engine_adapter *a);

/* The adapter in a slot, borrowed (NULL when empty): the one given to
 * engine_ctx_set_adapter(), or in a job that cuts adapters (TP, PP) this
 * rank's cut copy of it (same info.id). [step thread] */
const struct engine_adapter *engine_ctx_adapter(const struct engine_ctx *ctx, int32_t slot);

#endif
