/*
 * lora.c - loading adapters beside a frozen base model (engine/lora.h): PEFT
 * LoRA directories, GGUF LoRA files (llama.cpp's convert_lora_to_gguf.py),
 * bottleneck adapter directories (docs/adapters.md); their validation against
 * the model; reference counts; and the ctx's adapter slots.
 *
 * Every file is hostile: the readers (safetensors.c, gguf.c) check bounds and
 * sizes; this file checks names, ranks, shapes and types against the model and
 * logs once, naming the file and the tensor, before anything is kept. The
 * matrices are copied out of the files (f32/f16/bf16 as they are, other GGUF
 * types converted to f32) into the layout of engine/adapter.h, so a loaded
 * adapter holds no file open.
 *
 * Threads: engine_adapter_load() runs on any thread and touches only the
 * (immutable) model; references are atomic; the slot functions belong to the
 * ctx's step thread.
 */
#define LOG_TAG "lora"
#include "engine/model/lora.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "engine/model/adapter.h"
#include "engine/model/arch.h"
#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/fault.h"
#include "engine/base/file.h"
#include "engine/base/log.h"
#include "engine/format/gguf.h"
#include "engine/kernels/kernels.h"
#include "engine/model/model.h"
#include "engine/format/quant.h"
#include "engine/format/safetensors.h"

#define LORA_CONFIG_MAX_BYTES (1u << 20)  // adapter_config.json
#define LORA_MAX_RANK 65536                // rank or bottleneck width; far above real ones
#define LORA_PATH_MAX 4096

/* Per projection: the Hugging Face module path inside a decoder layer, its
 * last component (target_modules, messages) and the GGUF tensor stem. */
static const char *const proj_hf[ADAPTER_PROJ_COUNT] = {
    [ADAPTER_PROJ_Q] = "self_attn.q_proj", [ADAPTER_PROJ_K] = "self_attn.k_proj",
    [ADAPTER_PROJ_V] = "self_attn.v_proj", [ADAPTER_PROJ_O] = "self_attn.o_proj",
    [ADAPTER_PROJ_GATE] = "mlp.gate_proj", [ADAPTER_PROJ_UP] = "mlp.up_proj",
    [ADAPTER_PROJ_DOWN] = "mlp.down_proj",
};
static const char *const proj_module[ADAPTER_PROJ_COUNT] = {
    [ADAPTER_PROJ_Q] = "q_proj", [ADAPTER_PROJ_K] = "k_proj", [ADAPTER_PROJ_V] = "v_proj",
    [ADAPTER_PROJ_O] = "o_proj", [ADAPTER_PROJ_GATE] = "gate_proj", [ADAPTER_PROJ_UP] = "up_proj",
    [ADAPTER_PROJ_DOWN] = "down_proj",
};
static const char *const proj_gguf[ADAPTER_PROJ_COUNT] = {
    [ADAPTER_PROJ_Q] = "attn_q", [ADAPTER_PROJ_K] = "attn_k", [ADAPTER_PROJ_V] = "attn_v",
    [ADAPTER_PROJ_O] = "attn_output", [ADAPTER_PROJ_GATE] = "ffn_gate",
    [ADAPTER_PROJ_UP] = "ffn_up", [ADAPTER_PROJ_DOWN] = "ffn_down",
};
static const char *const pos_name[ADAPTER_POS_COUNT] = {
    [ADAPTER_POS_ATTN] = "attn_adapter", [ADAPTER_POS_FFN] = "ffn_adapter",
};

/* The base's input and output widths of projection p. */
static void proj_shape(const struct hparams *hp, enum adapter_proj p, int32_t *n_in,
                       int32_t *n_out) {
    const int32_t n_q = hp->n_head * hp->head_dim;
    const int32_t n_kv = hp->n_head_kv * hp->head_dim;
    switch (p) {
    case ADAPTER_PROJ_Q: *n_in = hp->n_embd; *n_out = n_q; return;
    case ADAPTER_PROJ_K:
    case ADAPTER_PROJ_V: *n_in = hp->n_embd; *n_out = n_kv; return;
    case ADAPTER_PROJ_O: *n_in = n_q; *n_out = hp->n_embd; return;
    case ADAPTER_PROJ_GATE:
    case ADAPTER_PROJ_UP: *n_in = hp->n_embd; *n_out = hp->n_ff; return;
    case ADAPTER_PROJ_DOWN: *n_in = hp->n_ff; *n_out = hp->n_embd; return;
    case ADAPTER_PROJ_COUNT: break;
    }
    UNREACHABLE();
}

/* ---- matrices: from a file's rows to the adapter layout ---------------------- */

/* A matrix in a file: rows of cols elements, row-major. */
struct mat_src {
    const char *name;      // for messages
    enum quant_type type;  // f32/f16/bf16, or (GGUF) any type with a to_f32
    const void *data;      // view into the file; possibly unaligned (safetensors)
    int64_t rows;
    int64_t cols;
};

/* f32/f16/bf16 are kept as they are; anything else becomes f32. */
static enum quant_type store_type(enum quant_type t) {
    return t == QUANT_F16 || t == QUANT_BF16 ? t : QUANT_F32;
}

/* The Hugging Face row that lands at row g of a q/k projection in a GGUF file
 * converted from it (llama.cpp's convert_hf_to_gguf.py, LlamaModel.permute:
 * per head, reshape(2, hd/2).swapaxes: rows w = 2i + j come from j * hd/2 + i,
 * turning NeoX's rotate-halves layout into rotate-adjacent-pairs). */
static int64_t hf_row_of(int64_t g, int32_t head_dim) {
    const int64_t h = g / head_dim;
    const int64_t w = g % head_dim;
    return h * head_dim + (w % 2) * (head_dim / 2) + w / 2;
}

/* Copies s's rows into dst (rows x cols of store_type(s->type)); row i comes
 * from row hf_row_of(i, perm_head_dim) when perm_head_dim > 0. */
