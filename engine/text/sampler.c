/*
 * sampler.c - the per-sequence sampler: the pipeline of sampler.h over one row
 * of logits, the RNG, the token history and the generated-token counts behind
 * the presence / frequency penalties.
 *
 * Owns each sequence's small state; the O(n_vocab) work arrays live in the
 * thread's struct sampler_scratch. Nothing vocabulary-sized is allocated per
 * call. Invariant (sampler_check): the count map holds, for every distinct
 * generated token, its number of occurrences in gen[0..n_gen).
 */
#include "engine/text/sampler.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"

// top-k up to this size uses a streaming heap (one read of the row, almost
// every logit rejected by one compare); larger k uses quickselect.
#define SAMPLER_HEAP_K_MAX 512
// exp() below this argument is flushed to 0 (expf(-87) is ~1.6e-38).
#define SAMPLER_EXP_MIN (-87.0f)

/* One candidate token: v is a logit, then an unnormalised probability. */
struct sampler_cand {
    float v;
    int32_t id;
};

/* Generated-token count, one per distinct token (dense array + hash index). */
struct sampler_count {
    int32_t token;
    int32_t n;
};

enum sampler_dist {
    SAMPLER_DIST_ONE,     // a single token (greedy, or a degenerate row)
    SAMPLER_DIST_DENSE,   // e[0..n_vocab) in scratch->work, sum z
    SAMPLER_DIST_SPARSE,  // cand[0..n_cand), sum z
};

struct sampler {
    struct sampler_params params;          // logit_bias points at bias
    struct sampler_logit_bias *bias;       // [params.n_logit_bias], owned
    int32_t n_vocab;
    uint64_t rng[4];                       // xoshiro256** state
    int32_t *prompt;                       // [n_prompt] of cap_prompt, owned
    int32_t n_prompt;
    int32_t cap_prompt;
    int32_t *gen;                          // [n_gen] of cap_gen, owned
    int32_t n_gen;
    int32_t cap_gen;
    struct sampler_count *counts;          // [n_counts] of cap_counts / 2, owned
    int32_t n_counts;
    int32_t *slots;                        // [cap_counts] index into counts or -1, owned
    int32_t cap_counts;                    // power of two, or 0 before the first token
};

struct sampler_scratch {
    int32_t n_vocab;
    float *work;                           // [n_vocab] adjusted logits, then exp values
    struct sampler_cand *cand;             // [n_vocab] candidates
    uint32_t *mark;                        // [n_vocab] epoch stamps (dedupes the window)
    uint32_t epoch;
    enum sampler_dist dist;                // result of the last build_dist()
    int32_t n_cand;                        // SPARSE: entries in cand
    int32_t one;                           // ONE: the token
    double z;                              // DENSE / SPARSE: sum of the weights
};

/* ---- params ---------------------------------------------------------- */

struct sampler_params sampler_default_params(void) {
    return (struct sampler_params){
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .repeat_last_n = 64,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = 0,
        .has_seed = false,
        .n_logit_bias = 0,
        .logit_bias = NULL,
        .n_top_logprobs = 0,
    };
}

static int invalid(char *msg, size_t msg_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int invalid(char *msg, size_t msg_size, const char *fmt, ...) {
    if (msg && msg_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_size, fmt, ap);
        va_end(ap);
    }
    return ERR_INVAL;
}

int sampler_params_validate(const struct sampler_params *p, int32_t n_vocab, char *msg,
                            size_t msg_size) {
    if (msg && msg_size) msg[0] = '\0';
    // NOTE: every check is written so that NaN fails it.
    if (!(p->temperature >= 0.0f && isfinite(p->temperature)))
        return invalid(msg, msg_size, "temperature must be a finite number >= 0, got %g",
                       (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return invalid(msg, msg_size, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return invalid(msg, msg_size, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f && isfinite(p->repetition_penalty)))
        return invalid(msg, msg_size, "repetition_penalty must be a finite number > 0, got %g",
                       (double)p->repetition_penalty);
    if (p->repeat_last_n < -1)
        return invalid(msg, msg_size,
                       "repeat_last_n must be -1 (whole history), 0 (off) or more, got %" PRId32,
                       p->repeat_last_n);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return invalid(msg, msg_size, "presence_penalty must be in [-2, 2], got %g",
                       (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return invalid(msg, msg_size, "frequency_penalty must be in [-2, 2], got %g",
                       (double)p->frequency_penalty);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return invalid(msg, msg_size, "logit_bias: bad entry count %" PRId32, p->n_logit_bias);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const struct sampler_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return invalid(msg, msg_size,
                           "logit_bias: token %" PRId32 " is out of range [0, %" PRId32 ")",
                           b->token, n_vocab);
        if (!(b->bias >= -100.0f && b->bias <= 100.0f))
            return invalid(msg, msg_size,
                           "logit_bias: bias for token %" PRId32 " must be in [-100, 100], got %g",
                           b->token, (double)b->bias);
    }
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > SAMPLER_MAX_TOP_LOGPROBS)
        return invalid(msg, msg_size, "top_logprobs must be in [0, %d], got %" PRId32,
                       SAMPLER_MAX_TOP_LOGPROBS, p->n_top_logprobs);
    return 0;
}

/* ---- RNG: xoshiro256** (Blackman & Vigna, "Scrambled linear pseudorandom
 * number generators", 2018), state filled by splitmix64 as they recommend. */

static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4]) {
    uint64_t out = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return out;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

static uint64_t os_seed(const void *salt) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof(seed), 0) == (ssize_t)sizeof(seed)) return seed;
    // No entropy from the kernel: a clock and an address still differ per sequence.
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ (uint64_t)(uintptr_t)salt;
}

