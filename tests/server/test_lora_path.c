/*
 * test_lora_path.c - runtime adapter paths confined to --lora-dir
 * (server/lora_path.h), on a directory tree made here in a temp dir. The
 * expectations are written out by hand from the rule (inside the
 * directory once every symlink is resolved, on a directory boundary; no
 * `..`; the same answer for a missing and an existing file outside), not
 * taken from the code.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/base/err.h"
#include "server/lora_path.h"

static char root[PATH_MAX];  // the temp dir (canonical)
static char dir[PATH_MAX];   // root/loras: the adapter directory

static const char *at(const char *rel) {
    static char paths[8][PATH_MAX + 64];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof(paths[0]), "%s/%s", root, rel);
    return p;
}

static void touch(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("x", f);
    fclose(f);
}

static int setup(void **state) {
    (void)state;
    char tmpl[] = "/tmp/test_lora_path-XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    assert_non_null(realpath(tmpl, root));  // /tmp may itself be a symlink
    assert_int_equal(mkdir(at("loras"), 0755), 0);
    assert_int_equal(mkdir(at("loras/sub"), 0755), 0);
    assert_int_equal(mkdir(at("loras/peft"), 0755), 0);
    assert_int_equal(mkdir(at("loras/peft-evil"), 0755), 0);
    assert_int_equal(mkdir(at("loras-old"), 0755), 0);
    touch(at("loras/a.gguf"));
    touch(at("loras/sub/b.gguf"));
    touch(at("loras/peft/adapter_config.json"));
    touch(at("loras/peft/adapter_model.safetensors"));
    touch(at("loras/peft-evil/adapter_config.json"));
    touch(at("loras-old/c.gguf"));
    touch(at("outside.gguf"));
    assert_int_equal(symlink("/etc", at("loras/etc")), 0);
    assert_int_equal(symlink(at("outside.gguf"), at("loras/out.gguf")), 0);
    assert_int_equal(symlink("a.gguf", at("loras/alias.gguf")), 0);  // stays inside
    assert_int_equal(symlink(at("outside.gguf"), at("loras/peft-evil/adapter_model.safetensors")),
                     0);
    assert_int_equal(symlink(at("loras"), at("loras-link")), 0);  // a way in from outside
    char msg[256];
    assert_int_equal(lora_path_dir(at("loras"), dir, sizeof(dir), msg, sizeof(msg)), 0);
    assert_string_equal(dir, at("loras"));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static int resolve(const char *path, char *out) {
    char msg[256];
    msg[0] = '\0';
    int err = lora_path_resolve(dir, path, out, PATH_MAX, msg, sizeof(msg));
    if (err) assert_true(msg[0] != '\0');  // every refusal says why
    return err;
}

static void test_lora_path_takes_what_is_inside(void **state) {
    (void)state;
    char out[PATH_MAX];
    assert_int_equal(resolve("a.gguf", out), 0);
    assert_string_equal(out, at("loras/a.gguf"));
    assert_int_equal(resolve("sub/b.gguf", out), 0);
    assert_string_equal(out, at("loras/sub/b.gguf"));
    assert_int_equal(resolve("./sub//b.gguf", out), 0);
    assert_string_equal(out, at("loras/sub/b.gguf"));
    assert_int_equal(resolve(at("loras/a.gguf"), out), 0);  // absolute, inside
    assert_string_equal(out, at("loras/a.gguf"));
    assert_int_equal(resolve("alias.gguf", out), 0);  // a symlink that stays inside
    assert_string_equal(out, at("loras/a.gguf"));
    assert_int_equal(resolve("peft", out), 0);  // a PEFT directory
    assert_string_equal(out, at("loras/peft"));
    assert_int_equal(resolve(at("loras-link/a.gguf"), out), 0);  // written outside, resolves in
    assert_string_equal(out, at("loras/a.gguf"));
}

static void test_lora_path_refuses_dotdot(void **state) {
    (void)state;
    char out[PATH_MAX];
    assert_int_equal(resolve("../outside.gguf", out), ERR_INVAL);
    assert_int_equal(resolve("sub/../a.gguf", out), ERR_INVAL);  // even one that stays inside
    assert_int_equal(resolve("sub/..", out), ERR_INVAL);
    assert_int_equal(resolve(at("loras/../outside.gguf"), out), ERR_INVAL);
    assert_int_equal(resolve("", out), ERR_INVAL);
    // Names that only contain dots are names.
    assert_int_equal(resolve("...gguf", out), ERR_NOTFOUND);
}

static void test_lora_path_refuses_the_outside(void **state) {
    (void)state;
    char out[PATH_MAX];
    assert_int_equal(resolve("/etc/passwd", out), ERR_PERM);
    assert_int_equal(resolve(at("outside.gguf"), out), ERR_PERM);
    assert_int_equal(resolve("etc/passwd", out), ERR_PERM);     // a symlinked directory out
    assert_int_equal(resolve("out.gguf", out), ERR_PERM);       // a symlinked file out
    assert_int_equal(resolve("peft-evil", out), ERR_PERM);      // a symlink inside a PEFT dir
    assert_int_equal(resolve(at("loras-old/c.gguf"), out), ERR_PERM);  // a prefix, not a parent
    assert_int_equal(resolve(root, out), ERR_PERM);
    assert_int_equal(resolve("/", out), ERR_PERM);
}

static void test_lora_path_says_the_same_for_missing_outside(void **state) {
    (void)state;
    char out[PATH_MAX];
    // Outside: 403 whether the file exists or not (no probing of the disk).
    assert_int_equal(resolve("/etc/no-such-file-here", out), ERR_PERM);
    assert_int_equal(resolve(at("no-such.gguf"), out), ERR_PERM);
    // Inside: missing is missing.
    assert_int_equal(resolve("no-such.gguf", out), ERR_NOTFOUND);
    assert_int_equal(resolve("a.gguf/x", out), ERR_NOTFOUND);  // through a file
}

static void test_lora_path_dir_needs_a_directory(void **state) {
    (void)state;
    char out[PATH_MAX];
    char msg[256];
    assert_int_equal(lora_path_dir(at("nope"), out, sizeof(out), msg, sizeof(msg)), ERR_NOTFOUND);
    assert_int_equal(lora_path_dir(at("loras/a.gguf"), out, sizeof(out), msg, sizeof(msg)),
                     ERR_INVAL);
    assert_int_equal(lora_path_dir(at("loras-link"), out, sizeof(out), msg, sizeof(msg)), 0);
    assert_string_equal(out, at("loras"));  // canonical
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lora_path_takes_what_is_inside),
        cmocka_unit_test(test_lora_path_refuses_dotdot),
        cmocka_unit_test(test_lora_path_refuses_the_outside),
        cmocka_unit_test(test_lora_path_says_the_same_for_missing_outside),
        cmocka_unit_test(test_lora_path_dir_needs_a_directory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
