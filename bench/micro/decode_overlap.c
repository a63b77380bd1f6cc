/* decode_overlap.c: how much of a decode step's arithmetic and its reads from DRAM one core can
 * overlap, with the cpu backend's call structure but none of its other work (a development
 * measurement behind bench/NOTES.md, twenty-fifth pass; not part of the build).
 *
 *   gcc -O3 -march=native [options] bench/micro/decode_overlap.c -o /tmp/decode_overlap
 *   /tmp/decode_overlap
 *
 * The KV of decode 16 x 4096 with 8 KV heads x 128 bf16 (HND, block size 16, each sequence's
 * blocks shuffled over two 128 MiB pools, 2 MiB pages advised), read in the backend's order: per
 * tile of 32 keys, one "call" per KV head over its 32 K rows, then one per KV head over its 32 V
 * rows. Every 32-byte load is split into its even and odd bf16 halves (a shift and an AND, as
 * the AVX2 kernels do) and feeds NF FMAs into 8 accumulators (8: the decode's useful flops at GQA
 * 4; 12: about the arithmetic the backend spends per byte). Each call prefetches the rows of the
 * call PFD calls ahead (every 64-byte line, PREFETCHT0), a row at a time, spread over the call as
 * the backend's kernels spread theirs. Options:
 *   -DNF=8|12     FMAs per 32-byte load (default 12)
 *   -DPFD=0..3    calls ahead that rows are prefetched (default 1; 0: none)
 *   -DHOTN=n      every table entry taken modulo n: n = 2 keeps the KV in L2 (arithmetic alone)
 *   -DCOLV        V calls walk their rows column by column (32 bytes of each of the 32 rows, then
 *                 the next 32 bytes), as the PV kernels do with their register-held chunks
 *   -DCOLSUB=k    with COLV: the same walk over sub-tiles of k rows at a time
 *   -DCOLPF       with COLV: the next V call prefetched line-major (line 0 of every row first)
 *   -DSOFT=n      n dependent FMAs on registers between a tile's K and V calls (a softmax pause)
 *   -DQMEM        the FMAs take their other operand from memory (a 2 KiB block per KV head, as
 *                 the QK kernels read the query rows from L1), not from registers
 * Prints the best time over 7 passes and the KV bytes over it.
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

#ifndef NF
#  define NF 12
#endif
#ifndef PFD
#  define PFD 1
#endif
#ifndef HOTN
#  define HOTN 0
#endif
#ifndef SOFT
#  define SOFT 0
#endif

enum { SEQS = 16, CTX = 4096, HEADS = 8, BS = 16, KT = 32, ROW = 256, RUN = BS * ROW };

/* every line of rows [a, b) of a call */
static inline void prefetch_rows(const char *const *rows, int a, int b)
{
    for (int i = a; i < b; i++)
        for (int l = 0; l < ROW; l += 64) _mm_prefetch(rows[i] + l, _MM_HINT_T0);
}

/* the work on one 32-byte load v: the even and odd bf16 halves, NF FMAs into 8 accumulators
 * (NF 12: 4 of them take two per load); with QMEM each of the 8 other operands is loaded once
 * per load of v and used for one or two FMAs (0.67 loads per FMA; the QK kernels: 0.625) */
#ifdef QMEM
#  define FMA2(w, a, x, b, y)                                                                        \
    do {                                                                                             \
        const __m256 w_ = (w);                                                                       \
        acc[a] = _mm256_fmadd_ps(w_, x, acc[a]);                                                     \
        if (NF >= 12) acc[b] = _mm256_fmadd_ps(w_, y, acc[b]);                                       \
    } while (0)
#  define WORK(v)                                                                                    \
    do {                                                                                             \
        __m256 e_ = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));                                   \
        __m256 o_ = _mm256_castsi256_ps(_mm256_and_si256(v, odd));                                   \
        const float *qj = qh + ((2 * j) & 511);                                                      \
        FMA2(_mm256_load_ps(qj), 0, e_, 1, o_);                                                      \
        FMA2(_mm256_load_ps(qj + 8), 1, o_, 0, e_);                                                  \
        FMA2(_mm256_load_ps(qj + 16), 2, e_, 3, o_);                                                 \
        FMA2(_mm256_load_ps(qj + 24), 3, o_, 2, e_);                                                 \
        acc[4] = _mm256_fmadd_ps(_mm256_load_ps(qj + 32), e_, acc[4]);                               \
        acc[5] = _mm256_fmadd_ps(_mm256_load_ps(qj + 40), o_, acc[5]);                               \
        acc[6] = _mm256_fmadd_ps(_mm256_load_ps(qj + 48), e_, acc[6]);                               \
        acc[7] = _mm256_fmadd_ps(_mm256_load_ps(qj + 56), o_, acc[7]);                               \
    } while (0)
