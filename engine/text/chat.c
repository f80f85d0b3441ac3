/*
 * chat.c - chat template family detection and exact per-family rendering.
 *
 * Each render_* function below is the Jinja template of its family rewritten
 * as C; the comment above it quotes the parts of the template that decide the
 * output, so a reader can check the two against each other. Rendering happens
 * in two passes: validate() checks the messages against what the family's
 * template accepts (and rejects what it would raise on or silently drop), then
 * the renderer appends, and cannot fail. That keeps `out` untouched on error.
 *
 * Jinja semantics worth knowing here: HF renders with trim_blocks and
 * lstrip_blocks, so a newline right after a {% block %} tag is dropped but a
 * newline after a {{ expression }} is kept (Zephyr relies on that); the
 * template's final newline is dropped; `| trim` and `.strip()` are Python's
 * str.strip(), which strips every code point for which str.isspace() is true.
 */
#define LOG_TAG "chat"
#include "engine/text/chat.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/log.h"

enum role {
    ROLE_SYSTEM,
    ROLE_USER,
    ROLE_ASSISTANT,
    ROLE_TOOL,
    ROLE_OTHER,
};

static const char *const family_names[CHAT_FAMILY_COUNT] = {
    [CHAT_FAMILY_CHATML] = "chatml",
    [CHAT_FAMILY_QWEN2_5] = "qwen2.5",
    [CHAT_FAMILY_LLAMA3] = "llama3",
    [CHAT_FAMILY_LLAMA3_1] = "llama3.1",
    [CHAT_FAMILY_LLAMA2] = "llama2",
    [CHAT_FAMILY_MISTRAL_LEGACY] = "mistral-legacy",
    [CHAT_FAMILY_MISTRAL_V1] = "mistral-v1",
    [CHAT_FAMILY_MISTRAL_TEKKEN] = "mistral-v3-tekken",
    [CHAT_FAMILY_PHI3] = "phi3",
    [CHAT_FAMILY_GEMMA] = "gemma",
    [CHAT_FAMILY_ZEPHYR] = "zephyr",
    [CHAT_FAMILY_DEEPSEEK_R1] = "deepseek-r1",
};

#define QWEN2_5_DEFAULT_SYSTEM \
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#define LLAMA3_1_DEFAULT_DATE "26 Jul 2024"

/* DeepSeek's markers use U+FF5C FULLWIDTH VERTICAL LINE and U+2581 LOWER ONE
 * EIGHTH BLOCK (UTF-8 in this source file), not ASCII '|' and '_'. */
#define DEEPSEEK_USER      "<｜User｜>"
#define DEEPSEEK_ASSISTANT "<｜Assistant｜>"
#define DEEPSEEK_EOS       "<｜end▁of▁sentence｜>"

/* ---- helpers ------------------------------------------------------------ */

static void set_msg(char *msg, size_t msg_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_msg(char *msg, size_t msg_size, const char *fmt, ...) {
    if (!msg || msg_size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msg_size, fmt, ap);
    va_end(ap);
}

static enum role role_of(const struct chat_message *m) {
    if (strcmp(m->role, "system") == 0) return ROLE_SYSTEM;
    if (strcmp(m->role, "user") == 0) return ROLE_USER;
    if (strcmp(m->role, "assistant") == 0) return ROLE_ASSISTANT;
    if (strcmp(m->role, "tool") == 0) return ROLE_TOOL;
    return ROLE_OTHER;
}

/* Bounded substring search (the template need not be NUL-terminated). */
static bool contains(const char *hay, size_t n_hay, const char *needle) {
    size_t n = strlen(needle);
    if (n == 0) return true;
    if (n > n_hay) return false;
    for (size_t i = 0; i + n <= n_hay; i++) {
        if (hay[i] == needle[0] && memcmp(hay + i, needle, n) == 0) return true;
    }
    return false;
}

/* Python's str.isspace() code points. */
static bool is_py_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* Decodes one well-formed UTF-8 sequence at s[0..n); returns its length, or 0
 * when the bytes there are not one (such bytes never count as whitespace: a
 * Python str cannot hold them, so the template never saw them). */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *out_cp) {
    if (n == 0) return 0;
    unsigned char c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
        *out_cp = c;
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    *out_cp = cp;
    return len;
}

/* Appends s[0..n) with leading and trailing Python whitespace removed. */
static void append_trimmed(struct buf *out, const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    size_t b = 0;
    size_t e = n;
    uint32_t cp = 0;
    while (b < e) {
        size_t k = utf8_decode(s + b, e - b, &cp);
        if (k == 0 || !is_py_space(cp)) break;
        b += k;
    }
    while (e > b) {
        // the last code point starts at the last non-continuation byte (at most 4 back)
        size_t start = e - 1;
        while (start > b && e - start < 4 && (s[start] & 0xc0) == 0x80) start--;
        size_t k = utf8_decode(s + start, e - start, &cp);
        if (k != e - start || !is_py_space(cp)) break;
        e = start;
    }
    buf_append(out, text + b, e - b);
}

static void append_trimmed_str(struct buf *out, const char *s) {
    append_trimmed(out, s, strlen(s));
}

/* The text after the last "</think>" (Python: content.split('</think>')[-1]). */
static const char *after_last_think(const char *content) {
    const char *tag = "</think>";
    const char *rest = content;
    for (const char *p = strstr(content, tag); p; p = strstr(p + 1, tag)) rest = p + strlen(tag);
    return rest;
}

static const char *or_empty(const char *s) {
    return s ? s : "";
}

