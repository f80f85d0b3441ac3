/*
 * quantize.c - whole-model quantizer: type rules per tensor (llama.cpp's
 * llama_tensor_get_type for dense Llama-family models, re-derived from its
 * documented behaviour), then a GGUF v3 writer that copies every metadata
 * entry in order and converts the matrices row by row on a worker pool.
 *
 * Output layout: header, metadata, tensor infos, padding to the alignment,
 * then each tensor's data at an offset that is a multiple of the alignment.
 * Memory: one input tensor converted at a time (its output bytes buffered).
 */
#define LOG_TAG "quantize"
#include "engine/model/quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/base/progress.h"
#include "engine/format/gguf.h"
#include "engine/kernels/threadpool.h"

static const struct {
    const char *name;
    enum quantize_ftype ftype;
} ftype_names[] = {
    {"F32", QUANTIZE_FTYPE_F32},       {"F16", QUANTIZE_FTYPE_F16},
    {"BF16", QUANTIZE_FTYPE_BF16},     {"Q8_0", QUANTIZE_FTYPE_Q8_0},
    {"Q4_0", QUANTIZE_FTYPE_Q4_0},     {"Q4_1", QUANTIZE_FTYPE_Q4_1},
    {"Q5_0", QUANTIZE_FTYPE_Q5_0},     {"Q5_1", QUANTIZE_FTYPE_Q5_1},
    {"Q2_K", QUANTIZE_FTYPE_Q2_K},     {"Q3_K_S", QUANTIZE_FTYPE_Q3_K_S},
    {"Q3_K_M", QUANTIZE_FTYPE_Q3_K_M}, {"Q3_K", QUANTIZE_FTYPE_Q3_K_M},
    {"Q3_K_L", QUANTIZE_FTYPE_Q3_K_L}, {"Q4_K_S", QUANTIZE_FTYPE_Q4_K_S},
    {"Q4_K_M", QUANTIZE_FTYPE_Q4_K_M}, {"Q4_K", QUANTIZE_FTYPE_Q4_K_M},
    {"Q5_K_S", QUANTIZE_FTYPE_Q5_K_S}, {"Q5_K_M", QUANTIZE_FTYPE_Q5_K_M},
    {"Q5_K", QUANTIZE_FTYPE_Q5_K_M},   {"Q6_K", QUANTIZE_FTYPE_Q6_K},
};

int32_t quantize_ftype_from_name(const char *s) {
    for (size_t i = 0; i < sizeof(ftype_names) / sizeof(ftype_names[0]); i++) {
        if (strcasecmp(s, ftype_names[i].name) == 0) return ftype_names[i].ftype;
    }
    return -1;
}

const char *quantize_ftype_names(void) {
    return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S, Q3_K_M (Q3_K), Q3_K_L, "
           "Q4_K_S, Q4_K_M (Q4_K), Q5_K_S, Q5_K_M (Q5_K), Q6_K";
}

static enum quant_type ftype_default_type(enum quantize_ftype f) {
    switch (f) {
    case QUANTIZE_FTYPE_F32: return QUANT_F32;
    case QUANTIZE_FTYPE_F16: return QUANT_F16;
    case QUANTIZE_FTYPE_BF16: return QUANT_BF16;
    case QUANTIZE_FTYPE_Q4_0: return QUANT_Q4_0;
    case QUANTIZE_FTYPE_Q4_1: return QUANT_Q4_1;
    case QUANTIZE_FTYPE_Q8_0: return QUANT_Q8_0;
    case QUANTIZE_FTYPE_Q5_0: return QUANT_Q5_0;
    case QUANTIZE_FTYPE_Q5_1: return QUANT_Q5_1;
    case QUANTIZE_FTYPE_Q2_K: return QUANT_Q2_K;
    case QUANTIZE_FTYPE_Q3_K_S:
    case QUANTIZE_FTYPE_Q3_K_M:
    case QUANTIZE_FTYPE_Q3_K_L: return QUANT_Q3_K;
    case QUANTIZE_FTYPE_Q4_K_S:
    case QUANTIZE_FTYPE_Q4_K_M: return QUANT_Q4_K;
    case QUANTIZE_FTYPE_Q5_K_S:
    case QUANTIZE_FTYPE_Q5_K_M: return QUANT_Q5_K;
    case QUANTIZE_FTYPE_Q6_K: return QUANT_Q6_K;
    }
    UNREACHABLE();
}

/* llama.cpp's "use more bits" layers: the first and last eighth, and every
 * third layer in between. */
