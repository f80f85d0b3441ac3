/*
 * test_progress.c - the progress of long work as a user sees it: loading a
 * model (generate), `quantize`, `perplexity` and `batch`, each run once with
 * stderr on a pseudo-terminal of 80 columns (a bar redrawn in place with
 * "\r", never wider than the terminal, ended by a newline) and once with
 * stderr on a pipe (plain log lines only: no "\r", no escape sequences, and
 * the "done" line of engine/base/progress.h). The oracle is the terminal's
 * side of the contract: what an 80-column terminal shows without wrapping.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "tests/helpers/testutil.h"

#define COLS 80

/* Runs argv with stdout on /dev/null and stderr on a new pseudo-terminal of
 * COLS columns (is_tty) or a pipe; returns what stderr got (malloc'd) and
 * the exit status in *status. */
static char *run(char *const argv[], bool is_tty, int *status) {
    int rd = -1, wr_fd = -1;
    char slave_name[128] = {0};
    if (is_tty) {
        rd = posix_openpt(O_RDWR | O_NOCTTY);
        assert_true(rd >= 0);
        assert_int_equal(grantpt(rd), 0);
        assert_int_equal(unlockpt(rd), 0);
        assert_int_equal(ptsname_r(rd, slave_name, sizeof(slave_name)), 0);
        struct winsize ws = {.ws_row = 24, .ws_col = COLS};
        assert_int_equal(ioctl(rd, TIOCSWINSZ, &ws), 0);
    } else {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        rd = fds[0];
        wr_fd = fds[1];
    }
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int err_fd = wr_fd;
        if (is_tty) {
            setsid();
            err_fd = open(slave_name, O_RDWR);  // becomes the controlling terminal
            if (err_fd < 0) _exit(126);
            struct termios t;
            if (tcgetattr(err_fd, &t) == 0) {
                t.c_oflag &= ~(tcflag_t)ONLCR;  // keep "\n" as written
                tcsetattr(err_fd, TCSANOW, &t);
            }
        }
        int null_fd = open("/dev/null", O_RDWR);
        dup2(null_fd, 0);
        dup2(null_fd, 1);
        dup2(err_fd, 2);
        close(rd);
        setenv("TERM", "xterm", 1);
        execv(argv[0], argv);
        _exit(127);
    }
    if (wr_fd >= 0) close(wr_fd);
    size_t len = 0, cap = 1 << 16;
    char *out = malloc(cap);
    assert_non_null(out);
    for (;;) {
        if (cap - len < 4096) {
            cap *= 2;
            out = realloc(out, cap);
            assert_non_null(out);
        }
        ssize_t n = read(rd, out + len, cap - len - 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // EOF of the pipe, EIO of the pty once the child is gone
        len += (size_t)n;
    }
    out[len] = 0;
    close(rd);
    assert_int_equal(waitpid(pid, status, 0), pid);
    return out;
}

/* Checks a terminal run: bars labelled `what` were drawn, each starting
 * with "\r" and ending with "\033[K" (erase the rest of the line), none
 * wider than COLS - 1 (so none wraps); the last at 100% with "in <time>" in
 * place of the ETA, then a newline. */
static void check_bar(const char *out, const char *what) {
    char head[64];
    snprintf(head, sizeof(head), "\r%s [", what);
    const char *last = NULL;
    int n_bars = 0;
    for (const char *p = strstr(out, head); p; p = strstr(p + 1, head)) {
        const char *end = strstr(p, "\033[K");
        assert_non_null(end);
        assert_true(end - (p + 1) <= COLS - 1);
        assert_null(memchr(p + 1, '\r', (size_t)(end - (p + 1))));
        assert_null(memchr(p + 1, '\n', (size_t)(end - (p + 1))));
        last = p;
        n_bars++;
    }
    assert_true(n_bars >= 2);  // the 0% bar at the start and the final one at least
    char final[256];
    snprintf(final, sizeof(final), "%.*s", (int)(strstr(last, "\033[K") - last), last);
    assert_non_null(strstr(final, "] 100% "));
    assert_non_null(strstr(final, " in "));
    assert_int_equal(strstr(last, "\033[K")[3], '\n');
}

