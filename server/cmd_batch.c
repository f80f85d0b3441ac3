/*
 * cmd_batch.c - `llmserve batch -m FILE --prompts FILE.jsonl`: many
 * completion requests through the scheduler at once (in-flight batching),
 * for throughput measurements and batch-invariance checks.
 *
 * Contracts (scripts/bench-batch relies on them):
 *   stdout: one JSON object per input line, in input order:
 *           {"index", "text", "token_ids", "finish_reason", "ttft_ms"}
 *           (finish_reason "stop" / "length"; ttft_ms from submit to first token),
 *           or {"index", "error"} for a line that could not be run.
 *   stderr: one summary line "batch: requests=N generated=N wall_s=S tok_s=T decode_tok_s=D
 *           prompt_tokens=N prefix_hit_tokens=N preemptions=N ..."; tok_s counts every
 *           generated token over the whole run, decode_tok_s the tokens after each
 *           request's first over the time after the last request got its first.
 * A line's "model" names an adapter given with --lora NAME=PATH (absent or
 * the model's own name: the base model; anything else: an error line).
 * Under `mpirun -np N` with --tp, --pp or --sp (docs/parallelism.md) the
 * model is split as for serve; rank 0 reads the prompts, runs the scheduler
 * and prints, the others follow its steps.
 * Requests are submitted --arrival-ms apart (0: all at once). The step loop
 * runs on the main thread (scheduler_step): the tool needs no second thread,
 * and arrivals land between steps exactly when due.
 */
#define LOG_TAG "batch"
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "engine/base/alloc.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/file.h"
#include "engine/base/log.h"
#include "engine/base/progress.h"
#include "engine/engine.h"
#include "engine/text/gbnf.h"
#include "scheduler/scheduler.h"
#include "server/cmd.h"
#include "server/draft_model.h"
#include "server/tp.h"
#include "server/openai.h"

#define BATCH_MAX_FILE_BYTES ((size_t)1 << 30)
#define BATCH_MAX_STOPS STOP_MAX_STRINGS  // the scheduler validates the list
#define BATCH_MAX_LORAS 256

/* The adapters of --lora, loaded before the lines are read. */
struct batch_loras {
    const char *names[BATCH_MAX_LORAS];         // borrowed from argv, cut at '='
    size_t name_lens[BATCH_MAX_LORAS];
    const char *paths[BATCH_MAX_LORAS];         // borrowed from argv
    struct engine_adapter *adapters[BATCH_MAX_LORAS];  // owned references
    int32_t n;
    const char *base_name;                      // the model's id: the file's name without
                                                //    .gguf, as serve names it (borrowed)
    const char *gguf_name;                      // general.name, also taken (borrowed)
};

struct batch_line {
    int32_t *prompt;                        // owned
    int32_t n_prompt;
    struct scheduler_request req;
    char *stops[BATCH_MAX_STOPS];          // owned
    char error[256];                        // non-empty: the line failed
    struct channel *channel;                // consumer reference, NULL if not submitted
    int64_t t_submit_ns;
    double ttft_ms;                         // -1 until the first token
};

