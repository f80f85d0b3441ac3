/*
 * gguf.h - reader of GGUF v2 and v3 files (the llama.cpp model format).
 *
 * The file is read into private read-only memory (file_map, never mapped
 * from the file): whole by gguf_open(), or the header only by
 * gguf_open_sparse() with tensor data read range by range as a caller needs
 * it (a rank of a parallel job); keys, strings and tensor data are views into those
 * bytes, valid until gguf_close(). Everything the file claims (counts,
 * lengths, offsets, sizes, types, alignment) is checked against the file size,
 * overflow included, before it is used: a truncated, corrupt or unsupported
 * file makes gguf_open() fail with a logged message naming what is wrong.
 *
 * Layout (little-endian), as in the GGUF spec:
 *   1. u32 magic "GGUF", u32 version (2 or 3), u64 n_tensors, u64 n_kv
 *   2. n_kv times: string key, u32 value type, value
 *      (string = u64 length + bytes; array = u32 elem type, u64 n, n values)
 *   3. n_tensors times: string name, u32 n_dims, u64 ne[n_dims], u32 type,
 *      u64 offset (relative to the data section, a multiple of the alignment)
 *   4. padding to general.alignment (default 32), then the data section
 *
 * Thread rule: a gguf_file is immutable after gguf_open(); any thread may read it.
 */
#ifndef LLMSERVE_GGUF_H
#define LLMSERVE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC 0x46554747u  // "GGUF" read as a little-endian u32
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT = 13,
};

/* A string in the file: not NUL-terminated, may contain any bytes. */
struct gguf_str {
    const char *data;  // view into the file's bytes
    uint64_t len;
};

struct gguf_kv {
    struct gguf_str key;
    enum gguf_type type;
    enum gguf_type arr_type;      // element type when type == GGUF_TYPE_ARRAY
    uint64_t arr_n;               // element count when type == GGUF_TYPE_ARRAY
    const uint8_t *data;          // view: the scalar, or the first array element (unaligned)
    const struct gguf_str *strs;  // string arrays: arr_n views; owned by the gguf_file
};

struct gguf_tensor_info {
    struct gguf_str name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];  // elements per dimension, ne[0] innermost; unused dims 1
    uint32_t type;              // ggml type id (enum quant_type)
    uint64_t offset;            // from the start of the data section
    size_t nbytes;              // bytes of data, from the type's block layout
    const void *data;           // view into the file's bytes, aligned to the file's alignment
};

struct gguf_file;

/* Opens and validates path. On success *out is owned by the caller (free with
 * gguf_close()). Returns 0, ERR_IO, ERR_FORMAT (corrupt or truncated),
 * ERR_UNSUPPORTED (e.g. GGUF v1, unknown tensor type id) or ERR_NOMEM; the
 * reason is logged once, naming the file and what is wrong. */
int gguf_open(const char *path, struct gguf_file **out);

/* As gguf_open(), reading only the header (metadata and tensor infos) from
 * the file: tensor data stays unread, zero, until gguf_read() reads the
 * ranges a caller needs (a rank of a parallel job: its own slices), and the
 * file is closed at gguf_seal(). Same checks and returns as gguf_open(). */
int gguf_open_sparse(const char *path, struct gguf_file **out);

/* Reads the n bytes at p, a view into f's tensor data (inside
 * [gguf_tensor_at(f, i)->data, + nbytes) of some tensor i), from the file.
 * A no-op returning 0 for a file read whole. Returns 0, ERR_INVAL (p, n not
 * inside the data section, or f sealed) or ERR_IO (logged with the path). */
int gguf_read(struct gguf_file *f, const void *p, size_t n);

/* The caller will gguf_read() all of f's tensor data (one process holding the
 * whole model): a hint that its memory may come in 2 MiB pages
 * (file_sparse_will_read). A no-op for a file read whole. */
void gguf_will_read_all(struct gguf_file *f);

/* Closes f's file: nothing is read from it afterwards (gguf_read then fails),
 * and its bytes become read-only. A no-op for a file read whole. */
void gguf_seal(struct gguf_file *f);

/* Bytes of tensor data read from the file (gguf_read() calls, for a sparse
 * file; the whole data section otherwise) and of the header before it
 * (read whole, or in growing chunks by gguf_open_sparse). */
size_t gguf_data_bytes_read(const struct gguf_file *f);
size_t gguf_header_bytes_read(const struct gguf_file *f);

/* As gguf_open() over a caller's buffer, retained (not copied) until
 * gguf_close(). name is used in messages. */
int gguf_open_memory(const void *data, size_t size, const char *name, struct gguf_file **out);

/* Frees f and unmaps its file; NULL-safe. */
void gguf_close(struct gguf_file *f);

uint32_t gguf_version(const struct gguf_file *f);
uint32_t gguf_alignment(const struct gguf_file *f);
const char *gguf_name(const struct gguf_file *f);  // path given to gguf_open

int64_t gguf_n_kv(const struct gguf_file *f);
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, int64_t i);

/* The entry with this key, or NULL. */
const struct gguf_kv *gguf_find(const struct gguf_file *f, const char *key);

/* Typed getters: 0 with *out set, ERR_NOTFOUND when the key is absent (*out
 * untouched, so a default can be preset), ERR_FORMAT when the value has the
 * wrong type or does not fit. Integer getters accept any integer type whose
 * value fits (converters disagree on u32 vs i32 vs u64); gguf_get_f32 accepts
 * FLOAT32 and FLOAT64. */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out);

/* An array with elements of elem_type: 0 with *out the entry, ERR_NOTFOUND,
 * or ERR_FORMAT (not an array, or other elements). */
int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_type elem_type,
                 const struct gguf_kv **out);

/* Element i of a numeric array entry (i < arr_n is asserted; the element type
 * must match the accessor, also asserted: check it with gguf_get_arr). */
float gguf_arr_f32(const struct gguf_kv *kv, uint64_t i);
int32_t gguf_arr_i32(const struct gguf_kv *kv, uint64_t i);
uint32_t gguf_arr_u32(const struct gguf_kv *kv, uint64_t i);

/* True when s equals the NUL-terminated string z. */
bool gguf_str_eq(struct gguf_str s, const char *z);

/* Copies s into dst (size n > 0) NUL-terminated, truncating; returns dst. */
char *gguf_str_copy(struct gguf_str s, char *dst, size_t n);

int64_t gguf_n_tensors(const struct gguf_file *f);
const struct gguf_tensor_info *gguf_tensor_at(const struct gguf_file *f, int64_t i);

/* The tensor with this name, or NULL. */
const struct gguf_tensor_info *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* "uint32", "string", ... for messages. */
const char *gguf_type_name(uint32_t t);

#endif