static bool use_more_bits(int32_t i, int32_t n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool is_k_quant(enum quant_type t) {
    return t == QUANT_Q2_K || t == QUANT_Q3_K || t == QUANT_Q4_K || t == QUANT_Q5_K ||
           t == QUANT_Q6_K;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Layer index of "blk.N.xxx", or -1. */
static int32_t layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    return (int32_t)strtol(name + 4, NULL, 10);
}

enum quant_type quantize_tensor_type(enum quantize_ftype ftype, const char *name, int64_t ne0,
                                     int32_t i_attn_v, const struct quantize_model_shape *shape) {
    enum quant_type t = ftype_default_type(ftype);
    if (!quant_traits(t)->block_size || t == QUANT_F32 || t == QUANT_F16 || t == QUANT_BF16) {
        return t;  // float file types: every matrix in that type, no mix rules
    }
    const enum quantize_ftype f = ftype;
    const bool is_output = strcmp(name, "output.weight") == 0 ||
                           (!shape->has_output && strcmp(name, "token_embd.weight") == 0);
    const int32_t n_layer = shape->n_layer;
    const int32_t il = layer_of(name);
    if (is_output) {
        // the classifier gets 6 bits, or 8 when its rows do not split in 256
        if (ne0 % QK_K != 0) {
            t = QUANT_Q8_0;
        } else if (t != QUANT_Q8_0) {
            t = QUANT_Q6_K;
        }
    } else if (ends_with(name, "attn_v.weight")) {
        const int32_t n_gqa = shape->n_head_kv > 0 ? shape->n_head / shape->n_head_kv : 1;
        if (f == QUANTIZE_FTYPE_Q2_K) {
            t = n_gqa >= 4 ? QUANT_Q4_K : QUANT_Q3_K;
        } else if (f == QUANTIZE_FTYPE_Q3_K_M) {
            t = i_attn_v < 2 ? QUANT_Q5_K : QUANT_Q4_K;
        } else if (f == QUANTIZE_FTYPE_Q3_K_L) {
            t = QUANT_Q5_K;
        } else if ((f == QUANTIZE_FTYPE_Q4_K_M || f == QUANTIZE_FTYPE_Q5_K_M) &&
                   use_more_bits(i_attn_v, shape->n_attn_v)) {
            t = QUANT_Q6_K;
        } else if (f == QUANTIZE_FTYPE_Q4_K_S && i_attn_v < 4) {
            t = QUANT_Q5_K;
        }
    } else if (ends_with(name, "ffn_down.weight") && il >= 0) {
        if (f == QUANTIZE_FTYPE_Q2_K) {
            t = QUANT_Q3_K;
        } else if (f == QUANTIZE_FTYPE_Q3_K_M) {
            t = il < n_layer / 16 ? QUANT_Q5_K : QUANT_Q4_K;
        } else if (f == QUANTIZE_FTYPE_Q3_K_L) {
            t = QUANT_Q5_K;
        } else if ((f == QUANTIZE_FTYPE_Q4_K_M || f == QUANTIZE_FTYPE_Q5_K_M) &&
                   use_more_bits(il, n_layer)) {
            t = QUANT_Q6_K;
        } else if (f == QUANTIZE_FTYPE_Q4_K_S && il < n_layer / 8) {
            t = QUANT_Q5_K;
        }
    } else if (ends_with(name, "attn_output.weight")) {
        if (f == QUANTIZE_FTYPE_Q2_K) {
            t = QUANT_Q3_K;
        } else if (f == QUANTIZE_FTYPE_Q3_K_M) {
            t = QUANT_Q4_K;
        } else if (f == QUANTIZE_FTYPE_Q3_K_L) {
            t = QUANT_Q5_K;
        }
    }
    // Rows that do not split into the type's blocks (llama.cpp's fallbacks;
    // Q2_K/Q3_K go to Q4_0 as we have no IQ4_NL).
    if (is_k_quant(t) && ne0 % QK_K != 0) {
        switch (t) {
        case QUANT_Q2_K:
        case QUANT_Q3_K: t = QUANT_Q4_0; break;
        case QUANT_Q4_K: t = QUANT_Q5_0; break;
        case QUANT_Q5_K: t = QUANT_Q5_1; break;
        case QUANT_Q6_K: t = QUANT_Q8_0; break;
        default: UNREACHABLE();
        }
    }
    if (ne0 % quant_traits(t)->block_size != 0) t = QUANT_F16;
    return t;
}

/* ---- GGUF writer -------------------------------------------------------------- */

struct writer {
    FILE *fp;
    const char *path;
    int err;   // first write error, sticky
};

static void put(struct writer *w, const void *p, size_t n) {
    if (w->err || n == 0) return;
    if (fwrite(p, 1, n, w->fp) != n) {
        LOG_ERROR("%s: write failed", w->path);
        w->err = ERR_IO;
    }
}

static void put_u32(struct writer *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(struct writer *w, uint64_t v) { put(w, &v, 8); }

static void put_str(struct writer *w, const char *s, uint64_t len) {
    put_u64(w, len);
    put(w, s, (size_t)len);
}

static size_t scalar_size(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64: return 8;
    case GGUF_TYPE_STRING:
    case GGUF_TYPE_ARRAY:
    case GGUF_TYPE_COUNT: return 0;
    }
    return 0;
}

/* Copies one metadata entry as it was. Nested arrays are refused. */
static int put_kv(struct writer *w, const struct gguf_kv *kv) {
    put_str(w, kv->key.data, kv->key.len);
    put_u32(w, (uint32_t)kv->type);
    if (kv->type == GGUF_TYPE_STRING) {
        uint64_t len;
        memcpy(&len, kv->data, 8);
        put_str(w, (const char *)kv->data + 8, len);
    } else if (kv->type == GGUF_TYPE_ARRAY) {
        put_u32(w, (uint32_t)kv->arr_type);
        put_u64(w, kv->arr_n);
        if (kv->arr_type == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < kv->arr_n; i++) put_str(w, kv->strs[i].data, kv->strs[i].len);
        } else if (kv->arr_type == GGUF_TYPE_ARRAY) {
            LOG_ERROR("%s: key '%.*s' is a nested array, which we do not copy", w->path,
                      (int)kv->key.len, kv->key.data);
            return ERR_UNSUPPORTED;
        } else {
            put(w, kv->data, (size_t)kv->arr_n * scalar_size(kv->arr_type));
        }
    } else {
        put(w, kv->data, scalar_size(kv->type));
    }
    return w->err;
}

