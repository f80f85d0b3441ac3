/*
 * test_lora.c - adapters (engine/lora.c, engine/adapter.c) against the
 * independent numpy reference: scripts/mklora writes random adapters for the
 * synthetic models of tests/models, scripts/reference --lora computes the
 * logits with the adapter merged into the weights (LoRA: W + scale * B A;
 * bottleneck: its module after the attention / FFN output).
 *
 * Covered: PEFT on a llama base (q/k rows of lora_B permuted to the GGUF
 * order, checked against a reference that un-permutes the base, adds B A in
 * Hugging Face order and permutes back; and shown to differ from a merge
 * without the permutation); the same PEFT adapter converted to a GGUF LoRA
 * (bit-identical logits); GGUF LoRA in f16; PEFT on qwen2 (NeoX: no
 * permutation) and on a GQA llama in f16; bf16 + rsLoRA + rank_pattern +
 * alpha_pattern; fan_in_fan_out (same layout, same logits); bottleneck
 * adapters; a batch mixing the base model and several adapters giving every
 * sequence exactly (bit for bit) what it gets alone; the portable kernels;
 * and rejection of mismatching or unsupported adapters with a message that
 * names the tensor (or the field).
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/engine.h"
#include "engine/kernels/kernels.h"
#include "tests/helpers/gguf_builder.h"
#include "tests/helpers/mpi_job.h"
#include "tests/helpers/safetensors_builder.h"
#include "tests/helpers/testutil.h"

#define MAX_VSEQS 8
#define MAX_TOKENS 128

/* ---- fixtures ------------------------------------------------------------------ */

struct tokens {
    int32_t n_seqs;
    int32_t len[MAX_VSEQS];
    int32_t *ids[MAX_VSEQS];  // owned
};

static const char *models_dir(void) { return testutil_path(testutil_build_dir(), "tests/models"); }

static struct engine_model *load_model(const char *name) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.gguf", models_dir(), name);
    struct engine_model *m = NULL;
    assert_int_equal(mpi_job_load(path, &m), 0);  // this rank's part under MPI
    return m;
}

static void load_tokens(const char *model, struct tokens *t) {
    memset(t, 0, sizeof(*t));
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.tokens", models_dir(), model);
    char *text = testutil_read_file(path, NULL);
    assert_non_null(text);
    char *p = text;
    while (*p && *p != '\n') {
        assert_true(t->n_seqs < MAX_VSEQS);
        int32_t *ids = malloc(MAX_TOKENS * sizeof(int32_t));
        int32_t n = 0;
        while (*p && *p != ';' && *p != '\n') {
            char *end;
            long v = strtol(p, &end, 10);
            assert_true(end != p && n < MAX_TOKENS);
            ids[n++] = (int32_t)v;
            p = *end == ',' ? end + 1 : end;
        }
        if (*p == ';') p++;
        t->ids[t->n_seqs] = ids;
        t->len[t->n_seqs++] = n;
    }
    free(text);
}

static void free_tokens(struct tokens *t) {
    for (int i = 0; i < t->n_seqs; i++) free(t->ids[i]);
}

/* Reference logits NAME.ref.bin: rows of n_vocab, the sequences concatenated. */
static float *load_ref(const char *name, const struct tokens *t, int32_t n_vocab) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.ref.bin", models_dir(), name);
    size_t n = 0;
    float *r = (float *)testutil_read_file(path, &n);
    assert_non_null(r);
    size_t rows = 0;
    for (int i = 0; i < t->n_seqs; i++) rows += (size_t)t->len[i];
    assert_int_equal(n, rows * (size_t)n_vocab * sizeof(float));
    return r;
}

/* Row pos of sequence s in a reference (or any run laid out the same way). */
static const float *ref_row(const float *ref, const struct tokens *t, int s, int32_t pos,
                            int32_t n_vocab) {
    size_t off = 0;
    for (int i = 0; i < s; i++) off += (size_t)t->len[i];
    return ref + (off + (size_t)pos) * (size_t)n_vocab;
}

/* Adapter NAME of tests/models: a directory NAME/ or a file NAME.gguf. */
static const char *adapter_path(const char *name) {
    static char path[4096];
    return testutil_adapter_path(name, path, sizeof(path));
}

static struct engine_adapter *load_adapter(const struct engine_model *m, const char *name) {
    struct engine_adapter *a = NULL;
    int err = engine_adapter_load(m, adapter_path(name), &a);
    if (err) fail_msg("loading adapter %s: %s", name, err_name(err));
    return a;
}

/* ---- running sequences --------------------------------------------------------- */


/* A virtual sequence: the token sequence src of the tokens file, run under
 * adapter slot `slot` (-1: none), chunk tokens per step (0: the schedule's). */
struct vseq {
    int src;
    int32_t slot;
    int32_t chunk;
};

struct run_opts {
    int32_t block_size;
    int32_t max_chunk;     // tokens per sequence per step
    bool together;         // all sequences in the same batches
    bool shuffle_blocks;
    bool null_adapter;     // batch.adapter = NULL (every slot must be -1)
};

/* Runs the virtual sequences with the adapters put into slots 0..n_slots-1
 * and returns every token's logits [sum len][n_vocab] in vseq order (owned by
 * the caller). */
