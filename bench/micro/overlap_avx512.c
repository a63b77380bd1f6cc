/* overlap_avx512.c: how much register-only arithmetic one AVX-512 core hides behind a decode's
 * reads, in the cpu backend's read order (a development measurement behind bench/NOTES.md,
 * thirty-fourth pass; not part of the build).
 *
 *   gcc -O3 -march=native [options] bench/micro/overlap_avx512.c -o /tmp/overlap_avx512
 *   taskset -c 0 /tmp/overlap_avx512
 *
 * The KV of decode 16 x 4096 with 8 KV heads x 128 bf16 (HND, block size 16: one 4 KiB page per
 * block and KV head), K and V each in its own 1 GiB pool (2 MiB pages advised), the blocks in a
 * shuffled order. Per tile of two blocks and per KV head, one "call" reads the head's two K pages,
 * the next its two V pages (256 calls per sequence, as the backend's 2-byte decode tiles of 32
 * keys). Every 64-byte line loaded feeds NF FMAs into 16 accumulators held in registers (nothing
 * else: no stores, no other loads); each call prefetches (PREFETCHT0, or PFH) the lines of the call D0
 * ahead, two per two lines it loads. Options:
 *   -DNF=n     FMAs per line (0: one add per line; default 24, ~6 ms of arithmetic on a Zen 5)
 *   -DHOT=n    every block index taken modulo n (n = 2: the KV stays in L2: the arithmetic alone)
 *   -DD0=n     prefetch distance in calls (default 1, 0: none)
 *   -DPFH=h    the prefetches' hint (default _MM_HINT_T0; _MM_HINT_T1: into L2)
 *   -DCOLV     V calls walk their rows in two passes of 128 bytes per 256-byte row (the bf16 PV
 *              kernels' 64-dim chunks) instead of front to back
 *   -DINORDER  the blocks in pool order (consecutive blocks adjacent in memory), not shuffled
 *   -DSCRATCH=m  the backend's per-call traffic beside the rows, over a scratch the size of its
 *              decode item's (queries, scores and outputs of 32 rows), by the bits of m (7: all):
 *              1, half the FMAs take their other operand from the call's 1 KiB of query lines;
 *              2, a K call stores 8 lines of scores; 4, a V call adds its accumulators into its
 *              head's 2 KiB of outputs (load, add, store)
 *   -DFLAT     the same addresses from one flat loop over the call's 64 line pairs with the page
 *              and line worked out per step (what COLV needs), instead of a loop per page
 *   -DEARLY=n  at the start of each call, also the first line of each page of the n calls after
 *              the prefetched one
 * Prints the best of 7 passes and the KV bytes over it. Check the HOT time of a variant before its
 * DRAM time: a first version of this loop (its FMAs behind a switch on a run-time count, the
 * accumulators in an array) was compiled by gcc 12 at -O2 with the accumulators in memory, a
 * store-to-load chain per FMA, ~7 cycles a line with the data in L1; any arithmetic then looked
 * as if it could not overlap the reads.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "micro.h"

#ifndef NF
#  define NF 24
#endif
#ifndef HOT
#  define HOT 0
#endif
#ifndef D0
#  define D0 1
#endif
#ifndef PFH
#  define PFH _MM_HINT_T0 /* -DPFH=_MM_HINT_T1: into L2 (the cpu backend's choice on Zen 4) */
#endif
#ifdef COLV
#  define FLAT 1
#  define WALK_V 1
#else
#  define WALK_V 0
#endif
#ifndef FLAT
#  define FLAT 0
#endif

#define PAGE 4096
#define HEADS 8
#define BLOCK (PAGE * HEADS)
#define NBLOCKS 4096 /* 16 sequences x 4096 keys / 16 */
#define NCALLS (NBLOCKS / 2 * HEADS * 2)

typedef struct {
    const char *page[2];
} call_pages;

#if defined SCRATCH && (SCRATCH & 1)
#  define OPERAND(j, line) (j & 2 ? _mm512_load_ps(qs + 16 * ((j + (line)) & 15)) : w0)
#else
#  define OPERAND(j, line) (j & 2 ? w1 : w0)
#endif
#define LINE_WORK(p, line)                                                                     \
    do {                                                                                       \
        const __m512 x_ = _mm512_load_ps((p) + (line) * 64), y_ = _mm512_load_ps((p) + (line) * 64 + 64); \
        if (NF == 0) {                                                                         \
            acc[0] = _mm512_add_ps(acc[0], x_);                                                \
            acc[1] = _mm512_add_ps(acc[1], y_);                                                \
        } else {                                                                               \
            _Pragma("GCC unroll 64") for (int j = 0; j < NF; j++) acc[j & 15] =                \
                _mm512_fmadd_ps(j & 1 ? y_ : x_, OPERAND(j, line), acc[j & 15]);                    \
        }                                                                                      \
    } while (0)

