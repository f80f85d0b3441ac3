/*
 * cmd_generate.c - `llmserve generate`: one sequence through the engine,
 * prompt prefilled in chunks, then decoded token by token.
 *
 * Contract (scripts and checks rely on it): with --prompt-ids, stdout gets the
 * generated ids space-separated on one line; stderr gets load time, prefill
 * and decode tokens/s.
 */
#define LOG_TAG "generate"
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/engine.h"
#include "engine/kernels/kernels.h"
#include "server/cmd.h"

struct generate_opts {
    const char *model;
    const char *prompt_ids;
    int32_t n_predict;
    int32_t n_threads;
    int32_t batch;       // prefill chunk
    bool ignore_eos;
};

static void generate_usage(FILE *fp) {
    fprintf(fp,
            "usage: llmserve generate -m FILE --prompt-ids 1,2,3 [-n N] [options]\n"
            "\n"
            "  -m, --model FILE        GGUF model\n"
            "      --prompt-ids LIST   prompt as comma-separated token ids\n"
            "  -n, --n-predict N       tokens to generate (default 32)\n"
            "  -t, --threads N         kernel threads (default: all cores)\n"
            "  -b, --batch N           prefill chunk in tokens (default 512)\n"
            "      --ignore-eos        do not stop at end-of-generation tokens\n"
            "      --log-level L       error, warn, info, debug (default warn)\n"
            "\n"
            "With --prompt-ids, stdout gets the generated ids on one line; decoding\n"
            "is greedy.\n");
}

static int parse_i32(const char *s, int32_t lo, int32_t hi, int32_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return ERR_INVAL;
    *out = (int32_t)v;
    return 0;
}

/* Parses "1,2,3" into a malloc'd array. */
static int parse_ids(const char *s, int32_t n_vocab, int32_t **out, int32_t *out_n) {
    *out = NULL;
    *out_n = 0;
    size_t cap = 16;
    int32_t n = 0;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    if (!ids) return ERR_NOMEM;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || v < 0 || v >= n_vocab) {
            free(ids);
            return ERR_INVAL;
        }
        if ((size_t)n == cap) {
            cap *= 2;
            int32_t *grown = realloc(ids, cap * sizeof(int32_t));
            if (!grown) {
                free(ids);
                return ERR_NOMEM;
            }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
        } else if (*p) {
            free(ids);
            return ERR_INVAL;
        }
    }
    if (n == 0) {
        free(ids);
        return ERR_INVAL;
    }
    *out = ids;
    *out_n = n;
    return 0;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
        if (x[i] > x[best]) best = i;
    }
    return best;
}

