/*
 * scheduler/seq.c - sequence lifecycle, stop conditions, incremental text.
 *
 * Text path of one token: tokenizer_stream (holds back a split UTF-8
 * character) -> reply prefix (holds back what may be the chat template's
 * anchor before a reply, dropped once matched) -> stop_matcher (holds back
 * a possible stop-string prefix) -> the caller's text buffer. Both hold-backs are flushed when the sequence
 * finishes for another reason, so no text is lost.
 */
#include "scheduler/seq.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/text/stop.h"
#include "scheduler/block_alloc.h"
#include "scheduler/channel.h"

int seq_create(uint64_t id, const struct tokenizer *tok, int32_t n_vocab, const int32_t *prompt,
               int32_t n_prompt, const struct seq_params *p, int32_t block_size,
               struct seq **out) {
    *out = NULL;
    ASSERT(n_prompt >= 1 && p->max_tokens >= 1 && block_size >= 1);
    struct seq *s = calloc(1, sizeof(*s));
    if (!s) return ERR_NOMEM;
    int err = ERR_NOMEM;
    s->id = id;
    s->status = SEQ_STATUS_WAITING;
    s->n_prompt = n_prompt;
    s->n_tokens = n_prompt;
    s->n_tokens_max = n_prompt + p->max_tokens;
    s->max_tokens = p->max_tokens;
    s->min_tokens = p->min_tokens;
    s->ignore_eos = p->ignore_eos;
    s->n_logprobs = p->n_logprobs;
    s->adapter = p->adapter ? engine_adapter_retain(p->adapter) : NULL;
    // The loaded object's identity, whatever slot it gets (lora.h): its
    // keys never change, so they are computed once.
    s->adapter_id = p->adapter ? engine_adapter_get_info(p->adapter)->id : 0;
    s->slot = -1;
    s->tok = tok;
    if (tok) tokenizer_stream_init_after(&s->stream, tok, prompt, n_prompt, p->skip_special);
    else tokenizer_stream_init(&s->stream, p->skip_special);
    if (p->reply_prefix) {
        size_t n = strlen(p->reply_prefix);
        if (n > SEQ_MAX_REPLY_PREFIX) {
            err = ERR_INVAL;
            goto fail;
        }
        memcpy(s->reply_prefix, p->reply_prefix, n + 1);
        s->n_reply_prefix = (int32_t)n;
    }
    int32_t cap = block_table_blocks_for(s->n_tokens_max, block_size);
    if (block_table_init(&s->table, cap) != 0) goto fail;
    s->tokens = malloc((size_t)s->n_tokens_max * sizeof(*s->tokens));
    s->keys = malloc(((size_t)cap + 1) * sizeof(*s->keys));
    if (!s->tokens || !s->keys) goto fail;
    memcpy(s->tokens, prompt, (size_t)n_prompt * sizeof(*prompt));
    if (p->n_stop_token_ids > 0) {
        s->stop_token_ids = malloc((size_t)p->n_stop_token_ids * sizeof(int32_t));
        if (!s->stop_token_ids) goto fail;
        memcpy(s->stop_token_ids, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof(int32_t));
        s->n_stop_token_ids = p->n_stop_token_ids;
    }
    if (p->n_stop > 0) {
        err = stop_matcher_create(p->stop, p->n_stop, p->include_stop_str, &s->stop);
        if (err) goto fail;
        err = ERR_NOMEM;
    }
    struct sampler_params sp = p->sampling;
    if (p->n_logprobs > 0)
        sp.n_top_logprobs = p->n_logprobs < SAMPLER_MAX_TOP_LOGPROBS ? p->n_logprobs
                                                                     : SAMPLER_MAX_TOP_LOGPROBS;
    s->sampler = sampler_create(&sp, n_vocab);
    if (!s->sampler) goto fail;
    if (p->grammar) {
        s->grammar = grammar_create(p->grammar);
        if (!s->grammar) goto fail;
        if (p->grammar_trigger && p->grammar_trigger[0])
            s->grammar_trigger = xstrdup(p->grammar_trigger);
    }
    for (int32_t i = 0; i < n_prompt; i++) sampler_accept(s->sampler, prompt[i], true);
    *out = s;
    return 0;

fail:
    seq_destroy(s);
    return err;
}

