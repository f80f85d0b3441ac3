/*
 * server/metrics.c - Prometheus text format: "# HELP", "# TYPE", then
 * samples; histograms as cumulative _bucket{le="..."} lines, _sum and _count.
 * Names follow Prometheus conventions (base units: seconds, _total counters).
 */
#include "server/metrics.h"

static void metric(struct buf *out, const char *name, const char *type, const char *help,
                   long long value) {
    buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %lld\n", name, help, name, type, name, value);
}

static void histogram(struct buf *out, const char *name, const char *help,
                      const struct stats_histogram *h, const double *bucket_ms) {
    buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    long long cum = 0;
    for (int i = 0; i < STATS_N_BUCKETS - 1; i++) {
        cum += h->counts[i];
        buf_printf(out, "%s_bucket{le=\"%g\"} %lld\n", name, bucket_ms[i] / 1000.0, cum);
    }
    cum += h->counts[STATS_N_BUCKETS - 1];
    buf_printf(out, "%s_bucket{le=\"+Inf\"} %lld\n", name, cum);
    buf_printf(out, "%s_sum %.6f\n%s_count %lld\n", name, h->sum_ms / 1000.0, name,
               (long long)h->n);
}

/* One value of every rank's figures (engine_rank_stats), by field. */
enum rank_field {
    RANK_RSS,
    RANK_FORWARD_S,
    RANK_STEPS,
    RANK_COMM_BYTES,
    RANK_RSS_NOW,
    RANK_MODEL_READ,
};

static double rank_value(const struct engine_rank_stats *r, enum rank_field f) {
    switch (f) {
        case RANK_RSS:
            return (double)r->peak_rss_bytes;
        case RANK_FORWARD_S:
            return (double)r->forward_ns / 1e9;
        case RANK_STEPS:
            return (double)r->n_steps;
        case RANK_COMM_BYTES:
            return (double)r->comm_bytes;
        case RANK_RSS_NOW:
            return (double)r->rss_bytes;
        case RANK_MODEL_READ:
            return (double)r->model_read_bytes;
    }
    return 0.0;
}

/* Tensor parallelism: the job's ranks, and per rank (as of its last report,
 * engine_ctx_rank_stats: at most a second old) its figures. */
static void rank_metrics(struct buf *out, const struct scheduler_stats *st) {
    static const struct {
        const char *name, *type, *help;
        enum rank_field field;
    } fams[] = {
        {"llmserve_rank_peak_rss_bytes", "gauge", "Peak resident memory of each rank.", RANK_RSS},
        {"llmserve_rank_forward_seconds_total", "counter",
         "Time each rank spent in forward passes.", RANK_FORWARD_S},
        {"llmserve_rank_steps_total", "counter", "Forward passes (steps) each rank ran.",
         RANK_STEPS},
        {"llmserve_rank_comm_bytes_total", "counter",
         "Payload bytes each rank handed to MPI collectives.", RANK_COMM_BYTES},
        {"llmserve_rank_rss_bytes", "gauge", "Resident memory of each rank now.", RANK_RSS_NOW},
        {"llmserve_rank_model_read_bytes", "gauge",
         "Tensor data each rank read from the model file (its slices).", RANK_MODEL_READ},
    };
    metric(out, "llmserve_ranks", "gauge", "Tensor-parallel ranks of the job.", st->n_ranks);
    const int32_t n_ranks = st->n_ranks < STATS_MAX_RANKS ? st->n_ranks : STATS_MAX_RANKS;
    for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
        buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", fams[f].name, fams[f].help, fams[f].name,
                   fams[f].type);
        for (int32_t r = 0; r < n_ranks; r++) {
            // seconds with microseconds; the others are whole numbers (exact below 2^53)
            buf_printf(out,
                       fams[f].field == RANK_FORWARD_S ? "%s{rank=\"%d\"} %.6f\n"
                                                       : "%s{rank=\"%d\"} %.0f\n",
                       fams[f].name, (int)r, rank_value(&st->ranks[r], fams[f].field));
        }
    }
}

