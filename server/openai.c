/*
 * server/openai.c - OpenAI request parsing and response building with
 * jansson. Every field is type-checked before use; a wrong type or range is a
 * 400 naming the field (OpenAI's "param"). JSON null means "not given".
 */
#define LOG_TAG "openai"
#include "server/openai.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <jansson.h>

#include "engine/base/alloc.h"
#include "engine/base/buf.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/fault.h"
#include "engine/base/log.h"
#include "server/json_schema.h"
#include "server/tool_call.h"

static int fail(struct openai_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct openai_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    e->err = ERR_INVAL;
    e->param = param;
    e->code = NULL;
    return ERR_INVAL;
}

/* An array sized by the request: it may fail (ERR_NOMEM in e: a 500 for this
 * request only), and a test may make it fail (engine/base/fault.h: site
 * parse, or tools for tool calling's arrays). NULL then; the caller returns
 * ERR_NOMEM. */
static void *request_calloc(enum fault_site site, size_t count, size_t size,
                            struct openai_error *e) {
    void *p = fault_calloc(site, count, size);
    if (!p) {
        snprintf(e->message, sizeof(e->message), "Out of memory while parsing the request");
        e->err = ERR_NOMEM;
        e->param = NULL;
        e->code = NULL;
    }
    return p;
}

/* ---- typed getters: 0 and *out untouched when absent or null --------------- */

static int get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   struct openai_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v);  // 16.0 is an integer to JavaScript clients
    } else {
        return fail(e, key, "'%s' must be an integer", key);
    }
    if (x < lo || x > hi) {
        return fail(e, key, "'%s' must be in [%" PRId64 ", %" PRId64 "], got %" PRId64, key, lo,
                    hi, x);
    }
    *out = x;
    return 0;
}

static int get_i32(json_t *o, const char *key, int32_t lo, int32_t hi, int32_t *out,
                   struct openai_error *e) {
    int64_t x = *out;
    int err = get_int(o, key, lo, hi, &x, e);
    if (!err) *out = (int32_t)x;
    return err;
}

static int get_float(json_t *o, const char *key, float *out, struct openai_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return fail(e, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x)) return fail(e, key, "'%s' must be finite", key);
    *out = (float)x;
    return 0;
}

static int get_bool(json_t *o, const char *key, bool *out, struct openai_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return fail(e, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* Copies a JSON string (may hold NUL bytes: refused, prompts are C strings). */
static int dup_string(json_t *v, const char *param, char **out, struct openai_error *e) {
    size_t len = json_string_length(v);
    const char *s = json_string_value(v);
    if (memchr(s, 0, len)) return fail(e, param, "'%s' must not contain NUL characters", param);
    *out = xstrdup(s);
    return 0;
}

/* ---- fields shared by both routes ------------------------------------------- */

static const char *const known_fields[] = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "min_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logit_bias", "logprobs", "top_logprobs", "echo", "stream",
    "stream_options", "user", "ignore_eos", "min_tokens", "stop_token_ids",
    "include_stop_str_in_output", "skip_special_tokens", "response_format", "grammar", "tools",
    "tool_choice", "parallel_tool_calls",
};

static void log_unknown_fields(json_t *root) {
    if (LOG_LEVEL_DEBUG > log_level_current) return;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        bool known = false;
        for (size_t i = 0; i < sizeof(known_fields) / sizeof(known_fields[0]); i++) {
            if (strcmp(key, known_fields[i]) == 0) known = true;
        }
        if (!known) LOG_DEBUG("ignoring unknown field '%.64s'", key);
    }
}

static int parse_stop(json_t *root, struct openai_request *r, struct openai_error *e) {
    json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return 0;  // "" stops nothing; clients send it
        int err = dup_string(v, "stop", &r->stop[0], e);
        if (err) return err;
        r->n_stop = 1;
    } else if (json_is_array(v)) {
        if (json_array_size(v) > STOP_MAX_STRINGS) {
            return fail(e, "stop", "'stop' may hold at most %d strings", STOP_MAX_STRINGS);
        }
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) {
            if (!json_is_string(s)) return fail(e, "stop", "'stop' must be an array of strings");
            int err = dup_string(s, "stop", &r->stop[r->n_stop], e);
            if (err) return err;
            r->n_stop++;
        }
    } else {
        return fail(e, "stop", "'stop' must be a string or an array of strings");
    }
    char msg[200];
    if (stop_matcher_validate((const char *const *)r->stop, r->n_stop, msg, sizeof(msg))) {
        return fail(e, "stop", "%s", msg);
    }
    return 0;
}

static int parse_logit_bias(json_t *root, int32_t n_vocab, struct openai_request *r,
                            struct openai_error *e) {
    json_t *v = json_object_get(root, "logit_bias");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return fail(e, "logit_bias", "'logit_bias' must be an object");
    size_t n = json_object_size(v);
    if (n > (size_t)n_vocab) return fail(e, "logit_bias", "'logit_bias' has too many entries");
    r->logit_bias = request_calloc(FAULT_SITE_PARSE, n ? n : 1, sizeof(*r->logit_bias), e);
    if (!r->logit_bias) return ERR_NOMEM;
    const char *key;
    json_t *b;
    int32_t k = 0;
    json_object_foreach(v, key, b) {
        char *end = NULL;
        long long id = strtoll(key, &end, 10);
        if (end == key || *end || id < 0 || id >= n_vocab) {
            return fail(e, "logit_bias", "'logit_bias' key '%.32s' is not a token id in [0, %d)",
                        key, (int)n_vocab);
        }
        if (!json_is_number(b) || !isfinite(json_number_value(b))) {
            return fail(e, "logit_bias", "'logit_bias' values must be numbers");
        }
        r->logit_bias[k].token = (int32_t)id;
        r->logit_bias[k].bias = (float)json_number_value(b);
        k++;
    }
    r->sampling.logit_bias = r->logit_bias;
    r->sampling.n_logit_bias = k;
    return 0;
}

static int parse_stop_token_ids(json_t *root, int32_t n_vocab, struct openai_request *r,
                                struct openai_error *e) {
    json_t *v = json_object_get(root, "stop_token_ids");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v) || json_array_size(v) > 1024) {
        return fail(e, "stop_token_ids", "'stop_token_ids' must be an array of at most 1024 ids");
    }
    size_t n = json_array_size(v);
    r->stop_token_ids = request_calloc(FAULT_SITE_PARSE, n ? n : 1, sizeof(int32_t), e);
    if (!r->stop_token_ids) return ERR_NOMEM;
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 ||
            json_integer_value(t) >= n_vocab) {
            return fail(e, "stop_token_ids", "'stop_token_ids' must hold token ids in [0, %d)",
                        (int)n_vocab);
        }
        r->stop_token_ids[i] = (int32_t)json_integer_value(t);
    }
    r->n_stop_token_ids = (int32_t)n;
    return 0;
}