static void batch_usage(FILE *fp) {
    fprintf(fp,
            "usage: llmserve batch -m FILE --prompts FILE.jsonl [options]\n"
            "\n"
            "  -m, --model FILE           GGUF model\n"
            "      --prompts FILE         JSON lines: prompt (string or token ids), max_tokens (16),\n"
            "                             temperature (1.0; 0 = greedy), top_p, top_k, min_p, seed,\n"
            "                             stop, presence_penalty, frequency_penalty,\n"
            "                             repetition_penalty, ignore_eos, grammar (GBNF),\n"
            "                             response_format (json_object, json_schema)\n"
            "      --arrival-ms N         submit requests N ms apart (default 0)\n"
            "      --kv-memory MIB        KV cache budget in MiB (default 256)\n"
            "      --kv-blocks N          KV cache size in blocks (overrides --kv-memory)\n"
            "      --block-size N         tokens per KV block (default 16)\n"
            "      --max-seqs N           running sequences at most (default 64)\n"
            "      --max-batch-tokens N   tokens per step (default 2048)\n"
            "      --prefill-chunk N      prefill tokens of a step beside decodes (default 256, 0 = no limit)\n"
            "      --step-ratio PCT       a step with prompt work costs at most PCT%% of a decode step\n"
            "                             of every sequence present (default 125, 0 = off)\n"
            "      --draft-n N            speculative decoding: up to N prompt-lookup draft tokens per\n"
            "                             step at batch <= 4 (default 0 = off, at most 16)\n"
            "      --draft-model FILE     speculative decoding with drafts from FILE, a smaller model\n"
            "                             of the same vocabulary (greedy, sampled for unseeded\n"
            "                             sampling lines; --draft-n default 4)\n"
            "      --draft-kv-blocks N    the draft model's KV pool, null block included (tests;\n"
            "                             default: 4 sequences of the context, at most half of\n"
            "                             --kv-memory, which the model's pool then has less of)\n"
            "      --draft-always         draft even where it does not pay (default: only while\n"
            "                             steps with drafts emit tokens faster than without)\n"
            "      --no-prefix-cache      disable automatic prefix caching\n"
            "      --lora NAME=PATH       an adapter a line selects with \"model\": \"NAME\"\n"
            "                             (repeatable)\n"
            "      --max-loras N          adapter slots: distinct adapters batched at once (8)\n"
            "      --tp N, --pp N, --sp N tensor, pipeline or sequence parallelism over the ranks\n"
            "                             of mpirun -np (docs/parallelism.md; default 1)\n"
            "      --sp-divide-kv         with --sp N: the KV cache divided over the N ranks\n"
            "                             (--kv-memory each, N times the blocks in all)\n"
            "  -c, --ctx N                most tokens of one request, prompt + max_tokens\n"
            "                             (default: the model's context_length); a line asking\n"
            "                             for more gets an error\n"
            "      --kv-type TYPE         KV cache storage: f16 (default), f32 or q8_0\n"
            "  -t, --threads N            kernel threads (default: all cores)\n");
}

static bool parse_i32(const char *s, int32_t lo, int32_t hi, int32_t *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    *out = (int32_t)v;
    return true;
}

static bool get_number(json_t *o, const char *key, double *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return false;
    if (!json_is_number(v)) return false;
    *out = json_number_value(v);
    return true;
}