void chat_append_json_string(struct buf *out, const char *s, size_t n) {
    buf_append_char(out, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f" : NULL;
        if (esc) {
            buf_append_str(out, esc);
        } else if (c < 0x20) {
            char u[8];
            snprintf(u, sizeof(u), "\\u%04x", (unsigned)c);
            buf_append_str(out, u);
        } else {
            buf_append_char(out, (char)c);
        }
    }
    buf_append_char(out, '"');
}

/* Whether message m is a tool-calling assistant turn. */
static bool has_calls(const struct chat_message *m) {
    return m->n_tool_calls > 0;
}

/* ---- validation --------------------------------------------------------- */

static bool family_alternates(enum chat_family f) {
    switch (f) {
        case CHAT_FAMILY_LLAMA2:
        case CHAT_FAMILY_MISTRAL_LEGACY:
        case CHAT_FAMILY_MISTRAL_V1:
        case CHAT_FAMILY_MISTRAL_TEKKEN:
        case CHAT_FAMILY_GEMMA:
            return true;
        case CHAT_FAMILY_CHATML:
        case CHAT_FAMILY_QWEN2_5:
        case CHAT_FAMILY_LLAMA3:
        case CHAT_FAMILY_LLAMA3_1:
        case CHAT_FAMILY_PHI3:
        case CHAT_FAMILY_ZEPHYR:
        case CHAT_FAMILY_DEEPSEEK_R1:
        case CHAT_FAMILY_COUNT:
            return false;
    }
    UNREACHABLE();
}

/* The tool rules: tools, tool calls and tool messages only for families
 * with tools, and what those templates raise on. */
static int validate_tools(enum chat_family f, const struct chat_message *msgs, int32_t n_msgs,
                          const struct chat_render_params *p, char *msg, size_t msg_size) {
    bool tools_ok = chat_family_has_tools(f);
    if (p->n_tools > 0 && !tools_ok) {
        set_msg(msg, msg_size, "the %s chat template does not support tools", family_names[f]);
        return ERR_INVAL;
    }
    for (int32_t i = 0; i < n_msgs; i++) {
        enum role r = role_of(&msgs[i]);
        if (has_calls(&msgs[i]) && (!tools_ok || r != ROLE_ASSISTANT)) {
            set_msg(msg, msg_size, "messages[%d]: %s", (int)i,
                    tools_ok ? "only assistant messages may have tool_calls"
                             : "this model's chat template does not support tool_calls");
            return ERR_INVAL;
        }
        for (int32_t k = 0; k < msgs[i].n_tool_calls; k++) {
            const struct chat_tool_call *c = &msgs[i].tool_calls[k];
            if (!c->name || !c->arguments || !c->id) {
                set_msg(msg, msg_size, "messages[%d].tool_calls[%d] needs an id, a name and "
                        "arguments", (int)i, (int)k);
                return ERR_INVAL;
            }
            if (f == CHAT_FAMILY_MISTRAL_TEKKEN && strlen(c->id) != 9) {
                set_msg(msg, msg_size, "messages[%d].tool_calls[%d].id: the %s chat template "
                        "needs tool call ids of 9 alphanumeric characters", (int)i, (int)k,
                        family_names[f]);
                return ERR_INVAL;
            }
        }
        if (f == CHAT_FAMILY_LLAMA3_1 && msgs[i].n_tool_calls > 1) {
            set_msg(msg, msg_size, "messages[%d]: the %s chat template supports one tool call "
                    "per message", (int)i, family_names[f]);
            return ERR_INVAL;
        }
        if (r == ROLE_TOOL && f == CHAT_FAMILY_MISTRAL_TEKKEN &&
            (!msgs[i].tool_call_id || strlen(msgs[i].tool_call_id) != 9)) {
            set_msg(msg, msg_size, "messages[%d].tool_call_id: the %s chat template needs tool "
                    "call ids of 9 alphanumeric characters", (int)i, family_names[f]);
            return ERR_INVAL;
        }
    }
    if (f == CHAT_FAMILY_LLAMA3_1 && p->n_tools > 0 &&
        n_msgs == (role_of(&msgs[0]) == ROLE_SYSTEM ? 1 : 0)) {
        set_msg(msg, msg_size, "the %s chat template puts tools into the first user message, "
                "and there is none", family_names[f]);
        return ERR_INVAL;
    }
    return 0;
}

/* Checks what every family needs, then the alternation rule of the templates
 * that raise_exception() on it:
 *     {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}raise
 * over the messages after an optional first system message (Mistral's tool
 * template leaves tool messages and tool-calling turns out of the count). We
 * also reject a system message anywhere else (those templates either raise on
 * it or drop it silently) and a conversation with no user turn (the template
 * would render nothing but BOS, silently losing the system message). */