void metrics_format(struct buf *out, const struct scheduler_stats *st, const double *bucket_ms,
                    const struct metrics_server *sv) {
    metric(out, "llmserve_requests_running", "gauge", "Sequences in the running batch.",
           st->n_running);
    metric(out, "llmserve_requests_waiting", "gauge", "Sequences waiting to be admitted.",
           st->n_waiting);
    metric(out, "llmserve_kv_blocks_total", "gauge", "KV blocks in the pool.",
           st->n_blocks_total);
    metric(out, "llmserve_kv_blocks_used", "gauge", "KV blocks held by sequences.",
           st->n_blocks_used);
    metric(out, "llmserve_kv_blocks_free", "gauge", "KV blocks on the free list (incl. cached).",
           st->n_blocks_free);
    metric(out, "llmserve_kv_blocks_cached", "gauge",
           "Free KV blocks that still hold a reusable prefix.", st->n_blocks_cached);
    metric(out, "llmserve_prefix_cache_hit_tokens_total", "counter",
           "Prompt tokens served from the prefix cache.", st->n_prefix_hit_tokens);
    metric(out, "llmserve_preemptions_total", "counter", "Sequences preempted.",
           st->n_preemptions);
    metric(out, "llmserve_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
           st->n_prompt_tokens);
    metric(out, "llmserve_generation_tokens_total", "counter", "Tokens generated.",
           st->n_generated_tokens);
    metric(out, "llmserve_sequences_submitted_total", "counter", "Sequences submitted.",
           st->n_requests);
    metric(out, "llmserve_sequences_finished_total", "counter", "Sequences finished.",
           st->n_finished);
    metric(out, "llmserve_steps_total", "counter", "Scheduler steps run.", st->n_steps);
    metric(out, "llmserve_draft_tokens_total", "counter",
           "Speculative decoding: draft tokens verified (--draft-n, --draft-model).", st->n_draft_tokens);
    metric(out, "llmserve_draft_accepted_tokens_total", "counter",
           "Speculative decoding: draft tokens accepted (the model gave the same token).",
           st->n_draft_accepted);
    metric(out, "llmserve_draft_kv_blocks_total", "gauge",
           "KV blocks of the draft model's pool (--draft-model; 0 without one).",
           st->n_draft_blocks_total);
    metric(out, "llmserve_draft_kv_blocks_used", "gauge",
           "Draft-model KV blocks held by sequences.", st->n_draft_blocks_used);
    metric(out, "llmserve_lora_slots", "gauge", "Adapter slots of the engine (--max-loras).",
           st->n_lora_slots);
    metric(out, "llmserve_lora_slots_used", "gauge", "Adapter slots holding an adapter.",
           st->n_lora_resident);
    metric(out, "llmserve_lora_slot_loads_total", "counter", "Adapters put into a slot.",
           st->n_lora_loads);
    metric(out, "llmserve_lora_slot_evictions_total", "counter",
           "Slot loads that replaced an unused resident adapter (LRU).", st->n_lora_evictions);
    metric(out, "llmserve_lora_slot_waits_total", "counter",
           "Admissions put off because every adapter slot was in use.", st->n_lora_waits);
    metric(out, "llmserve_lora_adapters", "gauge", "Adapters served by name.",
           sv->n_lora_adapters);
    metric(out, "llmserve_lora_loads_queued", "gauge",
           "Adapter loads (POST /v1/load_lora_adapter) waiting for the loader thread.",
           sv->n_lora_loads_queued);
    metric(out, "llmserve_lora_loads_running", "gauge", "Adapter loads in progress (0 or 1).",
           sv->n_lora_loads_running);
    metric(out, "llmserve_http_requests_total", "counter", "HTTP requests answered.",
           sv->n_http_requests);
    metric(out, "llmserve_http_errors_total", "counter", "HTTP responses with status >= 400.",
           sv->n_http_errors);
    metric(out, "llmserve_http_rejected_queue_full_total", "counter",
           "Requests refused with 429 because the queue was full.", sv->n_rejected_full);
    metric(out, "llmserve_http_disconnects_total", "counter",
           "Clients that disconnected before their response ended.", sv->n_disconnects);
    metric(out, "llmserve_http_open_streams", "gauge", "Streaming responses in progress.",
           sv->n_open_streams);
    metric(out, "llmserve_http_requests_in_progress", "gauge",
           "HTTP requests received and not yet completed (this one included).", sv->n_http_active);
    metric(out, "llmserve_http_read_timeouts_total", "counter",
           "Connections closed because a request was not received in full within "
           "--read-timeout.", sv->n_read_timeouts);
    if (st->n_ranks > 1) rank_metrics(out, st);  // one process: as before TP existed
    histogram(out, "llmserve_time_to_first_token_seconds", "Submit to first token.", &st->ttft,
              bucket_ms);
    histogram(out, "llmserve_inter_token_latency_seconds", "Time between tokens of a sequence.",
              &st->inter_token, bucket_ms);
    histogram(out, "llmserve_request_latency_seconds", "Submit to finish.", &st->latency,
              bucket_ms);
}

void metrics_live_read(struct metrics_live *l, struct metrics_server *out) {
    out->n_http_requests = atomic_load(&l->n_requests);
    out->n_http_errors = atomic_load(&l->n_errors);
    out->n_rejected_full = atomic_load(&l->n_full);
    out->n_disconnects = atomic_load(&l->n_disconnects);
    out->n_open_streams = atomic_load(&l->n_streams);
    out->n_http_active = atomic_load(&l->n_active);
    out->n_read_timeouts = atomic_load(&l->n_read_timeouts);
}
