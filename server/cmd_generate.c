/*
 * cmd_generate.c - `llmserve generate`: one sequence through the engine, its
 * prompt prefilled in chunks, then decoded token by token.
 *
 * Contracts (scripts and checks rely on them):
 *   --prompt-ids 1,2,3   stdout gets the generated ids, space-separated, on one
 *                        line (greedy unless --temp is given)
 *   -p TEXT              stdout gets the continuation text (not the prompt), as
 *                        it is generated; never a broken UTF-8 sequence
 * Either way stderr gets load time, prefill and decode tokens/s.
 * The context is --ctx or the model's context_length: a prompt + -n beyond it
 * is an error, as an explicit max_tokens is for serve; the default -n is cut
 * to what is left (serve's rule for an absent max_tokens).
 * --lora NAME=PATH runs the sequence under that adapter (--lora-name picks
 * one when several are given; only the chosen one is loaded).
 */
#define LOG_TAG "generate"
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/buf.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/text/chat.h"
#include "engine/engine.h"
#include "engine/kernels/kernels.h"
#include "engine/text/stop.h"
#include "server/cmd.h"
#include "server/tp.h"

struct generate_opts {
    const char *model;
    const char *prompt_ids;
    const char *prompt;
    bool chat;
    const char *system;
    int32_t n_predict;
    int32_t n_threads;
    int32_t batch;                 // prefill chunk
    int32_t n_ctx;                 // --ctx: most prompt + generated tokens; 0: context_length
    bool has_n_predict;            // -n was given (else the default is cut to the context)
    enum engine_kv_type kv_type;   // --kv-type
    bool ignore_eos;
    bool has_temp;
    struct sampler_params sp;
    const char *stops[STOP_MAX_STRINGS];
    int32_t n_stops;
    const char *lora_specs[16];    // --lora NAME=PATH as given
    int32_t n_loras;
    const char *lora_name;         // --lora-name, or NULL: the only --lora
    int32_t tp;                    // --tp: tensor-parallel ranks (run under mpirun -np N)
    int32_t pp;                    // --pp: pipeline stages (run under mpirun -np N)
    int32_t n_sp;                  // --sp: sequence-parallel ranks (run under mpirun -np N)
    bool is_kv_divided;            // --sp-divide-kv: the KV pool divided over those ranks
};

static void generate_usage(FILE *fp) {
    fprintf(fp,
            "usage: llmserve generate -m FILE (-p TEXT | --prompt-ids 1,2,3) [-n N] [options]\n"
            "\n"
            "  -m, --model FILE          GGUF model\n"
            "  -p, --prompt TEXT         prompt text; the continuation streams to stdout\n"
            "      --chat                render -p as a user message with the model's chat\n"
            "                            template (and --system TEXT as a system message)\n"
            "      --system TEXT         system message for --chat\n"
            "      --prompt-ids LIST     prompt as comma-separated token ids; generated ids go\n"
            "                            to stdout on one line\n"
            "  -n, --n-predict N         tokens to generate (default 32)\n"
            "      --temp T              temperature; 0 = greedy (default 0.8 with -p, 0 with\n"
            "                            --prompt-ids)\n"
            "      --top-k K             keep the K most likely tokens (default 40; 0 = off)\n"
            "      --top-p P             nucleus sampling (default 0.95; 1 = off)\n"
            "      --min-p P             drop tokens below P * p_max (default 0.05; 0 = off)\n"
            "      --repeat-penalty R    repetition penalty over the last 64 tokens (default 1)\n"
            "      --presence-penalty X  OpenAI presence penalty (default 0)\n"
            "      --frequency-penalty X OpenAI frequency penalty (default 0)\n"
            "      --seed S              RNG seed (default: random)\n"
            "      --stop TEXT           stop before this text (repeatable, up to %d)\n"
            "      --ignore-eos          do not stop at end-of-generation tokens\n"
            "      --lora NAME=PATH      an adapter (PEFT dir, GGUF LoRA file, bottleneck dir);\n"
            "                            repeatable, the sequence runs under --lora-name's\n"
            "      --lora-name NAME      which --lora to use (default: the only one)\n"
            "  -t, --threads N           kernel threads (default: all cores)\n"
            "      --tp N                split the model over N ranks of mpirun -np N (default 1;\n"
            "                            docs/parallelism.md)\n"
            "      --pp N                split the layers into N stages (default 1): mpirun\n"
            "                            -np N, or -np T x N with --tp T\n"
            "      --sp N                split each step's tokens over N ranks of mpirun -np N,\n"
            "                            each with the whole model (default 1; not with --tp,\n"
            "                            --pp)\n"
            "      --sp-divide-kv        with --sp N: the KV cache divided over the N ranks\n"
            "  -b, --batch N             prefill chunk in tokens (default 512)\n"
            "  -c, --ctx N               most tokens, prompt + generated (default: the model's\n"
            "                            context_length); more is an error\n"
            "      --kv-type TYPE        KV cache storage: f16 (default), f32 or q8_0\n"
            "      --log-level L         error, warn, info, debug (default warn)\n",
            STOP_MAX_STRINGS);
}

