/*
 * server/openai.h - the OpenAI wire format of /v1/completions and
 * /v1/chat/completions: request JSON -> struct openai_request (validated,
 * then tokenized by openai_prepare()), and results -> response, chunk and
 * error JSON.
 *
 * Owns nothing beyond what each struct says. No json_t crosses this header
 * (STYLE 2.7.11): requests come in as bytes and responses go out as
 * malloc'd strings. Client input errors are never logged above DEBUG: they
 * go back in struct openai_error.
 * Threads: every function is pure and reentrant. [any thread] (in practice
 * the HTTP thread)
 */
#ifndef SERVER_OPENAI_H
#define SERVER_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/text/chat.h"
#include "engine/engine.h"
#include "engine/text/stop.h"

struct gbnf;
struct json_t;

#define OPENAI_MAX_N 16          // choices per prompt
#define OPENAI_MAX_PROMPTS 64    // prompts in one completion request
#define OPENAI_MAX_CHOICES 64    // prompts * n
#define OPENAI_MAX_MESSAGES 1024

/* A client error: ERR_INVAL (400), ERR_NOTFOUND (404) or ERR_TOOLONG (400),
 * with OpenAI's message, param and code. */
struct openai_error {
    int err;
    char message[256];
    const char *param;  // static string or NULL
    const char *code;   // static string or NULL ("model_not_found", "context_length_exceeded")
};

enum openai_route {
    OPENAI_ROUTE_COMPLETIONS,
    OPENAI_ROUTE_CHAT,
};

struct openai_prompt {
    char *text;    // owned; NULL when the client sent token ids
    int32_t *ids;  // owned [n_ids]; from the JSON, or from openai_prepare()
    int32_t n_ids;
};

enum openai_tool_choice {
    OPENAI_TOOL_CHOICE_NONE,      // tools are in the prompt; the reply is text
    OPENAI_TOOL_CHOICE_AUTO,      // the model may call: its syntax is recognised, and
                                  //    constrained from its trigger on
    OPENAI_TOOL_CHOICE_REQUIRED,  // one or more calls of any tool, constrained throughout
    OPENAI_TOOL_CHOICE_NAMED,     // one call of tools[tool_named], constrained throughout
};

/* One entry of the request's tools: what the templates print and what the
 * grammar needs. Every string is owned. */
struct openai_tool {
    char *name;
    char *rules;                      // its parameters' GBNF rules (json_schema_to_gbnf_rule)
    char rule[16];                    // their start rule, "tN"
    char *json;                       // tojson(tool) (chat.h)
    char *json_indent4;               // tojson(tool, indent=4)
    struct chat_tool_member *members; // [n_members], strings owned
    int32_t n_members;
};

/* A tool call of a reply, or (streams) a delta of one: the first delta has
 * id and name and empty arguments, later ones argument fragments only. */
struct openai_tool_call {
    int32_t index;
    const char *id;          // NULL: a fragment (no id, type or name)
    const char *name;        // [name_len], with id
    size_t name_len;
    const char *arguments;   // [arguments_len] JSON text (a fragment in a delta)
    size_t arguments_len;
};

struct openai_request {
    enum openai_route route;
    char *model;                          // owned; NULL when absent
    struct openai_prompt *prompts;        // owned [n_prompts]; chat: one, after prepare
    int32_t n_prompts;
    struct chat_message *messages;        // owned [n_messages], strings owned (chat only)
    int32_t n_messages;
    int32_t max_tokens;                   // -1 until given or set by openai_prepare()
    int32_t n;                            // choices per prompt, 1..OPENAI_MAX_N
    struct sampler_params sampling;       // .logit_bias points at logit_bias below
    struct sampler_logit_bias *logit_bias;  // owned [sampling.n_logit_bias]
    char *stop[STOP_MAX_STRINGS];         // owned [n_stop]
    int32_t n_stop;
    int32_t *stop_token_ids;              // owned [n_stop_token_ids]
    int32_t n_stop_token_ids;
    int32_t min_tokens;
    int32_t n_logprobs;                   // -1: none; 0: chosen token; k: plus top k
    bool stream;
    bool include_usage;                   // stream_options.include_usage
    bool echo;                            // completions: prompt text before the completion
    bool ignore_eos;
    bool include_stop_str;
    bool skip_special;                    // default true
    char reply_prefix[16];                // chat, after prepare: the template's bytes before
                                          //    a reply (chat_reply_prefix()), dropped from text
    struct gbnf *grammar;                 // owned reference; NULL: unconstrained. From
                                          //    response_format, the grammar extension or tools
    struct openai_tool *tools;            // owned [n_tools] (chat only)
    int32_t n_tools;
    struct chat_tool *chat_tools;         // owned [n_tools], views of tools for chat_render()
    enum openai_tool_choice tool_choice;  // NONE without tools
    int32_t tool_named;                   // NAMED: the index in tools
    bool parallel_tool_calls;             // default true
    bool parse_tools;                     // after prepare: replies are parsed into calls
    struct chat_tool_syntax tool_syntax;  //    in this syntax (the template's)
    char grammar_trigger_text[64];        // the storage of grammar_trigger (auto)
    const char *grammar_trigger;          // after prepare: NULL, or (auto) the text after
                                          //    which the grammar starts: grammar_trigger_text
                                          //    (alternatives separated by newlines)
};

