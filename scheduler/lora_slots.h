/*
 * scheduler/lora_slots.h - the scheduler's view of the engine ctx's adapter
 * slots: which adapter each of the max_loras slots holds, how many running
 * sequences use it, and when it was last wanted (LRU).
 *
 * A sequence that needs an adapter gets a slot at admission: the slot already
 * holding its adapter, else an empty one, else the least recently used slot
 * that no running sequence uses (the old adapter is evicted); when every slot
 * is in use the sequence must wait (LORA_SLOTS_NONE). The table only decides:
 * a slot whose content changed is marked dirty, and scheduler.c puts the
 * adapter into the ctx (engine_ctx_set_adapter) before the next forward pass.
 *
 * Adapter identity for the prefix cache is not the slot's business: it is
 * the loaded object's info.id (engine/lora.h), which the engine hands out once
 * per load and never again. A slot number is reused by other adapters and a
 * pointer may be handed out again by malloc after the adapter is freed, so
 * neither could name one set of weights; the id does, in whatever slot the
 * adapter sits and across evictions and reloads into slots. The table keeps
 * a copy of the resident adapter's id for its invariants and the log.
 *
 * Owns one reference to each resident adapter (engine_adapter_retain), apart
 * from the engine slot's own. Threads: the step thread (or the thread driving
 * scheduler_step()).
 */
#ifndef SCHEDULER_LORA_SLOTS_H
#define SCHEDULER_LORA_SLOTS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

#define LORA_SLOTS_NONE (-1)

struct lora_slot {
    struct engine_adapter *adapter;  // owned reference; NULL: empty
    uint64_t adapter_id;             // the adapter's info.id (engine/lora.h), 0 when empty
    int32_t n_users;                 // running sequences that hold the slot
    int64_t t_last_used;             // lora_slots tick of the last acquire (LRU)
    bool is_dirty;                   // the ctx's slot does not hold `adapter` yet
};

struct lora_slots {
    struct lora_slot *slots;  // owned; [n_slots]
    int32_t n_slots;          // 0: adapters are not served
    int64_t tick;             // acquire counter, the LRU clock
    int64_t n_loads;          // adapters put into a slot
    int64_t n_evictions;      // of those, replacing a resident adapter
};

/* n_slots >= 0 empty slots. Aborts on OOM (bookkeeping). */
void lora_slots_init(struct lora_slots *t, int32_t n_slots);

/* Releases every resident adapter and frees the table; n_users must be 0.
 * Safe on a zeroed table. */
void lora_slots_deinit(struct lora_slots *t);

/* A slot for adapter a (non-NULL) for one more running sequence: the slot
 * that holds a, else an empty one, else the least recently used slot with no
 * users (evicting its adapter). Increments the slot's n_users. Returns the
 * slot index, or LORA_SLOTS_NONE when every slot is held by running sequences
 * (the caller waits; nothing changed). */
int32_t lora_slots_acquire(struct lora_slots *t, struct engine_adapter *a);

/* One running sequence of slot lets go (finish, preemption, a failed
 * admission). The adapter stays resident, evictable once n_users is 0. */
void lora_slots_release(struct lora_slots *t, int32_t slot);

/* Whether a running sequence would get a slot for a now (resident, or some
 * slot has no users). */
bool lora_slots_can_acquire(const struct lora_slots *t, const struct engine_adapter *a);

/* Resident adapters (slots not empty). */
int32_t lora_slots_n_resident(const struct lora_slots *t);

/* Invariants: ids non-zero exactly for resident slots and equal to their
 * adapter's info.id; n_users >= 0 and 0 for empty slots; no adapter (and no
 * id) in two slots. */
bool lora_slots_check(const struct lora_slots *t);

#endif // SCHEDULER_LORA_SLOTS_H