static void put_kv_u32(struct writer *w, const char *key, uint32_t v) {
    put_str(w, key, strlen(key));
    put_u32(w, GGUF_TYPE_UINT32);
    put_u32(w, v);
}

static bool key_is(const struct gguf_kv *kv, const char *key) {
    return kv->key.len == strlen(key) && memcmp(kv->key.data, key, kv->key.len) == 0;
}

/* ---- the conversion ------------------------------------------------------------ */

struct convert_job {
    const struct gguf_tensor_info *ti;
    enum quant_type out_type;
    uint8_t *out;            // [n_rows][out_row] bytes
    size_t in_row, out_row;  // bytes per row
    float **rows;            // [n_threads][ne0] f32 scratch, owned by the caller
};

static void convert_rows(void *arg, int64_t r0, int64_t r1, int32_t ith, int32_t nth) {
    (void)nth;
    const struct convert_job *j = arg;
    const int64_t ne0 = j->ti->ne[0];
    const struct quant_traits *in = quant_traits(j->ti->type);
    const struct quant_traits *out = quant_traits(j->out_type);
    float *row = j->rows[ith];
    for (int64_t r = r0; r < r1; r++) {
        in->to_f32((const uint8_t *)j->ti->data + (size_t)r * j->in_row, row, ne0);
        out->from_f32(row, j->out + (size_t)r * j->out_row, ne0);
    }
}

static char *name_z(struct gguf_str s, char *buf, size_t n) { return gguf_str_copy(s, buf, n); }

/* What the type mixes ask of the whole model (layers, heads, attn_v count,
 * a separate output), and the longest row any tensor has. */
static void read_shape(const struct gguf_file *in, struct quantize_model_shape *shape,
                       int64_t *max_ne0) {
    struct gguf_str arch = {0};
    char key[128], name[256];
    *shape = (struct quantize_model_shape){0};
    if (gguf_get_str(in, "general.architecture", &arch) == 0 && arch.len < 64) {
        uint32_t v = 0;
        snprintf(key, sizeof(key), "%.*s.block_count", (int)arch.len, arch.data);
        if (gguf_get_u32(in, key, &v) == 0) shape->n_layer = (int32_t)v;
        snprintf(key, sizeof(key), "%.*s.attention.head_count", (int)arch.len, arch.data);
        if (gguf_get_u32(in, key, &v) == 0) shape->n_head = (int32_t)v;
        shape->n_head_kv = shape->n_head;
        snprintf(key, sizeof(key), "%.*s.attention.head_count_kv", (int)arch.len, arch.data);
        if (gguf_get_u32(in, key, &v) == 0) shape->n_head_kv = (int32_t)v;
    }
    *max_ne0 = 1;
    for (int64_t i = 0; i < gguf_n_tensors(in); i++) {
        const struct gguf_tensor_info *ti = gguf_tensor_at(in, i);
        name_z(ti->name, name, sizeof(name));
        if (ends_with(name, "attn_v.weight")) shape->n_attn_v++;
        if (strcmp(name, "output.weight") == 0) shape->has_output = 1;
        if (ti->ne[0] > *max_ne0) *max_ne0 = ti->ne[0];
    }
}

