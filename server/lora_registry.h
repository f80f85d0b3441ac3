/*
 * server/lora_registry.h - the served adapters: name -> loaded engine adapter,
 * filled from --lora NAME=PATH at start-up and changed at run time by
 * POST /v1/load_lora_adapter and /v1/unload_lora_adapter.
 *
 * A name is either listed (its adapter is loaded: requests may select it,
 * /v1/models shows it) or reserved (a load of it is in progress, on the
 * loader thread, server/lora_loader.h: nothing sees it yet, but no second
 * load may take the name). A load is two steps, so that the slow one can run
 * on another thread than the one that checked the request:
 *   lora_registry_reserve()        checks the name, reserves it      [fast]
 *   lora_registry_load_reserved()  engine_adapter_load(), then lists [slow]
 * An unload of a reserved name withdraws the reservation: the load is not
 * started, or its adapter is dropped when it ends (ERR_CANCELED).
 *
 * Owns one reference to each adapter it lists, and copies of the names and
 * paths. Unloading drops the registry's reference only: requests that looked
 * the adapter up before (lora_registry_get() retains) and sequences in the
 * scheduler (which retain at submit) keep theirs and finish normally; the
 * adapter is freed when the last one lets go (engine/lora.h's refcount).
 * Threads: every function is [any thread]: one mutex guards the list (HTTP
 * handlers run on MHD's thread, loads on the loader thread, start-up on
 * main). engine_adapter_load() runs outside the lock.
 */
#ifndef SERVER_LORA_REGISTRY_H
#define SERVER_LORA_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

#define LORA_REGISTRY_NAME_MAX 128   // bytes of an adapter name

/* Outcomes of lora_registry_reserve() and lora_registry_load() (not errors:
 * the request was fine, the name is not free). */
#define LORA_REGISTRY_EXISTS 1       // the name is listed
#define LORA_REGISTRY_LOADING 2      // a load of the name is in progress

struct lora_registry;
struct lora_path_root;

/* An empty registry for adapters of model m (borrowed; it must outlive the
 * registry). base_name is the served base model's id, which no adapter may
 * take (copied). NULL when out of memory. Free with lora_registry_destroy(). */
struct lora_registry *lora_registry_create(const struct engine_model *m, const char *base_name);

/* Releases every adapter, forgets every reservation and frees the registry.
 * No load may be running (lora_loader_stop() first). NULL-safe. */
void lora_registry_destroy(struct lora_registry *r);

/* Checks name (non-empty, at most LORA_REGISTRY_NAME_MAX bytes, no control
 * characters, not the base model's name) and path (non-empty), and reserves
 * name for a load of path. Returns 0 with *out_ticket naming the reservation
 * (never 0, never reused); LORA_REGISTRY_EXISTS or LORA_REGISTRY_LOADING
 * when the name is taken; ERR_INVAL for a bad name or path. msg (msg_size
 * bytes) gets a sentence for the client in every non-zero case. */
int lora_registry_reserve(struct lora_registry *r, const char *name, const char *path,
                          uint64_t *out_ticket, char *msg, size_t msg_size);

/* Loads the reserved adapter (engine_adapter_load(): milliseconds to seconds;
 * never call it on the HTTP or the step thread) and lists it under its name.
 * With root, the reserved path (lora_path_check()'s output) is opened inside
 * it by lora_path_open() and loaded from that descriptor without following a
 * symlink (engine_adapter_load_fd(), ENGINE_ADAPTER_LOAD_NO_SYMLINKS); with
 * root NULL, by its path. The reservation is used up whatever happens.
 * Returns 0; ERR_CANCELED when the reservation was withdrawn
 * (lora_registry_unload()) before the load started (nothing is read) or
 * while it ran (the adapter is dropped); what lora_path_open() returns
 * (ERR_PERM, ERR_NOTFOUND, ERR_INVAL, ERR_IO); or what the engine's load
 * returns (ERR_IO, ERR_FORMAT, ERR_UNSUPPORTED, ERR_NOMEM, ERR_PERM; the
 * engine logged the detail). On 0, *out_adapter (when out_adapter is not
 * NULL) gets a reference the caller releases. msg gets a sentence for the
 * client in every non-zero case. */
int lora_registry_load_reserved(struct lora_registry *r, uint64_t ticket,
                                const struct lora_path_root *root,
                                struct engine_adapter **out_adapter, char *msg, size_t msg_size);

/* Withdraws a reservation that will never be loaded (a queued load dropped
 * at shutdown). No-op when it is gone already. */
void lora_registry_cancel(struct lora_registry *r, uint64_t ticket);

/* lora_registry_reserve() then lora_registry_load_reserved() on the calling
 * thread: for --lora at start-up. Returns what they return. */
int lora_registry_load(struct lora_registry *r, const char *name, const char *path, char *msg,
                       size_t msg_size);

/* Drops name from the registry: a listed adapter's reference is released, a
 * reservation is withdrawn (its load ends in ERR_CANCELED). Returns 0 or
 * ERR_NOTFOUND. */
int lora_registry_unload(struct lora_registry *r, const char *name);

/* The adapter listed as name, with a new reference the caller owns (release
 * with engine_adapter_release()), or NULL when name is not listed (also
 * while it is only reserved). */
struct engine_adapter *lora_registry_get(struct lora_registry *r, const char *name);

/* Adapters listed now (reservations not counted). */
int32_t lora_registry_count(struct lora_registry *r);

/* One listed adapter, for lora_registry_foreach(); every pointer is valid
 * only during the callback. */
struct lora_registry_entry {
    const char *name;
    const char *path;
    const struct engine_adapter_info *info;
    int64_t created_s;                       // Unix time it was loaded
};

/* Calls fn for each listed adapter in reservation order, under the
 * registry's lock: fn must not block or call back into the registry. */
void lora_registry_foreach(struct lora_registry *r,
                           void (*fn)(const struct lora_registry_entry *e, void *user),
                           void *user);

#endif