static int parse_i32(const char *s, int32_t lo, int32_t hi, int32_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return ERR_INVAL;
    *out = (int32_t)v;
    return 0;
}

static int parse_f32(const char *s, float *out) {
    char *end = NULL;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return ERR_INVAL;
    *out = v;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return ERR_INVAL;
    *out = v;
    return 0;
}

/* Parses "1,2,3" into a malloc'd array of ids in [0, n_vocab). */
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
        if (errno || end == p || v < 0 || v >= n_vocab) goto bad;
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
            if (!*p) goto bad;
        } else if (*p) {
            goto bad;
        }
    }
    if (n == 0) goto bad;
    *out = ids;
    *out_n = n;
    return 0;
bad:
    free(ids);
    return ERR_INVAL;
}

/* Builds the prompt token ids from -p (plain or --chat). */
static int text_prompt(const struct engine_model *model, const struct generate_opts *o,
                       int32_t **out, int32_t *out_n) {
    const struct tokenizer *tok = engine_model_tokenizer(model);
    if (!tok) {
        fprintf(stderr, "generate: the model has no tokenizer; use --prompt-ids\n");
        return ERR_INVAL;
    }
    size_t len = strlen(o->prompt);
    if (!o->chat) {
        int err = tokenizer_encode(tok, o->prompt, len, true, false, out, out_n);
        if (err == ERR_INVAL) fprintf(stderr, "generate: the prompt is not valid UTF-8\n");
        return err;
    }
    const char *tmpl = engine_model_chat_template(model);
    enum chat_family fam = CHAT_FAMILY_FALLBACK;
    int err = chat_detect(tmpl, tmpl ? strlen(tmpl) : 0, &fam);
    if (err == ERR_UNSUPPORTED) {
        fprintf(stderr, "generate: the model's chat template is not one llmserve can render\n");
        return err;
    }
    struct chat_message msgs[2];
    int32_t n_msgs = 0;
    if (o->system) msgs[n_msgs++] = (struct chat_message){.role = "system", .content = o->system};
    msgs[n_msgs++] = (struct chat_message){.role = "user", .content = o->prompt};
    struct chat_render_params rp = chat_render_default_params();
    int32_t bos = tokenizer_bos(tok);
    int32_t eos = tokenizer_eos(tok);
    rp.bos_text = bos >= 0 ? tokenizer_token_text(tok, bos) : NULL;
    rp.eos_text = eos >= 0 ? tokenizer_token_text(tok, eos) : NULL;
    struct buf text = {0};
    bool has_bos = false;
    char msg[256];
    err = chat_render(fam, msgs, n_msgs, &rp, &text, &has_bos, msg, sizeof(msg));
    if (err) {
        fprintf(stderr, "generate: cannot render the chat prompt: %s\n", msg);
        buf_free(&text);
        return err;
    }
    LOG_INFO("chat template family=%s", chat_family_name(fam));
    err = tokenizer_encode(tok, text.data, text.len, !has_bos, true, out, out_n);
    if (err == ERR_INVAL) fprintf(stderr, "generate: the prompt is not valid UTF-8\n");
    buf_free(&text);
    return err;
}

