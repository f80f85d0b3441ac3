/*
 * config/setting.c - the settings table and the typed parsing of one value.
 * Range checks live here too, so the file and the flags give the same
 * messages; config_validate() re-checks cross-field rules.
 */
#include "config/setting.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/log.h"

#define OFF(field) offsetof(struct config, field)
#define GIB (1024LL * 1024 * 1024)

const struct setting setting_table[] = {
    {"host", 0, "host", SETTING_KIND_STR, OFF(host), 0, 0, "ADDR",
     "IPv4 address to listen on"},
    {"port", 'p', "port", SETTING_KIND_I32, OFF(port), 1, 65535, "N", "TCP port"},
    {"model", 'm', "model", SETTING_KIND_STR, OFF(model_path), 0, 0, "FILE",
     "GGUF model to serve (required)"},
    {"model-name", 0, "model_name", SETTING_KIND_STR, OFF(model_name), 0, 0, "NAME",
     "model id in the API (/v1/models, \"model\" fields); default: the file's name "
     "without .gguf"},
    {"threads", 't', "threads", SETTING_KIND_I32, OFF(n_threads), 0, 1024, "N",
     "kernel threads; 0 = all cores"},
    {"ctx", 'c', "ctx", SETTING_KIND_I32, OFF(n_ctx), 0, 1 << 24, "N",
     "most tokens (prompt + generated) of one request; 0 = the model's context_length"},
    {"kv-memory", 0, "kv_memory", SETTING_KIND_SIZE, OFF(kv_bytes), 1024 * 1024, 1024 * GIB,
     "SIZE", "memory for the KV cache (a --draft-model's included), e.g. 512M, 4G"},
    {"block-size", 0, "block_size", SETTING_KIND_I32, OFF(block_size), 1, 1024, "N",
     "tokens per KV block"},
    // The names are engine_kv_type_parse()'s: config/ may not include engine.h.
    {"kv-type", 0, "kv_type", SETTING_KIND_CHOICE, OFF(kv_type), 0, 0, "f32|f16|q8_0",
     "KV cache storage: f16 (half of f32's bytes), f32 or q8_0 (int8 + scales, ~0.27x)"},
    // Checked against engine/chat.h's names by the server (config/ may not include it).
    {"chat-template", 0, "chat_template", SETTING_KIND_STR, OFF(chat_template), 0, 0, "FAMILY",
     "chat template to use instead of the model's: chatml, qwen2.5, llama3, llama3.1, llama2, "
     "mistral-legacy, mistral-v1, mistral-v3-tekken, phi3, gemma, zephyr, deepseek-r1"},
    {"max-seqs", 0, "max_seqs", SETTING_KIND_I32, OFF(max_seqs), 1, 65536, "N",
     "most sequences running at once"},
    {"max-batch-tokens", 0, "max_batch_tokens", SETTING_KIND_I32, OFF(max_batch_tokens), 1,
     1 << 20, "N", "token budget of one step (prefill chunk + decodes)"},
    {"prefill-chunk", 0, "prefill_chunk", SETTING_KIND_I32, OFF(prefill_chunk), 0, 1 << 20, "N",
     "prefill tokens of a step beside decodes (shortest prompt first), 0 = no limit"},
    {"step-ratio", 0, "step_ratio", SETTING_KIND_I32, OFF(step_ratio), 0, 100000, "PCT",
     "a step with prompt work costs at most PCT% of a decode step of every sequence present "
     "(inter-token latency while prompts arrive), 0 = --prefill-chunk alone"},
    {"draft-n", 0, "draft_n", SETTING_KIND_I32, OFF(draft_n), 0, 16, "N",
     "speculative decoding: up to N draft tokens per step at batch <= 4 (prompt lookup, or "
     "--draft-model's), 0 = off; default 0, or 4 with --draft-model"},
    {"draft-model", 0, "draft_model", SETTING_KIND_STR, OFF(draft_model_path), 0, 0, "FILE",
     "speculative decoding with drafts from FILE, a smaller GGUF model of the same vocabulary "
     "(greedy, or sampled for a request sampling without a seed; tokens as without: the same, "
     "or of the same distribution); under --tp/--pp/--sp it runs whole on rank 0"},
    {"draft-always", 0, "draft_always", SETTING_KIND_BOOL, OFF(draft_always), 0, 0, "[BOOL]",
     "draft at every decode step of at most 4 streams, even where drafting does not pay "
     "(tests, benchmarks; default: only while steps with drafts emit tokens faster)"},
    {"max-queue", 0, "max_queue", SETTING_KIND_I32, OFF(max_queue), 1, 1 << 20, "N",
     "requests waiting for a slot before 429"},
    {"max-body", 0, "max_body", SETTING_KIND_SIZE, OFF(max_body_bytes), 1024, GIB, "SIZE",
     "largest request body; larger gets 413"},
    {"request-timeout", 0, "request_timeout", SETTING_KIND_I32, OFF(request_timeout_s), 0,
     7 * 24 * 3600, "SEC", "longest a request may run, 0 = no limit"},
    {"idle-timeout", 0, "idle_timeout", SETTING_KIND_I32, OFF(idle_timeout_s), 0, 24 * 3600,
     "SEC", "close a connection that sends and reads nothing this long, 0 = never"},
    {"read-timeout", 0, "read_timeout", SETTING_KIND_I32, OFF(read_timeout_s), 0, 24 * 3600,
     "SEC", "close a connection whose request has not fully arrived this long after it opened "
     "or its last answer ended (slowloris), 0 = no limit"},
    {"max-connections", 0, "max_connections", SETTING_KIND_I32, OFF(max_connections), 1,
     1 << 20, "N", "open HTTP connections at most; more wait in the listen backlog"},
    {"shutdown-grace", 0, "shutdown_grace", SETTING_KIND_I32, OFF(shutdown_grace_s), 0, 3600,
     "SEC", "on SIGINT/SIGTERM, how long running requests may finish"},
    {"api-key", 0, "api_keys", SETTING_KIND_KEY, OFF(api_keys), 0, 0, "KEY",
     "accepted bearer key (repeatable; file: array); none = no auth"},
    {"api-key-file", 0, "api_key_file", SETTING_KIND_STR, OFF(api_key_file), 0, 0, "FILE",
     "file with one accepted key per line"},
    {"log-level", 0, "log_level", SETTING_KIND_LOGLEVEL, OFF(log_level), 0, 0, "LEVEL",
     "error, warn, info or debug"},
    {"lora", 0, "lora", SETTING_KIND_LORA, OFF(lora_names), 0, 0, "NAME=PATH",
     "serve an adapter (PEFT dir, GGUF LoRA, bottleneck dir) as model NAME (repeatable; "
     "file: {\"NAME\": \"PATH\"} or [\"NAME=PATH\"])"},
    {"tp", 0, "tp", SETTING_KIND_I32, OFF(tp), 1, 1024, "N",
     "tensor parallelism: split the model over the N ranks of mpirun -np N (docs/parallelism.md)"},
    {"pp", 0, "pp", SETTING_KIND_I32, OFF(pp), 1, 1024, "N",
     "pipeline parallelism: split the layers into N stages (mpirun -np N; with --tp T, "
     "-np T x N: each stage over T ranks; docs/parallelism.md)"},
    {"sp", 0, "sp", SETTING_KIND_I32, OFF(sp), 1, 1024, "N",
     "sequence parallelism: split each step's tokens over the N ranks of mpirun -np N, each "
     "with the whole model (long prompts; not with --tp, --pp; docs/parallelism.md)"},
    {"sp-divide-kv", 0, "sp_divide_kv", SETTING_KIND_BOOL, OFF(sp_divide_kv), 0, 0, "[BOOL]",
     "with --sp N: divide the KV cache over the N ranks (each holds 1/N of the blocks, "
     "--kv-memory each: N times the context in all; attention combined over the ranks)"},
    {"max-loras", 0, "max_loras", SETTING_KIND_I32, OFF(max_loras), 0, 256, "N",
     "adapter slots: distinct adapters batched at once (more wait); 0 = no adapters"},
    {"allow-runtime-lora", 0, "allow_runtime_lora", SETTING_KIND_BOOL, OFF(allow_runtime_lora),
     0, 0, "[BOOL]", "enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
     "(behind --api-key when set; needs --lora-dir)"},
    {"lora-dir", 0, "lora_dir", SETTING_KIND_STR, OFF(lora_dir), 0, 0, "DIR",
     "runtime loads may read adapters only inside DIR (no '..', no symlinks); "
     "relative paths are taken in it"},
};
const int setting_n = (int)(sizeof(setting_table) / sizeof(setting_table[0]));