/* Fills l from one JSON line; on failure writes l->error. */
static void parse_line(const struct tokenizer *tok, int32_t n_vocab, const struct batch_loras *lo,
                       const char *text, size_t len, struct batch_line *l) {
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je);
    l->req = scheduler_default_request();
    l->req.sampling.temperature = 1.0f;
    if (!o || !json_is_object(o)) {
        snprintf(l->error, sizeof(l->error), "invalid JSON: %s", o ? "not an object" : je.text);
        json_decref(o);
        return;
    }
    json_t *p = json_object_get(o, "prompt");
    if (json_is_string(p)) {
        int err = tokenizer_encode(tok, json_string_value(p), json_string_length(p), true, false,
                                   &l->prompt, &l->n_prompt);
        if (err) snprintf(l->error, sizeof(l->error), "prompt: %s", err_str(err));
    } else if (json_is_array(p) && json_array_size(p) > 0 && json_array_size(p) < (1u << 24)) {
        l->n_prompt = (int32_t)json_array_size(p);
        l->prompt = xmalloc((size_t)l->n_prompt * sizeof(int32_t));
        for (int32_t i = 0; i < l->n_prompt; i++) {
            json_t *v = json_array_get(p, (size_t)i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= n_vocab) {
                snprintf(l->error, sizeof(l->error), "prompt[%d]: not a token id", (int)i);
                break;
            }
            l->prompt[i] = (int32_t)json_integer_value(v);
        }
    } else {
        snprintf(l->error, sizeof(l->error), "prompt: a string or a non-empty array of token ids");
    }
    if (!l->error[0] && l->n_prompt < 1)
        snprintf(l->error, sizeof(l->error), "prompt: no tokens");
    double d;
    struct sampler_params *sp = &l->req.sampling;
    if (get_number(o, "max_tokens", &d)) {
        if (d < 1 || d > 1e7) snprintf(l->error, sizeof(l->error), "max_tokens: out of range");
        else l->req.max_tokens = (int32_t)d;
    }
    if (get_number(o, "temperature", &d)) sp->temperature = (float)d;
    if (get_number(o, "top_p", &d)) sp->top_p = (float)d;
    if (get_number(o, "top_k", &d)) sp->top_k = d > 1e9 ? 0 : (int32_t)d;
    if (get_number(o, "min_p", &d)) sp->min_p = (float)d;
    if (get_number(o, "presence_penalty", &d)) sp->presence_penalty = (float)d;
    if (get_number(o, "frequency_penalty", &d)) sp->frequency_penalty = (float)d;
    if (get_number(o, "repetition_penalty", &d)) sp->repetition_penalty = (float)d;
    json_t *seed = json_object_get(o, "seed");
    if (json_is_integer(seed)) {
        sp->seed = (uint64_t)json_integer_value(seed);
        sp->has_seed = true;
    }
    l->req.ignore_eos = json_is_true(json_object_get(o, "ignore_eos"));
    json_t *model = json_object_get(o, "model");
    if (json_is_string(model) && strcmp(json_string_value(model), lo->base_name) != 0 &&
        strcmp(json_string_value(model), lo->gguf_name) != 0) {
        const char *name = json_string_value(model);
        for (int32_t i = 0; i < lo->n; i++)
            if (strlen(name) == lo->name_lens[i] && strncmp(name, lo->names[i], lo->name_lens[i]) == 0)
                l->req.adapter = lo->adapters[i];  // borrowed: batch_loras outlives the run
        if (!l->req.adapter)
            snprintf(l->error, sizeof(l->error), "model: '%.128s' is neither the model nor a --lora",
                     name);
    } else if (model && !json_is_null(model) && !json_is_string(model)) {
        snprintf(l->error, sizeof(l->error), "model: not a string");
    }
    json_t *stop = json_object_get(o, "stop");
    int32_t n_stop = 0;
    if (json_is_string(stop)) {
        l->stops[n_stop++] = xstrdup(json_string_value(stop));
    } else if (json_is_array(stop)) {
        if (json_array_size(stop) > BATCH_MAX_STOPS) {
            snprintf(l->error, sizeof(l->error), "stop: at most %d strings", BATCH_MAX_STOPS);
        } else {
            for (size_t i = 0; i < json_array_size(stop); i++) {
                json_t *v = json_array_get(stop, i);
                if (!json_is_string(v)) {
                    snprintf(l->error, sizeof(l->error), "stop[%zu]: not a string", i);
                    break;
                }
                l->stops[n_stop++] = xstrdup(json_string_value(v));
            }
        }
    } else if (stop && !json_is_null(stop)) {
        snprintf(l->error, sizeof(l->error), "stop: a string or an array of strings");
    }
    struct openai_error ge;
    if (!l->error[0] && openai_parse_grammar(o, &l->req.grammar, &ge))
        snprintf(l->error, sizeof(l->error), "%s: %.200s", ge.param ? ge.param : "grammar", ge.message);
    l->req.stop = (const char *const *)l->stops;
    l->req.n_stop = n_stop;
    l->req.prompt = l->prompt;
    l->req.n_prompt = l->n_prompt;
    json_decref(o);
}

