/*
 * roofline.c - this machine's compute ceilings, the figures the kernels'
 * shares are taken of: multiply-adds per second of the instruction each
 * kernel family is built on, on N threads at once.
 *
 *   int8  vnni512  vpdpbusd zmm (64 u8 x s8 MACs), the VNNI q-panels
 *   int8  avx512bw vpmaddubsw zmm + vpaddw (64), the AVX-512 q-panels
 *   int8  avx2     vpmaddubsw ymm + vpaddw (32), the AVX2 q-panels
 *   f32   avx512f  vfmadd zmm (16), the f32/f16 panels and attention
 *   f32   avx2     vfmadd ymm (8)
 *   bf16  avx512bf16 vdpbf16ps zmm (32), what a bf16 path could reach
 *
 * Each thread runs independent accumulator chains (enough to cover the
 * instruction's latency on two ports) on operands in registers: no memory
 * traffic, so this is the arithmetic ceiling. Each chain's product takes its
 * own accumulator as an operand (the u8 side for vpmaddubsw), so no product
 * is shared between chains or hoisted out of the loop. Only what this CPU has is
 * run (detected at run time, like the engine's dispatch). scripts/membw is
 * the bandwidth ceiling beside it.
 *
 * usage: roofline [threads] [seconds per figure]
 * prints one line per figure: "<kind> <isa> <threads> <GMAC/s>"
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <uv.h>

/* Keeps v in a register the compiler must assume changed: the loop-invariant
 * operand is not hoisted, and no instruction is emitted. */
#define OPAQUE(v) __asm__ volatile("" : "+v"(v))

typedef int64_t (*peak_fn)(int64_t iters, int seed);  // returns MACs done

/* N independent chains of STEP on T, their sum sunk at the end. */
#define CHAINS(N, T, INIT, STEP, REDUCE)                                   \
    T acc[N];                                                              \
    for (int c = 0; c < (N); c++) acc[c] = INIT;                           \
    for (int64_t i = 0; i < iters; i++) {                                  \
        OPAQUE(w);                                                         \
        for (int c = 0; c < (N); c++) acc[c] = STEP(acc[c]);               \
    }                                                                      \
    T s = acc[0];                                                          \
    for (int c = 1; c < (N); c++) s = REDUCE(s, acc[c]);                   \
    sink(&s, sizeof(s));
/* 16 chains of zmm (32 registers), 8 of ymm (16 registers: more spill). */
#define CHAINS_512(...) CHAINS(16, __VA_ARGS__)
#define CHAINS_256(...) CHAINS(8, __VA_ARGS__)

static volatile uint8_t g_sink;
static void sink(const void *p, size_t n) {
    const uint8_t *b = p;
    uint8_t x = 0;
    for (size_t i = 0; i < n; i++) x ^= b[i];
    g_sink ^= x;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static int64_t int8_vnni512(int64_t iters,
                                                                                 int seed) {
    __m512i w = _mm512_set1_epi8((char)(seed | 1)), x = _mm512_set1_epi8(3);
#define VNNI_STEP(a) _mm512_dpbusd_epi32((a), w, x)
    CHAINS_512(__m512i, _mm512_set1_epi32(seed), VNNI_STEP, _mm512_add_epi32)
    return iters * 16 * 64;
}

__attribute__((target("avx512f,avx512bw"))) static int64_t int8_avx512bw(int64_t iters, int seed) {
    __m512i w = _mm512_set1_epi8(3);
#define BW_STEP(a) _mm512_add_epi16((a), _mm512_maddubs_epi16((a), w))
    CHAINS_512(__m512i, _mm512_set1_epi16((short)seed), BW_STEP, _mm512_add_epi16)
    return iters * 16 * 64;
}

__attribute__((target("avx2"))) static int64_t int8_avx2(int64_t iters, int seed) {
    __m256i w = _mm256_set1_epi8(3);
#define AVX2_STEP(a) _mm256_add_epi16((a), _mm256_maddubs_epi16((a), w))
    CHAINS_256(__m256i, _mm256_set1_epi16((short)seed), AVX2_STEP, _mm256_add_epi16)
    return iters * 8 * 32;
}

__attribute__((target("avx512f"))) static int64_t f32_avx512(int64_t iters, int seed) {
    __m512 w = _mm512_set1_ps(0.999f), x = _mm512_set1_ps(1e-3f);
#define F512_STEP(a) _mm512_fmadd_ps((a), w, x)
    CHAINS_512(__m512, _mm512_set1_ps((float)seed), F512_STEP, _mm512_add_ps)
    return iters * 16 * 16;
}

__attribute__((target("avx2,fma"))) static int64_t f32_avx2(int64_t iters, int seed) {
    __m256 w = _mm256_set1_ps(0.999f), x = _mm256_set1_ps(1e-3f);
#define F256_STEP(a) _mm256_fmadd_ps((a), w, x)
    CHAINS_256(__m256, _mm256_set1_ps((float)seed), F256_STEP, _mm256_add_ps)
    return iters * 8 * 8;
}

__attribute__((target("avx512f,avx512bf16"))) static int64_t bf16_avx512(int64_t iters, int seed) {
    __m512bh w = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.999f), _mm512_set1_ps(0.999f));
    __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
