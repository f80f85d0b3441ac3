/*
 * httptest.h - fixtures for the HTTP integration tests: start the real
 * `llmserve serve` on a free loopback port, talk HTTP/1.1 to it over plain
 * sockets, and pick apart its JSON and SSE replies without a JSON library
 * (only the few fields the tests look at).
 *
 * Every wait here is bounded by a number of polls, never asserted on time.
 */
#ifndef TESTS_INTEGRATION_HTTPTEST_H
#define TESTS_INTEGRATION_HTTPTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct httptest_server {
    pid_t pid;
    int port;
    char log_path[4096];   // the server's stderr
};

struct httptest_resp {
    int status;            // 0: no status line (connection failed or reset)
    char *headers;         // owned, NUL-terminated, as received
    char *body;            // owned, NUL-terminated, de-chunked
    size_t body_len;
};

/* The llmserve binary (LLMSERVE_BIN) and <build>/tests/models/NAME.gguf. */
const char *httptest_bin(void);
const char *httptest_model(const char *name);

/* Starts `llmserve serve -m model --port P` plus extra_args (split on spaces;
 * may be NULL) and waits for /health to answer 200. Asserts on failure.
 * With LLMSERVE_LAUNCH set (a command and its arguments, split on spaces,
 * e.g. "mpirun -np 2"), that command runs the binary. */
void httptest_start(struct httptest_server *s, const char *model, const char *extra_args);
/* httptest_start on a given port (0: a free one, as httptest_start). */
void httptest_start_port(struct httptest_server *s, const char *model, int port_wanted,
                         const char *extra_args);

/* Sends sig (if > 0) and waits for the process. Returns its exit status, or
 * -1 when it died of a signal. */
int httptest_stop(struct httptest_server *s, int sig);

/* One request on a new connection (Connection: close). extra_headers is
 * NULL or lines ending in "\r\n". Returns out->status. */
int httptest_request(int port, const char *method, const char *path, const char *extra_headers,
                     const char *body, struct httptest_resp *out);

/* Two halves of httptest_request, for concurrent and partial reads:
 * httptest_send() returns the connected socket (asserts on failure);
 * httptest_recv() reads it to EOF, closes it and returns out->status. */
int httptest_send(int port, const char *method, const char *path, const char *extra_headers,
                  const char *body);
int httptest_recv(int fd, struct httptest_resp *out);

/* Reads from fd until `needle` has been seen (at most max bytes). Returns
 * true when it was seen. For a stream read half-way before a disconnect. */
bool httptest_recv_until(int fd, const char *needle, size_t max);

void httptest_resp_free(struct httptest_resp *r);

/* The value of header name (case-insensitive), copied into out; false if absent. */
bool httptest_header(const struct httptest_resp *r, const char *name, char *out, size_t n);

/* The first string value of "key" at or after json (JSON-unescaped, malloc'd),
 * or NULL. */
char *httptest_json_str(const char *json, const char *key);

/* The synthetic vocabulary is mostly byte tokens, so generated text can hold
 * U+0000, which a C string cannot: its JSON escapes in json become U+0001,
 * in place (do it to every body compared, so comparisons stay exact). */
void httptest_no_nul(char *json);

/* The first integer value of "key", or def. */
long long httptest_json_int(const char *json, const char *key, long long def);

/* True when the body is OpenAI's error shape: {"error": {"message", "type",
 * "param", "code"}}. */
bool httptest_is_openai_error(const char *body);

/* The value of a Prometheus sample `name` (exact, no labels), or -1. */
double httptest_metric(const char *metrics, const char *name);

/* GET /metrics and return one sample (-1 if the request failed). */
double httptest_get_metric(int port, const char *name);

/* SSE: the payloads of the "data: " events in body, in order. *out_n is the
 * count; the array and the strings are malloc'd (free with
 * httptest_events_free). Comment lines are skipped. */
char **httptest_sse_events(const char *body, int *out_n);
void httptest_events_free(char **ev, int n);

/* Makes npm package `name` (installed as `spec`, e.g. "openai@6") available
 * under dir/node_modules, running `npm install --prefix dir` once (its output
 * in dir.log). Returns true when it is there; false, having printed why for
 * the caller's skip(), when node or npm is missing or the install failed. */
bool httptest_npm_ensure(const char *dir, const char *name, const char *spec);

/* Sleeps ms milliseconds (for bounded polling loops only). */
void httptest_sleep_ms(int ms);

#endif // TESTS_INTEGRATION_HTTPTEST_H
