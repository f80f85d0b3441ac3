/*
 * cmd_quant.c - `llmserve quantize IN.gguf OUT.gguf TYPE` (engine/quantize.c)
 * and `llmserve perplexity -m FILE --text FILE`: perplexity over a text in
 * windows, and with --base F32.gguf the KL divergence of the model's token
 * distributions from the base model's on the same windows.
 *
 * Windows follow llama.cpp's perplexity tool: the text's tokens are cut into
 * windows of --ctx tokens, each window's first token becomes BOS, and only
 * the second half of each window is scored (every scored token sees at least
 * ctx/2 tokens of context). Output: one line per window on stderr, then
 * `ppl=... n_tokens=...` on stdout, with --base also `kl=` (mean over scored
 * tokens), `kl_max=` (largest) and `top1=` (share of scored tokens whose most
 * likely next token is the base model's).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/file.h"
#define LOG_TAG "cmd"
#include "engine/base/log.h"
#include "engine/base/progress.h"
#include "engine/engine.h"
#include "engine/model/quantize.h"
#include "engine/text/tokenizer.h"
#include "server/cmd.h"

int cmd_quantize(int argc, char **argv) {
    int32_t n_threads = 0;
    int opt;
    optind = 1;
    while ((opt = getopt(argc, argv, "t:h")) != -1) {
        if (opt == 't') {
            n_threads = atoi(optarg);
        } else {
            fprintf(stderr, "usage: llmserve quantize [-t THREADS] IN.gguf OUT.gguf TYPE\n"
                            "TYPE: %s\n", quantize_ftype_names());
            return opt == 'h' ? 0 : 2;
        }
    }
    if (argc - optind != 3) {
        fprintf(stderr, "usage: llmserve quantize [-t THREADS] IN.gguf OUT.gguf TYPE\n");
        return 2;
    }
    int32_t ftype = quantize_ftype_from_name(argv[optind + 2]);
    if (ftype < 0) {
        fprintf(stderr, "quantize: unknown type '%s' (one of %s)\n", argv[optind + 2],
                quantize_ftype_names());
        return 2;
    }
    if (n_threads <= 0) n_threads = 2;
    struct quantize_params p = {.in_path = argv[optind], .out_path = argv[optind + 1],
                                .ftype = (enum quantize_ftype)ftype, .n_threads = n_threads,
                                .show_progress = true};
    int64_t t0 = clock_mono_ns();
    int err = quantize_model(&p);
    if (err) {
        fprintf(stderr, "quantize: failed: %s\n", err_str(err));
        return 1;
    }
    fprintf(stderr, "quantize: wrote %s in %.1f s\n", p.out_path,
            (double)(clock_mono_ns() - t0) / 1e9);
    return 0;
}

/* One model with a ctx sized for one window. */
struct ppl_model {
    struct engine_model *model;
    struct engine_ctx *ctx;
    int32_t n_vocab;
};

static int ppl_open(const char *path, int32_t n_ctx, int32_t n_threads,
                    enum engine_kv_type kv_type, struct ppl_model *out) {
    memset(out, 0, sizeof(*out));
    struct engine_model_params mp = engine_model_default_params();
    mp.path = path;
    mp.show_progress = true;
    int err = engine_model_load(&mp, &out->model);
    if (err) return err;
    out->n_vocab = engine_model_get_info(out->model)->n_vocab;
    struct engine_ctx_params cp = engine_ctx_default_params();
    cp.n_threads = n_threads;
    cp.max_seqs = 1;
    cp.max_batch_tokens = n_ctx;
    cp.max_outputs = n_ctx;
    cp.n_blocks = (n_ctx + cp.block_size - 1) / cp.block_size + 1;
    cp.kv_type = kv_type;
    return engine_ctx_create(out->model, &cp, &out->ctx);
}

static void ppl_close(struct ppl_model *m) {
    engine_ctx_free(m->ctx);
    engine_model_free(m->model);
}

/* log-softmax of logits row into out [n]. */
static void log_softmax(const float *logits, int32_t n, double *out) {
    double max = logits[0];
    for (int32_t i = 1; i < n; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)logits[i] - max);
    double lse = max + log(sum);
    for (int32_t i = 0; i < n; i++) out[i] = (double)logits[i] - lse;
}

struct ppl_opts {
    const char *model_path;
    const char *text_path;
    const char *base_path;          // NULL: no KL divergence
    int32_t n_ctx;                  // the window
    int32_t n_threads;
    int32_t max_windows;            // 0: every window of the text
    enum engine_kv_type kv_type;    // of -m; --base always has f32 KV
};

