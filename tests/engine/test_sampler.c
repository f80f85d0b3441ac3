/*
 * test_sampler.c - the sampler against independent oracles: a straightforward
 * double-precision implementation of the pipeline written in this file from
 * the definitions in sampler.h (full sorts, no shortcuts), a double-precision
 * log-softmax, hand-computed penalties, and chi-square bounds on the empirical
 * frequencies of many seeded draws (deterministic for the fixed seeds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/err.h"
#include "engine/text/sampler.h"

/* ---- helpers ------------------------------------------------------------ */

/* A small deterministic generator for test data (not the sampler's RNG). */
static uint64_t test_rng_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double test_uniform(uint64_t *x) { return (double)(test_rng_next(x) >> 11) * 0x1.0p-53; }

/* logits [n] ~ roughly normal(0, sigma), distinct with probability ~1. */
static void fill_logits(float *l, int32_t n, uint64_t seed, double sigma) {
    uint64_t x = seed;
    for (int32_t i = 0; i < n; i++) {
        double s = 0.0;
        for (int j = 0; j < 4; j++) s += test_uniform(&x) - 0.5;
        l[i] = (float)(s * sigma * 1.7320508);
    }
}

struct ref_item {
    double v;
    int32_t id;
};

static int ref_cmp(const void *pa, const void *pb) {
    const struct ref_item *a = pa;
    const struct ref_item *b = pb;
    if (a->v > b->v) return -1;
    if (a->v < b->v) return 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* The oracle: steps 6-10 of sampler.h on already adjusted logits adj [n], in
 * double, with full sorts. Writes probs [n]. */
static void ref_truncate(const double *adj, int32_t n, const struct sampler_params *p,
                         double *probs) {
    struct ref_item *it = malloc((size_t)n * sizeof(*it));
    for (int32_t i = 0; i < n; i++) it[i] = (struct ref_item){adj[i], i};
    qsort(it, (size_t)n, sizeof(*it), ref_cmp);
    for (int32_t i = 0; i < n; i++) probs[i] = 0.0;
    if (p->temperature == 0.0f) {
        probs[it[0].id] = 1.0;
        free(it);
        return;
    }
    int32_t k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    double z = 0.0;
    double l_max = it[0].v;
    for (int32_t i = 0; i < k; i++) {
        it[i].v = exp((it[i].v - l_max) / p->temperature);
        z += it[i].v;
    }
    for (int32_t i = 0; i < k; i++) it[i].v /= z;
    int32_t n_keep = k;
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        for (int32_t i = 0; i < k; i++) {
            cum += it[i].v;
            if (cum >= p->top_p) {
                n_keep = i + 1;
                break;
            }
        }
    }
    int32_t n_minp = 0;
    for (int32_t i = 0; i < n_keep; i++)
        if (it[i].v >= p->min_p * it[0].v) n_minp = i + 1;
    n_keep = n_minp;
    double zk = 0.0;
    for (int32_t i = 0; i < n_keep; i++) zk += it[i].v;
    for (int32_t i = 0; i < n_keep; i++) probs[it[i].id] = it[i].v / zk;
    free(it);
}

static struct sampler_params seeded(uint64_t seed) {
    struct sampler_params p = sampler_default_params();
    p.has_seed = true;
    p.seed = seed;
    return p;
}

/* Compares sampler_probs() with the oracle on raw logits (no penalties). */
static void check_probs_vs_ref(const struct sampler_params *p, const float *logits, int32_t n,
                               double tol) {
    struct sampler *s = sampler_create(p, n);
    struct sampler_scratch *sc = sampler_scratch_create(n);
    assert_non_null(s);
    assert_non_null(sc);
    float *got = malloc((size_t)n * sizeof(*got));
    double *adj = malloc((size_t)n * sizeof(*adj));
    double *want = malloc((size_t)n * sizeof(*want));
    for (int32_t i = 0; i < n; i++) adj[i] = logits[i];
    ref_truncate(adj, n, p, want);
    int32_t n_nonzero = sampler_probs(s, sc, logits, got);
    int32_t n_want = 0;
    for (int32_t i = 0; i < n; i++) {
        n_want += want[i] > 0.0;
        if (fabs(got[i] - want[i]) > tol) {
            print_message("token %d: got %.9g want %.9g (T=%g k=%d p=%g min_p=%g)\n", (int)i,
                          (double)got[i], want[i], (double)p->temperature, (int)p->top_k,
                          (double)p->top_p, (double)p->min_p);
            fail();
        }
        assert_true((got[i] > 0.0f) == (want[i] > 0.0));
    }
    assert_int_equal(n_nonzero, n_want);
    free(got);
    free(adj);
    free(want);
    sampler_scratch_free(sc);
    sampler_free(s);
}

static void assert_chi2_fits(const int32_t *count, const double *want, int32_t n,
                             int32_t n_draws);

/* Draws n_draws tokens (the history does not matter without penalties) and
 * checks: nothing outside the support of want, and a chi-square statistic
 * over the support (cells with expectation < 5 pooled) below a loose bound. */
