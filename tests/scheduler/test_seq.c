/*
 * tests/scheduler/test_seq.c - stop conditions and emitted text of a
 * sequence (eos, ignore_eos, min_tokens, stop_token_ids, stop strings with
 * and without include_stop_str, max_tokens), and the intrusive queue.
 * Uses the fake tokenizer: token t >= 2 reads "t<t> ", 1 is eos.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "scheduler/seq.h"
#include "tests/helpers/fake_engine.h"

static struct engine_model *model;

static int setup(void **state) {
    (void)state;
    struct fake_engine_params p = {.n_vocab = 64, .n_ctx = 1024};
    model = fake_engine_model_create(&p);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    engine_model_free(model);
    return 0;
}

static struct seq_params params(int32_t max_tokens) {
    struct seq_params p;
    memset(&p, 0, sizeof(p));
    p.sampling = sampler_default_params();
    p.max_tokens = max_tokens;
    p.n_logprobs = -1;
    p.adapter = NULL;
    return p;
}

static struct seq *make(const struct seq_params *p) {
    int32_t prompt[3] = {5, 6, 7};
    struct seq *s = NULL;
    assert_int_equal(seq_create(9, engine_model_tokenizer(model), 64, prompt, 3, p, 4, &s), 0);
    assert_int_equal(s->status, SEQ_STATUS_WAITING);
    assert_int_equal(s->n_tokens, 3);
    assert_int_equal(s->n_tokens_max, 3 + p->max_tokens);
    return s;
}

/* Feeds tokens until the sequence finishes or they run out; returns the status. */
static enum seq_status feed(struct seq *s, const int32_t *toks, int n, struct buf *text) {
    s->status = SEQ_STATUS_RUNNING;
    for (int i = 0; i < n; i++) {
        enum seq_status st = seq_append(s, toks[i], text);
        if (st != SEQ_STATUS_RUNNING) return st;
    }
    return s->status;
}

static void test_seq_eos_stops_without_text(void **state) {
    (void)state;
    struct seq_params p = params(10);
    struct seq *s = make(&p);
    struct buf text = {0};
    int32_t toks[] = {2, 3, FAKE_ENGINE_EOS, 4};
    assert_int_equal(feed(s, toks, 4, &text), SEQ_STATUS_FINISHED_STOP);
    assert_string_equal(text.data, "t2 t3 ");
    assert_int_equal(seq_n_generated(s), 3);
    assert_true(seq_is_finished(s));
    buf_free(&text);
    seq_destroy(s);
}

static void test_seq_ignore_eos_and_max_tokens(void **state) {
    (void)state;
    struct seq_params p = params(3);
    p.ignore_eos = true;
    struct seq *s = make(&p);
    struct buf text = {0};
    int32_t toks[] = {FAKE_ENGINE_EOS, 2, 3, 4};
    assert_int_equal(feed(s, toks, 4, &text), SEQ_STATUS_FINISHED_LENGTH);
    assert_int_equal(seq_n_generated(s), 3);
    assert_string_equal(text.data, "t2 t3 ");
    buf_free(&text);
    seq_destroy(s);
}

static void test_seq_min_tokens_delays_eos_and_stop_ids(void **state) {
    (void)state;
    struct seq_params p = params(10);
    p.min_tokens = 2;
    int32_t stop_ids[] = {9};
    p.stop_token_ids = stop_ids;
    p.n_stop_token_ids = 1;
    struct seq *s = make(&p);
    struct buf text = {0};
    int32_t toks[] = {FAKE_ENGINE_EOS, 9, 2, 9};
    // eos as 1st and 9 as 2nd token are ordinary; 9 as 4th stops.
    assert_int_equal(feed(s, toks, 4, &text), SEQ_STATUS_FINISHED_STOP);
    assert_int_equal(seq_n_generated(s), 4);
    assert_string_equal(text.data, "t9 t2 ");
    buf_free(&text);
    seq_destroy(s);
}

static void test_seq_stop_string_across_tokens(void **state) {
    (void)state;
    struct seq_params p = params(10);
    const char *stops[] = {"3 t4"};
    p.stop = stops;
    p.n_stop = 1;
    struct seq *s = make(&p);
    struct buf text = {0};
    int32_t toks[] = {2, 3, 4, 5};
    assert_int_equal(feed(s, toks, 4, &text), SEQ_STATUS_FINISHED_STOP);
    assert_int_equal(seq_n_generated(s), 3);
    assert_string_equal(text.data, "t2 t");
    buf_free(&text);
    seq_destroy(s);

    p.include_stop_str = true;
    s = make(&p);
    struct buf text2 = {0};
    assert_int_equal(feed(s, toks, 4, &text2), SEQ_STATUS_FINISHED_STOP);
    assert_string_equal(text2.data, "t2 t3 t4");
    buf_free(&text2);
    seq_destroy(s);
}

