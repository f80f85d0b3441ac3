/*
 * config/config.h - THE config API: every setting of `llmserve serve` in one
 * plain struct, filled in three layers (defaults, then an optional JSON config
 * file, then command-line flags) and validated once at start-up.
 *
 * Owns the strings of a struct config (freed by config_deinit()). Knows
 * nothing of the modules it configures: server/main.c (and cmd_serve.c)
 * translate a struct config into the modules' params structs (STYLE 2.10).
 * Threads: [before start]; a loaded config is read-only afterwards.
 */
#ifndef LLMSERVE_CONFIG_H
#define LLMSERVE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/base/log.h"

#define CONFIG_MAX_API_KEYS 64
#define CONFIG_API_KEY_MAX_BYTES 256
#define CONFIG_MAX_LORAS 256           // --lora adapters at start-up

struct config {
    char *host;                   // owned; listen address, default "127.0.0.1"
    int32_t port;                 // 1..65535, default 8080
    char *model_path;             // owned; GGUF file (required)
    char *model_name;             // owned; id served in /v1/models; NULL: the file's name
                                  //    without .gguf
    int32_t n_threads;            // kernel threads; 0: all cores
    int32_t n_ctx;                // most tokens per sequence; 0: the model's context_length
    int64_t kv_bytes;             // KV cache budget in bytes
    int32_t block_size;           // tokens per KV block
    char *kv_type;                // owned; KV storage: "f16" (default), "f32" or "q8_0"
    char *chat_template;          // owned; chat family name (engine/chat.h) overriding the
                                  //    model's template; NULL: detect it
    int32_t max_seqs;             // sequences running at once
    int32_t max_batch_tokens;     // token budget of one step
    int32_t prefill_chunk;        // prefill tokens of a step beside decodes, 0: no limit
    int32_t step_ratio;           // percent a step with prompt work may cost of a decode step, 0: off
    int32_t draft_n;              // speculative decoding: draft tokens per step, 0: off
                                  //    (the server takes 0 as 4 when draft_model_path is set)
    char *draft_model_path;       // owned; GGUF draft model, NULL: prompt-lookup drafts
    bool draft_always;            // draft even where it does not pay (tests, benchmarks)
    int32_t max_queue;            // requests waiting before 429
    int64_t max_body_bytes;       // largest request body before 413
    int32_t request_timeout_s;    // longest a request may run; 0: no limit
    int32_t idle_timeout_s;       // a connection silent this long is closed; 0: never
    int32_t read_timeout_s;       // longest to receive one request in full; 0: no limit
    int32_t max_connections;      // open HTTP connections at most
    int32_t shutdown_grace_s;     // how long running streams may finish on SIGTERM
    char *api_keys[CONFIG_MAX_API_KEYS];  // owned; empty list: no auth
    int32_t n_api_keys;
    char *api_key_file;           // owned; one key per line, read by config_load()
    char *lora_names[CONFIG_MAX_LORAS];  // owned; --lora NAME=PATH, in order given
    char *lora_paths[CONFIG_MAX_LORAS];  // owned; [n_loras]
    int32_t n_loras;
    int32_t max_loras;            // adapter slots in the engine (adapters batched at once)
    char *lora_dir;               // owned; runtime adapter paths must lie inside; required by allow_runtime_lora
    int32_t tp;                   // tensor-parallel ranks (1: this process alone)
    int32_t pp;                   // pipeline stages (1: every layer in each rank)
    int32_t sp;                   // sequence-parallel ranks (1: every token here)
    bool sp_divide_kv;            // with sp > 1: the KV cache divided over the SP ranks
    bool allow_runtime_lora;      // POST /v1/load_lora_adapter, /v1/unload_lora_adapter
    enum log_level log_level;
    char *config_file;            // owned; the file that was read, or NULL
    bool show_help;               // --help was given: print config_print_help(), exit 0
};

/* Fills c with the defaults (zeroing it first). [before start] */
void config_init_defaults(struct config *c);

/* Frees the strings of c and zeroes it. Safe on a zeroed or partly filled config. */
void config_deinit(struct config *c);

/* The whole start-up sequence: defaults, then the file named by --config (if
 * any), then every other flag of argv (argv[0] is the subcommand name), then
 * the keys of --api-key-file, then config_validate(). Returns 0 (check
 * c->show_help), or ERR_INVAL / ERR_IO with a message for the operator in msg
 * (msg_size bytes, NUL-terminated) naming the flag, key or file. On failure c
 * still owns whatever it holds: call config_deinit(). [before start] */
int config_load(struct config *c, int argc, char **argv, char *msg, size_t msg_size);

/* Checks every value's range and that a model is given. Returns 0 or
 * ERR_INVAL with a message naming the setting. */
int config_validate(const struct config *c, char *msg, size_t msg_size);

/* Parses a size such as "512M", "2G", "64k" or "1048576" (bytes) into *out.
 * Suffixes are binary (K = 1024). Returns 0 or ERR_INVAL. */
int config_parse_size(const char *s, int64_t *out);

/* Writes the `llmserve serve --help` text: every flag, its config-file key and
 * default. */
void config_print_help(FILE *fp);

/* Logs the effective config at INFO, one line; API keys only as a count. */
void config_log(const struct config *c);

#endif