static void check_draws(const struct sampler_params *p, const float *logits, int32_t n,
                        const double *want, int32_t n_draws) {
    struct sampler *s = sampler_create(p, n);
    struct sampler_scratch *sc = sampler_scratch_create(n);
    int32_t *count = calloc((size_t)n, sizeof(*count));
    for (int32_t d = 0; d < n_draws; d++) {
        int32_t t = sampler_sample(s, sc, logits, NULL);
        assert_true(t >= 0 && t < n);
        if (want[t] == 0.0) {
            print_message("token %d drawn outside the allowed set\n", (int)t);
            fail();
        }
        count[t]++;
    }
    assert_chi2_fits(count, want, n, n_draws);
    free(count);
    sampler_scratch_free(sc);
    sampler_free(s);
}

/* A chi-square statistic of counts [n] of n_draws draws against want [n]
 * over want's support (cells with expectation < 5 pooled) below a loose
 * bound. */
static void assert_chi2_fits(const int32_t *count, const double *want, int32_t n,
                             int32_t n_draws) {
    double chi2 = 0.0;
    double pooled_o = 0.0;
    double pooled_e = 0.0;
    int32_t n_cells = 0;
    for (int32_t i = 0; i < n; i++) {
        if (want[i] == 0.0) continue;
        double e = want[i] * n_draws;
        if (e < 5.0) {
            pooled_o += count[i];
            pooled_e += e;
            continue;
        }
        chi2 += (count[i] - e) * (count[i] - e) / e;
        n_cells++;
    }
    if (pooled_e >= 5.0) {
        chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        n_cells++;
    }
    double df = n_cells > 1 ? n_cells - 1 : 1;
    // mean df, sd sqrt(2 df): 6 sd plus slack is far beyond chance
    double bound = df + 6.0 * sqrt(2.0 * df) + 10.0;
    if (chi2 > bound) {
        print_message("chi2 %.2f > %.2f (df %.0f)\n", chi2, bound, df);
        fail();
    }
}

/* ---- validation --------------------------------------------------------- */

static void expect_invalid(const struct sampler_params *p, int32_t n_vocab, const char *field) {
    char msg[256];
    assert_int_equal(sampler_params_validate(p, n_vocab, msg, sizeof(msg)), ERR_INVAL);
    if (!strstr(msg, field)) {
        print_message("message \"%s\" does not name %s\n", msg, field);
        fail();
    }
}

static void test_sampler_validate_names_the_field(void **state) {
    (void)state;
    char msg[256];
    struct sampler_params d = sampler_default_params();
    assert_int_equal(sampler_params_validate(&d, 100, msg, sizeof(msg)), 0);
    assert_int_equal(sampler_params_validate(&d, 100, NULL, 0), 0);

    struct sampler_params p = d;
    p.temperature = -0.5f;
    expect_invalid(&p, 100, "temperature");
    p.temperature = NAN;
    expect_invalid(&p, 100, "temperature");
    p.temperature = INFINITY;
    expect_invalid(&p, 100, "temperature");

    p = d;
    p.top_p = 0.0f;
    expect_invalid(&p, 100, "top_p");
    p.top_p = 1.5f;
    expect_invalid(&p, 100, "top_p");
    p.top_p = NAN;
    expect_invalid(&p, 100, "top_p");

    p = d;
    p.min_p = -0.1f;
    expect_invalid(&p, 100, "min_p");
    p.min_p = 1.1f;
    expect_invalid(&p, 100, "min_p");

    p = d;
    p.repetition_penalty = 0.0f;
    expect_invalid(&p, 100, "repetition_penalty");
    p.repetition_penalty = INFINITY;
    expect_invalid(&p, 100, "repetition_penalty");
    p = d;
    p.repeat_last_n = -2;
    expect_invalid(&p, 100, "repeat_last_n");

    p = d;
    p.presence_penalty = 2.5f;
    expect_invalid(&p, 100, "presence_penalty");
    p.presence_penalty = NAN;
    expect_invalid(&p, 100, "presence_penalty");
    p = d;
    p.frequency_penalty = -2.01f;
    expect_invalid(&p, 100, "frequency_penalty");

    p = d;
    struct sampler_logit_bias bad_token[] = {{.token = 3, .bias = 1.0f}, {.token = 100, .bias = 1}};
    p.n_logit_bias = 2;
    p.logit_bias = bad_token;
    expect_invalid(&p, 100, "logit_bias");
    struct sampler_logit_bias neg_token[] = {{.token = -1, .bias = 1.0f}};
    p.n_logit_bias = 1;
    p.logit_bias = neg_token;
    expect_invalid(&p, 100, "logit_bias");
    struct sampler_logit_bias bad_bias[] = {{.token = 1, .bias = 100.5f}};
    p.logit_bias = bad_bias;
    expect_invalid(&p, 100, "logit_bias");
    p.logit_bias = NULL;
    expect_invalid(&p, 100, "logit_bias");

    p = d;
    p.n_top_logprobs = SAMPLER_MAX_TOP_LOGPROBS + 1;
    expect_invalid(&p, 100, "top_logprobs");
    p.n_top_logprobs = -1;
    expect_invalid(&p, 100, "top_logprobs");

    // the edges themselves are valid
    p = d;
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    p.repeat_last_n = -1;
    p.top_k = -7;
    p.n_top_logprobs = SAMPLER_MAX_TOP_LOGPROBS;
    struct sampler_logit_bias edges[] = {{.token = 0, .bias = -100.0f}, {.token = 99, .bias = 100}};
    p.n_logit_bias = 2;
    p.logit_bias = edges;
    assert_int_equal(sampler_params_validate(&p, 100, msg, sizeof(msg)), 0);
}

