/* avx2_convert.c: what the conversion of 16-bit KV costs the decode kernels' inner loops, on
 * one core, with every operand in L1 (a development measurement behind bench/NOTES.md, eleventh
 * pass; not part of the build).
 *
 *   gcc -O3 -mavx2 -mfma bench/micro/avx2_convert.c -o /tmp/avx2_convert && /tmp/avx2_convert
 *
 * Each loop has the shape of cpu_avx2.c's decode loops (4 query rows of one GQA group, 12
 * accumulators): QK over 3 keys in 8-dim steps, PV over 32 keys in 24-dim chunks. They differ
 * only in how a V (or K) vector becomes fp32. Variants marked "op mix" put the right operations
 * in the loop but not the right dims in the lanes (a cost measurement, not a kernel). Printed:
 * GFLOP/s (2 per FMA lane) and the fraction of a register-only FMA loop run in the same process.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define DP 128
#define NK 32

static float q[4][DP] __attribute__((aligned(64)));
static float p[4][NK] __attribute__((aligned(64)));
static float o[4][DP] __attribute__((aligned(64)));
static float kf[NK][DP + 32] __attribute__((aligned(64)));
static uint16_t kb[NK][DP + 32] __attribute__((aligned(64)));
static float sink;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline __m256 zx_shift(const uint16_t *v)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)v)), 16));
}
static inline __m256 ld_shift(const uint16_t *v)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)v), 16));
}
static inline __m256 ld_and(const uint16_t *v)
{
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)v), _mm256_set1_epi32((int)0xffff0000u)));
}

/* 12 independent FMA chains, nothing else: the peak the loops below are held to */
__attribute__((noinline)) static double fma_peak(long n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
           a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-9f);
    double t0 = now();
    for (long i = 0; i < n; i++) {
        a0 = _mm256_fmadd_ps(x, y, a0), a1 = _mm256_fmadd_ps(x, y, a1), a2 = _mm256_fmadd_ps(x, y, a2);
        a3 = _mm256_fmadd_ps(x, y, a3), a4 = _mm256_fmadd_ps(x, y, a4), a5 = _mm256_fmadd_ps(x, y, a5);
        a6 = _mm256_fmadd_ps(x, y, a6), a7 = _mm256_fmadd_ps(x, y, a7), a8 = _mm256_fmadd_ps(x, y, a8);
        a9 = _mm256_fmadd_ps(x, y, a9), a10 = _mm256_fmadd_ps(x, y, a10), a11 = _mm256_fmadd_ps(x, y, a11);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                         "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
    }
    double t = now() - t0;
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    sink += _mm256_cvtss_f32(s);
    return (double)n * 12 * 16 / t / 1e9;
}

/* PV: 4 rows x 24 dims x NK keys per chunk, 5 chunks (120 of the 128 dims) */
#define PV_LOOP(NAME, CONV)                                                                          \
    __attribute__((noinline)) static void NAME(void)                                                \
    {                                                                                                \
        for (int j = 0; j + 24 <= DP; j += 24) {                                                     \
            __m256 acc[4][3];                                                                        \
            for (int h = 0; h < 4; h++)                                                              \
                for (int u = 0; u < 3; u++) acc[h][u] = _mm256_load_ps(&o[h][j + 8 * u]);            \
            for (int i = 0; i < NK; i++) {                                                           \
                const uint16_t *v = kb[i] + j;                                                       \
                const float *vf = kf[i] + j;                                                         \
                __m256 x[3];                                                                         \
                (void)v, (void)vf;                                                                   \
                CONV;                                                                                \
                for (int h = 0; h < 4; h++) {                                                        \
                    __m256 w = _mm256_broadcast_ss(&p[h][i]);                                        \
                    for (int u = 0; u < 3; u++) acc[h][u] = _mm256_fmadd_ps(w, x[u], acc[h][u]);     \
                }                                                                                    \
            }                                                                                        \
            for (int h = 0; h < 4; h++)                                                              \
                for (int u = 0; u < 3; u++) _mm256_store_ps(&o[h][j + 8 * u], acc[h][u]);            \
        }                                                                                            \
    }
