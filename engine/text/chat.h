/*
 * chat.h - OpenAI-style chat messages -> one prompt string, the way the
 * model's own chat template (tokenizer.chat_template, a Jinja program) would
 * render it with Hugging Face's apply_chat_template (trim_blocks and
 * lstrip_blocks on), tools and tool calls included for the families whose
 * templates define them (chat_family_has_tools()).
 *
 * There is no Jinja interpreter here. chat_detect() recognises the template's
 * family by distinctive markers, and chat_render() is a hand-written renderer
 * per family that reproduces the template's output byte for byte: its
 * whitespace control ({%- -%}), its `| trim` / `.strip()` calls (Python's
 * str.strip(): Unicode whitespace), its default system message, its date
 * header and where it writes bos_token / eos_token.
 *
 * Owns nothing: every function works on borrowed arguments.
 * Threads: everything here is pure and reentrant. [any thread]
 */
#ifndef LLMSERVE_CHAT_H
#define LLMSERVE_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/base/buf.h"

/* Template families. The name in quotes is what chat_family_name() returns and
 * chat_family_parse() accepts (for a --chat-template override). */
enum chat_family {
    CHAT_FAMILY_CHATML,          // "chatml": <|im_start|>role\n...<|im_end|>\n, any role order
    CHAT_FAMILY_QWEN2_5,         // "qwen2.5": ChatML plus Qwen2.5's default system message
                                 //   "You are Qwen, created by Alibaba Cloud. You are a
                                 //   helpful assistant." when the first message is not system
    CHAT_FAMILY_LLAMA3,          // "llama3": Llama 3.0, <|start_header_id|>role<|end_header_id|>
    CHAT_FAMILY_LLAMA3_1,        // "llama3.1": Llama 3.1/3.2/3.3, always a system header with
                                 //   "Cutting Knowledge Date: December 2023" and "Today Date: "
    CHAT_FAMILY_LLAMA2,          // "llama2": <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]
    CHAT_FAMILY_MISTRAL_LEGACY,  // "mistral-legacy": Mistral/Mixtral v0.1 original template,
                                 //   <s>[INST] x [/INST]y</s>; no system role
    CHAT_FAMILY_MISTRAL_V1,      // "mistral-v1": Mistral's official v1 template,
                                 //   <s> [INST] x [/INST] y</s>; system joins the first user turn
    CHAT_FAMILY_MISTRAL_TEKKEN,  // "mistral-v3-tekken": Mistral Nemo, <s>[INST]x[/INST]y</s>;
                                 //   system joins the last message if that is a user turn
    CHAT_FAMILY_PHI3,            // "phi3": Phi-3.5, <|role|>\n...<|end|>\n
    CHAT_FAMILY_GEMMA,           // "gemma": <start_of_turn>user|model\n...<end_of_turn>\n
    CHAT_FAMILY_ZEPHYR,          // "zephyr": <|role|>\n...</s>\n
    CHAT_FAMILY_DEEPSEEK_R1,     // "deepseek-r1": DeepSeek-R1 (and its Qwen/Llama distills),
                                 //   <｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>
    CHAT_FAMILY_COUNT            // not a family: the number of families
};

/* The family to use when a model has no tokenizer.chat_template at all
 * (chat_detect() returns ERR_NOTFOUND): plain ChatML, as most servers do.
 * This is the only fallback; an unrecognised template is an error. */
#define CHAT_FAMILY_FALLBACK CHAT_FAMILY_CHATML

/* One call of an assistant message (OpenAI's message.tool_calls[i]). The
 * engine knows no JSON: arguments come as the text Jinja's tojson filter
 * writes for the parsed arguments object (Python's json.dumps: ", " and ": "
 * separators, UTF-8 kept), which the server produces. */
struct chat_tool_call {
    const char *id;         // the call's id (Mistral's template wants 9 alphanumerics)
    const char *name;       // the function's name
    const char *arguments;  // the arguments object as tojson writes it
};

/* One message. Strings are borrowed, NUL-terminated; content is passed
 * through unchanged (any UTF-8) except where the template trims it. */
struct chat_message {
    const char *role;                         // "system", "user", "assistant" or "tool"
    const char *content;
    const struct chat_tool_call *tool_calls;  // [n_tool_calls], assistant messages only
    int32_t n_tool_calls;
    const char *tool_call_id;                 // role "tool": the call it answers (or NULL)
};

/* A member of a tool's "function" object, as Mistral's template writes it:
 * a string value raw, anything else as tojson text. */
struct chat_tool_member {
    const char *key;
    const char *value;  // the raw string (is_string) or the value's tojson text
    bool is_string;
};

/* One entry of the request's tools (OpenAI's {"type": "function",
 * "function": {"name", "description", "parameters"}}), serialised by the
 * server the ways the templates print it. */
struct chat_tool {
    const char *json;                        // tojson(tool): {"type": "function", ...}
    const char *json_indent4;                // tojson(tool, indent=4)
    const struct chat_tool_member *members;  // [n_members] of tool.function, in order
    int32_t n_members;
};

/* How a family's model writes tool calls (what its template renders for an
 * assistant message's tool_calls, and its instructions ask for). Every call
 * is call_open + {"name": "NAME", "ARGS_KEY": ARGUMENTS} + call_close; the
 * calls stand between list_open and list_close, separated by separator. The
 * output text of a turn with calls starts them with trigger (a prefix of
 * list_open + call_open + "{\"name\": \""). All strings static. */
