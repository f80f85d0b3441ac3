/*
 * test_chat.c - chat template detection and rendering.
 *
 * Oracles: the real templates in ../shared/models/templates/ (*.jinja). Every
 * expected prompt below was derived by hand from its family's Jinja source
 * (the derivation is in the comment above it), not captured from our output.
 * Jinja rules used throughout: HF renders with trim_blocks (a newline right
 * after a {% %} tag is dropped, one after a {{ }} expression is kept) and
 * lstrip_blocks; `{%-`/`{{-` drop the whitespace before the tag; `| trim` and
 * `.strip()` are Python's str.strip() (Unicode whitespace).
 *
 * The fixed conversation is
 *     system    "You are terse."
 *     user      "Hello!"
 *     assistant "Hi there."
 *     user      "  What is 2+2?\n"      (whitespace shows which families trim)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/text/chat.h"
#include "tests/helpers/testutil.h"

#define N_OF(a) ((int32_t)(sizeof(a) / sizeof((a)[0])))

static const struct chat_message conv_sys[] = {
    {.role = "system", .content = "You are terse."},
    {.role = "user", .content = "Hello!"},
    {.role = "assistant", .content = "Hi there."},
    {.role = "user", .content = "  What is 2+2?\n"},
};

// conv_sys without its system message
static const struct chat_message *const conv = conv_sys + 1;
#define N_CONV 3

// DeepSeek's special token texts (U+FF5C, U+2581)
#define DS_BOS       "<｜begin▁of▁sentence｜>"
#define DS_USER      "<｜User｜>"
#define DS_ASSISTANT "<｜Assistant｜>"
#define DS_EOS       "<｜end▁of▁sentence｜>"

static struct chat_render_params params(const char *bos, const char *eos, bool gen) {
    struct chat_render_params p = chat_render_default_params();
    p.bos_text = bos;
    p.eos_text = eos;
    p.add_generation_prompt = gen;
    return p;
}

/* Renders and compares with expected; checks the BOS report too. */
static void check_render(enum chat_family f, const struct chat_message *msgs, int32_t n,
                         const struct chat_render_params *p, const char *expected,
                         bool expected_has_bos) {
    struct buf out = {0};
    bool has_bos = !expected_has_bos;
    char msg[256] = "untouched";
    int err = chat_render(f, msgs, n, p, &out, &has_bos, msg, sizeof(msg));
    if (err) print_message("chat_render(%s) failed: %s\n", chat_family_name(f), msg);
    assert_int_equal(err, 0);
    assert_non_null(out.data);
    assert_string_equal(out.data, expected);
    assert_int_equal(out.len, strlen(expected));
    assert_int_equal(has_bos, expected_has_bos);
    buf_free(&out);
}

/* Expects ERR_INVAL with a message that mentions `needle`, and out untouched. */
static void check_reject(enum chat_family f, const struct chat_message *msgs, int32_t n,
                         const char *needle) {
    struct buf out = {0};
    buf_append_str(&out, "prefix");
    char msg[256] = "";
    struct chat_render_params p = params("<s>", "</s>", true);
    int err = chat_render(f, msgs, n, &p, &out, NULL, msg, sizeof(msg));
    if (err != ERR_INVAL)
        print_message("%s: expected ERR_INVAL, got %d\n", chat_family_name(f), err);
    assert_int_equal(err, ERR_INVAL);
    assert_string_equal(out.data, "prefix");
    assert_int_equal(out.len, 6);
    if (!strstr(msg, needle)) print_message("message '%s' lacks '%s'\n", msg, needle);
    assert_non_null(strstr(msg, needle));
    buf_free(&out);
}

/* ---- detection ---------------------------------------------------------- */

static void check_detect(const char *tmpl, int expected_err, enum chat_family expected) {
    enum chat_family f = CHAT_FAMILY_COUNT;
    int err = chat_detect(tmpl, tmpl ? strlen(tmpl) : 0, &f);
    if (err != expected_err || (err == 0 && f != expected))
        print_message("detect '%.60s': err %d family %s\n", tmpl ? tmpl : "(null)", err,
                      chat_family_name(f));
    assert_int_equal(err, expected_err);
    if (err == 0)
        assert_int_equal(f, expected);
    else
        assert_int_equal(f, CHAT_FAMILY_COUNT);  // *out unchanged on failure
}

static void test_chat_detect_real_templates(void **state) {
    (void)state;
    const char *shared = testutil_shared_dir();
    if (!shared) {
        print_message("skipped: ../shared is absent (no real templates to detect)\n");
        skip();
    }
    static const struct {
        const char *file;
        enum chat_family family;
    } cases[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja", CHAT_FAMILY_QWEN2_5},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", CHAT_FAMILY_DEEPSEEK_R1},
        {"google-gemma-2-2b-it.jinja", CHAT_FAMILY_GEMMA},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", CHAT_FAMILY_LLAMA3_1},
        {"microsoft-Phi-3.5-mini-instruct.jinja", CHAT_FAMILY_PHI3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", CHAT_FAMILY_MISTRAL_TEKKEN},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[128];
        snprintf(name, sizeof(name), "models/templates/%s", cases[i].file);
        size_t len = 0;
        char *text = testutil_read_file(testutil_path(shared, name), &len);
        if (!text) print_message("cannot read %s\n", name);
        assert_non_null(text);
        enum chat_family f = CHAT_FAMILY_COUNT;
        assert_int_equal(chat_detect(text, len, &f), 0);
        if (f != cases[i].family) print_message("%s detected as %s\n", name, chat_family_name(f));
        assert_int_equal(f, cases[i].family);
        free(text);
    }
}

/* The Jinja fragments each renderer reproduces, read from the real templates: if a
 * template revision changes one of them, this fails before a prompt silently drifts.
 * (Strings quoted from the files: "\\n" is a Jinja escape, "\n" a raw newline.) */
