/*
 * test_forward.c - the engine's logits against the independent numpy
 * reference (scripts/reference) on the synthetic models of tests/models:
 * llama/qwen2/qwen3, GQA and not, tied and untied, F32/F16/BF16, partial
 * rotary, linear RoPE scaling, Llama 3 rope_freqs, sliding window.
 *
 * Every model is run (a) each sequence alone as one prefill, (b) token by
 * token, (c) all sequences in one batch, interleaved, in chunks, with small
 * blocks at shuffled ids; every output row must match the reference row of
 * the same sequence and position.
 *
 * Tensor parallelism: `mpirun -np N test_forward --tp N` runs the same
 * checks with every model split over N ranks (tests/engine/meson.build runs
 * N = 2 and 4 when the build has MPI): rank 0 runs the cmocka tests, and
 * before each model load, ctx creation and model free it tells the other
 * ranks which to do (a job, broadcast), so they follow it step by step.
 * Models whose kv heads N does not divide are skipped, saying so.
 * `--pp M` splits the layers into M pipeline stages as well (the job has
 * TP x PP ranks, stage-major): meson runs --pp 2 and --tp 2 --pp 2. `--sp N`
 * splits each step's tokens over N ranks instead (sequence parallelism):
 * meson runs --sp 2 and --sp 4, each also with `--sp-kv divided` (the KV pool
 * divided over the ranks, attention combined across them).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/base/err.h"
#include "engine/engine.h"
#include "engine/kernels/kernels.h"
#include "tests/helpers/mpi_job.h"
#include "tests/helpers/testutil.h"

#define MAX_SEQS 8


static int load_model(const char *name, struct engine_model **out) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/models/%s.gguf", testutil_build_dir(), name);
    return mpi_job_load(path, out);
}

struct fixture {
    struct engine_model *model;
    int32_t n_vocab;
    int32_t n_seqs;
    int32_t len[MAX_SEQS];
    int32_t *tokens[MAX_SEQS];  // owned
    const float *ref[MAX_SEQS];  // rows [len][n_vocab] into ref_data
    float *ref_data;             // owned
    float tol;
};

static void fixture_free(struct fixture *f) {
    for (int i = 0; i < f->n_seqs; i++) free(f->tokens[i]);
    free(f->ref_data);
    mpi_job_unload(f->model);
}

static void fixture_load(struct fixture *f, const char *name) {
    memset(f, 0, sizeof(*f));
    char path[4096];
    const int err = load_model(name, &f->model);
    if (err == ERR_UNSUPPORTED && mpi_job.comm) {
        print_message("%s cannot be split over %d ranks (see the log): skipped\n", name,
                      comm_size(mpi_job.comm));
        skip();
    }
    assert_int_equal(err, 0);
    f->n_vocab = engine_model_get_info(f->model)->n_vocab;

    snprintf(path, sizeof(path), "%s/tests/models/%s.tokens", testutil_build_dir(), name);
    char *text = testutil_read_file(path, NULL);
    assert_non_null(text);
    char *p = text;
    int64_t total = 0;
    while (*p && *p != '\n') {
        assert_true(f->n_seqs < MAX_SEQS);
        int32_t cap = 64;
        int32_t n = 0;
        int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
        while (*p && *p != ';' && *p != '\n') {
            char *end;
            long v = strtol(p, &end, 10);
            assert_true(end != p);
            if (n == cap) ids = realloc(ids, (size_t)(cap *= 2) * sizeof(int32_t));
            ids[n++] = (int32_t)v;
            p = *end == ',' ? end + 1 : end;
        }
        if (*p == ';') p++;
        f->tokens[f->n_seqs] = ids;
        f->len[f->n_seqs] = n;
        f->n_seqs++;
        total += n;
    }
    free(text);

    snprintf(path, sizeof(path), "%s/tests/models/%s.ref.bin", testutil_build_dir(), name);
    size_t n_bytes = 0;
    f->ref_data = (float *)testutil_read_file(path, &n_bytes);
    assert_non_null(f->ref_data);
    assert_int_equal(n_bytes, (size_t)total * f->n_vocab * sizeof(float));
    const float *r = f->ref_data;
    float max_abs = 0.0f;
    for (int i = 0; i < f->n_seqs; i++) {
        f->ref[i] = r;
        r += (size_t)f->len[i] * f->n_vocab;
    }
    for (int64_t i = 0; i < total * f->n_vocab; i++) {
        if (fabsf(f->ref_data[i]) > max_abs) max_abs = fabsf(f->ref_data[i]);
    }
    // About 1e-4 relative to the logits' scale: f32 arithmetic against float64.
    f->tol = 1e-4f * (max_abs > 1.0f ? max_abs : 1.0f);
}

static void check_row(const struct fixture *f, int seq, int32_t pos, const float *row,
                      const char *mode) {
    const float *ref = f->ref[seq] + (size_t)pos * f->n_vocab;
    float worst = 0.0f;
    for (int32_t i = 0; i < f->n_vocab; i++) {
        float d = fabsf(row[i] - ref[i]);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
    }
    if (worst > f->tol) {
        fail_msg("%s: seq %d pos %d: max abs error %g > tolerance %g", mode, seq, pos,
                 (double)worst, (double)f->tol);
    }
}

/* When set, run_schedule() runs this model in this process alone (no ranks)
 * and writes its rows into the fixture's reference instead of checking them:
 * the oracle of the quantized models under TP (check_model_sharded_quant). */
