/* page_reads.c: how fast one core reads 4 KiB pages in a shuffled order, as a decode over an HND
 * cache with block size 16 and 128 bf16 dims reads them (each block's rows of one KV head are
 * one 4 KiB page), under several software prefetch schemes (a development measurement behind
 * bench/NOTES.md, twenty-sixth pass; not part of the build).
 *
 *   gcc -O2 -mavx512f bench/micro/page_reads.c -o /tmp/page_reads && /tmp/page_reads
 *
 * 65536 pages (256 MiB) of a 1 GiB buffer (2 MiB pages advised), each read front to back with
 * 512-bit loads into one sum; best of 4 passes over different pages. Modes:
 *   0 no software prefetch (the hardware prefetchers alone)
 *   1 PREFETCHT0 of every line of the next page, two lines per two loads
 *   2 the same with PREFETCHT1, 3 with PREFETCHT2
 *   4 PREFETCHT0 of the first 4 lines of the page 2 ahead only (to start the L2 streamer)
 *   5, 6 the same for the page 4 and 8 ahead
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "micro.h"


#define PAGE 4096

int main(void)
{
    const size_t bytes = (size_t)1 << 30, n = bytes / PAGE;
    char *buf;
    if (posix_memalign((void **)&buf, (size_t)1 << 21, bytes)) return 1;
    madvise(buf, bytes, MADV_HUGEPAGE);
    memset(buf, 0x3f, bytes); /* floats near 0.75: no subnormal operand */
    uint32_t *perm = malloc(n * sizeof *perm);
    shuffled(perm, n);
    const int runs = 65536;
    for (int mode = 0; mode < 7; mode++) {
        double best = 1e9;
        __m512 acc = _mm512_setzero_ps();
        for (int rep = 0; rep < 4; rep++) {
            const size_t base = (size_t)rep * runs % (n - runs - 8);
            const double t0 = now();
            for (int c = 0; c < runs; c++) {
                const char *p = buf + (size_t)perm[base + c] * PAGE;
                const int dist = mode == 5 ? 4 : mode == 6 ? 8 : 2;
                const char *pn = buf + (size_t)perm[base + c + dist] * PAGE;
                const char *p1 = buf + (size_t)perm[base + c + 1] * PAGE;
                for (int l = 0; l < 64; l += 2) {
                    if (mode == 1) _mm_prefetch(p1 + l * 64, _MM_HINT_T0), _mm_prefetch(p1 + l * 64 + 64, _MM_HINT_T0);
                    if (mode == 2) _mm_prefetch(p1 + l * 64, _MM_HINT_T1), _mm_prefetch(p1 + l * 64 + 64, _MM_HINT_T1);
                    if (mode == 3) _mm_prefetch(p1 + l * 64, _MM_HINT_T2), _mm_prefetch(p1 + l * 64 + 64, _MM_HINT_T2);
                    if (mode >= 4 && l < 4) _mm_prefetch(pn + l * 64, _MM_HINT_T0), _mm_prefetch(pn + l * 64 + 64, _MM_HINT_T0);
                    acc = _mm512_add_ps(acc, _mm512_load_ps(p + l * 64));
                    acc = _mm512_add_ps(acc, _mm512_load_ps(p + l * 64 + 64));
                }
            }
            const double t = now() - t0;
            if (t < best) best = t;
        }
        float f[16];
        _mm512_storeu_ps(f, acc);
        printf("mode %d: %.2f GB/s (sum %g)\n", mode, (double)runs * PAGE / best / 1e9, (double)f[0]);
    }
    free(perm);
    free(buf);
    return 0;
}
