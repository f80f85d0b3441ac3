/*
 * panel.c - the panel layout of f32/f16/bf16 weights (kernels.h, "panels"):
 * its size, the packing from the GGUF row layout, and the portable matrix
 * product over it, the oracle the SIMD versions must equal bit for bit.
 * Quantized types are handed to their q-panels (kernels/qpanel.c).
 */
#include <math.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/kernels/kernels.h"
#include "engine/format/quant.h"

static bool is_float(enum quant_type t) {
    return t == QUANT_F32 || t == QUANT_F16 || t == QUANT_BF16;
}

bool kern_panel_supports(enum quant_type t) {
    return is_float(t) || kern_qpanel_supports(t);
}

size_t kern_panel_bytes(const struct tensor *w) {
    ASSERT(kern_panel_supports(w->type) && w->ne[2] == 1 && w->ne[3] == 1);
    if (!is_float(w->type)) {
        const int64_t n_panels = (w->ne[1] + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
        return (size_t)n_panels * kern_qpanel_stride(w->type, w->ne[0]);
    }
    const size_t esz = w->type == QUANT_F32 ? 4 : 2;
    const int64_t n_panels = (w->ne[1] + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
    return (size_t)n_panels * (size_t)w->ne[0] * KERN_PANEL_ROWS * esz;
}

/* Panel by panel, one k step (16 rows' elements) written at a time: 16
 * sequential read streams and one sequential write stream. */
#define PANEL_PACK(NAME, T)                                                      \
    static void NAME(const struct tensor *w, T *restrict out) {                  \
        const int64_t k = w->ne[0];                                              \
        const int64_t n = w->ne[1];                                              \
        for (int64_t r0 = 0; r0 < n; r0 += KERN_PANEL_ROWS) {                    \
            const T *rows[KERN_PANEL_ROWS];                                      \
            int nr = n - r0 < KERN_PANEL_ROWS ? (int)(n - r0) : KERN_PANEL_ROWS; \
            for (int r = 0; r < nr; r++) rows[r] = tensor_row(w, r0 + r);        \
            T *panel = out + (size_t)r0 * (size_t)k;                             \
            for (int64_t j = 0; j < k; j++) {                                    \
                T *step = panel + j * KERN_PANEL_ROWS;                           \
                for (int r = 0; r < nr; r++) step[r] = rows[r][j];               \
                for (int r = nr; r < KERN_PANEL_ROWS; r++) step[r] = 0;          \
            }                                                                    \
        }                                                                        \
    }

PANEL_PACK(pack_4, uint32_t)
PANEL_PACK(pack_2, uint16_t)

void kern_panel_pack(const struct tensor *w, void *dst) {
    ASSERT(kern_panel_supports(w->type));
    if (!is_float(w->type)) {
        kern_qpanel_pack(w, dst);
    } else if (w->type == QUANT_F32) {
        pack_4(w, dst);  // the bits of the floats, copied as they are
    } else {
        pack_2(w, dst);
    }
}

/* One output per (token, row), accumulated over j in order with fmaf: the
 * same operations the SIMD lanes perform. */
#define PANEL_REF(NAME, T, LOAD)                                                             \
    void NAME(const float *restrict x, int64_t n_tokens, const void *restrict pw, int64_t k, \
              int64_t n, int64_t p0, int64_t p1, float *restrict y) {                        \
        const T *w = pw;                                                                     \
        for (int64_t p = p0; p < p1; p++) {                                                  \
            const T *panel = w + (size_t)p * (size_t)k * KERN_PANEL_ROWS;                    \
            const int64_t rows = n - p * KERN_PANEL_ROWS < KERN_PANEL_ROWS                   \
                                     ? n - p * KERN_PANEL_ROWS                               \
                                     : KERN_PANEL_ROWS;                                      \
            for (int64_t t = 0; t < n_tokens; t++) {                                         \
                const float *xt = x + t * k;                                                 \
                float acc[KERN_PANEL_ROWS] = {0};                                            \
                for (int64_t j = 0; j < k; j++) {                                            \
                    for (int r = 0; r < KERN_PANEL_ROWS; r++) {                              \
                        acc[r] = fmaf(LOAD(panel[j * KERN_PANEL_ROWS + r]), xt[j], acc[r]);  \
                    }                                                                        \
                }                                                                            \
                memcpy(y + t * n + p * KERN_PANEL_ROWS, acc, (size_t)rows * sizeof(float));  \
            }                                                                                \
        }                                                                                    \
    }

#define LOAD_F32(v) (v)
PANEL_REF(kern_panel_ref_f32, float, LOAD_F32)
PANEL_REF(kern_panel_ref_f16, uint16_t, quant_f16_to_f32)
PANEL_REF(kern_panel_ref_bf16, uint16_t, quant_bf16_to_f32)
