/*
 * membw.c - memory bandwidth of this machine, STREAM-triad style
 * (a[i] = b[i] + s * c[i] over arrays far larger than the caches), on N
 * threads. scripts/bench-engine uses it for the decode roofline.
 *
 * usage: membw [threads] [MiB per array]   prints "triad_gbps <best of 5>"
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <uv.h>

struct part {
    float *a;
    const float *b;
    const float *c;
    size_t n;
};

static void triad(void *arg) {
    struct part *p = arg;
    for (size_t i = 0; i < p->n; i++) p->a[i] = p->b[i] + 3.0f * p->c[i];
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int n_threads = argc > 1 ? atoi(argv[1]) : 1;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    if (n_threads < 1 || n_threads > 256 || mib < 1) {
        fprintf(stderr, "usage: membw [threads] [MiB per array]\n");
        return 2;
    }
    size_t n = mib * 1024 * 1024 / sizeof(float);
    float *a = malloc(n * sizeof(float));
    float *b = malloc(n * sizeof(float));
    float *c = malloc(n * sizeof(float));
    if (!a || !b || !c) {
        fprintf(stderr, "membw: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        a[i] = 0.0f;
        b[i] = 1.0f;
        c[i] = 2.0f;
    }
    struct part parts[256];
    uv_thread_t threads[256];
    size_t per = n / (size_t)n_threads;
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        for (int t = 0; t < n_threads; t++) {
            size_t off = per * (size_t)t;
            parts[t] = (struct part){a + off, b + off, c + off, t == n_threads - 1 ? n - off : per};
            uv_thread_create(&threads[t], triad, &parts[t]);
        }
        for (int t = 0; t < n_threads; t++) uv_thread_join(&threads[t]);
        double dt = now_s() - t0;
        double gbps = 3.0 * (double)n * sizeof(float) / dt / 1e9;
        if (gbps > best) best = gbps;
    }
    printf("triad_gbps %.2f\n", best);
    free(a);
    free(b);
    free(c);
    return 0;
}
