/*
 * tests/helpers/fake_engine.h - the link seam for scheduler tests (STYLE
 * 2.15): tests/helpers/fake_engine.c implements the engine.h, tokenizer.h,
 * sampler.h and stop.h functions the scheduler calls, deterministically and
 * without numbers, so scheduler tests link it instead of the engine.
 *
 * The fake model's "forward pass" keeps a fake KV store: per (block, slot)
 * the position and token written there, and a chain hash
 *     h(pos) = H(h(pos - 1), token, pos)
 * read from the slot of pos - 1 through the sequence's block table. The
 * logits of a token are a pure function of its h, so they depend on the whole
 * token history exactly as the blocks hold it: a block-table or prefix-cache
 * bug changes the outputs. Every position a token attends to (its window)
 * must have been written, earlier or in this batch, with that position;
 * violations are counted (fake_engine_n_errors), never crash.
 *
 * Fake adapters (engine/lora.h): engine_adapter_load() accepts any path
 * except those containing "missing" (ERR_IO) or "bad" (ERR_FORMAT); an
 * adapter's effect is a salt (a hash of its path) mixed into h of every token
 * computed under it, so an adapter changes a sequence's whole future, and a
 * block computed under one adapter gives wrong outputs under another. Each load
 * gets a new info.id (1, 2, ... per model), as the engine's do. A load of a
 * path containing "gate" first waits at the model's gate until the test lets
 * it through (fake_engine_gate_*), so a test can hold a load "in progress"
 * for as long as it likes, without timing. A batch
 * naming an empty slot is ERR_INVAL. Adapters must be released before their
 * model is freed.
 *
 * Fake tokenizer: token 1 is eos (eog), 0 is bos; token id t >= 2 decodes to
 * "t<id> " (e.g. "t17 "); 0 and 1 decode to "".
 */
#ifndef TESTS_HELPERS_FAKE_ENGINE_H
#define TESTS_HELPERS_FAKE_ENGINE_H

#include <stdint.h>

#include "engine/engine.h"

#define FAKE_ENGINE_BOS 0
#define FAKE_ENGINE_EOS 1

struct fake_engine_params {
    int32_t n_vocab;         // >= 4
    int32_t n_ctx;           // n_ctx_train
    int32_t sliding_window;  // 0: none
    size_t kv_block_bytes;   // what engine_kv_block_bytes reports per token of a block
};

/* A fake model (free with engine_model_free()). Aborts on OOM. */
struct engine_model *fake_engine_model_create(const struct fake_engine_params *p);

/* Attention/write violations seen by every ctx of m so far (0 when correct). */
int64_t fake_engine_n_errors(const struct engine_model *m);
/* Tokens run through engine_forward() by every ctx of m. */
int64_t fake_engine_n_tokens(const struct engine_model *m);

/* Fake adapters loaded and not yet freed (0 when no reference leaked). */
int32_t fake_engine_n_live_adapters(const struct engine_model *m);
/* engine_ctx_set_adapter() calls that put an adapter into a slot. */
int64_t fake_engine_n_adapter_sets(const struct engine_model *m);

/* engine_adapter_load() calls on m so far (gated ones count when they start). */
int64_t fake_engine_n_loads(const struct engine_model *m);

/* The gate: blocks until n loads in all have arrived at m's gate. [any thread] */
void fake_engine_gate_wait(const struct engine_model *m, int32_t n);
/* Lets n more gated loads through, in arrival order. [any thread] */
void fake_engine_gate_pass(const struct engine_model *m, int32_t n);

/* The greedy next token after the history h of a position (the fake's logits
 * argmax), exposed so tests can build oracles without the scheduler. */
int32_t fake_engine_argmax(const struct engine_model *m, uint64_t h);

#endif // TESTS_HELPERS_FAKE_ENGINE_H
