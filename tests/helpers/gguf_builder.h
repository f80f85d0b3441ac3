/*
 * gguf_builder.h - writes GGUF files in memory for tests, valid or corrupt.
 *
 * A builder collects three sections (metadata, tensor infos, tensor data) and
 * joins them in gguf_builder_finish() as the GGUF spec lays them out:
 *   header (magic, version, n_tensors, n_kv) | kvs | tensor infos |
 *   padding to the alignment | data
 * The header counts are the numbers of entries added unless forced, and every
 * tensor added with data gets the next offset that is a multiple of the
 * builder's alignment, so a test writes the shape of a file and gets its bytes;
 * corrupt files come from the _raw entry points, forced counts and patching
 * the finished bytes.
 *
 * It does not consult engine/quant.h: callers state each tensor's byte size,
 * so a test's expectation of block sizes stays independent of the reader's
 * table. Allocation failures abort (tests only). Not thread-safe.
 */
#ifndef LLMSERVE_TESTS_GGUF_BUILDER_H
#define LLMSERVE_TESTS_GGUF_BUILDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/format/gguf.h"

struct gguf_builder;

/* A builder for a file of this version (any value: 1 and 4 make unsupported
 * files), alignment 32. Owned by the caller: free with gguf_builder_destroy(). */
struct gguf_builder *gguf_builder_create(uint32_t version);
void gguf_builder_destroy(struct gguf_builder *b);  // NULL-safe

/* The padding used before the data section and between tensors (default 32;
 * must be > 0). This sets the layout only: write the general.alignment kv
 * yourself (gguf_builder_kv_u32), or write a different one to make a file whose
 * offsets disagree with its key. */
void gguf_builder_set_alignment(struct gguf_builder *b, uint32_t alignment);

/* Forces the n_kv / n_tensors header fields to a value other than the number
 * of entries added (absurd counts). */
void gguf_builder_set_n_kv(struct gguf_builder *b, uint64_t n_kv);
void gguf_builder_set_n_tensors(struct gguf_builder *b, uint64_t n_tensors);

/* Scalar metadata entries: key (u64 length + bytes), u32 type, value. */
void gguf_builder_kv_u8(struct gguf_builder *b, const char *key, uint8_t v);
void gguf_builder_kv_i8(struct gguf_builder *b, const char *key, int8_t v);
void gguf_builder_kv_u16(struct gguf_builder *b, const char *key, uint16_t v);
void gguf_builder_kv_i16(struct gguf_builder *b, const char *key, int16_t v);
void gguf_builder_kv_u32(struct gguf_builder *b, const char *key, uint32_t v);
void gguf_builder_kv_i32(struct gguf_builder *b, const char *key, int32_t v);
void gguf_builder_kv_f32(struct gguf_builder *b, const char *key, float v);
void gguf_builder_kv_bool(struct gguf_builder *b, const char *key, bool v);
void gguf_builder_kv_u64(struct gguf_builder *b, const char *key, uint64_t v);
void gguf_builder_kv_i64(struct gguf_builder *b, const char *key, int64_t v);
void gguf_builder_kv_f64(struct gguf_builder *b, const char *key, double v);
/* A NUL-terminated string value. */
void gguf_builder_kv_str(struct gguf_builder *b, const char *key, const char *v);

/* An array of n scalars of elem_type; data holds them packed in host
 * (little-endian) order, n * element size bytes. */
void gguf_builder_kv_arr(struct gguf_builder *b, const char *key, enum gguf_type elem_type,
                         uint64_t n, const void *data);
/* An array of n NUL-terminated strings. */
void gguf_builder_kv_arr_str(struct gguf_builder *b, const char *key, uint64_t n,
                             const char *const *strs);

/* Starts an entry of any type id (invalid ones included) whose value the
 * caller then writes with the gguf_builder_put_* calls below: nested arrays,
 * huge lengths, truncated values. */
void gguf_builder_kv_begin(struct gguf_builder *b, const char *key, uint32_t type);
void gguf_builder_put_u32(struct gguf_builder *b, uint32_t v);
void gguf_builder_put_u64(struct gguf_builder *b, uint64_t v);
void gguf_builder_put_bytes(struct gguf_builder *b, const void *p, size_t n);
void gguf_builder_put_str(struct gguf_builder *b, const char *s);  // u64 length + bytes

/* A tensor info (name, n_dims, ne[0..n_dims), type, offset) and its nbytes of
 * data, placed at the next multiple of the alignment in the data section.
 * data NULL fills the bytes with a pattern (byte k of tensor i is
 * (uint8_t)(i * 31 + k * 7 + 1)). Returns the offset it was given. */
uint64_t gguf_builder_tensor(struct gguf_builder *b, const char *name, uint32_t n_dims,
                             const int64_t *ne, uint32_t type, const void *data, size_t nbytes);

/* A tensor info written as given (any n_dims, raw ne values, offset), without
 * data: for corrupt directories. ne holds min(n_dims, GGUF_BUILDER_MAX_NE)
 * values (NULL when 0) and only those are written, so a file can claim more
 * dims than it holds. */
#define GGUF_BUILDER_MAX_NE 8
void gguf_builder_tensor_raw(struct gguf_builder *b, const char *name, uint32_t n_dims,
                             const uint64_t *ne, uint32_t type, uint64_t offset);

/* Appends n raw bytes to the data section (after the tensors added so far). */
void gguf_builder_data(struct gguf_builder *b, const void *p, size_t n);

/* The file's bytes: malloc'd, owned by the caller (free()); *out_size set.
 * The builder stays usable (finish may be called again). */
uint8_t *gguf_builder_finish(const struct gguf_builder *b, size_t *out_size);

/* Writes bytes to a fresh file under $TMPDIR (or /tmp) and returns its path
 * in a static buffer (overwritten by the next call); the caller unlinks it.
 * Aborts when the file cannot be written. */
const char *gguf_builder_write_temp(const uint8_t *data, size_t size);

#endif
