/*
 * tests/scheduler/test_plan.c - the pure step policy: token budget, decode
 * first, chunked prefill, admission by blocks and max_seqs, prefix hits,
 * preemption of the newest, rejection of what can never fit.
 * The "engine" here is the test itself: after each plan it advances
 * n_computed and appends a token where the plan reached the end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "engine/base/buf.h"
#include "scheduler/block_alloc.h"
#include "scheduler/plan.h"
#include "scheduler/seq.h"
#include "tests/helpers/fake_engine.h"

enum { BS = 4 };

struct fixture {
    struct engine_model *model;
    struct block_alloc *a;
    struct seq_queue running, waiting, rejected;
    struct step_plan plan;
    struct plan_budget b;
    uint64_t next_id;
};

static struct fixture fx;

static void fx_init(int32_t n_blocks, int32_t budget, int32_t max_seqs, bool prefix) {
    memset(&fx, 0, sizeof(fx));
    struct fake_engine_params p = {.n_vocab = 64, .n_ctx = 4096};
    fx.model = fake_engine_model_create(&p);
    assert_int_equal(block_alloc_create(n_blocks, BS, &fx.a), 0);
    step_plan_init(&fx.plan, 16);
    fx.b.max_batch_tokens = budget;
    fx.b.max_seqs = max_seqs;
    fx.b.enable_prefix_cache = prefix;
}

static void free_queue(struct seq_queue *q) {
    struct seq *s;
    while ((s = seq_queue_pop_front(q))) {
        block_table_release(&s->table, fx.a);
        seq_destroy(s);
    }
}

static void fx_deinit(void) {
    free_queue(&fx.running);
    free_queue(&fx.waiting);
    free_queue(&fx.rejected);
    assert_true(block_alloc_check(fx.a));
    assert_int_equal(block_alloc_n_used(fx.a), 0);
    step_plan_deinit(&fx.plan);
    block_alloc_destroy(fx.a);
    engine_model_free(fx.model);
}

/* A waiting sequence with prompt tokens base, base+1, ... (mod 60, + 2). */
static struct seq *add(int32_t n_prompt, int32_t max_tokens, int32_t base) {
    int32_t prompt[256];
    for (int32_t i = 0; i < n_prompt; i++) prompt[i] = 2 + (base + i) % 60;
    struct seq_params p;
    memset(&p, 0, sizeof(p));
    p.sampling = sampler_default_params();
    p.max_tokens = max_tokens;
    p.n_logprobs = -1;
    p.adapter = NULL;
    p.ignore_eos = true;
    struct seq *s;
    assert_int_equal(seq_create(++fx.next_id, engine_model_tokenizer(fx.model), 64, prompt,
                                n_prompt, &p, BS, &s), 0);
    seq_queue_push_back(&fx.waiting, s);
    return s;
}

/* The sequences one token behind before the step: the decoders. */
static struct seq *decoders[64];
static int n_decoders;

static bool is_decoder(const struct seq *s) {
    for (int i = 0; i < n_decoders; i++)
        if (decoders[i] == s) return true;
    return false;
}

/* plan.c's rule: beside d > 0 decoders, prompt work gets at most
 * a = max(prefill_chunk, d) tokens, a quarter more to finish a prompt. */
static void check_allowance(void) {
    if (fx.b.prefill_chunk <= 0 || n_decoders == 0) return;
    int32_t a = fx.b.prefill_chunk > n_decoders ? fx.b.prefill_chunk : n_decoders, prefill = 0;
    for (int32_t i = 0; i < fx.plan.n_seqs; i++)
        if (!is_decoder(fx.plan.seqs[i])) prefill += fx.plan.n_new[i];
    assert_true(prefill <= a + a / 4);
}

static void plan(void) {
    n_decoders = 0;
    for (struct seq *s = fx.running.head; s && n_decoders < 64; s = s->next) {
        if (s->n_tokens - s->n_computed == 1) decoders[n_decoders++] = s;
    }
    plan_step(&fx.running, &fx.waiting, &fx.rejected, fx.a, NULL, &fx.b, &fx.plan);
    check_allowance();
    assert_true(block_alloc_check(fx.a));
    assert_true(fx.plan.n_tokens <= fx.b.max_batch_tokens);
    assert_true(fx.running.n <= fx.b.max_seqs);
    for (int32_t i = 0; i < fx.plan.n_seqs; i++) {
        struct seq *s = fx.plan.seqs[i];
        // Blocks cover what is computed, with no more than one partial block of waste.
        assert_int_equal(s->table.n_blocks,
                         block_table_blocks_for(s->n_computed + fx.plan.n_new[i], BS));
    }
}

