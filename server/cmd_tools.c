/*
 * cmd_tools.c - `llmserve tokenize` and `llmserve detokenize`.
 *
 * Contracts (scripts rely on them):
 *   tokenize -m FILE [--no-special] [--parse-special]
 *       reads text from stdin (all of it, byte for byte: a trailing newline is
 *       part of the text) and prints the ids space-separated on one line.
 *       --no-special: no BOS/EOS added (as the upstream test vectors expect).
 *   detokenize -m FILE [--skip-special]
 *       reads ids (separated by spaces, commas or newlines) from stdin and
 *       prints their text.
 */
#define LOG_TAG "tools"
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/engine.h"
#include "server/cmd.h"

#define TOOLS_MAX_INPUT (64u << 20)

/* Reads stdin into b (at most TOOLS_MAX_INPUT bytes). */
static int read_stdin(struct buf *b) {
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), stdin)) > 0) {
        if (b->len + n > TOOLS_MAX_INPUT) return ERR_TOOLONG;
        buf_append(b, chunk, n);
    }
    return ferror(stdin) ? ERR_IO : 0;
}

/* The vocabulary of the file at path, no weights: these tools work on
 * vocab-only GGUF files and do not map a large model's tensors. */
static int load(const char *cmd, const char *path, struct tokenizer **out) {
    int err = engine_tokenizer_load(path, out);
    if (err) {
        fprintf(stderr, "%s: cannot load the tokenizer of %s: %s\n", cmd, path,
                err == ERR_NOTFOUND ? "the file has no tokenizer.* keys" : err_str(err));
    }
    return err;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model_path = NULL;
    bool add_special = true;
    bool parse_special = false;
    enum { OPT_NO_SPECIAL = 256, OPT_PARSE_SPECIAL };
    static const struct option long_opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"no-special", no_argument, NULL, OPT_NO_SPECIAL},
        {"parse-special", no_argument, NULL, OPT_PARSE_SPECIAL},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    log_set_level(LOG_LEVEL_WARN);
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:h", long_opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case OPT_NO_SPECIAL: add_special = false; break;
        case OPT_PARSE_SPECIAL: parse_special = true; break;
        case 'h':
        default:
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: llmserve tokenize -m FILE [--no-special] [--parse-special] < text\n"
                    "  --no-special     do not add BOS/EOS\n"
                    "  --parse-special  text spelling a special token becomes that token\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (!model_path) {
        fprintf(stderr, "tokenize: -m FILE is required\n");
        return 2;
    }
    struct tokenizer *tok = NULL;
    if (load("tokenize", model_path, &tok)) return 1;
    struct buf text = {0};
    int err = read_stdin(&text);
    int32_t *ids = NULL;
    int32_t n = 0;
    if (!err) {
        err = tokenizer_encode(tok, text.data ? text.data : "", text.len, add_special,
                               parse_special, &ids, &n);
    }
    if (err) {
        fprintf(stderr, "tokenize: %s\n",
                err == ERR_INVAL ? "the input is not valid UTF-8 text (or contains a NUL byte)"
                                 : err_str(err));
    } else {
        for (int32_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
    free(ids);
    buf_free(&text);
    tokenizer_free(tok);
    return err ? 1 : 0;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model_path = NULL;
    bool skip_special = false;
    enum { OPT_SKIP_SPECIAL = 256 };
    static const struct option long_opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"skip-special", no_argument, NULL, OPT_SKIP_SPECIAL},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    log_set_level(LOG_LEVEL_WARN);
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:h", long_opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case OPT_SKIP_SPECIAL: skip_special = true; break;
        case 'h':
        default:
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: llmserve detokenize -m FILE [--skip-special] < ids\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (!model_path) {
        fprintf(stderr, "detokenize: -m FILE is required\n");
        return 2;
    }
    struct tokenizer *tok = NULL;
    if (load("detokenize", model_path, &tok)) return 1;
    struct buf in = {0};
    int err = read_stdin(&in);
    int32_t *ids = NULL;
    int32_t n = 0, cap = 0;
    const char *p = in.data ? in.data : "";
    while (!err && *p) {
        if (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r') {
            p++;
            continue;
        }
        char *end = NULL;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || v < 0 || v >= tokenizer_n_vocab(tok)) {
            fprintf(stderr, "detokenize: '%.20s' is not a token id in [0, %d)\n", p,
                    tokenizer_n_vocab(tok));
            err = ERR_INVAL;
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            int32_t *grown = realloc(ids, (size_t)cap * sizeof(int32_t));
            if (!grown) {
                err = ERR_NOMEM;
                break;
            }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (!err) {
        struct buf out = {0};
        tokenizer_decode(tok, ids, n, skip_special, &out);
        if (out.len) fwrite(out.data, 1, out.len, stdout);
        printf("\n");
        buf_free(&out);
    }
    free(ids);
    buf_free(&in);
    tokenizer_free(tok);
    return err ? 1 : 0;
}