static void test_seq_held_back_text_is_flushed_at_length(void **state) {
    (void)state;
    struct seq_params p = params(2);
    const char *stops[] = {"t3 t9"};
    p.stop = stops;
    p.n_stop = 1;
    struct seq *s = make(&p);
    struct buf text = {0};
    int32_t toks[] = {2, 3};
    assert_int_equal(feed(s, toks, 2, &text), SEQ_STATUS_FINISHED_LENGTH);
    assert_string_equal(text.data, "t2 t3 ");  // "t3 " was held back, then flushed
    buf_free(&text);
    seq_destroy(s);
}

static void test_seq_bad_stop_strings_are_rejected(void **state) {
    (void)state;
    struct seq_params p = params(2);
    const char *stops[] = {""};
    p.stop = stops;
    p.n_stop = 1;
    int32_t prompt[1] = {5};
    struct seq *s = (struct seq *)&s;
    assert_int_equal(seq_create(1, engine_model_tokenizer(model), 64, prompt, 1, &p, 4, &s),
                     ERR_INVAL);
    assert_null(s);
}

/* The chat template's bytes before a reply are dropped from the text's start
 * when the reply begins with them, and only then (hand-derived from the fake
 * pieces "t2 " "t3 " "t4 "). */
static void test_seq_reply_prefix(void **state) {
    (void)state;
    struct {
        const char *prefix;
        const char *stop;
        int32_t max_tokens;
        const char *want;
    } cases[] = {
        {"t2", NULL, 2, " t3 "},          // within the first token
        {"t2 t", NULL, 3, "3 t4 "},       // across two tokens
        {"t5", NULL, 2, "t2 t3 "},        // "t" matched, then not: all of it is text
        {"t2 t3 t4 t5", NULL, 2, "t2 t3 "},  // a finish before it is whole releases it
        {"t2", "t3", 3, " "},             // stop strings see the text without it
        {"", NULL, 2, "t2 t3 "},          // empty: nothing dropped
    };
    int32_t toks[] = {2, 3, 4};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct seq_params p = params(cases[k].max_tokens);
        p.reply_prefix = cases[k].prefix;
        const char *stops[1] = {cases[k].stop};
        if (cases[k].stop) {
            p.stop = stops;
            p.n_stop = 1;
        }
        struct seq *s = make(&p);
        struct buf text = {0};
        feed(s, toks, cases[k].max_tokens, &text);
        assert_true(seq_is_finished(s));
        assert_string_equal(text.data ? text.data : "", cases[k].want);
        buf_free(&text);
        seq_destroy(s);
    }
    // Longer than SEQ_MAX_REPLY_PREFIX: a client error, not a cut.
    struct seq_params p = params(2);
    p.reply_prefix = "0123456789abcdef";
    int32_t prompt[1] = {5};
    struct seq *s = NULL;
    assert_int_equal(seq_create(1, engine_model_tokenizer(model), 64, prompt, 1, &p, 4, &s),
                     ERR_INVAL);
    assert_null(s);
}

static void test_seq_queue_fifo_and_remove(void **state) {
    (void)state;
    struct seq_params p = params(2);
    struct seq *a = make(&p), *b = make(&p), *c = make(&p);
    struct seq_queue q = {0};
    seq_queue_push_back(&q, a);
    seq_queue_push_back(&q, b);
    seq_queue_push_front(&q, c);  // c a b
    assert_int_equal(q.n, 3);
    seq_queue_remove(&q, a);      // c b
    assert_ptr_equal(q.head, c);
    assert_ptr_equal(q.tail, b);
    assert_ptr_equal(seq_queue_pop_front(&q), c);
    assert_ptr_equal(seq_queue_pop_front(&q), b);
    assert_null(seq_queue_pop_front(&q));
    assert_int_equal(q.n, 0);
    seq_destroy(a);
    seq_destroy(b);
    seq_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seq_eos_stops_without_text),
        cmocka_unit_test(test_seq_reply_prefix),
        cmocka_unit_test(test_seq_ignore_eos_and_max_tokens),
        cmocka_unit_test(test_seq_min_tokens_delays_eos_and_stop_ids),
        cmocka_unit_test(test_seq_stop_string_across_tokens),
        cmocka_unit_test(test_seq_held_back_text_is_flushed_at_length),
        cmocka_unit_test(test_seq_bad_stop_strings_are_rejected),
        cmocka_unit_test(test_seq_queue_fifo_and_remove),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