static int parse_common(json_t *root, int32_t n_vocab, struct openai_request *r,
                        struct openai_error *e) {
    int err = 0;
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return fail(e, "model", "'model' must be a string");
        if ((err = dup_string(model, "model", &r->model, e))) return err;
    }
    json_t *user = json_object_get(root, "user");
    if (user && !json_is_null(user) && !json_is_string(user)) {
        return fail(e, "user", "'user' must be a string");
    }
    struct sampler_params *sp = &r->sampling;
    int64_t seed = 0;
    bool has_seed = json_object_get(root, "seed") && !json_is_null(json_object_get(root, "seed"));
    if ((err = get_i32(root, "max_tokens", 1, INT32_MAX, &r->max_tokens, e)) ||
        (err = get_i32(root, "max_completion_tokens", 1, INT32_MAX, &r->max_tokens, e)) ||
        (err = get_i32(root, "n", 1, OPENAI_MAX_N, &r->n, e)) ||
        (err = get_float(root, "temperature", &sp->temperature, e)) ||
        (err = get_float(root, "top_p", &sp->top_p, e)) ||
        (err = get_i32(root, "top_k", INT32_MIN, INT32_MAX, &sp->top_k, e)) ||
        (err = get_float(root, "min_p", &sp->min_p, e)) ||
        (err = get_float(root, "presence_penalty", &sp->presence_penalty, e)) ||
        (err = get_float(root, "frequency_penalty", &sp->frequency_penalty, e)) ||
        (err = get_float(root, "repetition_penalty", &sp->repetition_penalty, e)) ||
        (err = get_int(root, "seed", INT64_MIN, INT64_MAX, &seed, e)) ||
        (err = get_i32(root, "min_tokens", 0, INT32_MAX, &r->min_tokens, e)) ||
        (err = get_bool(root, "stream", &r->stream, e)) ||
        (err = get_bool(root, "ignore_eos", &r->ignore_eos, e)) ||
        (err = get_bool(root, "include_stop_str_in_output", &r->include_stop_str, e)) ||
        (err = get_bool(root, "skip_special_tokens", &r->skip_special, e))) {
        return err;
    }
    if (has_seed) {
        sp->seed = (uint64_t)seed;
        sp->has_seed = true;
    }
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            return fail(e, "stream_options", "'stream_options' must be an object");
        }
        if ((err = get_bool(so, "include_usage", &r->include_usage, e))) return err;
    }
    if ((err = parse_stop(root, r, e)) || (err = parse_logit_bias(root, n_vocab, r, e)) ||
        (err = parse_stop_token_ids(root, n_vocab, r, e))) {
        return err;
    }
    return 0;
}

/* ---- prompts and messages -------------------------------------------------- */

static int parse_ids(json_t *arr, int32_t n_vocab, struct openai_prompt *p,
                     struct openai_error *e) {
    size_t n = json_array_size(arr);
    if (n == 0) return fail(e, "prompt", "'prompt' must not be empty");
    if (n > INT32_MAX / 2) return fail(e, "prompt", "'prompt' is too long");
    p->ids = request_calloc(FAULT_SITE_PARSE, n, sizeof(int32_t), e);
    if (!p->ids) return ERR_NOMEM;
    size_t i;
    json_t *t;
    json_array_foreach(arr, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 ||
            json_integer_value(t) >= n_vocab) {
            return fail(e, "prompt", "'prompt' token ids must be integers in [0, %d)",
                        (int)n_vocab);
        }
        p->ids[i] = (int32_t)json_integer_value(t);
    }
    p->n_ids = (int32_t)n;
    return 0;
}

/* string | [string, ...] | [int, ...] | [[int, ...], ...] */
static int parse_prompt(json_t *root, int32_t n_vocab, struct openai_request *r,
                        struct openai_error *e) {
    json_t *v = json_object_get(root, "prompt");
    if (!v || json_is_null(v)) return fail(e, "prompt", "'prompt' is required");
    if (json_is_string(v)) {
        r->prompts = request_calloc(FAULT_SITE_PARSE, 1, sizeof(*r->prompts), e);
        if (!r->prompts) return ERR_NOMEM;
        r->n_prompts = 1;
        return dup_string(v, "prompt", &r->prompts[0].text, e);
    }
    if (!json_is_array(v) || json_array_size(v) == 0) {
        return fail(e, "prompt",
                    "'prompt' must be a string, an array of strings, an array of token ids "
                    "or an array of token id arrays");
    }
    json_t *first = json_array_get(v, 0);
    if (json_is_integer(first)) {
        r->prompts = request_calloc(FAULT_SITE_PARSE, 1, sizeof(*r->prompts), e);
        if (!r->prompts) return ERR_NOMEM;
        r->n_prompts = 1;
        return parse_ids(v, n_vocab, &r->prompts[0], e);
    }
    size_t n = json_array_size(v);
    if (n > OPENAI_MAX_PROMPTS) {
        return fail(e, "prompt", "'prompt' may hold at most %d prompts", OPENAI_MAX_PROMPTS);
    }
    r->prompts = request_calloc(FAULT_SITE_PARSE, n, sizeof(*r->prompts), e);
    if (!r->prompts) return ERR_NOMEM;
    r->n_prompts = (int32_t)n;
    size_t i;
    json_t *item;
    json_array_foreach(v, i, item) {
        int err;
        if (json_is_string(item) && json_is_string(first)) {
            err = dup_string(item, "prompt", &r->prompts[i].text, e);
        } else if (json_is_array(item) && json_is_array(first)) {
            err = parse_ids(item, n_vocab, &r->prompts[i], e);
        } else {
            err = fail(e, "prompt", "'prompt' array items must all be strings or all token id "
                                    "arrays");
        }
        if (err) return err;
    }
    return 0;
}

/* ---- tools ------------------------------------------------------------------- */

/* A float as Python's repr() writes it, which json.dumps uses: the shortest
 * digits that read back as x; fixed notation when the decimal point falls
 * within -4 < decpt <= 16 (with ".0" for whole numbers), else d.ddde+XX with
 * at least two exponent digits. */
