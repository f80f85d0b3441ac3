/*
 * tests/fuzz/fuzz_openai.c - libFuzzer target: request JSON -> parameters
 * for every route that reads a body, on the base model of fuzz_adapter.h
 * (its 260-token vocabulary and chat rendering):
 *   0 /v1/completions, 1 /v1/chat/completions: openai_parse() then
 *     openai_prepare(), what handle_generate() does before it submits (the
 *     submit needs a running scheduler, outside a parser's fuzz target);
 *   2 /tokenize, 3 /detokenize, 4 /v1/unload_lora_adapter: the route
 *     handlers themselves (routes_find() + handler), which answer at once.
 * /v1/load_lora_adapter is left out: past its two string fields it reads
 * the file system at the path the body names (fuzz_peft and fuzz_lora_gguf
 * fuzz those loaders).
 * Input: byte 0 the route (mod 5), byte 1 the chat family (mod
 * CHAT_FAMILY_COUNT; bit 7: the model has no usable template), then the
 * body. Oracle (openai.h, routes.h): every error is ERR_INVAL, ERR_NOTFOUND
 * or ERR_TOOLONG with a NUL-terminated message; every reply has a status
 * and a body. Seeds: tests/fuzz/corpus/openai.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/engine.h"
#include "server/lora_registry.h"
#include "server/openai.h"
#include "server/req.h"
#include "server/routes.h"
#include "tests/fuzz/fuzz_adapter.h"
#include "tests/fuzz/fuzz_util.h"

static struct lora_registry *loras;

static void free_loras(void) {
    lora_registry_destroy(loras);
    loras = NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_util_quiet_logs();
    loras = lora_registry_create(fuzz_adapter_base(), "base");
    atexit(free_loras);
    return 0;
}

static void generate(enum openai_route route, const struct openai_model *om, const char *body,
                     size_t len) {
    struct openai_request r;
    struct openai_error e = {0};
    const struct tokenizer *tok = engine_model_tokenizer(om->model);
    int err = openai_parse(route, body, len, tokenizer_n_vocab(tok), &r, &e);
    if (!err) err = openai_prepare(&r, om, &e);
    if (err) {
        if (err != ERR_INVAL && err != ERR_NOTFOUND && err != ERR_TOOLONG) abort();
        if (!memchr(e.message, '\0', sizeof(e.message))) abort();
    } else if (r.max_tokens < 0 || r.n < 1 || r.n_prompts < 1) {
        abort();  // openai_prepare() sets max_tokens; at least one prompt
    }
    openai_request_deinit(&r);
}

static void handle(const struct openai_model *om, const char *path, const char *body,
                   size_t len) {
    bool known = false;
    const struct route *route = routes_find("POST", path, &known);
    if (!route) abort();
    // The handlers only read the tokenizer and the registry; no scheduler
    // or loader is reached on these routes (unload checks the loader is set).
    struct routes_ctx ctx = {
        .model = om->model,
        .om = *om,
        .loras = loras,
        .allow_runtime_lora = true,
        .lora_loader = (struct lora_loader *)&ctx,  // never called by unload
    };
    struct req *r = req_create(NULL, NULL);
    buf_append(&r->body, body, len);
    struct route_reply out = {0};
    enum route_result res = route->handler(&ctx, r, &out);
    if (res != ROUTE_RESULT_REPLY || out.status < 200 || !out.body) abort();
    free(out.body);
    req_destroy(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const struct engine_model *m = fuzz_adapter_base();
    struct openai_model om = {
        .model = m,
        .name = "base",
        .n_ctx = 256,
        .chat_family = (enum chat_family)((data[1] & 0x7f) % CHAT_FAMILY_COUNT),
        .has_chat = !(data[1] & 0x80),
    };
    const char *body = (const char *)data + 2;
    const size_t len = size - 2;
    switch (data[0] % 5) {
    case 0: generate(OPENAI_ROUTE_COMPLETIONS, &om, body, len); break;
    case 1: generate(OPENAI_ROUTE_CHAT, &om, body, len); break;
    case 2: handle(&om, "/tokenize", body, len); break;
    case 3: handle(&om, "/detokenize", body, len); break;
    default: handle(&om, "/v1/unload_lora_adapter", body, len); break;
    }
    return 0;
}
