/*
 * tests/fuzz/fuzz_tokenizer.c - libFuzzer target: the tokenizers of every
 * shared vocabulary (every .gguf in ../shared/models/vocab: SPM and byte-level BPE
 * with their pre-tokenizers), encoding arbitrary bytes and
 * decoding arbitrary ids, in one shot and streamed.
 * Input: byte 0 picks the vocabulary (mod the number found), byte 1 the mode:
 *   bit 0 add_special, bit 1 parse_special, bit 2 decode instead of encode,
 *   bit 3 skip_special, bit 4 continuation streams (init_after, piece), bits
 *   5-7 where their prompt ends (k/7 of the ids);
 * then the text (encode) or little-endian int32 ids (decode, any value).
 * Oracle (tokenizer.h's contract): decode output is valid UTF-8; a stream
 * fed the same ids and flushed gives the same bytes as decode; a stream
 * after a prompt gives decode(prompt + ids) less decode(prompt)'s bytes;
 * token pieces that form valid UTF-8 are the streamed text.
 * Without ../shared every input is skipped (one note at start-up).
 * Seeds: tests/fuzz/corpus/tokenizer.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

#define MAX_VOCABS 64

static struct gguf_file *files[MAX_VOCABS];
static struct tokenizer *toks[MAX_VOCABS];
static int n_toks;

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_vocabs(void) {
    for (int i = 0; i < n_toks; i++) {
        tokenizer_free(toks[i]);
        gguf_close(files[i]);
    }
    n_toks = 0;
}

/* Loads every *.gguf of the shared vocab directory, in name order, so
 * byte 0 means the same vocabulary on every machine. A file that does not
 * load is a finding (the unit tests load them all): the target aborts. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_util_quiet_logs();
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/models/vocab", fuzz_util_shared_dir());
    DIR *d = opendir(dir);
    char *names[MAX_VOCABS];
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len <= 5 || strcmp(e->d_name + len - 5, ".gguf") != 0) continue;
        if (n == MAX_VOCABS) {
            fprintf(stderr, "fuzz_tokenizer: more than %d vocabularies in %s\n", MAX_VOCABS, dir);
            abort();
        }
        names[n++] = strdup(e->d_name);
    }
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof(names[0]), by_name);
    for (int i = 0; i < n; i++) {
        char path[2048];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        if (gguf_open(path, &files[n_toks]) == 0 &&
            tokenizer_load(files[n_toks], &toks[n_toks]) == 0) {
            n_toks++;
        } else {
            fprintf(stderr, "fuzz_tokenizer: %s does not load\n", path);
            abort();
        }
        free(names[i]);
    }
    if (n_toks == 0) {
        fprintf(stderr, "fuzz_tokenizer: no vocabulary in %s: every input is skipped\n", dir);
    } else {
        fprintf(stderr, "fuzz_tokenizer: %d vocabularies from %s\n", n_toks, dir);
    }
    atexit(free_vocabs);
    return 0;
}

static bool same(const struct buf *a, size_t a_from, const struct buf *b) {
    return a->len - a_from == b->len && (b->len == 0 || memcmp(a->data + a_from, b->data, b->len) == 0);
}

/* Decodes ids[n] whole and streamed and checks they agree. With
 * continuation, ids[0, n_prompt) are a prompt and the rest continue it: a
 * stream set up by tokenizer_stream_init_after() must give what the whole
 * stream gave past the prompt (checked where the prompt ends on a character
 * boundary, the only place "past the prompt" is a byte offset), and the raw
 * token strings of tokenizer_stream_piece() must be those bytes whenever
 * they are valid UTF-8 by themselves. */
static void decode_both_ways(const struct tokenizer *t, const int32_t *ids, int32_t n,
                             int32_t n_prompt, bool skip_special, bool continuation) {
    struct buf whole = {0};
    struct buf streamed = {0};
    struct tokenizer_stream s;
    tokenizer_stream_init(&s, skip_special);
    tokenizer_decode(t, ids, n, skip_special, &whole);
    if (!tokenizer_utf8_valid(whole.data, whole.len)) abort();
    bool on_boundary = false;
    size_t prompt_len = 0;
    for (int32_t i = 0; i < n; i++) {
        if (i == n_prompt) {
            on_boundary = s.n_pending == 0;
            prompt_len = streamed.len;
        }
        tokenizer_stream_feed(t, &s, ids[i], &streamed);
        if (!tokenizer_utf8_valid(streamed.data, streamed.len)) abort();
    }
    if (n_prompt == n) {
        on_boundary = s.n_pending == 0;
        prompt_len = streamed.len;
    }
    tokenizer_stream_flush(t, &s, &streamed);
    if (!tokenizer_utf8_valid(streamed.data, streamed.len) || !same(&whole, 0, &streamed)) abort();

    if (continuation) {
        struct buf after = {0};
        struct buf pieces = {0};
        struct tokenizer_stream sa;
        struct tokenizer_stream sp;
        tokenizer_stream_init_after(&sa, t, ids, n_prompt, skip_special);
        tokenizer_stream_init_after(&sp, t, ids, n_prompt, skip_special);
        for (int32_t i = n_prompt; i < n; i++) {
            tokenizer_stream_feed(t, &sa, ids[i], &after);
            if (!tokenizer_utf8_valid(after.data, after.len)) abort();
            tokenizer_stream_piece(t, &sp, ids[i], &pieces);
        }
        tokenizer_stream_flush(t, &sa, &after);
        if (!tokenizer_utf8_valid(after.data, after.len)) abort();
        if (on_boundary && !same(&streamed, prompt_len, &after)) abort();
        if (!skip_special && tokenizer_utf8_valid(pieces.data, pieces.len) &&
            !same(&pieces, 0, &after)) {
            abort();
        }
        buf_free(&after);
        buf_free(&pieces);
    }
    buf_free(&whole);
    buf_free(&streamed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (n_toks == 0 || size < 2) return 0;
    const struct tokenizer *t = toks[data[0] % n_toks];
    const uint8_t mode = data[1];
    const bool add_special = mode & 1;
    const bool parse_special = mode & 2;
    const bool skip_special = mode & 8;
    const bool continuation = mode & 16;
    const int32_t split_sevenths = mode >> 5;  // continuation: the prompt is n * (0..7) / 7 ids
    data += 2;
    size -= 2;
    if (mode & 4) {
        int32_t n = (int32_t)(size / sizeof(int32_t));
        int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
        if (!ids) return 0;
        memcpy(ids, data, (size_t)n * sizeof(int32_t));
        decode_both_ways(t, ids, n, (int32_t)((int64_t)n * split_sevenths / 7), skip_special,
                         continuation);
        struct buf piece = {0};
        for (int32_t i = 0; i < n; i++) {
            if (ids[i] >= 0 && ids[i] < tokenizer_n_vocab(t)) {
                tokenizer_token_to_piece(t, ids[i], !skip_special, &piece);
                (void)tokenizer_token_text(t, ids[i]);
                (void)tokenizer_token_type(t, ids[i]);
            }
        }
        buf_free(&piece);
        free(ids);
        return 0;
    }
    int32_t *ids = NULL;
    int32_t n = 0;
    int err = tokenizer_encode(t, (const char *)data, size, add_special, parse_special, &ids, &n);
    if (err == 0) {
        for (int32_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(t)) abort();  // ids from the vocab
        }
        decode_both_ways(t, ids, n, (int32_t)((int64_t)n * split_sevenths / 7), skip_special,
                         continuation);
    } else if (err != ERR_INVAL && err != ERR_NOMEM) {
        abort();  // the documented codes only
    }
    free(ids);
    return 0;
}