/* ---- greedy and temperature -------------------------------------------- */

static void test_sampler_temperature_zero_is_argmax(void **state) {
    (void)state;
    enum { N = 1000 };
    float l[N];
    struct sampler_scratch *sc = sampler_scratch_create(N);
    for (uint64_t seed = 1; seed <= 20; seed++) {
        fill_logits(l, N, seed, 2.0);
        int32_t want = 0;
        for (int32_t i = 1; i < N; i++)
            if (l[i] > l[want]) want = i;
        struct sampler_params p = seeded(seed);
        p.temperature = 0.0f;
        struct sampler *s = sampler_create(&p, N);
        for (int r = 0; r < 3; r++) assert_int_equal(sampler_sample(s, sc, l, NULL), want);
        sampler_free(s);
    }
    // ties go to the lowest id; NaN is never chosen
    for (int32_t i = 0; i < N; i++) l[i] = 0.0f;
    l[17] = 3.0f;
    l[400] = 3.0f;
    l[999] = 3.0f;
    l[5] = NAN;
    struct sampler_params p = seeded(1);
    p.temperature = 0.0f;
    struct sampler *s = sampler_create(&p, N);
    assert_int_equal(sampler_sample(s, sc, l, NULL), 17);
    sampler_free(s);
    sampler_scratch_free(sc);
}

static void test_sampler_temperature_to_zero_limit(void **state) {
    (void)state;
    enum { N = 64 };
    float l[N];
    for (int32_t i = 0; i < N; i++) l[i] = (float)((i * 37) % N) * 0.1f;  // distinct, gap 0.1
    int32_t want = 0;
    for (int32_t i = 1; i < N; i++)
        if (l[i] > l[want]) want = i;
    struct sampler_scratch *sc = sampler_scratch_create(N);
    float probs[N];
    // T = 0.005: the runner-up has weight exp(-0.1 / 0.005) = 2e-9
    const float temps[] = {0.005f, 1e-20f, 1e-40f};
    for (size_t t = 0; t < sizeof(temps) / sizeof(temps[0]); t++) {
        struct sampler_params p = seeded(7);
        p.temperature = temps[t];
        struct sampler *s = sampler_create(&p, N);
        for (int d = 0; d < 2000; d++) assert_int_equal(sampler_sample(s, sc, l, NULL), want);
        sampler_probs(s, sc, l, probs);
        assert_true(probs[want] > 0.999999f);
        sampler_free(s);
    }
    // while a moderate temperature spreads the mass as the oracle says
    for (float temp = 0.25f; temp <= 4.0f; temp *= 2.0f) {
        struct sampler_params p = seeded(7);
        p.temperature = temp;
        check_probs_vs_ref(&p, l, N, 1e-6);
    }
    sampler_scratch_free(sc);
}

/* ---- seeds ------------------------------------------------------------- */

static void draw_sequence(uint64_t seed, const float *l, int32_t n, int32_t *out, int32_t n_out) {
    struct sampler_params p = seeded(seed);
    p.temperature = 1.0f;
    p.top_k = 50;
    p.top_p = 0.98f;
    p.repetition_penalty = 1.1f;
    p.frequency_penalty = 0.3f;
    struct sampler *s = sampler_create(&p, n);
    struct sampler_scratch *sc = sampler_scratch_create(n);
    for (int32_t i = 0; i < 10; i++) sampler_accept(s, i * 3, true);
    for (int32_t i = 0; i < n_out; i++) out[i] = sampler_sample(s, sc, l, NULL);
    assert_true(sampler_check(s));
    assert_int_equal(sampler_n_prompt(s), 10);
    assert_int_equal(sampler_n_generated(s), n_out);
    sampler_scratch_free(sc);
    sampler_free(s);
}

static void test_sampler_seed_reproducible(void **state) {
    (void)state;
    enum { N = 500, T = 200 };
    float l[N];
    fill_logits(l, N, 99, 1.0);
    int32_t a[T], b[T], c[T];
    draw_sequence(1234, l, N, a, T);
    draw_sequence(1234, l, N, b, T);
    draw_sequence(1235, l, N, c, T);
    assert_memory_equal(a, b, sizeof(a));
    int32_t n_diff = 0;
    for (int32_t i = 0; i < T; i++) n_diff += a[i] != c[i];
    assert_true(n_diff > T / 4);

    // unseeded samplers draw from the OS: two of them differ
    struct sampler_params p = sampler_default_params();
    struct sampler *s1 = sampler_create(&p, N);
    struct sampler *s2 = sampler_create(&p, N);
    struct sampler_scratch *sc = sampler_scratch_create(N);
    n_diff = 0;
    for (int32_t i = 0; i < T; i++)
        n_diff += sampler_sample(s1, sc, l, NULL) != sampler_sample(s2, sc, l, NULL);
    assert_true(n_diff > 0);
    sampler_scratch_free(sc);
    sampler_free(s1);
    sampler_free(s2);
}

