/*
 * safetensors_builder.h - writes safetensors files in memory for tests, valid
 * or corrupt (the companion of gguf_builder.h).
 *
 * A builder collects tensor entries and their data and joins them in
 * safetensors_builder_finish() as the format lays them out: u64 header length,
 * the JSON header (padded with spaces to a multiple of 8), the data section.
 * Each tensor added gets the next data offset; its entry is written from the
 * values given, so a test can declare shapes, dtypes and offsets that do not
 * match its bytes. safetensors_builder_header() replaces the generated header
 * with any text (malformed JSON). Allocation failures abort (tests only).
 */
#ifndef LLMSERVE_TESTS_SAFETENSORS_BUILDER_H
#define LLMSERVE_TESTS_SAFETENSORS_BUILDER_H

#include <stddef.h>
#include <stdint.h>

struct safetensors_builder;

struct safetensors_builder *safetensors_builder_create(void);
void safetensors_builder_destroy(struct safetensors_builder *b);  // NULL-safe

/* A tensor: name, dtype string ("F32", "F16", "BF16", or anything), shape
 * [n_dims], and nbytes of data (data NULL: a byte pattern). The entry's
 * data_offsets are [at, at + nbytes) for the next free offset `at`. */
void safetensors_builder_tensor(struct safetensors_builder *b, const char *name, const char *dtype,
                                int n_dims, const int64_t *shape, const void *data, size_t nbytes);

/* An f32 tensor of shape [rows, cols] (cols 0: a vector [rows]) from data. */
void safetensors_builder_f32(struct safetensors_builder *b, const char *name, int64_t rows,
                             int64_t cols, const float *data);

/* One __metadata__ entry (string value). */
void safetensors_builder_metadata(struct safetensors_builder *b, const char *key,
                                  const char *value);

/* Uses text (NUL-terminated, any bytes) as the header instead of the
 * generated JSON; the data section stays as added. */
void safetensors_builder_header(struct safetensors_builder *b, const char *text);

/* The file's bytes (owned by the caller; free()) and their count. */
uint8_t *safetensors_builder_finish(struct safetensors_builder *b, size_t *out_n);

/* Writes bytes to path; returns 0 or -1. */
int safetensors_builder_write_file(const char *path, const uint8_t *bytes, size_t n);

#endif
