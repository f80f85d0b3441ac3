/*
 * tests/helpers/fake_engine.c - deterministic stand-ins for the engine and
 * the tokenizer (the contract is in fake_engine.h). The real sampler and
 * stop matcher (engine/sampler.c, engine/stop.c) are linked beside it.
 */
#define LOG_TAG "fake_engine"
#include "tests/helpers/fake_engine.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/base/log.h"

struct fake_counters {
    int64_t n_errors;
    int64_t n_tokens;
    atomic_int n_live_adapters;   // loaded and not yet freed
    atomic_llong n_adapter_sets;  // engine_ctx_set_adapter calls with an adapter
    atomic_ullong next_adapter_id; // the id the next loaded adapter gets (engine/lora.h)
    atomic_llong n_loads;          // engine_adapter_load calls
    pthread_mutex_t gate_lock;     // guards the two gate counters
    pthread_cond_t gate_cond;      // an arrival or a pass
    int32_t n_gate_arrived;        // gated loads that reached the gate so far
    int32_t n_gate_passes;         // gated loads let through so far
};

/* A fake adapter: its effect is a salt mixed into the chain hash of every
 * token computed under it, so its tokens' K/V and logits differ from the
 * base model's and from every other adapter's. */
struct engine_adapter {
    atomic_int n_refs;
    const struct engine_model *m;
    uint64_t salt;
    char *path;                    // owned
    struct engine_adapter_info info;
};

struct tokenizer {
    int32_t n_vocab;
};

struct engine_model {
    struct fake_engine_params p;
    struct engine_model_info info;
    struct tokenizer tok;
    struct fake_counters *counters;  // owned; mutable through a const model
};

struct kv_slot {
    int32_t pos;    // -1: never written
    int32_t token;
    uint64_t h;
};

struct engine_ctx {
    const struct engine_model *m;
    struct engine_ctx_params p;
    struct kv_slot *kv;   // [n_blocks * block_size]
    float *logits;        // [max_batch_tokens * n_vocab]
    int32_t *order;       // [max_batch_tokens]
    const struct engine_batch *sort_batch;
    struct engine_adapter **slots;  // [max_adapters] each an owned reference or NULL
};

static uint64_t mix(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    x ^= x >> 33;
    return x;
}

static uint64_t chain(uint64_t prev, int32_t token, int32_t pos) {
    return mix(prev ^ mix((uint64_t)(uint32_t)token * 0x9e3779b97f4a7c15ull + (uint64_t)pos));
}

/* ---- model ---- */

struct engine_model *fake_engine_model_create(const struct fake_engine_params *p) {
    struct engine_model *m = xcalloc(1, sizeof(*m));
    m->p = *p;
    m->tok.n_vocab = p->n_vocab;
    m->counters = xcalloc(1, sizeof(*m->counters));
    atomic_init(&m->counters->next_adapter_id, 1);
    pthread_mutex_init(&m->counters->gate_lock, NULL);
    pthread_cond_init(&m->counters->gate_cond, NULL);
    m->info.arch = "fake";
    m->info.name = "fake";
    m->info.weight_type = "f32";
    m->info.n_vocab = p->n_vocab;
    m->info.n_ctx_train = p->n_ctx;
    m->info.sliding_window = p->sliding_window;
    m->info.n_layer = 1;
    return m;
}

void engine_model_free(struct engine_model *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->counters->gate_lock);
    pthread_cond_destroy(&m->counters->gate_cond);
    free(m->counters);
    free(m);
}

int64_t fake_engine_n_errors(const struct engine_model *m) { return m->counters->n_errors; }
int64_t fake_engine_n_tokens(const struct engine_model *m) { return m->counters->n_tokens; }

int32_t fake_engine_argmax(const struct engine_model *m, uint64_t h) {
    return (int32_t)(h % (uint64_t)m->p.n_vocab);
}

const struct engine_model_info *engine_model_get_info(const struct engine_model *m) {
    return &m->info;
}

const struct tokenizer *engine_model_tokenizer(const struct engine_model *m) { return &m->tok; }

size_t engine_kv_block_bytes(const struct engine_model *m, int32_t block_size,
                             enum engine_kv_type kv_type) {
    (void)kv_type;
    size_t per = m->p.kv_block_bytes ? m->p.kv_block_bytes : 1024;
    return per * (size_t)block_size;
}