/* ---- lifecycle --------------------------------------------------------- */

struct sampler *sampler_create(const struct sampler_params *p, int32_t n_vocab) {
    ASSERT(n_vocab > 0);
    ASSERT(sampler_params_validate(p, n_vocab, NULL, 0) == 0);
    struct sampler *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->params = *p;
    s->n_vocab = n_vocab;
    if (p->n_logit_bias > 0) {
        s->bias = malloc((size_t)p->n_logit_bias * sizeof(*s->bias));
        if (!s->bias) {
            free(s);
            return NULL;
        }
        memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof(*s->bias));
    }
    s->params.logit_bias = s->bias;
    uint64_t x = p->has_seed ? p->seed : os_seed(s);
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64_next(&x);
    return s;
}

void sampler_free(struct sampler *s) {
    if (!s) return;
    free(s->bias);
    free(s->prompt);
    free(s->gen);
    free(s->counts);
    free(s->slots);
    free(s);
}

struct sampler_scratch *sampler_scratch_create(int32_t n_vocab) {
    ASSERT(n_vocab > 0);
    struct sampler_scratch *sc = calloc(1, sizeof(*sc));
    if (!sc) return NULL;
    sc->n_vocab = n_vocab;
    sc->work = malloc((size_t)n_vocab * sizeof(*sc->work));
    sc->cand = malloc((size_t)n_vocab * sizeof(*sc->cand));
    sc->mark = calloc((size_t)n_vocab, sizeof(*sc->mark));
    if (!sc->work || !sc->cand || !sc->mark) {
        sampler_scratch_free(sc);
        return NULL;
    }
    return sc;
}

void sampler_scratch_free(struct sampler_scratch *sc) {
    if (!sc) return;
    free(sc->work);
    free(sc->cand);
    free(sc->mark);
    free(sc);
}

/* ---- history ----------------------------------------------------------- */

static void push_token(int32_t **arr, int32_t *n, int32_t *cap, int32_t token) {
    if (*n == *cap) {
        ASSERT(*cap < INT32_MAX / 2);
        *cap = *cap ? *cap * 2 : 64;
        *arr = xrealloc(*arr, (size_t)*cap * sizeof(**arr));
    }
    (*arr)[(*n)++] = token;
}

static uint32_t hash_token(int32_t token) { return (uint32_t)token * 0x9e3779b1u; }

/* Rebuilds the index of counts into a table of cap slots (a power of two). */
static void counts_rehash(struct sampler *s, int32_t cap) {
    free(s->slots);
    s->slots = xmalloc((size_t)cap * sizeof(*s->slots));
    for (int32_t i = 0; i < cap; i++) s->slots[i] = -1;
    s->counts = xrealloc(s->counts, (size_t)(cap / 2) * sizeof(*s->counts));
    s->cap_counts = cap;
    uint32_t mask = (uint32_t)cap - 1;
    for (int32_t i = 0; i < s->n_counts; i++) {
        uint32_t h = hash_token(s->counts[i].token) & mask;
        while (s->slots[h] >= 0) h = (h + 1) & mask;
        s->slots[h] = i;
    }
}

/* Adds one occurrence of token; the load factor stays below one half. */
static void counts_add(struct sampler *s, int32_t token) {
    if ((s->n_counts + 1) * 2 > s->cap_counts) {
        ASSERT(s->cap_counts < INT32_MAX / 2);
        counts_rehash(s, s->cap_counts ? s->cap_counts * 2 : 64);
    }
    uint32_t mask = (uint32_t)s->cap_counts - 1;
    uint32_t h = hash_token(token) & mask;
    while (s->slots[h] >= 0) {
        struct sampler_count *c = &s->counts[s->slots[h]];
        if (c->token == token) {
            c->n++;
            return;
        }
        h = (h + 1) & mask;
    }
    s->slots[h] = s->n_counts;
    s->counts[s->n_counts++] = (struct sampler_count){.token = token, .n = 1};
}