void seq_destroy(struct seq *s) {
    if (!s) return;
    block_table_deinit(&s->table);
    block_table_deinit(&s->draft_table);
    free(s->tokens);
    free(s->keys);
    free(s->stop_token_ids);
    sampler_free(s->sampler);
    grammar_free(s->grammar);
    free(s->grammar_trigger);
    buf_free(&s->trigger_window);
    stop_matcher_free(s->stop);
    buf_free(&s->piece);
    buf_free(&s->unprefixed);
    channel_release(s->channel);
    engine_adapter_release(s->adapter);
    free(s);
}

enum grammar_step seq_grammar_trigger(struct seq *s, int32_t token) {
    ASSERT(s->grammar && s->grammar_trigger);
    // The alternatives, separated by '\n': the longest sets how far back to look.
    const char *alts = s->grammar_trigger;
    size_t n = 0;
    for (const char *p = alts; *p;) {
        size_t len = strcspn(p, "\n");
        if (len > n) n = len;
        p += len + (p[len] == '\n');
    }
    ASSERT(n > 0);
    struct buf *w = &s->trigger_window;
    size_t old_len = w->len;
    tokenizer_token_to_piece(s->tok, token, true, w);
    // An alternative's first byte is in the text before this token's bytes only
    // if it started within the last n - 1 bytes. The earliest start wins.
    size_t from = old_len > n - 1 ? old_len - (n - 1) : 0;
    size_t at = w->len;
    for (const char *p = alts; *p;) {
        size_t len = strcspn(p, "\n");
        for (size_t i = from; len > 0 && i + len <= w->len && i < at; i++) {
            if (memcmp(w->data + i, p, len) == 0) {
                at = i;
                break;
            }
        }
        p += len + (p[len] == '\n');
    }
    if (at == w->len) {
        // keep only the bytes the next search can need
        if (w->len > n - 1) {
            memmove(w->data, w->data + w->len - (n - 1), n - 1);
            w->len = n - 1;
        }
        return GRAMMAR_STEP_OK;
    }
    enum grammar_step st = grammar_accept_bytes(s->grammar, w->data + at, w->len - at);
    free(s->grammar_trigger);
    s->grammar_trigger = NULL;
    buf_free(w);
    if (st == GRAMMAR_STEP_REJECT) {
        grammar_free(s->grammar);
        s->grammar = NULL;
    }
    return st;
}

static bool is_stop_token(const struct seq *s, int32_t token) {
    if (!s->ignore_eos && s->tok && tokenizer_is_eog(s->tok, token)) return true;
    for (int32_t i = 0; i < s->n_stop_token_ids; i++)
        if (s->stop_token_ids[i] == token) return true;
    return false;
}

/* Passes piece through the stop matcher into text; 1 when a stop string matched. */
static int emit(struct seq *s, const char *piece, size_t len, struct buf *text) {
    if (!s->stop) {
        buf_append(text, piece, len);
        return 0;
    }
    return stop_matcher_feed(s->stop, piece, len, text);
}

/* The reply prefix (the template's " " after "[/INST]", say) is the
 * template's, not the reply's: it is matched byte by byte at the text's start
 * and dropped when whole; on a mismatch, or at a finish before it is whole,
 * the held bytes go out as text. Returns s->piece, or s->unprefixed holding
 * what passes. */
static const struct buf *drop_reply_prefix(struct seq *s, bool finishing) {
    if (s->n_reply_prefix == 0) return &s->piece;
    struct buf *out = &s->unprefixed;
    buf_reset(out);
    size_t i = 0;
    for (; i < s->piece.len && s->n_prefix_held < s->n_reply_prefix; i++) {
        if (s->piece.data[i] != s->reply_prefix[s->n_prefix_held]) break;
        s->n_prefix_held++;
    }
    bool whole = s->n_prefix_held == s->n_reply_prefix;
    bool mismatch = i < s->piece.len && !whole;
    if (whole || mismatch || finishing) {
        if (!whole) buf_append(out, s->reply_prefix, (size_t)s->n_prefix_held);
        s->n_reply_prefix = 0;  // done with it
    }
    buf_append(out, s->piece.data ? s->piece.data + i : "", s->piece.len - i);
    return out;
}

