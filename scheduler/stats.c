/*
 * scheduler/stats.c - histogram buckets and the published snapshot.
 */
#include "scheduler/stats.h"

#include <string.h>

#include "engine/base/err.h"

const double stats_bucket_ms[STATS_N_BUCKETS - 1] = {
    1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000,
};

void stats_observe(struct stats_histogram *h, double ms) {
    int i = 0;
    while (i < STATS_N_BUCKETS - 1 && ms > stats_bucket_ms[i]) i++;
    h->counts[i]++;
    h->n++;
    h->sum_ms += ms;
}

int stats_init(struct stats *st) {
    memset(&st->published, 0, sizeof(st->published));
    return uv_mutex_init(&st->lock) == 0 ? 0 : ERR_NOMEM;
}

void stats_deinit(struct stats *st) {
    uv_mutex_destroy(&st->lock);
}

void stats_publish(struct stats *st, const struct scheduler_stats *cur) {
    uv_mutex_lock(&st->lock);
    st->published = *cur;
    uv_mutex_unlock(&st->lock);
}

void stats_snapshot(struct stats *st, struct scheduler_stats *out) {
    uv_mutex_lock(&st->lock);
    *out = st->published;
    uv_mutex_unlock(&st->lock);
}