static float *run(const struct engine_model *m, const struct tokens *t, const struct vseq *vs,
                  int n_vs, struct engine_adapter *const *slots, int32_t n_slots,
                  const struct run_opts *o) {
    const int32_t n_vocab = engine_model_get_info(m)->n_vocab;
    struct engine_ctx_params cp = engine_ctx_default_params();
    cp.n_threads = mpi_job.comm ? 1 : 2;  // N ranks share the cores
    cp.block_size = o->block_size;
    cp.max_batch_tokens = MAX_TOKENS;
    cp.max_outputs = MAX_TOKENS;
    cp.max_seqs = MAX_VSEQS;
    cp.max_adapters = n_slots;
    int32_t n_blocks_seq[MAX_VSEQS];
    int32_t total_blocks = 1;
    size_t rows = 0;
    for (int s = 0; s < n_vs; s++) {
        const int32_t len = t->len[vs[s].src];
        n_blocks_seq[s] = (len + o->block_size - 1) / o->block_size;
        total_blocks += n_blocks_seq[s];
        rows += (size_t)len;
    }
    cp.n_blocks = total_blocks;
    mpi_job_ctx(&cp);
    struct engine_ctx *ctx = NULL;
    assert_int_equal(engine_ctx_create(m, &cp, &ctx), 0);
    mpi_job_open_ctx = ctx;
    for (int32_t i = 0; i < n_slots; i++) {
        if (slots[i]) assert_int_equal(engine_ctx_set_adapter(ctx, i, slots[i]), 0);
    }

    int32_t ids[256];
    assert_true(total_blocks <= 256);
    for (int32_t i = 0; i < total_blocks - 1; i++) ids[i] = i + 1;
    if (o->shuffle_blocks) {
        uint32_t st = 777;
        for (int32_t i = total_blocks - 2; i > 0; i--) {
            st = st * 1664525u + 1013904223u;
            int32_t j = (int32_t)(st % (uint32_t)(i + 1));
            int32_t tmp = ids[i];
            ids[i] = ids[j];
            ids[j] = tmp;
        }
    }
    struct engine_seq seqs[MAX_VSEQS];
    size_t row0[MAX_VSEQS];
    int32_t off = 0;
    size_t r0 = 0;
    for (int s = 0; s < n_vs; s++) {
        seqs[s].block_table = ids + off;
        seqs[s].n_blocks = n_blocks_seq[s];
        off += n_blocks_seq[s];
        row0[s] = r0;
        r0 += (size_t)t->len[vs[s].src];
    }

    float *out = malloc(rows * (size_t)n_vocab * sizeof(float));
    assert_non_null(out);
    int32_t done[MAX_VSEQS] = {0};
    int32_t tok[MAX_TOKENS], pos[MAX_TOKENS], sq[MAX_TOKENS], ad[MAX_TOKENS];
    size_t dst[MAX_TOKENS];
    int8_t outf[MAX_TOKENS];
    for (;;) {
        int32_t n = 0;
        int32_t n_bs = 0;
        struct engine_seq bseqs[MAX_VSEQS];
        for (int s = 0; s < n_vs; s++) {
            const int32_t len = t->len[vs[s].src];
            if (done[s] == len) continue;
            if (!o->together && n_bs > 0) break;
            int32_t take = len - done[s];
            int32_t chunk = vs[s].chunk > 0      ? vs[s].chunk
                            : o->max_chunk > 1 ? (o->max_chunk + s * 3) % o->max_chunk + 1
                                               : 1;
            if (take > chunk) take = chunk;
            if (n + take > MAX_TOKENS) break;
            bseqs[n_bs] = seqs[s];
            for (int32_t i = 0; i < take; i++) {
                tok[n] = t->ids[vs[s].src][done[s] + i];
                pos[n] = done[s] + i;
                sq[n] = n_bs;
                ad[n] = vs[s].slot;
                outf[n] = 1;
                dst[n] = row0[s] + (size_t)(done[s] + i);
                n++;
            }
            done[s] += take;
            n_bs++;
        }
        if (n == 0) break;
        struct engine_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq = sq,
                                 .adapter = o->null_adapter ? NULL : ad, .output = outf,
                                 .n_seqs = n_bs, .seqs = bseqs};
        const float *logits = NULL;
        assert_int_equal(engine_forward(ctx, &b, &logits), 0);
        for (int32_t i = 0; i < n; i++) {
            memcpy(out + dst[i] * (size_t)n_vocab, logits + (size_t)i * n_vocab,
                   (size_t)n_vocab * sizeof(float));
        }
    }
    mpi_job_open_ctx = NULL;
    engine_ctx_free(ctx);
    return out;
}

/* 1e-4 of the largest reference logit, as test_forward.c: f32 against float64. */
static float tolerance(const float *ref, size_t n) {
    float mx = 1.0f;
    for (size_t i = 0; i < n; i++) mx = fabsf(ref[i]) > mx ? fabsf(ref[i]) : mx;
    return 1e-4f * mx;
}

/* Largest |got - ref| over the rows of virtual sequence s (ref laid out by
 * source sequence, got by vseq). */
static float worst_diff(const float *got, const float *ref, const struct tokens *t,
                        const struct vseq *vs, int n_vs, int s, int32_t n_vocab) {
    size_t off = 0;
    for (int i = 0; i < s; i++) off += (size_t)t->len[vs[i].src];
    float worst = 0.0f;
    for (int32_t p = 0; p < t->len[vs[s].src]; p++) {
        const float *g = got + (off + (size_t)p) * (size_t)n_vocab;
        const float *r = ref_row(ref, t, vs[s].src, p, n_vocab);
        for (int32_t i = 0; i < n_vocab; i++) {
            float d = fabsf(g[i] - r[i]);
            if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
        }
    }
    (void)n_vs;
    return worst;
}

static const struct run_opts opts_prefill = {16, 64, false, false, false};
static const struct run_opts opts_tokenwise = {16, 1, false, false, false};
static const struct run_opts opts_mixed = {4, 7, true, true, false};

/* Every source sequence under slot 0 holding adapter `adapter` of model
 * `model`, in three schedules, against reference `ref`. Returns the logits
 * of the first schedule (owned by the caller) for further comparisons. */
static float *check_adapter(const char *model, const char *adapter, const char *ref_name) {
    struct engine_model *m = load_model(model);
    const int32_t n_vocab = engine_model_get_info(m)->n_vocab;
    struct tokens t;
    load_tokens(model, &t);
    float *ref = load_ref(ref_name, &t, n_vocab);
    size_t rows = 0;
    for (int i = 0; i < t.n_seqs; i++) rows += (size_t)t.len[i];
    const float tol = tolerance(ref, rows * (size_t)n_vocab);
    struct engine_adapter *a = load_adapter(m, adapter);
    struct vseq vs[MAX_VSEQS];
    for (int s = 0; s < t.n_seqs; s++) vs[s] = (struct vseq){s, 0, 0};
    const struct run_opts *schedules[3] = {&opts_prefill, &opts_tokenwise, &opts_mixed};
    float *first = NULL;
    for (int k = 0; k < 3; k++) {
        float *got = run(m, &t, vs, t.n_seqs, &a, 1, schedules[k]);
        for (int s = 0; s < t.n_seqs; s++) {
            float w = worst_diff(got, ref, &t, vs, t.n_seqs, s, n_vocab);
            if (w > tol) {
                fail_msg("%s on %s, schedule %d, seq %d: max abs error %g > %g", adapter, model,
                         k, s, (double)w, (double)tol);
            }
        }
        if (k == 0) {
            first = got;
        } else {
            // One prefill (the adapter's tokens cut into chunks of 8 spread
            // over the threads) and token by token (one-token chunks), same
            // block size: the same bits.
            if (k == 1 && memcmp(first, got, rows * (size_t)n_vocab * sizeof(float)) != 0) {
                fail_msg("%s on %s: one prefill and token by token differ", adapter, model);
            }
            free(got);
        }
    }
    // The adapter must matter: far from the base model's logits.
    float *base = load_ref(model, &t, n_vocab);
    float w = 0.0f;
    for (int s = 0; s < t.n_seqs; s++) {
        float d = worst_diff(first, base, &t, vs, t.n_seqs, s, n_vocab);
        w = d > w ? d : w;
    }
    if (w < 100.0f * tol) fail_msg("%s changes the logits by only %g", adapter, (double)w);
    free(base);
    engine_adapter_release(a);
    free(ref);
    free_tokens(&t);
    mpi_job_unload(m);
    return first;
}

