/*
 * main.c - program entry: makes sure OpenBLAS runs its fast kernels, then
 * dispatches to the subcommand.
 */
#define LOG_TAG "main"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/base/log.h"
#include "engine/kernels/kernels.h"
#include "server/cmd.h"

struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
};

static const struct subcommand subcommands[] = {
    {"generate", cmd_generate, "run a model on a prompt and stream the continuation"},
    {"tokenize", cmd_tokenize, "print the token ids of the text on stdin"},
    {"detokenize", cmd_detokenize, "print the text of the token ids on stdin"},
    {"batch", cmd_batch, "run many prompts from a JSONL file through the scheduler"},
    {"serve", cmd_serve, "serve the model over an OpenAI-compatible HTTP API"},
    {"quantize", cmd_quantize, "convert a GGUF's weights to Q8_0, Q4_0, Q4_K_M, ..."},
    {"perplexity", cmd_perplexity, "perplexity (and KL from a base model) over a text"},
};

static void usage(FILE *fp) {
    fprintf(fp, "usage: llmserve <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++) {
        fprintf(fp, "  %-10s %s\n", subcommands[i].name, subcommands[i].help);
    }
    fprintf(fp, "\n`llmserve <command> --help` lists a command's options.\n");
}

/* Debian's OpenBLAS reads OPENBLAS_CORETYPE only when it is loaded, and on
 * CPUs it does not recognise it falls back to SSE3 kernels (~5x slower sgemm).
 * If that happened and the user did not choose a core type, set it and re-exec
 * ourselves once (LLMSERVE_REEXEC guards against a loop). */
static void ensure_blas_coretype(char **argv) {
    const char *coretype = NULL;
    if (getenv("LLMSERVE_REEXEC") || !kern_blas_wants_coretype(&coretype)) return;
    setenv("OPENBLAS_CORETYPE", coretype, 1);
    setenv("LLMSERVE_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);
    // execv failed: go on with the slow kernels rather than not at all.
    LOG_WARN("OpenBLAS picked a generic kernel and re-exec with OPENBLAS_CORETYPE=%s failed",
             coretype);
}

int main(int argc, char **argv) {
    ensure_blas_coretype(argv);
    // Every subcommand computes with the kernels chosen here, once.
    kern_dispatch_init(false);
    kern_blas_init();
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++) {
        if (strcmp(argv[1], subcommands[i].name) == 0) return subcommands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "llmserve: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