static int32_t counts_get(const struct sampler *s, int32_t token) {
    if (!s->cap_counts) return 0;
    uint32_t mask = (uint32_t)s->cap_counts - 1;
    for (uint32_t h = hash_token(token) & mask; s->slots[h] >= 0; h = (h + 1) & mask)
        if (s->counts[s->slots[h]].token == token) return s->counts[s->slots[h]].n;
    return 0;
}

void sampler_accept(struct sampler *s, int32_t token, bool is_prompt) {
    ASSERT(token >= 0 && token < s->n_vocab);
    if (is_prompt) {
        push_token(&s->prompt, &s->n_prompt, &s->cap_prompt, token);
    } else {
        push_token(&s->gen, &s->n_gen, &s->cap_gen, token);
        counts_add(s, token);
    }
}

/* Takes back one occurrence of token, the newest token recorded: an entry
 * whose count falls to 0 is then the last of counts, and no entry after it
 * (none are left) probed past its slot, so the slot may simply be freed. */
static void counts_remove_newest(struct sampler *s, int32_t token) {
    uint32_t mask = (uint32_t)s->cap_counts - 1;
    uint32_t h = hash_token(token) & mask;
    while (s->counts[s->slots[h]].token != token) h = (h + 1) & mask;  // it is there
    struct sampler_count *c = &s->counts[s->slots[h]];
    if (--c->n > 0) return;
    ASSERT(s->slots[h] == s->n_counts - 1);
    s->n_counts--;
    s->slots[h] = -1;
}

int32_t sampler_mark(const struct sampler *s) { return s->n_gen; }

void sampler_rewind(struct sampler *s, int32_t mark) {
    ASSERT(mark >= 0 && mark <= s->n_gen);
    while (s->n_gen > mark) counts_remove_newest(s, s->gen[--s->n_gen]);
}

int32_t sampler_n_prompt(const struct sampler *s) { return s->n_prompt; }
int32_t sampler_n_generated(const struct sampler *s) { return s->n_gen; }

bool sampler_check(const struct sampler *s) {
    int64_t total = 0;
    for (int32_t i = 0; i < s->n_counts; i++) {
        const struct sampler_count *c = &s->counts[i];
        int32_t n = 0;
        for (int32_t j = 0; j < s->n_gen; j++) n += s->gen[j] == c->token;
        if (n != c->n || n == 0 || counts_get(s, c->token) != n) return false;
        total += n;
    }
    if (total != s->n_gen) return false;
    int32_t n_used = 0;
    for (int32_t i = 0; i < s->cap_counts; i++) n_used += s->slots[i] >= 0;
    return n_used == s->n_counts && s->n_counts * 2 <= s->cap_counts;
}

/* ---- row kernels ------------------------------------------------------- */

/* NOTE: the row loops below test floats through their bit patterns. With
 * GCC's default -ftrapping-math a float comparison cannot be if-converted, so
 * `x < c ? a : b` would keep every loop scalar; integer tests vectorise. */

static inline uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

static inline bool bits_is_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

/* A signed integer with the order of the floats (-inf lowest, +inf highest);
 * NaN maps to the key of -inf. */
static inline int32_t float_key(float x) {
    uint32_t u = float_bits(x);
    uint32_t k = u ^ ((uint32_t)-(int32_t)(u >> 31) & 0x7fffffffu);
    uint32_t mask = 0u - (uint32_t)bits_is_nan(u);
    return (int32_t)((k & ~mask) | (0x807fffffu & mask));
}

