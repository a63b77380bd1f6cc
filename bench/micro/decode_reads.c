/* decode_reads.c: how fast one core reads a bf16 HND KV cache in the order the cpu backend's
 * decode reads it, with nothing else to do (a development measurement behind bench/NOTES.md,
 * twenty-ninth pass; not part of the build).
 *
 *   gcc -O2 -mavx512f bench/micro/decode_reads.c -o /tmp/decode_reads && /tmp/decode_reads
 *
 * Two 1 GiB pools (K and V, 2 MiB pages advised) of 32 KiB blocks (block size 16 x 8 KV heads x
 * 128 dims x 2 bytes: each head's rows of a block are one 4 KiB piece); tiles of two blocks in a
 * shuffled order, 8192 blocks (512 MiB of K and V) per pass; the orders take turns, 5 passes
 * each (the host's memory speed drifts), best of each. Every line is
 * read by a 512-bit load into one sum. Orders:
 *   decode   per KV head, its 4 KiB of block A then of block B (one kernel call's 8 KiB), all
 *            heads' K, then all heads' V; the prefetches, where on, are the next call's lines,
 *            spread over the current call, as the backend issues them (CPU_DECODE_PF 1), or the
 *            call after next (distance 2)
 *   blocks   each block's 32 KiB of K front to back, then of V, in 8 KiB pieces
 *   1-block  tiles of one block: per head 4 KiB of K, then of V
 *   decode, next tile by block   the decode's order, the next tile's 128 KiB prefetched whole
 *            block after whole block, 8 KiB per call of this tile (T2 or T0)
 *   decode, next call T0 + T2 a tile (two tiles) ahead   the backend's prefetches and a second,
 *            far one into L2 of each call's lines a tile (two) later, at the call's start
 * A one-thread decode of 16 x 4096 bf16 that kept pace with its reads would take the bytes over
 * the best of these; bench's read probe (sequential, 2 MiB pages) sets the targets. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "micro.h"


#define BLK 32768
#define PIECE 4096

static __m512 acc;

/* reads bytes at p; prefetches pfb bytes at pf (if any) spread over the reads */
static void rd(const char *p, int bytes, const char *pf, int pfb, int hint)
{
    const int lines = bytes / 64, pl = pfb / 64;
    for (int l = 0; l < lines; l += 2) {
        if (pf)
            for (int x = l * pl / lines; x < (l + 2) * pl / lines; x++) {
                if (hint == 0) _mm_prefetch(pf + x * 64, _MM_HINT_T0);
                else _mm_prefetch(pf + x * 64, _MM_HINT_T2);
            }
        acc = _mm512_add_ps(acc, _mm512_load_ps(p + l * 64));
        acc = _mm512_add_ps(acc, _mm512_load_ps(p + l * 64 + 64));
    }
}

