/* micro.h: pieces the micro-benchmarks share (page_reads.c, decode_reads.c, shapes.c, ...). */
#ifndef PAGEDATTN_BENCH_MICRO_H
#define PAGEDATTN_BENCH_MICRO_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

static inline double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* perm[0..n) = a fixed random permutation of 0..n-1 (xorshift64 from seed 7, Fisher-Yates) */
static inline void shuffled(uint32_t *perm, size_t n)
{
    for (size_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
    uint64_t x = 7;
    for (size_t i = n - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t j = x % (i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* xorshift64 from a fixed seed: the same inputs on every run */
static uint64_t micro_rng = 88172645463325252ull;
static inline uint64_t micro_next(void)
{
    micro_rng ^= micro_rng << 13;
    micro_rng ^= micro_rng >> 7;
    micro_rng ^= micro_rng << 17;
    return micro_rng;
}

#endif
