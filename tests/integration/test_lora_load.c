/*
 * test_lora_load.c - runtime adapter loads (POST /v1/load_lora_adapter) on
 * the real `llmserve serve`: the load runs on the loader thread, so while it
 * is in progress every other request is served and streams run start to
 * finish; a second load of the same name gets 409 at once; loads of many
 * names at once all land; an unload cancels a queued load; a client that goes
 * away mid-load does not stop its adapter from landing; SIGTERM answers
 * queued loads (503), waits for the running one within the grace period, and
 * gives up on one that does not end (503, exit 0, no leak under ASan).
 *
 * Ordering, never timing: a load "in progress" is held there by a gate. The
 * server runs with LLMSERVE_FAULT_GATE=gate (engine/base/fault.h), and the
 * gated adapter directory holds only a FIFO named gate, so the loader thread
 * blocks in open(2) until the test opens the FIFO for writing; the load then
 * fails (no adapter_config.json: 400 lora_load_failed). Everything the
 * test does before it opens the gate happens, by construction, while the load
 * is in progress; a server that loaded on its HTTP thread would answer none
 * of it (every read here has a receive timeout, so such a server fails the
 * test instead of hanging it). Loads queue behind the gated one in order,
 * which holds real adapters (tests/models: mklora output, one of them rank
 * 1024, 7.3 MiB) "queued" for as long as the test needs.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/helpers/testutil.h"
#include "tests/integration/httptest.h"

enum { N_POLLS = 6000, POLL_MS = 10, RECV_TIMEOUT_S = 60 };

static struct httptest_server srv;

/* An adapter of tests/models for llama-f32: NAME/ (a directory) or NAME.gguf. */
static const char *adapter(const char *name) {
    static char paths[16][4096];  // a ring: callers keep a few at once
    static int next;
    const char *p = testutil_adapter_path(name, paths[next++ % 16], sizeof(paths[0]));
    if (!testutil_exists(p)) fail_msg("no adapter %s in tests/models", name);
    return p;
}

/* Serve arguments: runtime loads on, confined to the build's tests/ (the
 * adapters of tests/models and the gates below), then extra. */
static const char *runtime_args(const char *extra) {
    static char args[8192];
    snprintf(args, sizeof(args), "--allow-runtime-lora --lora-dir %s/tests %s",
             testutil_build_dir(), extra);
    return args;
}

/* ---- the gate ------------------------------------------------------------------ */

#define GATE_NAME "gate"  // LLMSERVE_FAULT_GATE, set in main for every server

struct gate {
    char dir[4096];
    char fifo[4200];
};

static void gate_make(struct gate *g, const char *tag) {
    snprintf(g->dir, sizeof(g->dir), "%s/tests/integration/gate-%s-%d", testutil_build_dir(), tag,
             (int)getpid());
    snprintf(g->fifo, sizeof(g->fifo), "%s/" GATE_NAME, g->dir);
    unlink(g->fifo);
    rmdir(g->dir);
    assert_int_equal(mkdir(g->dir, 0755), 0);
    assert_int_equal(mkfifo(g->fifo, 0644), 0);
}

/* Lets the gated load through: opens the FIFO for writing once the loader
 * has it open for reading (ENXIO until then), and closes it again. */
static void gate_open(struct gate *g) {
    for (int i = 0; i < N_POLLS; i++) {
        int fd = open(g->fifo, O_WRONLY | O_NONBLOCK);
        if (fd >= 0) {
            close(fd);
            return;
        }
        if (errno != ENXIO) fail_msg("open %s: %s", g->fifo, strerror(errno));
        httptest_sleep_ms(POLL_MS);
    }
    fail_msg("the loader never opened %s", g->fifo);
}

static void gate_remove(struct gate *g) {
    unlink(g->fifo);
    rmdir(g->dir);
}

/* ---- HTTP with bounded reads --------------------------------------------------------- */