static struct engine_model *record_model;

/* Runs the whole batch schedule: at each step, each sequence contributes up to
 * chunk[s] next tokens; all its rows ask for logits and are checked. */
static void run_schedule(const struct fixture *f, int32_t block_size, int32_t max_chunk,
                         bool together, bool shuffle_blocks, const char *mode) {
    struct engine_ctx_params cp = engine_ctx_default_params();
    cp.n_threads = mpi_job.comm ? 1 : 2;  // N ranks share the cores
    if (record_model) cp.n_threads = 1;
    cp.block_size = block_size;
    int32_t n_blocks_seq[MAX_SEQS];
    int32_t total_blocks = 1;
    for (int s = 0; s < f->n_seqs; s++) {
        n_blocks_seq[s] = (f->len[s] + block_size - 1) / block_size;
        total_blocks += n_blocks_seq[s];
    }
    cp.n_blocks = total_blocks;
    cp.max_batch_tokens = 128;
    cp.max_outputs = 128;
    cp.max_seqs = MAX_SEQS;
    if (!record_model) mpi_job_ctx(&cp);
    struct engine_ctx *ctx = NULL;
    assert_int_equal(engine_ctx_create(record_model ? record_model : f->model, &cp, &ctx), 0);
    mpi_job_open_ctx = ctx;

    // Block ids 1..total-1, optionally shuffled with a fixed LCG, dealt to sequences.
    int32_t *ids = malloc((size_t)total_blocks * sizeof(int32_t));
    for (int32_t i = 0; i < total_blocks - 1; i++) ids[i] = i + 1;
    if (shuffle_blocks) {
        uint32_t st = 12345;
        for (int32_t i = total_blocks - 2; i > 0; i--) {
            st = st * 1664525u + 1013904223u;
            int32_t j = (int32_t)(st % (uint32_t)(i + 1));
            int32_t tmp = ids[i];
            ids[i] = ids[j];
            ids[j] = tmp;
        }
    }
    struct engine_seq seqs[MAX_SEQS];
    int32_t off = 0;
    for (int s = 0; s < f->n_seqs; s++) {
        seqs[s].block_table = ids + off;
        seqs[s].n_blocks = n_blocks_seq[s];
        off += n_blocks_seq[s];
    }

    int32_t done[MAX_SEQS] = {0};
    int32_t tok[128], pos[128], sq[128], rows_seq[128], rows_pos[128];
    int8_t out[128];
    for (;;) {
        int32_t n = 0;
        int32_t n_seq_batch = 0;
        struct engine_seq bseqs[MAX_SEQS];
        for (int s = 0; s < f->n_seqs; s++) {
            if (done[s] == f->len[s]) continue;
            if (!together && n_seq_batch > 0) break;
            int32_t take = f->len[s] - done[s];
            // Vary chunk sizes by sequence so batches mix prefill chunks and single tokens.
            int32_t chunk = max_chunk > 1 ? (max_chunk + s * 3) % max_chunk + 1 : 1;
            if (take > chunk) take = chunk;
            if (n + take > 128) break;
            bseqs[n_seq_batch] = seqs[s];
            for (int32_t i = 0; i < take; i++) {
                tok[n] = f->tokens[s][done[s] + i];
                pos[n] = done[s] + i;
                sq[n] = n_seq_batch;
                out[n] = 1;
                rows_seq[n] = s;
                rows_pos[n] = done[s] + i;
                n++;
            }
            done[s] += take;
            n_seq_batch++;
        }
        if (n == 0) break;
        struct engine_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq = sq,
                                 .output = out, .n_seqs = n_seq_batch, .seqs = bseqs};
        const float *logits = NULL;
        assert_int_equal(engine_forward(ctx, &b, &logits), 0);
        for (int32_t i = 0; i < n; i++) {
            const float *row = logits + (size_t)i * f->n_vocab;
            if (record_model) {
                float *ref = (float *)f->ref[rows_seq[i]] + (size_t)rows_pos[i] * f->n_vocab;
                memcpy(ref, row, (size_t)f->n_vocab * sizeof(float));
            } else {
                check_row(f, rows_seq[i], rows_pos[i], row, mode);
            }
        }
    }
    free(ids);
    mpi_job_open_ctx = NULL;
    engine_ctx_free(ctx);
}