static inline float key_float(int32_t k) {
    uint32_t u = k < 0 ? (uint32_t)k ^ 0x7fffffffu : (uint32_t)k;
    float x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

/* exp(x), for the x <= 0 of a softmax: 0 below SAMPLER_EXP_MIN, for -inf and
 * for NaN; otherwise x = n ln2 + r with |r| <= ln2/2, exp(r) by its Taylor
 * series to r^7 (truncation error < 6e-9, below float precision), times 2^n
 * built in the exponent bits. Branch-free so the row loops vectorise. */
static inline float exp_le0(float x) {
    uint32_t u = float_bits(x);
    // For x <= 0, x < -87 exactly when its bits exceed those of -87.0f. The
    // clamp is done on the bits with a mask: a float select followed by float
    // arithmetic is not if-converted either.
    uint32_t is_zero = (u > 0xc2ae0000u) | bits_is_nan(u);
    uint32_t mask = 0u - is_zero;
    uint32_t u_c = (u & ~mask) | (float_bits(SAMPLER_EXP_MIN) & mask);
    float xc;
    memcpy(&xc, &u_c, sizeof(xc));
    // round(x / ln2) by the 1.5 * 2^23 trick (exact for |n| < 2^22)
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    // ln2 split in two so that n * ln2_hi is exact
    float r = xc - n * 0.693145751953125f - n * 1.42860682030941723e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = ((uint32_t)((int32_t)n + 127) << 23) & ~mask;  // 2^n, or 0 when flushed
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return p * scale;
}

#define SAMPLER_LANES 16

/* Largest value of x [n]; NaN is ignored; -inf when n == 0 or all are -inf/NaN. */
static float row_max(const float *restrict x, int64_t n) {
    int32_t m[SAMPLER_LANES];
    for (int j = 0; j < SAMPLER_LANES; j++) m[j] = INT32_MIN;
    int64_t i = 0;
    for (; i + SAMPLER_LANES <= n; i += SAMPLER_LANES) {
        for (int j = 0; j < SAMPLER_LANES; j++) {
            int32_t k = float_key(x[i + j]);
            m[j] = k > m[j] ? k : m[j];
        }
    }
    for (; i < n; i++) {
        int32_t k = float_key(x[i]);
        m[0] = k > m[0] ? k : m[0];
    }
    int32_t best = float_key(-INFINITY);
    for (int j = 0; j < SAMPLER_LANES; j++) best = m[j] > best ? m[j] : best;
    return key_float(best);
}

/* sum exp((x[i] - m) * scale) over x [n] (NaN terms count 0); when out is
 * non-NULL also stores each term in out [n] (out == x is allowed). Lanes are
 * summed in float for at most 64 blocks, then into a double, so the sum keeps
 * ~1e-7 relative error. */
static double row_sum_exp(const float *x, int64_t n, float m, float scale, float *out) {
    double total = 0.0;
    int64_t i = 0;
    while (i + SAMPLER_LANES <= n) {
        float acc[SAMPLER_LANES] = {0};
        int64_t n_blk = (n - i) / SAMPLER_LANES;
        if (n_blk > 64) n_blk = 64;
        int64_t end = i + n_blk * SAMPLER_LANES;
        if (out) {
            for (; i < end; i += SAMPLER_LANES) {
                for (int j = 0; j < SAMPLER_LANES; j++) {
                    float e = exp_le0((x[i + j] - m) * scale);
                    out[i + j] = e;
                    acc[j] += e;
                }
            }
        } else {
            for (; i < end; i += SAMPLER_LANES)
                for (int j = 0; j < SAMPLER_LANES; j++) acc[j] += exp_le0((x[i + j] - m) * scale);
        }
        for (int j = 0; j < SAMPLER_LANES; j++) total += acc[j];
    }
    for (; i < n; i++) {
        float e = exp_le0((x[i] - m) * scale);
        if (out) out[i] = e;
        total += e;
    }
    return total;
}

/* One pass; each lane keeps its first maximum, then the lanes are merged. */
int32_t sampler_argmax(const float *restrict x, int32_t n) {
    int32_t k_best[SAMPLER_LANES];
    int32_t i_best[SAMPLER_LANES];
    for (int j = 0; j < SAMPLER_LANES; j++) {
        k_best[j] = INT32_MIN;
        i_best[j] = 0;
    }
    int32_t i = 0;
    for (; i + SAMPLER_LANES <= n; i += SAMPLER_LANES) {
        for (int j = 0; j < SAMPLER_LANES; j++) {
            int32_t k = float_key(x[i + j]);
            int32_t gt = -(int32_t)(k > k_best[j]);  // all ones when better
            k_best[j] = (k & gt) | (k_best[j] & ~gt);
            i_best[j] = ((i + j) & gt) | (i_best[j] & ~gt);
        }
    }
    for (; i < n; i++) {
        int32_t k = float_key(x[i]);
        if (k > k_best[0]) {
            k_best[0] = k;
            i_best[0] = i;
        }
    }
    int32_t k_max = INT32_MIN;
    int32_t i_max = 0;
    for (int j = 0; j < SAMPLER_LANES; j++) {
        if (k_best[j] > k_max || (k_best[j] == k_max && i_best[j] < i_max)) {
            k_max = k_best[j];
            i_max = i_best[j];
        }
    }
    return i_max;
}

/* ---- selection --------------------------------------------------------- */

/* The order of candidates: larger v first, then lower id. A total order once
 * NaN is gone, which qsort and the selection below rely on. */
static bool cand_better(struct sampler_cand a, struct sampler_cand b) {
    return a.v > b.v || (a.v == b.v && a.id < b.id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const struct sampler_cand *a = pa;
    const struct sampler_cand *b = pb;
    if (cand_better(*a, *b)) return -1;
    if (cand_better(*b, *a)) return 1;
    return 0;
}

static void cand_sort(struct sampler_cand *c, int32_t n) {
    if (n > 1) qsort(c, (size_t)n, sizeof(*c), cand_cmp);
}

/* Min-heap by cand_better: h[0] is the worst of the kept. */
static void heap_sift_down(struct sampler_cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1;
        int32_t r = l + 1;
        int32_t w = i;
        if (l < n && cand_better(h[w], h[l])) w = l;
        if (r < n && cand_better(h[w], h[r])) w = r;
        if (w == i) return;
        struct sampler_cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The k best of x [n] (1 <= k <= n) into out [k], best first. One pass: ids
 * arrive in increasing order, so a later equal value never beats the root and
 * the test is a single compare. NaN reads as -inf. */
static void select_top_heap(const float *x, int32_t n, int32_t k, struct sampler_cand *out) {
    for (int32_t i = 0; i < k; i++)
        out[i] = (struct sampler_cand){.v = x[i] == x[i] ? x[i] : -INFINITY, .id = i};
    for (int32_t i = k / 2 - 1; i >= 0; i--) heap_sift_down(out, k, i);
    for (int32_t i = k; i < n; i++) {
        if (x[i] > out[0].v) {
            out[0] = (struct sampler_cand){.v = x[i], .id = i};
            heap_sift_down(out, k, 0);
        }
    }
    cand_sort(out, k);
}

/* Reorders c [n] so that its k best (1 <= k < n) come first, in any order:
 * quickselect with a median-of-three pivot, and a full sort as the fallback
 * after too many rounds, so the worst case stays O(n log n). */
static void select_nth(struct sampler_cand *c, int32_t n, int32_t k) {
    int32_t lo = 0;
    int32_t hi = n - 1;
    int32_t target = k - 1;
    for (int rounds = 0; hi > lo; rounds++) {
        if (rounds == 64) {
            cand_sort(c + lo, hi - lo + 1);
            return;
        }
        int32_t mid = lo + (hi - lo) / 2;
        struct sampler_cand a = c[lo], b = c[mid], d = c[hi];
        struct sampler_cand pivot = cand_better(a, b)
            ? (cand_better(b, d) ? b : (cand_better(a, d) ? d : a))
            : (cand_better(a, d) ? a : (cand_better(b, d) ? d : b));
        int32_t i = lo;
        int32_t j = hi;
        while (i <= j) {
            while (cand_better(c[i], pivot)) i++;
            while (cand_better(pivot, c[j])) j--;
            if (i <= j) {
                struct sampler_cand t = c[i];
                c[i] = c[j];
                c[j] = t;
                i++;
                j--;
            }
        }
        if (target <= j) {
            hi = j;
        } else if (target >= i) {
            lo = i;
        } else {
            return;
        }
    }
}

/* ---- pipeline ---------------------------------------------------------- */

static bool has_adjustments(const struct sampler *s) {
    const struct sampler_params *p = &s->params;
    bool rep = p->repetition_penalty != 1.0f && p->repeat_last_n != 0 &&
               s->n_prompt + s->n_gen > 0;
    bool pf = (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) && s->n_gen > 0;
    return p->n_logit_bias > 0 || rep || pf;
}

static void penalize_repetition(const struct sampler *s, struct sampler_scratch *sc, float *w,
                                int32_t token) {
    if (sc->mark[token] == sc->epoch) return;  // once per distinct token (HF, llama.cpp)
    sc->mark[token] = sc->epoch;
    float penalty = s->params.repetition_penalty;
    w[token] = w[token] > 0.0f ? w[token] / penalty : w[token] * penalty;
}

/* Steps 1-4 of the pipeline into sc->work [n_vocab]. */
static void adjust_logits(const struct sampler *s, struct sampler_scratch *sc, const float *logits,
                          const uint64_t *allow) {
    const struct sampler_params *p = &s->params;
    float *w = sc->work;
    int32_t n_vocab = s->n_vocab;
    // 1. copy, NaN read as -inf so every later comparison is a total order
    for (int32_t i = 0; i < n_vocab; i++)
        w[i] = bits_is_nan(float_bits(logits[i])) ? -INFINITY : logits[i];
    // 1b. the allowed-token mask
    if (allow) {
        for (int32_t i = 0; i < n_vocab; i++)
            if (!((allow[i >> 6] >> (i & 63)) & 1)) w[i] = -INFINITY;
    }
    // 2. logit bias
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const struct sampler_logit_bias *b = &s->bias[i];
        w[b->token] = b->bias <= -100.0f ? -INFINITY : w[b->token] + b->bias;
    }
    // 3. repetition penalty over the last repeat_last_n of prompt + generated
    if (p->repetition_penalty != 1.0f && p->repeat_last_n != 0) {
        int64_t n_hist = (int64_t)s->n_prompt + s->n_gen;
        int64_t n_win = p->repeat_last_n < 0 || p->repeat_last_n > n_hist ? n_hist
                                                                            : p->repeat_last_n;
        if (++sc->epoch == 0) {  // stamps wrapped: forget them all
            memset(sc->mark, 0, (size_t)sc->n_vocab * sizeof(*sc->mark));
            sc->epoch = 1;
        }
        int32_t n_from_gen = n_win < s->n_gen ? (int32_t)n_win : s->n_gen;
        for (int32_t i = s->n_gen - n_from_gen; i < s->n_gen; i++)
            penalize_repetition(s, sc, w, s->gen[i]);
        int32_t n_from_prompt = (int32_t)(n_win - n_from_gen);
        for (int32_t i = s->n_prompt - n_from_prompt; i < s->n_prompt; i++)
            penalize_repetition(s, sc, w, s->prompt[i]);
    }
    // 4. presence / frequency penalty over the generated tokens (OpenAI)
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (int32_t i = 0; i < s->n_counts; i++) {
            const struct sampler_count *c = &s->counts[i];
            w[c->token] -= (float)c->n * p->frequency_penalty + p->presence_penalty;
        }
    }
}

static void dist_one(struct sampler_scratch *sc, int32_t token) {
    sc->dist = SAMPLER_DIST_ONE;
    sc->one = token;
}

/* Moves the top-p nucleus of c [n] (weights, any order) to the front, sorted,
 * and returns its size: the shortest prefix of the descending order whose
 * weight reaches need, or all n if none does. Selects the best m = 64, 256,
 * ... first, so only the prefix that matters is ever sorted. */
static int32_t nucleus(struct sampler_cand *c, int32_t n, double need) {
    int32_t m = 64;
    while (m < n) {
        select_nth(c, n, m);
        double mass = 0.0;
        for (int32_t i = 0; i < m; i++) mass += c[i].v;
        if (mass >= need) break;
        m = m > n / 4 ? n : m * 4;
    }
    if (m > n) m = n;
    cand_sort(c, m);
    double cum = 0.0;
    for (int32_t i = 0; i < m; i++) {
        cum += c[i].v;
        if (cum >= need) return i + 1;
    }
    return m;
}

/* Steps 8-10 over sc->cand [n], whose v are exp((l - l_max) / T) (so p_max
 * is 1) and whose total over the step-7 distribution is z. min-p keeps
 * v >= min_p; top-p keeps the nucleus measured against z. Both keep a prefix
 * of the same descending order, so applying min-p first and then top-p
 * against the unchanged z gives their intersection, as the header's order
 * does. Leaves a SPARSE distribution. */
static void truncate_cands(const struct sampler *s, struct sampler_scratch *sc, int32_t n,
                           double z) {
    const struct sampler_params *p = &s->params;
    struct sampler_cand *c = sc->cand;
    // 9. min-p (and drop exact zeros: banned or underflowed tokens)
    float thr = p->min_p;
    int32_t n_kept = 0;
    for (int32_t i = 0; i < n; i++)
        if (c[i].v > 0.0f && c[i].v >= thr) c[n_kept++] = c[i];
    ASSERT(n_kept > 0);  // the maximum has v = 1
    // 8. top-p
    if (p->top_p < 1.0f) n_kept = nucleus(c, n_kept, (double)p->top_p * z);
    // 10. the weights are renormalised by the draw
    double z_kept = 0.0;
    for (int32_t i = 0; i < n_kept; i++) z_kept += c[i].v;
    sc->dist = SAMPLER_DIST_SPARSE;
    sc->n_cand = n_kept;
    sc->z = z_kept;
}

/* 1 / temperature; infinite (greedy) at temperature 0, or so small that
 * 1/T overflows. */
static float inv_temperature(const struct sampler_params *p) {
    return p->temperature > 0.0f ? 1.0f / p->temperature : INFINITY;
}

/* The whole pipeline: leaves in sc the distribution to draw from. */
static void build_dist(const struct sampler *s, struct sampler_scratch *sc, const float *logits,
                       const uint64_t *allow) {
    ASSERT(sc->n_vocab >= s->n_vocab);
    const struct sampler_params *p = &s->params;
    int32_t n_vocab = s->n_vocab;
    float inv_t = inv_temperature(p);
    bool is_greedy = !isfinite(inv_t);
    // Greedy with nothing to adjust is one pass over the raw row.
    if (is_greedy && !has_adjustments(s) && !allow) {
        dist_one(sc, sampler_argmax(logits, n_vocab));
        return;
    }
    adjust_logits(s, sc, logits, allow);  // 1-4
    float *w = sc->work;
    if (is_greedy) {  // 5.
        dist_one(sc, sampler_argmax(w, n_vocab));
        return;
    }
    bool is_truncated = p->top_p < 1.0f || p->min_p > 0.0f;
    int32_t k = p->top_k > 0 && p->top_k < n_vocab ? p->top_k : n_vocab;
    if (k < n_vocab) {
        // 6. top-k by partial selection; the k are not sorted
        struct sampler_cand *c = sc->cand;
        if (k <= SAMPLER_HEAP_K_MAX) {
            select_top_heap(w, n_vocab, k, c);
        } else {
            for (int32_t i = 0; i < n_vocab; i++) c[i] = (struct sampler_cand){.v = w[i], .id = i};
            select_nth(c, n_vocab, k);
        }
        int32_t i_max = 0;
        for (int32_t i = 1; i < k; i++) {
            if (cand_better(c[i], c[i_max])) i_max = i;
        }
        float l_max = c[i_max].v;
        if (l_max == -INFINITY) {  // everything banned
            dist_one(sc, c[i_max].id);
            return;
        }
        // 7. temperature and softmax (unnormalised: p_max is exp(0) = 1)
        double z = 0.0;
        for (int32_t i = 0; i < k; i++) {
            c[i].v = exp_le0((c[i].v - l_max) * inv_t);
            z += c[i].v;
        }
        truncate_cands(s, sc, k, z);  // 8-10
        return;
    }
    // No top-k: 7. softmax over the whole row, exp values in place.
    float l_max = row_max(w, n_vocab);
    if (l_max == -INFINITY) {
        dist_one(sc, 0);
        return;
    }
    double z = row_sum_exp(w, n_vocab, l_max, inv_t, w);
    if (!is_truncated) {
        sc->dist = SAMPLER_DIST_DENSE;  // 10. draw straight from the row
        sc->z = z;
        return;
    }
    // 8-9 without touching most of the vocabulary. min-p keeps e >= min_p. For
    // top-p, a token with p < t = (1 - top_p) / n_vocab is never in the
    // nucleus: all such tokens together weigh < n_vocab * t = 1 - top_p, so
    // the tokens with p >= t weigh > top_p and form a prefix that reaches it.
    float thr = p->min_p;
    if (p->top_p < 1.0f) {
        float thr_p = (float)((1.0 - (double)p->top_p) / n_vocab * z);
        thr = thr_p > thr ? thr_p : thr;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (w[i] > 0.0f && w[i] >= thr) sc->cand[n++] = (struct sampler_cand){.v = w[i], .id = i};
    }
    truncate_cands(s, sc, n, z);
}

/* 10. One draw from the distribution build_dist() left in sc. */
static int32_t draw(struct sampler *s, const struct sampler_scratch *sc) {
    switch (sc->dist) {
    case SAMPLER_DIST_ONE:
        return sc->one;
    case SAMPLER_DIST_DENSE: {
        double u = rng_uniform(s->rng) * sc->z;
        double cum = 0.0;
        int32_t last = 0;
        for (int32_t i = 0; i < s->n_vocab; i++) {
            float e = sc->work[i];
            if (e <= 0.0f) continue;
            cum += e;
            last = i;
            if (cum > u) return i;
        }
        return last;  // rounding left u at the very end
    }
    case SAMPLER_DIST_SPARSE: {
        double u = rng_uniform(s->rng) * sc->z;
        double cum = 0.0;
        for (int32_t i = 0; i < sc->n_cand; i++) {
            cum += sc->cand[i].v;
            if (cum > u) return sc->cand[i].id;
        }
        return sc->cand[sc->n_cand - 1].id;
    }
    }
    UNREACHABLE();
}

/* log_softmax of the raw logits for the chosen token and the n_top best. */
static void fill_logprobs(const struct sampler *s, const float *logits, int32_t token,
                          struct sampler_result *out) {
    int32_t n_vocab = s->n_vocab;
    float m = row_max(logits, n_vocab);
    float lse = -INFINITY;
    if (m != -INFINITY) lse = m + (float)log(row_sum_exp(logits, n_vocab, m, 1.0f, NULL));
    float l = logits[token];
    out->token = token;
    out->logprob = l == l && lse != -INFINITY ? l - lse : -INFINITY;
    int32_t n_top = s->params.n_top_logprobs < n_vocab ? s->params.n_top_logprobs : n_vocab;
    out->n_top = n_top;
    if (n_top <= 0) return;
    struct sampler_cand top[SAMPLER_MAX_TOP_LOGPROBS];
    select_top_heap(logits, n_vocab, n_top, top);
    for (int32_t i = 0; i < n_top; i++) {
        out->top[i].token = top[i].id;
        out->top[i].logprob = lse != -INFINITY ? top[i].v - lse : -INFINITY;
    }
}

int32_t sampler_sample(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                       struct sampler_result *out) {
    return sampler_sample_allowed(s, sc, logits, NULL, out);
}

int32_t sampler_sample_allowed(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                               const uint64_t *allow, struct sampler_result *out) {
    build_dist(s, sc, logits, allow);
    int32_t token = draw(s, sc);
    if (out) fill_logprobs(s, logits, token, out);
    sampler_accept(s, token, false);
    return token;
}

/* Entry i of the DENSE or SPARSE distribution build_dist() left in sc: its
 * token (in *id) and probability, rounded to float as sampler_probs() writes
 * it, so that a q from sampler_draft() over the same row compares equal. */
static double dist_entry(const struct sampler_scratch *sc, int32_t i, int32_t *id) {
    const bool is_sparse = sc->dist == SAMPLER_DIST_SPARSE;
    *id = is_sparse ? sc->cand[i].id : i;
    const float v = is_sparse ? sc->cand[i].v : sc->work[i];
    return v > 0.0f ? (float)(v / sc->z) : 0.0;
}

/* The probability of token under the distribution in sc (as dist_entry()). */
static double dist_prob(const struct sampler_scratch *sc, int32_t token) {
    int32_t id;
    switch (sc->dist) {
    case SAMPLER_DIST_ONE:
        return token == sc->one ? 1.0 : 0.0;
    case SAMPLER_DIST_DENSE:
        return dist_entry(sc, token, &id);
    case SAMPLER_DIST_SPARSE:
        for (int32_t i = 0; i < sc->n_cand; i++) {
            const double p = dist_entry(sc, i, &id);
            if (id == token) return p;
        }
        return 0.0;
    }
    UNREACHABLE();
}

/* One draw from max(0, p - q), renormalised, with p the distribution in sc
 * (as dist_entry()); -1 when that has no mass (p <= q everywhere: q is p,
 * or float rounding is all that is left). */
static int32_t draw_residual(struct sampler *s, const struct sampler_scratch *sc, const float *q) {
    if (sc->dist == SAMPLER_DIST_ONE) return q[sc->one] < 1.0f ? sc->one : -1;
    const int32_t n = sc->dist == SAMPLER_DIST_SPARSE ? sc->n_cand : s->n_vocab;
    int32_t id;
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const double r = dist_entry(sc, i, &id) - (double)q[id];
        if (r > 0.0) total += r;
    }
    if (total <= 1e-6) return -1;
    const double u = rng_uniform(s->rng) * total;
    double cum = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++) {
        const double r = dist_entry(sc, i, &id) - (double)q[id];
        if (r <= 0.0) continue;
        cum += r;
        last = id;
        if (cum > u) return id;
    }
    return last;  // rounding left u at the very end
}