static void test_chat_real_templates_have_rendered_fragments(void **state) {
    (void)state;
    const char *shared = testutil_shared_dir();
    if (!shared) {
        print_message("skipped: ../shared is absent (no real templates to read)\n");
        skip();
    }
    static const struct {
        const char *file;
        const char *fragments[6];
    } cases[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja",
         {"'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
          "assistant.<|im_end|>\\n'",
          "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n'",
          "{{- '<|im_start|>assistant\\n' }}"}},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
         {"{{bos_token}}{{ns.system_prompt}}", "{{'" DS_USER "' + message['content']}}",
          "content.split('</think>')[-1]", "{{'" DS_ASSISTANT "' + content + '" DS_EOS "'}}",
          "{{'" DS_ASSISTANT "<think>\\n'}}"}},
        {"google-gemma-2-2b-it.jinja",
         {"{{ bos_token }}", "raise_exception('System role not supported')",
          "{% set role = 'model' %}", "message['content'] | trim + '<end_of_turn>\n' }}",
          "{{'<start_of_turn>model\n'}}"}},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja",
         {"{%- set date_string = \"26 Jul 2024\" %}",
          "{{- \"Cutting Knowledge Date: December 2023\\n\" }}",
          "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}",
          "{%- set system_message = messages[0]['content']|trim %}",
          "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>'"}},
        {"microsoft-Phi-3.5-mini-instruct.jinja",
         {"message['role'] == 'system' and message['content']",
          "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}",
          "{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}"}},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja",
         {"{%- if loop.last and system_message is defined %}",
          "{{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}",
          "{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}",
          "{{- message[\"content\"] + eos_token}}"}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[128];
        snprintf(name, sizeof(name), "models/templates/%s", cases[i].file);
        char *text = testutil_read_file(testutil_path(shared, name), NULL);
        assert_non_null(text);
        for (size_t k = 0; k < 6 && cases[i].fragments[k]; k++) {
            if (!strstr(text, cases[i].fragments[k]))
                print_message("%s lacks: %s\n", cases[i].file, cases[i].fragments[k]);
            assert_non_null(strstr(text, cases[i].fragments[k]));
        }
        free(text);
    }
}

static void test_chat_detect_snippets(void **state) {
    (void)state;
    // generic ChatML (e.g. OpenHermes, Qwen2 without default system)
    check_detect(
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
        0, CHAT_FAMILY_CHATML);
    check_detect(
        "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
        "helpful assistant.<|im_end|>\\n' }}",
        0, CHAT_FAMILY_QWEN2_5);
    check_detect("{{'<|im_start|>' + message['role'] + '<|im_sep|>'}}", ERR_UNSUPPORTED,
                 0);  // Phi-4
    check_detect("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}", 0,
                 CHAT_FAMILY_LLAMA3);
    check_detect(
        "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
        "{{- \"Cutting Knowledge Date: December 2023\\n\" }}",
        0, CHAT_FAMILY_LLAMA3_1);
    check_detect(
        "{% set content = '<<SYS>>\\n' + system_message %}"
        "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}",
        0, CHAT_FAMILY_LLAMA2);
    check_detect(
        "{{ bos_token }}{% if message['role'] == 'user' %}"
        "{{ '[INST] ' + message['content'] + ' [/INST]' }}",
        0, CHAT_FAMILY_MISTRAL_LEGACY);
    check_detect("{{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}",
                 0, CHAT_FAMILY_MISTRAL_V1);
    check_detect("{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}", 0,
                 CHAT_FAMILY_MISTRAL_TEKKEN);
    // Mistral v3 (non-tekken) and v7 are recognised as not rendered
    check_detect("{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}", ERR_UNSUPPORTED, 0);
    check_detect("[SYSTEM_PROMPT]{{ x }}[/SYSTEM_PROMPT][INST]", ERR_UNSUPPORTED, 0);
    check_detect("{{'<|user|>\n' + message['content'] + '<|end|>\n'}}", 0, CHAT_FAMILY_PHI3);
    check_detect("{{ '<start_of_turn>' + role + '\n' }}", 0, CHAT_FAMILY_GEMMA);
    check_detect(
        "{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
        "{{ '<|assistant|>' }}",
        0, CHAT_FAMILY_ZEPHYR);
    check_detect("{{'" DS_USER "' + message['content']}}{{'" DS_ASSISTANT "'}}", 0,
                 CHAT_FAMILY_DEEPSEEK_R1);
    // unrecognised, and absent
    check_detect("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
                 ERR_UNSUPPORTED, 0);
    check_detect("{{ '<|user|>' + message['content'] }}", ERR_UNSUPPORTED, 0);  // GLM-style
    check_detect(NULL, ERR_NOTFOUND, 0);
    check_detect("", ERR_NOTFOUND, 0);
    check_detect(" \n\t ", ERR_NOTFOUND, 0);
}

static void test_chat_detect_respects_len(void **state) {
    (void)state;
    // the marker lies beyond len: nothing past len may be read or matched
    const char *t = "hello <|im_start|>";
    enum chat_family f = CHAT_FAMILY_COUNT;
    assert_int_equal(chat_detect(t, 6, &f), ERR_UNSUPPORTED);
    assert_int_equal(chat_detect(t, strlen(t) - 1, &f), ERR_UNSUPPORTED);
    assert_int_equal(chat_detect(t, strlen(t), &f), 0);
    assert_int_equal(f, CHAT_FAMILY_CHATML);
    // not NUL-terminated
    char raw[12];
    memcpy(raw, "<|im_start|>", 12);
    assert_int_equal(chat_detect(raw, sizeof(raw), &f), 0);
    assert_int_equal(f, CHAT_FAMILY_CHATML);
}

static void test_chat_family_names(void **state) {
    (void)state;
    for (int i = 0; i < CHAT_FAMILY_COUNT; i++) {
        const char *name = chat_family_name((enum chat_family)i);
        assert_string_not_equal(name, "unknown");
        enum chat_family f = CHAT_FAMILY_COUNT;
        assert_int_equal(chat_family_parse(name, &f), 0);
        assert_int_equal(f, i);
    }
    enum chat_family f = CHAT_FAMILY_GEMMA;
    assert_int_equal(chat_family_parse("jinja", &f), ERR_INVAL);
    assert_int_equal(chat_family_parse(NULL, &f), ERR_INVAL);
    assert_int_equal(f, CHAT_FAMILY_GEMMA);
    assert_string_equal(chat_family_name(CHAT_FAMILY_COUNT), "unknown");
    assert_string_equal(chat_family_name(CHAT_FAMILY_LLAMA3_1), "llama3.1");
    assert_int_equal(CHAT_FAMILY_FALLBACK, CHAT_FAMILY_CHATML);
}

/* ---- rendering, per family ---------------------------------------------- */

/* Generic ChatML: '<|im_start|>' + role + '\n' + content + '<|im_end|>' + '\n' per message
 * (content untrimmed), then '<|im_start|>assistant\n'. No default system message. */