static void check_model(const char *name) {
    struct fixture f;
    fixture_load(&f, name);
    run_schedule(&f, 16, 64, false, false, "alone, one prefill");
    // The longest schedule (a step per token of each sequence in turn) adds nothing
    // that the batched token-by-token one misses: left out under TP, which is slow
    // when N ranks share two loaded cores.
    if (!mpi_job.comm) run_schedule(&f, 16, 1, false, false, "alone, token by token");
    run_schedule(&f, 4, 7, true, true, "together, chunked, shuffled 4-token blocks");
    run_schedule(&f, 5, 1, true, true, "together, token by token, 5-token blocks");
    fixture_free(&f);
}

/* Quantized models under tensor parallelism. Their numpy reference differs
 * from the engine by its 8-bit activations (test_quant_model.c bounds that),
 * so the oracle here is the single-process engine on the same file, whose
 * code path has no slices and no allreduce: each sequence alone, as one
 * prefill. Within 1e-4 of the logits' scale, and the same argmax wherever the
 * top two are further apart than that. */
static void check_model_sharded_quant(const char *name) {
    if (!mpi_job.comm) skip();  // test_quant_model.c covers the single process
    struct fixture f;
    fixture_load(&f, name);
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/models/%s.gguf", testutil_build_dir(), name);
    struct engine_model_params mp = engine_model_default_params();
    mp.path = path;
    struct engine_model *whole = NULL;
    assert_int_equal(engine_model_load(&mp, &whole), 0);
    struct engine_ctx_params cp = engine_ctx_default_params();
    cp.n_threads = 1;
    cp.n_blocks = 16;
    cp.max_batch_tokens = 128;
    cp.max_outputs = 128;
    struct engine_ctx *ctx = NULL;
    assert_int_equal(engine_ctx_create(whole, &cp, &ctx), 0);
    float max_abs = 0.0f;
    for (int s = 0; s < f.n_seqs; s++) {
        int32_t pos[128], sq[128] = {0}, table[8];
        int8_t out[128];
        for (int32_t i = 0; i < f.len[s]; i++) {
            pos[i] = i;
            out[i] = 1;
        }
        for (int32_t i = 0; i < 8; i++) table[i] = i + 1;
        struct engine_seq seq = {.block_table = table, .n_blocks = 8};
        struct engine_batch b = {.n_tokens = f.len[s], .token = f.tokens[s], .pos = pos,
                                 .seq = sq, .output = out, .n_seqs = 1, .seqs = &seq};
        const float *logits = NULL;
        assert_int_equal(engine_forward(ctx, &b, &logits), 0);
        const size_t n = (size_t)f.len[s] * f.n_vocab;
        memcpy((float *)f.ref[s], logits, n * sizeof(float));  // the oracle, in place
        for (size_t i = 0; i < n; i++) max_abs = fmaxf(max_abs, fabsf(logits[i]));
    }
    engine_ctx_free(ctx);
    f.tol = 1e-4f * (max_abs > 1.0f ? max_abs : 1.0f);
    // A divided KV pool sums the ranks' attention partials in another order than
    // one process walks the keys, so a row's attention differs in its last bits;
    // the f32 models above hold 1e-4 against numpy that way, but here the q8_0
    // matrix products round their input to 8 bits, and a last-bit change can
    // move one of those roundings: llama-kv4-q8_0's seq 0 at pos 24, the row
    // that moves by 0.099 (of logits up to 13) between schedules in one process
    // too (below). 2% of the logits' scale is what such a flip costs; a wrong
    // combination is off by the logits' own size.
    if (mpi_job.is_kv_divided) f.tol = 2e-2f * (max_abs > 1.0f ? max_abs : 1.0f);
    run_schedule(&f, 16, 64, false, false, "sharded, alone, one prefill");
    // The chunked schedule against the single process on the same schedule,
    // not against one prefill: on an AVX2 machine the single process alone
    // gives llama-kv4-q8_0's seq 0 at pos 24 (decoded token by token) 0.099
    // away from its one-prefill row (logits up to 13), which is no matter of
    // the slices and allreduces this test is about (see issue 19's note: a
    // quantized model's chunked and whole prefill differ there).
    record_model = whole;
    run_schedule(&f, 4, 7, true, true, "single process, together, chunked (the oracle)");
    record_model = NULL;
    run_schedule(&f, 4, 7, true, true, "sharded, together, chunked, shuffled 4-token blocks");
    engine_model_free(whole);
    fixture_free(&f);
}

