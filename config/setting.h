/*
 * config/setting.h - the one table of settings that the command line
 * (cli.c), the config file (config_file.c) and the --help text share, so a
 * setting cannot exist in one and be missing from another.
 *
 * Private to config/. Owns nothing; the table is static const.
 */
#ifndef LLMSERVE_CONFIG_SETTING_H
#define LLMSERVE_CONFIG_SETTING_H

#include <stddef.h>

struct config;

enum setting_kind {
    SETTING_KIND_STR,       // char * field, replaced (owned copy)
    SETTING_KIND_CHOICE,    // char * field, one of the '|'-separated words of `arg`
    SETTING_KIND_I32,       // int32_t field in [lo, hi]
    SETTING_KIND_SIZE,      // int64_t byte count, "512M" style
    SETTING_KIND_LOGLEVEL,  // enum log_level
    SETTING_KIND_KEY,       // appends one API key
    SETTING_KIND_LORA,      // appends one adapter, "NAME=PATH"
    SETTING_KIND_BOOL,      // bool field; a flag without a value means true
};

struct setting {
    const char *flag;        // long flag without "--", e.g. "max-seqs"
    char short_flag;         // 0: none
    const char *key;         // config-file key, e.g. "max_seqs"
    enum setting_kind kind;
    size_t offset;           // of the field in struct config
    long long lo, hi;        // range for SETTING_KIND_I32 and _SIZE
    const char *arg;         // argument name for --help
    const char *help;        // one line; the default is printed after it
};

/* The table, n entries. */
extern const struct setting setting_table[];
extern const int setting_n;

/* The setting with that config-file key, or NULL. */
const struct setting *setting_find_key(const char *key);

/* Parses value for setting s and stores it in c. `where` names the source in
 * messages ("--port" or "config key \"port\""). Returns 0 or ERR_INVAL with a
 * message in msg. */
int setting_apply(struct config *c, const struct setting *s, const char *value,
                  const char *where, char *msg, size_t msg_size);

/* The current value of s in c as text (for --help defaults and the start-up
 * log) into out. API keys print as a count. */
void setting_format(const struct config *c, const struct setting *s, char *out, size_t out_size);

#endif
