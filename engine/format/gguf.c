/*
 * gguf.c - GGUF v2/v3 parsing with every claim checked against the file.
 *
 * The parse is one pass over a file_cursor (which cannot read past the end),
 * followed by checks of the tensor table against the data section. The only
 * allocations are the kv and tensor arrays and the string views of string
 * arrays; each is bounded by the file size (every entry costs the file at
 * least as many bytes as the count we allocate for), so a hostile count
 * cannot make us allocate more than a small multiple of the file.
 */
#define LOG_TAG "gguf"
#include "engine/format/gguf.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/file.h"
#include "engine/base/log.h"
#include "engine/format/quant.h"

#define GGUF_MAX_ARRAY_DEPTH 4

struct gguf_file {
    struct file_map map;                // owned when opened from a path, read whole
    struct file_sparse sparse;          // owned when opened sparse (is_sparse)
    bool is_sparse;
    size_t header_read;                 // bytes read by the header's parse (sparse)
    const uint8_t *data;                // the whole file (borrowed or the mapping)
    size_t size;
    char *name;                         // owned
    uint32_t version;
    uint32_t alignment;
    int64_t n_kv;
    struct gguf_kv *kvs;                // [n_kv], owned
    int64_t n_tensors;
    struct gguf_tensor_info *tensors;   // [n_tensors], owned
    size_t data_offset;                 // start of the data section in the file
};

static const char *const gguf_type_names[GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64",
};

const char *gguf_type_name(uint32_t t) {
    return t < GGUF_TYPE_COUNT ? gguf_type_names[t] : "invalid";
}

/* Bytes of one scalar of type t, 0 for string/array/invalid. */
static size_t scalar_size(uint32_t t) {
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
    default:
        return 0;
    }
}

static int read_str(struct file_cursor *c, struct gguf_str *out) {
    uint64_t len;
    const uint8_t *p;
    if (file_cursor_u64(c, &len) || file_cursor_bytes(c, len, &p)) return ERR_FORMAT;
    out->data = (const char *)p;
    out->len = len;
    return 0;
}

/* Skips a value of type t (used for nested arrays, which we keep as raw views). */
static int skip_value(struct file_cursor *c, uint32_t t, int depth) {
    size_t sz = scalar_size(t);
    if (sz) return file_cursor_skip(c, sz);
    if (t == GGUF_TYPE_STRING) {
        struct gguf_str s;
        return read_str(c, &s);
    }
    if (t != GGUF_TYPE_ARRAY || depth >= GGUF_MAX_ARRAY_DEPTH) return ERR_FORMAT;
    uint32_t et;
    uint64_t n;
    if (file_cursor_u32(c, &et) || file_cursor_u64(c, &n)) return ERR_FORMAT;
    if (et >= GGUF_TYPE_COUNT) return ERR_FORMAT;
    size_t esz = scalar_size(et);
    if (esz) {
        if (n > (uint64_t)file_cursor_left(c) / esz) return ERR_FORMAT;
        return file_cursor_skip(c, n * esz);
    }
    for (uint64_t i = 0; i < n; i++) {
        int err = skip_value(c, et, depth + 1);
        if (err) return err;
    }
    return 0;
}

