/*
 * config/cli.c - command-line flags for `llmserve serve`, driven by the
 * settings table so flags, file keys and --help never disagree.
 */
#include "config/cli.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "config/config.h"
#include "config/setting.h"
#include "engine/base/err.h"

/* What one argument is. A long flag "--name=value" carries its value;
 * otherwise the value is the next argument (take_value()). */
enum arg_kind { ARG_SETTING, ARG_CONFIG, ARG_HELP, ARG_UNKNOWN, ARG_POSITIONAL };

struct arg {
    enum arg_kind kind;
    const struct setting *s;
    const char *name;     // the flag as written, up to '=' (for messages)
    size_t name_len;
    const char *value;    // inline value after '=', or NULL
};

static struct arg classify(const char *a) {
    struct arg r = {.kind = ARG_UNKNOWN, .name = a, .name_len = strlen(a)};
    if (a[0] != '-' || a[1] == 0) {
        r.kind = ARG_POSITIONAL;
        return r;
    }
    if (a[1] != '-') {
        // Short flag: exactly "-x".
        if (a[2] != 0) return r;
        if (a[1] == 'h') {
            r.kind = ARG_HELP;
            return r;
        }
        for (int i = 0; i < setting_n; i++) {
            if (setting_table[i].short_flag == a[1]) {
                r.kind = ARG_SETTING;
                r.s = &setting_table[i];
                return r;
            }
        }
        return r;
    }
    const char *name = a + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    r.name_len = len + 2;
    r.value = eq ? eq + 1 : NULL;
    if (len == 4 && strncmp(name, "help", 4) == 0) {
        r.kind = ARG_HELP;
        return r;
    }
    if (len == 6 && strncmp(name, "config", 6) == 0) {
        r.kind = ARG_CONFIG;
        return r;
    }
    for (int i = 0; i < setting_n; i++) {
        const char *f = setting_table[i].flag;
        if (strlen(f) == len && strncmp(f, name, len) == 0) {
            r.kind = ARG_SETTING;
            r.s = &setting_table[i];
            return r;
        }
    }
    return r;
}

/* The value of a flag: inline after '=' or the next argument. */
static int take_value(struct arg *a, int argc, char **argv, int *i, char *msg, size_t msg_size) {
    if (a->value) return 0;
    if (*i + 1 >= argc) {
        snprintf(msg, msg_size, "%.*s needs a value", (int)a->name_len, a->name);
        return ERR_INVAL;
    }
    *i += 1;
    a->value = argv[*i];
    return 0;
}

int cli_find_config(int argc, char **argv, const char **out_path, char *msg, size_t msg_size) {
    *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        struct arg a = classify(argv[i]);
        if (a.kind == ARG_CONFIG) {
            int err = take_value(&a, argc, argv, &i, msg, msg_size);
            if (err) return err;
            *out_path = a.value;
        } else if (a.kind == ARG_SETTING && !a.value && a.s->kind != SETTING_KIND_BOOL) {
            i++;  // skip the flag's value so it is not mistaken for a flag
        }
    }
    return 0;
}

int cli_parse(struct config *c, int argc, char **argv, char *msg, size_t msg_size) {
    for (int i = 1; i < argc; i++) {
        struct arg a = classify(argv[i]);
        int err = 0;
        switch (a.kind) {
        case ARG_HELP:
            c->show_help = true;
            break;
        case ARG_CONFIG:
            err = take_value(&a, argc, argv, &i, msg, msg_size);  // loaded by the caller
            break;
        case ARG_SETTING: {
            // A bool flag alone means true; a value only with '='.
            if (a.s->kind == SETTING_KIND_BOOL && !a.value) a.value = "true";
            err = take_value(&a, argc, argv, &i, msg, msg_size);
            if (err) break;
            char where[64];
            snprintf(where, sizeof(where), "%.*s", (int)a.name_len, a.name);
            err = setting_apply(c, a.s, a.value, where, msg, msg_size);
            break;
        }
        case ARG_UNKNOWN:
            snprintf(msg, msg_size, "unknown flag '%.*s' (see llmserve serve --help)",
                     (int)a.name_len, a.name);
            err = ERR_INVAL;
            break;
        case ARG_POSITIONAL:
            snprintf(msg, msg_size, "unexpected argument '%s' (see llmserve serve --help)",
                     argv[i]);
            err = ERR_INVAL;
            break;
        }
        if (err) return err;
    }
    return 0;
}

void cli_print_help(FILE *fp, const struct config *defaults) {
    fprintf(fp,
            "usage: llmserve serve -m FILE [options]\n"
            "\n"
            "Serves the model over an OpenAI-compatible HTTP API. Settings come from the\n"
            "defaults, then the JSON object in --config FILE (keys in brackets), then flags.\n"
            "\n"
            "  %-28s %s\n"
            "  %-28s %s\n",
            "    --config FILE", "JSON config file read before the flags",
            "-h, --help", "this text");
    for (int i = 0; i < setting_n; i++) {
        const struct setting *s = &setting_table[i];
        char flag[64];
        if (s->short_flag) {
            snprintf(flag, sizeof(flag), "-%c, --%s %s", s->short_flag, s->flag, s->arg);
        } else {
            snprintf(flag, sizeof(flag), "    --%s %s", s->flag, s->arg);
        }
        char def[128];
        setting_format(defaults, s, def, sizeof(def));
        fprintf(fp, "  %-28s %s\n  %-28s [%s] default: %s\n", flag, s->help, "", s->key, def);
    }
    fprintf(fp,
            "\n"
            "Sizes take K, M, G suffixes (binary). Keys given with --api-key, api_keys and\n"
            "--api-key-file add up; clients send them as 'Authorization: Bearer KEY'.\n"
            "A request selects an adapter with \"model\": \"NAME\"; the base model's name or\n"
            "no \"model\" means no adapter.\n");
}