static void py_float(double x, struct buf *out) {
    if (!isfinite(x)) {
        buf_append_str(out, isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity");
        return;
    }
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof(e), "%.*e", prec - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    // e is [-]d[.ddd]e[+-]XX
    const char *p = e;
    if (*p == '-') buf_append_char(out, *p++);
    char digits[24];
    int n = 0;
    for (; *p && *p != 'e'; p++) {
        if (*p != '.') digits[n++] = *p;
    }
    digits[n] = '\0';
    int decpt = atoi(p + 1) + 1;
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            buf_append_str(out, "0.");
            for (int i = 0; i < -decpt; i++) buf_append_char(out, '0');
            buf_append_str(out, digits);
        } else if (decpt >= n) {
            buf_append_str(out, digits);
            for (int i = n; i < decpt; i++) buf_append_char(out, '0');
            buf_append_str(out, ".0");
        } else {
            buf_append(out, digits, (size_t)decpt);
            buf_append_char(out, '.');
            buf_append_str(out, digits + decpt);
        }
        return;
    }
    buf_append_char(out, digits[0]);
    if (n > 1) {
        buf_append_char(out, '.');
        buf_append_str(out, digits + 1);
    }
    char ex[16];
    snprintf(ex, sizeof(ex), "e%+03d", decpt - 1);
    buf_append_str(out, ex);
}

static void py_newline(struct buf *out, int indent, int level) {
    buf_append_char(out, '\n');
    for (int i = 0; i < indent * level; i++) buf_append_char(out, ' ');
}

/* v as Python's json.dumps(v, ensure_ascii=False[, indent=indent]) writes
 * it: ", " and ": " separators, or with an indent "," and a new line per
 * member; members in their order (jansson keeps it). */
static void py_dumps(json_t *v, int indent, int level, struct buf *out) {
    size_t i;
    json_t *item;
    const char *key;
    switch (json_typeof(v)) {
        case JSON_OBJECT:
            if (json_object_size(v) == 0) {
                buf_append_str(out, "{}");
                break;
            }
            buf_append_char(out, '{');
            i = 0;
            json_object_foreach(v, key, item) {
                if (i++) buf_append_str(out, indent ? "," : ", ");
                if (indent) py_newline(out, indent, level + 1);
                chat_append_json_string(out, key, strlen(key));
                buf_append_str(out, ": ");
                py_dumps(item, indent, level + 1, out);
            }
            if (indent) py_newline(out, indent, level);
            buf_append_char(out, '}');
            break;
        case JSON_ARRAY:
            if (json_array_size(v) == 0) {
                buf_append_str(out, "[]");
                break;
            }
            buf_append_char(out, '[');
            json_array_foreach(v, i, item) {
                if (i) buf_append_str(out, indent ? "," : ", ");
                if (indent) py_newline(out, indent, level + 1);
                py_dumps(item, indent, level + 1, out);
            }
            if (indent) py_newline(out, indent, level);
            buf_append_char(out, ']');
            break;
        case JSON_STRING:
            chat_append_json_string(out, json_string_value(v), json_string_length(v));
            break;
        case JSON_INTEGER: {
            char n[32];
            snprintf(n, sizeof(n), "%" PRId64, (int64_t)json_integer_value(v));
            buf_append_str(out, n);
            break;
        }
        case JSON_REAL:
            py_float(json_real_value(v), out);
            break;
        case JSON_TRUE:
            buf_append_str(out, "true");
            break;
        case JSON_FALSE:
            buf_append_str(out, "false");
            break;
        case JSON_NULL:
            buf_append_str(out, "null");
            break;
    }
}

/* A JSON value as Jinja's tojson writes it (chat.h): HF's filter is
 * json.dumps(ensure_ascii=False), so tools and arguments read in the prompt
 * exactly as the model saw them in training; indent 4 for tojson(indent=4). */
static char *tojson(json_t *v, bool indent) {
    struct buf b = {0};
    py_dumps(v, indent ? 4 : 0, 0, &b);
    return buf_take(&b);
}

/* messages[i].tool_calls (assistant) and .tool_call_id (tool): arguments
 * are a JSON text in the API, handed to the template as the parsed value. */
static int parse_message_tools(json_t *m, int32_t i, struct chat_message *out,
                               struct openai_error *e) {
    json_t *id = json_object_get(m, "tool_call_id");
    if (id && !json_is_null(id)) {
        if (!json_is_string(id))
            return fail(e, "messages", "messages[%d].tool_call_id must be a string", (int)i);
        char *s = NULL;
        int err = dup_string(id, "messages", &s, e);
        if (err) return err;
        out->tool_call_id = s;
    } else if (strcmp(out->role, "tool") == 0) {
        return fail(e, "messages", "messages[%d]: a 'tool' message needs 'tool_call_id'", (int)i);
    }
    json_t *calls = json_object_get(m, "tool_calls");
    if (!calls || json_is_null(calls)) return 0;
    if (!json_is_array(calls) || json_array_size(calls) > TOOL_CALL_MAX_CALLS)
        return fail(e, "messages", "messages[%d].tool_calls must be an array of at most %d calls",
                    (int)i, TOOL_CALL_MAX_CALLS);
    size_t n = json_array_size(calls);
    if (n == 0) return 0;
    struct chat_tool_call *cs = request_calloc(FAULT_SITE_TOOLS, n, sizeof(*cs), e);
    if (!cs) return ERR_NOMEM;
    out->tool_calls = cs;
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) {
        json_t *cid = json_object_get(c, "id");
        json_t *fn = json_object_get(c, "function");
        json_t *name = json_object_get(fn, "name");
        json_t *args = json_object_get(fn, "arguments");
        json_t *type = json_object_get(c, "type");
        if (!json_is_object(c) || !json_is_string(cid) || !json_is_object(fn) ||
            !json_is_string(name) || !json_is_string(args) ||
            (type && !(json_is_string(type) && strcmp(json_string_value(type), "function") == 0)))
            return fail(e, "messages", "messages[%d].tool_calls[%d] must be {\"id\": string, "
                        "\"type\": \"function\", \"function\": {\"name\": string, "
                        "\"arguments\": string}}", (int)i, (int)k);
        json_error_t jerr;
        json_t *parsed = json_loadb(json_string_value(args), json_string_length(args),
                                    JSON_DECODE_ANY, &jerr);
        if (!parsed)
            return fail(e, "messages", "messages[%d].tool_calls[%d].function.arguments is not "
                        "JSON: %s", (int)i, (int)k, jerr.text);
        char *sid = NULL, *sname = NULL;
        int err = dup_string(cid, "messages", &sid, e);
        if (!err) err = dup_string(name, "messages", &sname, e);
        cs[k].id = sid;
        cs[k].name = sname;
        cs[k].arguments = tojson(parsed, false);
        out->n_tool_calls = (int32_t)k + 1;
        json_decref(parsed);
        if (err) return err;
    }
    return 0;
}

/* One entry of 'tools' into t: checked, serialised for the templates, and its
 * parameters' grammar rules named "t<i>". */