static int parse_kv(struct gguf_file *f, struct file_cursor *c, struct gguf_kv *kv, int64_t idx) {
    size_t at = c->pos;
    if (read_str(c, &kv->key)) {
        LOG_ERROR("%s: metadata entry %lld: key runs past the end of the file (offset %zu)",
                  f->name, (long long)idx, at);
        return ERR_FORMAT;
    }
    char key[128];
    gguf_str_copy(kv->key, key, sizeof(key));
    uint32_t t;
    if (file_cursor_u32(c, &t)) {
        LOG_ERROR("%s: key '%s': truncated before its type", f->name, key);
        return ERR_FORMAT;
    }
    if (t >= GGUF_TYPE_COUNT) {
        LOG_ERROR("%s: key '%s': invalid value type %u", f->name, key, t);
        return ERR_FORMAT;
    }
    kv->type = (enum gguf_type)t;
    kv->data = c->base + c->pos;
    size_t sz = scalar_size(t);
    if (sz) {
        if (file_cursor_skip(c, sz)) goto truncated;
        return 0;
    }
    if (t == GGUF_TYPE_STRING) {
        struct gguf_str s;
        if (read_str(c, &s)) goto truncated;
        return 0;
    }
    // array
    uint32_t et;
    uint64_t n;
    if (file_cursor_u32(c, &et) || file_cursor_u64(c, &n)) goto truncated;
    if (et >= GGUF_TYPE_COUNT) {
        LOG_ERROR("%s: key '%s': invalid array element type %u", f->name, key, et);
        return ERR_FORMAT;
    }
    kv->arr_type = (enum gguf_type)et;
    kv->arr_n = n;
    kv->data = c->base + c->pos;
    size_t esz = scalar_size(et);
    if (esz) {
        if (n > (uint64_t)file_cursor_left(c) / esz) {
            LOG_ERROR("%s: key '%s': array of %llu %s elements does not fit in the file",
                      f->name, key, (unsigned long long)n, gguf_type_name(et));
            return ERR_FORMAT;
        }
        file_cursor_skip(c, n * esz);
        return 0;
    }
    if (et == GGUF_TYPE_STRING) {
        // Each string costs at least 8 bytes (its length), which bounds n.
        if (n > (uint64_t)file_cursor_left(c) / 8) {
            LOG_ERROR("%s: key '%s': array of %llu strings does not fit in the file", f->name,
                      key, (unsigned long long)n);
            return ERR_FORMAT;
        }
        struct gguf_str *strs = malloc((size_t)(n ? n : 1) * sizeof(*strs));
        if (!strs) return ERR_NOMEM;
        kv->strs = strs;
        for (uint64_t i = 0; i < n; i++) {
            if (read_str(c, &strs[i])) {
                LOG_ERROR("%s: key '%s': string %llu of %llu runs past the end of the file",
                          f->name, key, (unsigned long long)i, (unsigned long long)n);
                return ERR_FORMAT;
            }
        }
        return 0;
    }
    // nested arrays: valid GGUF, kept as a raw view; no typed accessor reads them
    for (uint64_t i = 0; i < n; i++) {
        if (skip_value(c, et, 1)) {
            LOG_ERROR("%s: key '%s': nested array element %llu is malformed or truncated",
                      f->name, key, (unsigned long long)i);
            return ERR_FORMAT;
        }
    }
    return 0;

truncated:
    LOG_ERROR("%s: key '%s': %s value runs past the end of the file", f->name, key,
              gguf_type_name(t));
    return ERR_FORMAT;
}

static int parse_tensor_info(struct gguf_file *f, struct file_cursor *c,
                             struct gguf_tensor_info *ti, int64_t idx) {
    if (read_str(c, &ti->name)) {
        LOG_ERROR("%s: tensor %lld: name runs past the end of the file", f->name, (long long)idx);
        return ERR_FORMAT;
    }
    char name[128];
    gguf_str_copy(ti->name, name, sizeof(name));
    if (file_cursor_u32(c, &ti->n_dims)) goto truncated;
    if (ti->n_dims < 1 || ti->n_dims > GGUF_MAX_DIMS) {
        LOG_ERROR("%s: tensor '%s': %u dimensions (1 to %d allowed)", f->name, name, ti->n_dims,
                  GGUF_MAX_DIMS);
        return ERR_FORMAT;
    }
    // NOTE: the bound is the product of the non-zero dims, so that every
    // partial product a caller may form (rows = ne[1] * ne[2], ...) fits in
    // int64 even when another dim is 0 and the element count is 0.
    int64_t n_elem = 1;
    int64_t n_bound = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) ti->ne[d] = 1;
    for (uint32_t d = 0; d < ti->n_dims; d++) {
        uint64_t ne;
        if (file_cursor_u64(c, &ne)) goto truncated;
        if (ne > (uint64_t)INT64_MAX || (ne && (uint64_t)n_bound > (uint64_t)INT64_MAX / ne)) {
            LOG_ERROR("%s: tensor '%s': element count overflows", f->name, name);
            return ERR_FORMAT;
        }
        ti->ne[d] = (int64_t)ne;
        if (ne) n_bound *= (int64_t)ne;
        n_elem *= (int64_t)ne;
    }
    if (file_cursor_u32(c, &ti->type) || file_cursor_u64(c, &ti->offset)) goto truncated;
    const struct quant_traits *tr = quant_traits(ti->type);
    if (!tr) {
        LOG_ERROR("%s: tensor '%s': unknown type id %u", f->name, name, ti->type);
        return ERR_UNSUPPORTED;
    }
    if (ti->ne[0] % tr->block_size != 0) {
        LOG_ERROR("%s: tensor '%s': row of %lld elements is not a multiple of the %s block "
                  "size %d", f->name, name, (long long)ti->ne[0], tr->name, tr->block_size);
        return ERR_FORMAT;
    }
    uint64_t n_blocks = (uint64_t)n_elem / (uint64_t)tr->block_size;
    if (n_blocks > (uint64_t)SIZE_MAX / tr->type_size) {
        LOG_ERROR("%s: tensor '%s': byte size overflows", f->name, name);
        return ERR_FORMAT;
    }
    ti->nbytes = (size_t)n_blocks * tr->type_size;
    return 0;

