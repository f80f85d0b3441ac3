/*
 * config/config_file.c - JSON config file merged over the defaults. Values
 * may be strings or numbers (sizes also as "512M"); api_keys is an array of
 * strings. Every value goes through setting_apply(), as flags do.
 */
#include "config/config_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "config/setting.h"
#include "engine/base/err.h"
#include "engine/base/file.h"

#define CONFIG_FILE_MAX_BYTES (1024 * 1024)

static int apply_value(struct config *c, const struct setting *s, json_t *v, const char *where,
                       char *msg, size_t msg_size) {
    char num[32];
    const char *text = NULL;
    if (json_is_string(v)) {
        text = json_string_value(v);
    } else if (json_is_boolean(v) && s->kind == SETTING_KIND_BOOL) {
        text = json_is_true(v) ? "true" : "false";
    } else if (json_is_integer(v) && s->kind != SETTING_KIND_STR && s->kind != SETTING_KIND_CHOICE &&
               s->kind != SETTING_KIND_LOGLEVEL && s->kind != SETTING_KIND_KEY) {
        snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(v));
        text = num;
    } else {
        snprintf(msg, msg_size, "%s: expected a %s", where,
                 s->kind == SETTING_KIND_I32 ? "integer"
                 : s->kind == SETTING_KIND_SIZE ? "size (integer bytes or a string like \"512M\")"
                 : s->kind == SETTING_KIND_BOOL ? "boolean"
                                                : "string");
        return ERR_INVAL;
    }
    return setting_apply(c, s, text, where, msg, msg_size);
}

int config_file_parse(struct config *c, const char *text, size_t len, const char *name, char *msg,
                      size_t msg_size) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(msg, msg_size, "%s:%d:%d: %s", name, jerr.line, jerr.column, jerr.text);
        return ERR_INVAL;
    }
    int err = 0;
    if (!json_is_object(root)) {
        snprintf(msg, msg_size, "%s: the config must be a JSON object", name);
        err = ERR_INVAL;
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        const struct setting *s = setting_find_key(key);
        char where[160];
        snprintf(where, sizeof(where), "%s: key \"%s\"", name, key);
        if (!s) {
            snprintf(msg, msg_size, "%s is not a setting (see llmserve serve --help)", where);
            err = ERR_INVAL;
            goto done;
        }
        if (s->kind == SETTING_KIND_KEY) {
            if (!json_is_array(v)) {
                snprintf(msg, msg_size, "%s: expected an array of strings", where);
                err = ERR_INVAL;
                goto done;
            }
            size_t i;
            json_t *item;
            json_array_foreach(v, i, item) {
                err = apply_value(c, s, item, where, msg, msg_size);
                if (err) goto done;
            }
            continue;
        }
        if (s->kind == SETTING_KIND_LORA && json_is_object(v)) {
            // {"NAME": "PATH", ...}
            const char *lora_name;
            json_t *path;
            json_object_foreach(v, lora_name, path) {
                if (!json_is_string(path)) {
                    snprintf(msg, msg_size, "%s: the path of \"%s\" must be a string", where,
                             lora_name);
                    err = ERR_INVAL;
                    goto done;
                }
                size_t n = strlen(lora_name) + strlen(json_string_value(path)) + 2;
                char *spec = malloc(n);
                if (!spec) {
                    err = ERR_NOMEM;
                    goto done;
                }
                snprintf(spec, n, "%s=%s", lora_name, json_string_value(path));
                err = setting_apply(c, s, spec, where, msg, msg_size);
                free(spec);
                if (err) goto done;
            }
            continue;
        }
        if (s->kind == SETTING_KIND_LORA && json_is_array(v)) {
            // ["NAME=PATH", ...]
            size_t i;
            json_t *item;
            json_array_foreach(v, i, item) {
                err = apply_value(c, s, item, where, msg, msg_size);
                if (err) goto done;
            }
            continue;
        }
        err = apply_value(c, s, v, where, msg, msg_size);
        if (err) goto done;
    }
done:
    json_decref(root);
    return err;
}

int config_file_load(struct config *c, const char *path, char *msg, size_t msg_size) {
    char *text = NULL;
    size_t len = 0;
    int err = file_read_all(path, CONFIG_FILE_MAX_BYTES, &text, &len);
    if (err) {
        snprintf(msg, msg_size, "cannot read config file %s: %s", path, err_str(err));
        return err == ERR_TOOLONG ? ERR_INVAL : ERR_IO;
    }
    err = config_file_parse(c, text, len, path, msg, msg_size);
    free(text);
    return err;
}