static int parse_tool(json_t *v, int32_t i, struct openai_tool *t, struct openai_error *e) {
    json_t *type = json_object_get(v, "type");
    json_t *fn = json_object_get(v, "function");
    if (!json_is_object(v) || !json_is_string(type) ||
        strcmp(json_string_value(type), "function") != 0 || !json_is_object(fn))
        return fail(e, "tools", "tools[%d] must be {\"type\": \"function\", \"function\": "
                    "{...}}", (int)i);
    json_t *name = json_object_get(fn, "name");
    if (!json_is_string(name) || !tool_call_name_valid(json_string_value(name)))
        return fail(e, "tools", "tools[%d].function.name must be a string of 1 to %d letters, "
                    "digits, '_' or '-'", (int)i, TOOL_CALL_NAME_MAX);
    json_t *desc = json_object_get(fn, "description");
    if (desc && !json_is_string(desc) && !json_is_null(desc))
        return fail(e, "tools", "tools[%d].function.description must be a string", (int)i);
    json_t *strict = json_object_get(fn, "strict");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return fail(e, "tools", "tools[%d].function.strict must be a boolean", (int)i);
    json_t *params = json_object_get(fn, "parameters");
    if (params && !json_is_object(params))
        return fail(e, "tools", "tools[%d].function.parameters must be a JSON Schema object",
                    (int)i);
    t->name = xstrdup(json_string_value(name));
    snprintf(t->rule, sizeof(t->rule), "t%d", (int)i);
    struct buf rules = {0};
    if (params) {
        char msg[200];
        if (json_schema_to_gbnf_rule(params, t->rule, &rules, msg, sizeof(msg))) {
            buf_free(&rules);
            return fail(e, "tools", "Invalid schema for tools[%d].function.parameters: %s",
                        (int)i, msg);
        }
    } else {
        buf_append_str(&rules, t->rule);  // no parameters: any object
        buf_append_str(&rules, " ::= object\n");
    }
    t->rules = buf_take(&rules);
    t->json = tojson(v, false);
    t->json_indent4 = tojson(v, true);
    size_t n = json_object_size(fn);
    t->members = request_calloc(FAULT_SITE_TOOLS, n ? n : 1, sizeof(*t->members), e);
    if (!t->members) return ERR_NOMEM;
    const char *key;
    json_t *mv;
    json_object_foreach(fn, key, mv) {
        struct chat_tool_member *mm = &t->members[t->n_members++];
        mm->key = xstrdup(key);
        mm->is_string = json_is_string(mv);
        mm->value = mm->is_string ? xstrdup(json_string_value(mv)) : tojson(mv, false);
    }
    return 0;
}

/* tools, tool_choice and parallel_tool_calls (chat). */
static int parse_tools(json_t *root, struct openai_request *r, struct openai_error *e) {
    json_t *tools = json_object_get(root, "tools");
    json_t *choice = json_object_get(root, "tool_choice");
    if (choice && json_is_null(choice)) choice = NULL;
    r->parallel_tool_calls = true;
    int err = get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, e);
    if (err) return err;
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools) || json_array_size(tools) > TOOL_CALL_MAX_TOOLS)
            return fail(e, "tools", "'tools' must be an array of at most %d tools",
                        TOOL_CALL_MAX_TOOLS);
        size_t n = json_array_size(tools);
        r->tools = request_calloc(FAULT_SITE_TOOLS, n ? n : 1, sizeof(*r->tools), e);
        if (!r->tools) return ERR_NOMEM;
        size_t i;
        json_t *v;
        json_array_foreach(tools, i, v) {
            r->n_tools = (int32_t)i + 1;
            if ((err = parse_tool(v, (int32_t)i, &r->tools[i], e))) return err;
            for (size_t k = 0; k < i; k++) {
                if (strcmp(r->tools[k].name, r->tools[i].name) == 0)
                    return fail(e, "tools", "tools[%d]: the function name '%s' is used twice",
                                (int)i, r->tools[i].name);
            }
        }
        r->chat_tools = request_calloc(FAULT_SITE_TOOLS, n ? n : 1, sizeof(*r->chat_tools), e);
        if (!r->chat_tools) return ERR_NOMEM;
        for (size_t k = 0; k < n; k++) {
            r->chat_tools[k] = (struct chat_tool){.json = r->tools[k].json,
                                                  .json_indent4 = r->tools[k].json_indent4,
                                                  .members = r->tools[k].members,
                                                  .n_members = r->tools[k].n_members};
        }
    }
    r->tool_choice = r->n_tools > 0 ? OPENAI_TOOL_CHOICE_AUTO : OPENAI_TOOL_CHOICE_NONE;
    if (!choice) return 0;
    if (json_is_string(choice)) {
        const char *c = json_string_value(choice);
        if (strcmp(c, "none") == 0) r->tool_choice = OPENAI_TOOL_CHOICE_NONE;
        else if (strcmp(c, "auto") == 0) r->tool_choice = OPENAI_TOOL_CHOICE_AUTO;
        else if (strcmp(c, "required") == 0) r->tool_choice = OPENAI_TOOL_CHOICE_REQUIRED;
        else
            return fail(e, "tool_choice", "Invalid value: '%.64s'. Supported values are: 'none', "
                        "'auto', 'required' and {\"type\": \"function\", \"function\": "
                        "{\"name\": ...}}.", c);
    } else {
        json_t *type = json_object_get(choice, "type");
        json_t *name = json_object_get(json_object_get(choice, "function"), "name");
        if (!json_is_object(choice) || !json_is_string(type) ||
            strcmp(json_string_value(type), "function") != 0 || !json_is_string(name))
            return fail(e, "tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        r->tool_choice = OPENAI_TOOL_CHOICE_NAMED;
        r->tool_named = -1;
        for (int32_t k = 0; k < r->n_tools; k++) {
            if (strcmp(r->tools[k].name, json_string_value(name)) == 0) r->tool_named = k;
        }
        if (r->tool_named < 0 && r->n_tools > 0)
            return fail(e, "tool_choice", "Invalid 'tool_choice': no function named '%.64s' in "
                        "'tools'", json_string_value(name));
    }
    if (r->tool_choice != OPENAI_TOOL_CHOICE_NONE && r->n_tools == 0)
        return fail(e, "tool_choice", "'tool_choice' is only allowed when 'tools' are "
                    "specified");
    return 0;
}

/* content: string | null | [{"type": "text", "text": "..."}, ...] */
static int parse_content(json_t *c, char **out, struct openai_error *e) {
    if (!c || json_is_null(c)) {
        *out = xstrdup("");
        return 0;
    }
    if (json_is_string(c)) return dup_string(c, "messages", out, e);
    if (!json_is_array(c)) {
        return fail(e, "messages", "message 'content' must be a string or an array of parts");
    }
    struct buf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *type = json_object_get(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) ||
            strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
            buf_free(&b);
            return fail(e, "messages", "only content parts of type 'text' are supported");
        }
        if (memchr(json_string_value(text), 0, json_string_length(text))) {
            buf_free(&b);
            return fail(e, "messages", "message content must not contain NUL characters");
        }
        buf_append(&b, json_string_value(text), json_string_length(text));
    }
    *out = b.data ? buf_take(&b) : xstrdup("");
    return 0;
}