truncated:
    LOG_ERROR("%s: tensor '%s': info runs past the end of the file", f->name, name);
    return ERR_FORMAT;
}

static int str_cmp(const void *a, const void *b) {
    const struct gguf_str *x = a;
    const struct gguf_str *y = b;
    size_t n = x->len < y->len ? (size_t)x->len : (size_t)y->len;
    int c = n ? memcmp(x->data, y->data, n) : 0;
    if (c) return c;
    return (x->len > y->len) - (x->len < y->len);
}

/* Sorts names[0..n) (the caller's scratch copy) and reports a name that
 * appears twice: 0, or ERR_FORMAT with *out_dup set. O(n log n), since a
 * hostile file can hold hundreds of thousands of short names. */
static int find_duplicate(struct gguf_str *names, int64_t n, struct gguf_str *out_dup) {
    if (n < 2) return 0;
    qsort(names, (size_t)n, sizeof(*names), str_cmp);
    for (int64_t i = 1; i < n; i++) {
        if (str_cmp(&names[i - 1], &names[i]) == 0) {
            *out_dup = names[i];
            return ERR_FORMAT;
        }
    }
    return 0;
}

/* Rejects a key (what == "key") or tensor name listed twice. */
static int check_unique(struct gguf_file *f, const char *what, int64_t n,
                        const struct gguf_str *(*name_at)(const struct gguf_file *, int64_t)) {
    struct gguf_str *names = malloc((size_t)(n ? n : 1) * sizeof(*names));
    if (!names) return ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) names[i] = *name_at(f, i);
    struct gguf_str dup;
    int err = find_duplicate(names, n, &dup);
    free(names);
    if (err) {
        char name[128];
        LOG_ERROR("%s: %s '%s' appears twice", f->name, what,
                  gguf_str_copy(dup, name, sizeof(name)));
    }
    return err;
}

static const struct gguf_str *kv_key_at(const struct gguf_file *f, int64_t i) {
    return &f->kvs[i].key;
}

static const struct gguf_str *tensor_name_at(const struct gguf_file *f, int64_t i) {
    return &f->tensors[i].name;
}