static void copy_rows(const struct mat_src *s, int32_t perm_head_dim, void *dst) {
    const enum quant_type st = store_type(s->type);
    const size_t dst_rb = (size_t)s->cols * adapter_elem_size(st);
    const size_t src_rb = quant_row_size(s->type, s->cols);
    const quant_to_f32_fn to_f32 = st == s->type ? NULL : quant_traits(s->type)->to_f32;
    for (int64_t i = 0; i < s->rows; i++) {
        const int64_t r = perm_head_dim > 0 ? hf_row_of(i, perm_head_dim) : i;
        const uint8_t *src = (const uint8_t *)s->data + (size_t)r * src_rb;
        uint8_t *d = (uint8_t *)dst + (size_t)i * dst_rb;
        if (to_f32) {
            to_f32(src, (float *)d, s->cols);  // GGUF data: aligned to the file's alignment
        } else {
            memcpy(d, src, dst_rb);
        }
    }
}

/* A [rows][cols] as rows of the store type. Adds the bytes to *bytes. */
static int make_rows(const struct mat_src *s, void **out, enum quant_type *out_type,
                     size_t *bytes) {
    *out_type = store_type(s->type);
    const size_t n = (size_t)s->rows * (size_t)s->cols * adapter_elem_size(*out_type);
    *out = fault_malloc(FAULT_SITE_ADAPTER, n ? n : 1);  // a test may make it fail
    if (!*out) return ERR_NOMEM;
    copy_rows(s, 0, *out);
    *bytes += n;
    return 0;
}

/* B [rows][cols] (rows = the projection's outputs, cols = rank) in panels of
 * the store type, rows permuted when perm_head_dim > 0. */
static int make_panels(const struct mat_src *s, int32_t perm_head_dim, void **out,
                       enum quant_type *out_type, size_t *bytes) {
    *out_type = store_type(s->type);
    void *rows = malloc((size_t)s->rows * (size_t)s->cols * adapter_elem_size(*out_type));
    if (!rows) return ERR_NOMEM;
    copy_rows(s, perm_head_dim, rows);
    *out = adapter_panels_from_rows(*out_type, rows, s->rows, s->cols, bytes);
    free(rows);
    return *out ? 0 : ERR_NOMEM;
}

static enum quant_type type_of_dtype(enum safetensors_dtype d) {
    switch (d) {
    case SAFETENSORS_DTYPE_F32: return QUANT_F32;
    case SAFETENSORS_DTYPE_F16: return QUANT_F16;
    case SAFETENSORS_DTYPE_BF16: return QUANT_BF16;
    }
    UNREACHABLE();
}

/* A safetensors matrix [rows][cols] as a mat_src. */
static struct mat_src st_mat(const struct safetensors_tensor *t) {
    return (struct mat_src){.name = t->name, .type = type_of_dtype(t->dtype), .data = t->data,
                            .rows = t->shape[0], .cols = t->shape[1]};
}

/* True when safetensors tensor t is a matrix [rows][cols]. */
static bool st_is_matrix(const struct safetensors_tensor *t, int64_t rows, int64_t cols) {
    return t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols;
}

/* One projection's update from A [rank][n_in] and B [n_out][rank]. */
static int set_lora(struct engine_adapter *a, int32_t il, enum adapter_proj p,
                    const struct mat_src *ma, const struct mat_src *mb, float scale,
                    int32_t perm_head_dim) {
    const struct hparams *hp = &a->model->hp;
    struct adapter_lora *l = &a->lora[(size_t)il * ADAPTER_PROJ_COUNT + p];
    proj_shape(hp, p, &l->n_in, &l->n_out);
    l->rank = (int32_t)ma->rows;
    l->scale = scale;
    int err = make_rows(ma, &l->a, &l->a_type, &a->info.bytes);
    if (!err) err = make_panels(mb, perm_head_dim, &l->b, &l->b_type, &a->info.bytes);
    if (err) return err;
    if (l->rank > a->max_rank) a->max_rank = l->rank;
    a->info.n_targets++;
    return 0;
}

/* ---- adapter_config.json ----------------------------------------------------- */

/* Where a load reads: the adapter, already open (a directory or a GGUF file).
 * A directory's files are opened in it by name, never through the path. */
struct load_src {
    int fd;               // borrowed
    const char *path;     // names it in messages
    bool is_no_symlinks;  // ENGINE_ADAPTER_LOAD_NO_SYMLINKS: a file in it may not be a symlink
};

/* Opens src's file `file` (adapter_config.json, adapter_model.safetensors)
 * into *out_fd, and its path for messages into path [LORA_PATH_MAX].
 * Returns 0, ERR_IO (logged), or ERR_PERM (a symlink, refused; logged). */
static int open_in_dir(const struct load_src *src, const char *file, char *path, int *out_fd) {
    *out_fd = -1;
    if (snprintf(path, LORA_PATH_MAX, "%s/%s", src->path, file) >= LORA_PATH_MAX) {
        LOG_ERROR("%s: %s: path too long", __func__, src->path);
        return ERR_IO;
    }
    // O_NONBLOCK: a FIFO named adapter_config.json must not hold the loader until a
    // writer comes (file_map_fd then refuses it as not a regular file); it changes
    // nothing for a regular file.
    const int flags =
        O_RDONLY | O_CLOEXEC | O_NONBLOCK | (src->is_no_symlinks ? O_NOFOLLOW : 0);
    int fd = openat(src->fd, file, flags);
    if (fd < 0) {
        if (errno == ELOOP && src->is_no_symlinks) {
            LOG_ERROR("%s: %s is a symlink, which is not followed here", __func__, path);
            return ERR_PERM;
        }
        LOG_ERROR("%s: cannot open %s: %s", __func__, path, strerror(errno));
        return ERR_IO;
    }
    // Confined (a runtime load): a file with another name may be a hard link to a file
    // outside the directory, which nothing here can tell from one inside.
    struct stat st;
    if (src->is_no_symlinks && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink > 1) {
        LOG_ERROR("%s: %s has %ju hard links; only a file with one name is loaded here",
                  __func__, path, (uintmax_t)st.st_nlink);
        close(fd);
        return ERR_PERM;
    }
    *out_fd = fd;
    return 0;
}

