/*
 * dispatch.c - CPUID detection and the table of chosen kernel paths.
 *
 * The table is filled once, at start-up, before any ctx exists; afterwards it
 * is only read, so no locking is needed.
 */
#include <stdatomic.h>

#include "engine/kernels/kernels.h"

static struct kern_dispatch kern_table = {
    .isa = "portable",
    .f16_to_f32 = kern_ref_f16_to_f32,
    .bf16_to_f32 = kern_ref_bf16_to_f32,
    .dot_f32 = kern_ref_dot_f32,
    .dot_f16 = kern_ref_dot_f16,
    .dot_bf16 = kern_ref_dot_bf16,
};

const struct kern_dispatch *kern_dispatch_init(bool force_portable) {
    struct kern_dispatch t = {
        .isa = "portable",
        .f16_to_f32 = kern_ref_f16_to_f32,
        .bf16_to_f32 = kern_ref_bf16_to_f32,
        .dot_f32 = kern_ref_dot_f32,
        .dot_f16 = kern_ref_dot_f16,
        .dot_bf16 = kern_ref_dot_bf16,
    };
    __builtin_cpu_init();
    if (!force_portable && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        t.isa = __builtin_cpu_supports("avx512f") ? "avx2 (cpu has avx512)" : "avx2";
        t.f16_to_f32 = kern_avx2_f16_to_f32;
        t.bf16_to_f32 = kern_avx2_bf16_to_f32;
        t.dot_f32 = kern_avx2_dot_f32;
        t.dot_f16 = kern_avx2_dot_f16;
        t.dot_bf16 = kern_avx2_dot_bf16;
    }
    kern_table = t;
    atomic_thread_fence(memory_order_release);
    return &kern_table;
}

const struct kern_dispatch *kern_get(void) { return &kern_table; }
