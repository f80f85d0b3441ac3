/*
 * adapter_share.c - broadcasting a loaded adapter from rank 0 (the wire
 * layout is in adapter_share.h).
 */
#define LOG_TAG "adapter"
#include "engine/compute/adapter_share.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/comm/comm.h"
#include "engine/model/adapter.h"
#include "engine/model/model.h"

enum {
    HDR_N_LAYER,
    HDR_ACT,
    HDR_KIND,
    HDR_FORMAT,  // index into formats[]
    HDR_RANK,
    HDR_SCALE,   // the float's bits
    HDR_N_TARGETS,
    HDR_ID,
    HDR_HAS_LORA,
    HDR_HAS_BN,
    HDR_PATH_LEN,
    HDR_COUNT
};

// info.format points at one of these (lora.c's literals); the index travels.
static const char *const formats[] = {"peft", "gguf", "bottleneck"};

enum { LORA_RANK, LORA_N_IN, LORA_N_OUT, LORA_A_TYPE, LORA_B_TYPE, LORA_SCALE, LORA_FIELDS };
enum { BN_WIDTH, BN_N_EMBD, BN_DOWN_TYPE, BN_UP_TYPE, BN_SCALE, BN_FIELDS };

static int32_t float_bits(float f) {
    int32_t v;
    memcpy(&v, &f, sizeof(v));
    return v;
}

static float bits_float(int32_t v) {
    float f;
    memcpy(&f, &v, sizeof(f));
    return f;
}

static int32_t format_index(const char *format) {
    for (int32_t i = 0; i < (int32_t)(sizeof(formats) / sizeof(formats[0])); i++) {
        if (strcmp(format, formats[i]) == 0) return i;
    }
    UNREACHABLE();
}

/* Rank 0: a's header and records into hdr and rec. */
static void describe(const struct engine_adapter *a, int64_t *hdr, int32_t *rec) {
    hdr[HDR_N_LAYER] = a->n_layer;
    hdr[HDR_ACT] = a->act;
    hdr[HDR_KIND] = a->info.kind;
    hdr[HDR_FORMAT] = format_index(a->info.format);
    hdr[HDR_RANK] = a->info.rank;
    hdr[HDR_SCALE] = float_bits(a->info.scale);
    hdr[HDR_N_TARGETS] = a->info.n_targets;
    hdr[HDR_ID] = (int64_t)a->info.id;
    hdr[HDR_HAS_LORA] = a->lora != NULL;
    hdr[HDR_HAS_BN] = a->bn != NULL;
    hdr[HDR_PATH_LEN] = (int64_t)strlen(a->path);
    const int32_t n_lora = a->lora ? a->n_layer * ADAPTER_PROJ_COUNT : 0;
    for (int32_t i = 0; i < n_lora; i++, rec += LORA_FIELDS) {
        const struct adapter_lora *l = &a->lora[i];
        rec[LORA_RANK] = l->rank;
        rec[LORA_N_IN] = l->n_in;
        rec[LORA_N_OUT] = l->n_out;
        rec[LORA_A_TYPE] = l->a_type;
        rec[LORA_B_TYPE] = l->b_type;
        rec[LORA_SCALE] = float_bits(l->scale);
    }
    const int32_t n_bn = a->bn ? a->n_layer * ADAPTER_POS_COUNT : 0;
    for (int32_t i = 0; i < n_bn; i++, rec += BN_FIELDS) {
        const struct adapter_bottleneck *b = &a->bn[i];
        rec[BN_WIDTH] = b->width;
        rec[BN_N_EMBD] = b->n_embd;
        rec[BN_DOWN_TYPE] = b->down_type;
        rec[BN_UP_TYPE] = b->up_type;
        rec[BN_SCALE] = float_bits(b->scale);
    }
}

/* Followers: an adapter of model m shaped by hdr and rec, its matrices
 * allocated but not filled, into *out (also on failure: adapter_free it). */