static void test_chat_render_chatml(void **state) {
    (void)state;
    struct chat_render_params p = params(NULL, "<|im_end|>", true);
    check_render(CHAT_FAMILY_CHATML, conv_sys, 4, &p,
                 "<|im_start|>system\nYou are terse.<|im_end|>\n"
                 "<|im_start|>user\nHello!<|im_end|>\n"
                 "<|im_start|>assistant\nHi there.<|im_end|>\n"
                 "<|im_start|>user\n  What is 2+2?\n<|im_end|>\n"
                 "<|im_start|>assistant\n",
                 false);
    p.add_generation_prompt = false;
    check_render(CHAT_FAMILY_CHATML, conv, N_CONV, &p,
                 "<|im_start|>user\nHello!<|im_end|>\n"
                 "<|im_start|>assistant\nHi there.<|im_end|>\n"
                 "<|im_start|>user\n  What is 2+2?\n<|im_end|>\n",
                 false);
    // any role order is fine for ChatML
    static const struct chat_message two_users[] = {{.role = "user", .content = "a"}, {.role = "user", .content = "b"}};
    check_render(CHAT_FAMILY_CHATML, two_users, 2, &p,
                 "<|im_start|>user\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n", false);
}

/* Qwen2.5 (no tools): messages[0] is system -> '<|im_start|>system\n' + content +
 * '<|im_end|>\n' and the loop skips it (system and loop.first); else the default
 * system turn. Other messages as ChatML; '<|im_start|>assistant\n' last. Qwen has
 * no BOS in its template. */
static void test_chat_render_qwen2_5(void **state) {
    (void)state;
    struct chat_render_params p = params("<|endoftext|>", "<|im_end|>", true);
    check_render(CHAT_FAMILY_QWEN2_5, conv_sys, 4, &p,
                 "<|im_start|>system\nYou are terse.<|im_end|>\n"
                 "<|im_start|>user\nHello!<|im_end|>\n"
                 "<|im_start|>assistant\nHi there.<|im_end|>\n"
                 "<|im_start|>user\n  What is 2+2?\n<|im_end|>\n"
                 "<|im_start|>assistant\n",
                 false);
    check_render(CHAT_FAMILY_QWEN2_5, conv, N_CONV, &p,
                 "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                 "assistant.<|im_end|>\n"
                 "<|im_start|>user\nHello!<|im_end|>\n"
                 "<|im_start|>assistant\nHi there.<|im_end|>\n"
                 "<|im_start|>user\n  What is 2+2?\n<|im_end|>\n"
                 "<|im_start|>assistant\n",
                 false);
    p.add_generation_prompt = false;
    // a later system message is rendered where it stands (system and not loop.first)
    static const struct chat_message late_sys[] = {{.role = "user", .content = "u"}, {.role = "system", .content = "s"}};
    check_render(CHAT_FAMILY_QWEN2_5, late_sys, 2, &p,
                 "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                 "assistant.<|im_end|>\n"
                 "<|im_start|>user\nu<|im_end|>\n<|im_start|>system\ns<|im_end|>\n",
                 false);
}

/* Llama 3.1 (real template, no tools): {{- bos_token }}, then always
 * "<|start_header_id|>system<|end_header_id|>\n\n" "Cutting Knowledge Date: December 2023\n"
 * "Today Date: " + date_string + "\n\n" + system_message (messages[0]['content']|trim, or
 * "") + "<|eot_id|>"; every other message '<|start_header_id|>' + role +
 * '<|end_header_id|>\n\n' + content|trim + '<|eot_id|>'; then the assistant header.
 * date_string defaults to "26 Jul 2024". */
static void test_chat_render_llama3_1(void **state) {
    (void)state;
    struct chat_render_params p = params("<|begin_of_text|>", "<|eot_id|>", true);
    check_render(CHAT_FAMILY_LLAMA3_1, conv_sys, 4, &p,
                 "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                 "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                 "You are terse.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n",
                 true);
    p.add_generation_prompt = false;
    p.date_string = "01 Feb 2025";
    check_render(CHAT_FAMILY_LLAMA3_1, conv, N_CONV, &p,
                 "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                 "Cutting Knowledge Date: December 2023\nToday Date: 01 Feb 2025\n\n<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>",
                 true);
    // the system message is trimmed too (messages[0]['content']|trim)
    static const struct chat_message sys_ws[] = {{.role = "system", .content = " \n S \n"}, {.role = "user", .content = "u"}};
    p.date_string = NULL;
    check_render(CHAT_FAMILY_LLAMA3_1, sys_ws, 2, &p,
                 "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                 "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nu<|eot_id|>",
                 true);
}

/* Llama 3.0 (Meta-Llama-3-8B-Instruct): content = '<|start_header_id|>' + role +
 * '<|end_header_id|>\n\n' + content|trim + '<|eot_id|>', bos_token before the first;
 * the system message is an ordinary turn; no date header. */
static void test_chat_render_llama3(void **state) {
    (void)state;
    struct chat_render_params p = params("<|begin_of_text|>", "<|eot_id|>", true);
    check_render(CHAT_FAMILY_LLAMA3, conv_sys, 4, &p,
                 "<|begin_of_text|>"
                 "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n",
                 true);
    // no BOS text: nothing to report
    p = params(NULL, NULL, false);
    check_render(CHAT_FAMILY_LLAMA3, conv, 1, &p,
                 "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>", false);
}

/* Llama 2 (Llama-2-chat-hf): first loop message with system: content = '<<SYS>>\n' +
 * system + '\n<</SYS>>\n\n' + content; user: bos_token + '[INST] ' + content.strip() +
 * ' [/INST]'; assistant: ' ' + content.strip() + ' ' + eos_token. No generation prompt
 * (add_generation_prompt is not read). */
static void test_chat_render_llama2(void **state) {
    (void)state;
    struct chat_render_params p = params("<s>", "</s>", true);
    static const char *const want_sys =
        "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHello! [/INST] Hi there. </s>"
        "<s>[INST] What is 2+2? [/INST]";
    check_render(CHAT_FAMILY_LLAMA2, conv_sys, 4, &p, want_sys, true);
    p.add_generation_prompt = false;
    check_render(CHAT_FAMILY_LLAMA2, conv_sys, 4, &p, want_sys, true);
    check_render(CHAT_FAMILY_LLAMA2, conv, N_CONV, &p,
                 "<s>[INST] Hello! [/INST] Hi there. </s><s>[INST] What is 2+2? [/INST]", true);
    // .strip() applies to the joined system+user text: an all-blank user message
    // lets it eat the "\n\n" after <</SYS>>
    static const struct chat_message blank[] = {{.role = "system", .content = "S"}, {.role = "user", .content = " \n "}};
    check_render(CHAT_FAMILY_LLAMA2, blank, 2, &p, "<s>[INST] <<SYS>>\nS\n<</SYS>> [/INST]", true);
}