static void print_result(int64_t index, struct batch_line *l, struct channel_output *out) {
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(index));
    if (l->error[0]) {
        json_object_set_new(o, "error", json_string(l->error));
    } else {
        json_object_set_new(o, "text", json_stringn(out->text ? out->text : "", out->text_len));
        json_t *ids = json_array();
        for (int32_t i = 0; i < out->n_tokens; i++)
            json_array_append_new(ids, json_integer(out->token_ids[i]));
        json_object_set_new(o, "token_ids", ids);
        const char *fr = out->finish == CHANNEL_FINISH_STOP     ? "stop"
                         : out->finish == CHANNEL_FINISH_LENGTH ? "length"
                         : out->finish == CHANNEL_FINISH_CANCELED ? "canceled"
                                                                  : "error";
        json_object_set_new(o, "finish_reason", json_string(fr));
        json_object_set_new(o, "ttft_ms", json_real(l->ttft_ms));
        if (out->finish == CHANNEL_FINISH_ERROR)
            json_object_set_new(o, "error", json_string(err_str(out->err)));
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s) printf("%s\n", s);
    free(s);
    json_decref(o);
}

/* Appends everything c holds to acc (text, ids); true once finished. */
static bool drain_channel(struct channel *c, struct channel_output *acc) {
    struct channel_output out;
    channel_read(c, &out);
    if (out.text_len) {
        acc->text = xrealloc(acc->text, acc->text_len + out.text_len + 1);
        memcpy(acc->text + acc->text_len, out.text, out.text_len);
        acc->text_len += out.text_len;
        acc->text[acc->text_len] = '\0';
    }
    if (out.n_tokens) {
        acc->token_ids = xrealloc(acc->token_ids,
                                  (size_t)(acc->n_tokens + out.n_tokens) * sizeof(int32_t));
        memcpy(acc->token_ids + acc->n_tokens, out.token_ids, (size_t)out.n_tokens * sizeof(int32_t));
        acc->n_tokens += out.n_tokens;
    }
    acc->finish = out.finish;
    acc->err = out.err;
    bool done = out.finish != CHANNEL_FINISH_NONE;
    channel_output_free(&out);
    return done;
}

/* The command line. lo's names and paths are borrowed from argv. */
struct batch_opts {
    const char *model_path;
    const char *draft_path;          // --draft-model, NULL: none
    const char *prompts_path;
    int32_t arrival_ms;              // between submissions; 0: all at once
    int32_t tp, pp, n_sp;            // --tp, --pp, --sp (1: none)
    bool is_kv_divided;              // --sp-divide-kv
    struct scheduler_params sp;
};

/* Reads the flags into *o (over the scheduler's defaults) and the --lora
 * list into *lo. Returns -1 to go on, else the exit code: 0 after --help,
 * 2 after a message. */
