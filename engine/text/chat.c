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

/* Checks what every family needs, then the alternation rule of the templates
 * that raise_exception() on it:
 *     {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}raise
 * over the messages after an optional first system message. We also reject a
 * system message anywhere else (those templates either raise on it or drop it
 * silently) and a conversation with no user turn (the template would render
 * nothing but BOS, silently losing the system message). */
static int validate(enum chat_family f, const struct chat_message *msgs, int32_t n_msgs, char *msg,
                    size_t msg_size) {
    if (!msgs || n_msgs <= 0) {
        set_msg(msg, msg_size, "messages must contain at least one message");
        return ERR_INVAL;
    }
    for (int32_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].role) {
            set_msg(msg, msg_size, "messages[%d].role is missing", (int)i);
            return ERR_INVAL;
        }
        if (role_of(&msgs[i]) == ROLE_OTHER) {
            set_msg(msg, msg_size,
                    "messages[%d].role '%.32s' is not supported (expected system, user or "
                    "assistant)",
                    (int)i, msgs[i].role);
            return ERR_INVAL;
        }
        if (!msgs[i].content) {
            set_msg(msg, msg_size, "messages[%d].content is missing", (int)i);
            return ERR_INVAL;
        }
    }
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
    for (int32_t i = i0; i < n_msgs; i++) {
        enum role r = role_of(&msgs[i]);
        if (r == ROLE_SYSTEM) {
            set_msg(msg, msg_size,
                    "messages[%d]: the %s chat template only allows a system message as the "
                    "first message",
                    (int)i, family_names[f]);
            return ERR_INVAL;
        }
        enum role want = (i - i0) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
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

/* Generic ChatML:
 *     {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' +
 *     message['content'] + '<|im_end|>' + '\n'}}{% endfor %}
 *     {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
 * Qwen2.5 (no tools) first writes messages[0] if it is system, else the default
 *     '<|im_start|>system\n' QWEN2_5_DEFAULT_SYSTEM '<|im_end|>\n'
 * and its loop skips a system message only when it is loop.first. */
static void render_chatml(const struct chat_message *msgs, int32_t n_msgs,
                          const struct chat_render_params *p, bool is_qwen, struct buf *out) {
    int32_t i0 = 0;
    if (is_qwen) {
        buf_append_str(out, "<|im_start|>system\n");
        if (role_of(&msgs[0]) == ROLE_SYSTEM) {
            buf_append_str(out, msgs[0].content);
            i0 = 1;
        } else {
            buf_append_str(out, QWEN2_5_DEFAULT_SYSTEM);
        }
        buf_append_str(out, "<|im_end|>\n");
    }
    for (int32_t i = i0; i < n_msgs; i++) {
        buf_append_str(out, "<|im_start|>");
        buf_append_str(out, msgs[i].role);
        buf_append_char(out, '\n');
        buf_append_str(out, msgs[i].content);
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
 * Llama 3.1 (no tools, no builtin_tools):
 *     {{- bos_token }}
 *     system_message = messages[0]['content']|trim if it is system (and is removed), else ""
 *     "<|start_header_id|>system<|end_header_id|>\n\n"
 *     "Cutting Knowledge Date: December 2023\n" "Today Date: " + date_string + "\n\n"
 *     system_message "<|eot_id|>"
 * then the loop as in 3.0 (a later system message keeps its role). */
static void render_llama3(const struct chat_message *msgs, int32_t n_msgs,
                          const struct chat_render_params *p, bool is_3_1, struct buf *out) {
    buf_append_str(out, or_empty(p->bos_text));
    int32_t i0 = 0;
    if (is_3_1) {
        buf_append_str(out, "<|start_header_id|>system<|end_header_id|>\n\n");
        buf_append_str(out, "Cutting Knowledge Date: December 2023\n");
        buf_append_str(out, "Today Date: ");
        buf_append_str(out, p->date_string ? p->date_string : LLAMA3_1_DEFAULT_DATE);
        buf_append_str(out, "\n\n");
        if (role_of(&msgs[0]) == ROLE_SYSTEM) {
            append_trimmed_str(out, msgs[0].content);
            i0 = 1;
        }
        buf_append_str(out, "<|eot_id|>");
    }
    for (int32_t i = i0; i < n_msgs; i++) append_llama3_turn(out, msgs[i].role, msgs[i].content);
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
 * (so Nemo drops the system message when the last message is an assistant's). */
static void render_mistral(enum chat_family f, const struct chat_message *msgs, int32_t n_msgs,
                           const struct chat_render_params *p, struct buf *out) {
    int32_t i0 = role_of(&msgs[0]) == ROLE_SYSTEM ? 1 : 0;
    const char *sys = i0 ? msgs[0].content : NULL;
    const char *inst_open = f == CHAT_FAMILY_MISTRAL_V1       ? " [INST] "
                            : f == CHAT_FAMILY_MISTRAL_LEGACY ? "[INST] "
                                                              : "[INST]";
    const char *inst_close = f == CHAT_FAMILY_MISTRAL_TEKKEN ? "[/INST]" : " [/INST]";
    const char *asst_prefix = f == CHAT_FAMILY_MISTRAL_V1 ? " " : "";
    buf_append_str(out, or_empty(p->bos_text));
    for (int32_t i = i0; i < n_msgs; i++) {
        if (role_of(&msgs[i]) == ROLE_USER) {
            bool with_sys = sys && ((f == CHAT_FAMILY_MISTRAL_V1 && i == i0) ||
                                    (f == CHAT_FAMILY_MISTRAL_TEKKEN && i == n_msgs - 1));
            buf_append_str(out, inst_open);
            if (with_sys) {
                buf_append_str(out, sys);
                buf_append_str(out, "\n\n");
            }
            buf_append_str(out, msgs[i].content);
            buf_append_str(out, inst_close);
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
    };
    return p;
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
    int err = validate(f, msgs, n_msgs, msg, msg_size);
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
    struct chat_message msgs[] = {{"user", "u"}, {"assistant", "x"}};
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