static int read_config(const struct load_src *src, json_t **out) {
    *out = NULL;
    char path[LORA_PATH_MAX];
    int fd = -1;
    int err = open_in_dir(src, "adapter_config.json", path, &fd);
    if (err) return err;
    struct file_map map;
    err = file_map_fd(fd, path, &map);  // logs its own errors
    close(fd);
    if (err) return err;
    if (map.size > LORA_CONFIG_MAX_BYTES) {
        LOG_ERROR("%s: %s is %zu bytes, more than the limit of %u", __func__, path, map.size,
                  LORA_CONFIG_MAX_BYTES);
        file_unmap(&map);
        return ERR_FORMAT;
    }
    json_error_t jerr;
    json_t *root = map.size ? json_loadb((const char *)map.data, map.size,
                                         JSON_REJECT_DUPLICATES, &jerr)
                            : json_loads("", 0, &jerr);
    file_unmap(&map);
    if (!root) {
        LOG_ERROR("%s: %s: not valid JSON at line %d: %s", __func__, path, jerr.line, jerr.text);
        return ERR_FORMAT;
    }
    if (!json_is_object(root)) {
        LOG_ERROR("%s: %s: not a JSON object", __func__, path);
        json_decref(root);
        return ERR_FORMAT;
    }
    *out = root;
    return 0;
}

/* A number field (integer or real): 0 with *out set, 0 untouched when absent
 * (or null), ERR_FORMAT (logged) when of another type or not finite. */
static int cfg_number(const char *path, const json_t *root, const char *key, double *out) {
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v))) {
        LOG_ERROR("%s: %s: '%s' must be a number", __func__, path, key);
        return ERR_FORMAT;
    }
    *out = json_number_value(v);
    return 0;
}

static int cfg_bool(const char *path, const json_t *root, const char *key, bool *out) {
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        LOG_ERROR("%s: %s: '%s' must be true or false", __func__, path, key);
        return ERR_FORMAT;
    }
    *out = json_is_true(v);
    return 0;
}

/* A string field, borrowed from root; NULL when absent or null. */
static int cfg_string(const char *path, const json_t *root, const char *key, const char **out) {
    *out = NULL;
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) {
        LOG_ERROR("%s: %s: '%s' must be a string", __func__, path, key);
        return ERR_FORMAT;
    }
    *out = json_string_value(v);
    return 0;
}

/* ---- PEFT LoRA directories ---------------------------------------------------- */

struct peft_config {
    int32_t r;
    double alpha;
    bool use_rslora;
    bool fan_in_fan_out;
    const json_t *rank_pattern;   // borrowed from the config; object or NULL
    const json_t *alpha_pattern;
};

/* rank_pattern / alpha_pattern keys are regular expressions in PEFT, matched
 * against the module name as "(.*\.)?KEY$". We take keys that are plain
 * module paths (a '.' in them matched literally, as it is in every real
 * module name), and refuse other regex syntax rather than guess. */
static int check_pattern(const char *path, const json_t *pat, const char *field) {
    if (!pat || json_is_null(pat)) return 0;
    if (!json_is_object(pat)) {
        LOG_ERROR("%s: %s: '%s' must be an object", __func__, path, field);
        return ERR_FORMAT;
    }
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)pat, k, v) {
        if (!json_is_number(v) || !isfinite(json_number_value(v))) {
            LOG_ERROR("%s: %s: %s['%s'] must be a number", __func__, path, field, k);
            return ERR_FORMAT;
        }
        if (k[0] == '\0' || strpbrk(k, "*+?()[]{}|^$\\")) {
            LOG_ERROR("%s: %s: %s key '%.100s' is a regular expression; only plain module "
                      "names and suffixes (e.g. \"q_proj\", \"layers.3.self_attn.q_proj\") "
                      "are supported", __func__, path, field, k);
            return ERR_UNSUPPORTED;
        }
    }
    return 0;
}

/* The first key of pat (in file order) that is module or a suffix of it after
 * a '.', as PEFT's get_pattern_key() matches; its value into *out. */
static bool pattern_lookup(const json_t *pat, const char *module, double *out) {
    if (!pat || !json_is_object(pat)) return false;
    const size_t n = strlen(module);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)pat, k, v) {
        const size_t kn = strlen(k);
        if (kn > n || strcmp(module + n - kn, k) != 0) continue;
        if (kn < n && module[n - kn - 1] != '.') continue;
        *out = json_number_value(v);
        return true;
    }
    return false;
}

static int parse_peft_config(const char *path, const json_t *root, struct peft_config *c) {
    memset(c, 0, sizeof(*c));
    int err;
    const char *peft_type = NULL;
    const char *bias = NULL;
    if ((err = cfg_string(path, root, "peft_type", &peft_type)) ||
        (err = cfg_string(path, root, "bias", &bias))) {
        return err;
    }
    if (peft_type && strcmp(peft_type, "LORA") != 0) {
        LOG_ERROR("%s: %s: peft_type '%.64s' is not supported (LORA is)", __func__, path,
                  peft_type);
        return ERR_UNSUPPORTED;
    }
    const json_t *r = json_object_get(root, "r");
    if (!json_is_integer(r) || json_integer_value(r) < 1 ||
        json_integer_value(r) > LORA_MAX_RANK) {
        LOG_ERROR("%s: %s: 'r' must be an integer in [1, %d]", __func__, path, LORA_MAX_RANK);
        return ERR_FORMAT;
    }
    c->r = (int32_t)json_integer_value(r);
    c->alpha = c->r;  // PEFT's default lora_alpha is 8 with r 8; an absent one means scale 1
    bool use_dora = false;
    bool lora_bias = false;
    if ((err = cfg_number(path, root, "lora_alpha", &c->alpha)) ||
        (err = cfg_bool(path, root, "use_rslora", &c->use_rslora)) ||
        (err = cfg_bool(path, root, "fan_in_fan_out", &c->fan_in_fan_out)) ||
        (err = cfg_bool(path, root, "use_dora", &use_dora)) ||
        (err = cfg_bool(path, root, "lora_bias", &lora_bias))) {
        return err;
    }
    if (use_dora) {
        LOG_ERROR("%s: %s: use_dora = true: DoRA adapters are not supported", __func__, path);
        return ERR_UNSUPPORTED;
    }
    if (lora_bias || (bias && strcmp(bias, "none") != 0)) {
        LOG_ERROR("%s: %s: bias = '%.32s' / lora_bias: adapters that train biases are not "
                  "supported (bias must be \"none\")", __func__, path, bias ? bias : "none");
        return ERR_UNSUPPORTED;
    }
    const json_t *mts = json_object_get(root, "modules_to_save");
    if (mts && !json_is_null(mts) && !(json_is_array(mts) && json_array_size(mts) == 0)) {
        LOG_ERROR("%s: %s: modules_to_save (full copies of base modules) is not supported",
                  __func__, path);
        return ERR_UNSUPPORTED;
    }
    // target_modules: a list of module names, or one string (a regex in PEFT,
    // or "all-linear"). PEFT evaluated it when the adapter was made; the
    // safetensors file holds the tensors of exactly the modules it matched,
    // and each is checked by name below, so a string is accepted as it is.
    // A listed name we cannot adapt is refused here, by name.
    const json_t *tm = json_object_get(root, "target_modules");
    if (json_is_array(tm)) {
        size_t i;
        const json_t *v;
        json_array_foreach(tm, i, v) {
            const char *s = json_string_value(v);
            bool ok = false;
            for (int p = 0; s && p < ADAPTER_PROJ_COUNT; p++) ok |= strcmp(s, proj_module[p]) == 0;
            if (!ok) {
                LOG_ERROR("%s: %s: target_modules names '%.64s'; only q_proj, k_proj, v_proj, "
                          "o_proj, gate_proj, up_proj and down_proj can be adapted", __func__,
                          path, s ? s : "(not a string)");
                return s ? ERR_UNSUPPORTED : ERR_FORMAT;
            }
        }
    } else if (tm && !json_is_null(tm) && !json_is_string(tm)) {
        LOG_ERROR("%s: %s: target_modules must be a list of names or a string", __func__, path);
        return ERR_FORMAT;
    }
    c->rank_pattern = json_object_get(root, "rank_pattern");
    c->alpha_pattern = json_object_get(root, "alpha_pattern");
    if ((err = check_pattern(path, c->rank_pattern, "rank_pattern")) ||
        (err = check_pattern(path, c->alpha_pattern, "alpha_pattern"))) {
        return err;
    }
    if (c->fan_in_fan_out) {
        // PEFT keeps lora_A as [r, in] and lora_B as [out, r] whatever this flag
        // says: it only tells how the *base* layer stores its weight (GPT-2's
        // Conv1D, transposed), for merging. Llama-family layers are nn.Linear,
        // for which PEFT resets the flag to false when it builds the adapter.
        LOG_WARN("%s: fan_in_fan_out = true describes a Conv1D base layer; lora_A/lora_B are "
                 "read as [r, in] / [out, r] as PEFT stores them for every layer type", path);
    }
    return 0;
}

