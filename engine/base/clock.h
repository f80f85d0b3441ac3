/*
 * clock.h - monotonic and wall clocks in nanoseconds. [any thread]
 */
#ifndef LLMSERVE_CLOCK_H
#define LLMSERVE_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in ns: for durations. */
int64_t clock_mono_ns(void);

/* CLOCK_REALTIME in ns since the epoch: for timestamps. */
int64_t clock_wall_ns(void);

#endif