static void test_forward_tp_q8_0_uneven_ffn_split(void **state) {
    (void)state;
    check_model_sharded_quant("llama-q8_0");  // 3 blocks of FFN columns over 2 ranks: 1 + 2
}
static void test_forward_tp_q4_0(void **state) {
    (void)state;
    check_model_sharded_quant("llama-q4_0");
}
static void test_forward_tp_kv4_q8_0(void **state) {
    (void)state;
    check_model_sharded_quant("llama-kv4-q8_0");
}
static void test_forward_llama_kv4_f32(void **state) {
    (void)state;
    check_model("llama-kv4-f32");
}

/* A K-quant's 256-column blocks cannot be cut at 128 columns: every rank
 * refuses the split with ERR_UNSUPPORTED (the log names the tensor). */
static void test_forward_tp_refuses_split_inside_a_block(void **state) {
    (void)state;
    if (mpi_job.n_tp == 1) skip();  // stages alone never cut a matrix
    struct engine_model *m = NULL;
    assert_int_equal(load_model("llama256-q4_k_m", &m), ERR_UNSUPPORTED);
    assert_null(m);
    mpi_job_unload(NULL);
}

/* 301 rows: under TP the embedding and the classifier split unevenly (one tensor:
 * tied), so the gathered logits are placed from parts of two sizes. */
static void test_forward_llama_kv4_tied_v301(void **state) {
    (void)state;
    check_model("llama-kv4-tied-v301");
}