static int validate(enum chat_family f, const struct chat_message *msgs, int32_t n_msgs,
                    const struct chat_render_params *p, char *msg, size_t msg_size) {
    if (!msgs || n_msgs <= 0) {
        set_msg(msg, msg_size, "messages must contain at least one message");
        return ERR_INVAL;
    }
    for (int32_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].role) {
            set_msg(msg, msg_size, "messages[%d].role is missing", (int)i);
            return ERR_INVAL;
        }
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_OTHER || (r == ROLE_TOOL && !chat_family_has_tools(f))) {
            set_msg(msg, msg_size,
                    "messages[%d].role '%.32s' is not supported (expected system, user or "
                    "assistant%s)",
                    (int)i, msgs[i].role, chat_family_has_tools(f) ? " or tool" : "");
            return ERR_INVAL;
        }
        if (!msgs[i].content) {
            set_msg(msg, msg_size, "messages[%d].content is missing", (int)i);
            return ERR_INVAL;
        }
    }
    int err = validate_tools(f, msgs, n_msgs, p, msg, msg_size);
    if (err) return err;
    if (!family_alternates(f)) return 0;

    int32_t i0 = role_of(&msgs[0]) == ROLE_SYSTEM ? 1 : 0;
    if (i0 == 1 && f == CHAT_FAMILY_MISTRAL_LEGACY) {
        set_msg(msg, msg_size, "the %s chat template does not support a system message",
                family_names[f]);
        return ERR_INVAL;
    }
    if (i0 == n_msgs) {
        set_msg(msg, msg_size, "messages must contain a user message after the system message");
        return ERR_INVAL;
    }
    int32_t k = 0;  // position among the counted messages
    for (int32_t i = i0; i < n_msgs; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_SYSTEM) {
            set_msg(msg, msg_size,
                    "messages[%d]: the %s chat template only allows a system message as the "
                    "first message",
                    (int)i, family_names[f]);
            return ERR_INVAL;
        }
        if (r == ROLE_TOOL || has_calls(&msgs[i])) continue;  // only tekken gets here
        enum role want = k % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
        k++;
        if (r != want) {
            set_msg(
                msg, msg_size,
                "messages[%d]: after the optional system message, conversation roles must "
                "alternate user/assistant/user/assistant/... (the %s chat template requires it)",
                (int)i, family_names[f]);
            return ERR_INVAL;
        }
    }
    return 0;
}

/* ---- renderers ---------------------------------------------------------- */

#define HERMES_TOOLS_OPEN                                                                   \
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are " \
    "provided with function signatures within <tools></tools> XML tags:\n<tools>"
#define HERMES_TOOLS_CLOSE                                                                    \
    "\n</tools>\n\nFor each function call, return a json object with function name and "      \
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "             \
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"

/* Generic ChatML:
 *     {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' +
 *     message['content'] + '<|im_end|>' + '\n'}}{% endfor %}
 *     {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
 * Qwen2.5 first writes messages[0] if it is system, else the default
 *     '<|im_start|>system\n' QWEN2_5_DEFAULT_SYSTEM '<|im_end|>\n'
 * and its loop skips a system message only when it is loop.first. With tools:
 *     '<|im_start|>system\n' + (system content or the default)
 *     + "\n\n" HERMES_TOOLS_OPEN + ("\n" + tool | tojson for each) + HERMES_TOOLS_CLOSE
 * and in the loop an assistant turn with tool_calls is
 *     '<|im_start|>assistant' + ('\n' + content if content) + for each call
 *     '\n<tool_call>\n{"name": "' + name + '", "arguments": ' + arguments|tojson
 *     + '}\n</tool_call>', then '<|im_end|>\n'; a run of tool messages is one
 *     '<|im_start|>user' turn of '\n<tool_response>\n' + content + '\n</tool_response>'.
 * Generic ChatML has no tools of its own: it takes Qwen's (the Hermes format)
 * without the default system message ("# Tools..." starts the system turn
 * when there is no system message). */
static void render_chatml(const struct chat_message *msgs, int32_t n_msgs,
                          const struct chat_render_params *p, bool is_qwen, struct buf *out) {
    int32_t i0 = 0;
    bool has_sys = role_of(&msgs[0]) == ROLE_SYSTEM;
    if (p->n_tools > 0) {
        buf_append_str(out, "<|im_start|>system\n");
        if (has_sys || is_qwen) {
            buf_append_str(out, has_sys ? msgs[0].content : QWEN2_5_DEFAULT_SYSTEM);
            buf_append_str(out, "\n\n");
        }
        buf_append_str(out, HERMES_TOOLS_OPEN);
        for (int32_t t = 0; t < p->n_tools; t++) {
            buf_append_char(out, '\n');
            buf_append_str(out, p->tools[t].json);
        }
        buf_append_str(out, HERMES_TOOLS_CLOSE);
        i0 = has_sys ? 1 : 0;
    } else if (is_qwen) {
        buf_append_str(out, "<|im_start|>system\n");
        buf_append_str(out, has_sys ? msgs[0].content : QWEN2_5_DEFAULT_SYSTEM);
        buf_append_str(out, "<|im_end|>\n");
        i0 = has_sys ? 1 : 0;
    }
    for (int32_t i = i0; i < n_msgs; i++) {
        const struct chat_message *m = &msgs[i];
        if (role_of(m) == ROLE_TOOL) {
            if (i == 0 || role_of(&msgs[i - 1]) != ROLE_TOOL) buf_append_str(out, "<|im_start|>user");
            buf_append_str(out, "\n<tool_response>\n");
            buf_append_str(out, m->content);
            buf_append_str(out, "\n</tool_response>");
            if (i == n_msgs - 1 || role_of(&msgs[i + 1]) != ROLE_TOOL) buf_append_str(out, "<|im_end|>\n");
            continue;
        }
        if (has_calls(m)) {
            buf_append_str(out, "<|im_start|>assistant");
            if (m->content[0]) {
                buf_append_char(out, '\n');
                buf_append_str(out, m->content);
            }
            for (int32_t k = 0; k < m->n_tool_calls; k++) {
                buf_append_str(out, "\n<tool_call>\n{\"name\": \"");
                buf_append_str(out, m->tool_calls[k].name);
                buf_append_str(out, "\", \"arguments\": ");
                buf_append_str(out, m->tool_calls[k].arguments);
                buf_append_str(out, "}\n</tool_call>");
            }
            buf_append_str(out, "<|im_end|>\n");
            continue;
        }
        buf_append_str(out, "<|im_start|>");
        buf_append_str(out, m->role);
        buf_append_char(out, '\n');
        buf_append_str(out, m->content);
        buf_append_str(out, "<|im_end|>\n");
    }
    if (p->add_generation_prompt) buf_append_str(out, "<|im_start|>assistant\n");
}