const struct setting *setting_find_key(const char *key) {
    for (int i = 0; i < setting_n; i++) {
        if (strcmp(setting_table[i].key, key) == 0) return &setting_table[i];
    }
    return NULL;
}

int config_parse_size(const char *s, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0) return ERR_INVAL;
    long long mul = 1;
    switch (*end) {
    case 0: break;
    case 'k': case 'K': mul = 1024LL; end++; break;
    case 'm': case 'M': mul = 1024LL * 1024; end++; break;
    case 'g': case 'G': mul = GIB; end++; break;
    default: return ERR_INVAL;
    }
    // Accept "512M", "512MB", "512MiB".
    if (mul > 1 && (strcmp(end, "B") == 0 || strcmp(end, "iB") == 0)) end += strlen(end);
    if (*end) return ERR_INVAL;
    if (v > INT64_MAX / mul) return ERR_INVAL;
    *out = (int64_t)(v * mul);
    return 0;
}

/* True when value is one of the '|'-separated words of choices. */
static bool is_choice(const char *choices, const char *value) {
    const size_t n = strlen(value);
    for (const char *w = choices; *w;) {
        const char *e = strchr(w, '|');
        const size_t len = e ? (size_t)(e - w) : strlen(w);
        if (n > 0 && len == n && memcmp(w, value, n) == 0) return true;
        if (!e) break;
        w = e + 1;
    }
    return false;
}

