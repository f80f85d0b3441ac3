/*
 * fault.c - LLMSERVE_FAULT: allocation failures injected for tests, and
 * LLMSERVE_FAULT_GATE, the gate that holds an adapter load in progress.
 */
#define LOG_TAG "fault"
#include "engine/base/fault.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/base/log.h"

static const char *const site_names[FAULT_SITE_COUNT] = {"kv", "adapter", "parse", "tools"};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int64_t fail_at[FAULT_SITE_COUNT];       // 0: never; written once, under `once`
static atomic_llong n_calls[FAULT_SITE_COUNT];

/* Parses "SITE:N[,SITE:N]..." into fail_at; anything else is ignored. */
static void read_env(void) {
    const char *spec = getenv("LLMSERVE_FAULT");
    if (!spec || !spec[0]) return;
    for (const char *p = spec; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        int site = -1;
        for (int s = 0; colon && s < FAULT_SITE_COUNT; s++) {
            size_t n = strlen(site_names[s]);
            if ((size_t)(colon - p) == n && memcmp(p, site_names[s], n) == 0) site = s;
        }
        char *num_end = NULL;
        long long n = colon ? strtoll(colon + 1, &num_end, 10) : 0;
        if (site < 0 || n < 1 || num_end != p + len) {
            LOG_WARN("LLMSERVE_FAULT: '%.*s' is not SITE:N (kv, adapter, parse, tools; "
                     "N >= 1); ignored", (int)len, p);
        } else {
            fail_at[site] = n;
            LOG_WARN("LLMSERVE_FAULT: allocation %lld at %s will fail (a test hook)", n,
                     site_names[site]);
        }
        if (!end) break;
        p = end + 1;
    }
}

bool fault_hit(enum fault_site site) {
    pthread_once(&once, read_env);
    long long n = atomic_fetch_add_explicit(&n_calls[site], 1, memory_order_relaxed) + 1;
    return fail_at[site] != 0 && n == fail_at[site];
}

void *fault_malloc(enum fault_site site, size_t n) {
    return fault_hit(site) ? NULL : malloc(n);
}

void *fault_calloc(enum fault_site site, size_t count, size_t size) {
    return fault_hit(site) ? NULL : calloc(count, size);
}

void fault_gate(int dir_fd) {
    const char *name = getenv("LLMSERVE_FAULT_GATE");
    if (!name || !name[0] || strchr(name, '/')) return;
    struct stat st;
    if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISFIFO(st.st_mode)) return;
    LOG_WARN("LLMSERVE_FAULT_GATE: waiting on the FIFO '%s' (a test hook)", name);
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);  // blocks for a writer
    if (fd < 0) return;
    char buf[64];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
}