/* Mistral v1 (official): {{- bos_token }}; user, loop.first with system: ' [INST] ' +
 * system + '\n\n' + content + ' [/INST]'; user: ' [INST] ' + content + ' [/INST]';
 * assistant: ' ' + content + eos_token. Nothing is trimmed. */
static void test_chat_render_mistral_v1(void **state) {
    (void)state;
    struct chat_render_params p = params("<s>", "</s>", true);
    check_render(CHAT_FAMILY_MISTRAL_V1, conv_sys, 4, &p,
                 "<s> [INST] You are terse.\n\nHello! [/INST] Hi there.</s>"
                 " [INST]   What is 2+2?\n [/INST]",
                 true);
    p.add_generation_prompt = false;
    check_render(CHAT_FAMILY_MISTRAL_V1, conv, N_CONV, &p,
                 "<s> [INST] Hello! [/INST] Hi there.</s> [INST]   What is 2+2?\n [/INST]", true);
}

/* Mistral legacy (Mixtral-8x7B-Instruct-v0.1): {{ bos_token }}; user: '[INST] ' +
 * content + ' [/INST]'; assistant: content + eos_token; system raises. */
static void test_chat_render_mistral_legacy(void **state) {
    (void)state;
    struct chat_render_params p = params("<s>", "</s>", true);
    check_render(CHAT_FAMILY_MISTRAL_LEGACY, conv, N_CONV, &p,
                 "<s>[INST] Hello! [/INST]Hi there.</s>[INST]   What is 2+2?\n [/INST]", true);
    check_reject(CHAT_FAMILY_MISTRAL_LEGACY, conv_sys, 4, "system");
}

/* Mistral Nemo (real template): {{- bos_token }}; user, loop.last with system:
 * "[INST]" + system + "\n\n" + content + "[/INST]"; user: "[INST]" + content +
 * "[/INST]"; assistant: content + eos_token. So the system message goes to the LAST
 * user turn, and is dropped when the last message is an assistant's. */
static void test_chat_render_mistral_tekken(void **state) {
    (void)state;
    struct chat_render_params p = params("<s>", "</s>", true);
    check_render(
        CHAT_FAMILY_MISTRAL_TEKKEN, conv_sys, 4, &p,
        "<s>[INST]Hello![/INST]Hi there.</s>[INST]You are terse.\n\n  What is 2+2?\n[/INST]", true);
    p.add_generation_prompt = false;
    check_render(CHAT_FAMILY_MISTRAL_TEKKEN, conv, N_CONV, &p,
                 "<s>[INST]Hello![/INST]Hi there.</s>[INST]  What is 2+2?\n[/INST]", true);
    check_render(CHAT_FAMILY_MISTRAL_TEKKEN, conv_sys, 3, &p, "<s>[INST]Hello![/INST]Hi there.</s>",
                 true);
}

/* Phi-3.5 (real template): system (non-empty): '<|system|>\n' + content + '<|end|>\n';
 * user/assistant likewise with <|user|>/<|assistant|>; then '<|assistant|>\n' if
 * add_generation_prompt else eos_token. No BOS in the template. */
static void test_chat_render_phi3(void **state) {
    (void)state;
    struct chat_render_params p = params("<s>", "<|endoftext|>", true);
    check_render(CHAT_FAMILY_PHI3, conv_sys, 4, &p,
                 "<|system|>\nYou are terse.<|end|>\n<|user|>\nHello!<|end|>\n"
                 "<|assistant|>\nHi there.<|end|>\n<|user|>\n  What is 2+2?\n<|end|>\n"
                 "<|assistant|>\n",
                 false);
    p.add_generation_prompt = false;
    check_render(CHAT_FAMILY_PHI3, conv, N_CONV, &p,
                 "<|user|>\nHello!<|end|>\n<|assistant|>\nHi there.<|end|>\n"
                 "<|user|>\n  What is 2+2?\n<|end|>\n<|endoftext|>",
                 false);
    // an empty system message is falsy in Jinja: skipped
    static const struct chat_message empty_sys[] = {{.role = "system", .content = ""}, {.role = "user", .content = "u"}};
    p.add_generation_prompt = true;
    check_render(CHAT_FAMILY_PHI3, empty_sys, 2, &p, "<|user|>\nu<|end|>\n<|assistant|>\n", false);
}

/* Gemma 2 (real template): {{ bos_token }}; each turn '<start_of_turn>' + role ('model'
 * for assistant) + '\n' + content | trim + '<end_of_turn>\n'; '<start_of_turn>model\n'.
 * With a system message (which Gemma 2's template rejects) we follow Gemma 3: it
 * becomes the prefix system + '\n\n' of the first user turn. */
static void test_chat_render_gemma(void **state) {
    (void)state;
    struct chat_render_params p = params("<bos>", "<eos>", true);
    check_render(CHAT_FAMILY_GEMMA, conv_sys, 4, &p,
                 "<bos><start_of_turn>user\nYou are terse.\n\nHello!<end_of_turn>\n"
                 "<start_of_turn>model\nHi there.<end_of_turn>\n"
                 "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
                 "<start_of_turn>model\n",
                 true);
    p.add_generation_prompt = false;
    check_render(CHAT_FAMILY_GEMMA, conv, N_CONV, &p,
                 "<bos><start_of_turn>user\nHello!<end_of_turn>\n"
                 "<start_of_turn>model\nHi there.<end_of_turn>\n"
                 "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n",
                 true);
}

/* Zephyr (zephyr-7b-beta): each message {{ '<|role|>\n' + content + eos_token }} and the
 * template newline after it (kept: trim_blocks only eats newlines after {% %} tags);
 * after the last, with add_generation_prompt, {{ '<|assistant|>' }} + newline. */
