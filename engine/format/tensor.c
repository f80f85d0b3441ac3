/*
 * tensor.c - row access to mapped weight tensors.
 */
#include "engine/format/tensor.h"

#include "engine/base/alloc.h"

int64_t tensor_n_elements(const struct tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

const void *tensor_row(const struct tensor *t, int64_t r) {
    DASSERT(r >= 0 && r < t->ne[1] * t->ne[2] * t->ne[3]);
    return (const uint8_t *)t->data + (size_t)r * t->row_bytes;
}

void tensor_row_to_f32(const struct tensor *t, int64_t r, float *dst) {
    const struct quant_traits *tr = quant_traits(t->type);
    ASSERT(tr && tr->to_f32);
    tr->to_f32(tensor_row(t, r), dst, t->ne[0]);
}