static int parse_messages(json_t *root, struct openai_request *r, struct openai_error *e) {
    json_t *v = json_object_get(root, "messages");
    if (!v || json_is_null(v)) return fail(e, "messages", "'messages' is required");
    if (!json_is_array(v) || json_array_size(v) == 0) {
        return fail(e, "messages", "'messages' must be a non-empty array");
    }
    size_t n = json_array_size(v);
    if (n > OPENAI_MAX_MESSAGES) {
        return fail(e, "messages", "'messages' may hold at most %d messages",
                    OPENAI_MAX_MESSAGES);
    }
    r->messages = request_calloc(FAULT_SITE_PARSE, n, sizeof(*r->messages), e);
    if (!r->messages) return ERR_NOMEM;
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) {
        if (!json_is_object(m)) return fail(e, "messages", "each message must be an object");
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) return fail(e, "messages", "each message needs a 'role'");
        char *role_s = NULL;
        char *content_s = NULL;
        int err = dup_string(role, "messages", &role_s, e);
        if (!err) err = parse_content(json_object_get(m, "content"), &content_s, e);
        r->messages[i].role = role_s;
        r->messages[i].content = content_s;
        r->n_messages = (int32_t)i + 1;
        if (!err) err = parse_message_tools(m, (int32_t)i, &r->messages[i], e);
        if (err) return err;
    }
    return 0;
}

static int parse_logprobs(json_t *root, struct openai_request *r, struct openai_error *e) {
    json_t *v = json_object_get(root, "logprobs");
    if (r->route == OPENAI_ROUTE_COMPLETIONS) {
        // Completions: logprobs is the number of alternatives (OpenAI: up to 5).
        if (v && json_is_boolean(v)) {
            r->n_logprobs = json_is_true(v) ? 0 : -1;
            return 0;
        }
        return get_i32(root, "logprobs", 0, SAMPLER_MAX_TOP_LOGPROBS, &r->n_logprobs, e);
    }
    // Chat: logprobs is a boolean, top_logprobs the number of alternatives.
    bool want = false;
    int32_t top = 0;
    int err = get_bool(root, "logprobs", &want, e);
    if (!err) err = get_i32(root, "top_logprobs", 0, SAMPLER_MAX_TOP_LOGPROBS, &top, e);
    if (err) return err;
    json_t *tl = json_object_get(root, "top_logprobs");
    if (!want && tl && !json_is_null(tl) && top > 0) {
        return fail(e, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
    }
    r->n_logprobs = want ? top : -1;
    return 0;
}

/* response_format ({"type": "text" | "json_object" | "json_schema"}) and the
 * `grammar` extension (GBNF text, as llama.cpp's server takes it) into
 * r->grammar, compiled here so a bad one is a 400 naming its problem. */
static int parse_structured(json_t *root, struct openai_request *r, struct openai_error *e) {
    json_t *rf = json_object_get(root, "response_format");
    json_t *gr = json_object_get(root, "grammar");
    if (gr && json_is_null(gr)) gr = NULL;
    if (rf && json_is_null(rf)) rf = NULL;
    if (gr && !json_is_string(gr)) return fail(e, "grammar", "'grammar' must be a string (GBNF)");
    struct buf text = {0};
    const char *param = "grammar";
    if (rf) {
        json_t *type = json_object_get(rf, "type");
        if (!json_is_object(rf) || !json_is_string(type))
            return fail(e, "response_format", "'response_format' must be an object with a 'type'");
        const char *t = json_string_value(type);
        bool is_text = strcmp(t, "text") == 0;
        if (!is_text && strcmp(t, "json_object") != 0 && strcmp(t, "json_schema") != 0) {
            return fail(e, "response_format", "Invalid value: '%.64s'. Supported values are: "
                        "'json_object', 'json_schema', and 'text'.", t);
        }
        if (!is_text && gr) {
            return fail(e, "grammar", "'grammar' and a 'response_format' of type '%s' cannot both "
                        "be given", t);
        }
        param = "response_format";
        if (strcmp(t, "json_object") == 0) json_schema_object_gbnf(&text);
        if (strcmp(t, "json_schema") == 0) {
            json_t *js = json_object_get(rf, "json_schema");
            if (!json_is_object(js))
                return fail(e, "response_format", "'response_format.json_schema' must be an object");
            json_t *name = json_object_get(js, "name");
            json_t *strict = json_object_get(js, "strict");
            if (name && !json_is_string(name))
                return fail(e, "response_format", "'response_format.json_schema.name' must be a string");
            if (strict && !json_is_boolean(strict) && !json_is_null(strict))
                return fail(e, "response_format", "'response_format.json_schema.strict' must be a boolean");
            json_t *schema = json_object_get(js, "schema");
            char msg[200];
            if (!schema) {
                json_schema_object_gbnf(&text);  // OpenAI: no schema, any object
            } else if (json_schema_to_gbnf(schema, &text, msg, sizeof(msg))) {
                buf_free(&text);
                return fail(e, "response_format", "Invalid schema for response_format: %s", msg);
            }
        }
    }
    if (gr) buf_append(&text, json_string_value(gr), json_string_length(gr));
    if (!text.len) {
        buf_free(&text);
        return 0;
    }
    char msg[200];
    int err = gbnf_compile(text.data, text.len, &r->grammar, msg, sizeof(msg));
    buf_free(&text);
    if (err == ERR_INVAL) return fail(e, param, "Invalid grammar: %s", msg);
    if (err) {
        e->err = err;
        snprintf(e->message, sizeof(e->message), "could not compile the grammar: %s", err_str(err));
    }
    return err;
}

int openai_parse_grammar(struct json_t *root, struct gbnf **out, struct openai_error *e) {
    struct openai_request r = {0};
    memset(e, 0, sizeof(*e));
    int err = parse_structured(root, &r, e);
    *out = err ? NULL : r.grammar;
    if (err) gbnf_release(r.grammar);
    return err;
}

int openai_parse(enum openai_route route, const char *body, size_t len, int32_t n_vocab,
                 struct openai_request *out, struct openai_error *e) {
    memset(out, 0, sizeof(*out));
    memset(e, 0, sizeof(*e));
    out->route = route;
    out->max_tokens = -1;
    out->n = 1;
    out->n_logprobs = -1;
    out->skip_special = true;
    out->sampling = sampler_default_params();

    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) {
        return fail(e, NULL, "We could not parse the JSON body of your request: %s (line %d, "
                             "column %d)", jerr.text, jerr.line, jerr.column);
    }
    int err = 0;
    if (!json_is_object(root)) {
        err = fail(e, NULL, "The request body must be a JSON object");
        goto done;
    }
    log_unknown_fields(root);
    err = parse_common(root, n_vocab, out, e);
    if (!err) err = parse_logprobs(root, out, e);
    if (!err && route == OPENAI_ROUTE_COMPLETIONS) {
        err = get_bool(root, "echo", &out->echo, e);
        if (!err) err = parse_prompt(root, n_vocab, out, e);
    }
    if (!err && route == OPENAI_ROUTE_CHAT) err = parse_messages(root, out, e);
    if (!err && route == OPENAI_ROUTE_CHAT) err = parse_tools(root, out, e);
    if (!err) err = parse_structured(root, out, e);
    if (!err && out->grammar && out->tool_choice != OPENAI_TOOL_CHOICE_NONE) {
        err = fail(e, "tool_choice", "'tools' with a 'tool_choice' other than 'none' cannot be "
                   "combined with a 'response_format' or 'grammar' that constrains the reply");
    }
    if (!err && out->n_prompts * out->n > OPENAI_MAX_CHOICES) {
        err = fail(e, "n", "prompts times 'n' must be at most %d", OPENAI_MAX_CHOICES);
    }
    if (!err) {
        char msg[200];
        if (sampler_params_validate(&out->sampling, n_vocab, msg, sizeof(msg))) {
            err = fail(e, NULL, "%s", msg);
        }
    }
done:
    json_decref(root);
    if (err) openai_request_deinit(out);
    return err;
}