int cmd_generate(int argc, char **argv) {
    struct generate_opts o = {.n_predict = 32, .batch = 512};
    enum { OPT_PROMPT_IDS = 256, OPT_IGNORE_EOS, OPT_LOG_LEVEL };
    static const struct option long_opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompt-ids", required_argument, NULL, OPT_PROMPT_IDS},
        {"n-predict", required_argument, NULL, 'n'},
        {"threads", required_argument, NULL, 't'},
        {"batch", required_argument, NULL, 'b'},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    log_set_level(LOG_LEVEL_WARN);
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:t:b:h", long_opts, NULL)) != -1) {
        int err = 0;
        switch (c) {
        case 'm': o.model = optarg; break;
        case OPT_PROMPT_IDS: o.prompt_ids = optarg; break;
        case 'n': err = parse_i32(optarg, 0, 1 << 24, &o.n_predict); break;
        case 't': err = parse_i32(optarg, 1, 1024, &o.n_threads); break;
        case 'b': err = parse_i32(optarg, 1, 1 << 16, &o.batch); break;
        case OPT_IGNORE_EOS: o.ignore_eos = true; break;
        case OPT_LOG_LEVEL: {
            enum log_level lvl;
            err = log_level_parse(optarg, &lvl);
            if (!err) log_set_level(lvl);
            break;
        }
        case 'h': generate_usage(stdout); return 0;
        default: generate_usage(stderr); return 2;
        }
        if (err) {
            fprintf(stderr, "generate: invalid value '%s' for option %s\n", optarg,
                    argv[optind - 1]);
            return 2;
        }
    }
    if (!o.model || !o.prompt_ids) {
        fprintf(stderr, "generate: -m FILE and --prompt-ids are required\n\n");
        generate_usage(stderr);
        return 2;
    }

    kern_dispatch_init(false);
    const char *blas_core = kern_blas_init();
    int64_t t0 = clock_mono_ns();
    struct engine_model_params mp = engine_model_default_params();
    mp.path = o.model;
    struct engine_model *model = NULL;
    int err = engine_model_load(&mp, &model);
    if (err) {
        fprintf(stderr, "generate: cannot load %s: %s\n", o.model, err_str(err));
        return 1;
    }
    const struct engine_model_info *info = engine_model_get_info(model);
    int64_t t_load = clock_mono_ns() - t0;

    int32_t *prompt = NULL;
    int32_t n_prompt = 0;
    err = parse_ids(o.prompt_ids, info->n_vocab, &prompt, &n_prompt);
    if (err) {
        fprintf(stderr, "generate: --prompt-ids must be comma-separated ids in [0, %d)\n",
                info->n_vocab);
        engine_model_free(model);
        return 2;
    }

    // One sequence: blocks 1..n_need hold positions 0..n_total-1 (block 0 is null).
    struct engine_ctx_params cp = engine_ctx_default_params();
    const int64_t n_total = (int64_t)n_prompt + o.n_predict;
    const int32_t n_need = (int32_t)((n_total + cp.block_size - 1) / cp.block_size);
    cp.n_threads = o.n_threads;
    cp.max_seqs = 1;
    cp.max_outputs = 1;
    cp.max_batch_tokens = o.batch < n_prompt ? o.batch : n_prompt;
    cp.n_blocks = n_need + 1;
    struct engine_ctx *ctx = NULL;
    int32_t *table = malloc((size_t)n_need * sizeof(int32_t));
    int32_t *pos = malloc((size_t)cp.max_batch_tokens * sizeof(int32_t));
    int32_t *seq_idx = calloc((size_t)cp.max_batch_tokens, sizeof(int32_t));
    int8_t *outf = calloc((size_t)cp.max_batch_tokens, 1);
    if (!table || !pos || !seq_idx || !outf) {
        err = ERR_NOMEM;
        goto done;
    }
    err = engine_ctx_create(model, &cp, &ctx);
    if (err) goto done;
    for (int32_t i = 0; i < n_need; i++) table[i] = i + 1;
    struct engine_seq seq = {.block_table = table, .n_blocks = n_need};

    LOG_INFO("model=%s arch=%s type=%s params=%lld blas=%s threads=%d", info->name, info->arch,
             info->weight_type, (long long)info->n_params, blas_core ? blas_core : "?",
             cp.n_threads ? cp.n_threads : 0);

    // Prefill in chunks; only the last prompt token asks for logits.
    const float *logits = NULL;
    int64_t t_prefill0 = clock_mono_ns();
    for (int32_t done_n = 0; done_n < n_prompt;) {
        int32_t n = n_prompt - done_n < cp.max_batch_tokens ? n_prompt - done_n
                                                            : cp.max_batch_tokens;
        for (int32_t i = 0; i < n; i++) {
            pos[i] = done_n + i;
            outf[i] = done_n + i == n_prompt - 1;
        }
        struct engine_batch b = {.n_tokens = n, .token = prompt + done_n, .pos = pos,
                                 .seq = seq_idx, .output = outf, .n_seqs = 1, .seqs = &seq};
        err = engine_forward(ctx, &b, &logits);
        if (err) goto done;
        done_n += n;
    }
    int64_t t_prefill = clock_mono_ns() - t_prefill0;

    // Decode greedily, streaming ids as they come.
    int64_t t_decode0 = clock_mono_ns();
    int32_t n_gen = 0;
    for (; n_gen < o.n_predict; n_gen++) {
        int32_t next = argmax(logits, info->n_vocab);
        printf(n_gen ? " %d" : "%d", next);
        fflush(stdout);
        if (!o.ignore_eos && engine_model_is_eog(model, next)) {
            n_gen++;
            break;
        }
        if (n_gen + 1 == o.n_predict) {
            n_gen++;
            break;
        }
        int32_t p = n_prompt + n_gen;
        int8_t one = 1;
        int32_t zero = 0;
        struct engine_batch b = {.n_tokens = 1, .token = &next, .pos = &p, .seq = &zero,
                                 .output = &one, .n_seqs = 1, .seqs = &seq};
        err = engine_forward(ctx, &b, &logits);
        if (err) goto done;
    }
    printf("\n");
    fflush(stdout);
    int64_t t_decode = clock_mono_ns() - t_decode0;
    fprintf(stderr, "load: %.1f ms\n", (double)t_load / 1e6);
    fprintf(stderr, "prefill: %d tokens in %.1f ms, %.2f tokens/s\n", n_prompt,
            (double)t_prefill / 1e6, n_prompt / ((double)t_prefill / 1e9));
    fprintf(stderr, "decode: %d tokens in %.1f ms, %.2f tokens/s\n", n_gen,
            (double)t_decode / 1e6, n_gen > 1 ? (n_gen - 1) / ((double)t_decode / 1e9) : 0.0);

done:
    if (err) fprintf(stderr, "generate: %s\n", err_str(err));
    engine_ctx_free(ctx);
    free(table);
    free(pos);
    free(seq_idx);
    free(outf);
    free(prompt);
    engine_model_free(model);
    return err ? 1 : 0;
}
