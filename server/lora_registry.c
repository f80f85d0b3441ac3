/*
 * server/lora_registry.c - name -> adapter list behind one mutex. Few
 * adapters (tens): a growable array searched linearly, in reservation order.
 * A reservation is an entry without an adapter, found by its ticket; the
 * slow engine_adapter_load() runs without the lock, and its adapter is listed
 * only if the ticket is still there (an unload removes the entry, so a later
 * reservation of the same name has another ticket and is never confused with
 * it).
 */
#define LOG_TAG "lora"
#include "server/lora_registry.h"

#include <unistd.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/base/alloc.h"
#include "server/lora_path.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/log.h"

struct lora_entry {
    char *name;                     // owned
    char *path;                     // owned
    struct engine_adapter *adapter; // owned reference; NULL while reserved
    uint64_t ticket;                // the reservation's, while reserved; 0 once listed
    int64_t created_s;
};

struct lora_registry {
    const struct engine_model *model;  // borrowed
    char *base_name;                   // owned
    pthread_mutex_t lock;              // guards entries, n and next_ticket
    struct lora_entry *entries;        // owned [cap], the first n in use, in reservation order
    int32_t n;
    int32_t cap;
    uint64_t next_ticket;              // the next reservation's ticket (from 1)
};

struct lora_registry *lora_registry_create(const struct engine_model *m, const char *base_name) {
    struct lora_registry *r = calloc(1, sizeof(*r));
    if (!r) return NULL;
    r->model = m;
    r->next_ticket = 1;
    r->base_name = strdup(base_name ? base_name : "");
    if (!r->base_name || pthread_mutex_init(&r->lock, NULL) != 0) {
        free(r->base_name);
        free(r);
        return NULL;
    }
    return r;
}

static void entry_free(struct lora_entry *e) {
    free(e->name);
    free(e->path);
    engine_adapter_release(e->adapter);
}

void lora_registry_destroy(struct lora_registry *r) {
    if (!r) return;
    for (int32_t i = 0; i < r->n; i++) entry_free(&r->entries[i]);
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

static int32_t find_ticket_locked(const struct lora_registry *r, uint64_t ticket) {
    for (int32_t i = 0; i < r->n; i++)
        if (r->entries[i].ticket == ticket) return i;
    return -1;
}

static void remove_locked(struct lora_registry *r, int32_t i) {
    memmove(&r->entries[i], &r->entries[i + 1], (size_t)(r->n - i - 1) * sizeof(*r->entries));
    r->n--;
}

static bool is_valid_name(const char *name) {
    size_t len = strlen(name);
    if (len == 0 || len > LORA_REGISTRY_NAME_MAX) return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f) return false;
    return true;
}

int lora_registry_reserve(struct lora_registry *r, const char *name, const char *path,
                          uint64_t *out_ticket, char *msg, size_t msg_size) {
    *out_ticket = 0;
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
    int32_t i = find_locked(r, name);
    if (i >= 0) {
        bool is_loading = r->entries[i].adapter == NULL;
        pthread_mutex_unlock(&r->lock);
        if (is_loading) {
            snprintf(msg, msg_size, "An adapter named '%.128s' is being loaded; wait for the "
                     "answer to that load", name);
            return LORA_REGISTRY_LOADING;
        }
        snprintf(msg, msg_size, "An adapter named '%.128s' is already loaded; unload it first",
                 name);
        return LORA_REGISTRY_EXISTS;
    }
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 8;
        r->entries = xrealloc(r->entries, (size_t)r->cap * sizeof(*r->entries));
    }
    uint64_t ticket = r->next_ticket++;
    r->entries[r->n++] = (struct lora_entry){xstrdup(name), xstrdup(path), NULL, ticket, 0};
    pthread_mutex_unlock(&r->lock);
    *out_ticket = ticket;
    return 0;
}

