/*
 * server/tool_call.c - the tool-call grammar and parser (tool_call.h).
 *
 * The parser is a hand-written recogniser of the one syntax the grammar
 * generates: literals compared byte for byte (a text that ends inside one is
 * "not yet"), the name up to its quote, and the arguments scanned as one
 * JSON value (depth and strings tracked, nothing decoded), so it is cheap
 * enough to rerun over the whole text at every streamed chunk.
 */
#include "server/tool_call.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "engine/base/alloc.h"
#include "engine/base/clock.h"
#include "server/json_schema.h"

/* ---- grammar ----------------------------------------------------------------- */

static void literal(struct buf *out, const char *s) {
    json_schema_gbnf_literal(out, s, strlen(s));
}

void tool_call_grammar(const struct chat_tool_syntax *syn, const struct tool_call_tool *tools,
                       int32_t n_tools, bool parallel, struct buf *out) {
    ASSERT(n_tools >= 1);
    // root ::= (MARKER)? LIST_OPEN tool-call (SEP tool-call){0,15} LIST_CLOSE
    buf_append_str(out, "root ::= ");
    if (syn->trigger_prefix && syn->trigger_prefix[0]) {
        buf_append_char(out, '(');
        literal(out, syn->trigger_prefix);
        buf_append_str(out, ")? ");
    }
    literal(out, syn->list_open);
    buf_append_str(out, " tool-call");
    if (parallel && syn->parallel) {
        buf_append_str(out, " (");
        literal(out, syn->separator);
        char rep[32];
        snprintf(rep, sizeof(rep), " tool-call){0,%d}", TOOL_CALL_MAX_CALLS - 1);
        buf_append_str(out, rep);
    }
    buf_append_char(out, ' ');
    literal(out, syn->list_close);
    // tool-call ::= CALL_OPEN "{\"name\": \"" (tool-fn0 | ...) "}" CALL_CLOSE
    buf_append_str(out, "\ntool-call ::= ");
    literal(out, syn->call_open);
    buf_append_char(out, ' ');
    literal(out, "{\"name\": \"");
    buf_append_str(out, " (");
    for (int32_t i = 0; i < n_tools; i++) {
        char name[32];
        snprintf(name, sizeof(name), "%stool-fn%d", i ? " | " : "", (int)i);
        buf_append_str(out, name);
    }
    buf_append_str(out, ") ");
    literal(out, "}");
    buf_append_char(out, ' ');
    literal(out, syn->call_close);
    buf_append_char(out, '\n');
    // tool-fnK ::= "NAME\", \"ARGS_KEY\": " RULE
    for (int32_t i = 0; i < n_tools; i++) {
        char head[TOOL_CALL_NAME_MAX + 64];
        snprintf(head, sizeof(head), "%s\", \"%s\": ", tools[i].name, syn->args_key);
        char name[32];
        snprintf(name, sizeof(name), "tool-fn%d ::= ", (int)i);
        buf_append_str(out, name);
        literal(out, head);
        buf_append_char(out, ' ');
        buf_append_str(out, tools[i].rule);
        buf_append_char(out, '\n');
        buf_append_str(out, tools[i].rules);
    }
    json_schema_primitives_gbnf(out);
}

bool tool_call_name_valid(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > TOOL_CALL_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

/* ---- parser ------------------------------------------------------------------ */

enum match {
    MATCH_OK,       // the literal is there; *pos moved past it
    MATCH_PARTIAL,  // the text ends inside it
    MATCH_FAIL,     // something else is there
};

static enum match match_lit(const char *t, size_t len, size_t *pos, const char *lit) {
    size_t n = strlen(lit);
    size_t have = len - *pos;
    if (have < n) return memcmp(t + *pos, lit, have) == 0 ? MATCH_PARTIAL : MATCH_FAIL;
    if (memcmp(t + *pos, lit, n) != 0) return MATCH_FAIL;
    *pos += n;
    return MATCH_OK;
}

/* Scans one JSON value from *pos. OK: *pos is past it; PARTIAL: the text
 * ends first. Strings and nesting are tracked, scalars end at a delimiter. */
static enum match scan_value(const char *t, size_t len, size_t *pos) {
    size_t i = *pos;
    int depth = 0;
    bool in_string = false;
    bool escaped = false;
    bool started = false;
    for (; i < len; i++) {
        char c = t[i];
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') {
                in_string = false;
                if (depth == 0) {
                    *pos = i + 1;
                    return MATCH_OK;
                }
            }
            continue;
        }
        if (c == '"') {
            in_string = true;
            started = true;
        } else if (c == '{' || c == '[') {
            depth++;
            started = true;
        } else if (c == '}' || c == ']') {
            if (depth == 0) {
                if (!started) return MATCH_FAIL;
                *pos = i;  // a scalar ended at its container's close
                return MATCH_OK;
            }
            if (--depth == 0) {
                *pos = i + 1;
                return MATCH_OK;
            }
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r')) {
            if (!started) return MATCH_FAIL;
            *pos = i;
            return MATCH_OK;
        } else {
            started = true;
        }
    }
    return MATCH_PARTIAL;
}

/* First occurrence of needle in t[0, len), or len. */
static size_t find(const char *t, size_t len, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; n <= len && i + n <= len; i++) {
        if (memcmp(t + i, needle, n) == 0) return i;
    }
    return len;
}

