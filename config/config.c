/*
 * config/config.c - defaults, the load sequence (defaults -> file -> flags ->
 * key file), cross-field validation and the start-up dump.
 */
#define LOG_TAG "config"
#include "config/config.h"

#include <stdlib.h>
#include <string.h>

#include "config/cli.h"
#include "config/config_file.h"
#include "config/setting.h"
#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/file.h"
#include "engine/base/log.h"

#define API_KEY_FILE_MAX_BYTES (1024 * 1024)

void config_init_defaults(struct config *c) {
    memset(c, 0, sizeof(*c));
    c->host = xstrdup("127.0.0.1");
    c->port = 8080;
    c->n_threads = 0;
    c->kv_bytes = 256LL * 1024 * 1024;
    c->block_size = 16;
    c->kv_type = xstrdup("f16");  // docs/decisions.md: KV type default
    c->max_seqs = 64;
    c->max_batch_tokens = 2048;  // = scheduler_default_params() (tests/server/test_defaults.c)
    c->prefill_chunk = 256;
    c->step_ratio = 125;
    c->max_queue = 1024;
    c->max_body_bytes = 4LL * 1024 * 1024;
    c->request_timeout_s = 600;
    c->idle_timeout_s = 60;
    c->read_timeout_s = 30;
    c->max_connections = 4096;
    c->shutdown_grace_s = 10;
    c->max_loras = 8;
    c->tp = 1;
    c->pp = 1;
    c->sp = 1;
    c->log_level = LOG_LEVEL_INFO;
}

void config_deinit(struct config *c) {
    if (!c) return;
    free(c->host);
    free(c->model_path);
    free(c->draft_model_path);
    free(c->model_name);
    free(c->kv_type);
    free(c->chat_template);
    for (int32_t i = 0; i < c->n_api_keys; i++) {
        // Keys are secrets: clear them before the memory goes back.
        volatile char *k = c->api_keys[i];
        for (size_t j = 0; k[j]; j++) k[j] = 0;
        free(c->api_keys[i]);
    }
    free(c->api_key_file);
    free(c->lora_dir);
    for (int32_t i = 0; i < c->n_loras; i++) {
        free(c->lora_names[i]);
        free(c->lora_paths[i]);
    }
    free(c->config_file);
    memset(c, 0, sizeof(*c));
}

/* One key per line; blank lines and lines starting with '#' are skipped,
 * surrounding whitespace is trimmed. */
static int load_key_file(struct config *c, const char *path, char *msg, size_t msg_size) {
    char *text = NULL;
    size_t len = 0;
    int err = file_read_all(path, API_KEY_FILE_MAX_BYTES, &text, &len);
    if (err) {
        snprintf(msg, msg_size, "--api-key-file %s: cannot read it: %s", path, err_str(err));
        return ERR_IO;
    }
    const struct setting *s = setting_find_key("api_keys");
    ASSERT(s);
    char *line = text;
    int lineno = 0;
    while (line && *line) {
        lineno++;
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *b = line;
        while (*b == ' ' || *b == '\t' || *b == '\r') b++;
        char *e = b + strlen(b);
        while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
        if (*b && *b != '#') {
            char where[64];
            snprintf(where, sizeof(where), "--api-key-file line %d", lineno);
            err = setting_apply(c, s, b, where, msg, msg_size);
            if (err) break;
        }
        line = nl ? nl + 1 : NULL;
    }
    memset(text, 0, len);
    free(text);
    return err;
}

int config_load(struct config *c, int argc, char **argv, char *msg, size_t msg_size) {
    msg[0] = 0;
    config_init_defaults(c);
    const char *file = NULL;
    int err = cli_find_config(argc, argv, &file, msg, msg_size);
    if (err) return err;
    if (file) {
        c->config_file = xstrdup(file);
        err = config_file_load(c, file, msg, msg_size);
        if (err) return err;
    }
    err = cli_parse(c, argc, argv, msg, msg_size);
    if (err || c->show_help) return err;
    if (c->api_key_file) {
        err = load_key_file(c, c->api_key_file, msg, msg_size);
        if (err) return err;
    }
    return config_validate(c, msg, msg_size);
}

