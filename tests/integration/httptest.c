/*
 * httptest.c - see httptest.h.
 */
#define _POSIX_C_SOURCE 200809L
#include "tests/integration/httptest.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/helpers/testutil.h"

void httptest_sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

const char *httptest_bin(void) {
    const char *b = getenv("LLMSERVE_BIN");
    assert_non_null(b);
    return b;
}

const char *httptest_model(const char *name) {
    static char path[4096];
    snprintf(path, sizeof(path), "%s/tests/models/%s.gguf", testutil_build_dir(), name);
    return path;
}

/* A port the kernel just handed out; the server binds it right after. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t len = sizeof(a);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

void httptest_start(struct httptest_server *s, const char *model, const char *extra_args) {
    httptest_start_port(s, model, 0, extra_args);
}

void httptest_start_port(struct httptest_server *s, const char *model, int port_wanted,
                         const char *extra_args) {
    signal(SIGPIPE, SIG_IGN);  // a test writing to a closed socket gets EPIPE instead
    memset(s, 0, sizeof(*s));
    for (int attempt = 0; attempt < 5; attempt++) {
        s->port = port_wanted ? port_wanted : free_port();
        snprintf(s->log_path, sizeof(s->log_path), "%s/tests/integration/serve-%d.log",
                 testutil_build_dir(), s->port);
        char args[2048];
        snprintf(args, sizeof(args), "%s", extra_args ? extra_args : "");
        char port[16];
        snprintf(port, sizeof(port), "%d", s->port);
        // LLMSERVE_LAUNCH (e.g. "mpirun -np 2 ..."), split on spaces, runs before the binary.
        char launch[1024];
        snprintf(launch, sizeof(launch), "%s", getenv("LLMSERVE_LAUNCH") ? getenv("LLMSERVE_LAUNCH")
                                                                        : "");
        char *argv[96];
        int argc = 0;
        for (char *t = strtok(launch, " "); t && argc < 32; t = strtok(NULL, " ")) argv[argc++] = t;
        const char *fixed[] = {httptest_bin(), "serve", "-m", model, "--port", port, "--threads",
                               "1"};
        for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
            argv[argc++] = (char *)fixed[i];
        }
        for (char *t = strtok(args, " "); t && argc < 94; t = strtok(NULL, " ")) argv[argc++] = t;
        argv[argc] = NULL;
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            int fd = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) {
                dup2(fd, 2);
                dup2(fd, 1);
                close(fd);
            }
            execvp(argv[0], argv);
            _exit(127);
        }
        s->pid = pid;
        // Up to 60 s for the model to load and the port to open.
        for (int i = 0; i < 1200; i++) {
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                s->pid = 0;
                break;  // exited: port taken meanwhile, or a real failure
            }
            struct httptest_resp r;
            int status = httptest_request(s->port, "GET", "/health", NULL, NULL, &r);
            httptest_resp_free(&r);
            if (status == 200) return;
            httptest_sleep_ms(50);
        }
        if (s->pid) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, NULL, 0);
            s->pid = 0;
        }
    }
    fail_msg("llmserve serve did not become healthy; see %s", s->log_path);
}

int httptest_stop(struct httptest_server *s, int sig) {
    if (!s->pid) return -1;
    if (sig > 0) kill(s->pid, sig);
    int st = 0;
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;  // the server may answer (413) and close before reading all
        p += w;
        n -= (size_t)w;
    }
}

int httptest_send(int port, const char *method, const char *path, const char *extra_headers,
                  const char *body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    size_t body_len = body ? strlen(body) : 0;
    char head[4096];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n%s%s", method,
                     path, port, extra_headers ? extra_headers : "",
                     body ? "Content-Type: application/json\r\n" : "");
    if (body) n += snprintf(head + n, sizeof(head) - (size_t)n, "Content-Length: %zu\r\n", body_len);
    n += snprintf(head + n, sizeof(head) - (size_t)n, "\r\n");
    write_all(fd, head, (size_t)n);
    if (body) write_all(fd, body, body_len);
    return fd;
}

/* Decodes a chunked body in place; returns the decoded length. */
static size_t dechunk(char *b, size_t n) {
    size_t in = 0;
    size_t out = 0;
    while (in < n) {
        char *end = NULL;
        unsigned long len = strtoul(b + in, &end, 16);
        char *crlf = strstr(b + in, "\r\n");
        if (!crlf || end == b + in) break;
        in = (size_t)(crlf - b) + 2;
        if (len == 0 || in + len > n) break;
        memmove(b + out, b + in, len);
        out += len;
        in += len + 2;
    }
    b[out] = '\0';
    return out;
}