/* ---- adapters ---- */

int engine_adapter_load(const struct engine_model *m, const char *path,
                        struct engine_adapter **out) {
    *out = NULL;
    struct fake_counters *fc = m->counters;
    atomic_fetch_add(&fc->n_loads, 1);
    if (path && strstr(path, "gate")) {
        // Wait for the test to let this one (the k-th arrival) through.
        pthread_mutex_lock(&fc->gate_lock);
        int32_t k = fc->n_gate_arrived++;
        pthread_cond_broadcast(&fc->gate_cond);
        while (fc->n_gate_passes <= k) pthread_cond_wait(&fc->gate_cond, &fc->gate_lock);
        pthread_mutex_unlock(&fc->gate_lock);
    }
    if (!path || !*path || strstr(path, "missing")) return ERR_IO;
    if (strstr(path, "bad")) return ERR_FORMAT;
    struct engine_adapter *a = xcalloc(1, sizeof(*a));
    atomic_init(&a->n_refs, 1);
    a->m = m;
    a->path = xstrdup(path);
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = path; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    a->salt = mix(h) | 1;
    a->info.kind = ENGINE_ADAPTER_LORA;
    a->info.format = "fake";
    a->info.path = a->path;
    a->info.rank = 4;
    a->info.scale = 1.0f;
    a->info.n_targets = 1;
    a->info.bytes = 64;
    a->info.id = atomic_fetch_add(&m->counters->next_adapter_id, 1);
    atomic_fetch_add(&m->counters->n_live_adapters, 1);
    *out = a;
    return 0;
}

/* The fake reads nothing: the descriptor's load is the path's. */
int engine_adapter_load_fd(const struct engine_model *m, int fd, const char *path,
                           unsigned flags, struct engine_adapter **out) {
    (void)fd;
    (void)flags;
    return engine_adapter_load(m, path, out);
}

struct engine_adapter *engine_adapter_retain(struct engine_adapter *a) {
    ASSERT(atomic_fetch_add(&a->n_refs, 1) > 0);
    return a;
}

void engine_adapter_release(struct engine_adapter *a) {
    if (!a) return;
    int n = atomic_fetch_sub(&a->n_refs, 1);
    ASSERT(n > 0);
    if (n > 1) return;
    atomic_fetch_sub(&a->m->counters->n_live_adapters, 1);
    free(a->path);
    free(a);
}

const struct engine_adapter_info *engine_adapter_get_info(const struct engine_adapter *a) {
    return &a->info;
}

int engine_ctx_set_adapter(struct engine_ctx *c, int32_t slot, struct engine_adapter *a) {
    if (slot < 0 || slot >= c->p.max_adapters || (a && a->m != c->m)) return ERR_INVAL;
    if (a) {
        engine_adapter_retain(a);
        atomic_fetch_add(&c->m->counters->n_adapter_sets, 1);
    }
    engine_adapter_release(c->slots[slot]);
    c->slots[slot] = a;
    return 0;
}

const struct engine_adapter *engine_ctx_adapter(const struct engine_ctx *c, int32_t slot) {
    ASSERT(slot >= 0 && slot < c->p.max_adapters);
    return c->slots[slot];
}

int32_t fake_engine_n_live_adapters(const struct engine_model *m) {
    return atomic_load(&m->counters->n_live_adapters);
}

int64_t fake_engine_n_adapter_sets(const struct engine_model *m) {
    return atomic_load(&m->counters->n_adapter_sets);
}

int64_t fake_engine_n_loads(const struct engine_model *m) {
    return atomic_load(&m->counters->n_loads);
}

void fake_engine_gate_wait(const struct engine_model *m, int32_t n) {
    struct fake_counters *fc = m->counters;
    pthread_mutex_lock(&fc->gate_lock);
    while (fc->n_gate_arrived < n) pthread_cond_wait(&fc->gate_cond, &fc->gate_lock);
    pthread_mutex_unlock(&fc->gate_lock);
}

void fake_engine_gate_pass(const struct engine_model *m, int32_t n) {
    struct fake_counters *fc = m->counters;
    pthread_mutex_lock(&fc->gate_lock);
    fc->n_gate_passes += n;
    pthread_cond_broadcast(&fc->gate_cond);
    pthread_mutex_unlock(&fc->gate_lock);
}

/* ---- ctx ---- */

