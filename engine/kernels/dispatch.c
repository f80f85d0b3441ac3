/*
 * dispatch.c - CPUID detection and the table of chosen kernel paths.
 *
 * The table is filled once, at start-up, before any ctx exists; afterwards it
 * is only read, so no locking is needed.
 */
#include <stdatomic.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "engine/kernels/kernels.h"

static struct kern_dispatch kern_table = {
    .isa = "portable",
    .f16_to_f32 = kern_ref_f16_to_f32,
    .bf16_to_f32 = kern_ref_bf16_to_f32,
    .f32_to_f16 = kern_ref_f32_to_f16,
    .swiglu = kern_ref_swiglu,
    .dot_f32 = kern_ref_dot_f32,
    .dot_f16 = kern_ref_dot_f16,
    .dot_bf16 = kern_ref_dot_bf16,
    .isa_quant = KERN_ISA_PORTABLE,
    .vec_dot = {
        [QUANT_Q4_0] = kern_ref_vec_dot_q4_0,
        [QUANT_Q4_1] = kern_ref_vec_dot_q4_1,
        [QUANT_Q5_0] = kern_ref_vec_dot_q5_0,
        [QUANT_Q5_1] = kern_ref_vec_dot_q5_1,
        [QUANT_Q8_0] = kern_ref_vec_dot_q8_0,
        [QUANT_Q2_K] = kern_ref_vec_dot_q2_K,
        [QUANT_Q3_K] = kern_ref_vec_dot_q3_K,
        [QUANT_Q4_K] = kern_ref_vec_dot_q4_K,
        [QUANT_Q5_K] = kern_ref_vec_dot_q5_K,
        [QUANT_Q6_K] = kern_ref_vec_dot_q6_K,
    },
    .isa_panel = KERN_ISA_PORTABLE,
    .panel = {kern_panel_ref_f32, kern_panel_ref_f16, kern_panel_ref_bf16},
    .isa_qpanel = KERN_ISA_PORTABLE,
    .qpanel = {
        [QUANT_Q8_0] = kern_qpanel_ref_q8_0,
        [QUANT_Q4_0] = kern_qpanel_ref_q4_0,
        [QUANT_Q4_K] = kern_qpanel_ref_q4_K,
        [QUANT_Q6_K] = kern_qpanel_ref_q6_K,
        [QUANT_Q5_0] = kern_qpanel_ref_q5_0,
        [QUANT_Q4_1] = kern_qpanel_ref_q4_1,
        [QUANT_Q5_1] = kern_qpanel_ref_q5_1,
        [QUANT_Q2_K] = kern_qpanel_ref_q2_K,
        [QUANT_Q3_K] = kern_qpanel_ref_q3_K,
        [QUANT_Q5_K] = kern_qpanel_ref_q5_K,
    },
    .qpanel_act = kern_qpanel_ref_act,
};

/* AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25), and Linux's
 * permission to use the tile data state, which a process must ask for
 * (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) before its first tile
 * instruction; it then holds for every thread. Asked once. */
static bool amx_usable(void) {
#if defined(__linux__) && defined(__x86_64__)
    static atomic_int state;  // 0 not asked, 1 usable, 2 not
    int s = atomic_load(&state);
    if (s == 0) {
        unsigned a, b, c, d;
        bool ok = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1);
        if (ok) {
            ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                         18 /* XFEATURE_XTILEDATA */) == 0;
        }
        s = ok ? 1 : 2;
        atomic_store(&state, s);
    }
    return s == 1;
#else
    return false;
#endif
}

/* F16C (CPUID leaf 1, ECX bit 29). Read from CPUID because clang before 15
 * does not know "f16c" in __builtin_cpu_supports (the fuzz build is clang). */
static bool has_f16c(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
#else
    return false;
#endif
}

enum kern_isa kern_isa_detect(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !has_f16c()) {
        return KERN_ISA_PORTABLE;
    }
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl")) {
        return KERN_ISA_AVX2;
    }
    if (!__builtin_cpu_supports("avx512vnni")) return KERN_ISA_AVX512;
    return amx_usable() ? KERN_ISA_AMX : KERN_ISA_VNNI;
}

void kern_spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();  // SSE2: every x86-64 has it
#endif
}

const char *kern_isa_name(enum kern_isa isa) {
    switch (isa) {
    case KERN_ISA_PORTABLE: return "portable";
    case KERN_ISA_AVX2: return "avx2";
    case KERN_ISA_AVX512: return "avx512";
    case KERN_ISA_VNNI: return "avx512-vnni";
    case KERN_ISA_AMX: return "amx";
    }
    return "unknown";
}

void kern_vec_dot_table(enum kern_isa isa, kern_vec_dot_fn out[QUANT_TYPE_COUNT]) {
    for (int t = 0; t < QUANT_TYPE_COUNT; t++) out[t] = NULL;
    out[QUANT_Q4_0] = kern_ref_vec_dot_q4_0;
    out[QUANT_Q4_1] = kern_ref_vec_dot_q4_1;
    out[QUANT_Q5_0] = kern_ref_vec_dot_q5_0;
    out[QUANT_Q5_1] = kern_ref_vec_dot_q5_1;
    out[QUANT_Q8_0] = kern_ref_vec_dot_q8_0;
    out[QUANT_Q2_K] = kern_ref_vec_dot_q2_K;
    out[QUANT_Q3_K] = kern_ref_vec_dot_q3_K;
    out[QUANT_Q4_K] = kern_ref_vec_dot_q4_K;
    out[QUANT_Q5_K] = kern_ref_vec_dot_q5_K;
    out[QUANT_Q6_K] = kern_ref_vec_dot_q6_K;
    if (isa >= KERN_ISA_AVX2) {
        out[QUANT_Q4_0] = kern_avx2_vec_dot_q4_0;
        out[QUANT_Q4_1] = kern_avx2_vec_dot_q4_1;
        out[QUANT_Q5_0] = kern_avx2_vec_dot_q5_0;
        out[QUANT_Q5_1] = kern_avx2_vec_dot_q5_1;
        out[QUANT_Q8_0] = kern_avx2_vec_dot_q8_0;
        out[QUANT_Q4_K] = kern_avx2_vec_dot_q4_K;
        out[QUANT_Q6_K] = kern_avx2_vec_dot_q6_K;
    }
    if (isa >= KERN_ISA_AVX512) {
        out[QUANT_Q4_0] = kern_avx512_vec_dot_q4_0;
        out[QUANT_Q8_0] = kern_avx512_vec_dot_q8_0;
    }
    if (isa >= KERN_ISA_VNNI) {
        out[QUANT_Q4_0] = kern_vnni_vec_dot_q4_0;
        out[QUANT_Q8_0] = kern_vnni_vec_dot_q8_0;
    }
}