/* ---- logits against the reference ---------------------------------------------- */

static void test_lora_peft_llama_permuted_qk_matches_reference(void **state) {
    (void)state;
    float *got = check_adapter("llama-f32", "llama-peft", "llama-peft");
    // ... and not the merge that ignores the HF -> GGUF q/k row order.
    struct engine_model *m = load_model("llama-f32");
    const int32_t n_vocab = engine_model_get_info(m)->n_vocab;
    struct tokens t;
    load_tokens("llama-f32", &t);
    float *wrong = load_ref("llama-peft-noperm", &t, n_vocab);
    float *right = load_ref("llama-peft", &t, n_vocab);
    size_t rows = 0;
    for (int i = 0; i < t.n_seqs; i++) rows += (size_t)t.len[i];
    const float tol = tolerance(right, rows * (size_t)n_vocab);
    struct vseq vs[MAX_VSEQS];
    for (int s = 0; s < t.n_seqs; s++) vs[s] = (struct vseq){s, 0, 0};
    float w = 0.0f;
    for (int s = 0; s < t.n_seqs; s++) {
        float d = worst_diff(got, wrong, &t, vs, t.n_seqs, s, n_vocab);
        w = d > w ? d : w;
    }
    if (w < 100.0f * tol) fail_msg("the unpermuted merge is within %g: the test has no teeth",
                                   (double)w);
    free(wrong);
    free(right);
    free(got);
    free_tokens(&t);
    mpi_job_unload(m);
}

static void test_lora_gguf_converted_from_peft_is_bit_identical(void **state) {
    (void)state;
    // The converter permuted B in Python; the PEFT loader permutes it in C.
    float *from_peft = check_adapter("llama-f32", "llama-peft", "llama-peft");
    float *from_gguf = check_adapter("llama-f32", "llama-peft-conv", "llama-peft");
    struct tokens t;
    load_tokens("llama-f32", &t);
    size_t rows = 0;
    for (int i = 0; i < t.n_seqs; i++) rows += (size_t)t.len[i];
    assert_memory_equal(from_peft, from_gguf, rows * 300 * sizeof(float));
    free_tokens(&t);
    free(from_peft);
    free(from_gguf);
}

static void test_lora_gguf_f16_matches_reference(void **state) {
    (void)state;
    free(check_adapter("llama-f32", "llama-gguf-f16", "llama-gguf-f16"));
}

static void test_lora_peft_qwen2_neox_is_not_permuted(void **state) {
    (void)state;
    free(check_adapter("qwen2-f32", "qwen2-peft", "qwen2-peft"));
}

static void test_lora_peft_gqa_f16_qk(void **state) {
    (void)state;
    free(check_adapter("llama-bf16-gqa", "gqa-peft-qk", "gqa-peft-qk"));
}

static void test_lora_peft_bf16_rslora_patterns(void **state) {
    (void)state;
    free(check_adapter("llama-f32", "llama-peft-bf16-rs", "llama-peft-bf16-rs"));
}

static void test_lora_fan_in_fan_out_reads_the_same_layout(void **state) {
    (void)state;
    // Same tensors as llama-peft, fan_in_fan_out = true in the config: PEFT
    // stores lora_A/lora_B alike for every layer type, so the logits match.
    float *plain = check_adapter("llama-f32", "llama-peft", "llama-peft");
    float *fifo = check_adapter("llama-f32", "llama-peft-fifo", "llama-peft");
    struct tokens t;
    load_tokens("llama-f32", &t);
    size_t rows = 0;
    for (int i = 0; i < t.n_seqs; i++) rows += (size_t)t.len[i];
    assert_memory_equal(plain, fifo, rows * 300 * sizeof(float));
    free_tokens(&t);
    free(plain);
    free(fifo);
}

static void test_lora_bottleneck_matches_reference(void **state) {
    (void)state;
    free(check_adapter("llama-f32", "llama-bn", "llama-bn"));
}

static void test_lora_portable_kernels_match(void **state) {
    (void)state;
    kern_dispatch_init(true);
    free(check_adapter("llama-f32", "llama-gguf-f16", "llama-gguf-f16"));
    free(check_adapter("llama-f32", "llama-peft-bf16-rs", "llama-peft-bf16-rs"));
    free(check_adapter("llama-f32", "llama-bn", "llama-bn"));
    kern_dispatch_init(false);
}

/* ---- heterogeneous batches ------------------------------------------------------- */

/* Base model and four adapters in one batch, every source sequence under
 * several of them: each row equals, bit for bit, the same (sequence,
 * adapter) run alone, and is within tolerance of its reference. */
