/*
 * scheduler/lora_slots.c - adapter slot assignment with LRU eviction of
 * unused slots (the contract is in lora_slots.h). A handful of slots: every
 * operation is a linear scan.
 */
#define LOG_TAG "lora"
#include "scheduler/lora_slots.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/log.h"

void lora_slots_init(struct lora_slots *t, int32_t n_slots) {
    ASSERT(n_slots >= 0);
    memset(t, 0, sizeof(*t));
    t->n_slots = n_slots;
    t->slots = n_slots ? xcalloc((size_t)n_slots, sizeof(*t->slots)) : NULL;
}

void lora_slots_deinit(struct lora_slots *t) {
    for (int32_t i = 0; i < t->n_slots; i++) {
        ASSERT(t->slots[i].n_users == 0);
        engine_adapter_release(t->slots[i].adapter);
    }
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static int32_t find(const struct lora_slots *t, const struct engine_adapter *a) {
    for (int32_t i = 0; i < t->n_slots; i++)
        if (t->slots[i].adapter == a) return i;
    return LORA_SLOTS_NONE;
}

/* An empty slot, else the least recently used one without users. */
static int32_t victim(const struct lora_slots *t) {
    int32_t best = LORA_SLOTS_NONE;
    for (int32_t i = 0; i < t->n_slots; i++) {
        const struct lora_slot *s = &t->slots[i];
        if (!s->adapter) return i;
        if (s->n_users == 0 && (best < 0 || s->t_last_used < t->slots[best].t_last_used)) best = i;
    }
    return best;
}

int32_t lora_slots_acquire(struct lora_slots *t, struct engine_adapter *a) {
    ASSERT(a);
    int32_t i = find(t, a);
    if (i < 0) {
        i = victim(t);
        if (i < 0) return LORA_SLOTS_NONE;
        struct lora_slot *s = &t->slots[i];
        if (s->adapter) {
            LOG_DEBUG("evict slot=%d adapter_id=%llu for a new adapter", (int)i,
                      (unsigned long long)s->adapter_id);
            engine_adapter_release(s->adapter);
            t->n_evictions++;
        }
        s->adapter = engine_adapter_retain(a);
        s->adapter_id = engine_adapter_get_info(a)->id;
        ASSERT(s->adapter_id != 0);  // the engine numbers adapters from 1
        s->is_dirty = true;
        t->n_loads++;
    }
    struct lora_slot *s = &t->slots[i];
    s->n_users++;
    s->t_last_used = ++t->tick;
    return i;
}

void lora_slots_release(struct lora_slots *t, int32_t slot) {
    ASSERT(slot >= 0 && slot < t->n_slots && t->slots[slot].n_users > 0);
    t->slots[slot].n_users--;
}

bool lora_slots_can_acquire(const struct lora_slots *t, const struct engine_adapter *a) {
    return find(t, a) >= 0 || victim(t) >= 0;
}

int32_t lora_slots_n_resident(const struct lora_slots *t) {
    int32_t n = 0;
    for (int32_t i = 0; i < t->n_slots; i++) n += t->slots[i].adapter != NULL;
    return n;
}

bool lora_slots_check(const struct lora_slots *t) {
    for (int32_t i = 0; i < t->n_slots; i++) {
        const struct lora_slot *s = &t->slots[i];
        if (s->n_users < 0 || (!s->adapter && (s->n_users || s->adapter_id))) {
            LOG_ERROR("lora_slots_check: slot %d users=%d id=%llu adapter=%p", (int)i,
                      (int)s->n_users, (unsigned long long)s->adapter_id, (void *)s->adapter);
            return false;
        }
        if (!s->adapter) continue;
        if (s->adapter_id == 0 || s->adapter_id != engine_adapter_get_info(s->adapter)->id) {
            LOG_ERROR("lora_slots_check: slot %d has id %llu, its adapter %llu", (int)i,
                      (unsigned long long)s->adapter_id,
                      (unsigned long long)engine_adapter_get_info(s->adapter)->id);
            return false;
        }
        for (int32_t j = i + 1; j < t->n_slots; j++) {
            if (t->slots[j].adapter == s->adapter || t->slots[j].adapter_id == s->adapter_id) {
                LOG_ERROR("lora_slots_check: slots %d and %d hold the same adapter", (int)i,
                          (int)j);
                return false;
            }
        }
    }
    return true;
}