static int parse_opts(int argc, char **argv, struct batch_opts *o, struct batch_loras *lo) {
    *o = (struct batch_opts){.tp = 1, .pp = 1, .n_sp = 1, .sp = scheduler_default_params()};
    struct scheduler_params *sp = &o->sp;
    static const struct option long_opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompts", required_argument, NULL, 'P'},
        {"arrival-ms", required_argument, NULL, 'a'},
        {"kv-memory", required_argument, NULL, 'k'},
        {"kv-blocks", required_argument, NULL, 'K'},
        {"block-size", required_argument, NULL, 'B'},
        {"max-seqs", required_argument, NULL, 'S'},
        {"max-batch-tokens", required_argument, NULL, 'T'},
        {"prefill-chunk", required_argument, NULL, 'C'},
        {"step-ratio", required_argument, NULL, 'r'},
        {"draft-n", required_argument, NULL, 'D'},
        {"draft-always", no_argument, NULL, 'A'},
        {"draft-model", required_argument, NULL, 'G'},
        {"draft-kv-blocks", required_argument, NULL, 'Q'},
        {"no-prefix-cache", no_argument, NULL, 'N'},
        {"threads", required_argument, NULL, 't'},
        {"ctx", required_argument, NULL, 'c'},
        {"kv-type", required_argument, NULL, 'V'},
        {"lora", required_argument, NULL, 'L'},
        {"max-loras", required_argument, NULL, 'R'},
        {"tp", required_argument, NULL, 'X'},
        {"pp", required_argument, NULL, 'Y'},
        {"sp", required_argument, NULL, 'Z'},
        {"sp-divide-kv", no_argument, NULL, 'W'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:c:h", long_opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case 'P': o->prompts_path = optarg; break;
        case 'a': ok = parse_i32(optarg, 0, 3600000, &o->arrival_ms); break;
        case 'k': ok = parse_i32(optarg, 1, 1 << 20, &sp->kv_memory_mib); break;
        case 'K': ok = parse_i32(optarg, 2, 1 << 24, &sp->kv_blocks); break;
        case 'B': ok = parse_i32(optarg, 1, 1024, &sp->block_size); break;
        case 'S': ok = parse_i32(optarg, 1, 4096, &sp->max_seqs); break;
        case 'T': ok = parse_i32(optarg, 1, 1 << 20, &sp->max_batch_tokens); break;
        case 'C': ok = parse_i32(optarg, 0, 1 << 20, &sp->prefill_chunk); break;
        case 'r': ok = parse_i32(optarg, 0, 100000, &sp->step_ratio); break;
        case 'D': ok = parse_i32(optarg, 0, SCHEDULER_MAX_DRAFT, &sp->draft_n); break;
        case 'A': sp->draft_always = true; break;
        case 'G': o->draft_path = optarg; break;
        case 'Q': ok = parse_i32(optarg, 2, 1 << 24, &sp->draft_kv_blocks); break;
        case 'N': sp->enable_prefix_cache = false; break;
        case 't': ok = parse_i32(optarg, 0, 4096, &sp->n_threads); break;
        case 'c': ok = parse_i32(optarg, 1, 1 << 24, &sp->n_ctx); break;
        case 'V':
            if (engine_kv_type_parse(optarg, &sp->kv_type) != 0) {
                fprintf(stderr, "batch: --kv-type: '%s' is not one of f32, f16, q8_0\n", optarg);
                return 2;
            }
            break;
        case 'R': ok = parse_i32(optarg, 0, SCHEDULER_MAX_LORAS, &sp->max_loras); break;
        case 'X': ok = parse_i32(optarg, 1, 1024, &o->tp); break;
        case 'Y': ok = parse_i32(optarg, 1, 1024, &o->pp); break;
        case 'Z': ok = parse_i32(optarg, 1, 1024, &o->n_sp); break;
        case 'W': o->is_kv_divided = true; break;
        case 'L': {
            const char *eq = strchr(optarg, '=');
            ok = eq && eq != optarg && eq[1] && lo->n < BATCH_MAX_LORAS;
            if (ok) {
                lo->names[lo->n] = optarg;
                lo->name_lens[lo->n] = (size_t)(eq - optarg);
                lo->paths[lo->n] = eq + 1;
                lo->n++;
            }
            break;
        }
        case 'h': batch_usage(stdout); return 0;
        default: batch_usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "batch: bad value for --%s: %s\n", long_opts[0].name, optarg);
            for (const struct option *opt = long_opts; opt->name; opt++)
                if (opt->val == c) fprintf(stderr, "batch: (option --%s)\n", opt->name);
            return 2;
        }
    }
    if (!o->model_path || !o->prompts_path || optind != argc) {
        batch_usage(stderr);
        return 2;
    }
    if (o->n_sp > 1 && (o->tp > 1 || o->pp > 1)) {
        fprintf(stderr, "batch: --sp goes with neither --tp nor --pp\n");
        return 2;
    }
    if ((int64_t)o->tp * o->pp > 1024) {
        fprintf(stderr, "batch: --tp %d x --pp %d is over 1024 ranks\n", (int)o->tp, (int)o->pp);
        return 2;
    }
    if (o->is_kv_divided && o->n_sp < 2) {
        fprintf(stderr, "batch: --sp-divide-kv needs --sp N with N >= 2\n");
        return 2;
    }
    if (o->is_kv_divided) sp->kv_parts = o->n_sp;
    return -1;
}