static void append_llama3_turn(struct buf *out, const char *role, const char *content) {
    buf_append_str(out, "<|start_header_id|>");
    buf_append_str(out, role);
    buf_append_str(out, "<|end_header_id|>\n\n");
    append_trimmed_str(out, content);
    buf_append_str(out, "<|eot_id|>");
}

/* Llama 3.0: every message is
 *     '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>'
 * with bos_token before the first one; then the assistant header.
 * Llama 3.1 (no builtin_tools; tools_in_user_message left at its default, true):
 *     {{- bos_token }}
 *     system_message = messages[0]['content']|trim if it is system (and is removed), else ""
 *     "<|start_header_id|>system<|end_header_id|>\n\n"
 *     ["Environment: ipython\n" with tools]
 *     "Cutting Knowledge Date: December 2023\n" "Today Date: " + date_string + "\n\n"
 *     system_message "<|eot_id|>"
 * with tools, the first remaining message (whatever its role) is taken out and becomes
 *     '<|start_header_id|>user<|end_header_id|>\n\n' LLAMA3_1_TOOLS_INTRO
 *     + (t | tojson(indent=4) + "\n\n" for each tool) + its content|trim + "<|eot_id|>"
 * then the loop as in 3.0 (a later system message keeps its role), except that
 * a turn with tool_calls (one) is the assistant header + '{"name": "' + name
 * + '", "parameters": ' + arguments|tojson + "}" + "<|eot_id|>", and a tool
 * message is '<|start_header_id|>ipython<|end_header_id|>\n\n' + content|tojson
 * (`content is iterable` holds for a string) + "<|eot_id|>". */
#define LLAMA3_1_TOOLS_INTRO                                                                   \
    "Given the following functions, please respond with a JSON for a function call with its " \
    "proper arguments that best answers the given prompt.\n\nRespond in the format "          \
    "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do " \
    "not use variables.\n\n"