static int build(const struct engine_model *m, const int64_t *hdr, const int32_t *rec,
                 const char *path, struct engine_adapter **out) {
    struct engine_adapter *a = calloc(1, sizeof(*a));
    *out = a;
    if (!a) return ERR_NOMEM;
    atomic_init(&a->n_refs, 1);
    a->model = m;
    a->n_layer = (int32_t)hdr[HDR_N_LAYER];
    a->act = (enum adapter_act)hdr[HDR_ACT];
    a->info.kind = (enum engine_adapter_kind)hdr[HDR_KIND];
    a->info.format = formats[hdr[HDR_FORMAT]];
    a->info.rank = (int32_t)hdr[HDR_RANK];
    a->info.scale = bits_float((int32_t)hdr[HDR_SCALE]);
    a->info.n_targets = (int32_t)hdr[HDR_N_TARGETS];
    a->info.id = (uint64_t)hdr[HDR_ID];
    a->path = strdup(path);
    a->info.path = a->path;
    if (!a->path) return ERR_NOMEM;
    ASSERT(a->n_layer == m->hp.n_layer);  // rank 0 checked it against the same file
    if (hdr[HDR_HAS_LORA]) {
        a->lora = calloc((size_t)a->n_layer * ADAPTER_PROJ_COUNT, sizeof(*a->lora));
        if (!a->lora) return ERR_NOMEM;
        for (int32_t i = 0; i < a->n_layer * ADAPTER_PROJ_COUNT; i++, rec += LORA_FIELDS) {
            struct adapter_lora *l = &a->lora[i];
            l->rank = rec[LORA_RANK];
            l->n_in = rec[LORA_N_IN];
            l->n_out = rec[LORA_N_OUT];
            l->a_type = (enum quant_type)rec[LORA_A_TYPE];
            l->b_type = (enum quant_type)rec[LORA_B_TYPE];
            l->scale = bits_float(rec[LORA_SCALE]);
            if (l->rank == 0) continue;
            const size_t na = adapter_lora_a_bytes(l), nb = adapter_lora_b_bytes(l);
            l->a = malloc(na);
            l->b = aligned_alloc(64, nb);
            if (!l->a || !l->b) return ERR_NOMEM;
            a->info.bytes += na + nb;
            if (l->rank > a->max_rank) a->max_rank = l->rank;
        }
    }
    if (hdr[HDR_HAS_BN]) {
        a->bn = calloc((size_t)a->n_layer * ADAPTER_POS_COUNT, sizeof(*a->bn));
        if (!a->bn) return ERR_NOMEM;
        for (int32_t i = 0; i < a->n_layer * ADAPTER_POS_COUNT; i++, rec += BN_FIELDS) {
            struct adapter_bottleneck *b = &a->bn[i];
            b->width = rec[BN_WIDTH];
            b->n_embd = rec[BN_N_EMBD];
            b->down_type = (enum quant_type)rec[BN_DOWN_TYPE];
            b->up_type = (enum quant_type)rec[BN_UP_TYPE];
            b->scale = bits_float(rec[BN_SCALE]);
            if (b->width == 0) continue;
            const size_t w = (size_t)b->width, e = (size_t)b->n_embd;
            const size_t nd = adapter_bn_down_bytes(b), nu = adapter_bn_up_bytes(b);
            b->down = malloc(nd);
            b->down_b = malloc(w * sizeof(float));
            b->up = aligned_alloc(64, nu);
            b->up_b = malloc(e * sizeof(float));
            if (!b->down || !b->down_b || !b->up || !b->up_b) return ERR_NOMEM;
            a->info.bytes += nd + nu + (w + e) * sizeof(float);
            if (b->width > a->max_width) a->max_width = b->width;
        }
    }
    return 0;
}

/* Every matrix of a, from rank 0 into the others' (same shapes on all ranks). */
static void send_matrices(struct comm *c, struct engine_adapter *a) {
    for (int32_t i = 0; a->lora && i < a->n_layer * ADAPTER_PROJ_COUNT; i++) {
        struct adapter_lora *l = &a->lora[i];
        if (l->rank == 0) continue;
        comm_bcast(c, l->a, adapter_lora_a_bytes(l));
        comm_bcast(c, l->b, adapter_lora_b_bytes(l));
    }
    for (int32_t i = 0; a->bn && i < a->n_layer * ADAPTER_POS_COUNT; i++) {
        struct adapter_bottleneck *b = &a->bn[i];
        if (b->width == 0) continue;
        const size_t w = (size_t)b->width, e = (size_t)b->n_embd;
        comm_bcast(c, b->down, adapter_bn_down_bytes(b));
        comm_bcast(c, b->down_b, w * sizeof(float));
        comm_bcast(c, b->up, adapter_bn_up_bytes(b));
        comm_bcast(c, b->up_b, e * sizeof(float));
    }
}

int adapter_share(struct comm *c, const struct engine_model *m, struct engine_adapter *a,
                  struct engine_adapter **out) {
    *out = NULL;
    const bool is_root = comm_rank(c) == 0;
    ASSERT(is_root == (a != NULL));
    int64_t hdr[HDR_COUNT] = {0};
    const int32_t n_layer = m->hp.n_layer;
    const size_t n_rec = (size_t)n_layer * (ADAPTER_PROJ_COUNT * LORA_FIELDS +
                                            ADAPTER_POS_COUNT * BN_FIELDS);
    int32_t *rec = xcalloc(n_rec, sizeof(int32_t));  // bookkeeping: a few KiB
    if (is_root) describe(a, hdr, rec);
    comm_bcast(c, hdr, sizeof(hdr));
    char *path = xcalloc((size_t)hdr[HDR_PATH_LEN] + 1, 1);
    if (is_root) memcpy(path, a->path, (size_t)hdr[HDR_PATH_LEN]);
    comm_bcast(c, path, (size_t)hdr[HDR_PATH_LEN]);
    comm_bcast(c, rec, n_rec * sizeof(int32_t));
    struct engine_adapter *copy = NULL;
    int err = is_root ? 0 : build(m, hdr, rec, path, &copy);
    free(rec);
    free(path);
    err = comm_agree(c, err);
    if (err) {
        adapter_free(copy);
        LOG_ERROR("%s: a rank has no memory for adapter %s", __func__, is_root ? a->path : "");
        return err;
    }
    send_matrices(c, is_root ? a : copy);
    *out = is_root ? engine_adapter_retain(a) : copy;
    return 0;
}
