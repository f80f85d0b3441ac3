/*
 * server/tool_call.h - tool calling on top of a chat template's tool-call
 * syntax (engine/text/chat.h, struct chat_tool_syntax): the grammar that
 * constrains decoding to valid calls of the request's tools, and the parser
 * that splits a model's output text into content and calls.
 *
 * The grammar's sentences are exactly the texts the template renders for an
 * assistant turn's tool_calls: list_open, then calls
 *     call_open {"name": "NAME", "ARGS_KEY": ARGUMENTS} call_close
 * joined by the separator, then list_close; ARGUMENTS is a JSON document of
 * the tool's parameters schema (server/json_schema.h). The parser reads the
 * same syntax, so under the grammar every output parses.
 *
 * Owns nothing beyond what each struct says. Threads: pure functions.
 * [any thread] (in practice the HTTP thread)
 */
#ifndef SERVER_TOOL_CALL_H
#define SERVER_TOOL_CALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/base/buf.h"
#include "engine/text/chat.h"

#define TOOL_CALL_MAX_TOOLS 128  // tools in one request
#define TOOL_CALL_MAX_CALLS 16   // calls in one turn (the grammar's bound)
#define TOOL_CALL_NAME_MAX 64    // OpenAI's limit on a function name

/* One tool for the grammar: its name and the rules of its parameters'
 * language (json_schema_to_gbnf_rule() output whose start rule is `rule`). */
struct tool_call_tool {
    const char *name;   // [A-Za-z0-9_-]{1,64}
    const char *rules;  // GBNF rules, no root, no JSON primitives
    const char *rule;   // the start rule's name
};

/* Appends a whole grammar (root and the JSON primitives included) for one
 * call (parallel false) or 1..TOOL_CALL_MAX_CALLS calls of tools[0..n_tools)
 * in syntax syn. n_tools >= 1. */
void tool_call_grammar(const struct chat_tool_syntax *syn, const struct tool_call_tool *tools,
                       int32_t n_tools, bool parallel, struct buf *out);

/* True when s is a valid function name: [A-Za-z0-9_-]{1,64}. */
bool tool_call_name_valid(const char *s);

/* One call found in a text; offsets into the parsed text. */
struct tool_call_found {
    size_t name_off;
    size_t name_len;
    size_t args_off;
    size_t args_len;      // the ARGUMENTS text so far
    bool has_name;        // the name and the args key are complete: a call has begun
    bool is_complete;     // its arguments and the call's closing text are complete
};

/* What a text holds. Content is text[0, content_len); the calls follow it. */
struct tool_call_parse {
    size_t content_len;
    int32_t n_calls;
    struct tool_call_found calls[TOOL_CALL_MAX_CALLS];
    bool has_trigger;     // the syntax's trigger was found (calls follow content)
    bool is_complete;     // every call is complete and the text ends where a turn may
    bool is_failed;       // the text after the trigger is not the syntax: all content
};

/* Parses text[0, len) (the output so far, or all of it when is_final) in
 * syntax syn. Prefix-stable: for a longer text of which this one is a
 * prefix, content and each call's name and arguments only grow, so a stream
 * can send the differences. Not final: a tail that may still become the
 * trigger is held back from content. Failed: content is the whole text. */
void tool_call_parse(const struct chat_tool_syntax *syn, const char *text, size_t len,
                     bool is_final, struct tool_call_parse *out);

/* A new call id into out (out_size >= 32): "call_" + 24 hex digits, or 9
 * alphanumerics when syn->short_ids (Mistral's templates want those back). */
void tool_call_make_id(const struct chat_tool_syntax *syn, char *out, size_t out_size);

#endif  // SERVER_TOOL_CALL_H