struct engine_ctx_params engine_ctx_default_params(void) {
    struct engine_ctx_params p = {.max_batch_tokens = 512, .max_seqs = 64, .block_size = 16};
    return p;
}

int engine_ctx_create(const struct engine_model *m, const struct engine_ctx_params *p,
                      struct engine_ctx **out) {
    *out = NULL;
    if (p->block_size < 1 || p->n_blocks < 2 || p->max_batch_tokens < 1 || p->max_seqs < 1)
        return ERR_INVAL;
    struct engine_ctx *c = xcalloc(1, sizeof(*c));
    c->m = m;
    c->p = *p;
    size_t n_slots = (size_t)p->n_blocks * (size_t)p->block_size;
    c->kv = xmalloc(n_slots * sizeof(*c->kv));
    for (size_t i = 0; i < n_slots; i++) c->kv[i].pos = -1;
    c->logits = xmalloc((size_t)p->max_batch_tokens * (size_t)m->p.n_vocab * sizeof(float));
    c->order = xmalloc((size_t)p->max_batch_tokens * sizeof(int32_t));
    if (p->max_adapters > 0) c->slots = xcalloc((size_t)p->max_adapters, sizeof(*c->slots));
    *out = c;
    return 0;
}

void engine_ctx_free(struct engine_ctx *c) {
    if (!c) return;
    for (int32_t i = 0; i < c->p.max_adapters; i++) engine_adapter_release(c->slots[i]);
    free(c->slots);
    free(c->kv);
    free(c->logits);
    free(c->order);
    free(c);
}

const struct engine_model *engine_ctx_model(const struct engine_ctx *c) { return c->m; }
int32_t engine_ctx_block_size(const struct engine_ctx *c) { return c->p.block_size; }
int32_t engine_ctx_n_blocks(const struct engine_ctx *c) { return c->p.n_blocks; }

/* One rank, no figures: the fake has no process of its own to measure. */
int32_t engine_ctx_rank_stats(const struct engine_ctx *c, struct engine_rank_stats *out,
                              int32_t max) {
    (void)c;
    if (max > 0) out[0] = (struct engine_rank_stats){0};
    return 1;
}

static void fake_error(const struct engine_ctx *c, const char *what, int32_t seq, int32_t pos,
                       int32_t q) {
    if (c->m->counters->n_errors++ < 5)
        fprintf(stderr, "fake_engine: %s (batch seq %d, pos %d, position %d)\n", what, (int)seq,
                (int)pos, (int)q);
}

/* The slot of position q of sequence si, or NULL (counted as an error). */
static struct kv_slot *slot_of(const struct engine_ctx *c, const struct engine_batch *b,
                               int32_t si, int32_t pos, int32_t q) {
    const struct engine_seq *es = &b->seqs[si];
    int32_t bs = c->p.block_size;
    int32_t i = q / bs;
    if (i >= es->n_blocks) {
        fake_error(c, "position beyond the block table", si, pos, q);
        return NULL;
    }
    int32_t id = es->block_table[i];
    if (id <= 0 || id >= c->p.n_blocks) {
        fake_error(c, "null or bad block in the table", si, pos, q);
        return NULL;
    }
    return &c->kv[(size_t)id * (size_t)bs + (size_t)(q % bs)];
}

/* qsort has no context argument: the batch being sorted sits in a
 * thread-local pointer (tests run engine_forward on one thread). */
static _Thread_local const struct engine_batch *sort_b;

static int cmp_order(const void *x, const void *y) {
    int32_t i = *(const int32_t *)x;
    int32_t j = *(const int32_t *)y;
    if (sort_b->seq[i] != sort_b->seq[j]) return sort_b->seq[i] < sort_b->seq[j] ? -1 : 1;
    if (sort_b->pos[i] != sort_b->pos[j]) return sort_b->pos[i] < sort_b->pos[j] ? -1 : 1;
    return (i > j) - (i < j);
}