/* Appends --api-key value to c's keys: 1..CONFIG_API_KEY_MAX_BYTES of
 * printable ASCII without spaces, at most CONFIG_MAX_API_KEYS. */
static int add_api_key(struct config *c, const char *value, const char *where, char *msg,
                       size_t msg_size) {
    size_t len = strlen(value);
    if (len == 0 || len > CONFIG_API_KEY_MAX_BYTES) {
        snprintf(msg, msg_size, "%s: an API key must be 1..%d bytes", where,
                 CONFIG_API_KEY_MAX_BYTES);
        return ERR_INVAL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)value[i];
        if (ch <= ' ' || ch >= 0x7f) {
            snprintf(msg, msg_size, "%s: an API key must be printable ASCII without spaces",
                     where);
            return ERR_INVAL;
        }
    }
    if (c->n_api_keys == CONFIG_MAX_API_KEYS) {
        snprintf(msg, msg_size, "%s: more than %d API keys", where, CONFIG_MAX_API_KEYS);
        return ERR_INVAL;
    }
    c->api_keys[c->n_api_keys++] = xstrdup(value);
    return 0;
}

/* Appends --lora NAME=PATH to c's adapters: a name not given before, at most
 * CONFIG_MAX_LORAS. */
static int add_lora(struct config *c, const char *value, const char *where, char *msg,
                    size_t msg_size) {
    const char *eq = strchr(value, '=');
    if (!eq || eq == value || !eq[1]) {
        snprintf(msg, msg_size, "%s: '%s' is not NAME=PATH", where, value);
        return ERR_INVAL;
    }
    size_t name_len = (size_t)(eq - value);
    for (int32_t i = 0; i < c->n_loras; i++) {
        if (strlen(c->lora_names[i]) == name_len &&
            strncmp(c->lora_names[i], value, name_len) == 0) {
            snprintf(msg, msg_size, "%s: the adapter name '%.*s' is given twice", where,
                     (int)name_len, value);
            return ERR_INVAL;
        }
    }
    if (c->n_loras == CONFIG_MAX_LORAS) {
        snprintf(msg, msg_size, "%s: more than %d adapters", where, CONFIG_MAX_LORAS);
        return ERR_INVAL;
    }
    char *name = xmalloc(name_len + 1);
    memcpy(name, value, name_len);
    name[name_len] = 0;
    c->lora_names[c->n_loras] = name;
    c->lora_paths[c->n_loras] = xstrdup(eq + 1);
    c->n_loras++;
    return 0;
}