int lora_registry_load_reserved(struct lora_registry *r, uint64_t ticket,
                                const struct lora_path_root *root,
                                struct engine_adapter **out_adapter, char *msg, size_t msg_size) {
    if (out_adapter) *out_adapter = NULL;
    // Copy what the load needs: an unload may free the entry meanwhile.
    char name[LORA_REGISTRY_NAME_MAX + 1];
    pthread_mutex_lock(&r->lock);
    int32_t i = find_ticket_locked(r, ticket);
    char *path = i >= 0 ? xstrdup(r->entries[i].path) : NULL;
    if (i >= 0) snprintf(name, sizeof(name), "%s", r->entries[i].name);
    pthread_mutex_unlock(&r->lock);
    if (!path) {
        snprintf(msg, msg_size, "The adapter was unloaded before its load started");
        return ERR_CANCELED;
    }

    int64_t t0 = clock_mono_ns();
    struct engine_adapter *a = NULL;
    int err = 0;
    if (root) {
        // Opened inside root without following a symlink, then read only
        // through the descriptor (server/lora_path.h).
        int fd = -1;
        err = lora_path_open(root, path, &fd, msg, msg_size);
        if (err) {
            lora_registry_cancel(r, ticket);
            free(path);
            return err;
        }
        err = engine_adapter_load_fd(r->model, fd, path, ENGINE_ADAPTER_LOAD_NO_SYMLINKS, &a);
        close(fd);
    } else {
        err = engine_adapter_load(r->model, path, &a);
    }
    if (err == ERR_PERM) {
        snprintf(msg, msg_size, "Cannot load the adapter '%.128s' from '%.256s': a file in it "
                 "is a symlink, and symlinks are not followed in the server's adapter "
                 "directory", name, path);
        lora_registry_cancel(r, ticket);
        free(path);
        return err;
    }
    if (err) {
        snprintf(msg, msg_size, "Cannot load the adapter '%.128s' from '%.256s': %s (the "
                 "server log has the details)", name, path, err_str(err));
        lora_registry_cancel(r, ticket);
        free(path);
        return err;
    }
    pthread_mutex_lock(&r->lock);
    i = find_ticket_locked(r, ticket);
    if (i >= 0) {
        r->entries[i].adapter = engine_adapter_retain(a);
        r->entries[i].ticket = 0;
        r->entries[i].created_s = (int64_t)time(NULL);
    }
    pthread_mutex_unlock(&r->lock);
    const struct engine_adapter_info *info = engine_adapter_get_info(a);
    double load_ms = (double)(clock_mono_ns() - t0) / 1e6;
    if (i < 0) {
        LOG_INFO("adapter load canceled name=%s path=%s load_ms=%.1f (unloaded while loading)",
                 name, path, load_ms);
        snprintf(msg, msg_size, "The adapter '%.128s' was unloaded while it was loading", name);
        engine_adapter_release(a);
        free(path);
        return ERR_CANCELED;
    }
    LOG_INFO("adapter loaded name=%s path=%s format=%s rank=%d scale=%g targets=%d mib=%.1f "
             "id=%llu load_ms=%.1f", name, path, info->format, (int)info->rank,
             (double)info->scale, (int)info->n_targets, (double)info->bytes / 1048576.0,
             (unsigned long long)info->id, load_ms);
    if (out_adapter) {
        *out_adapter = a;
    } else {
        engine_adapter_release(a);
    }
    free(path);
    return 0;
}

void lora_registry_cancel(struct lora_registry *r, uint64_t ticket) {
    pthread_mutex_lock(&r->lock);
    int32_t i = find_ticket_locked(r, ticket);
    struct lora_entry e = {0};
    if (i >= 0) {
        e = r->entries[i];
        remove_locked(r, i);
    }
    pthread_mutex_unlock(&r->lock);
    entry_free(&e);
}

int lora_registry_load(struct lora_registry *r, const char *name, const char *path, char *msg,
                       size_t msg_size) {
    uint64_t ticket = 0;
    int err = lora_registry_reserve(r, name, path, &ticket, msg, msg_size);
    if (err) return err;
    return lora_registry_load_reserved(r, ticket, NULL, NULL, msg, msg_size);
}

int lora_registry_unload(struct lora_registry *r, const char *name) {
    pthread_mutex_lock(&r->lock);
    int32_t i = find_locked(r, name);
    if (i < 0) {
        pthread_mutex_unlock(&r->lock);
        return ERR_NOTFOUND;
    }
    struct lora_entry e = r->entries[i];
    remove_locked(r, i);
    pthread_mutex_unlock(&r->lock);
    if (e.adapter) {
        LOG_INFO("adapter unloaded name=%s path=%s", e.name, e.path);
    } else {
        LOG_INFO("adapter unloaded name=%s path=%s while loading: its load is canceled", e.name,
                 e.path);
    }
    entry_free(&e);  // requests still using the adapter hold their own references
    return 0;
}

struct engine_adapter *lora_registry_get(struct lora_registry *r, const char *name) {
    pthread_mutex_lock(&r->lock);
    int32_t i = find_locked(r, name);
    struct engine_adapter *a = i >= 0 && r->entries[i].adapter
                                   ? engine_adapter_retain(r->entries[i].adapter)
                                   : NULL;
    pthread_mutex_unlock(&r->lock);
    return a;
}

int32_t lora_registry_count(struct lora_registry *r) {
    pthread_mutex_lock(&r->lock);
    int32_t n = 0;
    for (int32_t i = 0; i < r->n; i++) n += r->entries[i].adapter != NULL;
    pthread_mutex_unlock(&r->lock);
    return n;
}

void lora_registry_foreach(struct lora_registry *r,
                           void (*fn)(const struct lora_registry_entry *e, void *user),
                           void *user) {
    pthread_mutex_lock(&r->lock);
    for (int32_t i = 0; i < r->n; i++) {
        const struct lora_entry *le = &r->entries[i];
        if (!le->adapter) continue;  // reserved: not served yet
        struct lora_registry_entry e = {le->name, le->path, engine_adapter_get_info(le->adapter),
                                        le->created_s};
        fn(&e, user);
    }
    pthread_mutex_unlock(&r->lock);
}
