/*
 * gguf_builder.c - in-memory GGUF writer for the reader's tests.
 *
 * Each section is a struct buf of little-endian bytes (the hosts we build on
 * are little-endian, as engine/base/file.c assumes too); finish() joins them.
 */
#include "tests/helpers/gguf_builder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/base/alloc.h"
#include "engine/base/buf.h"

struct gguf_builder {
    uint32_t version;
    uint32_t alignment;      // layout padding, > 0
    uint64_t n_kv;           // entries added
    uint64_t n_tensors;      // infos added
    bool has_n_kv;           // n_kv_forced replaces n_kv in the header
    bool has_n_tensors;
    uint64_t n_kv_forced;
    uint64_t n_tensors_forced;
    struct buf kvs;          // owned: the metadata section
    struct buf infos;        // owned: the tensor info section
    struct buf data;         // owned: the data section, from its start
    struct buf *cur;         // where put_* writes: kvs (values are only written there)
};

struct gguf_builder *gguf_builder_create(uint32_t version) {
    struct gguf_builder *b = xcalloc(1, sizeof(*b));
    b->version = version;
    b->alignment = 32;
    b->cur = &b->kvs;
    return b;
}

void gguf_builder_destroy(struct gguf_builder *b) {
    if (!b) return;
    buf_free(&b->kvs);
    buf_free(&b->infos);
    buf_free(&b->data);
    free(b);
}

void gguf_builder_set_alignment(struct gguf_builder *b, uint32_t alignment) {
    ASSERT(alignment > 0);
    b->alignment = alignment;
}

void gguf_builder_set_n_kv(struct gguf_builder *b, uint64_t n_kv) {
    b->has_n_kv = true;
    b->n_kv_forced = n_kv;
}

void gguf_builder_set_n_tensors(struct gguf_builder *b, uint64_t n_tensors) {
    b->has_n_tensors = true;
    b->n_tensors_forced = n_tensors;
}

static void put_u32(struct buf *o, uint32_t v) { buf_append(o, &v, 4); }
static void put_u64(struct buf *o, uint64_t v) { buf_append(o, &v, 8); }

static void put_str(struct buf *o, const char *s) {
    size_t n = strlen(s);
    put_u64(o, n);
    buf_append(o, s, n);
}

void gguf_builder_put_u32(struct gguf_builder *b, uint32_t v) { put_u32(b->cur, v); }
void gguf_builder_put_u64(struct gguf_builder *b, uint64_t v) { put_u64(b->cur, v); }
void gguf_builder_put_bytes(struct gguf_builder *b, const void *p, size_t n) {
    buf_append(b->cur, p, n);
}
void gguf_builder_put_str(struct gguf_builder *b, const char *s) { put_str(b->cur, s); }

void gguf_builder_kv_begin(struct gguf_builder *b, const char *key, uint32_t type) {
    put_str(&b->kvs, key);
    put_u32(&b->kvs, type);
    b->n_kv++;
}

static void kv_scalar(struct gguf_builder *b, const char *key, enum gguf_type t, const void *v,
                      size_t n) {
    gguf_builder_kv_begin(b, key, (uint32_t)t);
    buf_append(&b->kvs, v, n);
}

void gguf_builder_kv_u8(struct gguf_builder *b, const char *key, uint8_t v) {
    kv_scalar(b, key, GGUF_TYPE_UINT8, &v, 1);
}
void gguf_builder_kv_i8(struct gguf_builder *b, const char *key, int8_t v) {
    kv_scalar(b, key, GGUF_TYPE_INT8, &v, 1);
}
void gguf_builder_kv_u16(struct gguf_builder *b, const char *key, uint16_t v) {
    kv_scalar(b, key, GGUF_TYPE_UINT16, &v, 2);
}
void gguf_builder_kv_i16(struct gguf_builder *b, const char *key, int16_t v) {
    kv_scalar(b, key, GGUF_TYPE_INT16, &v, 2);
}
void gguf_builder_kv_u32(struct gguf_builder *b, const char *key, uint32_t v) {
    kv_scalar(b, key, GGUF_TYPE_UINT32, &v, 4);
}
void gguf_builder_kv_i32(struct gguf_builder *b, const char *key, int32_t v) {
    kv_scalar(b, key, GGUF_TYPE_INT32, &v, 4);
}
void gguf_builder_kv_f32(struct gguf_builder *b, const char *key, float v) {
    kv_scalar(b, key, GGUF_TYPE_FLOAT32, &v, 4);
}
void gguf_builder_kv_bool(struct gguf_builder *b, const char *key, bool v) {
    uint8_t u = v ? 1 : 0;
    kv_scalar(b, key, GGUF_TYPE_BOOL, &u, 1);
}
void gguf_builder_kv_u64(struct gguf_builder *b, const char *key, uint64_t v) {
    kv_scalar(b, key, GGUF_TYPE_UINT64, &v, 8);
}
void gguf_builder_kv_i64(struct gguf_builder *b, const char *key, int64_t v) {
    kv_scalar(b, key, GGUF_TYPE_INT64, &v, 8);
}
void gguf_builder_kv_f64(struct gguf_builder *b, const char *key, double v) {
    kv_scalar(b, key, GGUF_TYPE_FLOAT64, &v, 8);
}
void gguf_builder_kv_str(struct gguf_builder *b, const char *key, const char *v) {
    gguf_builder_kv_begin(b, key, GGUF_TYPE_STRING);
    put_str(&b->kvs, v);
}