static void test_chat_render_zephyr(void **state) {
    (void)state;
    struct chat_render_params p = params("<s>", "</s>", true);
    check_render(CHAT_FAMILY_ZEPHYR, conv_sys, 4, &p,
                 "<|system|>\nYou are terse.</s>\n<|user|>\nHello!</s>\n"
                 "<|assistant|>\nHi there.</s>\n<|user|>\n  What is 2+2?\n</s>\n<|assistant|>\n",
                 false);
    p.add_generation_prompt = false;
    check_render(
        CHAT_FAMILY_ZEPHYR, conv, N_CONV, &p,
        "<|user|>\nHello!</s>\n<|assistant|>\nHi there.</s>\n<|user|>\n  What is 2+2?\n</s>\n",
        false);
}

/* DeepSeek-R1 distill (real template, no tools): {{bos_token}}{{ns.system_prompt}} (the
 * last system message); user '<｜User｜>' + content; assistant '<｜Assistant｜>' +
 * content.split('</think>')[-1] + '<｜end▁of▁sentence｜>'; then '<｜Assistant｜><think>\n'. */
static void test_chat_render_deepseek_r1(void **state) {
    (void)state;
    struct chat_render_params p = params(DS_BOS, DS_EOS, true);
    check_render(CHAT_FAMILY_DEEPSEEK_R1, conv_sys, 4, &p,
                 DS_BOS "You are terse." DS_USER "Hello!" DS_ASSISTANT "Hi there." DS_EOS DS_USER
                        "  What is 2+2?\n" DS_ASSISTANT "<think>\n",
                 true);
    p.add_generation_prompt = false;
    check_render(CHAT_FAMILY_DEEPSEEK_R1, conv, N_CONV, &p,
                 DS_BOS DS_USER "Hello!" DS_ASSISTANT "Hi there." DS_EOS DS_USER "  What is 2+2?\n",
                 true);
    // reasoning before the last </think> is dropped; the last system message wins
    static const struct chat_message think[] = {
        {.role = "system", .content = "first"},
        {.role = "user", .content = "q"},
        {.role = "assistant", .content = "<think>a</think>b</think>\nanswer"},
        {.role = "system", .content = "second"},
    };
    check_render(CHAT_FAMILY_DEEPSEEK_R1, think, 4, &p,
                 DS_BOS "second" DS_USER "q" DS_ASSISTANT "\nanswer" DS_EOS, true);
}

/* ---- text handling ------------------------------------------------------ */

/* What each template writes between the generation prompt and a reply's
 * content, read off the templates' own text (quoted in the tests above): the
 * llama-2 template's assistant turn is ' ' + content.strip() + ' ' + eos,
 * Mistral v1's ' ' + content + eos; every other family opens the reply right
 * where its generation prompt ends. */
static void test_chat_reply_prefix(void **state) {
    (void)state;
    struct chat_render_params p = params("<s>", "</s>", true);
    for (int f = 0; f < CHAT_FAMILY_COUNT; f++) {
        char out[16] = "junk";
        chat_reply_prefix((enum chat_family)f, &p, out, sizeof(out));
        const char *want = f == CHAT_FAMILY_LLAMA2 || f == CHAT_FAMILY_MISTRAL_V1 ? " " : "";
        if (strcmp(out, want) != 0)
            fail_msg("%s: reply prefix '%s', want '%s'", chat_family_name((enum chat_family)f),
                     out, want);
    }
    char tiny[1] = "";
    chat_reply_prefix(CHAT_FAMILY_LLAMA2, &p, tiny, sizeof(tiny));  // does not fit: ""
    assert_string_equal(tiny, "");
}

static void test_chat_render_utf8(void **state) {
    (void)state;
    // multi-byte content passes through untouched where nothing trims
    static const struct chat_message m[] = {{.role = "user", .content = "héllo 世界 🦙\xe3\x80\x80"}};
    struct chat_render_params p = params(NULL, NULL, true);
    check_render(
        CHAT_FAMILY_CHATML, m, 1, &p,
        "<|im_start|>user\nhéllo 世界 🦙\xe3\x80\x80<|im_end|>\n<|im_start|>assistant\n",
        false);
    // | trim strips Python's Unicode whitespace (U+3000, U+00A0, U+2028, U+0085) but
    // not other multi-byte characters (U+3001) nor invalid bytes
    static const struct chat_message ws[] = {
        {.role = "user", .content = "\xe3\x80\x80\xc2\xa0 hi\xe2\x80\xa8\xc2\x85"},
        {.role = "assistant", .content = "\xe3\x80\x81ok\xe3\x80\x81"},
        {.role = "user", .content = "\xff x \xff"},
    };
    p = params("<bos>", NULL, false);
    check_render(CHAT_FAMILY_GEMMA, ws, 3, &p,
                 "<bos><start_of_turn>user\nhi<end_of_turn>\n"
                 "<start_of_turn>model\n\xe3\x80\x81ok\xe3\x80\x81<end_of_turn>\n"
                 "<start_of_turn>user\n\xff x \xff<end_of_turn>\n",
                 true);
    // an all-whitespace message trims to nothing
    static const struct chat_message blank[] = {{.role = "user", .content = " \t\r\n\xe2\x80\x83"}};
    check_render(CHAT_FAMILY_LLAMA3, blank, 1, &p,
                 "<bos><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>", true);
}

static void test_chat_render_appends_and_defaults(void **state) {
    (void)state;
    // appends to what out holds; NULL params means chat_render_default_params()
    struct buf out = {0};
    buf_append_str(&out, "X");
    static const struct chat_message m[] = {{.role = "user", .content = "u"}};
    assert_int_equal(chat_render(CHAT_FAMILY_CHATML, m, 1, NULL, &out, NULL, NULL, 0), 0);
    assert_string_equal(out.data, "X<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n");
    buf_free(&out);
    // has_bos is about the appended text, and needs a non-empty BOS written by the template
    struct chat_render_params p = params("", NULL, true);
    bool has_bos = true;
    assert_int_equal(chat_render(CHAT_FAMILY_GEMMA, m, 1, &p, &out, &has_bos, NULL, 0), 0);
    assert_false(has_bos);
    assert_string_equal(out.data, "<start_of_turn>user\nu<end_of_turn>\n<start_of_turn>model\n");
    buf_free(&out);
    assert_true(chat_family_has_bos(CHAT_FAMILY_GEMMA));
    assert_false(chat_family_has_bos(CHAT_FAMILY_QWEN2_5));
}

/* ---- errors ------------------------------------------------------------- */