/* Sends a request; reads on the socket give up after RECV_TIMEOUT_S. */
static int send_req(int port, const char *method, const char *path, const char *body) {
    int fd = httptest_send(port, method, path, NULL, body);
    assert_true(fd >= 0);
    struct timeval tv = {.tv_sec = RECV_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Reads the answer on fd; fails when there is none (a blocked server). */
static int recv_resp(int fd, int want, struct httptest_resp *out, const char *what) {
    int st = httptest_recv(fd, out);
    if (st == 0) fail_msg("%s: no answer (is the HTTP thread blocked?)", what);
    if (want && st != want) fail_msg("%s: status %d, want %d: %s", what, st, want, out->body);
    if (st >= 400 && !httptest_is_openai_error(out->body))
        fail_msg("%s: not an OpenAI error: %s", what, out->body);
    return st;
}

static void request(int port, const char *method, const char *path, const char *body, int want,
                    struct httptest_resp *out, const char *what) {
    recv_resp(send_req(port, method, path, body), want, out, what);
}

static void expect_code(const struct httptest_resp *r, const char *code) {
    char *c = httptest_json_str(r->body, "code");
    if (!c || strcmp(c, code) != 0) fail_msg("code %s, want %s: %s", c ? c : "null", code, r->body);
    free(c);
}

/* Whether fd has nothing to read yet (no answer, no close). */
static bool is_unanswered(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 0;
}

static int send_load(int port, const char *name, const char *path) {
    char body[8192];
    snprintf(body, sizeof(body), "{\"lora_name\":\"%s\",\"lora_path\":\"%s\"}", name, path);
    return send_req(port, "POST", "/v1/load_lora_adapter", body);
}

static void unload(int port, const char *name, int want) {
    char body[256];
    snprintf(body, sizeof(body), "{\"lora_name\":\"%s\"}", name);
    struct httptest_resp r;
    request(port, "POST", "/v1/unload_lora_adapter", body, want, &r, "unload");
    httptest_resp_free(&r);
}

/* One sample of /metrics (a bounded read, as everything here). */
static double metric(int port, const char *name) {
    struct httptest_resp r;
    request(port, "GET", "/metrics", NULL, 200, &r, "metrics");
    double v = httptest_metric(r.body, name);
    httptest_resp_free(&r);
    return v;
}

/* Waits (bounded polls) until the metric has the value. */
static void wait_metric(int port, const char *name, double value) {
    double v = -1;
    for (int i = 0; i < N_POLLS; i++) {
        v = metric(port, name);
        if (v == value) return;
        httptest_sleep_ms(POLL_MS);
    }
    fail_msg("%s stayed %g, want %g", name, v, value);
}

static bool is_listed(int port, const char *name) {
    struct httptest_resp r;
    request(port, "GET", "/v1/models", NULL, 200, &r, "models");
    char pat[256];
    snprintf(pat, sizeof(pat), "\"id\":\"%s\"", name);
    bool listed = strstr(r.body, pat) != NULL;
    httptest_resp_free(&r);
    return listed;
}

static const char STREAM_BODY[] =
    "{\"prompt\":[1,5,6,7,8],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,"
    "\"stream\":true%s%s%s}";

static int send_stream(int port, int max_tokens, const char *model) {
    char body[512];
    snprintf(body, sizeof(body), STREAM_BODY, max_tokens, model ? ",\"model\":\"" : "",
             model ? model : "", model ? "\"" : "");
    return send_req(port, "POST", "/v1/completions", body);
}

/* Reads a whole stream; it must end with a finish_reason and [DONE]. */
static void expect_stream_done(int fd, const char *what) {
    struct httptest_resp r;
    recv_resp(fd, 200, &r, what);
    int n = 0;
    char **ev = httptest_sse_events(r.body, &n);
    if (n < 2 || strcmp(ev[n - 1], "[DONE]") != 0) fail_msg("%s: no [DONE]: %s", what, r.body);
    char *fr = httptest_json_str(ev[n - 2], "finish_reason");
    assert_non_null(fr);
    assert_string_equal(fr, "length");
    free(fr);
    httptest_events_free(ev, n);
    httptest_resp_free(&r);
}

/* A stream read in two parts: raw bytes up to some events, then to the end. */
struct raw {
    int fd;
    char *data;
    size_t len;
    size_t cap;
};

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* Reads until `needle` occurs n times (or EOF: false). */
static bool raw_read(struct raw *rw, const char *needle, int n) {
    for (;;) {
        if (rw->data && needle && count(rw->data, needle) >= n) return true;
        if (rw->len + 4097 > rw->cap) {
            rw->cap = rw->cap ? rw->cap * 2 : 1 << 16;
            rw->data = realloc(rw->data, rw->cap);
            assert_non_null(rw->data);
        }
        ssize_t k = read(rw->fd, rw->data + rw->len, 4096);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        rw->len += (size_t)k;
        rw->data[rw->len] = '\0';
    }
}

/* ---- the shared server ------------------------------------------------------------- */

static int group_setup(void **state) {
    (void)state;
    httptest_start(&srv, httptest_model("llama-f32"), runtime_args("--max-loras 2"));
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    assert_int_equal(httptest_stop(&srv, SIGTERM), 0);
    return 0;
}

/* While a load is in progress (gated) and another waits behind it, the HTTP
 * thread serves everything: health checks, a completion, a whole stream, the
 * first event of another stream (read to its end after the load), a second
 * load of the same name (409 at once), /v1/models (which lists neither), a
 * request for the adapter being loaded (404). Only then does the gate open:
 * the gated load fails on its FIFO (400), the large one behind it lands (200). */
static void test_lora_load_other_requests_go_on_while_loading(void **state) {
    (void)state;
    const int port = srv.port;
    struct gate g;
    gate_make(&g, "busy");
    int fd_gated = send_load(port, "gated", g.dir);
    wait_metric(port, "llmserve_lora_loads_running", 1);
    int fd_big = send_load(port, "big", adapter("llama-big"));
    wait_metric(port, "llmserve_lora_loads_queued", 1);

    struct httptest_resp r;
    for (int i = 0; i < 3; i++) {
        request(port, "GET", "/health", NULL, 200, &r, "health");
        httptest_resp_free(&r);
    }
    request(port, "POST", "/v1/completions",
            "{\"prompt\":[1,5,6,7,8],\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}", 200,
            &r, "completion");
    httptest_resp_free(&r);
    expect_stream_done(send_stream(port, 16, NULL), "stream during the load");
    struct raw long_stream = {.fd = send_stream(port, 64, NULL)};
    struct timeval tv = {.tv_sec = RECV_TIMEOUT_S};
    setsockopt(long_stream.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    // Its first event arrives during the load. (How many more do depends on
    // how fast tokens come: the server sends what has piled up as one event.)
    if (!raw_read(&long_stream, "data: ", 1)) fail_msg("the stream begun mid-load stalled");

    char body[8192];
    snprintf(body, sizeof(body), "{\"lora_name\":\"gated\",\"lora_path\":\"%s\"}",
             adapter("llama-peft"));
    request(port, "POST", "/v1/load_lora_adapter", body, 409, &r, "second load of the name");
    expect_code(&r, "lora_loading");
    httptest_resp_free(&r);
    snprintf(body, sizeof(body), "{\"lora_name\":\"big\",\"lora_path\":\"%s\"}",
             adapter("llama-peft"));
    request(port, "POST", "/v1/load_lora_adapter", body, 409, &r, "load of a queued name");
    expect_code(&r, "lora_loading");
    httptest_resp_free(&r);
    assert_false(is_listed(port, "gated"));
    assert_false(is_listed(port, "big"));
    request(port, "POST", "/v1/completions", "{\"model\":\"big\",\"prompt\":\"x\"}", 404, &r,
            "a request for an adapter still loading");
    expect_code(&r, "model_not_found");
    httptest_resp_free(&r);
    assert_true(is_unanswered(fd_gated));
    assert_true(is_unanswered(fd_big));

    gate_open(&g);
    recv_resp(fd_gated, 400, &r, "the gated load");
    expect_code(&r, "lora_load_failed");
    assert_non_null(strstr(r.body, "gated"));
    httptest_resp_free(&r);
    recv_resp(fd_big, 200, &r, "the large load");
    char *id = httptest_json_str(r.body, "id");
    char *format = httptest_json_str(r.body, "format");
    assert_string_equal(id, "big");
    assert_string_equal(format, "gguf");
    assert_int_equal(httptest_json_int(r.body, "rank", 0), 1024);
    free(id);
    free(format);
    httptest_resp_free(&r);
    assert_true(is_listed(port, "big"));
    assert_false(is_listed(port, "gated"));
    // The stream begun during the load ends normally.
    raw_read(&long_stream, NULL, 0);
    close(long_stream.fd);
    assert_non_null(strstr(long_stream.data, "data: [DONE]"));
    free(long_stream.data);
    wait_metric(port, "llmserve_lora_loads_running", 0);
    unload(port, "big", 200);
    gate_remove(&g);
}

/* Loads of several names at once (and one name twice) are all answered; the
 * distinct names all land and serve requests. */
static void test_lora_load_concurrent_loads(void **state) {
    (void)state;
    const int port = srv.port;
    const char *names[5] = {"c1", "c2", "c3", "c4", "c1"};
    const char *paths[5] = {adapter("llama-peft"), adapter("llama-gguf-f16"), adapter("llama-bn"),
                            adapter("llama-peft")};
    paths[4] = adapter("llama-gguf-f16");
    int fds[5];
    for (int i = 0; i < 5; i++) fds[i] = send_load(port, names[i], paths[i]);
    int status[5];
    for (int i = 0; i < 5; i++) {
        struct httptest_resp r;
        status[i] = recv_resp(fds[i], 0, &r, names[i]);
        if (status[i] == 409) {
            char *code = httptest_json_str(r.body, "code");
            assert_true(strcmp(code, "lora_loading") == 0 || strcmp(code, "lora_exists") == 0);
            free(code);
        }
        httptest_resp_free(&r);
    }
    for (int i = 1; i < 4; i++) assert_int_equal(status[i], 200);
    // Of the two loads of c1, exactly one won.
    assert_true((status[0] == 200 && status[4] == 409) || (status[0] == 409 && status[4] == 200));
    for (int i = 0; i < 4; i++) assert_true(is_listed(port, names[i]));
    struct httptest_resp r;
    request(port, "POST", "/v1/completions",
            "{\"model\":\"c3\",\"prompt\":[1,5,6],\"max_tokens\":4,\"ignore_eos\":true}", 200, &r,
            "a request for a loaded adapter");
    httptest_resp_free(&r);
    assert_int_equal(metric(port, "llmserve_lora_adapters"), 4);
    for (int i = 0; i < 4; i++) unload(port, names[i], 200);
}

/* An unload of a name whose load waits in the queue cancels it (409 for its
 * client, nothing listed); an unload of the name being loaded drops it too
 * (its client hears the load's own failure here: the gate's FIFO). Either
 * name can be loaded again afterwards. */
static void test_lora_load_unload_while_loading(void **state) {
    (void)state;
    const int port = srv.port;
    struct gate g;
    gate_make(&g, "unload");
    int fd_gated = send_load(port, "gated", g.dir);
    wait_metric(port, "llmserve_lora_loads_running", 1);
    int fd_q = send_load(port, "q", adapter("llama-peft"));
    wait_metric(port, "llmserve_lora_loads_queued", 1);
    unload(port, "q", 200);
    unload(port, "gated", 200);
    unload(port, "q", 404);
    assert_true(is_unanswered(fd_q));
    gate_open(&g);
    struct httptest_resp r;
    recv_resp(fd_gated, 400, &r, "the gated load");
    expect_code(&r, "lora_load_failed");
    httptest_resp_free(&r);
    recv_resp(fd_q, 409, &r, "the canceled load");
    expect_code(&r, "lora_load_canceled");
    httptest_resp_free(&r);
    wait_metric(port, "llmserve_lora_loads_running", 0);
    assert_false(is_listed(port, "q"));
    assert_int_equal(metric(port, "llmserve_lora_adapters"), 0);
    recv_resp(send_load(port, "q", adapter("llama-peft")), 200, &r, "q again");
    httptest_resp_free(&r);
    unload(port, "q", 200);
    gate_remove(&g);
}

/* Clients that go away while their loads are in progress or queued: the
 * server notices (their connections are answered and closed), the loads go
 * on, and the adapter lands anyway. */
static void test_lora_load_client_disconnects(void **state) {
    (void)state;
    const int port = srv.port;
    struct gate g;
    gate_make(&g, "gone");
    int fd_gated = send_load(port, "gated", g.dir);
    wait_metric(port, "llmserve_lora_loads_running", 1);
    int fd_x = send_load(port, "x", adapter("llama-gguf-f16"));
    wait_metric(port, "llmserve_lora_loads_queued", 1);
    close(fd_gated);
    close(fd_x);
    // The server finds both peers gone (http.c's ticker) and ends their
    // requests: the /metrics request is the only one left in progress.
    wait_metric(port, "llmserve_http_requests_in_progress", 1);
    assert_int_equal(metric(port, "llmserve_lora_loads_running"), 1);
    assert_int_equal(metric(port, "llmserve_lora_loads_queued"), 1);
    gate_open(&g);
    wait_metric(port, "llmserve_lora_adapters", 1);
    assert_true(is_listed(port, "x"));
    struct httptest_resp r;
    request(port, "POST", "/v1/completions",
            "{\"model\":\"x\",\"prompt\":[1,5,6],\"max_tokens\":4,\"ignore_eos\":true}", 200, &r,
            "the adapter whose client left");
    httptest_resp_free(&r);
    unload(port, "x", 200);
    gate_remove(&g);
}

/* ---- shutdown --------------------------------------------------------------------- */

/* Waits (bounded) for the server to exit; returns its exit status. */
static int wait_exit(struct httptest_server *s) {
    for (int i = 0; i < N_POLLS; i++) {
        int st = 0;
        pid_t p = waitpid(s->pid, &st, WNOHANG);
        if (p == s->pid) {
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        httptest_sleep_ms(POLL_MS);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    fail_msg("the server did not exit after SIGTERM; see %s", s->log_path);
    return -1;
}

static void expect_log(const struct httptest_server *s, const char *text) {
    char *log = testutil_read_file(s->log_path, NULL);
    assert_non_null(log);
    if (!strstr(log, text)) fail_msg("the log has no '%s': %s", text, log);
    free(log);
}

/* SIGTERM with a load running and one queued: the queued one is answered 503
 * at once, the running one may finish (its client gets its answer), then the
 * server exits 0. */
static void test_lora_load_sigterm_waits_for_the_running_load(void **state) {
    (void)state;
    struct httptest_server s;
    httptest_start(&s, httptest_model("llama-f32"), runtime_args("--shutdown-grace 120"));
    struct gate g;
    gate_make(&g, "term");
    int fd_gated = send_load(s.port, "gated", g.dir);
    wait_metric(s.port, "llmserve_lora_loads_running", 1);
    int fd_x = send_load(s.port, "x", adapter("llama-big"));
    wait_metric(s.port, "llmserve_lora_loads_queued", 1);
    kill(s.pid, SIGTERM);
    struct httptest_resp r;
    recv_resp(fd_x, 503, &r, "the queued load at shutdown");
    httptest_resp_free(&r);
    assert_true(is_unanswered(fd_gated));
    gate_open(&g);
    recv_resp(fd_gated, 400, &r, "the running load at shutdown");
    expect_code(&r, "lora_load_failed");
    httptest_resp_free(&r);
    assert_int_equal(wait_exit(&s), 0);
    expect_log(&s, "stopped");
    gate_remove(&g);
}

/* SIGTERM with a load that never ends (its gate stays shut): after the grace
 * period its client is answered 503 and the server exits 0 (under ASan: with
 * no leak reported) instead of hanging. */
static void test_lora_load_sigterm_gives_up_on_a_stuck_load(void **state) {
    (void)state;
    struct httptest_server s;
    httptest_start(&s, httptest_model("llama-f32"), runtime_args("--shutdown-grace 1"));
    struct gate g;
    gate_make(&g, "stuck");
    int fd_gated = send_load(s.port, "gated", g.dir);
    wait_metric(s.port, "llmserve_lora_loads_running", 1);
    kill(s.pid, SIGTERM);
    struct httptest_resp r;
    recv_resp(fd_gated, 503, &r, "the stuck load at shutdown");
    httptest_resp_free(&r);
    assert_int_equal(wait_exit(&s), 0);
    expect_log(&s, "exiting with an adapter load still running");
    gate_remove(&g);
}

int main(void) {
    setenv("LLMSERVE_FAULT_GATE", GATE_NAME, 1);  // the servers started below inherit it
    const struct CMUnitTest shared[] = {
        cmocka_unit_test(test_lora_load_other_requests_go_on_while_loading),
        cmocka_unit_test(test_lora_load_concurrent_loads),
        cmocka_unit_test(test_lora_load_unload_while_loading),
        cmocka_unit_test(test_lora_load_client_disconnects),
    };
    const struct CMUnitTest alone[] = {
        cmocka_unit_test(test_lora_load_sigterm_waits_for_the_running_load),
        cmocka_unit_test(test_lora_load_sigterm_gives_up_on_a_stuck_load),
    };
    int fails = cmocka_run_group_tests_name("lora_load", shared, group_setup, group_teardown);
    fails += cmocka_run_group_tests_name("lora_load_alone", alone, NULL, NULL);
    return fails;
}
