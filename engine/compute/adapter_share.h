/*
 * adapter_share.h - an adapter sent from rank 0 to every rank of a job
 * (tensor, pipeline or sequence parallelism), so that followers, which read
 * no adapter files, hold the same weights as rank 0.
 *
 * Rank 0 loads adapters as a single process does (engine/lora.h: any
 * thread, files checked there once). When its scheduler puts one into a
 * ctx slot (the step thread), engine.c broadcasts it with adapter_share()
 * and every rank, rank 0 too, cuts its own slice with adapter_cut()
 * (model/adapter.h). Followers thus need neither the file nor a shared file
 * system, and an adapter loaded at run time from --lora-dir is read once,
 * through the checked file descriptor, on rank 0 alone.
 *
 * On the wire (one broadcast each, in order): a header of int64 values; the
 * path; one record per projection and per bottleneck place (their shapes,
 * types and scales); then every matrix's bytes, in the layout of adapter.h.
 * Between the records and the bytes the ranks agree (comm_agree) that each
 * could allocate, so a follower out of memory fails the slot on every rank
 * instead of leaving the broadcasts out of step. What is sent is the whole
 * adapter as loaded: f32, f16 or bf16 matrices, a few MiB for common ranks.
 * Threads: the thread that runs the ctx's collectives (comm.h).
 */
#ifndef LLMSERVE_ADAPTER_SHARE_H
#define LLMSERVE_ADAPTER_SHARE_H

struct comm;
struct engine_adapter;
struct engine_model;

/* Collective over c. Rank 0 passes a (as loaded) and gets *out = a with one
 * more reference; every other rank passes NULL and gets *out, a copy with
 * one reference whose model is its own m (not cut yet). Returns 0, or
 * ERR_NOMEM on every rank when any rank could not allocate (*out NULL). */
int adapter_share(struct comm *c, const struct engine_model *m, struct engine_adapter *a,
                  struct engine_adapter **out);

#endif