static bool skip_prefix(const char **s, const char *prefix) {
    const size_t n = strlen(prefix);
    if (strncmp(*s, prefix, n) != 0) return false;
    *s += n;
    return true;
}

/* Reads a layer index: decimal digits, no sign, no leading zero, < 10^8. */
static bool parse_index(const char **s, int32_t *out) {
    const char *p = *s;
    int32_t v = 0;
    int n = 0;
    while (*p >= '0' && *p <= '9' && n < 9) {
        v = v * 10 + (*p - '0');
        p++;
        n++;
    }
    if (n == 0 || n > 8 || (n > 1 && **s == '0')) return false;
    *s = p;
    *out = v;
    return true;
}

/* "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" -> layer 3,
 * q, A. The "base_model.model." and "model." prefixes are optional. */
static bool parse_peft_name(const char *name, int32_t *il, enum adapter_proj *p, bool *is_b) {
    const char *s = name;
    skip_prefix(&s, "base_model.model.");
    skip_prefix(&s, "model.");
    if (!skip_prefix(&s, "layers.") || !parse_index(&s, il) || !skip_prefix(&s, ".")) {
        return false;
    }
    for (int i = 0; i < ADAPTER_PROJ_COUNT; i++) {
        const char *q = s;
        if (!skip_prefix(&q, proj_hf[i])) continue;
        if (strcmp(q, ".lora_A.weight") == 0 || strcmp(q, ".lora_B.weight") == 0) {
            *p = (enum adapter_proj)i;
            *is_b = q[6] == 'B';
            return true;
        }
    }
    return false;
}

/* Why a tensor name of a PEFT file is refused. */
static const char *peft_name_hint(const char *name) {
    if (strstr(name, "lora_magnitude_vector")) return "a DoRA magnitude (DoRA is not supported)";
    if (strstr(name, "embed_tokens") || strstr(name, "lm_head") || strstr(name, "lora_embedding")) {
        return "an adapter of the embeddings or the output head, which is not supported";
    }
    return "not a lora_A/lora_B weight of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj "
           "or down_proj in model.layers.N";
}