/* ---- truncation: exact distributions and draws ------------------------- */

static void test_sampler_truncation_matches_reference(void **state) {
    (void)state;
    // 3000 tokens: covers the heap (k <= 512), quickselect (k > 512) and no-top-k paths
    enum { N = 3000 };
    float *l = malloc(N * sizeof(*l));
    const int32_t ks[] = {0, 1, 5, 40, 512, 513, 1000, 2999, 3000, 5000};
    const float ps[] = {1.0f, 0.95f, 0.5f, 0.01f};
    const float min_ps[] = {0.0f, 0.05f, 0.5f};
    const float temps[] = {0.7f, 1.0f, 1.5f};
    for (uint64_t seed = 1; seed <= 2; seed++) {
        fill_logits(l, N, seed, seed == 1 ? 3.0 : 0.5);
        for (size_t a = 0; a < sizeof(ks) / sizeof(ks[0]); a++)
            for (size_t b = 0; b < sizeof(ps) / sizeof(ps[0]); b++)
                for (size_t c = 0; c < sizeof(min_ps) / sizeof(min_ps[0]); c++)
                    for (size_t t = 0; t < sizeof(temps) / sizeof(temps[0]); t++) {
                        struct sampler_params p = seeded(seed);
                        p.top_k = ks[a];
                        p.top_p = ps[b];
                        p.min_p = min_ps[c];
                        p.temperature = temps[t];
                        check_probs_vs_ref(&p, l, N, 2e-6);
                    }
    }
    free(l);
}

static void test_sampler_top_k_draws(void **state) {
    (void)state;
    enum { N = 200 };
    float l[N];
    fill_logits(l, N, 11, 1.0);
    double want[N];
    double adj[N];
    for (int32_t i = 0; i < N; i++) adj[i] = l[i];
    struct sampler_params p = seeded(2024);
    p.top_k = 8;
    p.temperature = 0.9f;
    ref_truncate(adj, N, &p, want);
    check_draws(&p, l, N, want, 40000);
}

static void test_sampler_top_p_draws(void **state) {
    (void)state;
    enum { N = 200 };
    float l[N];
    fill_logits(l, N, 12, 2.5);
    double want[N];
    double adj[N];
    for (int32_t i = 0; i < N; i++) adj[i] = l[i];
    struct sampler_params p = seeded(77);
    p.top_p = 0.8f;
    ref_truncate(adj, N, &p, want);
    int32_t n_support = 0;
    for (int32_t i = 0; i < N; i++) n_support += want[i] > 0.0;
    assert_true(n_support > 3 && n_support < N / 2);  // a real cut
    check_draws(&p, l, N, want, 40000);
}

static void test_sampler_min_p_draws(void **state) {
    (void)state;
    enum { N = 200 };
    float l[N];
    fill_logits(l, N, 13, 2.0);
    double want[N];
    double adj[N];
    for (int32_t i = 0; i < N; i++) adj[i] = l[i];
    struct sampler_params p = seeded(5);
    p.min_p = 0.1f;
    p.temperature = 1.2f;
    ref_truncate(adj, N, &p, want);
    int32_t n_support = 0;
    for (int32_t i = 0; i < N; i++) n_support += want[i] > 0.0;
    assert_true(n_support > 3 && n_support < N / 2);
    check_draws(&p, l, N, want, 40000);

    // the untruncated distribution too (the dense draw path)
    p = seeded(6);
    ref_truncate(adj, N, &p, want);
    check_draws(&p, l, N, want, 40000);
}

/* ---- penalties and bias ------------------------------------------------ */

/* sampler_probs() against a softmax of logits adjusted by hand. */
static void check_probs_adjusted(struct sampler *s, const struct sampler_params *p,
                                 const float *l, const double *adj, int32_t n) {
    struct sampler_scratch *sc = sampler_scratch_create(n);
    double *want = malloc((size_t)n * sizeof(*want));
    float *got = malloc((size_t)n * sizeof(*got));
    ref_truncate(adj, n, p, want);
    sampler_probs(s, sc, l, got);
    for (int32_t i = 0; i < n; i++) {
        if (fabs(got[i] - want[i]) > 1e-6) {
            print_message("token %d: got %.9g want %.9g\n", (int)i, (double)got[i], want[i]);
            fail();
        }
    }
    free(want);
    free(got);
    sampler_scratch_free(sc);
}

