/*
 * file.c - whole files read into private memory, and the checked cursor.
 */
#define LOG_TAG "file"
#include "engine/base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/base/pages.h"

enum { FILE_READ_CHUNK = 1 << 30 };  // bytes per pread (Linux stops one at 2 GiB)

/* st_size of fd, a regular file: 0, ERR_IO or ERR_FORMAT (logged with name). */
static int regular_size(int fd, const char *name, size_t *out) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        LOG_ERROR("cannot stat %s: %s", name, strerror(errno));
        return ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        LOG_ERROR("%s is not a regular file", name);
        return ERR_FORMAT;
    }
    *out = (size_t)st.st_size;
    return 0;
}

/* Reads bytes [off, off + n) of fd into dst: 0, or ERR_IO when a read fails
 * or the file ends first (it shrank since it was sized; logged with name). */
static int read_at(int fd, const char *name, uint8_t *dst, size_t off, size_t n) {
    for (size_t done = 0; done < n;) {
        size_t want = n - done < FILE_READ_CHUNK ? n - done : FILE_READ_CHUNK;
        ssize_t got = pread(fd, dst + done, want, (off_t)(off + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            LOG_ERROR("cannot read %s: %s", name,
                      got < 0 ? strerror(errno) : "the file shrank while it was read");
            return ERR_IO;
        }
        done += (size_t)got;
    }
    return 0;
}

/* size bytes of private anonymous memory, writable, or NULL (logged). */
static void *reserve(size_t size, const char *name) {
    void *p = pages_reserve(size, false);
    if (!p) LOG_ERROR("cannot allocate %zu bytes for %s: %s", size, name, strerror(errno));
    return p;
}

int file_map_fd(int fd, const char *name, struct file_map *out) {
    out->data = NULL;
    out->size = 0;
    size_t size = 0;
    int err = regular_size(fd, name, &size);
    if (err || size == 0) return err;
    // The bytes are copied into anonymous memory, not mapped from the file: a
    // mapping of the file would turn its truncation while in use (a model
    // replaced in place, a copy over it) into SIGBUS at the next access of a
    // page that is gone. A copy is never read from the file again.
    uint8_t *p = reserve(size, name);
    if (!p) return ERR_NOMEM;
    pages_advise_huge(p, size);  // all of it is read now
    if ((err = read_at(fd, name, p, 0, size))) {
        pages_release(p, size);
        return err;
    }
    mprotect(p, size, PROT_READ);  // read-only, as the file's mapping was
    out->data = p;
    out->size = size;
    return 0;
}

int file_map(const char *path, struct file_map *out) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO: refused, not waited on
    if (fd < 0) {
        LOG_ERROR("cannot open %s: %s", path, strerror(errno));
        return ERR_IO;
    }
    int err = file_map_fd(fd, path, out);
    close(fd);
    return err;
}

void file_unmap(struct file_map *m) {
    if (m->data) pages_release((void *)m->data, m->size);
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
    c->avail = size;
    c->fill = NULL;
}

enum { SPARSE_FIRST_CHUNK = 64 << 10 };  // bytes a sparse cursor reads first

void file_cursor_init_sparse(struct file_cursor *c, struct file_sparse *s) {
    file_cursor_init(c, s->map.data, s->map.size);
    c->avail = 0;
    c->fill = s;
}

/* Makes bytes [0, end) there to read (end <= size): 0, or ERR_FORMAT when the
 * file cannot supply them (logged by the read). Each fill at least doubles
 * what is there, so a header of H bytes takes O(log H) reads and reads less
 * than 2H + SPARSE_FIRST_CHUNK. */
static int cursor_need(struct file_cursor *c, size_t end) {
    if (end <= c->avail) return 0;
    size_t want = c->avail < SPARSE_FIRST_CHUNK / 2 ? SPARSE_FIRST_CHUNK : 2 * c->avail;
    if (want < end) want = end;
    if (want > c->size) want = c->size;
    if (file_sparse_read(c->fill, c->avail, want - c->avail)) return ERR_FORMAT;
    c->avail = want;
    return 0;
}

size_t file_cursor_left(const struct file_cursor *c) { return c->size - c->pos; }

static int cursor_read(struct file_cursor *c, void *dst, size_t n) {
    if (file_cursor_left(c) < n || cursor_need(c, c->pos + n)) return ERR_FORMAT;
    memcpy(dst, c->base + c->pos, n);  // x86-64 and aarch64 hosts are little-endian
    c->pos += n;
    return 0;
}

int file_cursor_u8(struct file_cursor *c, uint8_t *out) { return cursor_read(c, out, 1); }
int file_cursor_u16(struct file_cursor *c, uint16_t *out) { return cursor_read(c, out, 2); }
int file_cursor_u32(struct file_cursor *c, uint32_t *out) { return cursor_read(c, out, 4); }
int file_cursor_u64(struct file_cursor *c, uint64_t *out) { return cursor_read(c, out, 8); }

int file_cursor_bytes(struct file_cursor *c, uint64_t n, const uint8_t **out) {
    if ((uint64_t)file_cursor_left(c) < n || cursor_need(c, c->pos + (size_t)n)) return ERR_FORMAT;
    *out = c->base + c->pos;
    c->pos += (size_t)n;
    return 0;
}

int file_cursor_skip(struct file_cursor *c, uint64_t n) {
    // Skipped bytes are read in too: a parser skips what it views later (a
    // GGUF scalar, an array), and a header is read whole.
    if ((uint64_t)file_cursor_left(c) < n || cursor_need(c, c->pos + (size_t)n)) return ERR_FORMAT;
    c->pos += (size_t)n;
    return 0;
}

/* ---- read range by range ------------------------------------------------------- */

int file_sparse_open(const char *path, struct file_sparse *out) {
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    snprintf(out->name, sizeof(out->name), "%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO: refused, not waited on
    if (fd < 0) {
        LOG_ERROR("cannot open %s: %s", path, strerror(errno));
        return ERR_IO;
    }
    size_t size = 0;
    int err = regular_size(fd, path, &size);
    if (!err && size > 0 && !(out->map.data = reserve(size, path))) err = ERR_NOMEM;
    if (err) {
        close(fd);
        return err;
    }
    out->map.size = size;
    out->fd = fd;
    return 0;
}

int file_sparse_read(struct file_sparse *s, size_t off, size_t n) {
    if (s->fd < 0 || off > s->map.size || n > s->map.size - off) {
        LOG_ERROR("%s: bytes [%zu, +%zu) are not in the file (%zu bytes)%s", s->name, off, n,
                  s->map.size, s->fd < 0 ? ", or it is sealed" : "");
        return ERR_INVAL;
    }
    // The 2 MiB pages the range fills wholly (a rank's strided slices of a
    // matrix fill none, and commit no more than before).
    pages_advise_huge((uint8_t *)s->map.data + off, n);
    int err = read_at(s->fd, s->name, (uint8_t *)s->map.data + off, off, n);
    if (!err) s->n_read += n;
    return err;
}

void file_sparse_will_read(struct file_sparse *s, size_t off, size_t n) {
    if (!s->map.data || off >= s->map.size) return;
    pages_advise_huge((uint8_t *)s->map.data + off, n < s->map.size - off ? n : s->map.size - off);
}

void file_sparse_seal(struct file_sparse *s) {
    if (s->fd < 0) return;
    close(s->fd);
    s->fd = -1;
    if (s->map.data) mprotect((void *)s->map.data, s->map.size, PROT_READ);
}

void file_sparse_close(struct file_sparse *s) {
    file_sparse_seal(s);
    file_unmap(&s->map);
}
