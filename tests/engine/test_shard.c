/*
 * test_shard.c - the slices of engine/model/shard.c, in one process (no MPI:
 * engine_model_load() takes any tp_rank of tp_size). Oracle: the geometry
 * derived by hand from the synthetic llama-q8_0 model (tests/models: n_embd
 * 64, 4 heads and 2 kv heads of 16, n_ff 96, Q8_0 blocks of 32 values in 34
 * bytes) and the file's own tensors, which the slices must view.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "engine/base/err.h"
#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/model/model.h"
#include "tests/helpers/testutil.h"

static struct engine_model *load(const char *name, int32_t rank, int32_t size, int *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/models/%s.gguf", testutil_build_dir(), name);
    struct engine_model_params mp = engine_model_default_params();
    mp.path = path;
    mp.tp_rank = rank;
    mp.tp_size = size;
    struct engine_model *m = NULL;
    *err = engine_model_load(&mp, &m);
    return m;
}

/* Bytes from the file's tensor (in m's own mapping) to the slice's first byte. */
static ptrdiff_t offset(const struct engine_model *m, const struct tensor *part) {
    const struct gguf_tensor_info *ti = gguf_tensor_at(m->gguf, part - m->tensors);
    return (const uint8_t *)part->data - (const uint8_t *)ti->data;
}

/* Rank 1 of 2: query heads 2..3 (rows 32..63 of attn_q), kv head 1 (rows
 * 16..31 of attn_k/v), FFN blocks 1..2 of 3 (columns 32..95: 1 + 2 blocks
 * for ranks 0 and 1), attn_output and ffn_down cut to the same columns as
 * strided views with the file's row stride. */
static void test_shard_rank1_of_2_views_its_rows_and_columns(void **state) {
    (void)state;
    int err;
    struct engine_model *whole = load("llama-q8_0", 0, 1, &err);
    assert_int_equal(err, 0);
    struct engine_model *m = load("llama-q8_0", 1, 2, &err);
    assert_int_equal(err, 0);
    const struct shard *sh = &m->shard;
    assert_int_equal(sh->n_head, 2);
    assert_int_equal(sh->head0, 2);
    assert_int_equal(sh->n_head_kv, 1);
    assert_int_equal(sh->head_kv0, 1);
    assert_int_equal(sh->ff0, 32);
    assert_int_equal(sh->n_ff, 64);
    const size_t row64 = 2 * 34;  // a Q8_0 row of 64 values
    const size_t row96 = 3 * 34;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        const struct layer *L = &m->layers[il];
        assert_int_equal(L->wq->ne[1], 32);
        assert_int_equal(offset(m, L->wq), 32 * row64);
        assert_int_equal(L->wk->ne[1], 16);
        assert_int_equal(offset(m, L->wk), 16 * row64);
        assert_int_equal(offset(m, L->wv), 16 * row64);
        assert_int_equal(L->ffn_gate->ne[1], 64);
        assert_int_equal(offset(m, L->ffn_gate), 32 * row64);
        assert_int_equal(offset(m, L->ffn_up), 32 * row64);
        assert_int_equal(L->wo->ne[0], 32);  // columns 32..63
        assert_int_equal(L->wo->ne[1], 64);
        assert_int_equal(L->wo->row_bytes, row64);
        assert_int_equal(offset(m, L->wo), 34);
        assert_int_equal(L->ffn_down->ne[0], 64);  // columns 32..95
        assert_int_equal(L->ffn_down->row_bytes, row96);
        assert_int_equal(offset(m, L->ffn_down), 34);
    }
    // The KV block holds this rank's one kv head of the two.
    assert_int_equal(engine_kv_block_bytes(m, 16, ENGINE_KV_TYPE_F32) * 2,
                     engine_kv_block_bytes(whole, 16, ENGINE_KV_TYPE_F32));
    engine_model_free(m);
    engine_model_free(whole);
}

/* Rank 0 of 2 gets the other block of FFN columns, and the qwen2 biases
 * of its heads. */
static void test_shard_rank0_of_2_and_biases(void **state) {
    (void)state;
    int err;
    struct engine_model *m = load("llama-q8_0", 0, 2, &err);
    assert_int_equal(err, 0);
    assert_int_equal(m->shard.ff0, 0);
    assert_int_equal(m->shard.n_ff, 32);
    engine_model_free(m);
    struct engine_model *whole = load("qwen2-f32", 0, 1, &err);
    assert_int_equal(err, 0);
    struct engine_model *q = load("qwen2-f32", 1, 2, &err);
    assert_int_equal(err, 0);
    // head_dim 16: rank 1 has q rows 32..63 and kv rows 16..31
    for (int32_t il = 0; il < q->hp.n_layer; il++) {
        const struct layer *L = &q->layers[il];
        const struct layer *W = &whole->layers[il];
        for (int i = 0; i < 32; i++) assert_true(L->bq[i] == W->bq[32 + i]);
        for (int i = 0; i < 16; i++) assert_true(L->bk[i] == W->bk[16 + i]);
        for (int i = 0; i < 16; i++) assert_true(L->bv[i] == W->bv[16 + i]);
    }
    engine_model_free(q);
    engine_model_free(whole);
}

/* What cannot be split is refused with ERR_UNSUPPORTED: more ranks than kv
 * heads, and a K-quant's 256-wide blocks cut at 128 columns. A rank out of
 * range is ERR_INVAL. */
static void test_shard_refuses_impossible_splits(void **state) {
    (void)state;
    int err;
    assert_null(load("llama-q8_0", 0, 4, &err));
    assert_int_equal(err, ERR_UNSUPPORTED);
    assert_null(load("llama-q8_0", 3, 3, &err));
    assert_int_equal(err, ERR_INVAL);
    assert_null(load("llama256-q4_k_m", 0, 2, &err));
    assert_int_equal(err, ERR_UNSUPPORTED);
}

