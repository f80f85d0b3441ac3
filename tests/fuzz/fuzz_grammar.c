/*
 * tests/fuzz/fuzz_grammar.c - libFuzzer target: the GBNF compiler
 * (gbnf_compile), the JSON Schema to GBNF converter (json_schema_to_gbnf)
 * and the matcher that runs what they produce (grammar.h).
 * Input: byte 0 is the mode: bit 0 clear: the text is GBNF; set: it is a
 * JSON Schema (converted, then compiled); bit 1 clear: the rest drives the
 * matcher byte by byte; set: token by token over a 260-token vocabulary
 * (tests/fuzz/data/base.gguf's), two bytes per token id. The text runs
 * from byte 1 to the first NUL; what follows the NUL is the drive.
 * Oracle (gbnf.h, json_schema.h, grammar.h contracts):
 *   - gbnf_compile: 0, ERR_NOMEM, or ERR_INVAL with a non-empty message;
 *   - json_schema_to_gbnf: 0 or ERR_INVAL with a message, and what it
 *     returns compiles, unless the grammar is over one of the compiler's
 *     size limits (a message saying so);
 *   - bytes: grammar_allows_byte(b) is true exactly when accepting b does
 *     not REJECT; after DONE the output is a whole sentence;
 *   - tokens: a token is accepted exactly when its bit is set in
 *     grammar_mask(), or, when the mask was cut short by its bound of work
 *     (grammar_is_mask_cut), every token it allows is accepted; the mask's
 *     count is the number of set bits.
 * Everything is freed (LeakSanitizer).
 * Seeds: tests/fuzz/corpus/grammar.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/format/gguf.h"
#include "engine/text/gbnf.h"
#include "engine/text/grammar.h"
#include "engine/text/tokenizer.h"
#include "server/json_schema.h"
#include "tests/fuzz/fuzz_util.h"

#define DRIVE_MAX 512  // matcher steps per input at most

static struct gguf_file *vocab_file;
static struct tokenizer *tok;
static struct grammar_vocab *vocab;
static uint64_t *mask;  // [grammar_mask_words(n_vocab)]

static void free_vocab(void) {
    free(mask);
    grammar_vocab_free(vocab);
    tokenizer_free(tok);
    gguf_close(vocab_file);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_util_quiet_logs();
    const char *path = fuzz_util_data_path("base.gguf");
    if (gguf_open(path, &vocab_file) != 0 || tokenizer_load(vocab_file, &tok) != 0 ||
        !(vocab = grammar_vocab_create(tok))) {
        fprintf(stderr, "fuzz_grammar: %s does not give a vocabulary\n", path);
        abort();
    }
    mask = calloc(grammar_mask_words(grammar_vocab_n_vocab(vocab)), sizeof(*mask));
    if (!mask) abort();
    atexit(free_vocab);
    return 0;
}

static bool is_message(const char *msg, size_t size) {
    return memchr(msg, '\0', size) && msg[0] != '\0';
}

/* The compiler's size limits (gbnf.h): a converted schema may exceed them. */
static bool is_limit_message(const char *msg) {
    static const char *const words[] = {"more than", "over ", "deeper than", "longer than",
                                        "too long"};
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        if (strstr(msg, words[i])) return true;
    }
    return false;
}

static void drive_bytes(struct grammar *gm, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n && i < DRIVE_MAX; i++) {
        bool allowed = grammar_allows_byte(gm, p[i]);
        enum grammar_step st = grammar_accept_bytes(gm, &p[i], 1);
        if ((st != GRAMMAR_STEP_REJECT) != allowed) abort();
        if (st == GRAMMAR_STEP_DONE) {
            if (!grammar_is_accepting(gm)) abort();
            return;
        }
    }
}

static void drive_tokens(struct grammar *gm, const uint8_t *p, size_t n) {
    const int32_t n_vocab = grammar_vocab_n_vocab(vocab);
    for (size_t i = 0; i + 1 < n && i / 2 < DRIVE_MAX; i += 2) {
        int32_t n_allowed = grammar_mask(gm, vocab, mask);
        const bool is_cut = grammar_is_mask_cut(gm);
        int32_t n_bits = 0;
        for (int32_t k = 0; k < n_vocab; k++) n_bits += (int32_t)((mask[k / 64] >> (k % 64)) & 1);
        if (n_bits != n_allowed) abort();
        if (n_allowed == 0) return;
        int32_t t = (int32_t)((p[i] | (uint32_t)p[i + 1] << 8) % (uint32_t)n_vocab);
        bool allowed = (mask[t / 64] >> (t % 64)) & 1;
        enum grammar_step st = grammar_accept_token(gm, vocab, t);
        if (allowed && st == GRAMMAR_STEP_REJECT) abort();
        if (!allowed && st != GRAMMAR_STEP_REJECT && !is_cut) abort();
        if (st == GRAMMAR_STEP_DONE) return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t mode = data[0];
    const uint8_t *text = data + 1;
    const uint8_t *nul = memchr(text, '\0', size - 1);
    const size_t text_len = nul ? (size_t)(nul - text) : size - 1;
    const uint8_t *drive = nul ? nul + 1 : data + size;
    const size_t drive_len = (size_t)(data + size - drive);

    char msg[256];
    msg[0] = '\0';
    struct buf gb = {0};
    bool from_schema = mode & 1;
    if (from_schema) {
        json_t *schema = json_loadb((const char *)text, text_len, JSON_DECODE_ANY, NULL);
        if (!schema) return 0;
        int err = json_schema_to_gbnf(schema, &gb, msg, sizeof(msg));
        json_decref(schema);
        if (err) {
            if (err != ERR_INVAL || !is_message(msg, sizeof(msg))) abort();
            buf_free(&gb);
            return 0;
        }
    } else {
        buf_append(&gb, text, text_len);
    }
    struct gbnf *g = NULL;
    msg[0] = '\0';
    int err = gbnf_compile(gb.len ? gb.data : "", gb.len, &g, msg, sizeof(msg));
    if (err) {
        bool ok = err == ERR_NOMEM || (err == ERR_INVAL && is_message(msg, sizeof(msg)));
        if (!ok || (from_schema && err == ERR_INVAL && !is_limit_message(msg))) abort();
        buf_free(&gb);
        return 0;
    }
    struct grammar *gm = grammar_create(g);
    if (gm) {
        if (mode & 2) {
            drive_tokens(gm, drive, drive_len);
        } else {
            drive_bytes(gm, drive, drive_len);
        }
    }
    grammar_free(gm);
    gbnf_release(g);
    buf_free(&gb);
    return 0;
}