static void test_sampler_repetition_penalty_exact(void **state) {
    (void)state;
    enum { N = 8 };
    const float l[N] = {2.0f, -1.0f, 0.5f, -0.25f, 1.0f, 0.0f, 3.0f, -2.0f};
    struct sampler_params p = seeded(1);
    p.repetition_penalty = 1.5f;
    p.repeat_last_n = 4;
    struct sampler *s = sampler_create(&p, N);
    // history prompt 6 0 1, generated 3 0 0: the last 4 are 1 3 0 0 (distinct 0 1 3);
    // 6 has left the window
    sampler_accept(s, 6, true);
    sampler_accept(s, 0, true);
    sampler_accept(s, 1, true);
    sampler_accept(s, 3, false);
    sampler_accept(s, 0, false);
    sampler_accept(s, 0, false);
    assert_true(sampler_check(s));
    double adj[N];
    for (int32_t i = 0; i < N; i++) adj[i] = l[i];
    adj[0] = 2.0 / 1.5;     // positive: divided, once although it occurs twice
    adj[1] = -1.0 * 1.5;    // negative: multiplied
    adj[3] = -0.25 * 1.5;
    check_probs_adjusted(s, &p, l, adj, N);
    sampler_free(s);

    // repeat_last_n = -1: the whole history, prompt included
    p.repeat_last_n = -1;
    s = sampler_create(&p, N);
    sampler_accept(s, 6, true);
    sampler_accept(s, 5, true);  // logit 0 stays 0
    sampler_accept(s, 2, false);
    adj[0] = l[0];
    adj[1] = l[1];
    adj[3] = l[3];
    adj[6] = 3.0 / 1.5;
    adj[2] = 0.5 / 1.5;
    check_probs_adjusted(s, &p, l, adj, N);
    sampler_free(s);
}

static void test_sampler_presence_frequency_exact(void **state) {
    (void)state;
    enum { N = 8 };
    const float l[N] = {2.0f, -1.0f, 0.5f, -0.25f, 1.0f, 0.0f, 3.0f, -2.0f};
    struct sampler_params p = seeded(1);
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.temperature = 0.8f;
    struct sampler *s = sampler_create(&p, N);
    sampler_accept(s, 4, true);  // prompt tokens are not counted (OpenAI)
    const int32_t gen[] = {6, 6, 6, 2, 7, 2};
    for (size_t i = 0; i < sizeof(gen) / sizeof(gen[0]); i++) {
        sampler_accept(s, gen[i], false);
        assert_true(sampler_check(s));
    }
    double adj[N];
    for (int32_t i = 0; i < N; i++) adj[i] = l[i];
    adj[6] -= 3 * 0.25 + 0.5;
    adj[2] -= 2 * 0.25 + 0.5;
    adj[7] -= 1 * 0.25 + 0.5;
    check_probs_adjusted(s, &p, l, adj, N);
    sampler_free(s);

    // negative penalties reward repeats; combined with the repetition penalty,
    // the order is repetition first, then presence / frequency
    p.presence_penalty = -1.0f;
    p.frequency_penalty = 0.0f;
    p.repetition_penalty = 2.0f;
    p.repeat_last_n = 64;
    s = sampler_create(&p, N);
    sampler_accept(s, 0, false);
    sampler_accept(s, 1, false);
    for (int32_t i = 0; i < N; i++) adj[i] = l[i];
    adj[0] = 2.0 / 2.0 + 1.0;
    adj[1] = -1.0 * 2.0 + 1.0;
    check_probs_adjusted(s, &p, l, adj, N);
    sampler_free(s);
}

static void test_sampler_logit_bias(void **state) {
    (void)state;
    enum { N = 16 };
    float l[N];
    for (int32_t i = 0; i < N; i++) l[i] = 0.1f * (float)i;
    struct sampler_logit_bias bias[] = {
        {.token = 15, .bias = -100.0f},  // the argmax, banned
        {.token = 3, .bias = 0.5f},
        {.token = 14, .bias = -100.0f},
    };
    struct sampler_scratch *sc = sampler_scratch_create(N);
    // greedy: the ban moves the argmax to 13
    struct sampler_params p = seeded(3);
    p.temperature = 0.0f;
    p.n_logit_bias = 3;
    p.logit_bias = bias;
    struct sampler *s = sampler_create(&p, N);
    bias[0].token = 0;  // sampler_create copied the list
    assert_int_equal(sampler_sample(s, sc, l, NULL), 13);
    sampler_free(s);
    bias[0].token = 15;

    // sampling: 14 and 15 never appear, 3 gets +0.5
    p.temperature = 1.0f;
    s = sampler_create(&p, N);
    double adj[N];
    for (int32_t i = 0; i < N; i++) adj[i] = l[i];
    adj[15] = -INFINITY;
    adj[14] = -INFINITY;
    adj[3] += 0.5;
    check_probs_adjusted(s, &p, l, adj, N);
    for (int d = 0; d < 5000; d++) {
        int32_t t = sampler_sample(s, sc, l, NULL);
        assert_true(t != 14 && t != 15);
    }
    sampler_free(s);

    // with top-k and min-p paths too: the best three left are 13, 12, 11
    p.top_k = 3;
    p.min_p = 0.01f;
    s = sampler_create(&p, N);
    for (int d = 0; d < 2000; d++) {
        int32_t t = sampler_sample(s, sc, l, NULL);
        assert_true(t == 13 || t == 12 || t == 11);
    }
    sampler_free(s);
    sampler_scratch_free(sc);
}

