/*
 * tests/fuzz/fuzz_util.h - what every libFuzzer target of tests/fuzz shares:
 * silenced logs, a private scratch directory for the loaders that take a
 * path, and where the committed data and ../shared are.
 *
 * A target is one .c with LLVMFuzzerTestOneInput (and, where it loads
 * something once, LLVMFuzzerInitialize); scripts/fuzz runs them. Not
 * thread-safe: libFuzzer calls a target from one thread.
 */
#ifndef LLMSERVE_TESTS_FUZZ_UTIL_H
#define LLMSERVE_TESTS_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* libFuzzer's entry points (declared here for -Wmissing-prototypes). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Sends every log line to /dev/null: the loaders log each rejected input at
 * ERROR, which would cost more than the parse. LLMSERVE_FUZZ_LOG=1 keeps
 * them on stderr (for reading why a reproducer is refused). */
void fuzz_util_quiet_logs(void);

/* A directory of this process's own (mkdtemp under $TMPDIR, else /dev/shm
 * when it exists, else /tmp; removed at exit), so parallel fuzzers never
 * share files. */
const char *fuzz_util_scratch_dir(void);

/* Writes size bytes to <scratch>/<name> (replacing it) and returns that
 * path (a static buffer, valid until the next call). Aborts on I/O failure:
 * the harness, not the code under test, is broken then. */
const char *fuzz_util_write(const char *name, const void *data, size_t size);

/* tests/fuzz/data/<name> in the source tree (compiled in; static buffer). */
const char *fuzz_util_data_path(const char *name);

/* ../shared: $LLMSERVE_SHARED, else the build's shared_dir option. */
const char *fuzz_util_shared_dir(void);

#endif // LLMSERVE_TESTS_FUZZ_UTIL_H