static void test_chat_render_rejects(void **state) {
    (void)state;
    static const struct chat_message tool[] = {{.role = "user", .content = "u"},
                                               {.role = "tool", .content = "t"}};
    static const struct chat_message null_content[] = {{.role = "user", .content = NULL}};
    static const struct chat_message null_role[] = {{.role = NULL, .content = "x"}};
    static const struct chat_message two_users[] = {{.role = "user", .content = "a"}, {.role = "user", .content = "b"}};
    static const struct chat_message asst_first[] = {{.role = "assistant", .content = "a"}, {.role = "user", .content = "b"}};
    static const struct chat_message late_sys[] = {{.role = "user", .content = "a"}, {.role = "system", .content = "s"}};
    static const struct chat_message sys_only[] = {{.role = "system", .content = "s"}};
    static const struct chat_message sys_asst[] = {{.role = "system", .content = "s"}, {.role = "assistant", .content = "a"}};
    for (int f = 0; f < CHAT_FAMILY_COUNT; f++) {
        if (!chat_family_has_tools((enum chat_family)f))
            check_reject((enum chat_family)f, tool, 2, "'tool'");
        check_reject((enum chat_family)f, null_content, 1, "messages[0].content");
        check_reject((enum chat_family)f, null_role, 1, "messages[0].role");
        check_reject((enum chat_family)f, NULL, 0, "at least one");
        check_reject((enum chat_family)f, conv, 0, "at least one");
    }
    static const enum chat_family alternating[] = {
        CHAT_FAMILY_LLAMA2,         CHAT_FAMILY_MISTRAL_LEGACY, CHAT_FAMILY_MISTRAL_V1,
        CHAT_FAMILY_MISTRAL_TEKKEN, CHAT_FAMILY_GEMMA,
    };
    for (size_t i = 0; i < sizeof(alternating) / sizeof(alternating[0]); i++) {
        check_reject(alternating[i], two_users, 2, "alternate");
        check_reject(alternating[i], asst_first, 2, "alternate");
        check_reject(alternating[i], late_sys, 2, "system");
        check_reject(alternating[i], sys_asst, 2,
                     alternating[i] == CHAT_FAMILY_MISTRAL_LEGACY ? "system" : "alternate");
        check_reject(alternating[i], sys_only, 1,
                     alternating[i] == CHAT_FAMILY_MISTRAL_LEGACY ? "system" : "user message");
    }
    // families without the rule accept the same orders
    struct chat_render_params p = params("<s>", "</s>", false);
    check_render(CHAT_FAMILY_ZEPHYR, asst_first, 2, &p, "<|assistant|>\na</s>\n<|user|>\nb</s>\n",
                 false);
    check_render(CHAT_FAMILY_DEEPSEEK_R1, sys_only, 1, &p, "<s>s", true);
    // a family value that is not one
    struct buf out = {0};
    char msg[64] = "";
    assert_int_equal(chat_render(CHAT_FAMILY_COUNT, conv, N_CONV, &p, &out, NULL, msg, sizeof(msg)),
                     ERR_UNSUPPORTED);
    assert_true(strlen(msg) > 0);
    assert_null(out.data);
    // a tiny message buffer is still NUL-terminated
    char tiny[8];
    out.len = 0;
    assert_int_equal(
        chat_render(CHAT_FAMILY_GEMMA, two_users, 2, &p, &out, NULL, tiny, sizeof(tiny)),
        ERR_INVAL);
    assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
    assert_null(out.data);
}

/* ---- tools -------------------------------------------------------------- */

/* One tool, serialised as a server does for the templates (tojson, tojson
 * with indent 4, Mistral's per-member text). */
static const struct chat_tool_member weather_members[] = {
    {.key = "name", .value = "get_weather", .is_string = true},
    {.key = "description", .value = "Get the \"weather\"", .is_string = true},
    {.key = "parameters",
     .value = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
              "\"required\": [\"city\"]}",
     .is_string = false},
};
static const struct chat_tool weather_tool = {
    .json = "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
            "\"Get the \\\"weather\\\"\", \"parameters\": {\"type\": \"object\", \"properties\": "
            "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}",
    .json_indent4 = "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": "
                    "\"get_weather\",\n        \"description\": \"Get the \\\"weather\\\"\",\n"
                    "        \"parameters\": {\n            \"type\": \"object\",\n"
                    "            \"properties\": {\n                \"city\": {\n"
                    "                    \"type\": \"string\"\n                }\n"
                    "            },\n            \"required\": [\n                \"city\"\n"
                    "            ]\n        }\n    }\n}",
    .members = weather_members,
    .n_members = 3,
};
#define WEATHER_TOOL_JSON                                                                 \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"      \
    "\"Get the \\\"weather\\\"\",\"parameters\":{\"type\":\"object\",\"properties\":"      \
    "{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}"

static const struct chat_tool_call paris_calls[] = {
    {.id = "abcdefghi", .name = "get_weather", .arguments = "{\"city\": \"Paris\", \"n\": 2}"},
    {.id = "bcdefghij", .name = "get_weather", .arguments = "{\"city\": \"Caf\xc3\xa9\\n\"}"},
};
#define PARIS_CALLS_JSON(n_calls)                                                          \
    "\"tool_calls\":[{\"id\":\"abcdefghi\",\"type\":\"function\",\"function\":{\"name\":" \
    "\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"n\":2}}}"                         \
    "%s]"
#define SECOND_CALL_JSON                                                                   \
    ",{\"id\":\"bcdefghij\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\"," \
    "\"arguments\":{\"city\":\"Caf\xc3\xa9\\n\"}}}"

/* Renders the case (JSON, as the template sees it) with the real template
 * through scripts/render-chat-template (jinja2, as transformers renders) and
 * compares with chat_render() of the same conversation. */
static void check_against_jinja(const char *template_file, const char *case_json,
                                enum chat_family f, const struct chat_message *msgs, int32_t n,
                                const struct chat_render_params *p) {
    char path[4096], case_path[4096], out_path[4096], cmd[16384];
    snprintf(path, sizeof(path), "%s/models/templates/%s", testutil_shared_dir(), template_file);
    snprintf(case_path, sizeof(case_path), "%s/chat-case-%d.json", testutil_build_dir(),
             (int)getpid());
    snprintf(out_path, sizeof(out_path), "%s/chat-case-%d.out", testutil_build_dir(),
             (int)getpid());
    FILE *fp = fopen(case_path, "w");
    assert_non_null(fp);
    fputs(case_json, fp);
    fclose(fp);
    snprintf(cmd, sizeof(cmd), "%s/scripts/render-chat-template %s < %s > %s",
             testutil_source_dir(), path, case_path, out_path);
    assert_int_equal(testutil_system(cmd), 0);
    size_t len = 0;
    char *want = testutil_read_file(out_path, &len);
    assert_non_null(want);
    remove(case_path);
    remove(out_path);
    struct buf out = {0};
    char msg[256] = "";
    int err = chat_render(f, msgs, n, p, &out, NULL, msg, sizeof(msg));
    if (err) print_message("chat_render(%s): %s\n", chat_family_name(f), msg);
    assert_int_equal(err, 0);
    if (out.len != len || memcmp(out.data, want, len) != 0)
        print_message("jinja:\n%s\n--- ours:\n%s\n", want, out.data);
    assert_int_equal(out.len, len);
    assert_memory_equal(out.data, want, len);
    free(want);
    buf_free(&out);
}