/* ---- log-probabilities ------------------------------------------------- */

static void test_sampler_logprobs_match_log_softmax(void **state) {
    (void)state;
    enum { N = 50000 };
    float *l = malloc(N * sizeof(*l));
    fill_logits(l, N, 5, 4.0);
    l[123] = 25.0f;  // one dominant token as well
    double m = -INFINITY;
    for (int32_t i = 0; i < N; i++) m = l[i] > m ? l[i] : m;
    double z = 0.0;
    for (int32_t i = 0; i < N; i++) z += exp((double)l[i] - m);
    double lse = m + log(z);

    struct sampler_params p = seeded(8);
    p.n_top_logprobs = SAMPLER_MAX_TOP_LOGPROBS;
    p.temperature = 0.7f;             // logprobs ignore the pipeline...
    p.repetition_penalty = 1.3f;      // ...and the penalties
    struct sampler *s = sampler_create(&p, N);
    struct sampler_scratch *sc = sampler_scratch_create(N);
    sampler_accept(s, 123, true);
    struct ref_item *sorted = malloc(N * sizeof(*sorted));
    for (int32_t i = 0; i < N; i++) sorted[i] = (struct ref_item){l[i], i};
    qsort(sorted, N, sizeof(*sorted), ref_cmp);
    for (int r = 0; r < 20; r++) {
        struct sampler_result res;
        int32_t t = sampler_sample(s, sc, l, &res);
        assert_int_equal(res.token, t);
        assert_true(fabs(res.logprob - ((double)l[t] - lse)) < 2e-5);
        assert_int_equal(res.n_top, SAMPLER_MAX_TOP_LOGPROBS);
        for (int32_t i = 0; i < res.n_top; i++) {
            assert_int_equal(res.top[i].token, sorted[i].id);
            assert_true(fabs(res.top[i].logprob - (sorted[i].v - lse)) < 2e-5);
        }
    }
    sampler_free(s);

    // a vocabulary smaller than the request reports what there is
    p = seeded(9);
    p.n_top_logprobs = 5;
    s = sampler_create(&p, 3);
    const float tiny[3] = {1.0f, 2.0f, 3.0f};
    struct sampler_result res;
    sampler_sample(s, sc, tiny, &res);
    assert_int_equal(res.n_top, 3);
    double z3 = exp(1.0) + exp(2.0) + exp(3.0);
    assert_int_equal(res.top[0].token, 2);
    assert_true(fabs(res.top[0].logprob - (3.0 - log(z3))) < 1e-6);
    assert_true(fabs(res.top[2].logprob - (1.0 - log(z3))) < 1e-6);
    sampler_free(s);
    sampler_scratch_free(sc);
    free(sorted);
    free(l);
}

/* ---- history bookkeeping ----------------------------------------------- */

static void test_sampler_history_invariant(void **state) {
    (void)state;
    enum { N = 100000 };
    struct sampler_params p = seeded(1);
    struct sampler *s = sampler_create(&p, N);
    uint64_t x = 42;
    for (int32_t i = 0; i < 3000; i++) {
        // a skewed mix of repeats and new tokens, to grow and rehash the map
        int32_t t = (int32_t)(test_rng_next(&x) % (i % 3 ? 50 : N));
        sampler_accept(s, t, i < 100);
        if (i % 97 == 0) assert_true(sampler_check(s));
    }
    assert_true(sampler_check(s));
    assert_int_equal(sampler_n_prompt(s), 100);
    assert_int_equal(sampler_n_generated(s), 2900);
    sampler_free(s);
    sampler_free(NULL);
    sampler_scratch_free(NULL);
}

/* The allowed-token mask is step 1b: the oracle is the pipeline over logits
 * where every other token is -inf, penalties applied by hand afterwards. */
static void test_sampler_allowed_mask(void **state) {
    (void)state;
    enum { N = 300 };
    float l[N];
    fill_logits(l, N, 42, 2.0);
    uint64_t allow[(N + 63) / 64] = {0};
    for (int32_t i = 0; i < N; i += 3) allow[i >> 6] |= 1ull << (i & 63);
    allow[7 >> 6] |= 1ull << 7;
    struct sampler_params p = seeded(5);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.9f;
    p.repetition_penalty = 1.3f;
    struct sampler *s = sampler_create(&p, N);
    sampler_accept(s, 7, true);  // allowed and penalised
    sampler_accept(s, 8, true);  // penalised but banned by the mask
    double adj[N];
    for (int32_t i = 0; i < N; i++) adj[i] = (i % 3 == 0 || i == 7) ? l[i] : -INFINITY;
    adj[7] = l[7] > 0 ? l[7] / 1.3 : l[7] * 1.3;
    double want[N];
    ref_truncate(adj, N, &p, want);
    struct sampler_scratch *sc = sampler_scratch_create(N);
    float got[N];
    sampler_probs_allowed(s, sc, l, allow, got);
    for (int32_t i = 0; i < N; i++) assert_true(fabs(got[i] - want[i]) <= 1e-6);
    // draws record their tokens (the penalties move), but stay inside the mask
    for (int k = 0; k < 2000; k++) {
        int32_t t = sampler_sample_allowed(s, sc, l, allow, NULL);
        assert_true((allow[t >> 6] >> (t & 63)) & 1);
    }
    sampler_free(s);
    // greedy: the best allowed token, not the best token
    p = seeded(5);
    p.temperature = 0.0f;
    s = sampler_create(&p, N);
    int32_t best = -1;
    for (int32_t i = 0; i < N; i += 3)
        if (best < 0 || l[i] > l[best]) best = i;
    if (l[7] > l[best]) best = 7;
    assert_int_equal(sampler_sample_allowed(s, sc, l, allow, NULL), best);
    sampler_free(s);
    sampler_scratch_free(sc);
}