/* What the engine and sampler would do: advance, append a token at the end. */
static void execute(void) {
    for (int32_t i = 0; i < fx.plan.n_seqs; i++) {
        struct seq *s = fx.plan.seqs[i];
        s->n_computed += fx.plan.n_new[i];
        seq_publish_blocks(s, fx.a);
        if (s->n_computed == s->n_tokens && s->n_tokens < s->n_tokens_max) {
            struct buf t = {0};
            seq_append(s, 2 + s->n_tokens % 60, &t);
            buf_free(&t);
        }
    }
}

static int32_t n_new_of(const struct seq *s) {
    for (int32_t i = 0; i < fx.plan.n_seqs; i++)
        if (fx.plan.seqs[i] == s) return fx.plan.n_new[i];
    return 0;
}

static void test_plan_decode_first_then_chunked_prefill(void **state) {
    (void)state;
    fx_init(64, 10, 8, false);
    struct seq *a = add(3, 10, 0);
    plan();
    assert_int_equal(n_new_of(a), 3);  // whole prompt fits
    execute();
    struct seq *b = add(30, 10, 100);
    plan();
    assert_int_equal(fx.plan.seqs[0], a);  // the decode comes first
    assert_int_equal(n_new_of(a), 1);
    assert_int_equal(n_new_of(b), 9);  // the rest of the budget: a chunk
    assert_int_equal(fx.plan.n_tokens, 10);
    execute();
    plan();
    assert_int_equal(n_new_of(a), 1);
    assert_int_equal(n_new_of(b), 9);
    execute();
    assert_int_equal(b->n_computed, 18);
    fx_deinit();
}

static void test_plan_budget_limits_decodes_too(void **state) {
    (void)state;
    fx_init(64, 2, 8, false);
    struct seq *s[3];
    for (int i = 0; i < 3; i++) s[i] = add(1, 5, i);
    plan();
    assert_int_equal(fx.plan.n_seqs, 2);
    assert_int_equal(fx.waiting.n, 1);
    execute();
    plan();  // two decodes use the budget; the third waits
    assert_int_equal(fx.plan.n_tokens, 2);
    assert_int_equal(n_new_of(s[2]), 0);
    fx_deinit();
}

static void test_plan_admission_respects_max_seqs(void **state) {
    (void)state;
    fx_init(64, 100, 2, false);
    for (int i = 0; i < 4; i++) add(3, 5, i);
    plan();
    assert_int_equal(fx.plan.n_admitted, 2);
    assert_int_equal(fx.running.n, 2);
    assert_int_equal(fx.waiting.n, 2);
    fx_deinit();
}

static void test_plan_admission_waits_for_blocks(void **state) {
    (void)state;
    fx_init(5, 100, 8, false);  // 4 blocks of 4
    struct seq *a = add(8, 4, 50);   // 2 blocks
    struct seq *b = add(12, 4, 0);   // 3 blocks: must wait
    struct seq *c = add(16, 4, 20);  // 4 blocks: waits behind b
    plan();
    assert_int_equal(a->status, SEQ_STATUS_RUNNING);
    assert_int_equal(b->status, SEQ_STATUS_WAITING);
    assert_int_equal(b->table.n_blocks, 0);
    assert_int_equal(c->status, SEQ_STATUS_WAITING);
    fx_deinit();
}

/* The prefill allowance (plan.c's NOTE), schedules derived by hand. */

/* Eight 10-token prompts arrive together; the allowance is 20 tokens: two
 * prompts finish per step, so their first tokens come in steps 1,1,2,2,3,3,
 * 4,4, where without the allowance all eight finish in step 1. */
static void test_plan_prefill_chunk_staggers_prompts(void **state) {
    (void)state;
    for (int chunk = 0; chunk <= 20; chunk += 20) {
        fx_init(64, 100, 8, false);
        fx.b.prefill_chunk = chunk;
        struct seq *s[8];
        for (int i = 0; i < 8; i++) s[i] = add(10, 10, 7 * i);
        int first_step[8] = {0};
        for (int step = 1; step <= 4; step++) {
            plan();
            int n_decodes = 0;
            for (int i = 0; i < 8; i++) n_decodes += n_new_of(s[i]) == 1;
            // decodes + at most max(chunk, n_decodes) prefill tokens
            if (chunk) assert_true(fx.plan.n_tokens <= n_decodes + 20);
            execute();
            for (int i = 0; i < 8; i++)
                if (!first_step[i] && s[i]->n_computed >= 10) first_step[i] = step;
        }
        for (int i = 0; i < 8; i++) assert_int_equal(first_step[i], chunk ? i / 2 + 1 : 1);
        fx_deinit();
    }
}

