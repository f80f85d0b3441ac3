/*
 * sampler.h - choosing the next token from a row of logits, per sequence:
 * greedy, temperature, top-k, top-p, min-p, repetition / presence / frequency
 * penalties, logit bias, a per-request seed, and log-probabilities.
 *
 * A struct sampler is one sequence's state (parameters, RNG, token history);
 * it belongs to whichever thread samples that sequence (the step thread).
 * struct sampler_scratch holds the O(n_vocab) work arrays and is shared by all
 * samplers of one thread, so nothing vocabulary-sized is allocated per
 * sequence or per step.
 */
#ifndef LLMSERVE_SAMPLER_H
#define LLMSERVE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#define SAMPLER_MAX_TOP_LOGPROBS 20

struct sampler_logit_bias {
    int32_t token;
    float bias;  // added to the logit; -100 or less bans the token (OpenAI)
};

struct sampler_params {
    float temperature;                          // 0: greedy (argmax)
    int32_t top_k;                              // <= 0: off
    float top_p;                                // 1: off
    float min_p;                                // 0: off
    float repetition_penalty;                   // 1: off; over the last repeat_last_n tokens,
                                                //    prompt included (llama.cpp / HF rule)
    int32_t repeat_last_n;                      // window of the repetition penalty
    float presence_penalty;                     // 0: off; OpenAI rule, over generated tokens
    float frequency_penalty;                    // 0: off; OpenAI rule, over generated tokens
    uint64_t seed;                              // used when has_seed
    bool has_seed;                              // false: seeded from the OS
    int32_t n_logit_bias;
    const struct sampler_logit_bias *logit_bias;  // [n_logit_bias], copied by sampler_create
    int32_t n_top_logprobs;                     // alternatives reported, 0..SAMPLER_MAX_TOP_LOGPROBS
};

struct sampler_params sampler_default_params(void);

/* Checks ranges (temperature >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, penalties
 * finite, bias tokens < n_vocab, n_top_logprobs in range). Returns 0 or
 * ERR_INVAL with a message in msg (size msg_size) naming the field. */
int sampler_params_validate(const struct sampler_params *p, int32_t n_vocab, char *msg,
                            size_t msg_size);

struct sampler;
struct sampler_scratch;

/* Owned by the caller (sampler_free()); NULL when out of memory. p must be valid. */
struct sampler *sampler_create(const struct sampler_params *p, int32_t n_vocab);
void sampler_free(struct sampler *s);  // NULL-safe

/* Work arrays for samplers of vocabulary size n_vocab; owned by the caller
 * (sampler_scratch_free()); NULL when out of memory. */
struct sampler_scratch *sampler_scratch_create(int32_t n_vocab);
void sampler_scratch_free(struct sampler_scratch *sc);  // NULL-safe

/* Records a token of the sequence for the penalties: prompt tokens with
 * is_prompt true, then every sampled token (sampler_sample records it itself). */
void sampler_accept(struct sampler *s, int32_t token, bool is_prompt);

struct sampler_logprob {
    int32_t token;
    float logprob;
};

/* Log-probabilities are those of the model's distribution, log_softmax of the
 * raw logits (before penalties, bias, temperature and truncation), as vLLM
 * reports them by default. */
struct sampler_result {
    int32_t token;                                       // the chosen token
    float logprob;                                       // its log-probability
    int32_t n_top;                                       // entries in top
    struct sampler_logprob top[SAMPLER_MAX_TOP_LOGPROBS];  // most likely first
};

/* Samples from logits [n_vocab] (not modified) and records the chosen token.
 * Returns the token id. Deterministic for a given seed and history. */
int32_t sampler_sample(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                       struct sampler_result *out);

#endif