static void test_forward_llama_f32(void **state) {
    (void)state;
    check_model("llama-f32");
}
static void test_forward_llama_f16_tied(void **state) {
    (void)state;
    check_model("llama-f16-tied");
}
static void test_forward_llama_bf16_gqa_rope_freqs(void **state) {
    (void)state;
    check_model("llama-bf16-gqa");
}
static void test_forward_qwen2_f32_bias_neox(void **state) {
    (void)state;
    check_model("qwen2-f32");
}
static void test_forward_qwen3_f32_qk_norm(void **state) {
    (void)state;
    check_model("qwen3-f32");
}
static void test_forward_llama_sliding_window_linear_rope(void **state) {
    (void)state;
    check_model("llama-swa");
}

static void test_forward_qwen2_yarn(void **state) {
    (void)state;
    check_model("qwen2-yarn");
}

static void test_forward_portable_kernels_match(void **state) {
    (void)state;
    kern_dispatch_init(true);
    check_model("llama-f16-tied");
    kern_dispatch_init(false);
}

static void test_forward_rejects_oversized_batch(void **state) {
    (void)state;
    struct fixture f;
    fixture_load(&f, "llama-f32");
    struct engine_ctx_params cp = engine_ctx_default_params();
    cp.max_batch_tokens = 4;
    cp.max_seqs = 1;
    cp.n_blocks = 4;
    mpi_job_ctx(&cp);
    struct engine_ctx *ctx = NULL;
    assert_int_equal(engine_ctx_create(f.model, &cp, &ctx), 0);
    mpi_job_open_ctx = ctx;
    int32_t tok[5] = {1, 2, 3, 4, 5}, pos[5] = {0, 1, 2, 3, 4}, sq[5] = {0};
    int8_t out[5] = {1, 1, 1, 1, 1};
    int32_t table[1] = {1};
    struct engine_seq s = {.block_table = table, .n_blocks = 1};
    struct engine_batch b = {.n_tokens = 5, .token = tok, .pos = pos, .seq = sq, .output = out,
                             .n_seqs = 1, .seqs = &s};
    const float *logits = (const float *)&b;
    assert_int_equal(engine_forward(ctx, &b, &logits), ERR_INVAL);
    assert_null(logits);
    b.n_tokens = 3;  // 3 outputs > max_outputs (= max_seqs = 1)
    assert_int_equal(engine_forward(ctx, &b, &logits), ERR_INVAL);
    mpi_job_open_ctx = NULL;
    engine_ctx_free(ctx);
    fixture_free(&f);
}

int main(int argc, char **argv) {
    kern_dispatch_init(false);
    kern_blas_init();
    const int rc = mpi_job_start(argc, argv);
    if (rc >= 0) return rc;  // a follower's job has ended, or bad flags
    const struct CMUnitTest tests[] = {
        MPI_JOB_TEST(test_forward_llama_f32),
        MPI_JOB_TEST(test_forward_llama_f16_tied),
        MPI_JOB_TEST(test_forward_llama_bf16_gqa_rope_freqs),
        MPI_JOB_TEST(test_forward_qwen2_f32_bias_neox),
        MPI_JOB_TEST(test_forward_qwen3_f32_qk_norm),
        MPI_JOB_TEST(test_forward_llama_sliding_window_linear_rope),
        MPI_JOB_TEST(test_forward_qwen2_yarn),
        MPI_JOB_TEST(test_forward_portable_kernels_match),
        MPI_JOB_TEST(test_forward_rejects_oversized_batch),
        MPI_JOB_TEST(test_forward_llama_kv4_f32),
        MPI_JOB_TEST(test_forward_llama_kv4_tied_v301),
        MPI_JOB_TEST(test_forward_tp_q8_0_uneven_ffn_split),
        MPI_JOB_TEST(test_forward_tp_q4_0),
        MPI_JOB_TEST(test_forward_tp_kv4_q8_0),
        MPI_JOB_TEST(test_forward_tp_refuses_split_inside_a_block),
    };
    const int n_failed = cmocka_run_group_tests(tests, NULL, NULL);
    mpi_job_end();
    return n_failed;
}
