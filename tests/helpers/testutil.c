/*
 * testutil.c - fixtures shared by the test suites.
 */
#include "tests/helpers/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/text/tokenizer.h"

const char *testutil_shared_dir(void) {
    const char *d = getenv("LLMSERVE_SHARED");
    if (!d || !*d) return NULL;
    struct stat st;
    if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    return d;
}

const char *testutil_path(const char *dir, const char *name) {
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof(bufs[0]), "%s/%s", dir, name);
    return b;
}

const char *testutil_build_dir(void) {
    const char *d = getenv("LLMSERVE_BUILD");
    return d && *d ? d : ".";
}

const char *testutil_source_dir(void) {
    const char *d = getenv("LLMSERVE_SOURCE");
    return d && *d ? d : "..";
}

bool testutil_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

const char *testutil_adapter_path(const char *name, char *buf, size_t size) {
    snprintf(buf, size, "%s/tests/models/%s", testutil_build_dir(), name);
    if (!testutil_exists(buf)) {
        snprintf(buf, size, "%s/tests/models/%s.gguf", testutil_build_dir(), name);
    }
    return buf;
}

char *testutil_read_file(const char *path, size_t *out_len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    if (fseek(fp, 0, SEEK_END) != 0) {
        fclose(fp);
        return NULL;
    }
    long n = ftell(fp);
    rewind(fp);
    if (n < 0) {
        fclose(fp);
        return NULL;
    }
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (!buf) return NULL;
    buf[n] = '\0';
    if (out_len) *out_len = (size_t)n;
    return buf;
}

int testutil_system(const char *cmd) {
    int st = system(cmd);
    if (st == -1 || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

void testutil_spm_base(const char **tokens, float *scores, int32_t *types) {
    static char byte_names[256][8];
    tokens[0] = "<unk>";
    tokens[1] = "<s>";
    tokens[2] = "</s>";
    types[0] = TOKENIZER_TYPE_UNKNOWN;
    types[1] = types[2] = TOKENIZER_TYPE_CONTROL;
    for (int i = 0; i < 256; i++) {
        snprintf(byte_names[i], sizeof(byte_names[i]), "<0x%02X>", i);
        tokens[3 + i] = byte_names[i];
        types[3 + i] = TOKENIZER_TYPE_BYTE;
    }
    for (int i = 0; i < TESTUTIL_SPM_BASE; i++) scores[i] = 0;
}

size_t testutil_resident_pages(const void *p, size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t np = (n + page - 1) / page;
    unsigned char *v = malloc(np ? np : 1);
    if (!v || mincore((void *)p, n, v) != 0) {
        free(v);
        return (size_t)-1;
    }
    size_t k = 0;
    for (size_t i = 0; i < np; i++) k += v[i] & 1;
    free(v);
    return k;
}