/* A pipe run: no carriage return or escape sequence anywhere, and the log
 * line "INFO  <what>: done ". */
static void check_log(const char *out, const char *what) {
    assert_null(strchr(out, '\r'));
    assert_null(strchr(out, '\033'));
    char done[64];
    snprintf(done, sizeof(done), "INFO  %s: done ", what);
    assert_non_null(strstr(out, done));
}

/* f16 weights: loading packs them into panels, the work the load bar shows. */
/* run() that asserts a zero exit status. */
static char *run_ok(char *const argv[], bool is_tty) {
    int st;
    char *out = run(argv, is_tty, &st);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return out;
}

static const char *model(void) {
    return testutil_path(testutil_build_dir(), "tests/models/llama-f16-tied.gguf");
}

static void test_progress_load_bar_and_log(void **state) {
    (void)state;
    char *argv[] = {
        getenv("LLMSERVE_BIN"), "generate", "-m", (char *)model(), "-p", "Once", "-n", "2",
        "--log-level",          "info",     NULL};
    char *out = run_ok(argv, true);
    check_bar(out, "load");
    free(out);
    out = run_ok(argv, false);
    check_log(out, "load");
    assert_non_null(strstr(out, " MiB in "));
    free(out);
}

static void test_progress_quantize_bar_and_log(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/progress-q8_0.gguf", testutil_build_dir());
    char *argv[] = {getenv("LLMSERVE_BIN"), "quantize", (char *)model(), path, "q8_0", NULL};
    char *out = run_ok(argv, true);
    check_bar(out, "quantize");
    // the per-tensor log lines erase the bar first, so each starts a clean line
    assert_non_null(strstr(out, "\r\033[K20"));
    free(out);
    out = run_ok(argv, false);
    check_log(out, "quantize");
    free(out);
    remove(path);
}

static void test_progress_perplexity_bar_and_log(void **state) {
    (void)state;
    char text[512];
    snprintf(text, sizeof(text), "%s/docs/data/stories.txt", testutil_source_dir());
    char *argv[] = {getenv("LLMSERVE_BIN"),
                    "perplexity",
                    "-m",
                    (char *)model(),
                    "--text",
                    text,
                    "--ctx",
                    "32",
                    "--windows",
                    "3",
                    "-t",
                    "1",
                    NULL};
    char *out = run_ok(argv, true);
    check_bar(out, "perplexity");
    // the per-window lines are printed above the bar, whole
    assert_non_null(strstr(out, "\r\033[Kperplexity: window 3/3 ppl "));
    assert_non_null(strstr(out, "96/96 tok"));  // 3 windows of 32
    free(out);
    out = run_ok(argv, false);
    check_log(out, "perplexity");
    assert_non_null(strstr(out, "\nperplexity: window 3/3 ppl "));
    assert_non_null(strstr(out, "done 96 tok in "));
    free(out);
}

static void test_progress_batch_bar_and_log(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/progress-prompts.jsonl", testutil_build_dir());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 5; i++) fprintf(f, "{\"prompt\": \"Once %d\", \"max_tokens\": 3}\n", i);
    fclose(f);
    char *argv[] = {
        getenv("LLMSERVE_BIN"), "batch", "-m", (char *)model(), "--prompts", path, NULL};
    char *out = run_ok(argv, true);
    check_bar(out, "batch");
    assert_non_null(strstr(out, "] 100% 5/5 req "));
    free(out);
    out = run_ok(argv, false);
    check_log(out, "batch");
    assert_non_null(strstr(out, "done 5 req in "));
    free(out);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_load_bar_and_log),
        cmocka_unit_test(test_progress_quantize_bar_and_log),
        cmocka_unit_test(test_progress_perplexity_bar_and_log),
        cmocka_unit_test(test_progress_batch_bar_and_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