static bool have_jinja_oracle(void) {
    const char *shared = testutil_shared_dir();
    char path[4096];
    snprintf(path, sizeof(path), "%s/models/templates", shared ? shared : "/nonexistent");
    if (!shared || !testutil_exists(path)) {
        print_message("skipped: ../shared/models/templates is absent\n");
        return false;
    }
    if (testutil_system("/usr/bin/python3 -c 'import jinja2' 2>/dev/null") != 0) {
        print_message("skipped: python3-jinja2 is missing (scripts/setup installs it)\n");
        return false;
    }
    return true;
}

/* Qwen 2.5 and Llama 3.1: tools, a call, its result, a follow-up. */
static void test_chat_render_tools_match_jinja(void **state) {
    (void)state;
    if (!have_jinja_oracle()) skip();
    const struct chat_message msgs[] = {
        {.role = "system", .content = " Be brief. "},
        {.role = "user", .content = "Weather in Paris?"},
        {.role = "assistant", .content = "", .tool_calls = paris_calls, .n_tool_calls = 1},
        {.role = "tool", .content = "{\"temp\": 21}", .tool_call_id = "abcdefghi"},
        {.role = "user", .content = "thanks"},
    };
    char case_json[8192];
    snprintf(case_json, sizeof(case_json),
             "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_generation_prompt\":true,"
             "\"tools\":[" WEATHER_TOOL_JSON "],\"messages\":["
             "{\"role\":\"system\",\"content\":\" Be brief. \"},"
             "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
             "{\"role\":\"assistant\",\"content\":\"\"," PARIS_CALLS_JSON(1) "},"
             "{\"role\":\"tool\",\"tool_call_id\":\"abcdefghi\",\"content\":\"{\\\"temp\\\": 21}\"},"
             "{\"role\":\"user\",\"content\":\"thanks\"}]}",
             "");
    struct chat_render_params p = params("<s>", "</s>", true);
    p.tools = &weather_tool;
    p.n_tools = 1;
    check_against_jinja("Qwen-Qwen2.5-7B-Instruct.jinja", case_json, CHAT_FAMILY_QWEN2_5, msgs,
                        N_OF(msgs), &p);
    check_against_jinja("meta-llama-Llama-3.1-8B-Instruct.jinja", case_json,
                        CHAT_FAMILY_LLAMA3_1, msgs, N_OF(msgs), &p);
    // Qwen: two calls in one turn with content, two results in one user turn, no system
    const struct chat_message two[] = {
        {.role = "user", .content = "Paris and Caf\xc3\xa9?"},
        {.role = "assistant", .content = "Checking.", .tool_calls = paris_calls, .n_tool_calls = 2},
        {.role = "tool", .content = "21", .tool_call_id = "abcdefghi"},
        {.role = "tool", .content = "19", .tool_call_id = "bcdefghij"},
    };
    snprintf(case_json, sizeof(case_json),
             "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_generation_prompt\":true,"
             "\"tools\":[" WEATHER_TOOL_JSON "],\"messages\":["
             "{\"role\":\"user\",\"content\":\"Paris and Caf\xc3\xa9?\"},"
             "{\"role\":\"assistant\",\"content\":\"Checking.\"," PARIS_CALLS_JSON(2) "},"
             "{\"role\":\"tool\",\"tool_call_id\":\"abcdefghi\",\"content\":\"21\"},"
             "{\"role\":\"tool\",\"tool_call_id\":\"bcdefghij\",\"content\":\"19\"}]}",
             SECOND_CALL_JSON);
    check_against_jinja("Qwen-Qwen2.5-7B-Instruct.jinja", case_json, CHAT_FAMILY_QWEN2_5, two,
                        N_OF(two), &p);
    // Qwen without tools still renders a history with calls and results
    struct chat_render_params none = params("<s>", "</s>", true);
    snprintf(case_json, sizeof(case_json),
             "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_generation_prompt\":true,"
             "\"messages\":["
             "{\"role\":\"user\",\"content\":\"Paris and Caf\xc3\xa9?\"},"
             "{\"role\":\"assistant\",\"content\":\"Checking.\"," PARIS_CALLS_JSON(2) "},"
             "{\"role\":\"tool\",\"tool_call_id\":\"abcdefghi\",\"content\":\"21\"},"
             "{\"role\":\"tool\",\"tool_call_id\":\"bcdefghij\",\"content\":\"19\"}]}",
             SECOND_CALL_JSON);
    check_against_jinja("Qwen-Qwen2.5-7B-Instruct.jinja", case_json, CHAT_FAMILY_QWEN2_5, two,
                        N_OF(two), &none);
    // Mistral Nemo: tools before the last user message, calls with ids, results
    const struct chat_message nemo[] = {
        {.role = "system", .content = "S"},
        {.role = "user", .content = "Hi"},
        {.role = "assistant", .content = "Hello."},
        {.role = "user", .content = "Paris?"},
        {.role = "assistant", .content = "", .tool_calls = paris_calls, .n_tool_calls = 2},
        {.role = "tool", .content = "21", .tool_call_id = "abcdefghi"},
        {.role = "tool", .content = "{\"t\": 19}", .tool_call_id = "bcdefghij"},
    };
    snprintf(case_json, sizeof(case_json),
             "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_generation_prompt\":true,"
             "\"tools\":[" WEATHER_TOOL_JSON "],\"messages\":["
             "{\"role\":\"system\",\"content\":\"S\"},"
             "{\"role\":\"user\",\"content\":\"Hi\"},"
             "{\"role\":\"assistant\",\"content\":\"Hello.\"},"
             "{\"role\":\"user\",\"content\":\"Paris?\"},"
             "{\"role\":\"assistant\",\"content\":\"\"," PARIS_CALLS_JSON(2) "},"
             "{\"role\":\"tool\",\"tool_call_id\":\"abcdefghi\",\"content\":\"21\"},"
             "{\"role\":\"tool\",\"tool_call_id\":\"bcdefghij\",\"content\":\"{\\\"t\\\": 19}\"}]}",
             SECOND_CALL_JSON);
    check_against_jinja("mistralai-Mistral-Nemo-Instruct-2407.jinja", case_json,
                        CHAT_FAMILY_MISTRAL_TEKKEN, nemo, N_OF(nemo), &p);
}

