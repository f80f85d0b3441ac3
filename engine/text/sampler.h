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
 *
 * The pipeline of sampler_sample(), in this order:
 *   1. copy the logits into the scratch (NaN is read as -inf);
 *  1b. with an allowed-token mask (a grammar, engine/text/grammar.h): every token
 *      outside it becomes -inf, so everything below acts on allowed tokens only;
 *   2. logit bias: logit += bias, or -inf when bias <= -100 (a ban);
 *   3. repetition penalty over the distinct tokens among the last repeat_last_n
 *      tokens of prompt + generated: logit > 0 ? logit / penalty : logit * penalty;
 *   4. presence / frequency penalty over the generated tokens (OpenAI):
 *      logit -= count * frequency_penalty + (count > 0) * presence_penalty;
 *   5. temperature == 0: argmax (ties go to the lowest id), done;
 *   6. top-k: keep the k largest logits (ties: lowest id);
 *   7. temperature: logit / temperature, then softmax over what is left;
 *   8. top-p: keep the smallest set, by descending probability, whose
 *      cumulative probability is >= top_p;
 *   9. min-p: drop tokens with p < min_p * p_max;
 *  10. renormalise and draw one token with the sequence's RNG.
 * Steps 8 and 9 both keep a prefix of the same descending order computed from
 * the probabilities of step 7, so their result does not depend on how the
 * implementation interleaves them. Log-probabilities come from the raw logits
 * (see struct sampler_result), not from this pipeline.
 */
#ifndef LLMSERVE_SAMPLER_H
#define LLMSERVE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
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

/* Defaults: temperature 1, top_k 0, top_p 1, min_p 0, repetition_penalty 1,
 * repeat_last_n 64, presence and frequency penalty 0, no seed, no bias, no
 * alternatives. [any thread] */
struct sampler_params sampler_default_params(void);

/* Checks ranges (temperature >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, penalties
 * finite, bias tokens < n_vocab, n_top_logprobs in range). Returns 0 or
 * ERR_INVAL with a message in msg (size msg_size) naming the field. In detail:
 * temperature finite >= 0; top_k any value (<= 0 or >= n_vocab: off);
 * repetition_penalty finite > 0; repeat_last_n >= -1 (-1: the whole history,
 * 0: off); presence_penalty and frequency_penalty in [-2, 2] (OpenAI);
 * logit_bias tokens in [0, n_vocab) with bias in [-100, 100]; top_logprobs
 * (n_top_logprobs) in [0, SAMPLER_MAX_TOP_LOGPROBS]. msg may be NULL when
 * msg_size is 0. [any thread] */
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

/* A trial of generated tokens (a sampled draft's: each draft token's
 * distribution must see the draft's tokens before it, as the model's will
 * at verification): sampler_mark() returns the number of generated tokens
 * recorded, and sampler_rewind(s, mark) takes back every generated token
 * recorded since, newest first, leaving the history as it was. The RNG is
 * not rewound. [the sequence's thread] */
int32_t sampler_mark(const struct sampler *s);
void sampler_rewind(struct sampler *s, int32_t mark);

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
 * Returns the token id. Deterministic for a given seed and history. out may
 * be NULL when the caller needs only the token: filling it costs one more
 * pass over the row (a log-sum-exp), often more than the sampling itself, so
 * pass NULL when the request asked for no log-probs. sc must have been created
 * for at least s's n_vocab; its contents are overwritten. Cost: greedy is one
 * pass; top-k <= 512 one pass plus O(k log k); without top-k, top-p sorts only
 * the tokens that can be in the nucleus. [step thread] */
/* Index of the largest of x [n] (ties: the lowest index; NaN ignored; 0
 * when none): the greedy choice, as step 5 above makes it. [any thread] */
int32_t sampler_argmax(const float *x, int32_t n);

int32_t sampler_sample(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                       struct sampler_result *out);

/* sampler_sample() with an allowed-token mask allow [ceil(n_vocab / 64)]
 * (bit i of word i / 64 set: token i may be chosen; NULL: all may), applied
 * as step 1b. At least one token must be allowed: with none, the result is
 * token 0, which the caller must not use. [step thread] */
int32_t sampler_sample_allowed(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                               const uint64_t *allow, struct sampler_result *out);

/* The distribution sampler_sample() would draw from for these logits and the
 * current history, after the whole pipeline: writes probs [n_vocab] (0 for
 * every token the pipeline dropped; one 1 at the argmax when temperature is 0)
 * and returns how many tokens have a non-zero probability. Neither records a
 * token nor advances the RNG. For tests and debugging. [step thread] */
int32_t sampler_probs(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                      float *probs);
/* The same under an allowed-token mask (as sampler_sample_allowed()). */
int32_t sampler_probs_allowed(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                              const uint64_t *allow, float *probs);

/* Speculative sampling from a draft drawn from a known distribution (the
 * rejection rule of Leviathan et al. and Chen et al., 2023).
 * sampler_draft(): writes q [n_vocab], the distribution
 * sampler_sample_allowed() would draw from for these logits (a draft model's
 * row), the mask allow (NULL: none; the grammar's state after the draft's
 * earlier tokens) and the current history, and draws one token from it with
 * the sequence's RNG; records nothing. sampler_sample_draft(): for the
 * model's logits, whose pipeline distribution (mask and all) is p, keeps
 * draft with probability min(1, p(draft) / q(draft)), or else draws from
 * max(0, p - q) renormalised; records and returns the token, as
 * sampler_sample_allowed().
 * When draft was drawn from q, the token is distributed exactly as p: a
 * token other than draft means the draft was rejected. [step thread] */
int32_t sampler_draft(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                      const uint64_t *allow, float *q);
int32_t sampler_sample_draft(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                             const uint64_t *allow, int32_t draft, const float *q,
                             struct sampler_result *out);

/* True when the tokens are a function of the logits and the history alone:
 * temperature 0 (greedy) or a seed. Speculative decoding keeps such
 * sequences' tokens exactly those of decoding without drafts, so it drafts
 * greedily for them rather than with sampler_draft(). [any thread] */
bool sampler_is_deterministic(const struct sampler *s);

/* Tokens recorded so far by sampler_accept() / sampler_sample(). */
int32_t sampler_n_prompt(const struct sampler *s);
int32_t sampler_n_generated(const struct sampler *s);

/* Invariant check (STYLE 2.6): the generated-token counts behind the presence
 * and frequency penalties agree with the history. For tests and debug builds. */
bool sampler_check(const struct sampler *s);

#endif
