/*
 * file.h - whole files read into read-only private memory, and a bounds-checked cursor for
 * parsers of hostile files (GGUF, safetensors).
 *
 * A cursor never reads past its end: every read checks the remaining length
 * first and returns ERR_FORMAT (leaving the cursor unchanged) when the bytes
 * are not there, so a parser built on it cannot read out of bounds.
 */
#ifndef LLMSERVE_FILE_H
#define LLMSERVE_FILE_H

#include <stddef.h>
#include <stdint.h>

struct file_map {
    const uint8_t *data;  // the whole file's bytes, page-aligned, read-only; owned (file_unmap)
    size_t size;          // bytes in the file
};

/* Reads path whole into private read-only memory (*out). The file is not
 * mapped, so whatever happens to it afterwards (truncated, rewritten,
 * deleted) the bytes stay as they were read: a model being served is never
 * read from its file again. Returns 0, ERR_IO (cannot open/stat/read, or the
 * file shrank while being read; the reason is logged with the path),
 * ERR_NOMEM or ERR_FORMAT (not a regular file). An empty file gives
 * data == NULL, size == 0. */
int file_map(const char *path, struct file_map *out);

/* Unmaps; safe on a zeroed or already unmapped struct. */
void file_unmap(struct file_map *m);

/* Reads the whole file into a NUL-terminated malloc'd buffer (owned by the
 * caller; free()). Fails with ERR_TOOLONG above max_bytes, ERR_IO, ERR_NOMEM. */
int file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len);

struct file_cursor {
    const uint8_t *base;  // borrowed: start of the region
    size_t size;          // bytes in the region
    size_t pos;           // next byte to read, always <= size
};

void file_cursor_init(struct file_cursor *c, const void *base, size_t size);

/* Bytes left to read. */
size_t file_cursor_left(const struct file_cursor *c);

/* Each returns 0, or ERR_FORMAT if fewer bytes remain than the value needs.
 * Values are little-endian on disk. */
int file_cursor_u8(struct file_cursor *c, uint8_t *out);
int file_cursor_u16(struct file_cursor *c, uint16_t *out);
int file_cursor_u32(struct file_cursor *c, uint32_t *out);
int file_cursor_u64(struct file_cursor *c, uint64_t *out);

/* Points *out at the next n bytes (a view into the region) and skips them. */
int file_cursor_bytes(struct file_cursor *c, uint64_t n, const uint8_t **out);

/* Skips n bytes. */
int file_cursor_skip(struct file_cursor *c, uint64_t n);

/* As file_map(), from an open file descriptor (borrowed: not closed, its
 * offset not used): the bytes of the file fd names, however its path changes
 * meanwhile. name is used in messages. Same returns as file_map(). */
int file_map_fd(int fd, const char *name, struct file_map *out);

#endif
