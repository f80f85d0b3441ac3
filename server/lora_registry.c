/*
 * server/lora_registry.c - name -> adapter list behind one mutex. Few
 * adapters (tens): a growable array searched linearly, in load order.
 * A load checks the name, drops the lock for the slow engine_adapter_load(),
 * then checks the name again before inserting, so two concurrent loads of one
 * name cannot both win.
 */
#define LOG_TAG "lora"
#include "server/lora_registry.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/base/alloc.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/log.h"

struct lora_entry {
    char *name;                     // owned
    char *path;                     // owned
    struct engine_adapter *adapter; // owned reference
    int64_t created_s;
};

struct lora_registry {
    const struct engine_model *model;  // borrowed
    char *base_name;                   // owned
    pthread_mutex_t lock;              // guards entries and n
    struct lora_entry *entries;        // owned [cap], the first n in use, in load order
    int32_t n;
    int32_t cap;
};

struct lora_registry *lora_registry_create(const struct engine_model *m, const char *base_name) {
    struct lora_registry *r = calloc(1, sizeof(*r));
    if (!r) return NULL;
    r->model = m;
    r->base_name = strdup(base_name ? base_name : "");
    if (!r->base_name || pthread_mutex_init(&r->lock, NULL) != 0) {
        free(r->base_name);
        free(r);
        return NULL;
    }
    return r;
}

void lora_registry_destroy(struct lora_registry *r) {
    if (!r) return;
    for (int32_t i = 0; i < r->n; i++) {
        free(r->entries[i].name);
        free(r->entries[i].path);
        engine_adapter_release(r->entries[i].adapter);
    }
    free(r->entries);
    free(r->base_name);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

static int32_t find_locked(const struct lora_registry *r, const char *name) {
    for (int32_t i = 0; i < r->n; i++)
        if (strcmp(r->entries[i].name, name) == 0) return i;
    return -1;
}

static bool is_valid_name(const char *name) {
    size_t len = strlen(name);
    if (len == 0 || len > LORA_REGISTRY_NAME_MAX) return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f) return false;
    return true;
}

int lora_registry_load(struct lora_registry *r, const char *name, const char *path, char *msg,
                       size_t msg_size) {
    if (!is_valid_name(name)) {
        snprintf(msg, msg_size, "An adapter name must be 1 to %d bytes without control "
                 "characters", LORA_REGISTRY_NAME_MAX);
        return ERR_INVAL;
    }
    if (strcmp(name, r->base_name) == 0) {
        snprintf(msg, msg_size, "'%.128s' is the base model's name; choose another adapter name",
                 name);
        return ERR_INVAL;
    }
    if (!*path) {
        snprintf(msg, msg_size, "The adapter path is empty");
        return ERR_INVAL;
    }
    pthread_mutex_lock(&r->lock);
    bool is_taken = find_locked(r, name) >= 0;
    pthread_mutex_unlock(&r->lock);
    if (is_taken) goto exists;

    int64_t t0 = clock_mono_ns();
    struct engine_adapter *a = NULL;
    int err = engine_adapter_load(r->model, path, &a);
    if (err) {
        snprintf(msg, msg_size, "Cannot load the adapter '%.128s' from '%.256s': %s (the "
                 "server log has the details)", name, path, err_str(err));
        return err;
    }
    pthread_mutex_lock(&r->lock);
    if (find_locked(r, name) >= 0) {
        pthread_mutex_unlock(&r->lock);
        engine_adapter_release(a);
        goto exists;
    }
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 8;
        r->entries = xrealloc(r->entries, (size_t)r->cap * sizeof(*r->entries));
    }
    r->entries[r->n++] = (struct lora_entry){xstrdup(name), xstrdup(path), a, (int64_t)time(NULL)};
    pthread_mutex_unlock(&r->lock);
    const struct engine_adapter_info *info = engine_adapter_get_info(a);
    LOG_INFO("adapter loaded name=%s path=%s format=%s rank=%d scale=%g targets=%d mib=%.1f "
             "load_ms=%.1f", name, path, info->format, (int)info->rank, (double)info->scale,
             (int)info->n_targets, (double)info->bytes / 1048576.0,
             (double)(clock_mono_ns() - t0) / 1e6);
    return 0;

exists:
    snprintf(msg, msg_size, "An adapter named '%.128s' is already loaded; unload it first", name);
    return LORA_REGISTRY_EXISTS;
}

int lora_registry_unload(struct lora_registry *r, const char *name) {
    pthread_mutex_lock(&r->lock);
    int32_t i = find_locked(r, name);
    if (i < 0) {
        pthread_mutex_unlock(&r->lock);
        return ERR_NOTFOUND;
    }
    struct lora_entry e = r->entries[i];
    memmove(&r->entries[i], &r->entries[i + 1], (size_t)(r->n - i - 1) * sizeof(*r->entries));
    r->n--;
    pthread_mutex_unlock(&r->lock);
    LOG_INFO("adapter unloaded name=%s path=%s", e.name, e.path);
    free(e.name);
    free(e.path);
    engine_adapter_release(e.adapter);  // requests still using it hold their own
    return 0;
}

struct engine_adapter *lora_registry_get(struct lora_registry *r, const char *name) {
    pthread_mutex_lock(&r->lock);
    int32_t i = find_locked(r, name);
    struct engine_adapter *a = i >= 0 ? engine_adapter_retain(r->entries[i].adapter) : NULL;
    pthread_mutex_unlock(&r->lock);
    return a;
}

int32_t lora_registry_count(struct lora_registry *r) {
    pthread_mutex_lock(&r->lock);
    int32_t n = r->n;
    pthread_mutex_unlock(&r->lock);
    return n;
}

void lora_registry_foreach(struct lora_registry *r,
                           void (*fn)(const struct lora_registry_entry *e, void *user),
                           void *user) {
    pthread_mutex_lock(&r->lock);
    for (int32_t i = 0; i < r->n; i++) {
        const struct lora_entry *le = &r->entries[i];
        struct lora_registry_entry e = {le->name, le->path, engine_adapter_get_info(le->adapter),
                                        le->created_s};
        fn(&e, user);
    }
    pthread_mutex_unlock(&r->lock);
}