/* Shortest first: a 40-token prompt and an 8-token one, the long one first
 * in the queue, allowance 16. Step 1 (no decodes): the short one's 8, then 8
 * of the long one. Then one decode and 16 prompt tokens a step: 16, 16. */
static void test_plan_prefill_shortest_first(void **state) {
    (void)state;
    fx_init(64, 100, 8, false);
    fx.b.prefill_chunk = 16;
    struct seq *lng = add(40, 4, 0);
    struct seq *shrt = add(8, 4, 30);
    plan();
    assert_int_equal(n_new_of(shrt), 8);
    assert_int_equal(n_new_of(lng), 8);
    assert_ptr_equal(fx.plan.seqs[0], shrt);
    execute();
    plan();
    assert_int_equal(n_new_of(shrt), 1);
    assert_int_equal(n_new_of(lng), 16);
    execute();
    plan();
    assert_int_equal(n_new_of(lng), 16);
    execute();
    assert_int_equal(lng->n_computed, 40);
    fx_deinit();
}

/* A lone prompt takes the whole budget: no decodes wait for it. */
static void test_plan_prefill_lone_prompt_not_chunked(void **state) {
    (void)state;
    fx_init(64, 100, 8, false);
    fx.b.prefill_chunk = 16;
    struct seq *a = add(60, 4, 0);
    plan();
    assert_int_equal(n_new_of(a), 60);
    fx_deinit();
}

/* Beside d decodes a prompt gets max(chunk, d) tokens a step; a need of at
 * most a quarter over what is left of the allowance is taken whole. */
static void test_plan_prefill_beside_decodes(void **state) {
    (void)state;
    fx_init(64, 100, 8, false);
    struct seq *d[3];
    for (int i = 0; i < 3; i++) d[i] = add(1, 20, i);
    plan();  // no allowance yet: all three admitted
    execute();  // three decoders
    fx.b.prefill_chunk = 2;
    struct seq *p = add(12, 4, 40);
    plan();
    assert_int_equal(n_new_of(p), 3);  // max(2, 3 decodes)
    execute();
    fx.b.prefill_chunk = 8;
    plan();
    assert_int_equal(n_new_of(p), 9);  // max(8, 3) = 8, and 9 <= 8 + 8 / 4: whole
    execute();
    struct seq *q = add(11, 4, 50);    // beside 4 decodes: 11 > 8 + 2, a chunk of 8
    plan();
    assert_int_equal(n_new_of(q), 8);
    assert_int_equal(n_new_of(p), 1);
    for (int i = 0; i < 3; i++) assert_int_equal(n_new_of(d[i]), 1);
    assert_int_equal(fx.plan.n_tokens, 12);
    fx_deinit();
}

/* n one-token sequences, planned and executed once: n decoders. */
static void start_decoders(int n) {
    for (int i = 0; i < n; i++) add(1, 20, i);
    plan();
    execute();
}

/* Under step_ratio r beside d decodes, with n sequences present and a fixed
 * cost of f tokens, a prompt gets p = r (n + f) - f - d tokens, at least
 * PLAN_MIN_PREFILL and at most prefill_chunk (values by hand). */
static void test_plan_step_ratio_allowance(void **state) {
    (void)state;
    struct {
        int32_t ratio, fixed, chunk, want;
    } cases[] = {
        {300, 0, 256, 27},   // 300% of 13 = 39, minus 12 decodes
        {300, 10, 256, 47},  // 300% of 23 = 69, minus 10 and 12
        {150, 0, 256, 16},   // 150% of 13 = 19 (19.5), minus 12 = 7: the floor
        {150, 40, 256, 27},  // 150% of 53 = 79 (79.5), minus 40 and 12
        {300, 10, 30, 30},   // the cap
        {300, 10, 12, 12},   // a cap under the floor wins
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        fx_init(128, 200, 16, false);
        start_decoders(12);
        fx.b.prefill_chunk = cases[k].chunk;
        fx.b.step_ratio = cases[k].ratio;
        fx.b.fixed_tokens = cases[k].fixed;
        struct seq *p = add(200, 4, 40);
        plan();
        assert_int_equal(n_new_of(p), cases[k].want);
        assert_int_equal(fx.plan.n_tokens, 12 + cases[k].want);  // and the twelve decodes
        fx_deinit();
    }
}

/* The sequences present are counted up to max_seqs: a queue of 40 waiting
 * 150-token prompts (longer than the chunk of 100: none counts as finishable)
 * beside 4 decodes, max_seqs 8, ratio 300: 300% of 8 - 4 = 20 tokens of prompt
 * work (counting all 44 would give 132 - 4, capped at 100). */