static int parse_cursor(struct gguf_file *f, struct file_cursor *cp) {
    struct file_cursor c = *cp;
    uint32_t magic;
    if (file_cursor_u32(&c, &magic) || magic != GGUF_MAGIC) {
        LOG_ERROR("%s: not a GGUF file (bad magic)", f->name);
        return ERR_FORMAT;
    }
    if (file_cursor_u32(&c, &f->version)) {
        LOG_ERROR("%s: truncated header", f->name);
        return ERR_FORMAT;
    }
    if (f->version == 1) {
        LOG_ERROR("%s: GGUF version 1 is not supported (only 2 and 3); re-convert the model",
                  f->name);
        return ERR_UNSUPPORTED;
    }
    if (f->version != 2 && f->version != 3) {
        LOG_ERROR("%s: unknown GGUF version %u (2 and 3 are supported)", f->name, f->version);
        return ERR_UNSUPPORTED;
    }
    uint64_t n_tensors;
    uint64_t n_kv;
    if (file_cursor_u64(&c, &n_tensors) || file_cursor_u64(&c, &n_kv)) {
        LOG_ERROR("%s: truncated header", f->name);
        return ERR_FORMAT;
    }
    // A kv costs at least 8 (key length) + 4 (type) + 1 bytes; a tensor info
    // at least 8 + 4 + 8 + 4 + 8. Counts beyond that cannot be in the file.
    if (n_kv > file_cursor_left(&c) / 13) {
        LOG_ERROR("%s: header claims %llu metadata entries, more than the file can hold",
                  f->name, (unsigned long long)n_kv);
        return ERR_FORMAT;
    }
    if (n_tensors > file_cursor_left(&c) / 32) {
        LOG_ERROR("%s: header claims %llu tensors, more than the file can hold", f->name,
                  (unsigned long long)n_tensors);
        return ERR_FORMAT;
    }
    f->n_kv = (int64_t)n_kv;
    f->kvs = calloc((size_t)(n_kv ? n_kv : 1), sizeof(*f->kvs));
    if (!f->kvs) return ERR_NOMEM;
    for (int64_t i = 0; i < f->n_kv; i++) {
        int err = parse_kv(f, &c, &f->kvs[i], i);
        if (err) return err;
    }
    // Duplicate keys (two general.alignment, say) would make readers disagree.
    int err = check_unique(f, "key", f->n_kv, kv_key_at);
    if (err) return err;

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *al = gguf_find(f, "general.alignment");
    if (al) {
        uint32_t a = 0;
        if (al->type != GGUF_TYPE_UINT32 || (memcpy(&a, al->data, 4), a == 0) || (a & (a - 1))) {
            LOG_ERROR("%s: general.alignment must be a uint32 power of two", f->name);
            return ERR_FORMAT;
        }
        f->alignment = a;
    }

    f->n_tensors = (int64_t)n_tensors;
    f->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof(*f->tensors));
    if (!f->tensors) return ERR_NOMEM;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        err = parse_tensor_info(f, &c, &f->tensors[i], i);
        if (err) return err;
    }

    // The data section starts at the next multiple of the alignment.
    size_t pad = (f->alignment - c.pos % f->alignment) % f->alignment;
    if (n_tensors == 0) {
        f->data_offset = c.pos + pad <= f->size ? c.pos + pad : f->size;
        return 0;
    }
    if (pad > file_cursor_left(&c)) {
        LOG_ERROR("%s: truncated before the tensor data section", f->name);
        return ERR_FORMAT;
    }
    f->data_offset = c.pos + pad;
    size_t data_size = f->size - f->data_offset;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor_info *ti = &f->tensors[i];
        char name[128];
        gguf_str_copy(ti->name, name, sizeof(name));
        if (ti->offset % f->alignment != 0) {
            LOG_ERROR("%s: tensor '%s': offset %llu is not a multiple of the alignment %u",
                      f->name, name, (unsigned long long)ti->offset, f->alignment);
            return ERR_FORMAT;
        }
        if (ti->offset > data_size || ti->nbytes > data_size - ti->offset) {
            LOG_ERROR("%s: tensor '%s': data [%llu, +%zu) lies beyond the end of the file "
                      "(data section is %zu bytes)", f->name, name,
                      (unsigned long long)ti->offset, ti->nbytes, data_size);
            return ERR_FORMAT;
        }
        ti->data = f->data + f->data_offset + ti->offset;
    }
    return check_unique(f, "tensor", f->n_tensors, tensor_name_at);
}

/* The header's parse, over the bytes read whole or read in as it goes. */
static int parse(struct gguf_file *f) {
    struct file_cursor c;
    if (f->is_sparse) {
        file_cursor_init_sparse(&c, &f->sparse);
    } else {
        file_cursor_init(&c, f->data, f->size);
    }
    int err = parse_cursor(f, &c);
    f->header_read = f->is_sparse ? f->sparse.n_read : f->data_offset;
    return err;
}

int gguf_open_memory(const void *data, size_t size, const char *name, struct gguf_file **out) {
    *out = NULL;
    struct gguf_file *f = calloc(1, sizeof(*f));
    if (!f) return ERR_NOMEM;
    f->name = strdup(name ? name : "(memory)");
    if (!f->name) {
        free(f);
        return ERR_NOMEM;
    }
    f->data = data;
    f->size = size;
    int err = parse(f);
    if (err) {
        gguf_close(f);
        return err;
    }
    *out = f;
    return 0;
}

int gguf_open(const char *path, struct gguf_file **out) {
    *out = NULL;
    struct file_map map;
    int err = file_map(path, &map);
    if (err) return err;
    struct gguf_file *f = NULL;
    err = gguf_open_memory(map.data, map.size, path, &f);
    if (err) {
        file_unmap(&map);
        return err;
    }
    f->map = map;
    *out = f;
    return 0;
}

