/*
 * testutil.h - shared fixtures for the cmocka suites: where the test data is
 * (../shared and the build directory's synthetic models), and small helpers.
 */
#ifndef LLMSERVE_TESTUTIL_H
#define LLMSERVE_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The ../shared directory (LLMSERVE_SHARED), or NULL when it is absent: tests
 * that need it call skip() and say why. */
const char *testutil_shared_dir(void);

/* Joins dir and name into a static buffer (one per call site is enough for tests:
 * each call overwrites one of 8 rotating buffers). */
const char *testutil_path(const char *dir, const char *name);

/* The build directory (LLMSERVE_BUILD) and source directory (LLMSERVE_SOURCE). */
const char *testutil_build_dir(void);
const char *testutil_source_dir(void);

/* True when path exists. */
bool testutil_exists(const char *path);

/* Adapter NAME of the build's tests/models (scripts/mklora): the directory
 * NAME, else the file NAME.gguf, written into buf (size bytes); returns buf. */
const char *testutil_adapter_path(const char *name, char *buf, size_t size);

/* Pages of [p, p + n) resident now (mincore: the kernel's own count). */
size_t testutil_resident_pages(const void *p, size_t n);

/* Reads a whole file (malloc'd, NUL-terminated; the caller frees) or NULL. */
char *testutil_read_file(const char *path, size_t *out_len);

/* Runs a shell command, returns its exit status (or -1). */
int testutil_system(const char *cmd);

/* The first TESTUTIL_SPM_BASE entries of a synthetic SPM vocabulary, as
 * Llama's files have them: <unk> (unknown), <s> and </s> (control, ids 1
 * and 2), then the 256 byte tokens <0x00>..<0xFF> (ids 3..258), score 0.
 * tokens[] points at static names. */
#define TESTUTIL_SPM_BASE 259
void testutil_spm_base(const char **tokens, float *scores, int32_t *types);

#endif
