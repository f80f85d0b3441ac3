/*
 * test_gguf.c - the GGUF reader on the real files in ../shared/models.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/base/err.h"
#include "engine/gguf.h"
#include "tests/helpers/testutil.h"

static void test_gguf_parses_stories260k(void **state) {
    (void)state;
    const char *shared = testutil_shared_dir();
    if (!shared) {
        print_message("skipped: ../shared is absent\n");
        skip();
    }
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(testutil_path(shared, "models/stories260K.gguf"), &f), 0);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_n_kv(f), 19);
    assert_int_equal(gguf_n_tensors(f), 48);
    uint32_t n = 0;
    assert_int_equal(gguf_get_u32(f, "llama.embedding_length", &n), 0);
    assert_int_equal(n, 64);
    const struct gguf_kv *tokens = NULL;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tokens), 0);
    assert_int_equal(tokens->arr_n, 512);
    const struct gguf_tensor_info *t = gguf_find_tensor(f, "blk.0.ffn_gate.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 172);
    gguf_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_parses_stories260k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