/* Parses and validates a request body (len bytes, need not be
 * NUL-terminated) for route. n_vocab bounds token ids and logit_bias keys.
 * Unknown fields are ignored (logged at DEBUG). On success *out is filled and
 * owned by the caller (openai_request_deinit()); prompts given as text are
 * not tokenized yet. Returns 0, ERR_INVAL with e filled (message, param), or
 * ERR_NOMEM (e says so) when an array the request sizes cannot be allocated
 * (engine/base/fault.h can make one fail on purpose); on failure *out is
 * deinit'ed. */
int openai_parse(enum openai_route route, const char *body, size_t len, int32_t n_vocab,
                 struct openai_request *out, struct openai_error *e);

/* Frees what r owns and zeroes it. Safe on a zeroed request. */
void openai_request_deinit(struct openai_request *r);

/* The grammar of an object's `response_format` and `grammar` fields, read
 * and compiled as openai_parse() reads them (for `llmserve batch`'s lines):
 * 0 with *out a reference the caller releases (gbnf_release), NULL when
 * there is none; else ERR_INVAL or ERR_NOMEM with e filled. */
int openai_parse_grammar(struct json_t *root, struct gbnf **out, struct openai_error *e);

/* What openai_prepare() needs of the served model. */
struct openai_model {
    const struct engine_model *model;  // borrowed; tokenizer and context length
    const char *name;                  // the served model id
    int32_t n_ctx;                     // prompt + generated at most
    enum chat_family chat_family;
    bool has_chat;                     // false: the template is not supported, chat gets 400
};

/* Checks the model name (ERR_NOTFOUND, code "model_not_found"), renders chat
 * messages (and tools) into one prompt, builds the tool-call grammar and
 * sets parse_tools / grammar_trigger when tool_choice is not none (a
 * template without tools is a 400 naming "tools"), tokenizes text prompts, checks that no prompt is
 * empty and that every prompt + max_tokens fits n_ctx (ERR_TOOLONG, code
 * "context_length_exceeded"), and sets max_tokens where the client gave none
 * (completions: 16, as OpenAI; chat: the rest of the context); chat also
 * sets reply_prefix. Returns 0 or
 * the error in e. */
int openai_prepare(struct openai_request *r, const struct openai_model *m,
                   struct openai_error *e);

/* ---- responses ---------------------------------------------------------- */

struct openai_meta {
    const char *id;     // "cmpl-..." or "chatcmpl-..."
    int64_t created;    // Unix seconds
    const char *model;
};

/* One choice's output so far (a chunk) or in full (a response). Every
 * pointer is borrowed for the call. */
struct openai_choice {
    int32_t index;
    struct tokenizer_stream *stream;        // NULL, or the choice's log-probability stream
                                            //    (tokenizer_stream_init_after(prompt)): token
                                            //    strings then match the text's bytes
    const char *text;                       // valid UTF-8 [text_len]
    size_t text_len;
    const char *finish_reason;              // "stop", "length", ... or NULL (JSON null)
    bool role;                              // chat chunks: a delta with "role": "assistant"
    const struct tokenizer *tok;            // for logprob token strings; NULL: no logprobs
    const int32_t *ids;                     // [n_lps]
    const struct sampler_result *lps;       // [n_lps], NULL: no logprobs
    int32_t n_lps;
    int32_t n_top;                          // alternatives asked for
    size_t text_offset;                     // completions: offset of the first token's text
    const struct openai_tool_call *tool_calls;  // chat: [n_tool_calls] calls (a response) or
    int32_t n_tool_calls;                       //    call deltas (a chunk); content is null in
                                                //    a response with calls and no text
};

struct openai_usage {
    int32_t prompt_tokens;
    int32_t completion_tokens;
    int32_t cached_tokens;
};

/* Each returns a NUL-terminated JSON text, owned by the caller (free()).
 * chunk == true builds a streaming chunk ("text_completion" is used for both
 * completions forms; chat chunks are "chat.completion.chunk" with deltas).
 * usage may be NULL (omitted in chunks, zeros in full responses). */
char *openai_completion_json(const struct openai_meta *meta, const struct openai_choice *choices,
                             int32_t n_choices, const struct openai_usage *usage, bool chunk);
char *openai_chat_json(const struct openai_meta *meta, const struct openai_choice *choices,
                       int32_t n_choices, const struct openai_usage *usage, bool chunk);

/* {"error": {"message", "type", "param", "code"}}; param and code may be
 * NULL (JSON null). */
char *openai_error_json(const char *message, const char *type, const char *param,
                        const char *code);

/* The model id a user would type for the file at path: its name without the
 * directories and a ".gguf" suffix ("models/stories260K.gguf" ->
 * "stories260K"), into out (NUL-terminated, cut to out_size - 1 bytes).
 * Empty when path names no file (ends in '/'). */
void openai_model_id(const char *path, char *out, size_t out_size);

/* A random id with the prefix ("cmpl-", "chatcmpl-"): prefix + 24 hex digits,
 * into out (out_size >= strlen(prefix) + 25). */
void openai_make_id(const char *prefix, char *out, size_t out_size);

#endif