/* Bytes at the end of t[0, len) that begin needle (a proper prefix of it). */
static size_t held_prefix(const char *t, size_t len, const char *needle) {
    size_t n = strlen(needle);
    for (size_t k = n > 0 ? n - 1 : 0; k > 0; k--) {
        if (k <= len && memcmp(t + len - k, needle, k) == 0) return k;
    }
    return 0;
}

/* The calls after the trigger, from pos. Returns false when the text is not
 * the syntax (failed). */
static bool parse_calls(const struct chat_tool_syntax *syn, const char *t, size_t len, size_t pos,
                        struct tool_call_parse *out) {
    enum match m = match_lit(t, len, &pos, syn->list_open);
    if (m != MATCH_OK) return m == MATCH_PARTIAL;
    for (;;) {
        if (out->n_calls == TOOL_CALL_MAX_CALLS) return false;
        if ((m = match_lit(t, len, &pos, syn->call_open)) != MATCH_OK ||
            (m = match_lit(t, len, &pos, "{\"name\": \"")) != MATCH_OK)
            return m == MATCH_PARTIAL;
        struct tool_call_found *c = &out->calls[out->n_calls];
        size_t name_off = pos;
        while (pos < len && t[pos] != '"') pos++;
        if (pos == len) return pos - name_off <= TOOL_CALL_NAME_MAX;
        char name[TOOL_CALL_NAME_MAX + 1];
        if (pos - name_off > TOOL_CALL_NAME_MAX) return false;
        memcpy(name, t + name_off, pos - name_off);
        name[pos - name_off] = '\0';
        if (!tool_call_name_valid(name)) return false;
        size_t name_len = pos - name_off;
        pos++;
        if ((m = match_lit(t, len, &pos, ", \"")) != MATCH_OK ||
            (m = match_lit(t, len, &pos, syn->args_key)) != MATCH_OK ||
            (m = match_lit(t, len, &pos, "\": ")) != MATCH_OK)
            return m == MATCH_PARTIAL;
        *c = (struct tool_call_found){
            .name_off = name_off, .name_len = name_len, .args_off = pos, .has_name = true};
        out->n_calls++;
        m = scan_value(t, len, &pos);
        c->args_len = (m == MATCH_OK ? pos : len) - c->args_off;
        if (m != MATCH_OK) return m == MATCH_PARTIAL;
        if ((m = match_lit(t, len, &pos, "}")) != MATCH_OK ||
            (m = match_lit(t, len, &pos, syn->call_close)) != MATCH_OK)
            return m == MATCH_PARTIAL;
        c->is_complete = true;
        if (pos == len && syn->list_close[0] == '\0') {
            out->is_complete = true;
            return true;
        }
        if (syn->parallel && syn->separator[0]) {
            size_t at = pos;
            m = match_lit(t, len, &at, syn->separator);
            if (m == MATCH_PARTIAL) return true;
            if (m == MATCH_OK) {
                pos = at;
                continue;
            }
        }
        m = match_lit(t, len, &pos, syn->list_close);
        if (m != MATCH_OK) return m == MATCH_PARTIAL;
        // What a turn may end with after the calls: nothing but whitespace.
        while (pos < len && strchr(" \t\r\n", t[pos])) pos++;
        if (pos != len) return false;
        out->is_complete = true;
        return true;
    }
}

void tool_call_parse(const struct chat_tool_syntax *syn, const char *text, size_t len,
                     bool is_final, struct tool_call_parse *out) {
    memset(out, 0, sizeof(*out));
    const char *t = text ? text : "";
    size_t at = find(t, len, syn->trigger);
    const char *pre = syn->trigger_prefix ? syn->trigger_prefix : "";
    const size_t n_pre = strlen(pre);
    if (at == len) {
        size_t held = held_prefix(t, len, syn->trigger);
        if (n_pre > 0) {
            // The marker, whole or in part, or the marker and part of the trigger.
            char both[96];
            int n = snprintf(both, sizeof(both), "%s%s", pre, syn->trigger);
            ASSERT(n > 0 && (size_t)n < sizeof(both));
            size_t h = held_prefix(t, len, both);
            if (h > held) held = h;
        }
        out->content_len = is_final ? len : len - held;
        return;
    }
    // A marker right before the trigger belongs to the calls, not to the content.
    const bool has_pre = n_pre > 0 && at >= n_pre && memcmp(t + at - n_pre, pre, n_pre) == 0;
    out->content_len = has_pre ? at - n_pre : at;
    out->has_trigger = true;
    if (!parse_calls(syn, t, len, at, out)) {
        out->is_failed = true;
        out->n_calls = 0;
        out->is_complete = false;
        out->content_len = len;
    }
}

void tool_call_make_id(const struct chat_tool_syntax *syn, char *out, size_t out_size) {
    ASSERT(out_size >= 32);
    // "call_" + 24 hex digits (OpenAI's look), or Mistral's 9 alphanumerics
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static const char hex[] = "0123456789abcdef";
    uint8_t r[12] = {0};
    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
        int64_t ns = clock_wall_ns();
        memcpy(r, &ns, sizeof(ns));
    }
    size_t n = 0;
    if (syn->short_ids) {
        for (size_t i = 0; i < 9; i++) out[n++] = alnum[r[i] % (sizeof(alnum) - 1)];
    } else {
        memcpy(out, "call_", 5);
        n = 5;
        for (size_t i = 0; i < sizeof(r); i++) {
            out[n++] = hex[r[i] >> 4];
            out[n++] = hex[r[i] & 15];
        }
    }
    out[n] = '\0';
}