/* Every tensor's output type into types[], so a bad input fails before
 * anything is written: matrices get the mix's type, the rest keep theirs.
 * Returns 0 or ERR_UNSUPPORTED (logged) for a matrix that is not f32, f16
 * or bf16. */
static int choose_types(const struct gguf_file *in, const struct quantize_params *p,
                        const struct quantize_model_shape *shape, enum quant_type *types) {
    char name[256];
    int32_t i_attn_v = 0;
    for (int64_t i = 0; i < gguf_n_tensors(in); i++) {
        const struct gguf_tensor_info *ti = gguf_tensor_at(in, i);
        name_z(ti->name, name, sizeof(name));
        const bool is_matrix = ti->n_dims >= 2 && ends_with(name, ".weight");
        if (!is_matrix) {
            types[i] = (enum quant_type)ti->type;
            continue;
        }
        if (ti->type != QUANT_F32 && ti->type != QUANT_F16 && ti->type != QUANT_BF16) {
            LOG_ERROR("%s: tensor '%s' has type %s; quantize reads f32, f16 or bf16 matrices",
                      p->in_path, name, quant_name(ti->type));
            return ERR_UNSUPPORTED;
        }
        types[i] = quantize_tensor_type(p->ftype, name, ti->ne[0], i_attn_v, shape);
        if (ends_with(name, "attn_v.weight")) i_attn_v++;
    }
    return 0;
}

/* The output's header: GGUF v3, the input's metadata with general.file_type
 * and general.quantization_version set, the tensor infos with their new types
 * and aligned offsets, and the padding up to the data. Write errors stay in
 * w->err; returns 0 or an error of put_kv() or ftell(). */
static int write_header(struct writer *w, const struct gguf_file *in,
                        const struct quantize_params *p, const enum quant_type *types) {
    const int64_t n_tensors = gguf_n_tensors(in);
    const uint32_t alignment = gguf_alignment(in);
    int64_t n_kv = gguf_n_kv(in);
    bool has_ftype = false, has_qver = false;
    for (int64_t i = 0; i < n_kv; i++) {
        has_ftype |= key_is(gguf_kv_at(in, i), "general.file_type");
        has_qver |= key_is(gguf_kv_at(in, i), "general.quantization_version");
    }
    // header: magic, version 3, tensor count, metadata count
    put_u32(w, GGUF_MAGIC);
    put_u32(w, 3);
    put_u64(w, (uint64_t)n_tensors);
    put_u64(w, (uint64_t)(n_kv + !has_ftype + !has_qver));
    for (int64_t i = 0; i < n_kv; i++) {
        const struct gguf_kv *kv = gguf_kv_at(in, i);
        if (key_is(kv, "general.file_type")) {
            put_kv_u32(w, "general.file_type", (uint32_t)p->ftype);
        } else if (key_is(kv, "general.quantization_version")) {
            put_kv_u32(w, "general.quantization_version", 2);
        } else {
            int err = put_kv(w, kv);
            if (err) return err;
        }
    }
    if (!has_ftype) put_kv_u32(w, "general.file_type", (uint32_t)p->ftype);
    if (!has_qver) put_kv_u32(w, "general.quantization_version", 2);
    // tensor infos, data offsets aligned
    uint64_t offset = 0;
    for (int64_t i = 0; i < n_tensors; i++) {
        const struct gguf_tensor_info *ti = gguf_tensor_at(in, i);
        put_str(w, ti->name.data, ti->name.len);
        put_u32(w, ti->n_dims);
        for (uint32_t d = 0; d < ti->n_dims; d++) put_u64(w, (uint64_t)ti->ne[d]);
        put_u32(w, (uint32_t)types[i]);
        put_u64(w, offset);
        int64_t n_rows = ti->ne[1] * ti->ne[2] * ti->ne[3];
        offset += (quant_row_size(types[i], ti->ne[0]) * (size_t)n_rows + alignment - 1) /
                  alignment * alignment;
    }
    static const uint8_t zeros[256];
    long pos = ftell(w->fp);
    if (pos < 0) return ERR_IO;
    put(w, zeros, (alignment - (uint64_t)pos % alignment) % alignment);
    return 0;
}