int main(void)
{
    const size_t bytes = (size_t)1 << 30, n = bytes / BLOCK;
    char *kpool, *vpool;
    if (posix_memalign((void **)&kpool, (size_t)1 << 21, bytes) || posix_memalign((void **)&vpool, (size_t)1 << 21, bytes))
        return 1;
    madvise(kpool, bytes, MADV_HUGEPAGE);
    madvise(vpool, bytes, MADV_HUGEPAGE);
    memset(kpool, 0x3f, bytes); /* floats near 0.75 */
    memset(vpool, 0x3f, bytes);
    uint32_t *perm = malloc(n * sizeof *perm);
    call_pages *calls = malloc(sizeof *calls * (NCALLS + 16));
    shuffled(perm, n);
#ifdef INORDER
    for (size_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
#endif
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    const __m512 w0 = _mm512_set1_ps(1.0001f), w1 = _mm512_set1_ps(0.9999f);
    (void)w1;
    double best = 1e9;
    static float scratch[40 * 1024 / 4] __attribute__((aligned(64))); /* q 8 KiB, scores 8, o 16, 8 more */
    for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++) scratch[i] = 1.0f;
    for (int pass = 0; pass < 7; pass++) {
        const size_t base = (size_t)pass * 3001 % (n - NBLOCKS - 4);
        int k = 0;
        for (int b = 0; b < NBLOCKS; b += 2) {
            const size_t b0 = perm[base + (HOT ? b % HOT : b)], b1 = perm[base + (HOT ? (b + 1) % HOT : b + 1)];
            for (int h = 0; h < HEADS; h++) {
                const size_t off = (size_t)h * PAGE;
                calls[k++] = (call_pages){{kpool + b0 * BLOCK + off, kpool + b1 * BLOCK + off}};
                calls[k++] = (call_pages){{vpool + b0 * BLOCK + off, vpool + b1 * BLOCK + off}};
            }
        }
        for (int e = 0; e < 16; e++) calls[k + e] = calls[k - 1]; /* the last calls prefetch themselves */
        const double t0 = now();
        for (int c = 0; c < NCALLS; c++) {
            const call_pages *cur = &calls[c], *next = &calls[c + D0];
#ifdef EARLY
            for (int e = 2; e <= 1 + EARLY; e++) {
                _mm_prefetch(calls[c + e].page[0], PFH);
                _mm_prefetch(calls[c + e].page[1], PFH);
            }
#endif
            const int head = c / 2 % HEADS;
            const float *qs = scratch + head * 256; /* 1 KiB of queries per head */
            (void)qs;
            if (!FLAT) {
                for (int pg = 0; pg < 2; pg++)
                    for (int l = 0; l < 64; l += 2) {
                        if (D0) {
                            _mm_prefetch(next->page[pg] + l * 64, PFH);
                            _mm_prefetch(next->page[pg] + l * 64 + 64, PFH);
                        }
                        LINE_WORK(cur->page[pg], l);
                    }
            } else {
                const int walk = WALK_V && (c & 1); /* odd calls are V calls */
                for (int s = 0; s < 64; s++) {
                    /* step s: pages and lines front to back, or (walk) chunk s / 32 of row s % 16
                     * of page s / 16 % 2 */
                    const int pg = walk ? s >> 4 & 1 : s >> 5, l = walk ? 4 * (s & 15) + 2 * (s >> 5) : 2 * (s & 31);
                    if (D0) {
                        _mm_prefetch(next->page[s >> 5] + 2 * (s & 31) * 64, PFH);
                        _mm_prefetch(next->page[s >> 5] + 2 * (s & 31) * 64 + 64, PFH);
                    }
                    LINE_WORK(cur->page[pg], l);
                }
            }
#ifdef SCRATCH
            if (!(c & 1) && (SCRATCH & 2)) { /* K call: 4 rows x 32 scores */
                float *sc = scratch + 2048 + head * 256;
                for (int i = 0; i < 8; i++) _mm512_store_ps(sc + 16 * i, acc[i]);
            } else if ((c & 1) && (SCRATCH & 4)) { /* V call: 4 rows x 128 outputs */
                float *o = scratch + 4096 + head * 512;
                for (int i = 0; i < 32; i++) _mm512_store_ps(o + 16 * i, _mm512_add_ps(_mm512_load_ps(o + 16 * i), acc[i & 15]));
            }
#endif
        }
        const double t = now() - t0;
        if (t < best) best = t;
    }
    __m512 s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, acc[i]);
    printf("NF %d HOT %d D0 %d COLV %d FLAT %d: %.2f ms, %.1f GB/s (checksum %g)\n", NF, HOT, D0, WALK_V, FLAT,
           best * 1e3, (double)NBLOCKS * BLOCK * 2 / best / 1e9, (double)_mm512_reduce_add_ps(s));
    free(calls);
    free(perm);
    free(kpool);
    free(vpool);
    return 0;
}