int setting_apply(struct config *c, const struct setting *s, const char *value,
                  const char *where, char *msg, size_t msg_size) {
    char *base = (char *)c;
    switch (s->kind) {
    case SETTING_KIND_CHOICE:
    case SETTING_KIND_STR: {
        if (!*value) {
            snprintf(msg, msg_size, "%s: empty value", where);
            return ERR_INVAL;
        }
        if (s->kind == SETTING_KIND_CHOICE && !is_choice(s->arg, value)) {
            snprintf(msg, msg_size, "%s: '%s' is not one of %s", where, value, s->arg);
            return ERR_INVAL;
        }
        char **field = (char **)(void *)(base + s->offset);
        free(*field);
        *field = xstrdup(value);
        return 0;
    }
    case SETTING_KIND_I32: {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (errno || end == value || *end) {
            snprintf(msg, msg_size, "%s: '%s' is not an integer", where, value);
            return ERR_INVAL;
        }
        if (v < s->lo || v > s->hi) {
            snprintf(msg, msg_size, "%s: %lld is out of range [%lld, %lld]", where, v, s->lo,
                     s->hi);
            return ERR_INVAL;
        }
        *(int32_t *)(void *)(base + s->offset) = (int32_t)v;
        return 0;
    }
    case SETTING_KIND_SIZE: {
        int64_t v = 0;
        if (config_parse_size(value, &v)) {
            snprintf(msg, msg_size, "%s: '%s' is not a size (e.g. 1048576, 512K, 64M, 2G)",
                     where, value);
            return ERR_INVAL;
        }
        if (v < s->lo || v > s->hi) {
            snprintf(msg, msg_size, "%s: %lld bytes is out of range [%lld, %lld]", where,
                     (long long)v, s->lo, s->hi);
            return ERR_INVAL;
        }
        *(int64_t *)(void *)(base + s->offset) = v;
        return 0;
    }
    case SETTING_KIND_LOGLEVEL: {
        enum log_level lvl;
        if (log_level_parse(value, &lvl)) {
            snprintf(msg, msg_size, "%s: '%s' is not one of error, warn, info, debug", where,
                     value);
            return ERR_INVAL;
        }
        c->log_level = lvl;
        return 0;
    }
    case SETTING_KIND_KEY: return add_api_key(c, value, where, msg, msg_size);
    case SETTING_KIND_LORA: return add_lora(c, value, where, msg, msg_size);
    case SETTING_KIND_BOOL: {
        bool *field = (bool *)(void *)(base + s->offset);
        if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0 || strcmp(value, "on") == 0 ||
            strcmp(value, "yes") == 0) {
            *field = true;
        } else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0 ||
                   strcmp(value, "off") == 0 || strcmp(value, "no") == 0) {
            *field = false;
        } else {
            snprintf(msg, msg_size, "%s: '%s' is not true or false", where, value);
            return ERR_INVAL;
        }
        return 0;
    }
    }
    UNREACHABLE();
}

void setting_format(const struct config *c, const struct setting *s, char *out, size_t out_size) {
    const char *base = (const char *)c;
    switch (s->kind) {
    case SETTING_KIND_CHOICE:
    case SETTING_KIND_STR: {
        const char *v = *(char *const *)(const void *)(base + s->offset);
        snprintf(out, out_size, "%s", v ? v : "(none)");
        return;
    }
    case SETTING_KIND_I32:
        snprintf(out, out_size, "%d", (int)*(const int32_t *)(const void *)(base + s->offset));
        return;
    case SETTING_KIND_SIZE: {
        long long v = (long long)*(const int64_t *)(const void *)(base + s->offset);
        if (v % GIB == 0) {
            snprintf(out, out_size, "%lldG", v / GIB);
        } else if (v % (1024 * 1024) == 0) {
            snprintf(out, out_size, "%lldM", v / (1024 * 1024));
        } else if (v % 1024 == 0) {
            snprintf(out, out_size, "%lldK", v / 1024);
        } else {
            snprintf(out, out_size, "%lld", v);
        }
        return;
    }
    case SETTING_KIND_LOGLEVEL: {
        static const char *const names[] = {"error", "warn", "info", "debug"};
        int lvl = (int)c->log_level;
        snprintf(out, out_size, "%s", lvl >= 0 && lvl <= 3 ? names[lvl] : "?");
        return;
    }
    case SETTING_KIND_KEY:
        snprintf(out, out_size, "%d key(s)", (int)c->n_api_keys);
        return;
    case SETTING_KIND_LORA:
        snprintf(out, out_size, "%d adapter(s)", (int)c->n_loras);
        return;
    case SETTING_KIND_BOOL:
        snprintf(out, out_size, "%s", *(const bool *)(const void *)(base + s->offset) ? "true"
                                                                                      : "false");
        return;
    }
    UNREACHABLE();
}