PV_LOOP(pv_f32, x[0] = _mm256_loadu_ps(vf); x[1] = _mm256_loadu_ps(vf + 8); x[2] = _mm256_loadu_ps(vf + 16))
PV_LOOP(pv_zx3, x[0] = zx_shift(v); x[1] = zx_shift(v + 8); x[2] = zx_shift(v + 16))
PV_LOOP(pv_split_zx, x[0] = ld_shift(v); x[1] = ld_and(v); x[2] = zx_shift(v + 16))
PV_LOOP(pv_split_shift, x[0] = ld_shift(v); x[1] = ld_and(v); x[2] = ld_shift(v + 16))
PV_LOOP(pv_split_and, x[0] = ld_shift(v); x[1] = ld_and(v); x[2] = ld_and(v + 16))

/* QK: 4 rows x 3 keys over 8-dim steps, 21 key triples; the 12 sums stored without a reduction
 * tree (the kernel's epilogue is left out: this is the inner loop alone) */
#define QK_LOOP(NAME, CONV)                                                                          \
    __attribute__((noinline)) static void NAME(void)                                                \
    {                                                                                                \
        for (int c = 0; c + 3 <= NK; c += 3) {                                                       \
            __m256 a[4][3];                                                                          \
            for (int h = 0; h < 4; h++) a[h][0] = a[h][1] = a[h][2] = _mm256_setzero_ps();           \
            for (int j = 0; j < DP; j += 8) {                                                        \
                __m256 x[3];                                                                         \
                CONV;                                                                                \
                for (int h = 0; h < 4; h++) {                                                        \
                    __m256 w = _mm256_load_ps(&q[h][j]);                                             \
                    for (int u = 0; u < 3; u++) a[h][u] = _mm256_fmadd_ps(w, x[u], a[h][u]);         \
                }                                                                                    \
            }                                                                                        \
            for (int h = 0; h < 4; h++)                                                              \
                for (int u = 0; u < 3; u++) _mm256_store_ps(&o[h][8 * u], a[h][u]);                  \
        }                                                                                            \
    }
QK_LOOP(qk_f32, for (int u = 0; u < 3; u++) x[u] = _mm256_load_ps(kf[c + u] + j))
QK_LOOP(qk_zx, for (int u = 0; u < 3; u++) x[u] = zx_shift(kb[c + u] + j))

static double run(void (*f)(void), double flops, int reps)
{
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (int i = 0; i < reps; i++) f();
        double t = now() - t0;
        if (t < best) best = t;
    }
    return flops * reps / best / 1e9;
}

int main(void)
{
    for (int i = 0; i < NK; i++)
        for (int j = 0; j < DP + 32; j++) kf[i][j] = 1.0f, kb[i][j] = 0x3f80;
    for (int h = 0; h < 4; h++) {
        for (int i = 0; i < NK; i++) p[h][i] = 1e-7f;
        for (int j = 0; j < DP; j++) q[h][j] = 1e-3f;
    }
    const double pv_flops = 2.0 * 4 * 120 * NK, qk_flops = 2.0 * 4 * DP * (NK / 3 * 3);
    static const struct {
        const char *name;
        void (*f)(void);
        int pv;
    } v[] = {
        {"PV fp32 V (no conversion)", pv_f32, 1},
        {"PV bf16: zero-extend + shift x3", pv_zx3, 1},
        {"PV bf16: pair split + zero-extend (kernel)", pv_split_zx, 1},
        {"PV bf16: pair split + shift (op mix)", pv_split_shift, 1},
        {"PV bf16: pair split + AND (op mix)", pv_split_and, 1},
        {"QK fp32 K (no conversion)", qk_f32, 0},
        {"QK bf16: zero-extend + shift (kernel)", qk_zx, 0},
    };
    double peak = fma_peak(50000000);
    printf("register-only FMA loop: %.1f GFLOP/s\n", peak);
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        double g = run(v[k].f, v[k].pv ? pv_flops : qk_flops, 100000);
        printf("%-44s %6.1f GFLOP/s  %3.0f%%\n", v[k].name, g, 100.0 * g / peak);
    }
    return sink == 12345.0f;
}
