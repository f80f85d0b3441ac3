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

struct file_sparse;

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
    size_t avail;         // bytes [0, avail) are there to read: size, unless filled on demand
    struct file_sparse *fill;  // borrowed, or NULL: reads [avail, ...) in as the cursor needs it
};

void file_cursor_init(struct file_cursor *c, const void *base, size_t size);

/* A cursor over all of s's bytes (s->map.size) that reads them in from the
 * file as it reaches them, in growing chunks from the start: for a header
 * of unknown length at the start of a file whose rest is read range by
 * range (gguf_open_sparse). A read that the file cannot supply is
 * ERR_FORMAT like a short region, with the I/O error logged. */
void file_cursor_init_sparse(struct file_cursor *c, struct file_sparse *s);

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

/* A file read range by range instead of whole, for a rank of a parallel job
 * that computes only its slices of a model (engine/model/shard.h): the whole
 * size is reserved as private anonymous memory (address space: a page costs
 * memory only once written), file_sparse_read() copies ranges of the file in
 * at their own offsets, and file_sparse_seal() closes the file and makes the
 * bytes read-only. Bytes never read stay zero. As with file_map(), nothing is
 * read from the file after it is sealed, whatever happens to it. */
struct file_sparse {
    struct file_map map;  // all of the file's size; owned (file_sparse_close)
    int fd;               // open until sealed; -1 after
    char name[256];       // the path, for messages
    size_t n_read;        // bytes read so far (a range read twice counts twice)
};

/* Opens path and reserves its size; reads nothing. Returns 0, ERR_IO,
 * ERR_NOMEM or ERR_FORMAT (not a regular file), as file_map(). */
int file_sparse_open(const char *path, struct file_sparse *out);

/* Reads bytes [off, off + n) of the file into s->map.data + off. Returns 0,
 * ERR_INVAL (the range is not inside the file, or s is sealed) or ERR_IO
 * (the read failed or the file shrank; logged with the path). */
int file_sparse_read(struct file_sparse *s, size_t off, size_t n);

/* The caller will read all of bytes [off, off + n) (clamped to the file):
 * their memory is asked to come in 2 MiB pages, one fault each instead of
 * 512. A hint; it reads and commits nothing. file_sparse_read() gives the
 * same hint for the whole 2 MiB pages inside each range it reads. */
void file_sparse_will_read(struct file_sparse *s, size_t off, size_t n);

/* Closes the file and makes the bytes read-only. Idempotent. */
void file_sparse_seal(struct file_sparse *s);

/* Seals and unmaps; safe on a zeroed struct with fd -1, or twice. */
void file_sparse_close(struct file_sparse *s);

/* As file_map(), from an open file descriptor (borrowed: not closed, its
 * offset not used): the bytes of the file fd names, however its path changes
 * meanwhile. name is used in messages. Same returns as file_map(). */
int file_map_fd(int fd, const char *name, struct file_map *out);

#endif