static struct engine_model *load_stage(const char *name, int32_t stage, int32_t n_stages,
                                       int *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/models/%s.gguf", testutil_build_dir(), name);
    struct engine_model_params mp = engine_model_default_params();
    mp.path = path;
    mp.pp_rank = stage;
    mp.pp_size = n_stages;
    struct engine_model *m = NULL;
    *err = engine_model_load(&mp, &m);
    return m;
}

/* Pipeline stages of the 2-layer llama-q8_0: stage s of 2 holds layer s, packs
 * only that layer's matrices (the other's have no panels), and its KV block is
 * half the whole model's (one layer of two). Only the last stage packs the
 * classifier; stage 0 holds the embedding, the last the classifier, each all
 * 300 rows at TP 1. One stage per layer at most: 3 stages are refused. */
static void test_shard_pipeline_stages_hold_their_layers(void **state) {
    (void)state;
    int err;
    struct engine_model *whole = load("llama-q8_0", 0, 1, &err);
    assert_int_equal(err, 0);
    assert_int_equal(whole->hp.n_layer, 2);
    for (int32_t stage = 0; stage < 2; stage++) {
        struct engine_model *m = load_stage("llama-q8_0", stage, 2, &err);
        assert_int_equal(err, 0);
        assert_int_equal(m->shard.layer0, stage);
        assert_int_equal(m->shard.n_layer, 1);
        assert_int_equal(shard_job_rank(&m->shard), stage);
        assert_int_equal(shard_job_size(&m->shard), 2);
        for (int32_t il = 0; il < 2; il++) {
            const struct layer *L = &m->layers[il];
            const bool mine = il == stage;
            assert_true((L->wq->panels != NULL) == mine);
            assert_true((L->ffn_down->panels != NULL) == mine);
            assert_int_equal(L->wq->ne[1], whole->layers[il].wq->ne[1]);  // not cut: TP 1
        }
        assert_true((m->output->panels != NULL) == (stage == 1));
        assert_true(shard_has_embedding(&m->shard) == (stage == 0));
        assert_true(shard_has_classifier(&m->shard) == (stage == 1));
        assert_int_equal(m->shard.n_vocab, 300);
        assert_int_equal(engine_kv_block_bytes(m, 16, ENGINE_KV_TYPE_F32) * 2,
                         engine_kv_block_bytes(whole, 16, ENGINE_KV_TYPE_F32));
        engine_model_free(m);
    }
    engine_model_free(whole);
    assert_null(load_stage("llama-q8_0", 0, 3, &err));
    assert_int_equal(err, ERR_UNSUPPORTED);
    assert_null(load_stage("llama-q8_0", 2, 2, &err));
    assert_int_equal(err, ERR_INVAL);
}

/* The classifier split by vocabulary (llama-q8_0: untied, 300 rows of 64
 * Q8_0 values, 68 bytes each): rank 1 of 2 views rows 150..299 of
 * output.weight and of token_embd; of 301 rows over 4 ranks (the tied test
 * model), ranks hold 75, 75, 75 and 76 rows from 0, 75, 150 and 225, one
 * tensor for both, and the gather's stride is 76. */
static void test_shard_vocabulary_rows(void **state) {
    (void)state;
    int err;
    struct engine_model *m = load("llama-q8_0", 1, 2, &err);
    assert_int_equal(err, 0);
    assert_int_equal(m->shard.vocab0, 150);
    assert_int_equal(m->shard.n_vocab, 150);
    assert_true(shard_has_classifier(&m->shard));
    assert_false(shard_gets_logits(&m->shard));
    assert_int_equal(m->output->ne[1], 150);
    assert_int_equal(offset(m, m->output), 150 * 68);
    assert_int_equal(m->tok_embd->ne[1], 150);
    assert_int_equal(offset(m, m->tok_embd), 150 * 68);
    assert_non_null(m->output->panels);  // packed: this rank computes its rows' logits
    assert_int_equal(m->hp.n_vocab, 300);  // the model's vocabulary is still all of it
    engine_model_free(m);
    const int32_t want0[4] = {0, 75, 150, 225}, want_n[4] = {75, 75, 75, 76};
    for (int32_t r = 0; r < 4; r++) {
        struct engine_model *t = load("llama-kv4-tied-v301", r, 4, &err);
        assert_int_equal(err, 0);
        assert_ptr_equal(t->output, t->tok_embd);
        assert_int_equal(t->shard.vocab0, want0[r]);
        assert_int_equal(t->shard.n_vocab, want_n[r]);
        assert_int_equal(t->tok_embd->ne[1], want_n[r]);
        assert_int_equal(offset(t, t->tok_embd), (ptrdiff_t)want0[r] * 128 * 2);  // f16 rows
        assert_int_equal(shard_vocab_stride(&t->shard, 301), 76);
        assert_true(shard_gets_logits(&t->shard) == (r == 0));
        engine_model_free(t);
    }
    // One process: every row, nothing cut.
    struct engine_model *whole = load("llama-q8_0", 0, 1, &err);
    assert_int_equal(err, 0);
    assert_int_equal(whole->shard.vocab0, 0);
    assert_int_equal(whole->shard.n_vocab, 300);
    assert_int_equal(whole->output->ne[1], 300);
    engine_model_free(whole);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_rank1_of_2_views_its_rows_and_columns),
        cmocka_unit_test(test_shard_rank0_of_2_and_biases),
        cmocka_unit_test(test_shard_refuses_impossible_splits),
        cmocka_unit_test(test_shard_pipeline_stages_hold_their_layers),
        cmocka_unit_test(test_shard_vocabulary_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
