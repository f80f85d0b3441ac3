/*
 * safetensors_builder.c - in-memory safetensors writer for tests (the
 * contract is in safetensors_builder.h).
 */
#include "tests/helpers/safetensors_builder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct safetensors_builder {
    char *json;        // the entries so far, without the braces
    size_t json_len;
    char *meta;        // the __metadata__ entries so far
    size_t meta_len;
    uint8_t *data;
    size_t data_len;
    char *header;      // forced header text, or NULL
};

static void *xrealloc_or_die(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) abort();
    return p;
}

static void append(char **s, size_t *len, const char *text) {
    size_t n = strlen(text);
    *s = xrealloc_or_die(*s, *len + n + 1);
    memcpy(*s + *len, text, n + 1);
    *len += n;
}

struct safetensors_builder *safetensors_builder_create(void) {
    struct safetensors_builder *b = calloc(1, sizeof(*b));
    if (!b) abort();
    return b;
}

void safetensors_builder_destroy(struct safetensors_builder *b) {
    if (!b) return;
    free(b->json);
    free(b->meta);
    free(b->data);
    free(b->header);
    free(b);
}

void safetensors_builder_tensor(struct safetensors_builder *b, const char *name, const char *dtype,
                                int n_dims, const int64_t *shape, const void *data, size_t nbytes) {
    char entry[1024];
    int n = snprintf(entry, sizeof(entry), "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                     b->json_len ? "," : "", name, dtype);
    for (int d = 0; d < n_dims; d++) {
        n += snprintf(entry + n, sizeof(entry) - (size_t)n, "%s%lld", d ? "," : "",
                      (long long)shape[d]);
    }
    snprintf(entry + n, sizeof(entry) - (size_t)n, "],\"data_offsets\":[%zu,%zu]}", b->data_len,
             b->data_len + nbytes);
    append(&b->json, &b->json_len, entry);
    b->data = xrealloc_or_die(b->data, b->data_len + nbytes);
    for (size_t k = 0; k < nbytes; k++) {
        b->data[b->data_len + k] = data ? ((const uint8_t *)data)[k] : (uint8_t)(k * 7 + 1);
    }
    b->data_len += nbytes;
}

void safetensors_builder_f32(struct safetensors_builder *b, const char *name, int64_t rows,
                             int64_t cols, const float *data) {
    int64_t shape[2] = {rows, cols};
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1) * sizeof(float);
    safetensors_builder_tensor(b, name, "F32", cols ? 2 : 1, shape, data, n);
}

void safetensors_builder_metadata(struct safetensors_builder *b, const char *key,
                                  const char *value) {
    char entry[512];
    snprintf(entry, sizeof(entry), "%s\"%s\":\"%s\"", b->meta_len ? "," : "", key, value);
    append(&b->meta, &b->meta_len, entry);
}

void safetensors_builder_header(struct safetensors_builder *b, const char *text) {
    free(b->header);
    b->header = strdup(text);
    if (!b->header) abort();
}

uint8_t *safetensors_builder_finish(struct safetensors_builder *b, size_t *out_n) {
    char *h = NULL;
    size_t hl = 0;
    if (b->header) {
        append(&h, &hl, b->header);
    } else {
        append(&h, &hl, "{");
        if (b->meta_len) {
            append(&h, &hl, "\"__metadata__\":{");
            append(&h, &hl, b->meta);
            append(&h, &hl, b->json_len ? "}," : "}");
        }
        if (b->json_len) append(&h, &hl, b->json);
        append(&h, &hl, "}");
        while (hl % 8) append(&h, &hl, " ");
    }
    size_t n = 8 + hl + b->data_len;
    uint8_t *out = malloc(n);
    if (!out) abort();
    uint64_t len = hl;
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(len >> (8 * i));
    memcpy(out + 8, h, hl);
    if (b->data_len) memcpy(out + 8 + hl, b->data, b->data_len);
    free(h);
    *out_n = n;
    return out;
}

int safetensors_builder_write_file(const char *path, const uint8_t *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(bytes, 1, n, f) == n;
    ok &= fclose(f) == 0;
    return ok ? 0 : -1;
}