void kern_panel_table(enum kern_isa isa, struct kern_panel *out) {
    *out = (struct kern_panel){kern_panel_ref_f32, kern_panel_ref_f16, kern_panel_ref_bf16};
    if (isa >= KERN_ISA_AVX2) {
        *out = (struct kern_panel){kern_panel_avx2_f32, kern_panel_avx2_f16, kern_panel_avx2_bf16};
    }
    if (isa >= KERN_ISA_AVX512) {
        *out = (struct kern_panel){kern_panel_avx512_f32, kern_panel_avx512_f16,
                                   kern_panel_avx512_bf16};
    }
}

/* Every format's q-panel product of one level (the functions kernels.h
 * declares as kern_qpanel_<level>_<type>). */
#define QPANEL_LEVEL(out, level)                        \
    do {                                                \
        (out)[QUANT_Q8_0] = kern_qpanel_##level##_q8_0; \
        (out)[QUANT_Q4_0] = kern_qpanel_##level##_q4_0; \
        (out)[QUANT_Q4_K] = kern_qpanel_##level##_q4_K; \
        (out)[QUANT_Q6_K] = kern_qpanel_##level##_q6_K; \
        (out)[QUANT_Q5_0] = kern_qpanel_##level##_q5_0; \
        (out)[QUANT_Q4_1] = kern_qpanel_##level##_q4_1; \
        (out)[QUANT_Q5_1] = kern_qpanel_##level##_q5_1; \
        (out)[QUANT_Q2_K] = kern_qpanel_##level##_q2_K; \
        (out)[QUANT_Q3_K] = kern_qpanel_##level##_q3_K; \
        (out)[QUANT_Q5_K] = kern_qpanel_##level##_q5_K; \
    } while (0)

void kern_qpanel_table(enum kern_isa isa, kern_qpanel_fn out[QUANT_TYPE_COUNT]) {
    for (int t = 0; t < QUANT_TYPE_COUNT; t++) out[t] = NULL;
    QPANEL_LEVEL(out, ref);
    if (isa >= KERN_ISA_AVX2) QPANEL_LEVEL(out, avx2);
    if (isa >= KERN_ISA_AVX512) QPANEL_LEVEL(out, avx512);
    if (isa >= KERN_ISA_VNNI) QPANEL_LEVEL(out, vnni);
    if (isa >= KERN_ISA_AMX) {  // tiles for q8_0 and q4_0 only
        out[QUANT_Q8_0] = kern_qpanel_amx_q8_0;
        out[QUANT_Q4_0] = kern_qpanel_amx_q4_0;
    }
}

kern_qpanel_act_fn kern_qpanel_act_select(enum kern_isa isa) {
    if (isa >= KERN_ISA_AVX512) return kern_qpanel_avx512_act;
    if (isa >= KERN_ISA_AVX2) return kern_qpanel_avx2_act;
    return kern_qpanel_ref_act;
}

const struct kern_dispatch *kern_dispatch_init(bool force_portable) {
    struct kern_dispatch t = {
        .isa = "portable",
        .f16_to_f32 = kern_ref_f16_to_f32,
        .bf16_to_f32 = kern_ref_bf16_to_f32,
        .f32_to_f16 = kern_ref_f32_to_f16,
        .swiglu = kern_ref_swiglu,
        .dot_f32 = kern_ref_dot_f32,
        .dot_f16 = kern_ref_dot_f16,
        .dot_bf16 = kern_ref_dot_bf16,
    };
    __builtin_cpu_init();
    if (!force_portable && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        has_f16c()) {
        t.isa = __builtin_cpu_supports("avx512f") ? "avx2 (cpu has avx512)" : "avx2";
        t.f16_to_f32 = kern_avx2_f16_to_f32;
        t.bf16_to_f32 = kern_avx2_bf16_to_f32;
        t.f32_to_f16 = kern_avx2_f32_to_f16;
        t.swiglu = kern_avx2_swiglu;
        t.dot_f32 = kern_avx2_dot_f32;
        t.dot_f16 = kern_avx2_dot_f16;
        t.dot_bf16 = kern_avx2_dot_bf16;
    }
    t.isa_quant = force_portable ? KERN_ISA_PORTABLE : kern_isa_detect();
    kern_vec_dot_table(t.isa_quant, t.vec_dot);
    t.isa_panel = t.isa_quant;
    kern_panel_table(t.isa_panel, &t.panel);
    t.isa_qpanel = t.isa_quant;
    kern_qpanel_table(t.isa_qpanel, t.qpanel);
    t.qpanel_act = kern_qpanel_act_select(t.isa_qpanel);
    kern_table = t;
    atomic_thread_fence(memory_order_release);
    return &kern_table;
}

const struct kern_dispatch *kern_get(void) { return &kern_table; }
