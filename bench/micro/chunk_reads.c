/* chunk_reads.c: how fast one core reads a pool in contiguous chunks taken in a shuffled order,
 * by chunk size and software prefetch (a development measurement behind bench/NOTES.md,
 * thirty-fifth pass; not part of the build).
 *
 *   gcc -O2 -mavx512f bench/micro/chunk_reads.c -o /tmp/chunk_reads && taskset -c 0 /tmp/chunk_reads
 *
 * A 1 GiB pool (2 MiB pages advised) read once per pass, 64 bytes a load, chunk after chunk in a
 * fixed shuffled order (as a paged cache's blocks lie), for chunks of 4 to 64 KiB (HND, bf16, d
 * 128, block 16: one KV head's rows of a block are 4 KiB, all 8 heads' 32 KiB), and the same pool
 * front to back for comparison. Prefetch: none; every line of the next chunk, one per line
 * loaded, as PREFETCHT0, PREFETCHT1 (into L2: on a Zen 4 ~1.7x T0's speed, bench/NOTES.md,
 * forty-eighth pass) or PREFETCHNTA. Prints GB/s, best of 3 passes.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define POOL (1ul << 30)

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { PF_NONE, PF_T0, PF_T1, PF_NTA };

/* one pass over the pool in chunks of cs bytes in the order ord (NULL: front to back) */
static double pass(const char *pool, size_t cs, const uint32_t *ord, int pf)
{
    const size_t n = POOL / cs, lines = cs / 64;
    __m512i acc = _mm512_setzero_si512();
    const double t0 = now_s();
    for (size_t c = 0; c < n; c++) {
        const char *p = pool + (ord ? ord[c] : c) * cs;
        const char *q = c + 1 < n ? pool + (ord ? ord[c + 1] : c + 1) * cs : p;
        for (size_t l = 0; l < lines; l++) {
            if (pf == PF_T0) _mm_prefetch(q + 64 * l, _MM_HINT_T0);
            else if (pf == PF_T1) _mm_prefetch(q + 64 * l, _MM_HINT_T1);
            else if (pf == PF_NTA) _mm_prefetch(q + 64 * l, _MM_HINT_NTA);
            acc = _mm512_add_epi32(acc, _mm512_load_si512(p + 64 * l));
        }
    }
    const double t = now_s() - t0;
    volatile int sink = _mm512_reduce_add_epi32(acc);
    (void)sink;
    return (double)POOL / t / 1e9;
}

int main(void)
{
    char *pool = aligned_alloc(1 << 21, POOL);
    uint32_t *ord = malloc((POOL / 4096) * sizeof *ord);
    if (!pool || !ord) return 1;
    madvise(pool, POOL, MADV_HUGEPAGE);
    memset(pool, 1, POOL);
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double g = pass(pool, 4096, NULL, PF_NONE);
        if (g > best) best = g;
    }
    printf("front to back, no prefetch: %.1f GB/s\n", best);
    static const char *const name[] = {"no prefetch", "PREFETCHT0 next chunk", "PREFETCHT1 next chunk",
                                       "PREFETCHNTA next chunk"};
    for (size_t cs = 4096; cs <= 65536; cs *= 2) {
        const size_t n = POOL / cs;
        for (size_t i = 0; i < n; i++) ord[i] = (uint32_t)i;
        uint64_t x = 0x9e3779b97f4a7c15u;
        for (size_t i = n - 1; i > 0; i--) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t j = (size_t)(x % (i + 1));
            uint32_t t = ord[i];
            ord[i] = ord[j], ord[j] = t;
        }
        printf("chunks of %2zu KiB, shuffled:", cs / 1024);
        for (int pf = PF_NONE; pf <= PF_NTA; pf++) {
            best = 0;
            for (int r = 0; r < 3; r++) {
                double g = pass(pool, cs, ord, pf);
                if (g > best) best = g;
            }
            printf("  %s %.1f", name[pf], best);
        }
        printf(" GB/s\n");
    }
    free(ord);
    free(pool);
    return 0;
}