int32_t sampler_draft(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                      const uint64_t *allow, float *q) {
    sampler_probs_allowed(s, sc, logits, allow, q);
    return draw(s, sc);
}

int32_t sampler_sample_draft(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                             const uint64_t *allow, int32_t draft, const float *q,
                             struct sampler_result *out) {
    build_dist(s, sc, logits, allow);
    // Keep the draft with probability min(1, p / q); else draw from max(0, p - q),
    // whose mass is the chance of that rejection: together, a draw from p.
    const double p_d = dist_prob(sc, draft);
    const double q_d = q[draft];
    int32_t token = draft;
    if (!(p_d > 0.0 && rng_uniform(s->rng) * q_d < p_d)) {
        token = draw_residual(s, sc, q);
        if (token < 0) token = draw(s, sc);  // p = q up to rounding: p itself
    }
    if (out) fill_logprobs(s, logits, token, out);
    sampler_accept(s, token, false);
    return token;
}

bool sampler_is_deterministic(const struct sampler *s) {
    return s->params.has_seed || !isfinite(inv_temperature(&s->params));
}

int32_t sampler_probs(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                      float *probs) {
    return sampler_probs_allowed(s, sc, logits, NULL, probs);
}

int32_t sampler_probs_allowed(struct sampler *s, struct sampler_scratch *sc, const float *logits,
                              const uint64_t *allow, float *probs) {
    build_dist(s, sc, logits, allow);
    int32_t n_vocab = s->n_vocab;
    int32_t n_nonzero = 0;
    switch (sc->dist) {
    case SAMPLER_DIST_ONE:
        memset(probs, 0, (size_t)n_vocab * sizeof(*probs));
        probs[sc->one] = 1.0f;
        return 1;
    case SAMPLER_DIST_DENSE:
        for (int32_t i = 0; i < n_vocab; i++) {
            probs[i] = (float)(sc->work[i] / sc->z);
            n_nonzero += probs[i] > 0.0f;
        }
        return n_nonzero;
    case SAMPLER_DIST_SPARSE:
        memset(probs, 0, (size_t)n_vocab * sizeof(*probs));
        for (int32_t i = 0; i < sc->n_cand; i++) {
            probs[sc->cand[i].id] = (float)(sc->cand[i].v / sc->z);
            n_nonzero += probs[sc->cand[i].id] > 0.0f;
        }
        return n_nonzero;
    }
    UNREACHABLE();
}
