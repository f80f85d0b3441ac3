/*
 * file.c - whole files read into private memory, and the checked cursor.
 */
#define LOG_TAG "file"
#include "engine/base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/base/err.h"
#include "engine/base/log.h"

enum { FILE_READ_CHUNK = 1 << 30 };  // bytes per pread (Linux stops one at 2 GiB)

int file_map(const char *path, struct file_map *out) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        LOG_ERROR("%s: cannot open %s: %s", __func__, path, strerror(errno));
        return ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        LOG_ERROR("%s: cannot stat %s: %s", __func__, path, strerror(errno));
        close(fd);
        return ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        LOG_ERROR("%s: %s is not a regular file", __func__, path);
        close(fd);
        return ERR_FORMAT;
    }
    if (st.st_size == 0) {
        close(fd);
        return 0;
    }
    // The bytes are copied into anonymous memory, not mapped from the file: a
    // mapping of the file would turn its truncation while in use (a model
    // replaced in place, a copy over it) into SIGBUS at the next access of a
    // page that is gone. A copy is never read from the file again.
    const size_t size = (size_t)st.st_size;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        LOG_ERROR("%s: cannot allocate %zu bytes for %s: %s", __func__, size, path,
                  strerror(errno));
        close(fd);
        return ERR_NOMEM;
    }
    for (size_t done = 0; done < size;) {
        size_t want = size - done < FILE_READ_CHUNK ? size - done : FILE_READ_CHUNK;
        ssize_t n = pread(fd, (uint8_t *)p + done, want, (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            LOG_ERROR("%s: cannot read %s: %s", __func__, path,
                      n < 0 ? strerror(errno) : "the file shrank while it was read");
            munmap(p, size);
            close(fd);
            return ERR_IO;
        }
        done += (size_t)n;
    }
    close(fd);
    mprotect(p, size, PROT_READ);  // read-only, as the file's mapping was
    out->data = p;
    out->size = size;
    return 0;
}

void file_unmap(struct file_map *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

int file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    struct file_map m;
    int err = file_map(path, &m);
    if (err) return err;
    if (m.size > max_bytes) {
        LOG_ERROR("%s: %s is %zu bytes, more than the limit of %zu", __func__, path, m.size,
                  max_bytes);
        file_unmap(&m);
        return ERR_TOOLONG;
    }
    char *buf = malloc(m.size + 1);
    if (!buf) {
        file_unmap(&m);
        return ERR_NOMEM;
    }
    if (m.size) memcpy(buf, m.data, m.size);
    buf[m.size] = '\0';
    if (out_len) *out_len = m.size;
    file_unmap(&m);
    *out = buf;
    return 0;
}

void file_cursor_init(struct file_cursor *c, const void *base, size_t size) {
    c->base = base;
    c->size = size;
    c->pos = 0;
}

size_t file_cursor_left(const struct file_cursor *c) { return c->size - c->pos; }

static int cursor_read(struct file_cursor *c, void *dst, size_t n) {
    if (file_cursor_left(c) < n) return ERR_FORMAT;
    memcpy(dst, c->base + c->pos, n);  // x86-64 and aarch64 hosts are little-endian
    c->pos += n;
    return 0;
}

int file_cursor_u8(struct file_cursor *c, uint8_t *out) { return cursor_read(c, out, 1); }
int file_cursor_u16(struct file_cursor *c, uint16_t *out) { return cursor_read(c, out, 2); }
int file_cursor_u32(struct file_cursor *c, uint32_t *out) { return cursor_read(c, out, 4); }
int file_cursor_u64(struct file_cursor *c, uint64_t *out) { return cursor_read(c, out, 8); }

int file_cursor_bytes(struct file_cursor *c, uint64_t n, const uint8_t **out) {
    if ((uint64_t)file_cursor_left(c) < n) return ERR_FORMAT;
    *out = c->base + c->pos;
    c->pos += (size_t)n;
    return 0;
}

int file_cursor_skip(struct file_cursor *c, uint64_t n) {
    if ((uint64_t)file_cursor_left(c) < n) return ERR_FORMAT;
    c->pos += (size_t)n;
    return 0;
}

/* ---- from an open descriptor ---------------------------------------------------- */

int file_map_fd(int fd, const char *name, struct file_map *out) {
    out->data = NULL;
    out->size = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        LOG_ERROR("%s: cannot stat %s: %s", __func__, name, strerror(errno));
        return ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        LOG_ERROR("%s: %s is not a regular file", __func__, name);
        return ERR_FORMAT;
    }
    if (st.st_size == 0) return 0;
    // Copied into anonymous memory, as file_map() does, and for its reason.
    const size_t size = (size_t)st.st_size;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        LOG_ERROR("%s: cannot allocate %zu bytes for %s: %s", __func__, size, name,
                  strerror(errno));
        return ERR_NOMEM;
    }
    for (size_t done = 0; done < size;) {
        size_t want = size - done < FILE_READ_CHUNK ? size - done : FILE_READ_CHUNK;
        ssize_t n = pread(fd, (uint8_t *)p + done, want, (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            LOG_ERROR("%s: cannot read %s: %s", __func__, name,
                      n < 0 ? strerror(errno) : "the file shrank while it was read");
            munmap(p, size);
            return ERR_IO;
        }
        done += (size_t)n;
    }
    mprotect(p, size, PROT_READ);
    out->data = p;
    out->size = size;
    return 0;
}