int gguf_open_sparse(const char *path, struct gguf_file **out) {
    *out = NULL;
    struct gguf_file *f = calloc(1, sizeof(*f));
    if (!f) return ERR_NOMEM;
    f->sparse.fd = -1;
    f->name = strdup(path);
    int err = f->name ? file_sparse_open(path, &f->sparse) : ERR_NOMEM;
    if (!err) {
        f->is_sparse = true;
        f->data = f->sparse.map.data;
        f->size = f->sparse.map.size;
        err = parse(f);
    }
    if (err) {
        gguf_close(f);
        return err;
    }
    *out = f;
    return 0;
}

int gguf_read(struct gguf_file *f, const void *p, size_t n) {
    if (!f->is_sparse) return 0;
    const uint8_t *b = p;
    const uint8_t *lo = f->data + f->data_offset;
    if (b < lo || b > f->data + f->size || n > (size_t)(f->data + f->size - b)) {
        LOG_ERROR("%s: %zu bytes asked for outside the tensor data", f->name, n);
        return ERR_INVAL;
    }
    return file_sparse_read(&f->sparse, (size_t)(b - f->data), n);
}

void gguf_will_read_all(struct gguf_file *f) {
    if (f->is_sparse) file_sparse_will_read(&f->sparse, f->data_offset, f->size - f->data_offset);
}

void gguf_seal(struct gguf_file *f) {
    if (f->is_sparse) file_sparse_seal(&f->sparse);
}

size_t gguf_header_bytes_read(const struct gguf_file *f) { return f->header_read; }

size_t gguf_data_bytes_read(const struct gguf_file *f) {
    if (!f->is_sparse) return f->size - f->data_offset;
    return f->sparse.n_read - f->header_read;
}

void gguf_close(struct gguf_file *f) {
    if (!f) return;
    if (f->kvs) {
        for (int64_t i = 0; i < f->n_kv; i++) free((void *)f->kvs[i].strs);
    }
    free(f->kvs);
    free(f->tensors);
    free(f->name);
    file_unmap(&f->map);
    if (f->is_sparse) file_sparse_close(&f->sparse);
    free(f);
}

uint32_t gguf_version(const struct gguf_file *f) { return f->version; }
uint32_t gguf_alignment(const struct gguf_file *f) { return f->alignment; }
const char *gguf_name(const struct gguf_file *f) { return f->name; }
int64_t gguf_n_kv(const struct gguf_file *f) { return f->n_kv; }

const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, int64_t i) {
    ASSERT(i >= 0 && i < f->n_kv);
    return &f->kvs[i];
}

bool gguf_str_eq(struct gguf_str s, const char *z) {
    size_t n = strlen(z);
    return s.len == n && memcmp(s.data, z, n) == 0;
}

char *gguf_str_copy(struct gguf_str s, char *dst, size_t n) {
    ASSERT(n > 0);
    size_t m = s.len < n - 1 ? (size_t)s.len : n - 1;
    memcpy(dst, s.data, m);
    dst[m] = '\0';
    return dst;
}

const struct gguf_kv *gguf_find(const struct gguf_file *f, const char *key) {
    // Parsed entries only: during parse() n_kv counts entries not yet read,
    // whose key views are still zeroed (len 0), which never equal a real key.
    for (int64_t i = 0; i < f->n_kv; i++) {
        if (f->kvs[i].key.data && gguf_str_eq(f->kvs[i].key, key)) return &f->kvs[i];
    }
    return NULL;
}

/* Reads an integer scalar of any width into a 128-bit-safe pair. */
static int kv_int(const struct gguf_kv *kv, bool *neg, uint64_t *mag) {
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } v;
    size_t sz = scalar_size(kv->type);
    if (!sz || kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64 ||
        kv->type == GGUF_TYPE_BOOL) {
        return ERR_FORMAT;
    }
    memcpy(&v, kv->data, sz);
    int64_t s = 0;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: *neg = false; *mag = v.u8; return 0;
    case GGUF_TYPE_UINT16: *neg = false; *mag = v.u16; return 0;
    case GGUF_TYPE_UINT32: *neg = false; *mag = v.u32; return 0;
    case GGUF_TYPE_UINT64: *neg = false; *mag = v.u64; return 0;
    case GGUF_TYPE_INT8: s = v.i8; break;
    case GGUF_TYPE_INT16: s = v.i16; break;
    case GGUF_TYPE_INT32: s = v.i32; break;
    case GGUF_TYPE_INT64: s = v.i64; break;
    default: return ERR_FORMAT;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return 0;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out) {
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv) return ERR_NOTFOUND;
    bool neg;
    uint64_t mag;
    if (kv_int(kv, &neg, &mag) || neg || mag > UINT32_MAX) {
        LOG_ERROR("%s: key '%s' must be an unsigned 32-bit integer (it is %s)", f->name, key,
                  gguf_type_name(kv->type));
        return ERR_FORMAT;
    }
    *out = (uint32_t)mag;
    return 0;
}

