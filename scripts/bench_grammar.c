/*
 * bench_grammar.c - the cost of grammar-constrained decoding per step (a
 * benchmark, not a test): B sequences each under a JSON grammar, and per step
 * for each sequence the token mask (grammar_mask), the mask applied to a row
 * of logits and a token drawn (sampler_sample_allowed), and the matcher
 * advanced by the token (grammar_accept_token), against the same sampling
 * without a grammar. The "model" writes JSON documents: seeded random objects
 * (keys from a word list; strings, numbers, booleans, nulls, nested arrays
 * and objects) tokenized by the vocabulary, each token made the likeliest
 * over random logits, so the matcher meets the states real JSON output
 * meets, each sequence in its own documents.
 *
 * usage: bench_grammar VOCAB.gguf [batch] [steps]
 * Prints one markdown row: vocab size, trie nodes, trie build ms, batch,
 * CPU ms per step with and without the grammar (mean over the steps, so the
 * steps that meet a new state and walk the trie count in full), the
 * grammar's extra ms per step, its median, and the slowest step's extra.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/base/alloc.h"
#include "engine/base/buf.h"
#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "server/json_schema.h"

/* The calling thread's CPU time: all of this runs on one thread, and other
 * processes on a shared machine do not inflate it (they still share caches). */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static const char *const words[] = {
    "name", "id", "title", "price", "tags", "user", "email", "created_at", "items", "count",
    "description", "enabled", "address", "city", "zip", "score", "type", "value", "children",
    "Ünïcödé", "日本", "status", "ok", "error", "message", "latitude", "longitude",
};
#define N_WORDS ((int)(sizeof(words) / sizeof(words[0])))

/* A random JSON value into out, depth-limited. */
static void gen_value(struct buf *out, uint64_t *x, int depth) {
    int kind = (int)(rng(x) % (depth > 2 ? 5 : 7));
    char tmp[64];
    switch (kind) {
    case 0: buf_append_str(out, "\""); buf_append_str(out, words[rng(x) % N_WORDS]);
            if (rng(x) % 2) { buf_append_str(out, " "); buf_append_str(out, words[rng(x) % N_WORDS]); }
            buf_append_str(out, "\""); break;
    case 1: snprintf(tmp, sizeof(tmp), "%d", (int)(rng(x) % 100000) - 500); buf_append_str(out, tmp); break;
    case 2: snprintf(tmp, sizeof(tmp), "%.3f", (double)(rng(x) % 100000) / 97.0); buf_append_str(out, tmp); break;
    case 3: buf_append_str(out, rng(x) % 2 ? "true" : "false"); break;
    case 4: buf_append_str(out, "null"); break;
    case 5: {
        buf_append_str(out, "[");
        int n = (int)(rng(x) % 4);
        for (int i = 0; i < n; i++) {
            if (i) buf_append_str(out, ", ");
            gen_value(out, x, depth + 1);
        }
        buf_append_str(out, "]");
        break;
    }
    default: {
        buf_append_str(out, "{");
        int n = 1 + (int)(rng(x) % 4);
        for (int i = 0; i < n; i++) {
            if (i) buf_append_str(out, ", ");
            buf_append_str(out, "\"");
            buf_append_str(out, words[rng(x) % N_WORDS]);
            buf_append_str(out, "\": ");
            gen_value(out, x, depth + 1);
        }
        buf_append_str(out, "}");
    }
    }
}

/* One sequence's "model": its current document, written token by token as
 * the longest piece that matches what is left of it. */
struct writer {
    struct buf doc;  // owned
    size_t at;       // bytes of doc written
    uint64_t x;
};

static void next_doc(struct writer *w) {
    buf_reset(&w->doc);
    w->at = 0;
    buf_append_str(&w->doc, "{\"");
    buf_append_str(&w->doc, words[rng(&w->x) % N_WORDS]);
    buf_append_str(&w->doc, "\": ");
    gen_value(&w->doc, &w->x, 0);
    buf_append_str(&w->doc, ", \"more\": ");
    gen_value(&w->doc, &w->x, 1);
    buf_append_str(&w->doc, "}");
}