static int load_peft(struct engine_adapter *a, const struct load_src *src, const json_t *root) {
    const struct engine_model *m = a->model;
    const struct hparams *hp = &m->hp;
    struct peft_config c;
    char path[LORA_PATH_MAX];
    snprintf(path, sizeof(path), "%s/adapter_config.json", src->path);
    int err = parse_peft_config(path, root, &c);
    if (err) return err;
    a->info.kind = ENGINE_ADAPTER_LORA;
    a->info.format = "peft";
    a->info.scale = (float)(c.alpha / (c.use_rslora ? sqrt((double)c.r) : (double)c.r));

    int fd = -1;
    err = open_in_dir(src, "adapter_model.safetensors", path, &fd);
    if (err) return err;
    struct safetensors_file *f = NULL;
    err = safetensors_open_fd(fd, path, &f);  // logs its own errors
    close(fd);
    if (err) return err;
    const size_t n_mods = (size_t)hp->n_layer * ADAPTER_PROJ_COUNT;
    const struct safetensors_tensor **ta = calloc(n_mods, sizeof(*ta));
    const struct safetensors_tensor **tb = calloc(n_mods, sizeof(*tb));
    a->lora = calloc(n_mods, sizeof(*a->lora));
    if (!ta || !tb || !a->lora) {
        err = ERR_NOMEM;
        goto done;
    }

    // 1. Every tensor names one (layer, projection, A|B), each at most once.
    for (int64_t i = 0; i < safetensors_n_tensors(f); i++) {
        const struct safetensors_tensor *t = safetensors_tensor_at(f, i);
        int32_t il;
        enum adapter_proj p;
        bool is_b;
        if (!parse_peft_name(t->name, &il, &p, &is_b)) {
            LOG_ERROR("%s: %s: tensor '%.200s' is %s", __func__, path, t->name,
                      peft_name_hint(t->name));
            err = strstr(t->name, "lora_") ? ERR_UNSUPPORTED : ERR_FORMAT;
            goto done;
        }
        if (il >= hp->n_layer) {
            LOG_ERROR("%s: %s: tensor '%.200s' is for layer %d, but the model has %d layers",
                      __func__, path, t->name, il, hp->n_layer);
            err = ERR_FORMAT;
            goto done;
        }
        const struct safetensors_tensor **slot = is_b ? &tb[(size_t)il * ADAPTER_PROJ_COUNT + p]
                                                      : &ta[(size_t)il * ADAPTER_PROJ_COUNT + p];
        if (*slot) {
            LOG_ERROR("%s: %s: tensors '%.200s' and '%.200s' adapt the same module", __func__,
                      path, (*slot)->name, t->name);
            err = ERR_FORMAT;
            goto done;
        }
        *slot = t;
    }

    // 2. Pairs, ranks and shapes against the model; then the copies.
    const bool is_permuted = m->arch->rope == ARCH_ROPE_NORMAL;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        for (int p = 0; p < ADAPTER_PROJ_COUNT; p++) {
            const size_t i = (size_t)il * ADAPTER_PROJ_COUNT + (size_t)p;
            const struct safetensors_tensor *A = ta[i];
            const struct safetensors_tensor *B = tb[i];
            if (!A && !B) continue;
            if (!A || !B) {
                LOG_ERROR("%s: %s: tensor '%.200s' has no matching lora_%s", __func__, path,
                          (A ? A : B)->name, A ? "B" : "A");
                err = ERR_FORMAT;
                goto done;
            }
            char module[128];
            snprintf(module, sizeof(module), "model.layers.%d.%s", il, proj_hf[p]);
            double want_r = c.r;
            double alpha = c.alpha;
            pattern_lookup(c.rank_pattern, module, &want_r);
            pattern_lookup(c.alpha_pattern, module, &alpha);
            int32_t n_in, n_out;
            proj_shape(hp, (enum adapter_proj)p, &n_in, &n_out);
            const int64_t r = A->n_dims == 2 ? A->shape[0] : 0;
            if (r < 1 || r > LORA_MAX_RANK || !st_is_matrix(A, r, n_in)) {
                LOG_ERROR("%s: %s: tensor '%.200s' has shape %s[%lld, %lld], expected [r, %d] "
                          "for %s of this model", __func__, path, A->name,
                          A->n_dims == 2 ? "" : "(not a matrix) ", (long long)A->shape[0],
                          (long long)A->shape[1], n_in, module);
                err = ERR_FORMAT;
                goto done;
            }
            if (!st_is_matrix(B, n_out, r)) {
                LOG_ERROR("%s: %s: tensor '%.200s' has shape [%lld, %lld], expected [%d, %lld] "
                          "(outputs of %s, rank of its lora_A)", __func__, path, B->name,
                          (long long)B->shape[0], (long long)B->shape[1], n_out, (long long)r,
                          module);
                err = ERR_FORMAT;
                goto done;
            }
            if ((double)r != want_r) {
                LOG_ERROR("%s: %s: tensor '%.200s' has rank %lld but adapter_config.json gives "
                          "%g for %s", __func__, path, A->name, (long long)r, want_r, module);
                err = ERR_FORMAT;
                goto done;
            }
            const double scale = alpha / (c.use_rslora ? sqrt((double)r) : (double)r);
            // Q and K rows of a llama base are in the converter's permuted order.
            const bool perm = is_permuted && (p == ADAPTER_PROJ_Q || p == ADAPTER_PROJ_K);
            const struct mat_src ma = st_mat(A);
            const struct mat_src mb = st_mat(B);
            err = set_lora(a, il, (enum adapter_proj)p, &ma, &mb, (float)scale,
                           perm ? hp->head_dim : 0);
            if (err) goto done;
        }
    }
    if (a->info.n_targets == 0) {
        LOG_ERROR("%s: %s: no LoRA tensors", __func__, path);
        err = ERR_FORMAT;
    }
done:
    free(ta);
    free(tb);
    safetensors_close(f);
    return err;
}

/* ---- GGUF LoRA files -------------------------------------------------------- */

/* A GGUF tensor as a matrix [ne[1]][ne[0]] (2-D, a type we can read). */
static bool gguf_is_matrix(const struct gguf_tensor_info *t, int64_t rows, int64_t cols) {
    return t->n_dims == 2 && t->ne[0] == cols && t->ne[1] == rows;
}

/* "blk.3.attn_q.weight.lora_a" -> layer 3, q, A. */
static bool parse_gguf_name(const char *name, int32_t *il, enum adapter_proj *p, bool *is_b) {
    const char *s = name;
    if (!skip_prefix(&s, "blk.") || !parse_index(&s, il) || !skip_prefix(&s, ".")) return false;
    for (int i = 0; i < ADAPTER_PROJ_COUNT; i++) {
        const char *q = s;
        if (!skip_prefix(&q, proj_gguf[i])) continue;
        if (strcmp(q, ".weight.lora_a") == 0 || strcmp(q, ".weight.lora_b") == 0) {
            *p = (enum adapter_proj)i;
            *is_b = q[13] == 'b';
            return true;
        }
    }
    return false;
}

static int gguf_expect_str(const struct gguf_file *f, const char *key, const char *want) {
    struct gguf_str s;
    int err = gguf_get_str(f, key, &s);
    if (err == ERR_NOTFOUND) {
        LOG_ERROR("%s: %s: key %s is missing: not a GGUF adapter (%s = %s)", __func__,
                  gguf_name(f), key, key, want);
        return ERR_FORMAT;
    }
    if (err) return err;
    if (!gguf_str_eq(s, want)) {
        char v[64];
        LOG_ERROR("%s: %s: %s is '%s', expected '%s'", __func__, gguf_name(f), key,
                  gguf_str_copy(s, v, sizeof(v)), want);
        return ERR_UNSUPPORTED;
    }
    return 0;
}

/* The matrix of GGUF tensor t as a mat_src, or ERR_UNSUPPORTED for a type the
 * engine cannot convert. */
static int gguf_mat(const char *path, const char *name, const struct gguf_tensor_info *t,
                    struct mat_src *out) {
    const struct quant_traits *tr = quant_traits(t->type);
    if (!tr || !tr->to_f32) {
        LOG_ERROR("%s: %s: tensor '%s' has type %s, which cannot be read", __func__, path, name,
                  quant_name(t->type));
        return ERR_UNSUPPORTED;
    }
    *out = (struct mat_src){.name = name, .type = (enum quant_type)t->type, .data = t->data,
                            .rows = t->ne[1], .cols = t->ne[0]};
    return 0;
}

