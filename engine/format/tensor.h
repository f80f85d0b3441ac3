/*
 * tensor.h - a weight tensor: its type, shape and a view of its data in the
 * mapped GGUF file. Shapes use GGUF/ggml order: ne[0] is the contiguous
 * (innermost) dimension, so a matrix with ne = [n_in, n_out] is stored as
 * n_out rows of n_in elements, and y = W x has n_out outputs.
 */
#ifndef LLMSERVE_TENSOR_H
#define LLMSERVE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "engine/format/quant.h"

struct tensor {
    char name[64];          // GGUF name, e.g. "blk.3.attn_q.weight"
    enum quant_type type;
    int32_t n_dims;
    int64_t ne[4];          // elements per dimension; unused ones are 1
    size_t row_bytes;       // bytes from one row to the next: those of ne[0] elements,
                            //   or more in a column slice of tensor parallelism, a
                            //   strided view of the file's wider rows (model/shard.h)
    const void *data;       // view into the mapping; valid for the model's life
    // the same matrix in the panel or q-panel layout of kern_matmul()
    // (kernels.h), owned by the model, or NULL (types without one, 1-D
    // tensors, tools that never multiply)
    const void *panels;
};

/* Elements in the tensor. */
int64_t tensor_n_elements(const struct tensor *t);

/* Pointer to row r (0 <= r < ne[1] * ne[2] * ne[3], asserted). */
const void *tensor_row(const struct tensor *t, int64_t r);

/* Converts row r to f32 into dst [ne[0]]. The type must be supported. */
void tensor_row_to_f32(const struct tensor *t, int64_t r, float *dst);

#endif
