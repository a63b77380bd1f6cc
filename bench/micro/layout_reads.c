/* layout_reads.c: the memory side of a decode step alone, per cache layout and read order (a
 * development measurement behind bench/NOTES.md, fifteenth pass; not part of the build).
 *
 *   gcc -O2 -mavx2 bench/micro/layout_reads.c -o /tmp/layout_reads
 *   /tmp/layout_reads LAYOUT ORDER DIST [REPEATS]
 *
 * The KV of decode 16 x 4096 with 8 KV heads x 128 bf16 (256 MiB, block size 16, each
 * sequence's blocks shuffled over the pool) is read once per repeat, 256 bytes per row, with no
 * arithmetic but an XOR to keep the loads. LAYOUT: 0 HND ([block, head, token, dim]) or 1 NHD
 * ([block, token, head, dim]). ORDER, within each tile of 32 keys:
 *   0 head-major: K of head 0..7, then V of head 0..7 (the cpu backend's decode order);
 *   1 token-major: K of key 0 for heads 0..7, key 1, ..., then V the same way;
 *   2 head-major reads, with the prefetches (below) walking the token-major order;
 *   3 a token-major copy of the tile into a scratch in HND order, then head-major reads of it;
 *   4 head-major reads, prefetched twice: into L2 walking the token-major order DIST rows ahead
 *     (PREFETCHT1), and into L1 walking the read order 8 rows ahead (PREFETCHT0).
 * DIST: rows ahead of the read that each row's lines are software-prefetched (0: none; order 3
 * takes none). Printed: the best time over the repeats and the KV bytes over it.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { SEQS = 16, CTX = 4096, HEADS = 8, ROW = 128 * 2, BS = 16, KT = 32 };

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *pool[2]; /* K, V */
static int32_t *table;
static int nhd;

static const char *row_at(int kv, int s, int j, int h)
{
    const int64_t b = table[s * (CTX / BS) + j / BS], t = j % BS;
    const int64_t off = nhd ? t * HEADS + h : (int64_t)h * BS + t;
    return pool[kv] + (b * BS * HEADS + off) * ROW;
}

static __m256i sink;

static inline void read_row(const char *p)
{
    __m256i y = _mm256_loadu_si256((const __m256i *)p);
    for (int i = 32; i < ROW; i += 32) y = _mm256_xor_si256(y, _mm256_loadu_si256((const __m256i *)(p + i)));
    sink = _mm256_add_epi32(sink, y);
}

/* Every row of the step in the given order (0 head-major, else token-major) into list. */
static size_t walk(int token_major, const char **list)
{
    size_t n = 0;
    for (int s = 0; s < SEQS; s++)
        for (int j0 = 0; j0 < CTX; j0 += KT)
            for (int kv = 0; kv < 2; kv++)
                for (int a = 0; a < (token_major ? KT : HEADS); a++)
                    for (int b = 0; b < (token_major ? HEADS : KT); b++)
                        list[n++] = token_major ? row_at(kv, s, j0 + a, b) : row_at(kv, s, j0 + b, a);
    return n;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s LAYOUT(0 HND, 1 NHD) ORDER(0-4) DIST [REPEATS]\n", argv[0]);
        return 2;
    }
    nhd = atoi(argv[1]);
    const int order = atoi(argv[2]), dist = atoi(argv[3]), reps = argc > 4 ? atoi(argv[4]) : 3;
    const size_t nblocks = (size_t)SEQS * (CTX / BS), bytes = nblocks * BS * HEADS * ROW;
    for (int kv = 0; kv < 2; kv++) {
        pool[kv] = aligned_alloc((size_t)2 << 20, bytes);
        if (!pool[kv]) return 1;
        madvise(pool[kv], bytes, MADV_HUGEPAGE);
        memset(pool[kv], kv + 1, bytes);
    }
    table = malloc(nblocks * sizeof *table);
    for (size_t i = 0; i < nblocks; i++) table[i] = (int32_t)i;
    uint64_t x = 7;
    for (size_t i = nblocks - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t j = (size_t)(x % (i + 1));
        int32_t t = table[i];
        table[i] = table[j], table[j] = t;
    }
    const size_t rows = (size_t)SEQS * CTX * HEADS * 2, pad = 4096;
    const char **reads = malloc((rows + pad) * sizeof *reads), **pf = reads;
    size_t n = walk(order == 1, reads);
    if (order == 2 || order == 4) {
        pf = malloc((rows + pad) * sizeof *pf);
        walk(1, pf);
    }
    for (size_t i = n; i < n + pad; i++) reads[i] = reads[n - 1], pf[i] = pf[n - 1];
    static char stage[2 * HEADS * KT * ROW] __attribute__((aligned(64)));
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        if (order == 3) {
            for (int s = 0; s < SEQS; s++)
                for (int j0 = 0; j0 < CTX; j0 += KT) {
                    for (int kv = 0; kv < 2; kv++)
                        for (int c = 0; c < KT; c++)
                            for (int h = 0; h < HEADS; h++) {
                                const char *src = row_at(kv, s, j0 + c, h);
                                char *dst = stage + ((size_t)(kv * HEADS + h) * KT + c) * ROW;
                                for (int i = 0; i < ROW; i += 32)
                                    _mm256_store_si256((__m256i *)(dst + i),
                                                       _mm256_loadu_si256((const __m256i *)(src + i)));
                            }
                    for (int i = 0; i < 2 * HEADS * KT; i++) read_row(stage + (size_t)i * ROW);
                }
        } else {
            for (size_t i = 0; i < n; i++) {
                read_row(reads[i]);
                if (order == 4) {
                    for (int l = 0; l < ROW; l += 64) __builtin_prefetch(pf[i + dist] + l, 0, 2);
                    for (int l = 0; l < ROW; l += 64) __builtin_prefetch(reads[i + 8] + l, 0, 3);
                } else if (dist) {
                    for (int l = 0; l < ROW; l += 64) __builtin_prefetch(pf[i + dist] + l, 0, 3);
                }
            }
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    int lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, sink);
    printf("%s order %d dist %d: %.2f ms, %.2f GB/s of KV%s\n", nhd ? "NHD" : "HND", order, dist, best * 1e3,
           2.0 * (double)bytes / best * 1e-9, lanes[0] == 12345 ? " " : "");
    return 0;
}