/* The token with the longest piece that the rest of w's document starts with. */
static int32_t next_token(const struct writer *w, const struct buf *pieces, const uint32_t *off,
                          int32_t n_vocab, uint32_t *len) {
    int32_t best = -1;
    *len = 0;
    const char *rest = w->doc.data + w->at;
    size_t n_rest = w->doc.len - w->at;
    for (int32_t t = 0; t < n_vocab; t++) {
        uint32_t n = off[t + 1] - off[t];
        if (n > *len && n <= n_rest && memcmp(pieces->data + off[t], rest, n) == 0) {
            best = t;
            *len = n;
        }
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_grammar VOCAB.gguf [batch] [steps]\n");
        return 2;
    }
    int batch = argc > 2 ? atoi(argv[2]) : 1;
    int steps = argc > 3 ? atoi(argv[3]) : 200;
    if (batch < 1 || steps < 1) return 2;
    struct buf gtext = {0};
    json_schema_object_gbnf(&gtext);  // the server's json_object grammar, the one copy
    struct gguf_file *gf = NULL;
    struct tokenizer *tok = NULL;
    if (gguf_open(argv[1], &gf) || tokenizer_load(gf, &tok)) {
        fprintf(stderr, "bench_grammar: cannot load the vocabulary of %s\n", argv[1]);
        return 1;
    }
    char msg[256];
    struct gbnf *g = NULL;
    if (gbnf_compile(gtext.data, gtext.len, &g, msg, sizeof(msg))) {
        fprintf(stderr, "bench_grammar: %s\n", msg);
        return 1;
    }
    int32_t n_vocab = tokenizer_n_vocab(tok);
    double t0 = now_ms();
    struct grammar_vocab *gv = grammar_vocab_create(tok);
    double trie_ms = now_ms() - t0;

    float *logits = xmalloc((size_t)batch * n_vocab * sizeof(float));  // [batch, n_vocab]
    uint64_t *allow = xmalloc(grammar_mask_words(n_vocab) * sizeof(uint64_t));
    struct grammar **gm = xcalloc((size_t)batch, sizeof(*gm));
    struct sampler **sp = xcalloc((size_t)batch, sizeof(*sp));
    struct sampler_params p = sampler_default_params();
    p.temperature = 1.0f;
    p.has_seed = true;
    struct sampler_scratch *sc = sampler_scratch_create(n_vocab);
    double *with = xmalloc((size_t)steps * sizeof(double));
    double *without = xmalloc((size_t)steps * sizeof(double));
    uint64_t x = 88172645463325252ull;
    for (int b = 0; b < batch; b++) {
        gm[b] = grammar_create(g);
        p.seed = 1000 + (uint64_t)b;
        sp[b] = sampler_create(&p, n_vocab);
    }
    // every token's piece, as the grammar sees it (control tokens: empty)
    struct buf pieces = {0};
    uint32_t *off = xmalloc(((size_t)n_vocab + 1) * sizeof(uint32_t));
    for (int32_t t = 0; t < n_vocab; t++) {
        off[t] = (uint32_t)pieces.len;
        tokenizer_token_to_piece(tok, t, false, &pieces);
    }
    off[n_vocab] = (uint32_t)pieces.len;
    struct writer *wr = xcalloc((size_t)batch, sizeof(*wr));
    int32_t *want = xmalloc((size_t)batch * sizeof(int32_t));
    uint32_t *want_len = xmalloc((size_t)batch * sizeof(uint32_t));
    for (int b = 0; b < batch; b++) {
        wr[b].x = 0x9E3779B97F4A7C15ull * (uint64_t)(b + 1);
        next_doc(&wr[b]);
    }
    long n_docs = 0, n_desync = 0;
    int64_t n_cut = 0;  // masks cut short by the matcher's bound of work (grammar.h)
    for (int s = 0; s < steps; s++) {
        for (size_t i = 0; i < (size_t)batch * n_vocab; i++)
            logits[i] = (float)(rng(&x) >> 40) * (8.0f / (float)(1 << 24));  // U[0, 8)
        for (int b = 0; b < batch; b++) {  // the writer's next token is the likeliest
            want[b] = next_token(&wr[b], &pieces, off, n_vocab, &want_len[b]);
            ASSERT(want[b] >= 0);  // byte tokens (or the byte-level alphabet) always match
            logits[(size_t)b * n_vocab + want[b]] = 30.0f;
        }
        // unconstrained: sampling alone
        double a = now_ms();
        for (int b = 0; b < batch; b++)
            (void)sampler_sample(sp[b], sc, logits + (size_t)b * n_vocab, NULL);
        without[s] = now_ms() - a;
        // constrained: mask, masked sampling, advance
        a = now_ms();
        for (int b = 0; b < batch; b++) {
            int32_t t = -1;
            if (grammar_mask(gm[b], gv, allow) > 0)
                t = sampler_sample_allowed(sp[b], sc, logits + (size_t)b * n_vocab, allow, NULL);
            enum grammar_step st = t >= 0 ? grammar_accept_token(gm[b], gv, t) : GRAMMAR_STEP_REJECT;
            bool desync = t != want[b];  // the grammar refused the writer's token
            wr[b].at += want_len[b];
            if (st == GRAMMAR_STEP_DONE || desync || wr[b].at == wr[b].doc.len) {
                n_docs += st == GRAMMAR_STEP_DONE;
                n_desync += desync;
                n_cut += grammar_n_masks_cut(gm[b]);
                grammar_free(gm[b]);  // the next document
                gm[b] = grammar_create(g);
                next_doc(&wr[b]);
            }
        }
        with[s] = now_ms() - a;
    }
    for (int b = 0; b < batch; b++) buf_free(&wr[b].doc);
    free(wr);
    free(want);
    free(want_len);
    free(off);
    buf_free(&pieces);
    double extra_max = 0, mw = 0, mo = 0;
    double *extra = xmalloc((size_t)steps * sizeof(double));
    for (int s = 0; s < steps; s++) {
        extra[s] = with[s] - without[s];
        if (extra[s] > extra_max) extra_max = extra[s];
        mw += with[s] / steps;
        mo += without[s] / steps;
    }
    qsort(extra, (size_t)steps, sizeof(double), cmp_double);
    double extra_median = extra[steps / 2];
    free(extra);
    int32_t n_states = 0;
    for (int b = 0; b < batch; b++) n_states += grammar_n_states(gm[b]);
    for (int b = 0; b < batch; b++) n_cut += grammar_n_masks_cut(gm[b]);
    const char *name = strrchr(gguf_name(gf), '/');
    printf("| %s | %d | %d | %.0f | %d | %.3f | %.3f | %.3f | %.3f | %.2f |\n",
           name ? name + 1 : gguf_name(gf), (int)n_vocab, (int)grammar_vocab_n_nodes(gv), trie_ms,
           batch, mw, mo, mw - mo, extra_median, extra_max);
    fprintf(stderr, "bench_grammar: %d steps, %ld documents completed, %ld refused tokens, %d states "
            "in the matchers at the end, %lld masks cut at the bound of work\n", steps, n_docs,
            n_desync, (int)n_states, (long long)n_cut);
    for (int b = 0; b < batch; b++) {
        grammar_free(gm[b]);
        sampler_free(sp[b]);
    }
    free(gm);
    free(sp);
    free(with);
    free(without);
    free(allow);
    free(logits);
    sampler_scratch_free(sc);
    grammar_vocab_free(gv);
    gbnf_release(g);
    tokenizer_free(tok);
    gguf_close(gf);
    buf_free(&gtext);
    return 0;
}