static void test_lora_mixed_batch_equals_alone(void **state) {
    (void)state;
    struct engine_model *m = load_model("llama-f32");
    const int32_t n_vocab = engine_model_get_info(m)->n_vocab;
    struct tokens t;
    load_tokens("llama-f32", &t);
    assert_int_equal(t.n_seqs, 3);
    const char *names[4] = {"llama-peft", "llama-gguf-f16", "llama-bn", "llama-peft-bf16-rs"};
    struct engine_adapter *slots[5] = {NULL};
    // Slot 0 stays empty: a batch never names it.
    for (int i = 0; i < 4; i++) slots[i + 1] = load_adapter(m, names[i]);
    // Chunks of 1 to 7 tokens per step, so prefill chunks and decodes mix.
    const struct vseq vs[8] = {{0, -1, 3}, {0, 1, 7}, {1, 2, 2}, {2, 3, 5},
                               {2, -1, 1}, {1, 1, 4}, {0, 4, 6}, {1, 4, 1}};
    const int n_vs = 8;
    float *mixed = run(m, &t, vs, n_vs, slots, 5, &opts_mixed);
    float *refs[5];
    refs[0] = load_ref("llama-f32", &t, n_vocab);
    for (int i = 0; i < 4; i++) refs[i + 1] = load_ref(names[i], &t, n_vocab);
    size_t rows = 0;
    for (int i = 0; i < t.n_seqs; i++) rows += (size_t)t.len[i];
    size_t off = 0;
    for (int s = 0; s < n_vs; s++) {
        // Alone: one sequence per batch, the same chunks and block size (the
        // attention's order of work follows both), other block ids, its
        // adapter in a different slot.
        struct engine_adapter *one[5] = {NULL};
        int32_t slot = vs[s].slot < 0 ? -1 : 4 - (vs[s].slot - 1);
        if (slot >= 0) one[slot] = slots[vs[s].slot];
        struct vseq v = {vs[s].src, slot, vs[s].chunk};
        const struct run_opts alone_opts = {opts_mixed.block_size, 1, false, false, false};
        float *alone = run(m, &t, &v, 1, one, 5, &alone_opts);
        const size_t n = (size_t)t.len[vs[s].src] * (size_t)n_vocab;
        if (memcmp(alone, mixed + off * (size_t)n_vocab, n * sizeof(float)) != 0) {
            fail_msg("vseq %d (seq %d, adapter slot %d): mixed batch != alone", s, vs[s].src,
                     vs[s].slot);
        }
        const float *ref = refs[vs[s].slot < 0 ? 0 : vs[s].slot];
        const float tol = tolerance(ref, rows * (size_t)n_vocab);
        struct vseq one_vs = {vs[s].src, 0, 0};
        float w = worst_diff(alone, ref, &t, &one_vs, 1, 0, n_vocab);
        if (w > tol) fail_msg("vseq %d: max abs error %g > %g", s, (double)w, (double)tol);
        off += (size_t)t.len[vs[s].src];
        free(alone);
    }
    // A batch whose adapter array names no slot equals one without the array.
    const struct vseq base[3] = {{0, -1, 0}, {1, -1, 0}, {2, -1, 0}};
    float *with_arr = run(m, &t, base, 3, slots, 5, &opts_mixed);
    struct run_opts no_arr = opts_mixed;
    no_arr.null_adapter = true;
    float *without = run(m, &t, base, 3, slots, 5, &no_arr);
    assert_memory_equal(with_arr, without, rows * (size_t)n_vocab * sizeof(float));
    free(with_arr);
    free(without);
    for (int i = 0; i < 5; i++) free(refs[i]);
    free(mixed);
    for (int i = 0; i < 5; i++) engine_adapter_release(slots[i]);
    free_tokens(&t);
    mpi_job_unload(m);
}

/* ---- slots, references, info ------------------------------------------------------ */

/* Every load is a new object with a new id, also of the same file, and a
 * failed load uses none: the prefix cache keys blocks by it (lora.h). */
static void test_lora_each_load_gets_a_new_id(void **state) {
    (void)state;
    struct engine_model *m = load_model("llama-f32");
    struct engine_adapter *a = load_adapter(m, "llama-peft");
    struct engine_adapter *bad = NULL;
    assert_int_not_equal(engine_adapter_load(m, "/nonexistent/adapter", &bad), 0);
    struct engine_adapter *b = load_adapter(m, "llama-peft");
    struct engine_adapter *c = load_adapter(m, "llama-bn");
    uint64_t ia = engine_adapter_get_info(a)->id;
    uint64_t ib = engine_adapter_get_info(b)->id;
    uint64_t ic = engine_adapter_get_info(c)->id;
    assert_true(ia >= 1);
    assert_true(ib == ia + 1 && ic == ib + 1);
    // Freed adapters do not give their ids back.
    engine_adapter_release(a);
    engine_adapter_release(b);
    struct engine_adapter *d = load_adapter(m, "llama-peft");
    assert_true(engine_adapter_get_info(d)->id == ic + 1);
    engine_adapter_release(c);
    engine_adapter_release(d);
    engine_model_free(m);
}

