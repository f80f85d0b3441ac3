/*
 * safetensors.h - reader of safetensors files (Hugging Face's tensor format,
 * as PEFT saves adapter_model.safetensors).
 *
 * Layout (https://github.com/huggingface/safetensors, "Format"):
 *   1. u64 N, little-endian: bytes of the header
 *   2. N bytes of UTF-8 JSON, an object: each key a tensor name with
 *      {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, plus an
 *      optional "__metadata__" object of string values; may end in spaces
 *   3. the data section: offsets are relative to its start (byte 8 + N)
 *
 * The file is read whole into private read-only memory (file_map). Everything it claims is checked before use:
 * N against the file size and a 100 MiB cap, JSON shape and types, duplicate
 * names, dtypes (F32, F16, BF16 are read; the other safetensors dtypes are
 * ERR_UNSUPPORTED, anything else ERR_FORMAT), every data_offsets pair against
 * the data section, shape products (overflow included) against the byte size,
 * and the spec's rule that the tensors tile the data section exactly (sorted
 * by offset, no overlap, no hole, nothing after the last).
 *
 * Thread rule: immutable after safetensors_open(); any thread may read it.
 */
#ifndef LLMSERVE_SAFETENSORS_H
#define LLMSERVE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_MAX_DIMS 4
#define SAFETENSORS_MAX_HEADER_BYTES (100u << 20)  // the reference implementation's limit

enum safetensors_dtype {
    SAFETENSORS_DTYPE_F32,
    SAFETENSORS_DTYPE_F16,
    SAFETENSORS_DTYPE_BF16,
};

struct safetensors_tensor {
    const char *name;                     // owned by the file (NUL-terminated copy)
    enum safetensors_dtype dtype;
    int32_t n_dims;                       // 0 (a scalar) .. SAFETENSORS_MAX_DIMS
    int64_t shape[SAFETENSORS_MAX_DIMS];  // PyTorch order: shape[n_dims - 1] is contiguous
    int64_t n_elements;                   // product of shape (1 for a scalar)
    size_t nbytes;                        // = n_elements * element size
    const void *data;                     // view into the file's bytes; NOT aligned (read with memcpy)
};

struct safetensors_file;

/* Maps and validates path. On success *out is owned by the caller (free with
 * safetensors_close()). Returns 0, ERR_IO, ERR_FORMAT (corrupt, truncated or
 * inconsistent), ERR_UNSUPPORTED (a dtype other than F32/F16/BF16: the message
 * names the tensor and the dtype) or ERR_NOMEM; the reason is logged once,
 * naming the file. */
int safetensors_open(const char *path, struct safetensors_file **out);

/* As safetensors_open() from an open file descriptor (borrowed, not
 * closed), read whole as file_map_fd() does; name is used in messages. */
int safetensors_open_fd(int fd, const char *name, struct safetensors_file **out);

/* As safetensors_open() over a caller's buffer, retained (not copied) until
 * safetensors_close(). name is used in messages. */
int safetensors_open_memory(const void *data, size_t size, const char *name,
                            struct safetensors_file **out);

/* Frees f and unmaps its file; NULL-safe. */
void safetensors_close(struct safetensors_file *f);

const char *safetensors_name(const struct safetensors_file *f);  // path given to open

/* Tensors in the header's order (the JSON object's key order). */
int64_t safetensors_n_tensors(const struct safetensors_file *f);
const struct safetensors_tensor *safetensors_tensor_at(const struct safetensors_file *f,
                                                       int64_t i);

/* The tensor with this name, or NULL. */
const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name);

/* The string value of key in __metadata__, borrowed for f's life, or NULL
 * when absent. */
const char *safetensors_metadata(const struct safetensors_file *f, const char *key);

/* Converts all n_elements of t to f32 into dst [t->n_elements]. */
void safetensors_to_f32(const struct safetensors_tensor *t, float *dst);

/* "F32", "F16", "BF16". */
const char *safetensors_dtype_name(enum safetensors_dtype d);

#endif