#define BF16_STEP(a) _mm512_dpbf16_ps((a), w, x)
    CHAINS_512(__m512, _mm512_set1_ps((float)seed), BF16_STEP, _mm512_add_ps)
    return iters * 16 * 32;
}

enum need { NEED_AVX2, NEED_AVX512F, NEED_AVX512BW, NEED_VNNI, NEED_BF16 };

struct peak {
    const char *kind, *isa;
    enum need need;
    peak_fn fn;
};

static const struct peak peaks[] = {
    {"int8", "vnni512", NEED_VNNI, int8_vnni512},
    {"int8", "avx512bw", NEED_AVX512BW, int8_avx512bw},
    {"int8", "avx2", NEED_AVX2, int8_avx2},
    {"f32", "avx512f", NEED_AVX512F, f32_avx512},
    {"f32", "avx2", NEED_AVX2, f32_avx2},
    {"bf16", "avx512bf16", NEED_BF16, bf16_avx512},
};

static bool cpu_has(enum need n) {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool f512 = avx2 && __builtin_cpu_supports("avx512f");
    switch (n) {
    case NEED_AVX2: return avx2;
    case NEED_AVX512F: return f512;
    case NEED_AVX512BW: return f512 && __builtin_cpu_supports("avx512bw");
    case NEED_VNNI: return f512 && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vnni");
    case NEED_BF16: return f512 && __builtin_cpu_supports("avx512bf16");
    }
    return false;
}

struct job {
    peak_fn fn;
    int64_t iters, macs;
    int seed;
};

static void run_job(void *arg) {
    struct job *j = arg;
    j->macs = j->fn(j->iters, j->seed);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* GMAC/s of fn on n threads at once: best of 3 runs of about `seconds`. */
static double measure(peak_fn fn, int n_threads, double seconds) {
    double t0 = now_s();
    int64_t macs = fn(1 << 16, 1);
    double per_mac = (now_s() - t0) / (double)macs;
    int64_t iters = (int64_t)((double)(1 << 16) * seconds / ((double)macs * per_mac)) + 1;
    struct job jobs[256];
    uv_thread_t th[256];
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        t0 = now_s();
        for (int t = 0; t < n_threads; t++) {
            jobs[t] = (struct job){fn, iters, 0, t + rep + 2};
            uv_thread_create(&th[t], run_job, &jobs[t]);
        }
        int64_t total = 0;
        for (int t = 0; t < n_threads; t++) {
            uv_thread_join(&th[t]);
            total += jobs[t].macs;
        }
        double g = (double)total / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

int main(int argc, char **argv) {
    int n_threads = argc > 1 ? atoi(argv[1]) : 1;
    double seconds = argc > 2 ? atof(argv[2]) : 0.3;
    if (n_threads < 1 || n_threads > 256 || !(seconds > 0.0 && seconds < 60.0)) {
        fprintf(stderr, "usage: roofline [threads 1..256] [seconds per figure]\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof(peaks) / sizeof(peaks[0]); i++) {
        if (!cpu_has(peaks[i].need)) continue;
        printf("%s %s %d %.1f\n", peaks[i].kind, peaks[i].isa, n_threads,
               measure(peaks[i].fn, n_threads, seconds));
        fflush(stdout);
    }
    return 0;
}