/* Generic ChatML has no template with tools: Qwen's Hermes block without
 * Qwen's default system message (derived from the Qwen 2.5 template above). */
static void test_chat_render_chatml_tools(void **state) {
    (void)state;
    const struct chat_message msgs[] = {
        {.role = "user", .content = "u"},
        {.role = "assistant", .content = "", .tool_calls = paris_calls, .n_tool_calls = 1},
        {.role = "tool", .content = "r", .tool_call_id = "abcdefghi"},
    };
    struct chat_render_params p = params(NULL, NULL, true);
    p.tools = &weather_tool;
    p.n_tools = 1;
    struct buf want = {0};
    buf_append_str(&want, "<|im_start|>system\n# Tools\n\nYou may call one or more functions to "
                          "assist with the user query.\n\nYou are provided with function "
                          "signatures within <tools></tools> XML tags:\n<tools>\n");
    buf_append_str(&want, weather_tool.json);
    buf_append_str(&want, "\n</tools>\n\nFor each function call, return a json object with "
                          "function name and arguments within <tool_call></tool_call> XML "
                          "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                          "<args-json-object>}\n</tool_call><|im_end|>\n"
                          "<|im_start|>user\nu<|im_end|>\n"
                          "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
                          "\"arguments\": {\"city\": \"Paris\", \"n\": 2}}\n</tool_call>"
                          "<|im_end|>\n<|im_start|>user\n<tool_response>\nr\n</tool_response>"
                          "<|im_end|>\n<|im_start|>assistant\n");
    check_render(CHAT_FAMILY_CHATML, msgs, N_OF(msgs), &p, want.data, false);
    buf_free(&want);
}

/* What the tool templates raise on, and tools for families without them. */
static void test_chat_render_tools_rejects(void **state) {
    (void)state;
    const struct chat_message u[] = {{.role = "user", .content = "u"}};
    const struct chat_message sys_only[] = {{.role = "system", .content = "s"}};
    const struct chat_message two_calls[] = {
        {.role = "user", .content = "u"},
        {.role = "assistant", .content = "", .tool_calls = paris_calls, .n_tool_calls = 2},
    };
    static const struct chat_tool_call long_id[] = {
        {.id = "call_0123456789", .name = "f", .arguments = "{}"},
    };
    const struct chat_message long_call[] = {
        {.role = "user", .content = "u"},
        {.role = "assistant", .content = "", .tool_calls = long_id, .n_tool_calls = 1},
    };
    const struct chat_message user_calls[] = {
        {.role = "user", .content = "u", .tool_calls = paris_calls, .n_tool_calls = 1},
    };
    struct buf out = {0};
    char msg[256];
    struct chat_render_params p = params("<s>", "</s>", true);
    p.tools = &weather_tool;
    p.n_tools = 1;
    for (int f = 0; f < CHAT_FAMILY_COUNT; f++) {
        int err = chat_render((enum chat_family)f, u, 1, &p, &out, NULL, msg, sizeof(msg));
        assert_int_equal(err, chat_family_has_tools((enum chat_family)f) ? 0 : ERR_INVAL);
        if (err) assert_non_null(strstr(msg, "does not support tools"));
        buf_free(&out);
        struct chat_tool_syntax syn;
        assert_int_equal(chat_tool_syntax((enum chat_family)f, &syn),
                         chat_family_has_tools((enum chat_family)f) ? 0 : ERR_UNSUPPORTED);
    }
    assert_int_equal(chat_render(CHAT_FAMILY_LLAMA3_1, sys_only, 1, &p, &out, NULL, msg,
                                 sizeof(msg)), ERR_INVAL);
    assert_non_null(strstr(msg, "first user message"));
    assert_int_equal(chat_render(CHAT_FAMILY_LLAMA3_1, two_calls, 2, &p, &out, NULL, msg,
                                 sizeof(msg)), ERR_INVAL);
    assert_non_null(strstr(msg, "one tool call"));
    assert_int_equal(chat_render(CHAT_FAMILY_MISTRAL_TEKKEN, long_call, 2, &p, &out, NULL, msg,
                                 sizeof(msg)), ERR_INVAL);
    assert_non_null(strstr(msg, "9 alphanumeric"));
    assert_int_equal(chat_render(CHAT_FAMILY_QWEN2_5, user_calls, 1, &p, &out, NULL, msg,
                                 sizeof(msg)), ERR_INVAL);
    assert_non_null(strstr(msg, "only assistant"));
    assert_null(out.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_detect_real_templates),
        cmocka_unit_test(test_chat_real_templates_have_rendered_fragments),
        cmocka_unit_test(test_chat_detect_snippets),
        cmocka_unit_test(test_chat_detect_respects_len),
        cmocka_unit_test(test_chat_family_names),
        cmocka_unit_test(test_chat_reply_prefix),
        cmocka_unit_test(test_chat_render_chatml),
        cmocka_unit_test(test_chat_render_qwen2_5),
        cmocka_unit_test(test_chat_render_llama3_1),
        cmocka_unit_test(test_chat_render_llama3),
        cmocka_unit_test(test_chat_render_llama2),
        cmocka_unit_test(test_chat_render_mistral_v1),
        cmocka_unit_test(test_chat_render_mistral_legacy),
        cmocka_unit_test(test_chat_render_mistral_tekken),
        cmocka_unit_test(test_chat_render_phi3),
        cmocka_unit_test(test_chat_render_gemma),
        cmocka_unit_test(test_chat_render_zephyr),
        cmocka_unit_test(test_chat_render_deepseek_r1),
        cmocka_unit_test(test_chat_render_utf8),
        cmocka_unit_test(test_chat_render_appends_and_defaults),
        cmocka_unit_test(test_chat_render_rejects),
        cmocka_unit_test(test_chat_render_tools_match_jinja),
        cmocka_unit_test(test_chat_render_chatml_tools),
        cmocka_unit_test(test_chat_render_tools_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