static void test_plan_step_ratio_counts_at_most_max_seqs(void **state) {
    (void)state;
    fx_init(256, 400, 8, false);
    start_decoders(4);
    fx.b.prefill_chunk = 100;
    fx.b.step_ratio = 300;
    for (int i = 0; i < 40; i++) add(150, 4, 10 + i);
    plan();
    assert_int_equal(fx.plan.n_tokens, 4 + 20);
    assert_int_equal(fx.running.n, 5);
    fx_deinit();
}

/* While more candidates need at most prefill_chunk than there are decodes,
 * prompt work gets prefill_chunk: 2 decodes, 10 waiting 10-token prompts
 * (n = 12), chunk 40, ratio 150: 40 tokens, four prompts (the ratio alone
 * would give 18 - 2 = 16). Then 6 decodes and 6 such prompts: the ratio. */
static void test_plan_step_ratio_most_waiting_get_the_chunk(void **state) {
    (void)state;
    fx_init(256, 400, 16, false);
    start_decoders(2);
    fx.b.prefill_chunk = 40;
    fx.b.step_ratio = 150;
    for (int i = 0; i < 10; i++) add(10, 4, 10 + i);
    plan();
    assert_int_equal(fx.plan.n_tokens, 2 + 40);
    execute();  // now 6 decode, 6 wait: the ratio, 18 - 6 = 12, raised to PLAN_MIN_PREFILL 16
    plan();
    assert_int_equal(fx.plan.n_tokens, 6 + 10 + 6);  // 10 of one prompt, 6 of the next
    fx_deinit();
}

/* A candidate passed over PLAN_MAX_PASSED_OVER steps goes first. */
static void test_plan_prefill_passed_over_goes_first(void **state) {
    (void)state;
    fx_init(64, 100, 8, false);
    fx.b.prefill_chunk = 4;
    struct seq *d = add(1, 40, 0);
    plan();
    execute();  // one decoder
    struct seq *lng = add(20, 4, 10);
    struct seq *shrt = add(4, 4, 30);
    plan();  // the short one's 4 tokens are the allowance: the long one is passed over
    assert_int_equal(n_new_of(shrt), 4);
    assert_int_equal(n_new_of(lng), 0);
    assert_int_equal(lng->n_passed_over, 1);
    execute();
    lng->n_passed_over = PLAN_MAX_PASSED_OVER;
    struct seq *shrt2 = add(4, 4, 50);
    plan();
    assert_int_equal(n_new_of(lng), 4);
    assert_int_equal(n_new_of(shrt2), 0);
    assert_int_equal(lng->n_passed_over, 0);
    assert_int_equal(n_new_of(d), 1);
    fx_deinit();
}

/* Two prompts part-way and the newest sequence decoding, no block free: the
 * first prompt's next chunk preempts the decoder. The decoder's token goes
 * back to the step's budget, not to the prompts' allowance (check_allowance:
 * the second prompt gets nothing more than max(chunk, decoders) allows). */
static void test_plan_preempted_decoder_gives_no_allowance(void **state) {
    (void)state;
    fx_init(7, 100, 8, false);  // 6 blocks of 4
    fx.b.prefill_chunk = 3;
    struct seq *d = add(2, 40, 0);
    plan();
    execute();  // d decodes
    struct seq *x = add(16, 4, 10);
    struct seq *y = add(16, 4, 30);
    plan();
    execute();  // x has 3 of its 16
    y->n_passed_over = PLAN_MAX_PASSED_OVER;
    plan();
    execute();  // y has 3 (one slot of its block free)
    struct seq *v = add(1, 40, 50);
    plan();  // beside d: v's 1, x's 2 (allowance 3)
    assert_int_equal(n_new_of(v), 1);
    assert_int_equal(n_new_of(x), 2);
    execute();
    plan();  // beside d and v: x's 3
    assert_int_equal(n_new_of(x), 3);
    assert_int_equal(n_new_of(y), 0);
    execute();
    assert_int_equal(x->n_computed, 8);
    assert_int_equal(block_alloc_n_free(fx.a), 0);
    // x's next 3 need a 3rd block: v, the newest, is preempted. Its token
    // returns to the budget; the allowance max(3, 2 decoders) = 3 is x's,
    // so y (with room in its block) gets none of it.
    plan();
    assert_int_equal(fx.plan.n_preempted, 1);
    assert_int_equal(v->status, SEQ_STATUS_PREEMPTED);
    assert_int_equal(n_new_of(d), 1);
    assert_int_equal(n_new_of(x), 3);
    assert_int_equal(n_new_of(y), 0);
    execute();
    fx_deinit();
}