/* ---- speculative sampling ------------------------------------------------ */

/* The rejection rule: a draft x drawn from q (sampler_draft on a draft
 * model's logits), then sampler_sample_draft on the model's logits, gives
 * tokens distributed as the model's own pipeline distribution p, and keeps
 * the draft with probability sum_i min(p_i, q_i). Oracles: p and q from the
 * double-precision pipeline above (ref_truncate), a chi-square bound on the
 * tokens against p, and a binomial bound (5 sd) on the acceptance. Also a
 * point-mass draft outside p's support (always rejected: the tokens are
 * still p's) and a mask: allow for p (the grammar's, at verification), qallow
 * for q (the same grammar's, at drafting; NULL: q unmasked). */
static void check_draft_rule(const struct sampler_params *p, const float *lp, const float *lq,
                             int32_t n, const uint64_t *allow, const uint64_t *qallow,
                             int32_t n_draws) {
    struct sampler *s = sampler_create(p, n);
    struct sampler_scratch *sc = sampler_scratch_create(n);
    double *adj = malloc((size_t)n * sizeof(*adj));
    double *want_p = malloc((size_t)n * sizeof(*want_p));
    double *want_q = malloc((size_t)n * sizeof(*want_q));
    float *q = malloc((size_t)n * sizeof(*q));
    int32_t *count = calloc((size_t)n, sizeof(*count));
    for (int32_t i = 0; i < n; i++)
        adj[i] = allow && !((allow[i / 64] >> (i % 64)) & 1) ? -INFINITY : lp[i];
    ref_truncate(adj, n, p, want_p);
    for (int32_t i = 0; i < n; i++)
        adj[i] = qallow && !((qallow[i / 64] >> (i % 64)) & 1) ? -INFINITY : lq[i];
    ref_truncate(adj, n, p, want_q);
    double overlap = 0.0;
    for (int32_t i = 0; i < n; i++) overlap += want_p[i] < want_q[i] ? want_p[i] : want_q[i];
    int32_t n_kept = 0;
    for (int32_t d = 0; d < n_draws; d++) {
        int32_t x = sampler_draft(s, sc, lq, qallow, q);
        if (d == 0) {
            for (int32_t i = 0; i < n; i++) assert_true(fabs(q[i] - want_q[i]) < 1e-5);
        }
        assert_true(want_q[x] > 0.0);
        int32_t t = sampler_sample_draft(s, sc, lp, allow, x, q, NULL);
        assert_true(t >= 0 && t < n);
        assert_true(want_p[t] > 0.0);
        count[t]++;
        n_kept += t == x;
    }
    assert_chi2_fits(count, want_p, n, n_draws);
    double rate = (double)n_kept / n_draws;
    double sd = sqrt(overlap * (1.0 - overlap) / n_draws);
    print_message("draft kept %.4f, sum min(p, q) %.4f\n", rate, overlap);
    assert_true(fabs(rate - overlap) <= 5.0 * sd + 1e-9);
    // A point mass on a token p never draws: always rejected, the tokens still p's.
    int32_t outside = -1;
    for (int32_t i = 0; i < n && outside < 0; i++)
        if (want_p[i] == 0.0) outside = i;
    if (outside >= 0) {
        memset(count, 0, (size_t)n * sizeof(*count));
        for (int32_t i = 0; i < n; i++) q[i] = i == outside ? 1.0f : 0.0f;
        for (int32_t d = 0; d < n_draws; d++) {
            int32_t t = sampler_sample_draft(s, sc, lp, allow, outside, q, NULL);
            assert_int_not_equal(t, outside);
            count[t]++;
        }
        assert_chi2_fits(count, want_p, n, n_draws);
    }
    free(count);
    free(q);
    free(want_q);
    free(want_p);
    free(adj);
    sampler_scratch_free(sc);
    sampler_free(s);
}

