/*
 * safetensors.c - safetensors parsing with every claim checked against the file.
 *
 * The 8-byte length is read through a file_cursor; the header is parsed by
 * jansson (duplicate keys rejected by the decoder), then every entry is
 * checked and the tensor table is sorted by offset to prove that the tensors
 * tile the data section. The only allocations are the tensor array, its name
 * copies and jansson's tree of the header, all bounded by the header size
 * (itself bounded by the file and SAFETENSORS_MAX_HEADER_BYTES).
 */
#define LOG_TAG "safetensors"
#include "engine/format/safetensors.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/file.h"
#include "engine/base/log.h"
#include "engine/format/quant.h"

struct safetensors_file {
    struct file_map map;                 // owned when opened from a path
    const uint8_t *data;                 // the whole file (borrowed or the mapping)
    size_t size;
    char *name;                          // owned
    json_t *header;                      // owned: the parsed header (metadata lookups)
    const json_t *metadata;              // borrowed from header, or NULL
    int64_t n_tensors;
    struct safetensors_tensor *tensors;  // [n_tensors], owned (names too)
};

static const char *const dtype_names[] = {
    [SAFETENSORS_DTYPE_F32] = "F32",
    [SAFETENSORS_DTYPE_F16] = "F16",
    [SAFETENSORS_DTYPE_BF16] = "BF16",
};

static const size_t dtype_sizes[] = {
    [SAFETENSORS_DTYPE_F32] = 4,
    [SAFETENSORS_DTYPE_F16] = 2,
    [SAFETENSORS_DTYPE_BF16] = 2,
};

/* dtypes the format defines that we do not read (ERR_UNSUPPORTED, not FORMAT). */
static const char *const other_dtypes[] = {
    "F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL",
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64",
};

const char *safetensors_dtype_name(enum safetensors_dtype d) {
    return d >= 0 && d <= SAFETENSORS_DTYPE_BF16 ? dtype_names[d] : "?";
}

void safetensors_close(struct safetensors_file *f) {
    if (!f) return;
    for (int64_t i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    if (f->header) json_decref(f->header);
    file_unmap(&f->map);
    free(f->name);
    free(f);
}

const char *safetensors_name(const struct safetensors_file *f) { return f->name; }
int64_t safetensors_n_tensors(const struct safetensors_file *f) { return f->n_tensors; }

const struct safetensors_tensor *safetensors_tensor_at(const struct safetensors_file *f,
                                                       int64_t i) {
    ASSERT(i >= 0 && i < f->n_tensors);
    return &f->tensors[i];
}

const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name) {
    for (int64_t i = 0; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    }
    return NULL;
}

const char *safetensors_metadata(const struct safetensors_file *f, const char *key) {
    if (!f->metadata) return NULL;
    return json_string_value(json_object_get(f->metadata, key));  // NULL when absent
}

void safetensors_to_f32(const struct safetensors_tensor *t, float *dst) {
    const uint8_t *src = t->data;
    switch (t->dtype) {
    case SAFETENSORS_DTYPE_F32:
        memcpy(dst, src, t->nbytes);  // little-endian host (x86-64, as the kernels)
        return;
    case SAFETENSORS_DTYPE_F16:
    case SAFETENSORS_DTYPE_BF16:
        for (int64_t i = 0; i < t->n_elements; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = t->dtype == SAFETENSORS_DTYPE_F16 ? quant_f16_to_f32(h) : quant_bf16_to_f32(h);
        }
        return;
    }
    UNREACHABLE();
}