void openai_request_deinit(struct openai_request *r) {
    if (!r) return;
    free(r->model);
    for (int32_t i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    for (int32_t i = 0; i < r->n_messages; i++) {
        struct chat_message *m = &r->messages[i];
        free((char *)m->role);
        free((char *)m->content);
        free((char *)m->tool_call_id);
        for (int32_t k = 0; k < m->n_tool_calls; k++) {
            free((char *)m->tool_calls[k].id);
            free((char *)m->tool_calls[k].name);
            free((char *)m->tool_calls[k].arguments);
        }
        free((struct chat_tool_call *)m->tool_calls);
    }
    for (int32_t i = 0; i < r->n_tools; i++) {
        struct openai_tool *t = &r->tools[i];
        free(t->name);
        free(t->rules);
        free(t->json);
        free(t->json_indent4);
        for (int32_t k = 0; k < t->n_members; k++) {
            free((char *)t->members[k].key);
            free((char *)t->members[k].value);
        }
        free(t->members);
    }
    free(r->tools);
    free(r->chat_tools);
    free(r->messages);
    free(r->logit_bias);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop_token_ids);
    gbnf_release(r->grammar);
    memset(r, 0, sizeof(*r));
}

/* ---- prepare: model check, chat rendering, tokenizing, lengths -------------- */

static int tokenize(const struct tokenizer *tok, const char *text, bool add_special,
                    struct openai_prompt *p, const char *param, struct openai_error *e) {
    int err = tokenizer_encode(tok, text, strlen(text), add_special, true, &p->ids, &p->n_ids);
    if (err == ERR_INVAL) return fail(e, param, "'%s' is not valid UTF-8", param);
    if (err) {
        e->err = err;
        snprintf(e->message, sizeof(e->message), "could not tokenize the prompt: %s",
                 err_str(err));
        return err;
    }
    return 0;
}

/* The tool-call grammar of the template's syntax: from the first token for
 * required and named choices, from the syntax's trigger on for auto (whose
 * text keeps control tokens, so a trigger that is one, Mistral's
 * [TOOL_CALLS], is seen). */
static int prepare_tools(struct openai_request *r, const struct openai_model *m,
                         struct openai_error *e) {
    if (chat_tool_syntax(m->chat_family, &r->tool_syntax) != 0) {
        return fail(e, "tools", "This model's chat template (%s) does not support tools",
                    chat_family_name(m->chat_family));
    }
    struct tool_call_tool *tt =
        request_calloc(FAULT_SITE_TOOLS, (size_t)r->n_tools, sizeof(*tt), e);
    if (!tt) return ERR_NOMEM;
    int32_t n = 0;
    for (int32_t i = 0; i < r->n_tools; i++) {
        if (r->tool_choice == OPENAI_TOOL_CHOICE_NAMED && i != r->tool_named) continue;
        tt[n++] = (struct tool_call_tool){
            .name = r->tools[i].name, .rules = r->tools[i].rules, .rule = r->tools[i].rule};
    }
    bool parallel = r->parallel_tool_calls && r->tool_choice != OPENAI_TOOL_CHOICE_NAMED;
    struct buf text = {0};
    tool_call_grammar(&r->tool_syntax, tt, n, parallel, &text);
    free(tt);
    char msg[200];
    int err = gbnf_compile(text.data, text.len, &r->grammar, msg, sizeof(msg));
    buf_free(&text);
    if (err == ERR_INVAL) return fail(e, "tools", "Invalid tools: %s", msg);
    if (err) {
        e->err = err;
        snprintf(e->message, sizeof(e->message), "could not compile the tools' grammar: %s",
                 err_str(err));
        return err;
    }
    r->parse_tools = true;
    if (r->tool_choice == OPENAI_TOOL_CHOICE_AUTO) {
        // The syntax's marker (Llama 3.1's <|python_tag|>) starts the calls too.
        const char *pre = r->tool_syntax.trigger_prefix;
        snprintf(r->grammar_trigger_text, sizeof(r->grammar_trigger_text), "%s%s%s",
                 pre && pre[0] ? pre : "", pre && pre[0] ? "\n" : "", r->tool_syntax.trigger);
        r->grammar_trigger = r->grammar_trigger_text;
        r->skip_special = false;
    }
    return 0;
}