static void test_sampler_draft_rule_keeps_the_distribution(void **state) {
    (void)state;
    enum { N = 48 };
    float lp[N], lq[N];
    fill_logits(lp, N, 101, 1.5);
    fill_logits(lq, N, 202, 1.5);
    for (int32_t i = 0; i < N; i++) lq[i] = 0.5f * lq[i] + 0.8f * lp[i];  // a related draft
    // Seeded so that the test is deterministic; the server drafts this way only for
    // unseeded sequences, which the rule does not tell apart.
    struct sampler_params p = seeded(11);
    check_draft_rule(&p, lp, lq, N, NULL, NULL, 100000);      // dense
    p.temperature = 0.7f;
    p.top_k = 12;
    check_draft_rule(&p, lp, lq, N, NULL, NULL, 100000);      // sparse: q has mass outside p
    p.top_k = 0;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    check_draft_rule(&p, lp, lq, N, NULL, NULL, 100000);
    uint64_t allow[1] = {0x0000f0f0f0f0f0f0ull};  // a grammar's mask on p; on q, or not
    p = seeded(12);
    check_draft_rule(&p, lp, lq, N, allow, NULL, 100000);
    check_draft_rule(&p, lp, lq, N, allow, allow, 100000);  // q masked as p is
    // A draft of the model itself: q = p, so every draft is kept; under a grammar,
    // only when q is masked as p is (unmasked, q has mass p has not).
    check_draft_rule(&p, lp, lp, N, NULL, NULL, 20000);
    check_draft_rule(&p, lp, lp, N, allow, allow, 20000);
    // Which sequences draft this way: only those without a seed that sample.
    struct sampler_params cases[3] = {sampler_default_params(), sampler_default_params(),
                                      seeded(7)};
    cases[1].temperature = 0.0f;
    for (int c = 0; c < 3; c++) {
        struct sampler *sm = sampler_create(&cases[c], N);
        assert_int_equal(sampler_is_deterministic(sm), c > 0);
        sampler_free(sm);
    }
}

/* sampler_mark / sampler_rewind (a sampled draft's tokens, tried in the
 * history). Oracles: during the trial, the distribution is that of a second
 * sampler given the same history by sampler_accept alone; after the rewind,
 * it is the one from before the trial, bit for bit, and the history checks
 * (sampler_check). The trial's 80 tokens over 50 ids (repeats of ids seen
 * before it and new ones) pass the count table's first growth (32 ids). */
static void test_sampler_mark_and_rewind(void **state) {
    (void)state;
    enum { N = 64 };
    float l[N], before[N], now[N], want[N];
    fill_logits(l, N, 303, 1.0);
    struct sampler_params p = seeded(21);
    p.presence_penalty = 0.7f;
    p.frequency_penalty = 0.4f;
    p.repetition_penalty = 1.3f;
    struct sampler *s = sampler_create(&p, N);
    struct sampler *ref = sampler_create(&p, N);
    struct sampler_scratch *sc = sampler_scratch_create(N);
    for (int32_t i = 0; i < 10; i++) {
        sampler_accept(s, i, true);
        sampler_accept(ref, i, true);
    }
    for (int32_t i = 0; i < 20; i++) {
        sampler_accept(s, (i * 7) % 12, false);
        sampler_accept(ref, (i * 7) % 12, false);
    }
    sampler_probs(s, sc, l, before);
    const int32_t at = sampler_mark(s);
    assert_int_equal(at, 20);
    for (int32_t i = 0; i < 80; i++) {
        const int32_t t = (i * 13) % 50;
        sampler_accept(s, t, false);
        sampler_accept(ref, t, false);
        if (i % 20 == 19) {
            sampler_probs(s, sc, l, now);
            sampler_probs(ref, sc, l, want);
            assert_memory_equal(now, want, sizeof(now));
        }
    }
    assert_true(sampler_check(s));
    sampler_rewind(s, at);
    assert_int_equal(sampler_n_generated(s), 20);
    assert_true(sampler_check(s));
    sampler_probs(s, sc, l, now);
    assert_memory_equal(now, before, sizeof(now));
    sampler_rewind(s, at);  // nothing to take back
    assert_true(sampler_check(s));
    sampler_scratch_free(sc);
    sampler_free(ref);
    sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler_validate_names_the_field),
        cmocka_unit_test(test_sampler_temperature_zero_is_argmax),
        cmocka_unit_test(test_sampler_temperature_to_zero_limit),
        cmocka_unit_test(test_sampler_seed_reproducible),
        cmocka_unit_test(test_sampler_truncation_matches_reference),
        cmocka_unit_test(test_sampler_top_k_draws),
        cmocka_unit_test(test_sampler_top_p_draws),
        cmocka_unit_test(test_sampler_min_p_draws),
        cmocka_unit_test(test_sampler_repetition_penalty_exact),
        cmocka_unit_test(test_sampler_presence_frequency_exact),
        cmocka_unit_test(test_sampler_logit_bias),
        cmocka_unit_test(test_sampler_logprobs_match_log_softmax),
        cmocka_unit_test(test_sampler_history_invariant),
        cmocka_unit_test(test_sampler_allowed_mask),
        cmocka_unit_test(test_sampler_draft_rule_keeps_the_distribution),
        cmocka_unit_test(test_sampler_mark_and_rewind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