/* The text of the token just fed into s->piece, through the reply prefix
 * and the stop matcher; 1 when a stop string matched. */
static int emit_piece(struct seq *s, struct buf *text, bool finishing) {
    const struct buf *p = drop_reply_prefix(s, finishing);
    return emit(s, p->data ? p->data : "", p->len, text);
}

/* Finishing without a stop string: everything held back goes out. */
static void flush(struct seq *s, struct buf *text) {
    buf_reset(&s->piece);
    if (s->tok) tokenizer_stream_flush(s->tok, &s->stream, &s->piece);
    if (emit_piece(s, text, true)) return;
    if (s->stop) stop_matcher_flush(s->stop, text);
}

enum seq_status seq_append(struct seq *s, int32_t token, struct buf *text) {
    ASSERT(s->n_tokens < s->n_tokens_max && !seq_is_finished(s));
    s->tokens[s->n_tokens++] = token;
    int32_t n_generated = seq_n_generated(s);
    // min_tokens counts the tokens before the stop token (vLLM masks eos while
    // fewer than min_tokens were generated).
    if (is_stop_token(s, token) && n_generated > s->min_tokens) {
        flush(s, text);
        s->status = SEQ_STATUS_FINISHED_STOP;
        return s->status;
    }
    buf_reset(&s->piece);
    if (s->tok) tokenizer_stream_feed(s->tok, &s->stream, token, &s->piece);
    if (emit_piece(s, text, false)) {
        s->status = SEQ_STATUS_FINISHED_STOP;
        return s->status;
    }
    if (n_generated >= s->max_tokens) {
        flush(s, text);
        s->status = SEQ_STATUS_FINISHED_LENGTH;
    }
    return s->status;
}

enum seq_status seq_finish_stop(struct seq *s, struct buf *text) {
    ASSERT(!seq_is_finished(s));
    flush(s, text);
    s->status = SEQ_STATUS_FINISHED_STOP;
    return s->status;
}

void seq_reset_computed(struct seq *s) {
    s->n_computed = 0;
    s->n_published = 0;
    s->n_cached = 0;
}

struct block_hash seq_block_key(struct seq *s, int32_t i, int32_t block_size) {
    ASSERT(i >= 0 && (i + 1) * block_size <= s->n_tokens && i < s->table.cap);
    while (s->n_hashed <= i) {
        int32_t j = s->n_hashed;
        struct block_hash parent = j ? s->keys[j - 1] : BLOCK_HASH_ROOT;
        s->keys[j] = block_hash_compute(parent, &s->tokens[j * block_size], block_size, s->adapter_id);
        s->n_hashed = j + 1;
    }
    return s->keys[i];
}

void seq_publish_blocks(struct seq *s, struct block_alloc *a) {
    int32_t bs = block_alloc_block_size(a);
    int32_t n_full = s->n_computed / bs;
    for (int32_t i = s->n_published; i < n_full; i++) {
        struct block_hash key = seq_block_key(s, i, bs);
        int32_t id = s->table.ids[i];
        if (id != 0) block_alloc_publish(a, id, key, &s->tokens[i * bs], s->adapter_id);
    }
    if (n_full > s->n_published) s->n_published = n_full;
}

/* ---- queues ---- */

void seq_queue_push_back(struct seq_queue *q, struct seq *s) {
    DASSERT(!s->prev && !s->next);
    s->prev = q->tail;
    s->next = NULL;
    if (q->tail) q->tail->next = s;
    else q->head = s;
    q->tail = s;
    q->n++;
}

void seq_queue_push_front(struct seq_queue *q, struct seq *s) {
    DASSERT(!s->prev && !s->next);
    s->next = q->head;
    s->prev = NULL;
    if (q->head) q->head->prev = s;
    else q->tail = s;
    q->head = s;
    q->n++;
}

void seq_queue_remove(struct seq_queue *q, struct seq *s) {
    if (s->prev) s->prev->next = s->next;
    else q->head = s->next;
    if (s->next) s->next->prev = s->prev;
    else q->tail = s->prev;
    s->prev = NULL;
    s->next = NULL;
    q->n--;
}

struct seq *seq_queue_pop_front(struct seq_queue *q) {
    struct seq *s = q->head;
    if (s) seq_queue_remove(q, s);
    return s;
}
