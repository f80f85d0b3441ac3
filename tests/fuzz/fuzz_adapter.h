/*
 * tests/fuzz/fuzz_adapter.h - the base model that fuzz_peft and
 * fuzz_lora_gguf load adapters against: tests/fuzz/data/base.gguf (written
 * by tests/fuzz/mkseeds), loaded once per process.
 */
#ifndef LLMSERVE_TESTS_FUZZ_ADAPTER_H
#define LLMSERVE_TESTS_FUZZ_ADAPTER_H

#include <stddef.h>

struct engine_model;

/* The base model, loaded on the first call (aborts when the committed file
 * does not load: the harness is broken then). Freed at exit. */
const struct engine_model *fuzz_adapter_base(void);

/* engine_adapter_load(base, path): on success checks the info and releases
 * the adapter. */
void fuzz_adapter_load(const char *path);

#endif // LLMSERVE_TESTS_FUZZ_ADAPTER_H