/* Reads the flags into *o. Returns -1 to go on, else the exit code 2 after
 * the usage. */
static int parse_ppl_opts(int argc, char **argv, struct ppl_opts *o) {
    *o = (struct ppl_opts){.n_ctx = 128, .kv_type = ENGINE_KV_TYPE_F32};
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'}, {"text", required_argument, NULL, 'f'},
        {"ctx", required_argument, NULL, 'c'},   {"base", required_argument, NULL, 'b'},
        {"threads", required_argument, NULL, 't'},
        {"windows", required_argument, NULL, 'w'}, {"kv-type", required_argument, NULL, 'k'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:f:c:b:t:w:k:", longopts, NULL)) != -1) {
        switch (opt) {
        case 'm': o->model_path = optarg; break;
        case 'f': o->text_path = optarg; break;
        case 'c': o->n_ctx = atoi(optarg); break;
        case 'b': o->base_path = optarg; break;
        case 't': o->n_threads = atoi(optarg); break;
        case 'w': o->max_windows = atoi(optarg); break;
        case 'k':
            if (engine_kv_type_parse(optarg, &o->kv_type) != 0) {
                fprintf(stderr, "perplexity: --kv-type: '%s' is not one of f32, f16, q8_0\n",
                        optarg);
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: llmserve perplexity -m FILE --text FILE [--ctx N] "
                            "[--base F32.gguf] [--windows N] [--kv-type f32|f16|q8_0] "
                            "[-t THREADS]\n");
            return 2;
        }
    }
    if (!o->model_path || !o->text_path || o->n_ctx < 4) {
        fprintf(stderr, "usage: llmserve perplexity -m FILE --text FILE [--ctx N >= 4] "
                        "[--base F32.gguf] [--windows N] [--kv-type f32|f16|q8_0] "
                        "[-t THREADS]\n");
        return 2;
    }
    return -1;
}

/* The sums over every scored token. */
struct ppl_sums {
    double nll;
    double kl;
    double kl_max;
    int64_t n_scored;
    int64_t n_top1;   // tokens whose most likely next token agrees with the base's
};

/* Scores n_out output rows of logits [n_out][n_vocab] against the tokens
 * that follow (next [n_out]), and with base_logits (else NULL) the KL
 * divergence from the base's rows; lp, lq: scratch [n_vocab]. Adds to *s;
 * returns the rows' negative log-likelihood. */
static double score_outputs(const float *logits, const float *base_logits, const int32_t *next,
                            int32_t n_out, int32_t n_vocab, double *lp, double *lq,
                            struct ppl_sums *s) {
    double w_nll = 0;
    for (int32_t o = 0; o < n_out; o++) {
        log_softmax(logits + (size_t)o * n_vocab, n_vocab, lq);
        w_nll -= lq[next[o]];
        if (!base_logits) continue;
        log_softmax(base_logits + (size_t)o * n_vocab, n_vocab, lp);
        double d = 0;
        int32_t top_p = 0, top_q = 0;
        for (int32_t v = 0; v < n_vocab; v++) {
            d += exp(lp[v]) * (lp[v] - lq[v]);
            if (lp[v] > lp[top_p]) top_p = v;
            if (lq[v] > lq[top_q]) top_q = v;
        }
        s->kl += d;
        s->kl_max = d > s->kl_max ? d : s->kl_max;
        s->n_top1 += top_p == top_q;
    }
    return w_nll;
}