int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out) {
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv) return ERR_NOTFOUND;
    bool neg;
    uint64_t mag;
    if (kv_int(kv, &neg, &mag) || (!neg && mag > (uint64_t)INT64_MAX) ||
        (neg && mag > (uint64_t)INT64_MAX + 1)) {
        LOG_ERROR("%s: key '%s' must be an integer (it is %s)", f->name, key,
                  gguf_type_name(kv->type));
        return ERR_FORMAT;
    }
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return 0;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out) {
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv) return ERR_NOTFOUND;
    if (kv->type == GGUF_TYPE_FLOAT32) {
        memcpy(out, kv->data, 4);
        return 0;
    }
    if (kv->type == GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, kv->data, 8);
        if (isfinite(d) && fabs(d) > FLT_MAX) {
            LOG_ERROR("%s: key '%s': %g does not fit in a float", f->name, key, d);
            return ERR_FORMAT;
        }
        *out = (float)d;
        return 0;
    }
    LOG_ERROR("%s: key '%s' must be a float (it is %s)", f->name, key, gguf_type_name(kv->type));
    return ERR_FORMAT;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out) {
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv) return ERR_NOTFOUND;
    if (kv->type != GGUF_TYPE_BOOL) {
        LOG_ERROR("%s: key '%s' must be a bool (it is %s)", f->name, key,
                  gguf_type_name(kv->type));
        return ERR_FORMAT;
    }
    *out = kv->data[0] != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out) {
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv) return ERR_NOTFOUND;
    if (kv->type != GGUF_TYPE_STRING) {
        LOG_ERROR("%s: key '%s' must be a string (it is %s)", f->name, key,
                  gguf_type_name(kv->type));
        return ERR_FORMAT;
    }
    uint64_t len;
    memcpy(&len, kv->data, 8);
    out->len = len;
    out->data = (const char *)kv->data + 8;
    return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_type elem_type,
                 const struct gguf_kv **out) {
    const struct gguf_kv *kv = gguf_find(f, key);
    if (!kv) return ERR_NOTFOUND;
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != elem_type) {
        LOG_ERROR("%s: key '%s' must be an array of %s (it is %s%s%s)", f->name, key,
                  gguf_type_name(elem_type), gguf_type_name(kv->type),
                  kv->type == GGUF_TYPE_ARRAY ? " of " : "",
                  kv->type == GGUF_TYPE_ARRAY ? gguf_type_name(kv->arr_type) : "");
        return ERR_FORMAT;
    }
    *out = kv;
    return 0;
}

float gguf_arr_f32(const struct gguf_kv *kv, uint64_t i) {
    ASSERT(kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_FLOAT32 && i < kv->arr_n);
    float v;
    memcpy(&v, kv->data + i * 4, 4);
    return v;
}

int32_t gguf_arr_i32(const struct gguf_kv *kv, uint64_t i) {
    ASSERT(kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_INT32 && i < kv->arr_n);
    int32_t v;
    memcpy(&v, kv->data + i * 4, 4);
    return v;
}

uint32_t gguf_arr_u32(const struct gguf_kv *kv, uint64_t i) {
    ASSERT(kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_UINT32 && i < kv->arr_n);
    uint32_t v;
    memcpy(&v, kv->data + i * 4, 4);
    return v;
}

int64_t gguf_n_tensors(const struct gguf_file *f) { return f->n_tensors; }

const struct gguf_tensor_info *gguf_tensor_at(const struct gguf_file *f, int64_t i) {
    ASSERT(i >= 0 && i < f->n_tensors);
    return &f->tensors[i];
}

const struct gguf_tensor_info *gguf_find_tensor(const struct gguf_file *f, const char *name) {
    for (int64_t i = 0; i < f->n_tensors; i++) {
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    }
    return NULL;
}
