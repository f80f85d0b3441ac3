/*
 * server/draft_model.h - the draft model of --draft-model (speculative
 * decoding, scheduler/drafter.h): loaded beside the served model and
 * checked to speak its vocabulary, since a draft is a list of token ids the
 * served model then verifies.
 */
#ifndef LLMSERVE_DRAFT_MODEL_H
#define LLMSERVE_DRAFT_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* Vocabularies may differ in size by this many ids at most (models of one
 * family pad their embedding tables differently, e.g. Qwen2.5 0.5B and 7B);
 * the ids both have must be the same tokens. */
#define DRAFT_MODEL_MAX_VOCAB_DIFF 128

/* -1 when the draft tokenizer can draft for the target: sizes within
 * DRAFT_MODEL_MAX_VOCAB_DIFF and every id both have spelling the same
 * vocabulary string; else the first id that differs (the smaller size when
 * only the sizes are too far apart). */
int32_t draft_model_vocab_mismatch(const struct tokenizer *target, const struct tokenizer *draft);

/* Loads path as the draft model for target and checks the vocabulary.
 * Returns 0, or the load's error or ERR_INVAL (another vocabulary), with a
 * message for the operator in msg [msg_size]. *out is owned by the caller
 * (engine_model_free()). [main thread] */
int draft_model_load(const char *path, const struct engine_model *target, bool show_progress,
                     struct engine_model **out, char *msg, size_t msg_size);

#endif // LLMSERVE_DRAFT_MODEL_H