/* Parses one entry per non-empty line of text; *out is owned by the caller. */
static int64_t read_lines(const struct tokenizer *tok, int32_t n_vocab,
                          const struct batch_loras *lo, char *text, size_t text_len,
                          struct batch_line **out) {
    int64_t n_lines = 0;
    int64_t cap = 0;
    struct batch_line *lines = NULL;
    for (char *p = text; p < text + text_len;) {
        char *nl = memchr(p, '\n', (size_t)(text + text_len - p));
        char *end = nl ? nl : text + text_len;
        char *q = p;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q < end) {
            if (n_lines == cap) {
                cap = cap ? 2 * cap : 64;
                lines = xrealloc(lines, (size_t)cap * sizeof(*lines));
            }
            struct batch_line *l = &lines[n_lines++];
            memset(l, 0, sizeof(*l));
            parse_line(tok, n_vocab, lo, p, (size_t)(end - p), l);
        }
        p = end + 1;
    }
    *out = lines;
    return n_lines;
}

/* Frees what read_lines() made of each of lines [n] (submitted or not), and
 * the array. */
static void free_lines(struct batch_line *lines, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        channel_release(lines[i].channel);
        free(lines[i].prompt);
        for (int32_t k = 0; k < BATCH_MAX_STOPS; k++) free(lines[i].stops[k]);
        gbnf_release(lines[i].req.grammar);
    }
    free(lines);
}

/* One run's lines and what they produced, for the arrival loop. */
struct batch_run {
    struct scheduler *s;
    struct batch_line *lines;
    int64_t n_lines;
    struct channel_output *acc;     // [n_lines]: each line's output so far
    bool *done;                     // [n_lines]
    int64_t n_left;                 // lines not done
    int32_t n_ctx;                  // for the "too long" message
    int64_t t0;                     // start of the run
    int64_t t_last_first_ns;        // when the last request got its first token
    int64_t n_first;                // requests that got a first token
};

/* Submits the lines due by now from *i_next on; a line that cannot run is
 * done with its error. */
static void submit_due(struct batch_run *r, int32_t arrival_ms, int64_t *i_next) {
    int64_t now = clock_mono_ns();
    for (; *i_next < r->n_lines; (*i_next)++) {
        struct batch_line *l = &r->lines[*i_next];
        int64_t due = r->t0 + *i_next * (int64_t)arrival_ms * 1000000;
        if (due > now) break;
        if (!l->error[0]) {
            uint64_t id;
            l->t_submit_ns = clock_mono_ns();
            l->ttft_ms = -1.0;
            int err = scheduler_submit(r->s, &l->req, &id, &l->channel);
            if (err == ERR_TOOLONG) {
                snprintf(l->error, sizeof(l->error),
                         "the context is %d tokens, but the prompt has %d and max_tokens "
                         "asks for %d more", (int)r->n_ctx, (int)l->req.n_prompt,
                         (int)l->req.max_tokens);
            } else if (err) {
                snprintf(l->error, sizeof(l->error), "%s", err_str(err));
            }
        }
        if (l->error[0]) {
            r->done[*i_next] = true;
            r->n_left--;
        }
    }
}