static int load_gguf(struct engine_adapter *a, const struct load_src *src) {
    const struct engine_model *m = a->model;
    const struct hparams *hp = &m->hp;
    const char *path = src->path;
    // Read from the open file, not by name: the bytes are the checked file's.
    struct file_map map;
    int err = file_map_fd(src->fd, path, &map);  // logs its own errors
    if (err) return err;
    struct gguf_file *f = NULL;
    err = gguf_open_memory(map.data, map.size, path, &f);  // logs its own errors
    if (err) {
        file_unmap(&map);
        return err;
    }
    const size_t n_mods = (size_t)hp->n_layer * ADAPTER_PROJ_COUNT;
    const struct gguf_tensor_info **ta = calloc(n_mods, sizeof(*ta));
    const struct gguf_tensor_info **tb = calloc(n_mods, sizeof(*tb));
    a->lora = calloc(n_mods, sizeof(*a->lora));
    if (!ta || !tb || !a->lora) {
        err = ERR_NOMEM;
        goto done;
    }
    if ((err = gguf_expect_str(f, "general.type", "adapter")) ||
        (err = gguf_expect_str(f, "adapter.type", "lora")) ||
        (err = gguf_expect_str(f, "general.architecture", m->arch->name))) {
        goto done;
    }
    // llama.cpp: scale = alpha / rank, and 1 when the file has no alpha (or 0).
    float alpha = 0.0f;
    err = gguf_get_f32(f, "adapter.lora.alpha", &alpha);
    if (err && err != ERR_NOTFOUND) goto done;
    err = 0;
    if (!isfinite(alpha)) {
        LOG_ERROR("%s: %s: adapter.lora.alpha is not a finite number", __func__, path);
        err = ERR_FORMAT;
        goto done;
    }
    a->info.kind = ENGINE_ADAPTER_LORA;
    a->info.format = "gguf";

    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor_info *t = gguf_tensor_at(f, i);
        char name[160];
        gguf_str_copy(t->name, name, sizeof(name));
        int32_t il;
        enum adapter_proj p;
        bool is_b;
        if (t->name.len >= sizeof(name) || !parse_gguf_name(name, &il, &p, &is_b)) {
            const bool is_lora = strstr(name, ".lora_a") || strstr(name, ".lora_b");
            const bool is_io = strncmp(name, "token_embd.", 11) == 0 ||
                               strncmp(name, "output.", 7) == 0;
            LOG_ERROR("%s: %s: tensor '%s' is %s", __func__, path, name,
                      is_lora && is_io ? "a LoRA of the embeddings or the output head, which is "
                                         "not supported"
                      : is_lora ? "a LoRA of a tensor this engine does not adapt (only attn_q, "
                                  "attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down)"
                                : "not a LoRA tensor (replacing base tensors, e.g. norms, is "
                                  "not supported)");
            err = is_lora || strstr(name, "norm") ? ERR_UNSUPPORTED : ERR_FORMAT;
            goto done;
        }
        if (il >= hp->n_layer) {
            LOG_ERROR("%s: %s: tensor '%s' is for layer %d, but the model has %d layers",
                      __func__, path, name, il, hp->n_layer);
            err = ERR_FORMAT;
            goto done;
        }
        const struct gguf_tensor_info **slot = is_b ? &tb[(size_t)il * ADAPTER_PROJ_COUNT + p]
                                                    : &ta[(size_t)il * ADAPTER_PROJ_COUNT + p];
        if (*slot) {
            LOG_ERROR("%s: %s: tensor '%s' appears twice", __func__, path, name);
            err = ERR_FORMAT;
            goto done;
        }
        *slot = t;
    }

    for (int32_t il = 0; il < hp->n_layer; il++) {
        for (int p = 0; p < ADAPTER_PROJ_COUNT; p++) {
            const size_t i = (size_t)il * ADAPTER_PROJ_COUNT + (size_t)p;
            const struct gguf_tensor_info *A = ta[i];
            const struct gguf_tensor_info *B = tb[i];
            if (!A && !B) continue;
            char na[96], nb[96];
            snprintf(na, sizeof(na), "blk.%d.%s.weight.lora_a", il, proj_gguf[p]);
            snprintf(nb, sizeof(nb), "blk.%d.%s.weight.lora_b", il, proj_gguf[p]);
            if (!A || !B) {
                LOG_ERROR("%s: %s: tensor '%s' is missing (its pair '%s' is there)", __func__,
                          path, A ? nb : na, A ? na : nb);
                err = ERR_FORMAT;
                goto done;
            }
            int32_t n_in, n_out;
            proj_shape(hp, (enum adapter_proj)p, &n_in, &n_out);
            // lora_a: ne = [n_in, r] (r rows of n_in); lora_b: ne = [r, n_out].
            const int64_t r = A->n_dims == 2 ? A->ne[1] : 0;
            if (r < 1 || r > LORA_MAX_RANK || !gguf_is_matrix(A, r, n_in)) {
                LOG_ERROR("%s: %s: tensor '%s' has ne [%lld, %lld, %lld, %lld], expected "
                          "[%d, r]", __func__, path, na, (long long)A->ne[0], (long long)A->ne[1],
                          (long long)A->ne[2], (long long)A->ne[3], n_in);
                err = ERR_FORMAT;
                goto done;
            }
            if (!gguf_is_matrix(B, n_out, r)) {
                LOG_ERROR("%s: %s: tensor '%s' has ne [%lld, %lld, %lld, %lld], expected "
                          "[%lld, %d]", __func__, path, nb, (long long)B->ne[0],
                          (long long)B->ne[1], (long long)B->ne[2], (long long)B->ne[3],
                          (long long)r, n_out);
                err = ERR_FORMAT;
                goto done;
            }
            struct mat_src ma, mb;
            if ((err = gguf_mat(path, na, A, &ma)) || (err = gguf_mat(path, nb, B, &mb))) goto done;
            const float scale = alpha != 0.0f ? alpha / (float)r : 1.0f;
            err = set_lora(a, il, (enum adapter_proj)p, &ma, &mb, scale, 0);  // B already permuted
            if (err) goto done;
            if (a->info.n_targets == 1) a->info.scale = scale;
        }
    }
    if (a->info.n_targets == 0) {
        LOG_ERROR("%s: %s: no LoRA tensors", __func__, path);
        err = ERR_FORMAT;
    }