int cmd_perplexity(int argc, char **argv) {
    struct ppl_opts po;
    int exit_code = parse_ppl_opts(argc, argv, &po);
    if (exit_code >= 0) return exit_code;
    const char *base_path = po.base_path;
    const int32_t n_ctx = po.n_ctx;
    exit_code = 1;
    struct ppl_model m = {0}, base = {0};
    struct file_map text = {0};
    int32_t *ids = NULL, *pos = NULL, *seq = NULL, *table = NULL;
    int8_t *outf = NULL;
    double *lp = NULL, *lq = NULL;
    float *base_logits = NULL;
    struct progress pr = {.mode = PROGRESS_OFF};  // over the tokens of all windows
    int err = file_map(po.text_path, &text);
    if (err) goto done;
    err = ppl_open(po.model_path, n_ctx, po.n_threads, po.kv_type, &m);
    if (err) goto done;
    if (base_path) {
        err = ppl_open(base_path, n_ctx, po.n_threads, ENGINE_KV_TYPE_F32, &base);
        if (err) goto done;
        if (base.n_vocab != m.n_vocab) {
            fprintf(stderr, "perplexity: --base has %d tokens in its vocabulary, the model %d\n",
                    base.n_vocab, m.n_vocab);
            goto done;
        }
    }
    int32_t n_ids = 0;
    err = tokenizer_encode(engine_model_tokenizer(m.model),
                           text.data ? (const char *)text.data : "", text.size, false, false,
                           &ids, &n_ids);
    if (err) goto done;
    const int32_t n_windows_all = n_ids / n_ctx;
    const int32_t n_windows =
        po.max_windows > 0 && po.max_windows < n_windows_all ? po.max_windows : n_windows_all;
    if (n_windows < 1) {
        fprintf(stderr, "perplexity: the text has %d tokens, fewer than one window of %d\n", n_ids,
                n_ctx);
        goto done;
    }
    const int32_t n_vocab = m.n_vocab;
    const int32_t bos = tokenizer_bos(engine_model_tokenizer(m.model));
    const int32_t n_blk = engine_ctx_block_size(m.ctx);
    pos = malloc((size_t)n_ctx * sizeof(int32_t));
    seq = calloc((size_t)n_ctx, sizeof(int32_t));
    outf = malloc((size_t)n_ctx);
    table = malloc((size_t)(n_ctx / n_blk + 2) * sizeof(int32_t));
    lp = malloc((size_t)n_vocab * sizeof(double));
    lq = malloc((size_t)n_vocab * sizeof(double));
    base_logits = base_path ? malloc((size_t)n_ctx * (size_t)n_vocab * sizeof(float)) : NULL;
    if (!pos || !seq || !outf || !table || !lp || !lq || (base_path && !base_logits)) {
        err = ERR_NOMEM;
        goto done;
    }
    for (int32_t i = 0; i < n_ctx / n_blk + 2; i++) table[i] = i + 1;
    struct engine_seq es = {.block_table = table, .n_blocks = (n_ctx + n_blk - 1) / n_blk};
    const int32_t first = n_ctx / 2;  // scored: positions first .. n_ctx-2 predict the next
    struct ppl_sums s = {0};
    int64_t t0 = clock_mono_ns();
    progress_begin(&pr, "perplexity", (int64_t)n_windows * n_ctx, "tok", 1);
    for (int32_t w = 0; w < n_windows; w++) {
        int32_t *tok = ids + (size_t)w * n_ctx;
        const int32_t saved = tok[0];
        if (bos >= 0) tok[0] = bos;
        for (int32_t i = 0; i < n_ctx; i++) {
            pos[i] = i;
            outf[i] = i >= first - 1 && i < n_ctx - 1;
        }
        struct engine_batch b = {.n_tokens = n_ctx, .token = tok, .pos = pos, .seq = seq,
                                 .output = outf, .n_seqs = 1, .seqs = &es};
        const float *logits = NULL;
        const int32_t n_out = n_ctx - first;
        if (base_path) {
            err = engine_forward(base.ctx, &b, &logits);
            if (err) goto done;
            memcpy(base_logits, logits, (size_t)n_out * (size_t)n_vocab * sizeof(float));
        }
        err = engine_forward(m.ctx, &b, &logits);
        if (err) goto done;
        double w_nll = score_outputs(logits, base_logits, ids + (size_t)w * n_ctx + first, n_out,
                                     n_vocab, lp, lq, &s);
        tok[0] = saved;
        s.nll += w_nll;
        s.n_scored += n_out;
        progress_printf(&pr, "perplexity: window %d/%d ppl %.4f (running %.4f)", w + 1,
                        n_windows, exp(w_nll / n_out), exp(s.nll / (double)s.n_scored));
        progress_note(&pr, "ppl %.4f", exp(s.nll / (double)s.n_scored));
        progress_update(&pr, (int64_t)(w + 1) * n_ctx);
    }
    progress_end(&pr);
    double secs = (double)(clock_mono_ns() - t0) / 1e9;
    printf("ppl=%.4f n_tokens=%lld windows=%d ctx=%d", exp(s.nll / (double)s.n_scored),
           (long long)s.n_scored, n_windows, n_ctx);
    if (base_path) {
        printf(" kl=%.6f kl_max=%.6f top1=%.4f", s.kl / (double)s.n_scored, s.kl_max,
               (double)s.n_top1 / (double)s.n_scored);
    }
    printf(" seconds=%.1f\n", secs);
    exit_code = 0;

done:
    progress_end(&pr);
    if (err) fprintf(stderr, "perplexity: failed: %s\n", err_str(err));
    free(ids);
    free(pos);
    free(seq);
    free(outf);
    free(table);
    free(lp);
    free(lq);
    free(base_logits);
    ppl_close(&base);
    ppl_close(&m);
    file_unmap(&text);
    return exit_code;
}