int config_validate(const struct config *c, char *msg, size_t msg_size) {
    if (!c->model_path) {
        snprintf(msg, msg_size, "no model given: pass --model FILE (a GGUF file)");
        return ERR_INVAL;
    }
    if (!c->host || !*c->host) {
        snprintf(msg, msg_size, "--host: empty address");
        return ERR_INVAL;
    }
    // Ranges were checked as each value was applied; re-check here for
    // configs filled in by code (tests, defaults changed later).
    for (int i = 0; i < setting_n; i++) {
        const struct setting *s = &setting_table[i];
        const char *base = (const char *)c;
        long long v;
        if (s->kind == SETTING_KIND_I32) {
            v = *(const int32_t *)(const void *)(base + s->offset);
        } else if (s->kind == SETTING_KIND_SIZE) {
            v = (long long)*(const int64_t *)(const void *)(base + s->offset);
        } else {
            continue;
        }
        if (v < s->lo || v > s->hi) {
            snprintf(msg, msg_size, "--%s: %lld is out of range [%lld, %lld]", s->flag, v, s->lo,
                     s->hi);
            return ERR_INVAL;
        }
    }
    if (c->block_size & (c->block_size - 1)) {
        snprintf(msg, msg_size, "--block-size: %d is not a power of two", (int)c->block_size);
        return ERR_INVAL;
    }
    if (c->sp > 1 && (c->tp > 1 || c->pp > 1)) {
        snprintf(msg, msg_size, "--sp %d goes with neither --tp nor --pp", (int)c->sp);
        return ERR_INVAL;
    }
    if (c->sp_divide_kv && c->sp < 2) {
        snprintf(msg, msg_size, "--sp-divide-kv divides the KV cache over the ranks of --sp N "
                 "(N >= 2), but --sp is %d", (int)c->sp);
        return ERR_INVAL;
    }
    if ((int64_t)c->tp * c->pp > 1024) {
        snprintf(msg, msg_size, "--tp %d x --pp %d is over 1024 ranks", (int)c->tp, (int)c->pp);
        return ERR_INVAL;
    }
    if (c->max_loras == 0 && (c->n_loras > 0 || c->allow_runtime_lora)) {
        snprintf(msg, msg_size, "--max-loras 0 serves no adapters, but --lora or "
                 "--allow-runtime-lora was given");
        return ERR_INVAL;
    }
    if (c->allow_runtime_lora && (!c->lora_dir || !*c->lora_dir)) {
        snprintf(msg, msg_size, "--allow-runtime-lora needs --lora-dir DIR: POST "
                 "/v1/load_lora_adapter opens a path the client chooses, and only paths "
                 "inside DIR are allowed");
        return ERR_INVAL;
    }
    if (c->max_batch_tokens < c->max_seqs) {
        snprintf(msg, msg_size,
                 "--max-batch-tokens (%d) must be at least --max-seqs (%d): every running "
                 "sequence needs one token per step",
                 (int)c->max_batch_tokens, (int)c->max_seqs);
        return ERR_INVAL;
    }
    return 0;
}

void config_print_help(FILE *fp) {
    struct config d;
    config_init_defaults(&d);
    cli_print_help(fp, &d);
    config_deinit(&d);
}

void config_log(const struct config *c) {
    char line[1024];
    size_t n = 0;
    for (int i = 0; i < setting_n && n < sizeof(line); i++) {
        char v[256];
        setting_format(c, &setting_table[i], v, sizeof(v));
        int w = snprintf(line + n, sizeof(line) - n, "%s%s=%s", i ? " " : "",
                         setting_table[i].key, v);
        if (w < 0) break;
        n += (size_t)w;
    }
    if (c->config_file) {
        LOG_INFO("config file=%s %s", c->config_file, line);
    } else {
        LOG_INFO("config %s", line);
    }
}