static void write_out(const struct buf *b) {
    if (b->len) {
        fwrite(b->data, 1, b->len, stdout);
        fflush(stdout);
    }
}

enum {
    OPT_PROMPT_IDS = 256, OPT_TP, OPT_PP, OPT_SP, OPT_SP_DIVIDE_KV, OPT_KV_TYPE, OPT_IGNORE_EOS, OPT_LOG_LEVEL, OPT_CHAT, OPT_SYSTEM, OPT_TEMP,
    OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REPEAT, OPT_PRESENCE, OPT_FREQUENCY, OPT_SEED,
    OPT_STOP, OPT_LORA, OPT_LORA_NAME,
};

static const struct option long_opts[] = {
    {"model", required_argument, NULL, 'm'},
    {"prompt", required_argument, NULL, 'p'},
    {"prompt-ids", required_argument, NULL, OPT_PROMPT_IDS},
    {"chat", no_argument, NULL, OPT_CHAT},
    {"system", required_argument, NULL, OPT_SYSTEM},
    {"n-predict", required_argument, NULL, 'n'},
    {"temp", required_argument, NULL, OPT_TEMP},
    {"top-k", required_argument, NULL, OPT_TOP_K},
    {"top-p", required_argument, NULL, OPT_TOP_P},
    {"min-p", required_argument, NULL, OPT_MIN_P},
    {"repeat-penalty", required_argument, NULL, OPT_REPEAT},
    {"presence-penalty", required_argument, NULL, OPT_PRESENCE},
    {"frequency-penalty", required_argument, NULL, OPT_FREQUENCY},
    {"seed", required_argument, NULL, OPT_SEED},
    {"stop", required_argument, NULL, OPT_STOP},
    {"lora", required_argument, NULL, OPT_LORA},
    {"lora-name", required_argument, NULL, OPT_LORA_NAME},
    {"threads", required_argument, NULL, 't'},
    {"tp", required_argument, NULL, OPT_TP},
    {"pp", required_argument, NULL, OPT_PP},
    {"sp", required_argument, NULL, OPT_SP},
    {"sp-divide-kv", no_argument, NULL, OPT_SP_DIVIDE_KV},
    {"ctx", required_argument, NULL, 'c'},
    {"kv-type", required_argument, NULL, OPT_KV_TYPE},
    {"batch", required_argument, NULL, 'b'},
    {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Reads the flags into *o over its defaults. Returns -1 to go on, else the
 * exit code: 0 after --help, 2 after a message on stderr. */
static int parse_opts(int argc, char **argv, struct generate_opts *o) {
    *o = (struct generate_opts){.n_predict = 32, .batch = 512, .kv_type = ENGINE_KV_TYPE_F16,
                                .tp = 1, .pp = 1, .n_sp = 1};
    o->sp = sampler_default_params();
    o->sp.top_k = 40;
    o->sp.top_p = 0.95f;
    o->sp.min_p = 0.05f;
    o->sp.temperature = 0.8f;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:b:c:h", long_opts, NULL)) != -1) {
        int err = 0;
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': o->prompt = optarg; break;
        case OPT_PROMPT_IDS: o->prompt_ids = optarg; break;
        case OPT_CHAT: o->chat = true; break;
        case OPT_SYSTEM: o->system = optarg; break;
        case 'n':
            err = parse_i32(optarg, 0, 1 << 24, &o->n_predict);
            o->has_n_predict = true;
            break;
        case 'c': err = parse_i32(optarg, 1, 1 << 24, &o->n_ctx); break;
        case OPT_KV_TYPE:
            err = engine_kv_type_parse(optarg, &o->kv_type);
            if (err) {
                fprintf(stderr, "generate: --kv-type: '%s' is not one of f32, f16, q8_0\n", optarg);
                return 2;
            }
            break;
        case OPT_TEMP:
            err = parse_f32(optarg, &o->sp.temperature);
            o->has_temp = true;
            break;
        case OPT_TOP_K: err = parse_i32(optarg, 0, 1 << 30, &o->sp.top_k); break;
        case OPT_TOP_P: err = parse_f32(optarg, &o->sp.top_p); break;
        case OPT_MIN_P: err = parse_f32(optarg, &o->sp.min_p); break;
        case OPT_REPEAT: err = parse_f32(optarg, &o->sp.repetition_penalty); break;
        case OPT_PRESENCE: err = parse_f32(optarg, &o->sp.presence_penalty); break;
        case OPT_FREQUENCY: err = parse_f32(optarg, &o->sp.frequency_penalty); break;
        case OPT_SEED:
            err = parse_u64(optarg, &o->sp.seed);
            o->sp.has_seed = true;
            break;
        case OPT_STOP:
            if (o->n_stops == STOP_MAX_STRINGS) {
                fprintf(stderr, "generate: at most %d --stop strings\n", STOP_MAX_STRINGS);
                return 2;
            }
            o->stops[o->n_stops++] = optarg;
            break;
        case OPT_LORA:
            if (o->n_loras == 16) {
                fprintf(stderr, "generate: at most 16 --lora adapters\n");
                return 2;
            }
            if (!strchr(optarg, '=') || optarg[0] == '=' || !strchr(optarg, '=')[1]) err = ERR_INVAL;
            else o->lora_specs[o->n_loras++] = optarg;
            break;
        case OPT_LORA_NAME: o->lora_name = optarg; break;
        case 't': err = parse_i32(optarg, 1, 1024, &o->n_threads); break;
        case OPT_TP: err = parse_i32(optarg, 1, 1024, &o->tp); break;
        case OPT_PP: err = parse_i32(optarg, 1, 1024, &o->pp); break;
        case OPT_SP: err = parse_i32(optarg, 1, 1024, &o->n_sp); break;
        case OPT_SP_DIVIDE_KV: o->is_kv_divided = true; break;
        case 'b': err = parse_i32(optarg, 1, 1 << 16, &o->batch); break;
        case OPT_IGNORE_EOS: o->ignore_eos = true; break;
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
    if (optind < argc) {
        fprintf(stderr, "generate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return -1;
}

/* The flags' combinations, and the adapter's path in *lora_path (NULL: none):
 * --lora-name's entry, or the only --lora. Returns 0, or 2 after a message. */
static int check_opts(struct generate_opts *o, const char **lora_path) {
    if (!o->model || (!o->prompt_ids == !o->prompt)) {
        fprintf(stderr, "generate: -m FILE and one of -p TEXT or --prompt-ids are required\n\n");
        generate_usage(stderr);
        return 2;
    }
    if (o->chat && !o->prompt) {
        fprintf(stderr, "generate: --chat needs -p TEXT\n");
        return 2;
    }
    *lora_path = NULL;
    for (int32_t i = 0; i < o->n_loras; i++) {
        const char *eq = strchr(o->lora_specs[i], '=');
        if (!o->lora_name ? o->n_loras == 1
                          : strlen(o->lora_name) == (size_t)(eq - o->lora_specs[i]) &&
                                strncmp(o->lora_name, o->lora_specs[i], strlen(o->lora_name)) == 0)
            *lora_path = eq + 1;
    }
    if ((o->n_loras > 1 || o->lora_name) && !*lora_path) {
        fprintf(stderr, o->lora_name ? "generate: --lora-name %s names no --lora\n"
                                     : "generate: several --lora given: choose one with --lora-name\n",
                o->lora_name);
        return 2;
    }
    if (!o->prompt && !o->has_temp) o->sp.temperature = 0.0f;
    char msg[256];
    if (stop_matcher_validate(o->stops, o->n_stops, msg, sizeof(msg)) != 0) {
        fprintf(stderr, "generate: %s\n", msg);
        return 2;
    }
    return 0;
}

/* One run's state. Every pointer is owned (release with run_free()) except
 * where marked. */
struct generate_run {
    struct comm *comm;               // tensor parallelism: the job's ranks; NULL: one process
    bool are_ranks_waiting;          // rank 0 of several, before its ctx exists: the other
                                     //   ranks wait for it, so a failure must end them too
    struct engine_model *model;
    const struct tokenizer *tok;     // borrowed from model
    int32_t n_vocab;
    int32_t *prompt;
    int32_t n_prompt;
    struct engine_ctx *ctx;
    struct engine_adapter *adapter;
    struct sampler *smp;
    struct sampler_scratch *sc;
    struct stop_matcher *stop;       // NULL: no --stop
    int32_t max_batch_tokens;        // prefill chunk
    int32_t *table;                  // [n_blocks of seq]: blocks 1..n
    int32_t *pos;                    // [max_batch_tokens]
    int32_t *seq_idx;                // [max_batch_tokens], all zero
    int8_t *outf;                    // [max_batch_tokens]
    struct engine_seq seq;
    struct buf text;                 // a token's decoded text
    struct buf emit;                 // what the stop matcher lets out
};

static void run_free(struct generate_run *g) {
    buf_free(&g->text);
    buf_free(&g->emit);
    stop_matcher_free(g->stop);
    sampler_scratch_free(g->sc);
    sampler_free(g->smp);
    engine_ctx_free(g->ctx);
    engine_adapter_release(g->adapter);
    free(g->table);
    free(g->pos);
    free(g->seq_idx);
    free(g->outf);
    free(g->prompt);
    engine_model_free(g->model);
    comm_close(g->comm);
}

/* The prompt ids from -p or --prompt-ids, and the sampler parameters checked
 * against the vocabulary. Returns 0, or 2 after a message. */
static int run_prompt(struct generate_run *g, const struct generate_opts *o) {
    if (o->prompt) {
        if (g->n_prompt == 0) {
            fprintf(stderr, "generate: the prompt is empty and the model adds no BOS token\n");
            return 2;
        }
    } else if (parse_ids(o->prompt_ids, g->n_vocab, &g->prompt, &g->n_prompt) != 0) {
        fprintf(stderr, "generate: --prompt-ids must be comma-separated ids in [0, %d)\n",
                g->n_vocab);
        return 2;
    }
    char msg[256];
    if (sampler_params_validate(&o->sp, g->n_vocab, msg, sizeof(msg)) != 0) {
        fprintf(stderr, "generate: %s\n", msg);
        return 2;
    }
    return 0;
}

/* The context for one sequence (blocks 1..n_need hold positions
 * 0..n_total-1; block 0 is null), the buffers, the sampler, the stop matcher
 * and the adapter. o->n_predict may be cut to the context. Returns 0, 2 after
 * a message (the request does not fit), 1 after a message (the adapter), or
 * an ERR_* code. */
static int run_setup(struct generate_run *g, struct generate_opts *o, int32_t n_ctx_train,
                     const char *lora_path) {
    struct engine_ctx_params cp = engine_ctx_default_params();
    // The context: --ctx, else the model's; the default -n is cut to fit.
    const int32_t n_ctx = o->n_ctx > 0 ? o->n_ctx : n_ctx_train;
    const int32_t n_prompt = g->n_prompt;
    if (!o->has_n_predict && n_prompt < n_ctx && n_prompt + o->n_predict > n_ctx) {
        o->n_predict = n_ctx - n_prompt;
    }
    if ((int64_t)n_prompt + (o->n_predict > 0 ? o->n_predict : 1) > n_ctx) {
        fprintf(stderr, "generate: the context is %d tokens (%s), but the prompt has %d and "
                "-n asks for %d more: shorten the prompt, lower -n or raise --ctx\n",
                (int)n_ctx, o->n_ctx > 0 ? "--ctx" : "the model's context_length", (int)n_prompt,
                (int)o->n_predict);
        return 2;
    }
    const int64_t n_total = (int64_t)n_prompt + o->n_predict;
    if (n_total > (int64_t)1 << 30) {
        fprintf(stderr, "generate: prompt + n-predict is too long\n");
        return 2;
    }
    const int32_t n_need = (int32_t)((n_total + cp.block_size - 1) / cp.block_size);
    cp.n_threads = o->n_threads;
    cp.max_seqs = 1;
    cp.max_outputs = 1;
    cp.max_batch_tokens = o->batch < n_prompt ? o->batch : n_prompt;
    cp.n_blocks = n_need + 1;
    if (o->is_kv_divided) {  // the ids 1..n_need fall on the ranks in turn
        cp.kv_divided = true;
        cp.n_blocks = (n_need + o->n_sp) / o->n_sp * o->n_sp;
    }
    cp.kv_type = o->kv_type;
    cp.max_adapters = lora_path ? 1 : 0;
    cp.comm = g->comm;
    g->max_batch_tokens = cp.max_batch_tokens;
    g->table = malloc((size_t)n_need * sizeof(int32_t));
    g->pos = malloc((size_t)cp.max_batch_tokens * sizeof(int32_t));
    g->seq_idx = calloc((size_t)cp.max_batch_tokens, sizeof(int32_t));
    g->outf = calloc((size_t)cp.max_batch_tokens, 1);
    g->smp = sampler_create(&o->sp, g->n_vocab);
    g->sc = sampler_scratch_create(g->n_vocab);
    if (!g->table || !g->pos || !g->seq_idx || !g->outf || !g->smp || !g->sc) return ERR_NOMEM;
    if (o->n_stops && stop_matcher_create(o->stops, o->n_stops, false, &g->stop) != 0) {
        return ERR_NOMEM;
    }
    g->are_ranks_waiting = false;  // the ctx's creation answers them, whatever its outcome
    int err = engine_ctx_create(g->model, &cp, &g->ctx);
    if (err) return err;
    if (lora_path) {
        int64_t t_lora0 = clock_mono_ns();
        err = engine_adapter_load(g->model, lora_path, &g->adapter);
        if (err) {
            fprintf(stderr, "generate: cannot load the adapter %s: %s\n", lora_path, err_str(err));
            return 1;
        }
        err = engine_ctx_set_adapter(g->ctx, 0, g->adapter);
        if (err) return err;
        const struct engine_adapter_info *ai = engine_adapter_get_info(g->adapter);
        LOG_INFO("adapter path=%s format=%s rank=%d scale=%g load_ms=%.1f", lora_path, ai->format,
                 (int)ai->rank, (double)ai->scale, (double)(clock_mono_ns() - t_lora0) / 1e6);
    }
    for (int32_t i = 0; i < n_need; i++) g->table[i] = i + 1;
    for (int32_t i = 0; i < n_prompt; i++) sampler_accept(g->smp, g->prompt[i], true);
    g->seq = (struct engine_seq){.block_table = g->table, .n_blocks = n_need};
    return 0;
}

/* Prefills the prompt in chunks; only the last prompt token asks for logits
 * (*logits, valid until the next engine_forward()). */
static int run_prefill(struct generate_run *g, const float **logits) {
    // Every token runs in slot 0 (the adapter) or none: seq_idx is all zeros.
    const int32_t *adapter_slots = g->adapter ? g->seq_idx : NULL;
    for (int32_t done_n = 0; done_n < g->n_prompt;) {
        int32_t n = g->n_prompt - done_n < g->max_batch_tokens ? g->n_prompt - done_n
                                                               : g->max_batch_tokens;
        for (int32_t i = 0; i < n; i++) {
            g->pos[i] = done_n + i;
            g->outf[i] = done_n + i == g->n_prompt - 1;
        }
        struct engine_batch b = {.n_tokens = n, .token = g->prompt + done_n, .pos = g->pos,
                                 .seq = g->seq_idx, .adapter = adapter_slots, .output = g->outf,
                                 .n_seqs = 1, .seqs = &g->seq};
        int err = engine_forward(g->ctx, &b, logits);
        if (err) return err;
        done_n += n;
    }
    return 0;
}

/* Writes one generated token to stdout: its id, or its text through the stop
 * matcher. Returns whether a stop string ended the output. */
static bool emit_token(struct generate_run *g, struct tokenizer_stream *ts, bool text_mode,
                       bool eog, int32_t next, int32_t n_gen) {
    if (!text_mode) {
        printf(n_gen > 1 ? " %d" : "%d", next);
        fflush(stdout);
        return false;
    }
    if (eog) return false;
    buf_reset(&g->text);
    tokenizer_stream_feed(g->tok, ts, next, &g->text);
    if (!g->stop) {
        write_out(&g->text);
        return false;
    }
    buf_reset(&g->emit);
    bool stopped = stop_matcher_feed(g->stop, g->text.data ? g->text.data : "", g->text.len,
                                     &g->emit);
    write_out(&g->emit);
    return stopped;
}

/* Decodes from the prefill's logits, streaming ids or text as they come,
 * until -n tokens, an end-of-generation token or a stop string; *n_gen
 * counts the sampled tokens. */
static int run_decode(struct generate_run *g, const struct generate_opts *o, const float *logits,
                      int32_t *n_gen) {
    const bool text_mode = o->prompt != NULL;
    struct tokenizer_stream ts;
    tokenizer_stream_init_after(&ts, g->tok, g->prompt, g->n_prompt, true);  // text after the prompt's
    bool stopped = false;
    *n_gen = 0;
    while (*n_gen < o->n_predict && !stopped) {
        int32_t next = sampler_sample(g->smp, g->sc, logits, NULL);
        (*n_gen)++;
        bool eog = !o->ignore_eos && engine_model_is_eog(g->model, next);
        stopped = emit_token(g, &ts, text_mode, eog, next, *n_gen);
        if (eog || stopped || *n_gen == o->n_predict) break;
        int32_t p = g->n_prompt + *n_gen - 1;
        int8_t one = 1;
        int32_t zero = 0;
        struct engine_batch b = {.n_tokens = 1, .token = &next, .pos = &p, .seq = &zero,
                                 .adapter = g->adapter ? &zero : NULL, .output = &one,
                                 .n_seqs = 1, .seqs = &g->seq};
        int err = engine_forward(g->ctx, &b, &logits);
        if (err) return err;
    }
    if (text_mode && !stopped) {
        buf_reset(&g->text);
        tokenizer_stream_flush(g->tok, &ts, &g->text);
        if (g->stop) {
            buf_reset(&g->emit);
            stop_matcher_feed(g->stop, g->text.data ? g->text.data : "", g->text.len, &g->emit);
            stop_matcher_flush(g->stop, &g->emit);
            write_out(&g->emit);
        } else {
            write_out(&g->text);
        }
    }
    printf("\n");
    fflush(stdout);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    struct generate_opts o;
    log_set_level(LOG_LEVEL_WARN);
    int code = parse_opts(argc, argv, &o);
    if (code >= 0) return code;
    const char *lora_path = NULL;
    code = check_opts(&o, &lora_path);
    if (code) return code;
    if (o.n_sp > 1 && (o.tp > 1 || o.pp > 1)) {
        fprintf(stderr, "generate: --sp goes with neither --tp nor --pp\n");
        return 2;
    }
    if (o.is_kv_divided && o.n_sp < 2) {
        fprintf(stderr, "generate: --sp-divide-kv needs --sp N with N >= 2\n");
        return 2;
    }
    if ((int64_t)o.tp * o.pp > 1024) {
        fprintf(stderr, "generate: --tp %d x --pp %d is over 1024 ranks\n", (int)o.tp, (int)o.pp);
        return 2;
    }

    kern_dispatch_init(false);
    const char *blas_core = kern_blas_init();
    int64_t t0 = clock_mono_ns();
    struct generate_run g = {0};
    int err = tp_open(o.tp * o.pp * o.n_sp, &g.comm);
    if (err) return 1;
    err = tp_load_model(g.comm, o.model, o.pp, o.n_sp, &g.model);
    if (err) {
        fprintf(stderr, "generate: cannot load %s: %s\n", o.model, err_str(err));
        run_free(&g);
        return 1;
    }
    if (comm_rank(g.comm) > 0) {  // tensor parallelism: this rank only follows rank 0
        code = tp_follow(g.comm, g.model, o.n_threads);
        run_free(&g);
        return code;
    }
    g.are_ranks_waiting = comm_size(g.comm) > 1;
    const struct engine_model_info *info = engine_model_get_info(g.model);
    g.tok = engine_model_tokenizer(g.model);
    g.n_vocab = info->n_vocab;
    int64_t t_load = clock_mono_ns() - t0;

    code = 1;
    if (o.prompt) {
        err = text_prompt(g.model, &o, &g.prompt, &g.n_prompt);
        if (err) {
            code = 2;
            goto done;
        }
    }
    int status = run_prompt(&g, &o);
    if (status == 0) status = run_setup(&g, &o, info->n_ctx_train, lora_path);
    if (status > 0) {
        code = status;
        goto done;
    }
    err = status;
    if (err) goto done;

    LOG_INFO("model=%s arch=%s type=%s params=%lld blas=%s isa=%s", info->name, info->arch,
             info->weight_type, (long long)info->n_params, blas_core ? blas_core : "?",
             kern_get()->isa);
    const float *logits = NULL;
    int64_t t_prefill0 = clock_mono_ns();
    err = run_prefill(&g, &logits);
    if (err) goto done;
    int64_t t_prefill = clock_mono_ns() - t_prefill0;
    int64_t t_decode0 = clock_mono_ns();
    int32_t n_gen = 0;
    err = run_decode(&g, &o, logits, &n_gen);
    if (err) goto done;
    int64_t t_decode = clock_mono_ns() - t_decode0;
    fprintf(stderr, "load: %.1f ms\n", (double)t_load / 1e6);
    fprintf(stderr, "prefill: %d tokens in %.1f ms, %.2f tokens/s\n", g.n_prompt,
            (double)t_prefill / 1e6, g.n_prompt / ((double)t_prefill / 1e9));
    // The first generated token came from the prefill's logits.
    fprintf(stderr, "decode: %d tokens in %.1f ms, %.2f tokens/s\n", n_gen,
            (double)t_decode / 1e6, n_gen > 1 ? (n_gen - 1) / ((double)t_decode / 1e9) : 0.0);
    fprintf(stderr, "memory: peak RSS %.1f MiB\n", tp_peak_rss_mib());
    if (g.comm) {
        fprintf(stderr,
                "mpi: %d ranks (tp %d, pp %d, sp %d), rank 0 handed %llu bytes to collectives\n",
                (int)comm_size(g.comm), (int)o.tp, (int)o.pp, (int)o.n_sp,
                (unsigned long long)comm_bytes_sent(g.comm));
    }
    code = 0;

done:
    if (err) fprintf(stderr, "generate: %s\n", err_str(err));
    if (g.are_ranks_waiting) tp_fail(g.comm, code, "generate stopped before its first step");
    run_free(&g);
    return code;
}