/* Reads a non-negative JSON integer. */
static bool get_count(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* Checks and fills one tensor entry; data_size bytes follow the header. */
static int parse_entry(const struct safetensors_file *f, const char *key, const json_t *v,
                       size_t data_size, const uint8_t *data_base, struct safetensors_tensor *t,
                       uint64_t *out_begin) {
    if (!json_is_object(v)) {
        LOG_ERROR("%s: %s: tensor '%s': entry is not an object", __func__, f->name, key);
        return ERR_FORMAT;
    }
    const char *dtype = json_string_value(json_object_get(v, "dtype"));
    const json_t *shape = json_object_get(v, "shape");
    const json_t *offs = json_object_get(v, "data_offsets");
    if (!dtype || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2) {
        LOG_ERROR("%s: %s: tensor '%s' needs a string dtype, a shape array and a "
                  "data_offsets pair", __func__, f->name, key);
        return ERR_FORMAT;
    }
    bool known = false;
    for (size_t i = 0; i < sizeof(dtype_names) / sizeof(dtype_names[0]); i++) {
        if (strcmp(dtype, dtype_names[i]) == 0) {
            t->dtype = (enum safetensors_dtype)i;
            known = true;
        }
    }
    if (!known) {
        for (size_t i = 0; i < sizeof(other_dtypes) / sizeof(other_dtypes[0]); i++) {
            if (strcmp(dtype, other_dtypes[i]) == 0) {
                LOG_ERROR("%s: %s: tensor '%s' has dtype %s; only F32, F16 and BF16 are "
                          "supported", __func__, f->name, key, dtype);
                return ERR_UNSUPPORTED;
            }
        }
        LOG_ERROR("%s: %s: tensor '%s' has unknown dtype '%.32s'", __func__, f->name, key,
                  dtype);
        return ERR_FORMAT;
    }

    size_t n_dims = json_array_size(shape);
    if (n_dims > SAFETENSORS_MAX_DIMS) {
        LOG_ERROR("%s: %s: tensor '%s' has %zu dimensions (at most %d)", __func__, f->name, key,
                  n_dims, SAFETENSORS_MAX_DIMS);
        return ERR_FORMAT;
    }
    // Read every dim first; the product is bounded by the data section, so it
    // saturates at data_size + 1 ("too big") instead of overflowing.
    uint64_t ne[SAFETENSORS_MAX_DIMS];
    bool has_zero = false;
    t->n_dims = (int32_t)n_dims;
    for (size_t d = 0; d < SAFETENSORS_MAX_DIMS; d++) t->shape[d] = 1;
    for (size_t d = 0; d < n_dims; d++) {
        if (!get_count(json_array_get(shape, d), &ne[d])) {
            LOG_ERROR("%s: %s: tensor '%s': shape[%zu] is not a non-negative integer", __func__,
                      f->name, key, d);
            return ERR_FORMAT;
        }
        if (ne[d] == 0) has_zero = true;
    }
    uint64_t n_el = has_zero ? 0 : 1;
    bool too_big = false;
    for (size_t d = 0; d < n_dims && !has_zero; d++) {
        if (ne[d] > data_size || n_el > data_size / ne[d]) {
            too_big = true;
            break;
        }
        n_el *= ne[d];
    }
    for (size_t d = 0; d < n_dims; d++) t->shape[d] = (int64_t)(too_big ? 0 : ne[d]);
    uint64_t begin, end;
    if (!get_count(json_array_get(offs, 0), &begin) || !get_count(json_array_get(offs, 1), &end)) {
        LOG_ERROR("%s: %s: tensor '%s': data_offsets are not non-negative integers", __func__,
                  f->name, key);
        return ERR_FORMAT;
    }
    if (begin > end || end > data_size) {
        LOG_ERROR("%s: %s: tensor '%s': data_offsets [%llu, %llu] outside the data section of "
                  "%zu bytes", __func__, f->name, key, (unsigned long long)begin,
                  (unsigned long long)end, data_size);
        return ERR_FORMAT;
    }
    const size_t el = dtype_sizes[t->dtype];
    if (too_big || n_el > data_size / el || n_el * el != end - begin) {
        LOG_ERROR("%s: %s: tensor '%s': shape and dtype %s need %s%llu bytes, data_offsets "
                  "give %llu", __func__, f->name, key, dtype, too_big ? "more than " : "",
                  (unsigned long long)(too_big ? data_size : n_el * el),
                  (unsigned long long)(end - begin));
        return ERR_FORMAT;
    }
    t->n_elements = (int64_t)n_el;
    t->nbytes = (size_t)(end - begin);
    t->data = data_base + begin;
    *out_begin = begin;
    return 0;
}

struct span {
    uint64_t begin;
    uint64_t end;
    int64_t i;  // tensor index, for messages
};

static int cmp_span(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* The spec's rule: sorted by offset, the tensors cover [0, data_size) with no
 * overlap and no hole. */
static int check_tiling(const struct safetensors_file *f, const uint64_t *begins,
                        size_t data_size) {
    int err = 0;
    if (f->n_tensors == 0) {
        if (data_size != 0) {
            LOG_ERROR("%s: %s: %zu data bytes but no tensors", __func__, f->name, data_size);
            return ERR_FORMAT;
        }
        return 0;
    }
    struct span *s = malloc((size_t)f->n_tensors * sizeof(*s));
    if (!s) return ERR_NOMEM;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        s[i] = (struct span){begins[i], begins[i] + f->tensors[i].nbytes, i};
    }
    qsort(s, (size_t)f->n_tensors, sizeof(*s), cmp_span);
    uint64_t at = 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        if (s[i].begin != at) {
            LOG_ERROR("%s: %s: tensor '%s' starts at data offset %llu, expected %llu (%s)",
                      __func__, f->name, f->tensors[s[i].i].name,
                      (unsigned long long)s[i].begin, (unsigned long long)at,
                      s[i].begin < at ? "overlaps the previous tensor" : "a hole before it");
            err = ERR_FORMAT;
            goto done;
        }
        at = s[i].end;
    }
    if (at != data_size) {
        LOG_ERROR("%s: %s: tensors end at data offset %llu but the data section has %zu bytes",
                  __func__, f->name, (unsigned long long)at, data_size);
        err = ERR_FORMAT;
    }
done:
    free(s);
    return err;
}