done:
    free(ta);
    free(tb);
    gguf_close(f);
    file_unmap(&map);  // the weights were copied out
    return err;
}

/* ---- bottleneck adapter directories (docs/adapters.md) ------------------------ */

/* adapter_config.json's bottleneck_size (*width), non_linearity and scaling
 * into a and *scaling. path: the config's, for messages. */
static int bottleneck_config(struct engine_adapter *a, const char *path, const json_t *root,
                             int32_t *width, double *scaling) {
    const json_t *w = json_object_get(root, "bottleneck_size");
    if (!json_is_integer(w) || json_integer_value(w) < 1 ||
        json_integer_value(w) > LORA_MAX_RANK) {
        LOG_ERROR("%s: %s: 'bottleneck_size' must be an integer in [1, %d]", __func__, path,
                  LORA_MAX_RANK);
        return ERR_FORMAT;
    }
    *width = (int32_t)json_integer_value(w);
    const char *act = NULL;
    *scaling = 1.0;
    int err;
    if ((err = cfg_string(path, root, "non_linearity", &act)) ||
        (err = cfg_number(path, root, "scaling", scaling))) {
        return err;
    }
    if (!act || strcmp(act, "relu") == 0) {
        a->act = ADAPTER_ACT_RELU;
    } else if (strcmp(act, "gelu") == 0) {
        a->act = ADAPTER_ACT_GELU;
    } else if (strcmp(act, "silu") == 0 || strcmp(act, "swish") == 0) {
        a->act = ADAPTER_ACT_SILU;
    } else {
        LOG_ERROR("%s: %s: non_linearity '%.32s' is not supported (relu, gelu, silu)", __func__,
                  path, act);
        return ERR_UNSUPPORTED;
    }
    a->info.kind = ENGINE_ADAPTER_BOTTLENECK;
    a->info.format = "bottleneck";
    a->info.rank = *width;
    a->info.scale = (float)*scaling;
    return 0;
}

/* The module at (il, pos) from f, if any of its four tensors is there: both
 * weights required, shapes checked, into a->bn; *n_used counts its tensors.
 * path: the safetensors file's, for messages. */
static int bottleneck_module(struct engine_adapter *a, const struct safetensors_file *f,
                             const char *path, int32_t il, int pos, int32_t width, double scaling,
                             int64_t *n_used) {
    const int32_t n_embd = a->model->hp.n_embd;
    char nd[96], nu[96], ndb[96], nub[96];
    snprintf(nd, sizeof(nd), "layers.%d.%s.down.weight", il, pos_name[pos]);
    snprintf(nu, sizeof(nu), "layers.%d.%s.up.weight", il, pos_name[pos]);
    snprintf(ndb, sizeof(ndb), "layers.%d.%s.down.bias", il, pos_name[pos]);
    snprintf(nub, sizeof(nub), "layers.%d.%s.up.bias", il, pos_name[pos]);
    const struct safetensors_tensor *D = safetensors_find(f, nd);
    const struct safetensors_tensor *U = safetensors_find(f, nu);
    const struct safetensors_tensor *Db = safetensors_find(f, ndb);
    const struct safetensors_tensor *Ub = safetensors_find(f, nub);
    if (!D && !U && !Db && !Ub) return 0;
    if (!D || !U) {
        LOG_ERROR("%s: %s: tensor '%s' is missing (the module has '%s')", __func__, path,
                  D ? nu : nd, D ? nd : (U ? nu : (Db ? ndb : nub)));
        return ERR_FORMAT;
    }
    const struct {
        const struct safetensors_tensor *t;
        const char *name;
        int64_t rows, cols;  // cols 0: a vector of rows
    } want[4] = {{D, nd, width, n_embd}, {U, nu, n_embd, width}, {Db, ndb, width, 0},
                 {Ub, nub, n_embd, 0}};
    for (int k = 0; k < 4; k++) {
        const struct safetensors_tensor *t = want[k].t;
        if (!t) continue;
        const bool ok = want[k].cols ? st_is_matrix(t, want[k].rows, want[k].cols)
                                     : t->n_dims == 1 && t->shape[0] == want[k].rows;
        if (!ok) {
            LOG_ERROR("%s: %s: tensor '%s' has %d dimensions [%lld, %lld], expected "
                      "[%lld%s%lld] (bottleneck_size %d, n_embd %d)", __func__, path,
                      want[k].name, (int)t->n_dims, (long long)t->shape[0],
                      (long long)t->shape[1], (long long)want[k].rows,
                      want[k].cols ? ", " : "", want[k].cols ? (long long)want[k].cols : 0LL,
                      width, n_embd);
            return ERR_FORMAT;
        }
        (*n_used)++;
    }
    struct adapter_bottleneck *b = &a->bn[(size_t)il * ADAPTER_POS_COUNT + pos];
    b->width = width;
    b->n_embd = n_embd;
    b->scale = (float)scaling;
    b->down_b = calloc((size_t)width, sizeof(float));
    b->up_b = calloc((size_t)n_embd, sizeof(float));
    if (!b->down_b || !b->up_b) return ERR_NOMEM;
    if (Db) safetensors_to_f32(Db, b->down_b);
    if (Ub) {
        safetensors_to_f32(Ub, b->up_b);
        for (int32_t i = 0; i < n_embd; i++) b->up_b[i] *= b->scale;
    }
    a->info.bytes += ((size_t)width + (size_t)n_embd) * sizeof(float);
    const struct mat_src md = st_mat(D);
    const struct mat_src mu = st_mat(U);
    int err;
    if ((err = make_rows(&md, &b->down, &b->down_type, &a->info.bytes)) ||
        (err = make_panels(&mu, 0, &b->up, &b->up_type, &a->info.bytes))) {
        return err;
    }
    a->max_width = width;
    a->info.n_targets++;
    return 0;
}