/* Reads every submitted line's channel after a step; notes first tokens. */
static void collect(struct batch_run *r, int64_t i_next) {
    for (int64_t i = 0; i < i_next; i++) {
        struct batch_line *l = &r->lines[i];
        if (r->done[i] || !l->channel) continue;
        bool is_done = drain_channel(l->channel, &r->acc[i]);
        if (l->ttft_ms < 0 && r->acc[i].n_tokens > 0) {
            const int64_t t_now = clock_mono_ns();
            l->ttft_ms = (double)(t_now - l->t_submit_ns) / 1e6;
            r->t_last_first_ns = t_now;  // the decode-only window starts after the last first token
            r->n_first++;
        }
        if (is_done) {
            r->done[i] = true;
            r->n_left--;
        }
    }
}

/* The step loop runs on this thread (scheduler_step), so arrivals are exact
 * and nothing waits on a lock: submit what is due, step, collect. */
static void run_lines(struct batch_run *r, int32_t arrival_ms) {
    r->t0 = clock_mono_ns();
    r->t_last_first_ns = r->t0;
    r->n_left = r->n_lines;
    int64_t i_next = 0;  // next line to submit
    struct progress pr;  // over the requests finished
    progress_begin(&pr, "batch", r->n_lines, "req", 1);
    while (r->n_left > 0) {
        progress_update(&pr, r->n_lines - r->n_left);
        submit_due(r, arrival_ms, &i_next);
        if (!scheduler_has_work(r->s)) {
            if (i_next >= r->n_lines) break;
            int64_t due = r->t0 + i_next * (int64_t)arrival_ms * 1000000;
            int64_t wait_ns = due - clock_mono_ns();
            if (wait_ns > 0) {
                struct timespec ts = {(time_t)(wait_ns / 1000000000), (long)(wait_ns % 1000000000)};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        int32_t n = scheduler_step(r->s);
        if (n < 0) LOG_WARN("step failed: %s", err_str(n));
        collect(r, i_next);
    }
    progress_update(&pr, r->n_lines - r->n_left);
    progress_end(&pr);
}

static void release_loras(struct batch_loras *lo, int32_t n) {
    for (int32_t k = 0; k < n; k++) engine_adapter_release(lo->adapters[k]);
}

int cmd_batch(int argc, char **argv) {
    struct batch_opts o;
    static struct batch_loras lo;  // large: not on the stack
    memset(&lo, 0, sizeof(lo));
    int code = parse_opts(argc, argv, &o, &lo);
    if (code >= 0) return code;
    struct scheduler_params sp = o.sp;

    struct comm *comm = NULL;
    struct engine_model *model = NULL;
    struct engine_model *draft = NULL;
    struct scheduler *s = NULL;
    struct batch_line *lines = NULL;
    char *text = NULL;
    size_t text_len = 0;
    int64_t n_lines = 0;   // of lines
    int32_t n_loaded = 0;  // adapters of lo loaded
    code = 1;
    int err = tp_open(o.tp * o.pp * o.n_sp, &comm);
    if (err) goto done;
    err = tp_load_model(comm, o.model_path, o.pp, o.n_sp, &model);
    if (err) {
        fprintf(stderr, "batch: cannot load %s: %s\n", o.model_path, err_str(err));
        goto done;
    }
    if (comm_rank(comm) > 0) {  // a split model: this rank only follows rank 0's steps
        code = tp_follow(comm, model, sp.n_threads);
        goto done;
    }
    err = file_read_all(o.prompts_path, BATCH_MAX_FILE_BYTES, &text, &text_len);
    if (err) {
        fprintf(stderr, "batch: cannot read %s: %s\n", o.prompts_path, err_str(err));
        goto done;
    }
    const int32_t n_ctx_train = engine_model_get_info(model)->n_ctx_train;
    const struct tokenizer *tok = engine_model_tokenizer(model);
    int32_t n_vocab = engine_model_get_info(model)->n_vocab;
    char file_id[256];
    openai_model_id(o.model_path, file_id, sizeof(file_id));
    lo.base_name = file_id;
    lo.gguf_name = engine_model_get_info(model)->name;
    for (; n_loaded < lo.n; n_loaded++) {
        err = engine_adapter_load(model, lo.paths[n_loaded], &lo.adapters[n_loaded]);
        if (err) {
            fprintf(stderr, "batch: cannot load the adapter %.*s=%s: %s\n",
                    (int)lo.name_lens[n_loaded], lo.names[n_loaded], lo.paths[n_loaded],
                    err_str(err));
            goto done;
        }
    }
    if (o.draft_path) {
        char msg[512];
        err = draft_model_load(o.draft_path, model, true, &draft, msg, sizeof(msg));
        if (err) {
            fprintf(stderr, "batch: %s\n", msg);
            goto done;
        }
        sp.draft_model = draft;
    }
    if (lo.n > 0 && sp.max_loras == 0) {
        fprintf(stderr, "batch: --lora needs --max-loras >= 1\n");
        code = 2;
        goto done;
    }

    n_lines = read_lines(tok, n_vocab, &lo, text, text_len, &lines);
    free(text);
    text = NULL;
    if (sp.max_queue < n_lines + 1) sp.max_queue = n_lines + 1 > INT32_MAX ? INT32_MAX : (int32_t)n_lines + 1;

    sp.comm = comm;
    err = scheduler_create(model, &sp, &s);
    if (err) {
        fprintf(stderr, "batch: cannot start the scheduler: %s\n", err_str(err));
        goto done;
    }
    struct batch_run r = {
        .s = s,
        .lines = lines,
        .n_lines = n_lines,
        .acc = xcalloc((size_t)n_lines + 1, sizeof(*r.acc)),
        .done = xcalloc((size_t)n_lines + 1, sizeof(*r.done)),
        .n_ctx = sp.n_ctx > 0 ? sp.n_ctx : n_ctx_train,
    };
    run_lines(&r, o.arrival_ms);
    const int64_t t_end_ns = clock_mono_ns();
    double wall_s = (double)(t_end_ns - r.t0) / 1e9;
    double decode_s = (double)(t_end_ns - r.t_last_first_ns) / 1e9;
    struct scheduler_stats st;
    scheduler_stop(s, 0);
    scheduler_get_stats(s, &st);

    for (int64_t i = 0; i < n_lines; i++) {
        print_result(i, &lines[i], &r.acc[i]);
        channel_output_free(&r.acc[i]);
    }
    fflush(stdout);
    fprintf(stderr,
            "batch: requests=%lld generated=%lld wall_s=%.3f tok_s=%.1f decode_tok_s=%.1f "
            "prompt_tokens=%lld prefix_hit_tokens=%lld preemptions=%lld steps=%lld "
            "lora_loads=%lld lora_evictions=%lld lora_waits=%lld draft_tokens=%lld "
            "draft_accepted=%lld\n",
            (long long)n_lines, (long long)st.n_generated_tokens, wall_s,
            wall_s > 0 ? (double)st.n_generated_tokens / wall_s : 0.0,
            decode_s > 0 ? (double)(st.n_generated_tokens - r.n_first) / decode_s : 0.0,
            (long long)st.n_prompt_tokens, (long long)st.n_prefix_hit_tokens,
            (long long)st.n_preemptions, (long long)st.n_steps, (long long)st.n_lora_loads,
            (long long)st.n_lora_evictions, (long long)st.n_lora_waits,
            (long long)st.n_draft_tokens, (long long)st.n_draft_accepted);
    free(r.acc);
    free(r.done);
    code = 0;

done:
    // Rank 0 failed with the other ranks still waiting for it (in the ctx's
    // creation): end them with it. Once the scheduler exists, freeing it
    // frees the ctx, which releases them.
    if (code != 0 && !s && comm_rank(comm) == 0) tp_fail(comm, code, "batch failed");
    free(text);
    free_lines(lines, n_lines);
    scheduler_free(s);
    release_loras(&lo, n_loaded);
    engine_model_free(draft);
    engine_model_free(model);
    comm_close(comm);
    return code;
}