int engine_forward(struct engine_ctx *c, const struct engine_batch *b, const float **out_logits) {
    *out_logits = NULL;
    if (b->n_tokens < 1 || b->n_tokens > c->p.max_batch_tokens || b->n_seqs < 1 ||
        b->n_seqs > c->p.max_seqs)
        return ERR_INVAL;
    int32_t n_vocab = c->m->p.n_vocab;
    int32_t w = c->m->p.sliding_window;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        ASSERT(b->seq[t] >= 0 && b->seq[t] < b->n_seqs && b->pos[t] >= 0);
        ASSERT(b->token[t] >= 0 && b->token[t] < n_vocab);
        int32_t slot = b->adapter ? b->adapter[t] : -1;
        if (slot >= 0 && (slot >= c->p.max_adapters || !c->slots[slot])) return ERR_INVAL;
        c->order[t] = t;
    }
    sort_b = b;
    qsort(c->order, (size_t)b->n_tokens, sizeof(*c->order), cmp_order);
    // Output rows come in batch order: number them first.
    int32_t n_out = 0;
    int32_t *row = xmalloc((size_t)b->n_tokens * sizeof(*row));
    for (int32_t t = 0; t < b->n_tokens; t++) row[t] = b->output[t] ? n_out++ : -1;
    for (int32_t k = 0; k < b->n_tokens; k++) {
        int32_t t = c->order[k];
        int32_t si = b->seq[t];
        int32_t pos = b->pos[t];
        uint64_t prev = 0x1234567ull;
        if (pos > 0) {
            struct kv_slot *ps = slot_of(c, b, si, pos, pos - 1);
            if (ps && ps->pos != pos - 1) fake_error(c, "previous position not written", si, pos, pos - 1);
            if (ps) prev = ps->h;
        }
        struct kv_slot *sl = slot_of(c, b, si, pos, pos);
        int32_t slot = b->adapter ? b->adapter[t] : -1;
        uint64_t h = chain(slot >= 0 ? prev ^ c->slots[slot]->salt : prev, b->token[t], pos);
        if (sl) {
            sl->pos = pos;
            sl->token = b->token[t];
            sl->h = h;
        }
        // Attention: every position of the window must hold itself.
        int32_t q0 = w > 0 && pos - w + 1 > 0 ? pos - w + 1 : 0;
        for (int32_t q = q0; q < pos; q++) {
            struct kv_slot *qs = slot_of(c, b, si, pos, q);
            if (qs && qs->pos != q) fake_error(c, "attended position not written", si, pos, q);
        }
        if (row[t] >= 0) {
            float *lg = c->logits + (size_t)row[t] * (size_t)n_vocab;
            for (int32_t j = 0; j < n_vocab; j++) lg[j] = 0.0f;
            lg[(h >> 17) % (uint64_t)n_vocab] = 1.5f;
            lg[fake_engine_argmax(c->m, h)] = 3.0f;
        }
    }
    free(row);
    c->m->counters->n_tokens += b->n_tokens;
    *out_logits = c->logits;
    return 0;
}

/* ---- tokenizer ---- */

int32_t tokenizer_n_vocab(const struct tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const struct tokenizer *t) { (void)t; return FAKE_ENGINE_BOS; }
int32_t tokenizer_eos(const struct tokenizer *t) { (void)t; return FAKE_ENGINE_EOS; }

bool tokenizer_is_eog(const struct tokenizer *t, int32_t id) {
    (void)t;
    return id == FAKE_ENGINE_EOS;
}

void tokenizer_token_to_piece(const struct tokenizer *t, int32_t id, bool special, struct buf *out) {
    (void)t;
    (void)special;
    if (id >= 2) buf_printf(out, "t%d ", (int)id);
}

void tokenizer_stream_init(struct tokenizer_stream *s, bool skip_special) {
    memset(s, 0, sizeof(*s));
    s->skip_special = skip_special;
}

void tokenizer_stream_init_after(struct tokenizer_stream *s, const struct tokenizer *t,
                                 const int32_t *prompt, int32_t n_prompt, bool skip_special) {
    (void)t;
    (void)prompt;
    (void)n_prompt;
    tokenizer_stream_init(s, skip_special);
}

void tokenizer_stream_feed(const struct tokenizer *t, struct tokenizer_stream *s, int32_t id,
                           struct buf *out) {
    s->n_fed++;
    tokenizer_token_to_piece(t, id, !s->skip_special, out);
}

void tokenizer_stream_piece(const struct tokenizer *t, struct tokenizer_stream *s, int32_t id,
                            struct buf *out) {
    (void)s;
    tokenizer_token_to_piece(t, id, true, out);
}

void tokenizer_stream_flush(const struct tokenizer *t, struct tokenizer_stream *s, struct buf *out) {
    (void)t;
    (void)s;
    (void)out;
}