/* Logs the first tensor of f that is not part of any module. */
static void name_stray_tensor(const struct safetensors_file *f, const char *path,
                              int32_t n_layer) {
    for (int64_t i = 0; i < safetensors_n_tensors(f); i++) {
        const char *name = safetensors_tensor_at(f, i)->name;
        const char *s = name;
        int32_t il = -1;
        bool ok = skip_prefix(&s, "layers.") && parse_index(&s, &il) && il < n_layer &&
                  skip_prefix(&s, ".") &&
                  (skip_prefix(&s, "attn_adapter.") || skip_prefix(&s, "ffn_adapter.")) &&
                  (strcmp(s, "down.weight") == 0 || strcmp(s, "up.weight") == 0 ||
                   strcmp(s, "down.bias") == 0 || strcmp(s, "up.bias") == 0);
        if (!ok) {
            LOG_ERROR("%s: %s: tensor '%.200s' is not part of a bottleneck module (names: "
                      "layers.N.{attn,ffn}_adapter.{down,up}.{weight,bias}, N < %d)",
                      __func__, path, name, n_layer);
            return;
        }
    }
}

static int load_bottleneck(struct engine_adapter *a, const struct load_src *src,
                           const json_t *root) {
    const struct hparams *hp = &a->model->hp;
    char path[LORA_PATH_MAX];
    snprintf(path, sizeof(path), "%s/adapter_config.json", src->path);
    int32_t width = 0;
    double scaling = 1.0;
    int err = bottleneck_config(a, path, root, &width, &scaling);
    if (err) return err;
    int fd = -1;
    err = open_in_dir(src, "adapter_model.safetensors", path, &fd);
    if (err) return err;
    struct safetensors_file *f = NULL;
    err = safetensors_open_fd(fd, path, &f);
    close(fd);
    if (err) return err;
    const size_t n_mods = (size_t)hp->n_layer * ADAPTER_POS_COUNT;
    a->bn = calloc(n_mods, sizeof(*a->bn));
    if (!a->bn) {
        err = ERR_NOMEM;
        goto done;
    }
    // Every tensor must be one of the four of some module; count what is used.
    int64_t n_used = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        for (int pos = 0; pos < ADAPTER_POS_COUNT; pos++) {
            err = bottleneck_module(a, f, path, il, pos, width, scaling, &n_used);
            if (err) goto done;
        }
    }
    if (n_used != safetensors_n_tensors(f)) {
        name_stray_tensor(f, path, hp->n_layer);
        err = ERR_FORMAT;
        goto done;
    }
    if (a->info.n_targets == 0) {
        LOG_ERROR("%s: %s: no bottleneck modules", __func__, path);
        err = ERR_FORMAT;
    }
done:
    safetensors_close(f);
    return err;
}

/* ---- the public API ------------------------------------------------------------ */

/* A directory: its adapter_config.json says bottleneck or (PEFT) LoRA. */
static int load_dir(struct engine_adapter *a, const struct load_src *src) {
    json_t *root = NULL;
    int err = read_config(src, &root);
    if (err) return err;
    const char *type = NULL;
    char path[LORA_PATH_MAX];
    snprintf(path, sizeof(path), "%s/adapter_config.json", src->path);
    err = cfg_string(path, root, "adapter_type", &type);
    if (!err) {
        if (type && strcmp(type, "bottleneck") == 0) {
            err = load_bottleneck(a, src, root);
        } else if (type) {
            LOG_ERROR("%s: %s: adapter_type '%.32s' is not supported (bottleneck; PEFT LoRA "
                      "configs have no adapter_type)", __func__, path, type);
            err = ERR_UNSUPPORTED;
        } else {
            err = load_peft(a, src, root);
        }
    }
    json_decref(root);
    return err;
}

int engine_adapter_load(const struct engine_model *m, const char *path,
                        struct engine_adapter **out) {
    *out = NULL;
    // stat first: a FIFO or a device is refused without opening it.
    struct stat st;
    if (stat(path, &st) != 0) {
        LOG_ERROR("%s: %s: %s", __func__, path, strerror(errno));
        return ERR_IO;
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        LOG_ERROR("%s: %s is neither a directory (PEFT, bottleneck) nor a file (GGUF)", __func__,
                  path);
        return ERR_IO;
    }
    // O_NONBLOCK: the name may have become a FIFO since the stat.
    int fd = open(path,
                  O_RDONLY | O_CLOEXEC | O_NONBLOCK | (S_ISDIR(st.st_mode) ? O_DIRECTORY : 0));
    if (fd < 0) {
        LOG_ERROR("%s: cannot open %s: %s", __func__, path, strerror(errno));
        return ERR_IO;
    }
    int err = engine_adapter_load_fd(m, fd, path, 0, out);
    close(fd);
    return err;
}

int engine_adapter_load_fd(const struct engine_model *m, int fd, const char *path,
                           unsigned flags, struct engine_adapter **out) {
    *out = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        LOG_ERROR("%s: %s: %s", __func__, path, strerror(errno));
        return ERR_IO;
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        LOG_ERROR("%s: %s is neither a directory (PEFT, bottleneck) nor a file (GGUF)", __func__,
                  path);
        return ERR_IO;
    }
    if (S_ISDIR(st.st_mode)) fault_gate(fd);  // a test hook; nothing without its variable
    const struct load_src src = {
        .fd = fd,
        .path = path,
        .is_no_symlinks = (flags & ENGINE_ADAPTER_LOAD_NO_SYMLINKS) != 0,
    };
    struct engine_adapter *a = calloc(1, sizeof(*a));
    if (!a) return ERR_NOMEM;
    atomic_init(&a->n_refs, 1);
    a->model = m;
    a->n_layer = m->hp.n_layer;
    a->path = strdup(path);
    if (!a->path) {
        free(a);
        return ERR_NOMEM;
    }
    a->info.path = a->path;
    int err = S_ISDIR(st.st_mode) ? load_dir(a, &src) : load_gguf(a, &src);
    if (err) {
        adapter_free(a);
        return err;
    }
    if (a->info.kind == ENGINE_ADAPTER_LORA) a->info.rank = a->max_rank;
    a->info.id = model_next_adapter_id(m);
    *out = a;
    return 0;
}

struct engine_adapter *engine_adapter_retain(struct engine_adapter *a) {
    const int n = atomic_fetch_add(&a->n_refs, 1);
    ASSERT(n > 0);
    return a;
}

void engine_adapter_release(struct engine_adapter *a) {
    if (!a) return;
    const int n = atomic_fetch_sub(&a->n_refs, 1);
    ASSERT(n > 0);
    if (n == 1) adapter_free(a);
}

const struct engine_adapter_info *engine_adapter_get_info(const struct engine_adapter *a) {
    return &a->info;
}