int main(void)
{
    const size_t bytes = (size_t)1 << 30, nb = bytes / BLK;
    char *K, *V;
    if (posix_memalign((void **)&K, (size_t)1 << 21, bytes) || posix_memalign((void **)&V, (size_t)1 << 21, bytes))
        return 1;
    madvise(K, bytes, MADV_HUGEPAGE);
    madvise(V, bytes, MADV_HUGEPAGE);
    memset(K, 0x3f, bytes);
    memset(V, 0x3f, bytes);
    uint32_t *perm = malloc(nb * sizeof *perm);
    shuffled(perm, nb);
    const int ntiles = 4096;
    static const char *names[] = {"decode, no prefetch", "decode, next call T0", "decode, call after next T0",
                                  "decode, next call T2", "blocks, next piece T0", "1-block, next call T0",
                                  "decode, next tile by block T2", "decode, next tile by block T0",
                                  "decode, next call T0 + T2 a tile ahead", "decode, next call T0 + T2 2 tiles ahead"};
    double best[10] = {1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9};
    for (int rep = 0; rep < 5; rep++)
        for (int mode = 0; mode < 10; mode++) {
            const size_t base = (size_t)rep * 2 * ntiles % (nb - 2 * ntiles - 8);
            const double t0 = now();
            for (int t = 0; t < ntiles; t++) {
                const size_t a = perm[base + 2 * t], b = perm[base + 2 * t + 1];
                const size_t na = perm[base + 2 * t + 2], nb2 = perm[base + 2 * t + 3];
                if (mode <= 3) {
                    /* the calls in order: K heads 0..7, V heads 0..7, then the next tile's */
                    const char *ca[17], *cb[17];
                    for (int h = 0; h < 8; h++) {
                        ca[h] = K + a * BLK + h * PIECE, cb[h] = K + b * BLK + h * PIECE;
                        ca[8 + h] = V + a * BLK + h * PIECE, cb[8 + h] = V + b * BLK + h * PIECE;
                    }
                    ca[16] = K + na * BLK, cb[16] = K + nb2 * BLK;
                    const int dist = mode == 2 ? 2 : 1, hint = mode == 3;
                    for (int c = 0; c < 16; c++) {
                        const int n = c + dist <= 16 ? c + dist : 16; /* (past the next tile's first: its first again) */
                        rd(ca[c], PIECE, mode ? ca[n] : NULL, PIECE, hint);
                        rd(cb[c], PIECE, mode ? cb[n] : NULL, PIECE, hint);
                    }
                } else if (mode >= 8) {
                    /* as "next call T0", and each call's lines a tile (or two) later by T2 */
                    const int far = mode == 8 ? 1 : 2;
                    const size_t fa = perm[base + 2 * (t + far)], fb = perm[base + 2 * (t + far) + 1];
                    const char *ca[17], *cb[17];
                    for (int h = 0; h < 8; h++) {
                        ca[h] = K + a * BLK + h * PIECE, cb[h] = K + b * BLK + h * PIECE;
                        ca[8 + h] = V + a * BLK + h * PIECE, cb[8 + h] = V + b * BLK + h * PIECE;
                    }
                    ca[16] = K + na * BLK, cb[16] = K + nb2 * BLK;
                    for (int c = 0; c < 16; c++) {
                        const char *fpa = (c < 8 ? K : V) + fa * BLK + (c % 8) * PIECE;
                        const char *fpb = (c < 8 ? K : V) + fb * BLK + (c % 8) * PIECE;
                        for (int x = 0; x < 64; x++) _mm_prefetch(fpa + x * 64, _MM_HINT_T2), _mm_prefetch(fpb + x * 64, _MM_HINT_T2);
                        rd(ca[c], PIECE, ca[c + 1], PIECE, 0);
                        rd(cb[c], PIECE, cb[c + 1], PIECE, 0);
                    }
                } else if (mode >= 6) {
                    /* demand in the decode's order; the next tile (64 KiB of K, then 64 of V) by
                     * whole blocks, 8 KiB per call of this tile */
                    const char *nx[4] = {K + na * BLK, K + nb2 * BLK, V + na * BLK, V + nb2 * BLK};
                    for (int c = 0; c < 16; c++) {
                        const char *pa = (c < 8 ? K : V) + a * BLK + (c % 8) * PIECE;
                        const char *pb = (c < 8 ? K : V) + b * BLK + (c % 8) * PIECE;
                        const char *q = nx[c / 4] + (c % 4) * 8192;
                        rd(pa, PIECE, q, PIECE, mode == 6);
                        rd(pb, PIECE, q + PIECE, PIECE, mode == 6);
                    }
                } else if (mode == 4) {
                    const char *seq[5] = {K + a * BLK, K + b * BLK, V + a * BLK, V + b * BLK, K + na * BLK};
                    for (int s = 0; s < 4; s++)
                        for (int c = 0; c < 4; c++) {
                            const char *p = seq[s] + c * 8192;
                            rd(p, 8192, c < 3 ? p + 8192 : seq[s + 1], 8192, 0);
                        }
                } else {
                    const char *blk[5] = {K + a * BLK, V + a * BLK, K + b * BLK, V + b * BLK, K + na * BLK};
                    for (int s = 0; s < 4; s++)
                        for (int h = 0; h < 8; h++) {
                            const char *p = blk[s] + h * PIECE;
                            rd(p, PIECE, h < 7 ? p + PIECE : blk[s + 1], PIECE, 0);
                        }
                }
            }
            const double dt = now() - t0;
            if (dt < best[mode]) best[mode] = dt;
        }
    float f[16];
    _mm512_storeu_ps(f, acc);
    for (int mode = 0; mode < 10; mode++)
        printf("%-28s %6.2f GB/s\n", names[mode], (double)ntiles * 4 * BLK / best[mode] / 1e9);
    printf("(sum %g)\n", (double)f[0]);
    free(perm);
    free(K);
    free(V);
    return 0;
}
