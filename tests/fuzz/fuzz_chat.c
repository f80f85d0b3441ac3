/*
 * tests/fuzz/fuzz_chat.c - libFuzzer target: the chat template renderer
 * (chat_render) on arbitrary message lists for every family, and the
 * template recogniser (chat_detect) on arbitrary templates.
 * Input: byte 0 the family (mod CHAT_FAMILY_COUNT), byte 1 flags:
 *   bit 0 add_generation_prompt, bit 1 bos/eos texts set, bit 2 a date
 *   string, bit 3 a NULL content in the last message, bit 4 the payload is
 *   a template for chat_detect() instead;
 * then NUL-separated fields role, content, role, content, ...; a one-byte
 * role 1, 2 or 3 stands for "system", "user", "assistant" (anything else
 * is taken as the role's text). Oracle (chat.h's contract): 0 or ERR_INVAL,
 * a NUL-terminated message on failure and out unchanged.
 * Seeds: tests/fuzz/corpus/chat.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/text/chat.h"
#include "tests/fuzz/fuzz_util.h"

#define MAX_MESSAGES 64

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_util_quiet_logs();
    return 0;
}

static const char *role_of(const char *field) {
    static const char *const roles[] = {"system", "user", "assistant"};
    if (field[0] >= 1 && field[0] <= 3 && field[1] == '\0') return roles[field[0] - 1];
    return field;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const enum chat_family fam = (enum chat_family)(data[0] % CHAT_FAMILY_COUNT);
    const uint8_t flags = data[1];
    data += 2;
    size -= 2;
    if (flags & 16) {
        enum chat_family got = CHAT_FAMILY_COUNT;
        int err = chat_detect((const char *)data, size, &got);
        if (err == 0 && got >= CHAT_FAMILY_COUNT) abort();
        if (err != 0 && got != CHAT_FAMILY_COUNT) abort();  // *out unchanged
        return 0;
    }
    // A NUL-terminated copy, split in place at each NUL into fields.
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    struct chat_message msgs[MAX_MESSAGES];
    int32_t n = 0;
    char *p = text;
    const char *end = text + size;
    while (p < end && n < MAX_MESSAGES) {
        const char *role = p;
        p += strlen(p) + 1;
        const char *content = p < end ? p : "";
        if (p < end) p += strlen(p) + 1;
        msgs[n++] = (struct chat_message){.role = role_of(role), .content = content};
    }
    if ((flags & 8) && n > 0) msgs[n - 1].content = NULL;
    struct chat_render_params params = chat_render_default_params();
    params.add_generation_prompt = flags & 1;
    if (flags & 2) {
        params.bos_text = "<s>";
        params.eos_text = "</s>";
    }
    if (flags & 4) params.date_string = "04 Dec 2026";
    struct buf out = {0};
    buf_append_str(&out, "x");  // something already there: failure must leave it
    bool has_bos = false;
    char msg[128];
    int err = chat_render(fam, msgs, n, &params, &out, &has_bos, msg, sizeof(msg));
    if (err != 0) {
        if (err != ERR_INVAL || out.len != 1 || !memchr(msg, '\0', sizeof(msg))) abort();
    } else if (out.len < 1 || out.data[0] != 'x') {
        abort();
    }
    buf_free(&out);
    free(text);
    return 0;
}