/* Every tensor's data, converted on the pool (rows: one f32 row per thread)
 * where its type changes, each padded to the alignment. Write errors stay in
 * w->err; returns 0 or ERR_NOMEM. */
static int write_tensors(struct writer *w, const struct gguf_file *in,
                         const enum quant_type *types, struct threadpool *pool, float **rows,
                         bool show_progress) {
    static const uint8_t zeros[256];
    const uint32_t alignment = gguf_alignment(in);
    char name[256];
    int64_t in_bytes = 0, in_done = 0;
    for (int64_t i = 0; i < gguf_n_tensors(in); i++) in_bytes += (int64_t)gguf_tensor_at(in, i)->nbytes;
    struct progress pr;
    if (show_progress) progress_begin(&pr, "quantize", in_bytes, "MiB", (int64_t)1 << 20);
    for (int64_t i = 0; i < gguf_n_tensors(in) && !w->err; i++) {
        const struct gguf_tensor_info *ti = gguf_tensor_at(in, i);
        name_z(ti->name, name, sizeof(name));
        const int64_t n_rows = ti->ne[1] * ti->ne[2] * ti->ne[3];
        const size_t out_row = quant_row_size(types[i], ti->ne[0]);
        const size_t nbytes = out_row * (size_t)n_rows;
        if (types[i] == (enum quant_type)ti->type) {
            put(w, ti->data, nbytes);
        } else {
            uint8_t *buf = malloc(nbytes);
            if (!buf) {
                if (show_progress) progress_end(&pr);
                return ERR_NOMEM;
            }
            struct convert_job job = {.ti = ti, .out_type = types[i], .out = buf,
                                      .in_row = quant_row_size(ti->type, ti->ne[0]),
                                      .out_row = out_row, .rows = rows};
            threadpool_run(pool, n_rows, 1, convert_rows, &job);
            put(w, buf, nbytes);
            free(buf);
        }
        put(w, zeros, (alignment - nbytes % alignment) % alignment);
        LOG_INFO("%-28s [%lld, %lld] %s -> %s", name, (long long)ti->ne[0], (long long)n_rows,
                 quant_name(ti->type), quant_name(types[i]));
        in_done += (int64_t)ti->nbytes;
        if (show_progress) progress_update(&pr, in_done);
    }
    if (show_progress) progress_end(&pr);
    return 0;
}

int quantize_model(const struct quantize_params *p) {
    struct gguf_file *in = NULL;
    struct writer w = {.fp = NULL, .path = p->out_path, .err = 0};
    struct threadpool *pool = NULL;
    float **rows = NULL;
    enum quant_type *types = NULL;
    bool created = false;
    int32_t n_threads = p->n_threads > 0 ? p->n_threads : 1;
    int err = gguf_open(p->in_path, &in);
    if (err) return err;

    struct quantize_model_shape shape;
    int64_t max_ne0;
    read_shape(in, &shape, &max_ne0);
    types = calloc((size_t)gguf_n_tensors(in) + 1, sizeof(*types));
    if (!types) {
        err = ERR_NOMEM;
        goto fail;
    }
    err = choose_types(in, p, &shape, types);
    if (err) goto fail;

    pool = threadpool_create(n_threads);
    rows = calloc((size_t)n_threads, sizeof(*rows));
    if (!pool || !rows) {
        err = ERR_NOMEM;
        goto fail;
    }
    ASSERT(threadpool_n_threads(pool) == n_threads);
    for (int32_t t = 0; t < n_threads; t++) {
        rows[t] = malloc((size_t)max_ne0 * sizeof(float));
        if (!rows[t]) {
            err = ERR_NOMEM;
            goto fail;
        }
    }

    w.fp = fopen(p->out_path, "wb");
    if (!w.fp) {
        LOG_ERROR("%s: cannot create the output file", p->out_path);
        err = ERR_IO;
        goto fail;
    }
    created = true;
    err = write_header(&w, in, p, types);
    if (!err) err = write_tensors(&w, in, types, pool, rows, p->show_progress);
    if (!err) err = w.err;
    if (err) goto fail;
    if (fclose(w.fp) != 0) {
        w.fp = NULL;
        LOG_ERROR("%s: write failed", p->out_path);
        err = ERR_IO;
        goto fail;
    }
    w.fp = NULL;
    err = 0;

fail:
    if (w.fp) fclose(w.fp);
    if (err && created) remove(p->out_path);  // no half-written model left behind
    if (rows) {
        for (int32_t t = 0; t < n_threads; t++) free(rows[t]);
    }
    free(rows);
    free(types);
    threadpool_free(pool);
    gguf_close(in);
    return err;
}