static int parse(struct safetensors_file *f) {
    struct file_cursor c;
    file_cursor_init(&c, f->data, f->size);
    uint64_t n_header;
    if (file_cursor_u64(&c, &n_header)) {
        LOG_ERROR("%s: %s: %zu bytes, too short for the header length", __func__, f->name,
                  f->size);
        return ERR_FORMAT;
    }
    if (n_header < 2 || n_header > SAFETENSORS_MAX_HEADER_BYTES ||
        n_header > file_cursor_left(&c)) {
        LOG_ERROR("%s: %s: header length %llu is impossible (file of %zu bytes, limit %u)",
                  __func__, f->name, (unsigned long long)n_header, f->size,
                  SAFETENSORS_MAX_HEADER_BYTES);
        return ERR_FORMAT;
    }
    const uint8_t *text;
    if (file_cursor_bytes(&c, n_header, &text)) return ERR_FORMAT;  // checked above
    const size_t data_size = file_cursor_left(&c);
    const uint8_t *data_base = text + n_header;

    json_error_t jerr;
    f->header = json_loadb((const char *)text, (size_t)n_header, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->header) {
        LOG_ERROR("%s: %s: header is not valid JSON at byte %d: %s", __func__, f->name,
                  jerr.position, jerr.text);
        return ERR_FORMAT;
    }
    if (!json_is_object(f->header)) {
        LOG_ERROR("%s: %s: header is not a JSON object", __func__, f->name);
        return ERR_FORMAT;
    }
    size_t n_keys = json_object_size(f->header);
    const json_t *meta = json_object_get(f->header, "__metadata__");
    if (meta) {
        const char *k;
        const json_t *mv;
        if (!json_is_object(meta)) {
            LOG_ERROR("%s: %s: __metadata__ is not an object", __func__, f->name);
            return ERR_FORMAT;
        }
        json_object_foreach((json_t *)meta, k, mv) {
            if (!json_is_string(mv)) {
                LOG_ERROR("%s: %s: __metadata__ value of '%s' is not a string", __func__,
                          f->name, k);
                return ERR_FORMAT;
            }
        }
        f->metadata = meta;
        n_keys--;
    }

    int err = 0;
    uint64_t *begins = NULL;
    if (n_keys > 0) {
        f->tensors = calloc(n_keys, sizeof(*f->tensors));
        begins = malloc(n_keys * sizeof(*begins));
        if (!f->tensors || !begins) {
            free(begins);
            return ERR_NOMEM;
        }
    }
    const char *key;
    const json_t *v;
    json_object_foreach(f->header, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        struct safetensors_tensor *t = &f->tensors[f->n_tensors];
        err = parse_entry(f, key, v, data_size, data_base, t, &begins[f->n_tensors]);
        if (err) goto done;
        t->name = strdup(key);
        if (!t->name) {
            err = ERR_NOMEM;
            goto done;
        }
        f->n_tensors++;
    }
    err = check_tiling(f, begins, data_size);
done:
    free(begins);
    return err;
}

static int open_common(struct safetensors_file *f, struct safetensors_file **out) {
    int err = parse(f);
    if (err) {
        safetensors_close(f);
        return err;
    }
    *out = f;
    return 0;
}

int safetensors_open(const char *path, struct safetensors_file **out) {
    *out = NULL;
    struct safetensors_file *f = calloc(1, sizeof(*f));
    if (!f) return ERR_NOMEM;
    f->name = strdup(path);
    if (!f->name) {
        free(f);
        return ERR_NOMEM;
    }
    int err = file_map(path, &f->map);
    if (err) {
        safetensors_close(f);
        return err;
    }
    f->data = f->map.data;
    f->size = f->map.size;
    return open_common(f, out);
}

int safetensors_open_fd(int fd, const char *name, struct safetensors_file **out) {
    *out = NULL;
    struct safetensors_file *f = calloc(1, sizeof(*f));
    if (!f) return ERR_NOMEM;
    f->name = strdup(name);
    if (!f->name) {
        free(f);
        return ERR_NOMEM;
    }
    int err = file_map_fd(fd, name, &f->map);
    if (err) {
        safetensors_close(f);
        return err;
    }
    f->data = f->map.data;
    f->size = f->map.size;
    return open_common(f, out);
}

int safetensors_open_memory(const void *data, size_t size, const char *name,
                            struct safetensors_file **out) {
    *out = NULL;
    struct safetensors_file *f = calloc(1, sizeof(*f));
    if (!f) return ERR_NOMEM;
    f->name = strdup(name ? name : "(memory)");
    if (!f->name) {
        free(f);
        return ERR_NOMEM;
    }
    f->data = data;
    f->size = size;
    return open_common(f, out);
}