int httptest_recv(int fd, struct httptest_resp *out) {
    memset(out, 0, sizeof(*out));
    if (fd < 0) return 0;
    size_t cap = 1 << 16;
    size_t len = 0;
    char *data = malloc(cap);
    assert_non_null(data);
    for (;;) {
        if (len + 4096 > cap) {
            cap *= 2;
            data = realloc(data, cap);
            assert_non_null(data);
        }
        ssize_t r = read(fd, data + len, cap - len - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    data[len] = '\0';
    char *sep = strstr(data, "\r\n\r\n");
    if (!sep || strncmp(data, "HTTP/1.", 7) != 0) {
        free(data);
        return 0;
    }
    out->status = atoi(data + 9);
    size_t head_len = (size_t)(sep - data) + 2;
    out->headers = malloc(head_len + 1);
    assert_non_null(out->headers);
    memcpy(out->headers, data, head_len);
    out->headers[head_len] = '\0';
    size_t body_len = len - head_len - 2;
    out->body = malloc(body_len + 1);
    assert_non_null(out->body);
    memcpy(out->body, sep + 4, body_len);
    out->body[body_len] = '\0';
    out->body_len = body_len;
    char te[64];
    if (httptest_header(out, "Transfer-Encoding", te, sizeof(te)) && strcasecmp(te, "chunked") == 0) {
        out->body_len = dechunk(out->body, body_len);
    }
    free(data);
    return out->status;
}

int httptest_request(int port, const char *method, const char *path, const char *extra_headers,
                     const char *body, struct httptest_resp *out) {
    return httptest_recv(httptest_send(port, method, path, extra_headers, body), out);
}

bool httptest_recv_until(int fd, const char *needle, size_t max) {
    char *data = malloc(max + 1);
    assert_non_null(data);
    size_t len = 0;
    bool seen = false;
    while (len < max && !seen) {
        ssize_t r = read(fd, data + len, max - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        data[len] = '\0';
        seen = strstr(data, needle) != NULL;
    }
    free(data);
    return seen;
}

void httptest_resp_free(struct httptest_resp *r) {
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof(*r));
}

bool httptest_header(const struct httptest_resp *r, const char *name, char *out, size_t n) {
    if (!r->headers) return false;
    size_t nl = strlen(name);
    for (const char *p = strstr(r->headers, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ') v++;
            const char *e = strstr(v, "\r\n");
            size_t vl = e ? (size_t)(e - v) : strlen(v);
            if (vl >= n) vl = n - 1;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return true;
        }
    }
    return false;
}

/* Points at the first character of the value of "key", or NULL. */
static const char *find_value(const char *json, const char *key) {
    char pat[128];
    snprintf(pat, sizeof(pat), "\"%s\"", key);
    for (const char *p = strstr(json, pat); p; p = strstr(p + 1, pat)) {
        const char *v = p + strlen(pat);
        while (*v == ' ') v++;
        if (*v != ':') continue;
        v++;
        while (*v == ' ') v++;
        return v;
    }
    return NULL;
}

static void put_utf8(char **o, uint32_t c) {
    unsigned char *u = (unsigned char *)*o;
    if (c < 0x80) {
        *u++ = (unsigned char)c;
    } else if (c < 0x800) {
        *u++ = (unsigned char)(0xC0 | (c >> 6));
        *u++ = (unsigned char)(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        *u++ = (unsigned char)(0xE0 | (c >> 12));
        *u++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        *u++ = (unsigned char)(0x80 | (c & 0x3F));
    } else {
        *u++ = (unsigned char)(0xF0 | (c >> 18));
        *u++ = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
        *u++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        *u++ = (unsigned char)(0x80 | (c & 0x3F));
    }
    *o = (char *)u;
}

void httptest_no_nul(char *json) {
    for (char *p = json; (p = strstr(p, "\\u0000")) != NULL; p += 6) p[5] = '1';
}

char *httptest_json_str(const char *json, const char *key) {
    const char *v = find_value(json, key);
    if (!v || *v != '"') return NULL;
    v++;
    char *out = malloc(strlen(v) * 2 + 1);  // \uXXXX (6 bytes) -> at most 4
    assert_non_null(out);
    char *o = out;
    while (*v && *v != '"') {
        if (*v != '\\') {
            *o++ = *v++;
            continue;
        }
        v++;
        switch (*v) {
        case 'n': *o++ = '\n'; v++; break;
        case 't': *o++ = '\t'; v++; break;
        case 'r': *o++ = '\r'; v++; break;
        case 'b': *o++ = '\b'; v++; break;
        case 'f': *o++ = '\f'; v++; break;
        case 'u': {
            uint32_t c = (uint32_t)strtoul((char[5]){v[1], v[2], v[3], v[4], 0}, NULL, 16);
            v += 5;
            if (c >= 0xD800 && c < 0xDC00 && v[0] == '\\' && v[1] == 'u') {
                uint32_t lo = (uint32_t)strtoul((char[5]){v[2], v[3], v[4], v[5], 0}, NULL, 16);
                c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
                v += 6;
            }
            put_utf8(&o, c);
            break;
        }
        default: *o++ = *v++; break;  // \" \\ \/
        }
    }
    *o = '\0';
    return out;
}

long long httptest_json_int(const char *json, const char *key, long long def) {
    const char *v = find_value(json, key);
    if (!v || !(*v == '-' || (*v >= '0' && *v <= '9'))) return def;
    return strtoll(v, NULL, 10);
}

bool httptest_is_openai_error(const char *body) {
    if (!body || strncmp(body, "{\"error\":", 9) != 0) return false;
    char *msg = httptest_json_str(body, "message");
    char *type = httptest_json_str(body, "type");
    bool ok = msg && *msg && type && *type && find_value(body, "param") && find_value(body, "code");
    free(msg);
    free(type);
    return ok;
}

double httptest_metric(const char *metrics, const char *name) {
    size_t nl = strlen(name);
    for (const char *p = metrics; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, name, nl) == 0 && p[nl] == ' ') return strtod(p + nl + 1, NULL);
    }
    return -1;
}

double httptest_get_metric(int port, const char *name) {
    struct httptest_resp r;
    double v = -1;
    if (httptest_request(port, "GET", "/metrics", NULL, NULL, &r) == 200) {
        v = httptest_metric(r.body, name);
    }
    httptest_resp_free(&r);
    return v;
}

char **httptest_sse_events(const char *body, int *out_n) {
    int cap = 16;
    int n = 0;
    char **ev = malloc((size_t)cap * sizeof(*ev));
    assert_non_null(ev);
    for (const char *p = body; p && *p;) {
        const char *end = strstr(p, "\n\n");
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (strncmp(p, "data: ", 6) == 0) {
            if (n == cap) {
                cap *= 2;
                ev = realloc(ev, (size_t)cap * sizeof(*ev));
                assert_non_null(ev);
            }
            ev[n] = strndup(p + 6, len - 6);
            assert_non_null(ev[n]);
            n++;
        }
        p = end ? end + 2 : NULL;
    }
    *out_n = n;
    return ev;
}

void httptest_events_free(char **ev, int n) {
    for (int i = 0; i < n; i++) free(ev[i]);
    free(ev);
}

bool httptest_npm_ensure(const char *dir, const char *name, const char *spec) {
    if (testutil_system("command -v node >/dev/null && command -v npm >/dev/null") != 0) {
        print_message("skipped: node or npm is not installed\n");
        return false;
    }
    char cmd[16384];
    snprintf(cmd, sizeof(cmd), "test -f %s/node_modules/%s/package.json", dir, name);
    if (testutil_system(cmd) == 0) return true;
    snprintf(cmd, sizeof(cmd),
             "npm install --silent --no-audit --no-fund --prefix %s %s >%s.log 2>&1", dir, spec,
             dir);
    if (testutil_system(cmd) == 0) return true;
    print_message("skipped: npm could not install %s (registry unreachable?); see %s.log\n",
                  spec, dir);
    return false;
}
