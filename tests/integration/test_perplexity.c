/*
 * test_perplexity.c - `llmserve perplexity` as a user runs it: its stdout
 * contract (ppl=, and with --base kl=, kl_max=, top1=) on a synthetic test
 * model compared with itself, with the same and with a quantized KV cache.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "tests/helpers/testutil.h"

struct ppl_result {
    double ppl;
    double kl;
    double kl_max;
    double top1;
};

/* Runs `llmserve perplexity` of the llama-f32 test model against itself as
 * --base, its KV cache of kv_type, and parses stdout; returns the exit status. */
static int run_ppl(const char *kv_type, struct ppl_result *r) {
    const char *bin = getenv("LLMSERVE_BIN");
    const char *build = getenv("LLMSERVE_BUILD");
    assert_non_null(bin);
    assert_non_null(build);
    char cmd[4096], out[1024];
    snprintf(cmd, sizeof(cmd),
             "%s perplexity -m %s/tests/models/llama-f32.gguf --base %s/tests/models/llama-f32.gguf"
             " --kv-type %s --text %s/docs/data/stories.txt --ctx 64 -t 2 2>/dev/null",
             bin, build, build, kv_type, testutil_source_dir());
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t got = fread(out, 1, sizeof(out) - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    memset(r, 0, sizeof(*r));
    const char *kl = strstr(out, " kl=");
    const char *kl_max = strstr(out, " kl_max=");
    const char *top1 = strstr(out, " top1=");
    assert_true(strncmp(out, "ppl=", 4) == 0);
    assert_non_null(kl);
    assert_non_null(kl_max);
    assert_non_null(top1);
    r->ppl = strtod(out + 4, NULL);
    r->kl = strtod(kl + 4, NULL);
    r->kl_max = strtod(kl_max + 8, NULL);
    r->top1 = strtod(top1 + 6, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The same model and KV type as the base: nothing differs. */
static void test_perplexity_self_kl_is_zero(void **state) {
    (void)state;
    struct ppl_result r;
    assert_int_equal(run_ppl("f32", &r), 0);
    assert_true(r.ppl > 1.0);
    assert_true(r.kl == 0.0 && r.kl_max == 0.0);
    assert_true(r.top1 == 1.0);
}

/* A quantized KV cache moves the distributions a little, never much
 * (docs/quantization.md has the measured values). */
static void test_perplexity_quantized_kv_kl_is_small(void **state) {
    (void)state;
    struct ppl_result r16, r8;
    assert_int_equal(run_ppl("f16", &r16), 0);
    assert_int_equal(run_ppl("q8_0", &r8), 0);
    assert_true(r16.kl >= 0.0 && r16.kl <= r16.kl_max && r16.kl_max < 1e-3);
    assert_true(r8.kl > 0.0 && r8.kl <= r8.kl_max && r8.kl_max < 0.01);
    assert_true(r16.top1 >= 0.99 && r8.top1 >= 0.95);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_perplexity_self_kl_is_zero),
        cmocka_unit_test(test_perplexity_quantized_kv_kl_is_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
