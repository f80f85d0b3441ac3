/*
 * server/lora_registry.h - the served adapters: name -> loaded engine adapter,
 * filled from --lora NAME=PATH at start-up and changed at run time by
 * POST /v1/load_lora_adapter and /v1/unload_lora_adapter.
 *
 * Owns one reference to each adapter it lists, and copies of the names and
 * paths. Unloading drops the registry's reference only: requests that looked
 * the adapter up before (lora_registry_get() retains) and sequences in the
 * scheduler (which retain at submit) keep theirs and finish normally; the
 * adapter is freed when the last one lets go (engine/lora.h's refcount).
 * Threads: every function is [any thread]: one mutex guards the list (HTTP
 * handlers run on MHD's thread, start-up on main). Loading from disk runs
 * outside the lock, on the caller's thread (never the step thread).
 */
#ifndef SERVER_LORA_REGISTRY_H
#define SERVER_LORA_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

#define LORA_REGISTRY_NAME_MAX 128   // bytes of an adapter name
#define LORA_REGISTRY_EXISTS 1       // lora_registry_load(): the name is taken (an outcome)

struct lora_registry;

/* An empty registry for adapters of model m (borrowed; it must outlive the
 * registry). base_name is the served base model's id, which no adapter may
 * take (copied). NULL when out of memory. Free with lora_registry_destroy(). */
struct lora_registry *lora_registry_create(const struct engine_model *m, const char *base_name);

/* Releases every adapter and frees the registry. NULL-safe. */
void lora_registry_destroy(struct lora_registry *r);

/* Loads the adapter at path (engine_adapter_load(): PEFT directory, GGUF LoRA
 * file or bottleneck directory) and lists it as name. Returns 0;
 * LORA_REGISTRY_EXISTS when name is already listed (nothing is loaded);
 * ERR_INVAL for a bad name (empty, longer than LORA_REGISTRY_NAME_MAX, control
 * characters, or the base model's name); or what engine_adapter_load()
 * returns (ERR_IO, ERR_FORMAT, ERR_UNSUPPORTED, ERR_NOMEM; the engine logged
 * the detail). msg (msg_size bytes) gets a sentence for the client or the
 * operator in every non-zero case. */
int lora_registry_load(struct lora_registry *r, const char *name, const char *path, char *msg,
                       size_t msg_size);

/* Drops name from the registry and releases the registry's reference.
 * Returns 0 or ERR_NOTFOUND. */
int lora_registry_unload(struct lora_registry *r, const char *name);

/* The adapter listed as name, with a new reference the caller owns (release
 * with engine_adapter_release()), or NULL when name is not listed. */
struct engine_adapter *lora_registry_get(struct lora_registry *r, const char *name);

/* Adapters listed now. */
int32_t lora_registry_count(struct lora_registry *r);

/* One listed adapter, for lora_registry_foreach(); every pointer is valid
 * only during the callback. */
struct lora_registry_entry {
    const char *name;
    const char *path;
    const struct engine_adapter_info *info;
    int64_t created_s;                       // Unix time it was loaded
};

/* Calls fn for each adapter in load order, under the registry's lock: fn must
 * not block or call back into the registry. */
void lora_registry_foreach(struct lora_registry *r,
                           void (*fn)(const struct lora_registry_entry *e, void *user),
                           void *user);

#endif