/* Bytes of one element of a scalar type; asserts the type is scalar. */
static size_t elem_size(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL:
        return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
        return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32:
        return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64:
        return 8;
    case GGUF_TYPE_STRING:
    case GGUF_TYPE_ARRAY:
    case GGUF_TYPE_COUNT:
        break;
    }
    UNREACHABLE();
}

void gguf_builder_kv_arr(struct gguf_builder *b, const char *key, enum gguf_type elem_type,
                         uint64_t n, const void *data) {
    gguf_builder_kv_begin(b, key, GGUF_TYPE_ARRAY);
    put_u32(&b->kvs, (uint32_t)elem_type);
    put_u64(&b->kvs, n);
    if (n) buf_append(&b->kvs, data, (size_t)n * elem_size(elem_type));
}

void gguf_builder_kv_arr_str(struct gguf_builder *b, const char *key, uint64_t n,
                             const char *const *strs) {
    gguf_builder_kv_begin(b, key, GGUF_TYPE_ARRAY);
    put_u32(&b->kvs, GGUF_TYPE_STRING);
    put_u64(&b->kvs, n);
    for (uint64_t i = 0; i < n; i++) put_str(&b->kvs, strs[i]);
}

/* Pads the data section to the next multiple of the alignment. */
static void pad_data(struct gguf_builder *b) {
    while (b->data.len % b->alignment) buf_append_char(&b->data, 0);
}

uint64_t gguf_builder_tensor(struct gguf_builder *b, const char *name, uint32_t n_dims,
                             const int64_t *ne, uint32_t type, const void *data, size_t nbytes) {
    pad_data(b);
    uint64_t offset = b->data.len;
    uint64_t raw[GGUF_BUILDER_MAX_NE];
    ASSERT(n_dims <= GGUF_BUILDER_MAX_NE);
    for (uint32_t d = 0; d < n_dims; d++) raw[d] = (uint64_t)ne[d];
    uint64_t idx = b->n_tensors;
    gguf_builder_tensor_raw(b, name, n_dims, raw, type, offset);
    if (data) {
        buf_append(&b->data, data, nbytes);
    } else {
        buf_reserve(&b->data, nbytes);
        for (size_t k = 0; k < nbytes; k++) {
            buf_append_char(&b->data, (char)(uint8_t)(idx * 31 + k * 7 + 1));
        }
    }
    return offset;
}

void gguf_builder_tensor_raw(struct gguf_builder *b, const char *name, uint32_t n_dims,
                             const uint64_t *ne, uint32_t type, uint64_t offset) {
    put_str(&b->infos, name);
    put_u32(&b->infos, n_dims);
    for (uint32_t d = 0; d < n_dims && d < GGUF_BUILDER_MAX_NE; d++) put_u64(&b->infos, ne[d]);
    put_u32(&b->infos, type);
    put_u64(&b->infos, offset);
    b->n_tensors++;
}

void gguf_builder_data(struct gguf_builder *b, const void *p, size_t n) {
    buf_append(&b->data, p, n);
}

uint8_t *gguf_builder_finish(const struct gguf_builder *b, size_t *out_size) {
    struct buf o = {0};
    put_u32(&o, GGUF_MAGIC);
    put_u32(&o, b->version);
    put_u64(&o, b->has_n_tensors ? b->n_tensors_forced : b->n_tensors);
    put_u64(&o, b->has_n_kv ? b->n_kv_forced : b->n_kv);
    buf_append(&o, b->kvs.data, b->kvs.len);
    buf_append(&o, b->infos.data, b->infos.len);
    if (b->data.len) {
        while (o.len % b->alignment) buf_append_char(&o, 0);
        buf_append(&o, b->data.data, b->data.len);
    }
    *out_size = o.len;
    return (uint8_t *)buf_take(&o);
}

const char *gguf_builder_write_temp(const uint8_t *data, size_t size) {
    static char path[4096];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof(path), "%s/llmserve-gguf-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    size_t done = 0;
    while (done < size) {
        ssize_t n = write(fd, data + done, size - done);
        ASSERT(n > 0);
        done += (size_t)n;
    }
    ASSERT(close(fd) == 0);
    return path;
}