static void test_plan_preempts_newest_and_skips_admission(void **state) {
    (void)state;
    fx_init(5, 100, 8, false);  // 4 blocks of 4
    struct seq *a = add(8, 8, 0);   // 2 blocks
    struct seq *b = add(8, 8, 50);  // 2 blocks
    plan();
    execute();  // both computed 8, appended a 9th token: each needs a 3rd block
    struct seq *c = add(1, 1, 90);
    plan();
    assert_int_equal(fx.plan.n_preempted, 1);
    assert_int_equal(b->status, SEQ_STATUS_PREEMPTED);  // the newest
    assert_ptr_equal(fx.waiting.head, b);               // at the head of the queue
    assert_int_equal(b->n_computed, 0);
    assert_int_equal(b->table.n_blocks, 0);
    assert_int_equal(seq_n_generated(b), 1);            // tokens kept
    assert_int_equal(n_new_of(a), 1);
    assert_int_equal(c->status, SEQ_STATUS_WAITING);    // no admission this step
    assert_int_equal(fx.plan.n_admitted, 0);
    fx_deinit();
}

static void test_plan_preempts_itself_when_alone_is_newest(void **state) {
    (void)state;
    fx_init(3, 100, 8, false);  // 2 blocks of 4
    struct seq *a = add(4, 8, 0);
    struct seq *b = add(4, 8, 50);
    plan();
    execute();  // both need a 2nd block; a is oldest: b goes
    plan();
    assert_int_equal(b->status, SEQ_STATUS_PREEMPTED);
    assert_int_equal(n_new_of(a), 1);
    fx_deinit();
}

static void test_plan_rejects_what_never_fits(void **state) {
    (void)state;
    fx_init(3, 100, 8, false);  // 2 blocks of 4 = 8 tokens
    struct seq *a = add(12, 1, 0);
    struct seq *b = add(3, 1, 0);
    plan();
    assert_int_equal(fx.plan.n_rejected, 1);
    assert_ptr_equal(fx.rejected.head, a);
    assert_int_equal(a->status, SEQ_STATUS_FINISHED_ERROR);
    assert_int_equal(b->status, SEQ_STATUS_RUNNING);
    fx_deinit();
}

static void test_plan_prefix_hits_skip_cached_blocks(void **state) {
    (void)state;
    fx_init(32, 100, 8, true);
    struct seq *a = add(18, 5, 0);  // 4 full blocks + 2
    plan();
    execute();  // publishes blocks 0..3
    assert_int_equal(block_alloc_n_used(fx.a), 5);
    struct seq *b = add(18, 1, 0);  // same prompt
    plan();
    assert_int_equal(fx.plan.n_prefix_hit_tokens, 16);
    assert_int_equal(b->n_computed, 16);
    assert_int_equal(n_new_of(b), 2);
    for (int i = 0; i < 4; i++) assert_int_equal(b->table.ids[i], a->table.ids[i]);
    assert_int_equal(block_alloc_n_refs(fx.a, a->table.ids[0]), 2);
    // The block holding the last prompt token is never a hit: 16 tokens of 16.
    struct seq *c = add(16, 1, 0);
    plan();
    assert_int_equal(c->n_computed, 12);
    assert_int_equal(n_new_of(c), 4);
    fx_deinit();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_decode_first_then_chunked_prefill),
        cmocka_unit_test(test_plan_budget_limits_decodes_too),
        cmocka_unit_test(test_plan_admission_respects_max_seqs),
        cmocka_unit_test(test_plan_admission_waits_for_blocks),
        cmocka_unit_test(test_plan_prefill_chunk_staggers_prompts),
        cmocka_unit_test(test_plan_prefill_shortest_first),
        cmocka_unit_test(test_plan_prefill_lone_prompt_not_chunked),
        cmocka_unit_test(test_plan_prefill_beside_decodes),
        cmocka_unit_test(test_plan_prefill_passed_over_goes_first),
        cmocka_unit_test(test_plan_step_ratio_allowance),
        cmocka_unit_test(test_plan_step_ratio_counts_at_most_max_seqs),
        cmocka_unit_test(test_plan_step_ratio_most_waiting_get_the_chunk),
        cmocka_unit_test(test_plan_preempted_decoder_gives_no_allowance),
        cmocka_unit_test(test_plan_preempts_newest_and_skips_admission),
        cmocka_unit_test(test_plan_preempts_itself_when_alone_is_newest),
        cmocka_unit_test(test_plan_rejects_what_never_fits),
        cmocka_unit_test(test_plan_prefix_hits_skip_cached_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