/* Copies file from to to (whole). */
static void copy_to(const char *from, const char *to) {
    size_t n = 0;
    char *data = testutil_read_file(from, &n);
    if (!data) fail_msg("cannot read %s", from);
    FILE *f = fopen(to, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    free(data);
}

/* engine_adapter_load_fd() loads what the descriptor names: the same adapter
 * as a load by path; a GGUF file replaced under its name after the open is
 * still read as it was; a PEFT directory's symlinked file loads (the layout
 * of a Hugging Face cache) unless ENGINE_ADAPTER_LOAD_NO_SYMLINKS, which
 * refuses it with ERR_PERM. */
static void test_lora_load_fd_reads_the_open_object(void **state) {
    (void)state;
    struct engine_model *m = load_model("llama-f32");
    struct engine_adapter *by_path = load_adapter(m, "llama-peft");
    const struct engine_adapter_info *ip = engine_adapter_get_info(by_path);
    int fd = open(adapter_path("llama-peft"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(fd >= 0);
    struct engine_adapter *a = NULL;
    assert_int_equal(engine_adapter_load_fd(m, fd, "peft-by-fd", ENGINE_ADAPTER_LOAD_NO_SYMLINKS,
                                            &a),
                     0);
    close(fd);
    const struct engine_adapter_info *ia = engine_adapter_get_info(a);
    assert_string_equal(ia->format, ip->format);
    assert_string_equal(ia->path, "peft-by-fd");
    assert_int_equal(ia->rank, ip->rank);
    assert_int_equal(ia->n_targets, ip->n_targets);
    assert_int_equal(ia->bytes, ip->bytes);
    engine_adapter_release(a);
    engine_adapter_release(by_path);

    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/tests/engine/lora-fd-%d", testutil_build_dir(), (int)getpid());
    char cfg[4200];
    char st[4200];
    char gguf[4200];
    snprintf(cfg, sizeof(cfg), "%s/adapter_config.json", dir);
    snprintf(st, sizeof(st), "%s/adapter_model.safetensors", dir);
    snprintf(gguf, sizeof(gguf), "%s.gguf", dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    char from[4200];
    snprintf(from, sizeof(from), "%s/adapter_config.json", adapter_path("llama-peft"));
    copy_to(from, cfg);
    snprintf(from, sizeof(from), "%s/adapter_model.safetensors", adapter_path("llama-peft"));
    assert_int_equal(symlink(from, st), 0);
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(engine_adapter_load_fd(m, fd, dir, 0, &a), 0);
    engine_adapter_release(a);
    assert_int_equal(engine_adapter_load_fd(m, fd, dir, ENGINE_ADAPTER_LOAD_NO_SYMLINKS, &a),
                     ERR_PERM);
    assert_null(a);
    close(fd);

    copy_to(adapter_path("llama-gguf-f16"), gguf);
    fd = open(gguf, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(unlink(gguf), 0);
    copy_to(cfg, gguf);  // not an adapter at all now, under the same name
    assert_int_equal(engine_adapter_load_fd(m, fd, gguf, ENGINE_ADAPTER_LOAD_NO_SYMLINKS, &a), 0);
    assert_string_equal(engine_adapter_get_info(a)->format, "gguf");
    engine_adapter_release(a);
    close(fd);
    assert_int_not_equal(engine_adapter_load(m, gguf, &a), 0);  // by name: what is there now

    unlink(gguf);
    unlink(st);
    unlink(cfg);
    rmdir(dir);
    engine_model_free(m);
}

static void test_lora_slots_and_references(void **state) {
    (void)state;
    struct engine_model *m = load_model("llama-f32");
    struct engine_model *other = load_model("qwen2-f32");
    struct engine_adapter *a = load_adapter(m, "llama-peft");
    const struct engine_adapter_info *info = engine_adapter_get_info(a);
    assert_int_equal(info->kind, ENGINE_ADAPTER_LORA);
    assert_string_equal(info->format, "peft");
    assert_int_equal(info->rank, 8);
    assert_true(fabsf(info->scale - 2.0f) < 1e-6f);  // alpha 16 / r 8
    assert_int_equal(info->n_targets, 2 * 7);
    assert_true(info->bytes > 0);
    assert_string_equal(info->path, adapter_path("llama-peft"));

    struct engine_ctx_params cp = engine_ctx_default_params();
    cp.max_adapters = 2;
    cp.n_blocks = 8;
    cp.max_batch_tokens = 8;
    cp.max_seqs = 4;
    struct engine_ctx *ctx = NULL;
    assert_int_equal(engine_ctx_create(m, &cp, &ctx), 0);
    assert_int_equal(engine_ctx_set_adapter(ctx, 2, a), ERR_INVAL);
    assert_int_equal(engine_ctx_set_adapter(ctx, -1, a), ERR_INVAL);
    struct engine_adapter *b = load_adapter(other, "qwen2-peft");
    assert_int_equal(engine_ctx_set_adapter(ctx, 0, b), ERR_INVAL);  // another model's
    engine_adapter_release(b);
    assert_int_equal(engine_ctx_set_adapter(ctx, 1, a), 0);
    assert_ptr_equal(engine_ctx_adapter(ctx, 1), a);
    assert_null(engine_ctx_adapter(ctx, 0));

    // A batch naming an empty or out-of-range slot is refused.
    int32_t tok[2] = {1, 2}, pos[2] = {0, 1}, sq[2] = {0, 0}, table[1] = {1};
    int8_t out[2] = {1, 1};
    struct engine_seq s = {.block_table = table, .n_blocks = 1};
    const int32_t bad[4][2] = {{1, 0}, {2, -1}, {-2, 1}, {1, 1}};
    const int want[4] = {ERR_INVAL, ERR_INVAL, ERR_INVAL, 0};
    for (int k = 0; k < 4; k++) {
        struct engine_batch bt = {.n_tokens = 2, .token = tok, .pos = pos, .seq = sq,
                                  .adapter = bad[k], .output = out, .n_seqs = 1, .seqs = &s};
        const float *logits = NULL;
        assert_int_equal(engine_forward(ctx, &bt, &logits), want[k]);
    }

    // The ctx holds its own reference: dropping ours keeps the adapter alive
    // (ASan would see a use after free) until the slot lets go.
    engine_adapter_release(a);
    {
        struct engine_batch bt = {.n_tokens = 2, .token = tok, .pos = pos, .seq = sq,
                                  .adapter = bad[3], .output = out, .n_seqs = 1, .seqs = &s};
        const float *logits = NULL;
        assert_int_equal(engine_forward(ctx, &bt, &logits), 0);
    }
    assert_int_equal(engine_ctx_set_adapter(ctx, 1, NULL), 0);  // frees it
    assert_null(engine_ctx_adapter(ctx, 1));
    engine_ctx_free(ctx);

    // A ctx without slots refuses any slot.
    cp.max_adapters = 0;
    assert_int_equal(engine_ctx_create(m, &cp, &ctx), 0);
    a = load_adapter(m, "llama-bn");
    assert_int_equal(engine_ctx_set_adapter(ctx, 0, a), ERR_INVAL);
    info = engine_adapter_get_info(a);
    assert_int_equal(info->kind, ENGINE_ADAPTER_BOTTLENECK);
    assert_string_equal(info->format, "bottleneck");
    assert_int_equal(info->rank, 12);
    assert_int_equal(info->n_targets, 2 * 2);
    // Released while a slot still holds it: freed with the ctx.
    cp.max_adapters = 1;
    engine_ctx_free(ctx);
    assert_int_equal(engine_ctx_create(m, &cp, &ctx), 0);
    assert_int_equal(engine_ctx_set_adapter(ctx, 0, a), 0);
    engine_adapter_release(a);
    engine_ctx_free(ctx);

    a = load_adapter(m, "llama-gguf-f16");
    info = engine_adapter_get_info(a);
    assert_string_equal(info->format, "gguf");
    assert_int_equal(info->rank, 16);
    assert_int_equal(info->n_targets, 7);  // layer 1 only
    assert_true(fabsf(info->scale - 2.0f) < 1e-6f);
    engine_adapter_release(a);
    engine_model_free(other);
    engine_model_free(m);
}

/* ---- rejections -------------------------------------------------------------------- */

/* Log lines written between capture_begin() and capture_end(). */
static char capture_path[4096];
static int capture_fd = -1;

static void capture_begin(void) {
    snprintf(capture_path, sizeof(capture_path), "%s/tests/engine/lora-log-%d.txt",
             testutil_build_dir(), (int)getpid());
    FILE *f = fopen(capture_path, "w");
    assert_non_null(f);
    capture_fd = dup(fileno(f));
    fclose(f);
    log_set_fd(capture_fd);
}

static char *capture_end(void) {
    log_set_fd(2);
    close(capture_fd);
    char *text = testutil_read_file(capture_path, NULL);
    assert_non_null(text);
    unlink(capture_path);
    return text;
}

/* Loads path, expects err and a log line containing want (NULL: any). */
static void expect_reject(const struct engine_model *m, const char *path, int err,
                          const char *want, const char *what) {
    struct engine_adapter *a = (struct engine_adapter *)&capture_fd;  // must be reset
    capture_begin();
    int got = engine_adapter_load(m, path, &a);
    char *log = capture_end();
    if (got != err) fail_msg("%s: got %s, want %s; log: %s", what, err_name(got), err_name(err), log);
    assert_null(a);
    if (want && !strstr(log, want)) fail_msg("%s: the message does not name '%s': %s", what, want, log);
    free(log);
}

/* Scratch directory for hand-made adapters. */
static const char *scratch_dir(const char *name) {
    static char dir[4096];
    snprintf(dir, sizeof(dir), "%s/tests/engine/lora-%s", testutil_build_dir(), name);
    mkdir(dir, 0755);
    return dir;
}

static void write_text(const char *dir, const char *file, const char *text) {
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void write_st(const char *dir, struct safetensors_builder *b) {
    size_t n = 0;
    uint8_t *bytes = safetensors_builder_finish(b, &n);
    char path[4200];
    snprintf(path, sizeof(path), "%s/adapter_model.safetensors", dir);
    assert_int_equal(safetensors_builder_write_file(path, bytes, n), 0);
    free(bytes);
    safetensors_builder_destroy(b);
}

/* A tensor of zeros, [rows, cols] (cols 0: [rows]). */
static void add_zeros(struct safetensors_builder *b, const char *name, int64_t rows, int64_t cols) {
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    float *z = calloc(n, sizeof(float));
    safetensors_builder_f32(b, name, rows, cols, z);
    free(z);
}

#define PEFT_CFG "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"]}"
#define QA "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
#define QB "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"

/* llama-f32: n_embd 64, q 64, kv 32, n_ff 96, 2 layers. */
static void test_lora_rejects_bad_peft_naming_the_tensor(void **state) {
    (void)state;
    struct engine_model *m = load_model("llama-f32");
    struct {
        const char *what;
        const char *cfg;
        const char *names[3];
        int64_t shapes[3][2];
        int err;
        const char *want;
    } cases[] = {
        {"q lora_B rows", PEFT_CFG, {QA, QB}, {{4, 64}, {48, 4}}, ERR_FORMAT, QB},
        {"q lora_A cols", PEFT_CFG, {QA, QB}, {{4, 96}, {64, 4}}, ERR_FORMAT, QA},
        {"rank disagrees between A and B", PEFT_CFG, {QA, QB}, {{4, 64}, {64, 3}}, ERR_FORMAT, QB},
        {"rank disagrees with r", PEFT_CFG, {QA, QB}, {{2, 64}, {64, 2}}, ERR_FORMAT, QA},
        {"A without B", PEFT_CFG,
         {QA, "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight", QB},
         {{4, 64}, {4, 64}, {64, 4}}, ERR_FORMAT, "layers.1.self_attn.k_proj.lora_A.weight"},
        {"layer out of range", PEFT_CFG,
         {"base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight"}, {{4, 64}},
         ERR_FORMAT, "layers.2.self_attn.q_proj.lora_A.weight"},
        {"embeddings", PEFT_CFG, {"base_model.model.model.embed_tokens.lora_embedding_A"},
         {{4, 300}}, ERR_UNSUPPORTED, "embed_tokens.lora_embedding_A"},
        {"lm_head", PEFT_CFG, {"base_model.model.lm_head.lora_A.weight"}, {{4, 64}},
         ERR_UNSUPPORTED, "lm_head.lora_A.weight"},
        {"not a LoRA tensor", PEFT_CFG, {"base_model.model.model.layers.0.self_attn.q_proj.weight"},
         {{64, 64}}, ERR_FORMAT, "self_attn.q_proj.weight"},
        {"same module twice", PEFT_CFG, {QA, "model.layers.0.self_attn.q_proj.lora_A.weight", QB},
         {{4, 64}, {4, 64}, {64, 4}}, ERR_FORMAT, "model.layers.0.self_attn.q_proj.lora_A.weight"},
        {"no tensors", PEFT_CFG, {NULL}, {{0}}, ERR_FORMAT, "no LoRA tensors"},
        {"DoRA", "{\"r\":4,\"use_dora\":true}", {QA, QB}, {{4, 64}, {64, 4}}, ERR_UNSUPPORTED,
         "DoRA"},
        {"lm_head target", "{\"r\":4,\"target_modules\":[\"q_proj\",\"lm_head\"]}", {QA, QB},
         {{4, 64}, {64, 4}}, ERR_UNSUPPORTED, "lm_head"},
        {"regex rank_pattern", "{\"r\":4,\"rank_pattern\":{\"layers\\\\.0.*\":2}}", {QA, QB},
         {{4, 64}, {64, 4}}, ERR_UNSUPPORTED, "rank_pattern"},
        {"no r", "{\"lora_alpha\":8}", {QA, QB}, {{4, 64}, {64, 4}}, ERR_FORMAT, "'r'"},
        {"r not an integer", "{\"r\":\"4\"}", {QA, QB}, {{4, 64}, {64, 4}}, ERR_FORMAT, "'r'"},
        {"bad JSON", "{\"r\":4,", {QA, QB}, {{4, 64}, {64, 4}}, ERR_FORMAT, "adapter_config.json"},
        {"not an object", "[4]", {QA, QB}, {{4, 64}, {64, 4}}, ERR_FORMAT, "adapter_config.json"},
        {"IA3", "{\"r\":4,\"peft_type\":\"IA3\"}", {QA, QB}, {{4, 64}, {64, 4}}, ERR_UNSUPPORTED,
         "IA3"},
        {"trained biases", "{\"r\":4,\"bias\":\"all\"}", {QA, QB}, {{4, 64}, {64, 4}},
         ERR_UNSUPPORTED, "bias"},
        {"modules_to_save", "{\"r\":4,\"modules_to_save\":[\"lm_head\"]}", {QA, QB},
         {{4, 64}, {64, 4}}, ERR_UNSUPPORTED, "modules_to_save"},
        {"alpha not a number", "{\"r\":4,\"lora_alpha\":\"x\"}", {QA, QB}, {{4, 64}, {64, 4}},
         ERR_FORMAT, "lora_alpha"},
        {"unknown adapter_type", "{\"adapter_type\":\"prefix\"}", {QA, QB}, {{4, 64}, {64, 4}},
         ERR_UNSUPPORTED, "prefix"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "peft-%zu", i);
        const char *dir = scratch_dir(tag);
        write_text(dir, "adapter_config.json", cases[i].cfg);
        struct safetensors_builder *b = safetensors_builder_create();
        for (int k = 0; k < 3 && cases[i].names[k]; k++) {
            add_zeros(b, cases[i].names[k], cases[i].shapes[k][0], cases[i].shapes[k][1]);
        }
        write_st(dir, b);
        expect_reject(m, dir, cases[i].err, cases[i].want, cases[i].what);
    }

    // An F64 tensor: the reader refuses the dtype, naming the tensor.
    const char *dir = scratch_dir("peft-f64");
    write_text(dir, "adapter_config.json", PEFT_CFG);
    struct safetensors_builder *b = safetensors_builder_create();
    int64_t shape[2] = {4, 64};
    safetensors_builder_tensor(b, QA, "F64", 2, shape, NULL, 4 * 64 * 8);
    write_st(dir, b);
    expect_reject(m, dir, ERR_UNSUPPORTED, QA, "F64 tensor");

    // No safetensors file; no directory at all; no config.
    dir = scratch_dir("peft-nofile");
    write_text(dir, "adapter_config.json", PEFT_CFG);
    expect_reject(m, dir, ERR_IO, "adapter_model.safetensors", "missing safetensors");
    expect_reject(m, "/nonexistent/adapter", ERR_IO, "/nonexistent/adapter", "missing path");
    dir = scratch_dir("peft-noconfig");
    expect_reject(m, dir, ERR_IO, "adapter_config.json", "missing config");

    // A valid adapter with shapes for another model: rejected by tensor name.
    struct engine_model *q = load_model("llama-bf16-gqa");  // n_embd 128
    expect_reject(q, adapter_path("llama-peft"), ERR_FORMAT,
                  "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                  "adapter of another model");
    engine_model_free(q);
    engine_model_free(m);
}

/* A GGUF adapter with one pair (or a bad variant) for llama-f32. */
static const char *write_gguf(const char *arch, const char *gtype, const char *name_a,
                              int64_t a0, int64_t a1, const char *name_b, int64_t b0, int64_t b1) {
    struct gguf_builder *b = gguf_builder_create(3);
    if (arch) gguf_builder_kv_str(b, "general.architecture", arch);
    if (gtype) gguf_builder_kv_str(b, "general.type", gtype);
    gguf_builder_kv_str(b, "adapter.type", "lora");
    gguf_builder_kv_f32(b, "adapter.lora.alpha", 8.0f);
    float *z = calloc((size_t)(a0 * a1 + b0 * b1), sizeof(float));
    int64_t ne_a[2] = {a0, a1};
    int64_t ne_b[2] = {b0, b1};
    if (name_a) gguf_builder_tensor(b, name_a, 2, ne_a, 0, z, (size_t)(a0 * a1) * sizeof(float));
    if (name_b) gguf_builder_tensor(b, name_b, 2, ne_b, 0, z, (size_t)(b0 * b1) * sizeof(float));
    free(z);
    size_t n = 0;
    uint8_t *bytes = gguf_builder_finish(b, &n);
    static char path[4096];
    snprintf(path, sizeof(path), "%s/tests/engine/lora-bad.gguf", testutil_build_dir());
    assert_int_equal(safetensors_builder_write_file(path, bytes, n), 0);
    free(bytes);
    gguf_builder_destroy(b);
    return path;
}

static void test_lora_rejects_bad_gguf_naming_the_tensor(void **state) {
    (void)state;
    struct engine_model *m = load_model("llama-f32");
    const char *va = "blk.0.attn_v.weight.lora_a";
    const char *vb = "blk.0.attn_v.weight.lora_b";
    // The baseline is valid.
    struct engine_adapter *a = NULL;
    assert_int_equal(engine_adapter_load(m, write_gguf("llama", "adapter", va, 64, 4, vb, 4, 32),
                                         &a), 0);
    assert_true(fabsf(engine_adapter_get_info(a)->scale - 2.0f) < 1e-6f);
    engine_adapter_release(a);
    expect_reject(m, write_gguf("qwen2", "adapter", va, 64, 4, vb, 4, 32), ERR_UNSUPPORTED,
                  "general.architecture", "other architecture");
    expect_reject(m, write_gguf("llama", "model", va, 64, 4, vb, 4, 32), ERR_UNSUPPORTED,
                  "general.type", "a model, not an adapter");
    expect_reject(m, write_gguf("llama", NULL, va, 64, 4, vb, 4, 32), ERR_FORMAT, "general.type",
                  "no general.type");
    expect_reject(m, write_gguf("llama", "adapter", va, 64, 4, vb, 4, 64), ERR_FORMAT, vb,
                  "lora_b rows");
    expect_reject(m, write_gguf("llama", "adapter", va, 96, 4, vb, 4, 32), ERR_FORMAT, va,
                  "lora_a cols");
    expect_reject(m, write_gguf("llama", "adapter", va, 64, 4, vb, 3, 32), ERR_FORMAT, vb,
                  "rank disagrees");
    expect_reject(m, write_gguf("llama", "adapter", va, 64, 4, NULL, 0, 0), ERR_FORMAT, vb,
                  "lora_b missing");
    expect_reject(m, write_gguf("llama", "adapter", "token_embd.weight.lora_a", 64, 4,
                                "token_embd.weight.lora_b", 4, 300),
                  ERR_UNSUPPORTED, "token_embd.weight.lora_a", "embeddings");
    expect_reject(m, write_gguf("llama", "adapter", "blk.0.attn_norm.weight", 64, 1, NULL, 0, 0),
                  ERR_UNSUPPORTED, "blk.0.attn_norm.weight", "a norm");
    expect_reject(m, write_gguf("llama", "adapter", "blk.7.attn_v.weight.lora_a", 64, 4,
                                "blk.7.attn_v.weight.lora_b", 4, 32),
                  ERR_FORMAT, "blk.7.attn_v.weight.lora_a", "layer out of range");
    expect_reject(m, write_gguf("llama", "adapter", NULL, 0, 0, NULL, 0, 0), ERR_FORMAT,
                  "no LoRA tensors", "empty");
    char base[4096];
    snprintf(base, sizeof(base), "%s/llama-f32.gguf", models_dir());
    expect_reject(m, base, ERR_FORMAT, "general.type", "the base model itself");
    engine_model_free(m);
}

#define BN_CFG "{\"adapter_type\":\"bottleneck\",\"bottleneck_size\":8,\"non_linearity\":\"relu\"}"

static void test_lora_rejects_bad_bottleneck_naming_the_tensor(void **state) {
    (void)state;
    struct engine_model *m = load_model("llama-f32");
    struct {
        const char *what;
        const char *cfg;
        const char *names[3];
        int64_t shapes[3][2];
        int err;
        const char *want;
    } cases[] = {
        {"valid", BN_CFG, {"layers.0.attn_adapter.down.weight", "layers.0.attn_adapter.up.weight"},
         {{8, 64}, {64, 8}}, 0, NULL},
        {"width", BN_CFG, {"layers.0.attn_adapter.down.weight", "layers.0.attn_adapter.up.weight"},
         {{6, 64}, {64, 8}}, ERR_FORMAT, "layers.0.attn_adapter.down.weight"},
        {"up missing", BN_CFG, {"layers.1.ffn_adapter.down.weight"}, {{8, 64}}, ERR_FORMAT,
         "layers.1.ffn_adapter.up.weight"},
        {"bias shape", BN_CFG,
         {"layers.0.attn_adapter.down.weight", "layers.0.attn_adapter.up.weight",
          "layers.0.attn_adapter.up.bias"},
         {{8, 64}, {64, 8}, {8, 0}}, ERR_FORMAT, "layers.0.attn_adapter.up.bias"},
        {"stray tensor", BN_CFG,
         {"layers.0.attn_adapter.down.weight", "layers.0.attn_adapter.up.weight",
          "layers.0.attn_adapter.gate.weight"},
         {{8, 64}, {64, 8}, {8, 8}}, ERR_FORMAT, "layers.0.attn_adapter.gate.weight"},
        {"layer out of range", BN_CFG,
         {"layers.2.attn_adapter.down.weight", "layers.2.attn_adapter.up.weight"},
         {{8, 64}, {64, 8}}, ERR_FORMAT, "layers.2.attn_adapter.down.weight"},
        {"activation",
         "{\"adapter_type\":\"bottleneck\",\"bottleneck_size\":8,\"non_linearity\":\"tanh\"}",
         {"layers.0.attn_adapter.down.weight", "layers.0.attn_adapter.up.weight"},
         {{8, 64}, {64, 8}}, ERR_UNSUPPORTED, "tanh"},
        {"no size", "{\"adapter_type\":\"bottleneck\"}",
         {"layers.0.attn_adapter.down.weight", "layers.0.attn_adapter.up.weight"},
         {{8, 64}, {64, 8}}, ERR_FORMAT, "bottleneck_size"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "bn-%zu", i);
        const char *dir = scratch_dir(tag);
        write_text(dir, "adapter_config.json", cases[i].cfg);
        struct safetensors_builder *b = safetensors_builder_create();
        for (int k = 0; k < 3 && cases[i].names[k]; k++) {
            add_zeros(b, cases[i].names[k], cases[i].shapes[k][0], cases[i].shapes[k][1]);
        }
        write_st(dir, b);
        if (cases[i].err == 0) {
            struct engine_adapter *a = NULL;
            assert_int_equal(engine_adapter_load(m, dir, &a), 0);
            assert_int_equal(engine_adapter_get_info(a)->n_targets, 1);
            engine_adapter_release(a);
            continue;
        }
        expect_reject(m, dir, cases[i].err, cases[i].want, cases[i].what);
    }
    engine_model_free(m);
}

int main(int argc, char **argv) {
    kern_dispatch_init(false);
    kern_blas_init();
    const int rc = mpi_job_start(argc, argv);
    if (rc >= 0) return rc;  // a follower's job has ended, or bad flags
    // Under MPI (tests/engine/meson.build: TP 2, PP 2, TP 2 x PP 2, SP 2) the same
    // adapters against the same numpy references: rank 0 loads them, every rank
    // gets its cut of each (engine/compute/adapter_share.h).
    const struct CMUnitTest job_tests[] = {
        MPI_JOB_TEST(test_lora_peft_llama_permuted_qk_matches_reference),
        MPI_JOB_TEST(test_lora_gguf_converted_from_peft_is_bit_identical),
        MPI_JOB_TEST(test_lora_gguf_f16_matches_reference),
        MPI_JOB_TEST(test_lora_peft_qwen2_neox_is_not_permuted),
        MPI_JOB_TEST(test_lora_peft_gqa_f16_qk),
        MPI_JOB_TEST(test_lora_peft_bf16_rslora_patterns),
        MPI_JOB_TEST(test_lora_bottleneck_matches_reference),
        MPI_JOB_TEST(test_lora_mixed_batch_equals_alone),
    };
    if (mpi_job.comm) {
        const int n_failed = cmocka_run_group_tests(job_tests, NULL, NULL);
        mpi_job_end();
        return n_failed;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lora_peft_llama_permuted_qk_matches_reference),
        cmocka_unit_test(test_lora_gguf_converted_from_peft_is_bit_identical),
        cmocka_unit_test(test_lora_gguf_f16_matches_reference),
        cmocka_unit_test(test_lora_peft_qwen2_neox_is_not_permuted),
        cmocka_unit_test(test_lora_peft_gqa_f16_qk),
        cmocka_unit_test(test_lora_peft_bf16_rslora_patterns),
        cmocka_unit_test(test_lora_fan_in_fan_out_reads_the_same_layout),
        cmocka_unit_test(test_lora_bottleneck_matches_reference),
        cmocka_unit_test(test_lora_portable_kernels_match),
        cmocka_unit_test(test_lora_mixed_batch_equals_alone),
        cmocka_unit_test(test_lora_each_load_gets_a_new_id),
        cmocka_unit_test(test_lora_slots_and_references),
        cmocka_unit_test(test_lora_rejects_bad_peft_naming_the_tensor),
        cmocka_unit_test(test_lora_rejects_bad_gguf_naming_the_tensor),
        cmocka_unit_test(test_lora_rejects_bad_bottleneck_naming_the_tensor),
        cmocka_unit_test(test_lora_load_fd_reads_the_open_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