struct chat_tool_syntax {
    const char *trigger;     // "<tool_call>", "[TOOL_CALLS]", "{\"name\": \""
    const char *trigger_prefix;  // a marker the model may write just before the trigger,
                                 //   never content ("<|python_tag|>" for Llama 3.1), or ""
    const char *list_open;   // before the first call ("[TOOL_CALLS][" or "")
    const char *call_open;   // before each call's object ("<tool_call>\n" or "")
    const char *call_close;  // after each call's object ("\n</tool_call>" or "")
    const char *separator;   // between calls
    const char *list_close;  // after the last call ("]" or "")
    const char *args_key;    // "arguments" or "parameters" (Llama 3.1)
    bool parallel;           // more than one call in a turn (Llama 3.1's template: one)
    bool short_ids;          // call ids are 9 alphanumerics (Mistral's template raises else)
};

struct chat_render_params {
    const char *bos_text;        // the model's BOS token text (e.g. "<s>"); NULL or "" when it
                                 // has none: renders as "" like an undefined Jinja variable
    const char *eos_text;        // the model's EOS token text (e.g. "</s>"); NULL or "" likewise
    bool add_generation_prompt;  // open an assistant turn at the end (families that have one)
    const char *date_string;     // Llama 3.1's "Today Date: "; NULL: the template's default
                                 // "26 Jul 2024"
    const struct chat_tool *tools;  // [n_tools] the functions offered; NULL/0: none
    int32_t n_tools;
};

/* bos_text = eos_text = date_string = NULL, add_generation_prompt = true, no tools. */
struct chat_render_params chat_render_default_params(void);

/* Recognises the family of a chat template (len bytes, need not be
 * NUL-terminated). Returns 0 and sets *out; ERR_NOTFOUND when tmpl is NULL,
 * empty or all whitespace (use CHAT_FAMILY_FALLBACK); ERR_UNSUPPORTED when the
 * template is not one of the families above, or is a relative we do not render
 * exactly (Mistral v3 non-tekken and v7, Phi-4, ...): logged at WARN once with
 * the template's size; the caller must then refuse chat requests (or take an
 * explicit override) rather than guess. On failure *out is left unchanged. */
int chat_detect(const char *tmpl, size_t len, enum chat_family *out);

/* The family's name (see the enum), a static string; "unknown" when f is out
 * of range. */
const char *chat_family_name(enum chat_family f);

/* Parses a family name as chat_family_name() spells it. Returns 0 or
 * ERR_INVAL (unknown name; *out unchanged). */
int chat_family_parse(const char *name, enum chat_family *out);

/* True when family f's template writes bos_token at the very start of the
 * prompt (so the tokenizer must not add another BOS). */
bool chat_family_has_bos(enum chat_family f);

/* True when family f's template puts tools into the prompt and renders tool
 * calls and tool results: chatml (as Qwen 2.5 / Hermes do, without Qwen's
 * default system message: generic ChatML templates define no tools),
 * qwen2.5, llama3.1 and mistral-v3-tekken. */
bool chat_family_has_tools(enum chat_family f);

/* The tool-call syntax of family f into *out. Returns 0, or ERR_UNSUPPORTED
 * when the family has none (chat_family_has_tools() is false). */
int chat_tool_syntax(enum chat_family f, struct chat_tool_syntax *out);

/* Appends s[0, n) as a JSON string the way Jinja's tojson filter writes it
 * in Hugging Face's templates (Python's json.dumps with ensure_ascii=False):
 * quotes, \" \\ \n \r \t \b \f, other control characters as \u00xx, all
 * else as is. [any thread] */
void chat_append_json_string(struct buf *out, const char *s, size_t n);

/* Renders n_msgs messages as family f's template does and appends the prompt to
 * out (out is borrowed; a zeroed struct buf is fine).
 *
 * *out_has_bos (may be NULL) is set to true when the appended text begins with
 * params->bos_text written by the template itself, so the caller tokenizes it
 * without adding a second BOS (and with parse_special, so the markers become
 * their control tokens).
 *
 * Families without a generation prompt in their template (llama2, mistral-*)
 * ignore add_generation_prompt: their prompt already ends where the assistant
 * answer begins ("[/INST]").
 *
 * Returns 0, or ERR_INVAL when the messages cannot be rendered, with a
 * client-facing reason in msg (msg_size bytes, NUL-terminated, may be NULL):
 * no messages, a NULL role or content, a role other than system/user/assistant
 * (or tool, for families with tools), tools, tool calls or tool messages for
 * a family without them, what a family's template raises on (Llama 3.1: more
 * than one call in a message, tools and no message after the system one;
 * Mistral: call ids that are not 9 characters), or a role order the template rejects (llama2, mistral-*, gemma: an optional
 * first system message, then user/assistant alternating from user, at least
 * one user message; mistral-legacy: no system message at all).
 * Gemma: the real Gemma 2 template raises on any system message; we instead
 * merge it into the first user turn as Gemma 3's template does
 * ("<system>\n\n<trimmed user>"). On failure out is unchanged.
 * Messages are client input: nothing is logged above DEBUG. [any thread] */
int chat_render(enum chat_family f, const struct chat_message *msgs, int32_t n_msgs,
                const struct chat_render_params *params, struct buf *out, bool *out_has_bos,
                char *msg, size_t msg_size);

/* The bytes family f's template writes between the end of the prompt and an
 * assistant reply's content (llama2 and mistral-v1: " ", from "[/INST] " +
 * reply; "" for the others), into out (NUL-terminated; "" when they would not
 * fit in out_size). Derived by rendering a conversation without and with a
 * reply, so it follows the renderer. A model continuing the prompt writes
 * them first; they are the template's, not the reply's, and servers drop
 * them from the reply's text. [any thread] */
void chat_reply_prefix(enum chat_family f, const struct chat_render_params *params, char *out,
                       size_t out_size);

#endif