#else
#  define WORK(v)                                                                                    \
    do {                                                                                             \
        __m256 e_ = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));                                   \
        __m256 o_ = _mm256_castsi256_ps(_mm256_and_si256(v, odd));                                   \
        for (int k = 0; k < 4; k++) {                                                                \
            acc[2 * k] = _mm256_fmadd_ps(q[2 * k], e_, acc[2 * k]);                                  \
            acc[2 * k + 1] = _mm256_fmadd_ps(q[2 * k + 1], o_, acc[2 * k + 1]);                      \
        }                                                                                            \
        if (NF >= 12)                                                                                \
            for (int k = 0; k < 2; k++) {                                                            \
                acc[2 * k] = _mm256_fmadd_ps(q[2 * k + 1], e_, acc[2 * k]);                          \
                acc[2 * k + 1] = _mm256_fmadd_ps(q[2 * k], o_, acc[2 * k + 1]);                      \
            }                                                                                        \
    } while (0)
#endif

int main(void)
{
    const int nblk = SEQS * CTX / BS;
    const size_t pool_bytes = (size_t)nblk * HEADS * RUN;
    char *pool[2];
    for (int k = 0; k < 2; k++) {
        pool[k] = mmap(NULL, pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (pool[k] == MAP_FAILED) return 1;
        madvise(pool[k], pool_bytes, MADV_HUGEPAGE);
        memset(pool[k], 1, pool_bytes);
    }
    int *table = malloc(sizeof(int) * (size_t)nblk);
    for (int i = 0; i < nblk; i++) table[i] = i;
    for (int i = nblk - 1; i > 0; i--) {
        int j = (int)(micro_next() % (uint64_t)(i + 1)), t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    if (HOTN)
        for (int i = 0; i < nblk; i++) table[i] %= HOTN > 0 ? HOTN : 1;
    /* the rows of every call in order, then PFD + 1 calls' worth repeating the last row */
    const long ncalls = (long)SEQS * (CTX / KT) * 2 * HEADS;
    const char **rows = malloc(sizeof(char *) * (size_t)(ncalls + PFD + 1) * KT);
    long n = 0;
    for (int s = 0; s < SEQS; s++)
        for (int t = 0; t < CTX / BS; t += KT / BS)
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < HEADS; h++)
                    for (int b = 0; b < KT / BS; b++)
                        for (int r = 0; r < BS; r++)
                            rows[n++] = pool[kv] + ((size_t)table[s * (CTX / BS) + t + b] * HEADS + h) * RUN + (size_t)r * ROW;
    for (long i = n; i < (ncalls + PFD + 1) * KT; i++) rows[i] = rows[n - 1];

    __m256 acc[8], q[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps(), q[i] = _mm256_set1_ps(0.001f * (float)(i + 1));
    const __m256i odd = _mm256_set1_epi32((int)0xffff0000u);
    float *qm = aligned_alloc(64, sizeof(float) * 512 * HEADS);
    for (int i = 0; i < 512 * HEADS; i++) qm[i] = 0.001f * (float)(i % 7 + 1);
    (void)qm;
    (void)q;
    __m256 pause = _mm256_set1_ps(1.0001f);
    double best = 1e30;
    for (int pass = 0; pass < 7; pass++) {
        double t0 = now();
        for (long c = 0; c < ncalls; c++) {
            const char *const *cr = rows + c * KT, *const *nr = rows + (c + PFD) * KT;
            const int v_call = (int)((c / HEADS) & 1);
            const float *qh = qm + (size_t)(c % HEADS) * 512;
            (void)qh;
            (void)v_call;
            (void)nr;
            if (SOFT && v_call && c % HEADS == 0) {
                __m256 x = pause;
                for (int i = 0; i < SOFT; i++) x = _mm256_fmadd_ps(x, x, pause);
                pause = _mm256_min_ps(x, _mm256_set1_ps(2.0f));
            }
#ifdef COLV
#  ifndef COLSUB
#    define COLSUB KT
#  endif
            if (v_call) {
                for (int r0 = 0; r0 < KT; r0 += COLSUB)
                    for (int j = 0; j < ROW; j += 32) {
#  ifdef COLPF
                        if (PFD && r0 == 0 && !(j & 63))
                            for (int r = 0; r < KT; r++) _mm_prefetch(nr[r] + j, _MM_HINT_T0);
#  else
                        if (PFD) prefetch_rows(nr, (r0 * ROW + j * COLSUB) / ROW, (r0 * ROW + (j + 32) * COLSUB) / ROW);
#  endif
                        for (int r = r0; r < r0 + COLSUB; r++) {
                            __m256i v = _mm256_load_si256((const __m256i *)(cr[r] + j));
                            WORK(v);
                        }
                    }
                continue;
            }
#endif
            for (int r = 0; r < KT; r++) {
                if (PFD) prefetch_rows(nr, r, r + 1);
                for (int j = 0; j < ROW; j += 32) {
                    __m256i v = _mm256_load_si256((const __m256i *)(cr[r] + j));
                    WORK(v);
                }
            }
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    __m256 s = pause;
    for (int i = 0; i < 8; i++) s = _mm256_add_ps(s, acc[i]);
    float f[8];
    _mm256_storeu_ps(f, s);
#ifdef COLV
    const int colv = 1;
#else
    const int colv = 0;
#endif
    printf("NF %d PFD %d HOTN %d COLV %d SOFT %d: %.2f ms, %.2f GB/s (checksum %g)\n", NF, PFD, HOTN, colv, SOFT,
           best * 1e3, 2.0 * (double)pool_bytes / best / 1e9, (double)f[0]);
    return 0;
}