static void render_llama3(const struct chat_message *msgs, int32_t n_msgs,
                          const struct chat_render_params *p, bool is_3_1, struct buf *out) {
    buf_append_str(out, or_empty(p->bos_text));
    int32_t i0 = 0;
    if (is_3_1) {
        buf_append_str(out, "<|start_header_id|>system<|end_header_id|>\n\n");
        if (p->n_tools > 0) buf_append_str(out, "Environment: ipython\n");
        buf_append_str(out, "Cutting Knowledge Date: December 2023\n");
        buf_append_str(out, "Today Date: ");
        buf_append_str(out, p->date_string ? p->date_string : LLAMA3_1_DEFAULT_DATE);
        buf_append_str(out, "\n\n");
        if (role_of(&msgs[0]) == ROLE_SYSTEM) {
            append_trimmed_str(out, msgs[0].content);
            i0 = 1;
        }
        buf_append_str(out, "<|eot_id|>");
        if (p->n_tools > 0) {  // validate() made sure a message is left
            buf_append_str(out, "<|start_header_id|>user<|end_header_id|>\n\n");
            buf_append_str(out, LLAMA3_1_TOOLS_INTRO);
            for (int32_t t = 0; t < p->n_tools; t++) {
                buf_append_str(out, p->tools[t].json_indent4);
                buf_append_str(out, "\n\n");
            }
            append_trimmed_str(out, msgs[i0].content);
            buf_append_str(out, "<|eot_id|>");
            i0++;
        }
    }
    for (int32_t i = i0; i < n_msgs; i++) {
        const struct chat_message *m = &msgs[i];
        if (has_calls(m)) {
            buf_append_str(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
            buf_append_str(out, "{\"name\": \"");
            buf_append_str(out, m->tool_calls[0].name);
            buf_append_str(out, "\", \"parameters\": ");
            buf_append_str(out, m->tool_calls[0].arguments);
            buf_append_str(out, "}<|eot_id|>");
        } else if (role_of(m) == ROLE_TOOL) {
            buf_append_str(out, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            chat_append_json_string(out, m->content, strlen(m->content));
            buf_append_str(out, "<|eot_id|>");
        } else {
            append_llama3_turn(out, m->role, m->content);
        }
    }
    if (p->add_generation_prompt)
        buf_append_str(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Llama 2 (meta-llama/Llama-2-*-chat-hf):
 *     first loop message with a system message:
 *         content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content']
 *     user:      bos_token + '[INST] ' + content.strip() + ' [/INST]'
 *     assistant: ' ' + content.strip() + ' ' + eos_token
 * The strip applies to the joined text, so it is built first. */
static void render_llama2(const struct chat_message *msgs, int32_t n_msgs,
                          const struct chat_render_params *p, struct buf *out) {
    int32_t i0 = role_of(&msgs[0]) == ROLE_SYSTEM ? 1 : 0;
    struct buf content = {0};
    for (int32_t i = i0; i < n_msgs; i++) {
        buf_reset(&content);
        if (i == i0 && i0 == 1) {
            buf_append_str(&content, "<<SYS>>\n");
            buf_append_str(&content, msgs[0].content);
            buf_append_str(&content, "\n<</SYS>>\n\n");
        }
        buf_append_str(&content, msgs[i].content);
        if (role_of(&msgs[i]) == ROLE_USER) {
            buf_append_str(out, or_empty(p->bos_text));
            buf_append_str(out, "[INST] ");
            append_trimmed(out, content.data, content.len);
            buf_append_str(out, " [/INST]");
        } else {
            buf_append_char(out, ' ');
            append_trimmed(out, content.data, content.len);
            buf_append_char(out, ' ');
            buf_append_str(out, or_empty(p->eos_text));
        }
    }
    buf_free(&content);
}

/* Mistral legacy (Mistral-7B-Instruct-v0.1 / Mixtral-8x7B-Instruct-v0.1 originals):
 *     {{ bos_token }} user: '[INST] ' + content + ' [/INST]'   assistant: content + eos_token
 * Mistral v1 (the official template):
 *     {{- bos_token }}
 *     user, loop.first with system: ' [INST] ' + system_message + '\n\n' + content + ' [/INST]'
 *     user otherwise:               ' [INST] ' + content + ' [/INST]'
 *     assistant:                    ' ' + content + eos_token
 * Mistral v3 tekken (Mistral Nemo):
 *     {{- bos_token }}
 *     user, loop.last with system:  "[INST]" + system_message + "\n\n" + content + "[/INST]"
 *     user otherwise:               "[INST]" + content + "[/INST]"
 *     assistant:                    content + eos_token
 * (so Nemo drops the system message when the last message is an assistant's).
 * Nemo's tools go before the last user message (every user message equal to
 * it: the template compares with ==):
 *     "[AVAILABLE_TOOLS][" + for each tool '{"type": "function", "function": {'
 *     + its function's members but "return" ('"key": "value"' for a string value,
 *     '"key": ' + value|tojson otherwise) joined by ", " + "}}", joined by ", "
 *     + "][/AVAILABLE_TOOLS]"
 * a turn with tool_calls is "[TOOL_CALLS][" + for each call
 *     tool_call.function|tojson minus its "}" + ', "id": "' + id + '"}', joined
 *     by ", " + "]" + eos_token
 * and a tool message '[TOOL_RESULTS]{"content": ' + content + ', "call_id": "'
 * + tool_call_id + '"}[/TOOL_RESULTS]'. */
static void render_mistral_tools(const struct chat_render_params *p, struct buf *out) {
    buf_append_str(out, "[AVAILABLE_TOOLS][");
    for (int32_t t = 0; t < p->n_tools; t++) {
        const struct chat_tool *tool = &p->tools[t];
        buf_append_str(out, "{\"type\": \"function\", \"function\": {");
        bool first = true;
        for (int32_t k = 0; k < tool->n_members; k++) {
            const struct chat_tool_member *m = &tool->members[k];
            if (strcmp(m->key, "return") == 0) continue;
            if (!first) buf_append_str(out, ", ");
            first = false;
            buf_append_char(out, '"');
            buf_append_str(out, m->key);
            buf_append_str(out, m->is_string ? "\": \"" : "\": ");
            buf_append_str(out, m->value);
            if (m->is_string) buf_append_char(out, '"');
        }
        buf_append_str(out, "}}");
        buf_append_str(out, t + 1 < p->n_tools ? ", " : "]");
    }
    buf_append_str(out, "[/AVAILABLE_TOOLS]");
}

static void render_mistral_calls(const struct chat_message *m, const struct chat_render_params *p,
                                 struct buf *out) {
    buf_append_str(out, "[TOOL_CALLS][");
    for (int32_t k = 0; k < m->n_tool_calls; k++) {
        buf_append_str(out, "{\"name\": \"");
        buf_append_str(out, m->tool_calls[k].name);
        buf_append_str(out, "\", \"arguments\": ");
        buf_append_str(out, m->tool_calls[k].arguments);
        buf_append_str(out, ", \"id\": \"");
        buf_append_str(out, m->tool_calls[k].id);
        buf_append_str(out, "\"}");
        if (k + 1 < m->n_tool_calls) buf_append_str(out, ", ");
    }
    buf_append_str(out, "]");
    buf_append_str(out, or_empty(p->eos_text));
}

static void render_mistral(enum chat_family f, const struct chat_message *msgs, int32_t n_msgs,
                           const struct chat_render_params *p, struct buf *out) {
    int32_t i0 = role_of(&msgs[0]) == ROLE_SYSTEM ? 1 : 0;
    const char *sys = i0 ? msgs[0].content : NULL;
    const char *inst_open = f == CHAT_FAMILY_MISTRAL_V1       ? " [INST] "
                            : f == CHAT_FAMILY_MISTRAL_LEGACY ? "[INST] "
                                                              : "[INST]";
    const char *inst_close = f == CHAT_FAMILY_MISTRAL_TEKKEN ? "[/INST]" : " [/INST]";
    const char *asst_prefix = f == CHAT_FAMILY_MISTRAL_V1 ? " " : "";
    const char *last_user = NULL;
    for (int32_t i = i0; i < n_msgs; i++) {
        if (role_of(&msgs[i]) == ROLE_USER) last_user = msgs[i].content;
    }
    buf_append_str(out, or_empty(p->bos_text));
    for (int32_t i = i0; i < n_msgs; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_USER) {
            if (p->n_tools > 0 && strcmp(msgs[i].content, last_user) == 0) {
                render_mistral_tools(p, out);
            }
            bool with_sys = sys && ((f == CHAT_FAMILY_MISTRAL_V1 && i == i0) ||
                                    (f == CHAT_FAMILY_MISTRAL_TEKKEN && i == n_msgs - 1));
            buf_append_str(out, inst_open);
            if (with_sys) {
                buf_append_str(out, sys);
                buf_append_str(out, "\n\n");
            }
            buf_append_str(out, msgs[i].content);
            buf_append_str(out, inst_close);
        } else if (has_calls(&msgs[i])) {
            render_mistral_calls(&msgs[i], p, out);
        } else if (r == ROLE_TOOL) {
            buf_append_str(out, "[TOOL_RESULTS]{\"content\": ");
            buf_append_str(out, msgs[i].content);
            buf_append_str(out, ", \"call_id\": \"");
            buf_append_str(out, msgs[i].tool_call_id);
            buf_append_str(out, "\"}[/TOOL_RESULTS]");
        } else {
            buf_append_str(out, asst_prefix);
            buf_append_str(out, msgs[i].content);
            buf_append_str(out, or_empty(p->eos_text));
        }
    }
}

/* Phi-3.5-mini-instruct:
 *     system (non-empty content): '<|system|>\n' + content + '<|end|>\n'
 *     user: '<|user|>\n' + content + '<|end|>\n'   assistant: '<|assistant|>\n' + ...
 *     {% if add_generation_prompt %}'<|assistant|>\n'{% else %}{{ eos_token }}{% endif %} */
static void render_phi3(const struct chat_message *msgs, int32_t n_msgs,
                        const struct chat_render_params *p, struct buf *out) {
    for (int32_t i = 0; i < n_msgs; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_SYSTEM && msgs[i].content[0] == '\0') continue;  // Jinja: '' is falsy
        buf_append_str(out, "<|");
        buf_append_str(out, msgs[i].role);
        buf_append_str(out, "|>\n");
        buf_append_str(out, msgs[i].content);
        buf_append_str(out, "<|end|>\n");
    }
    if (p->add_generation_prompt)
        buf_append_str(out, "<|assistant|>\n");
    else
        buf_append_str(out, or_empty(p->eos_text));
}

/* Gemma (2 and 3):
 *     {{ bos_token }}  each turn:
 *     '<start_of_turn>' + ('model' if assistant else role) + '\n'
 *         + content | trim + '<end_of_turn>\n'
 *     {% if add_generation_prompt %}'<start_of_turn>model\n'{% endif %}
 * A first system message becomes Gemma 3's first_user_prefix, content + '\n\n'
 * (untrimmed), written before the first user turn's trimmed content. */
static void render_gemma(const struct chat_message *msgs, int32_t n_msgs,
                         const struct chat_render_params *p, struct buf *out) {
    int32_t i0 = role_of(&msgs[0]) == ROLE_SYSTEM ? 1 : 0;
    buf_append_str(out, or_empty(p->bos_text));
    for (int32_t i = i0; i < n_msgs; i++) {
        bool is_user = role_of(&msgs[i]) == ROLE_USER;
        buf_append_str(out, is_user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == i0 && i0 == 1) {
            buf_append_str(out, msgs[0].content);
            buf_append_str(out, "\n\n");
        }
        append_trimmed_str(out, msgs[i].content);
        buf_append_str(out, "<end_of_turn>\n");
    }
    if (p->add_generation_prompt) buf_append_str(out, "<start_of_turn>model\n");
}

/* Zephyr (HuggingFaceH4/zephyr-7b-beta): each message is
 *     {{ '<|role|>\n' + message['content'] + eos_token }}\n
 * where the newline after the expression survives trim_blocks; after the last
 * one, with add_generation_prompt, {{ '<|assistant|>' }}\n. */
static void render_zephyr(const struct chat_message *msgs, int32_t n_msgs,
                          const struct chat_render_params *p, struct buf *out) {
    for (int32_t i = 0; i < n_msgs; i++) {
        buf_append_str(out, "<|");
        buf_append_str(out, msgs[i].role);
        buf_append_str(out, "|>\n");
        buf_append_str(out, msgs[i].content);
        buf_append_str(out, or_empty(p->eos_text));
        buf_append_char(out, '\n');
    }
    if (p->add_generation_prompt) buf_append_str(out, "<|assistant|>\n");
}

/* DeepSeek-R1 (no tools):
 *     ns.system_prompt = the content of the LAST system message (any position), or ''
 *     {{bos_token}}{{ns.system_prompt}}
 *     user:      '<｜User｜>' + content
 *     assistant: '<｜Assistant｜>' + content.split('</think>')[-1] + '<｜end▁of▁sentence｜>'
 *     {% if add_generation_prompt %}'<｜Assistant｜><think>\n'{% endif %}
 * System messages write nothing where they stand. */
static void render_deepseek_r1(const struct chat_message *msgs, int32_t n_msgs,
                               const struct chat_render_params *p, struct buf *out) {
    const char *sys = "";
    for (int32_t i = 0; i < n_msgs; i++) {
        if (role_of(&msgs[i]) == ROLE_SYSTEM) sys = msgs[i].content;
    }
    buf_append_str(out, or_empty(p->bos_text));
    buf_append_str(out, sys);
    for (int32_t i = 0; i < n_msgs; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_USER) {
            buf_append_str(out, DEEPSEEK_USER);
            buf_append_str(out, msgs[i].content);
        } else if (r == ROLE_ASSISTANT) {
            buf_append_str(out, DEEPSEEK_ASSISTANT);
            buf_append_str(out, after_last_think(msgs[i].content));
            buf_append_str(out, DEEPSEEK_EOS);
        }
    }
    if (p->add_generation_prompt) buf_append_str(out, DEEPSEEK_ASSISTANT "<think>\n");
}

/* ---- public ------------------------------------------------------------- */

struct chat_render_params chat_render_default_params(void) {
    struct chat_render_params p = {
        .bos_text = NULL,
        .eos_text = NULL,
        .add_generation_prompt = true,
        .date_string = NULL,
        .tools = NULL,
        .n_tools = 0,
    };
    return p;
}

bool chat_family_has_tools(enum chat_family f) {
    return f == CHAT_FAMILY_CHATML || f == CHAT_FAMILY_QWEN2_5 || f == CHAT_FAMILY_LLAMA3_1 ||
           f == CHAT_FAMILY_MISTRAL_TEKKEN;
}

/* What each template renders for an assistant turn's tool_calls (see the
 * renderers above), which is also what its instructions ask the model for. */
int chat_tool_syntax(enum chat_family f, struct chat_tool_syntax *out) {
    static const struct chat_tool_syntax hermes = {
        .trigger = "<tool_call>",
        .trigger_prefix = "",
        .list_open = "",
        .call_open = "<tool_call>\n",
        .call_close = "\n</tool_call>",
        .separator = "\n",
        .list_close = "",
        .args_key = "arguments",
        .parallel = true,
        .short_ids = false,
    };
    static const struct chat_tool_syntax llama3_1 = {
        .trigger = "{\"name\": \"",
        // Meta's Llama 3.1 prompt format: <|python_tag|> starts a tool call (its template
        // writes it for the built-in tools; the models also write it before the JSON of
        // a custom one, and llama.cpp accepts it there).
        .trigger_prefix = "<|python_tag|>",
        .list_open = "",
        .call_open = "",
        .call_close = "",
        .separator = "",
        .list_close = "",
        .args_key = "parameters",
        .parallel = false,
        .short_ids = false,
    };
    static const struct chat_tool_syntax mistral = {
        .trigger = "[TOOL_CALLS]",
        .trigger_prefix = "",
        .list_open = "[TOOL_CALLS][",
        .call_open = "",
        .call_close = "",
        .separator = ", ",
        .list_close = "]",
        .args_key = "arguments",
        .parallel = true,
        .short_ids = true,
    };
    switch (f) {
        case CHAT_FAMILY_CHATML:
        case CHAT_FAMILY_QWEN2_5:
            *out = hermes;
            return 0;
        case CHAT_FAMILY_LLAMA3_1:
            *out = llama3_1;
            return 0;
        case CHAT_FAMILY_MISTRAL_TEKKEN:
            *out = mistral;
            return 0;
        case CHAT_FAMILY_LLAMA3:
        case CHAT_FAMILY_LLAMA2:
        case CHAT_FAMILY_MISTRAL_LEGACY:
        case CHAT_FAMILY_MISTRAL_V1:
        case CHAT_FAMILY_PHI3:
        case CHAT_FAMILY_GEMMA:
        case CHAT_FAMILY_ZEPHYR:
        case CHAT_FAMILY_DEEPSEEK_R1:
        case CHAT_FAMILY_COUNT:
            break;
    }
    return ERR_UNSUPPORTED;
}

const char *chat_family_name(enum chat_family f) {
    if ((int)f < 0 || f >= CHAT_FAMILY_COUNT) return "unknown";
    return family_names[f];
}

int chat_family_parse(const char *name, enum chat_family *out) {
    if (!name) return ERR_INVAL;
    for (int f = 0; f < CHAT_FAMILY_COUNT; f++) {
        if (strcmp(name, family_names[f]) == 0) {
            *out = (enum chat_family)f;
            return 0;
        }
    }
    return ERR_INVAL;
}

bool chat_family_has_bos(enum chat_family f) {
    switch (f) {
        case CHAT_FAMILY_LLAMA3:
        case CHAT_FAMILY_LLAMA3_1:
        case CHAT_FAMILY_LLAMA2:  // validate() makes the first rendered message a user's
        case CHAT_FAMILY_MISTRAL_LEGACY:
        case CHAT_FAMILY_MISTRAL_V1:
        case CHAT_FAMILY_MISTRAL_TEKKEN:
        case CHAT_FAMILY_GEMMA:
        case CHAT_FAMILY_DEEPSEEK_R1:
            return true;
        case CHAT_FAMILY_CHATML:
        case CHAT_FAMILY_QWEN2_5:
        case CHAT_FAMILY_PHI3:
        case CHAT_FAMILY_ZEPHYR:
        case CHAT_FAMILY_COUNT:
            return false;
    }
    return false;
}

/* Marker rules, most specific first. Each family's rule names the strings its
 * template writes and no other family's does. */
int chat_detect(const char *tmpl, size_t len, enum chat_family *out) {
    size_t n_space = 0;
    while (tmpl && n_space < len && tmpl[n_space] != '\0' && strchr(" \t\r\n", tmpl[n_space]))
        n_space++;
    if (!tmpl || n_space == len) return ERR_NOTFOUND;

    enum chat_family f = CHAT_FAMILY_COUNT;
    if (contains(tmpl, len, "<|im_start|>")) {
        if (contains(tmpl, len, "<|im_sep|>")) {
            f = CHAT_FAMILY_COUNT;  // Phi-4: <|im_start|>role<|im_sep|>, not ChatML
        } else if (contains(tmpl, len, QWEN2_5_DEFAULT_SYSTEM)) {
            f = CHAT_FAMILY_QWEN2_5;
        } else {
            f = CHAT_FAMILY_CHATML;
        }
    } else if (contains(tmpl, len, DEEPSEEK_USER) && contains(tmpl, len, DEEPSEEK_ASSISTANT)) {
        f = CHAT_FAMILY_DEEPSEEK_R1;
    } else if (contains(tmpl, len, "<|start_header_id|>")) {
        f = contains(tmpl, len, "Cutting Knowledge Date") ? CHAT_FAMILY_LLAMA3_1
                                                          : CHAT_FAMILY_LLAMA3;
    } else if (contains(tmpl, len, "<start_of_turn>")) {
        f = CHAT_FAMILY_GEMMA;
    } else if (contains(tmpl, len, "<|user|>")) {
        if (contains(tmpl, len, "<|end|>")) {
            f = CHAT_FAMILY_PHI3;
        } else if (contains(tmpl, len, "<|assistant|>") &&
                   (contains(tmpl, len, "eos_token") || contains(tmpl, len, "</s>"))) {
            f = CHAT_FAMILY_ZEPHYR;
        }
    } else if (contains(tmpl, len, "[INST]")) {
        if (contains(tmpl, len, "[SYSTEM_PROMPT]")) {
            f = CHAT_FAMILY_COUNT;  // Mistral v7: not rendered
        } else if (contains(tmpl, len, "<<SYS>>")) {
            f = CHAT_FAMILY_LLAMA2;
        } else if (contains(tmpl, len, "' [INST] '") || contains(tmpl, len, "\" [INST] \"")) {
            f = CHAT_FAMILY_MISTRAL_V1;
        } else if (contains(tmpl, len, "\"[INST]\"") || contains(tmpl, len, "'[INST]'")) {
            f = CHAT_FAMILY_MISTRAL_TEKKEN;
        } else if (contains(tmpl, len, "'[INST] '") && contains(tmpl, len, "' [/INST]'")) {
            f = CHAT_FAMILY_MISTRAL_LEGACY;
        }
        // anything else ("[INST] " + x + "[/INST]": Mistral v3 non-tekken, whose
        // revisions differ in where the system message and spaces go) is unsupported
    }
    if (f == CHAT_FAMILY_COUNT) {
        LOG_WARN(
            "unrecognised tokenizer.chat_template (%zu bytes): chat requests need an "
            "explicit template family",
            len);
        return ERR_UNSUPPORTED;
    }
    *out = f;
    return 0;
}

int chat_render(enum chat_family f, const struct chat_message *msgs, int32_t n_msgs,
                const struct chat_render_params *params, struct buf *out, bool *out_has_bos,
                char *msg, size_t msg_size) {
    if (out_has_bos) *out_has_bos = false;
    if (msg && msg_size) msg[0] = '\0';
    if ((int)f < 0 || f >= CHAT_FAMILY_COUNT) {
        set_msg(msg, msg_size, "chat template family %d is not supported", (int)f);
        return ERR_UNSUPPORTED;
    }
    ASSERT(out);
    struct chat_render_params defaults = chat_render_default_params();
    const struct chat_render_params *p = params ? params : &defaults;
    int err = validate(f, msgs, n_msgs, p, msg, msg_size);
    if (err) {
        LOG_DEBUG("render %s: %s", family_names[f], msg ? msg : err_str(err));
        return err;
    }

    size_t start = out->len;
    switch (f) {
        case CHAT_FAMILY_CHATML:
        case CHAT_FAMILY_QWEN2_5:
            render_chatml(msgs, n_msgs, p, f == CHAT_FAMILY_QWEN2_5, out);
            break;
        case CHAT_FAMILY_LLAMA3:
        case CHAT_FAMILY_LLAMA3_1:
            render_llama3(msgs, n_msgs, p, f == CHAT_FAMILY_LLAMA3_1, out);
            break;
        case CHAT_FAMILY_LLAMA2:
            render_llama2(msgs, n_msgs, p, out);
            break;
        case CHAT_FAMILY_MISTRAL_LEGACY:
        case CHAT_FAMILY_MISTRAL_V1:
        case CHAT_FAMILY_MISTRAL_TEKKEN:
            render_mistral(f, msgs, n_msgs, p, out);
            break;
        case CHAT_FAMILY_PHI3:
            render_phi3(msgs, n_msgs, p, out);
            break;
        case CHAT_FAMILY_GEMMA:
            render_gemma(msgs, n_msgs, p, out);
            break;
        case CHAT_FAMILY_ZEPHYR:
            render_zephyr(msgs, n_msgs, p, out);
            break;
        case CHAT_FAMILY_DEEPSEEK_R1:
            render_deepseek_r1(msgs, n_msgs, p, out);
            break;
        case CHAT_FAMILY_COUNT:
            UNREACHABLE();
    }
    buf_append(out, "", 0);  // an empty render still leaves out NUL-terminated
    const char *bos = or_empty(p->bos_text);
    if (out_has_bos)
        *out_has_bos = chat_family_has_bos(f) && bos[0] != '\0' &&
                       out->len - start >= strlen(bos) &&
                       memcmp(out->data + start, bos, strlen(bos)) == 0;
    return 0;
}

void chat_reply_prefix(enum chat_family f, const struct chat_render_params *params, char *out,
                       size_t out_size) {
    ASSERT(out_size >= 1);
    out[0] = '\0';
    // What the template writes between the generation prompt and a reply:
    // render a conversation without and with one, and read the bytes between.
    struct chat_message msgs[] = {{.role = "user", .content = "u"}, {.role = "assistant", .content = "x"}};
    struct chat_render_params p = *params;
    struct buf open = {0}, done = {0};
    p.add_generation_prompt = true;
    int err = chat_render(f, msgs, 1, &p, &open, NULL, NULL, 0);
    p.add_generation_prompt = false;
    if (!err) err = chat_render(f, msgs, 2, &p, &done, NULL, NULL, 0);
    if (!err && done.len > open.len && memcmp(done.data, open.data, open.len) == 0) {
        const char *rest = done.data + open.len;
        const char *x = memchr(rest, 'x', done.len - open.len);
        size_t n = x ? (size_t)(x - rest) : 0;
        if (n < out_size) {
            memcpy(out, rest, n);
            out[n] = '\0';
        }
    }
    buf_free(&open);
    buf_free(&done);
}