int openai_prepare(struct openai_request *r, const struct openai_model *m,
                   struct openai_error *e) {
    memset(e, 0, sizeof(*e));
    if (r->model && strcmp(r->model, m->name) != 0) {
        snprintf(e->message, sizeof(e->message), "The model '%.128s' does not exist", r->model);
        e->err = ERR_NOTFOUND;
        e->param = "model";
        e->code = "model_not_found";
        return ERR_NOTFOUND;
    }
    const struct tokenizer *tok = engine_model_tokenizer(m->model);
    const char *param = r->route == OPENAI_ROUTE_CHAT ? "messages" : "prompt";
    if (r->route == OPENAI_ROUTE_CHAT) {
        if (!m->has_chat) {
            return fail(e, "messages", "This model's chat template is not supported; use "
                                       "/v1/completions");
        }
        struct chat_render_params cp = chat_render_default_params();
        int32_t bos = tokenizer_bos(tok);
        int32_t eos = tokenizer_eos(tok);
        cp.bos_text = bos >= 0 ? tokenizer_token_text(tok, bos) : NULL;
        cp.eos_text = eos >= 0 ? tokenizer_token_text(tok, eos) : NULL;
        if (r->n_tools > 0 && !chat_family_has_tools(m->chat_family)) {
            return fail(e, "tools", "This model's chat template (%s) does not support tools",
                        chat_family_name(m->chat_family));
        }
        cp.tools = r->chat_tools;
        cp.n_tools = r->n_tools;
        struct buf text = {0};
        bool has_bos = false;
        char msg[200];
        int err = chat_render(m->chat_family, r->messages, r->n_messages, &cp, &text, &has_bos,
                              msg, sizeof(msg));
        if (err) {
            buf_free(&text);
            return fail(e, "messages", "%s", msg);
        }
        chat_reply_prefix(m->chat_family, &cp, r->reply_prefix, sizeof(r->reply_prefix));
        r->prompts = xcalloc(1, sizeof(*r->prompts));
        r->n_prompts = 1;
        r->prompts[0].text = text.data ? buf_take(&text) : xstrdup("");
        err = tokenize(tok, r->prompts[0].text, !has_bos, &r->prompts[0], param, e);
        if (err) return err;
        if (r->tool_choice != OPENAI_TOOL_CHOICE_NONE && (err = prepare_tools(r, m, e)))
            return err;
    } else {
        for (int32_t i = 0; i < r->n_prompts; i++) {
            if (!r->prompts[i].text) continue;
            int err = tokenize(tok, r->prompts[i].text, true, &r->prompts[i], param, e);
            if (err) return err;
        }
    }
    // Where the client gave no max_tokens: completions 16 (OpenAI's default),
    // chat the rest of the context; either way no more than the shortest room.
    bool given = r->max_tokens >= 0;
    int32_t room = INT32_MAX;
    for (int32_t i = 0; i < r->n_prompts; i++) {
        if (r->prompts[i].n_ids == 0) return fail(e, param, "The prompt is empty");
        if (m->n_ctx - r->prompts[i].n_ids < room) room = m->n_ctx - r->prompts[i].n_ids;
    }
    if (!given) {
        r->max_tokens = r->route == OPENAI_ROUTE_COMPLETIONS ? 16 : room;
        if (r->max_tokens > room) r->max_tokens = room;
    }
    for (int32_t i = 0; i < r->n_prompts; i++) {
        int32_t n_prompt = r->prompts[i].n_ids;
        int32_t max_tokens = r->max_tokens > 0 ? r->max_tokens : 1;
        if ((int64_t)n_prompt + max_tokens > m->n_ctx) {
            snprintf(e->message, sizeof(e->message),
                     "This model's maximum context length is %d tokens. However, you requested "
                     "%lld tokens (%d in the prompt, %d for the completion). Please reduce the "
                     "prompt or max_tokens.",
                     (int)m->n_ctx, (long long)n_prompt + max_tokens, (int)n_prompt,
                     (int)max_tokens);
            e->err = ERR_TOOLONG;
            e->param = given ? "max_tokens" : param;
            e->code = "context_length_exceeded";
            return ERR_TOOLONG;
        }
    }
    return 0;
}

/* ---- responses ---------------------------------------------------------------- */

/* Token id's bytes into scratch: as the text has them when a stream is given
 * (which then advances), else its piece. */
static void token_bytes(const struct tokenizer *tok, struct tokenizer_stream *stream, int32_t id,
                        struct buf *scratch) {
    buf_reset(scratch);
    if (stream) tokenizer_stream_piece(tok, stream, id, scratch);
    else tokenizer_token_to_piece(tok, id, true, scratch);
}

/* The JSON string of the bytes in scratch. */
static json_t *piece_json(const struct buf *scratch) {
    // A piece may be a lone byte of a multi-byte character: not valid JSON text.
    if (!tokenizer_utf8_valid(scratch->data ? scratch->data : "", scratch->len)) {
        char hex[16];
        snprintf(hex, sizeof(hex), "bytes:\\x%02x",
                 scratch->len ? (unsigned)(unsigned char)scratch->data[0] : 0u);
        return json_string(hex);
    }
    return json_stringn(scratch->data ? scratch->data : "", scratch->len);
}

/* The JSON array of the bytes in scratch. */
static json_t *bytes_json(const struct buf *scratch) {
    json_t *a = json_array();
    for (size_t i = 0; i < scratch->len; i++) {
        json_array_append_new(a, json_integer((unsigned char)scratch->data[i]));
    }
    return a;
}

static json_t *logprob_json(float lp) {
    return json_real(isfinite(lp) ? (double)lp : -9999.0);
}

/* Token id at the position the choice's stream is at: its bytes into
 * scratch, without advancing the stream (alternatives share the position). */
static void alt_bytes(const struct openai_choice *c, int32_t id, struct buf *scratch) {
    struct tokenizer_stream at;
    if (c->stream) at = *c->stream;
    token_bytes(c->tok, c->stream ? &at : NULL, id, scratch);
}

/* Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. */
static json_t *completion_logprobs(const struct openai_choice *c) {
    json_t *tokens = json_array();
    json_t *lps = json_array();
    json_t *tops = json_array();
    json_t *offsets = json_array();
    struct buf scratch = {0};
    size_t offset = c->text_offset;
    for (int32_t i = 0; i < c->n_lps; i++) {
        json_t *top = json_object();
        for (int32_t k = 0; k < c->lps[i].n_top && k < c->n_top; k++) {
            alt_bytes(c, c->lps[i].top[k].token, &scratch);
            json_t *p = piece_json(&scratch);
            json_object_set_new(top, json_string_value(p), logprob_json(c->lps[i].top[k].logprob));
            json_decref(p);
        }
        token_bytes(c->tok, c->stream, c->ids[i], &scratch);
        json_array_append_new(tokens, piece_json(&scratch));
        json_array_append_new(offsets, json_integer((json_int_t)offset));
        offset += scratch.len;
        json_array_append_new(lps, logprob_json(c->lps[i].logprob));
        json_array_append_new(tops, top);
    }
    buf_free(&scratch);
    json_t *o = json_object();
    json_object_set_new(o, "tokens", tokens);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offsets);
    return o;
}

/* {"token", "logprob", "bytes"} of the bytes in scratch. */
static json_t *chat_token_json(const struct buf *scratch, float logprob) {
    json_t *t = json_object();
    json_object_set_new(t, "token", piece_json(scratch));
    json_object_set_new(t, "logprob", logprob_json(logprob));
    json_object_set_new(t, "bytes", bytes_json(scratch));
    return t;
}

/* Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}. */
static json_t *chat_logprobs(const struct openai_choice *c) {
    json_t *content = json_array();
    struct buf scratch = {0};
    for (int32_t i = 0; i < c->n_lps; i++) {
        json_t *tops = json_array();
        for (int32_t k = 0; k < c->lps[i].n_top && k < c->n_top; k++) {
            alt_bytes(c, c->lps[i].top[k].token, &scratch);
            json_array_append_new(tops, chat_token_json(&scratch, c->lps[i].top[k].logprob));
        }
        token_bytes(c->tok, c->stream, c->ids[i], &scratch);
        json_t *item = chat_token_json(&scratch, c->lps[i].logprob);
        json_object_set_new(item, "top_logprobs", tops);
        json_array_append_new(content, item);
    }
    buf_free(&scratch);
    json_t *o = json_object();
    json_object_set_new(o, "content", content);
    return o;
}

static json_t *usage_json(const struct openai_usage *u) {
    json_t *o = json_object();
    json_object_set_new(o, "prompt_tokens", json_integer(u->prompt_tokens));
    json_object_set_new(o, "completion_tokens", json_integer(u->completion_tokens));
    json_object_set_new(o, "total_tokens",
                        json_integer((json_int_t)u->prompt_tokens + u->completion_tokens));
    json_t *details = json_object();
    json_object_set_new(details, "cached_tokens", json_integer(u->cached_tokens));
    json_object_set_new(o, "prompt_tokens_details", details);
    return o;
}

static json_t *envelope(const struct openai_meta *meta, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(meta->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer((json_int_t)meta->created));
    json_object_set_new(o, "model", json_string(meta->model));
    return o;
}

static json_t *finish_json(const char *reason) {
    return reason ? json_string(reason) : json_null();
}

static char *dump(json_t *root) {
    // JSON_COMPACT keeps SSE lines short; JSON_ENSURE_ASCII is not needed (UTF-8 is fine).
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    ASSERT(s);
    return s;
}

char *openai_completion_json(const struct openai_meta *meta, const struct openai_choice *choices,
                             int32_t n_choices, const struct openai_usage *usage, bool chunk) {
    json_t *root = envelope(meta, "text_completion");
    json_t *arr = json_array();
    for (int32_t i = 0; i < n_choices; i++) {
        const struct openai_choice *c = &choices[i];
        json_t *o = json_object();
        json_object_set_new(o, "index", json_integer(c->index));
        json_object_set_new(o, "text", json_stringn(c->text ? c->text : "", c->text_len));
        json_object_set_new(o, "logprobs", c->lps ? completion_logprobs(c) : json_null());
        json_object_set_new(o, "finish_reason", finish_json(c->finish_reason));
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "choices", arr);
    if (usage) {
        json_object_set_new(root, "usage", usage_json(usage));
    } else if (!chunk) {
        struct openai_usage zero = {0};
        json_object_set_new(root, "usage", usage_json(&zero));
    }
    return dump(root);
}

/* message.tool_calls, or a chunk's delta.tool_calls (with "index"; id, type
 * and name only in a call's first delta). */
static json_t *tool_calls_json(const struct openai_choice *c, bool chunk) {
    json_t *arr = json_array();
    for (int32_t i = 0; i < c->n_tool_calls; i++) {
        const struct openai_tool_call *tc = &c->tool_calls[i];
        json_t *o = json_object();
        if (chunk) json_object_set_new(o, "index", json_integer(tc->index));
        json_t *fn = json_object();
        if (tc->id) {
            json_object_set_new(o, "id", json_string(tc->id));
            json_object_set_new(o, "type", json_string("function"));
            json_object_set_new(fn, "name", json_stringn(tc->name, tc->name_len));
        }
        json_object_set_new(fn, "arguments",
                            json_stringn(tc->arguments ? tc->arguments : "", tc->arguments_len));
        json_object_set_new(o, "function", fn);
        json_array_append_new(arr, o);
    }
    return arr;
}

char *openai_chat_json(const struct openai_meta *meta, const struct openai_choice *choices,
                       int32_t n_choices, const struct openai_usage *usage, bool chunk) {
    json_t *root = envelope(meta, chunk ? "chat.completion.chunk" : "chat.completion");
    json_t *arr = json_array();
    for (int32_t i = 0; i < n_choices; i++) {
        const struct openai_choice *c = &choices[i];
        json_t *o = json_object();
        json_object_set_new(o, "index", json_integer(c->index));
        json_t *msg = json_object();
        if (!chunk || c->role) json_object_set_new(msg, "role", json_string("assistant"));
        if (!chunk && c->n_tool_calls && !c->text_len) {
            json_object_set_new(msg, "content", json_null());
        } else if (!chunk || c->text_len || c->role) {
            json_object_set_new(msg, "content", json_stringn(c->text ? c->text : "", c->text_len));
        }
        if (c->n_tool_calls) json_object_set_new(msg, "tool_calls", tool_calls_json(c, chunk));
        json_object_set_new(o, chunk ? "delta" : "message", msg);
        json_object_set_new(o, "logprobs", c->lps ? chat_logprobs(c) : json_null());
        json_object_set_new(o, "finish_reason", finish_json(c->finish_reason));
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "choices", arr);
    if (usage) {
        json_object_set_new(root, "usage", usage_json(usage));
    } else if (!chunk) {
        struct openai_usage zero = {0};
        json_object_set_new(root, "usage", usage_json(&zero));
    }
    return dump(root);
}

char *openai_error_json(const char *message, const char *type, const char *param,
                        const char *code) {
    json_t *err = json_object();
    // A message cut at its buffer's end may end in part of a character
    // (a client's name quoted with %.128s): keep its valid UTF-8 prefix.
    size_t len = strlen(message);
    while (len && !tokenizer_utf8_valid(message, len)) len--;
    json_object_set_new(err, "message", json_stringn(message, len));
    json_object_set_new(err, "type", json_string(type));
    json_object_set_new(err, "param", param ? json_string(param) : json_null());
    json_object_set_new(err, "code", code ? json_string(code) : json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", err);
    return dump(root);
}

void openai_model_id(const char *path, char *out, size_t out_size) {
    ASSERT(out_size >= 1);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && strcmp(base + n - 5, ".gguf") == 0) n -= 5;
    if (n >= out_size) n = out_size - 1;
    memcpy(out, base, n);
    out[n] = '\0';
}

void openai_make_id(const char *prefix, char *out, size_t out_size) {
    uint8_t r[12] = {0};
    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
        int64_t t = clock_wall_ns();
        memcpy(r, &t, sizeof(t));
    }
    size_t n = (size_t)snprintf(out, out_size, "%s", prefix);
    for (size_t i = 0; i < sizeof(r) && n + 2 < out_size; i++) {
        n += (size_t)snprintf(out + n, out_size - n, "%02x", r[i]);
    }
}
