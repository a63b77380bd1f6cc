/* test_cpu_fp8_lut.c: the AVX-512 decode QK and PV over fp8 rows by AVX512-VBMI byte tables
 * (cpu_avx512.c, f8l_cvt: pa__cpu_kernels_init_avx512's lut), called directly. Those kernels take
 * each 64 values in a permuted order (the query rows permuted alike, the PV sums put back in order
 * at the end of each chunk), so a wrong index in either permutation, a tail of 16, 32 or 48 dims
 * read as a whole step, or a row group written over its neighbour gives wrong numbers here. Every
 * byte of both formats occurs (NaN, E5M2 infinities, subnormals, zeros of both signs), query rows
 * 1..16 (the driver's groups of 4 and the rest), keys 1..CPU_KT at scattered rows, head sizes 16
 * to 512 (every step width), alpha given or not, a column mask or none whose hidden keys hold
 * NaN bytes. Each score and output is held to a double-precision sum over the formats' values
 * written out here: NaN exactly where that sum is NaN, the same infinity where it is one, else
 * within fp32 rounding; score columns past nc stay as they were, and NaN after the query rows
 * never gets in. Skips where this build or this
 * CPU has no AVX-512 path or no AVX512-VBMI. */
#include "test.h"

#include "backends/cpu/cpu.h"
#include "test_cpu_tables.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* the value of byte b in format dt (E4M3: S.1111.111 NaN; E5M2: exponent 31 infinity or NaN) */
static double fp8(pa_dtype dt, unsigned char b)
{
    double v;
    if (dt == PA_DTYPE_FP8_E4M3) {
        if ((b & 0x7f) == 0x7f) return NAN;
        const int e = b >> 3 & 15, m = b & 7;
        v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    } else {
        const int e = b >> 2 & 31, m = b & 3;
        if (e == 31) v = m ? NAN : INFINITY;
        else v = e ? ldexp(1.0 + m / 4.0, e - 15) : ldexp(m / 4.0, -14);
    }
    return b & 0x80 ? -v : v;
}

/* a byte of modest magnitude (below 2^3 in either format; subnormals and zeros included), or,
 * one time in `rare`, any byte at all */
static unsigned char byte(pa_dtype dt, unsigned rare)
{
    if (next_u32() % rare == 0) return (unsigned char)next_u32();
    const unsigned top = dt == PA_DTYPE_FP8_E4M3 ? 10 : 18; /* exponent fields 0..9 or 0..17 */
    const unsigned shift = dt == PA_DTYPE_FP8_E4M3 ? 3 : 2, mant = dt == PA_DTYPE_FP8_E4M3 ? 7 : 3;
    return (unsigned char)((next_u32() & (0x80 | mant)) | (next_u32() % top) << shift);
}

static bool close_to(double want, double mag, float got, double tol)
{
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return !isnan(got) && fabs((double)got - want) <= tol * mag + 1e-30;
}

enum { NRMAX = 16, DMAX = 512 };

int main(void)
{
    const int skip = test_cpu_avx512_skip();
    if (skip) return skip;
    pa__cpu_features f;
    pa__cpu_detect(&f);
    if (!f.avx512vbmi) {
        printf("SKIP: this CPU has no AVX512-VBMI (the byte tables' permutes)\n");
        return 77;
    }
    pa__cpu_kernels k, kf;
    pa__cpu_kernels_init_generic(&k);
    pa__cpu_kernels_init_generic(&kf);
    if (pa__cpu_kernels_init_avx2) pa__cpu_kernels_init_avx2(&k), pa__cpu_kernels_init_avx2(&kf);
    pa__cpu_kernels_init_avx512(&k, false, true);
    pa__cpu_kernels_init_avx512(&kf, false, false);
    /* (the tables' entries differ from the plain ones: else this test checks the f16 forms) */
    CHECK(k.qk_src != kf.qk_src && k.pv_src != kf.pv_src && !k.e4m3_bf16 && k.fp8_lut && !kf.fp8_lut);

    unsigned char *kv = malloc((size_t)CPU_KT * DMAX);
    float *q = aligned_alloc(64, sizeof(float) * NRMAX * DMAX), *s = malloc(sizeof(float) * NRMAX * CPU_KT);
    float *p = malloc(sizeof(float) * NRMAX * CPU_KT), *o = aligned_alloc(64, sizeof(float) * NRMAX * DMAX);
    float *o0 = malloc(sizeof(float) * NRMAX * DMAX), alpha[NRMAX];
    const void *rows[CPU_KT];
    unsigned char colmask[CPU_KT];
    const int dps[] = {16, 32, 48, 64, 80, 112, 128, 144, 208, 256, 512};
    const int ndp = (int)(sizeof dps / sizeof dps[0]);
    int cases = 0, bad = 0, nonfinite = 0, tails = 0;
    for (int it = 0; it < 2 * NRMAX * ndp * 4; it++) {
        const pa_dtype dt = it % 2 ? PA_DTYPE_FP8_E5M2 : PA_DTYPE_FP8_E4M3;
        const int nr = 1 + it / 2 % NRMAX, dp = dps[it / (2 * NRMAX) % ndp];
        const bool masked = it / (2 * NRMAX * ndp) % 2, scaled = it / (4 * NRMAX * ndp) % 2;
        const int nc = 1 + (int)(next_u32() % CPU_KT);
        /* rows at scattered offsets of one buffer (row i at (i * 37) % CPU_KT), as cache rows;
         * a rare byte (any code) one time in 4 cases in 200, else one in 20000 */
        const unsigned rare = it % 4 ? 20000 : 200;
        for (size_t i = 0; i < (size_t)CPU_KT * DMAX; i++) kv[i] = byte(dt, rare);
        for (int c = 0; c < nc; c++) rows[c] = kv + (size_t)(c * 37 % CPU_KT) * DMAX;
        for (int c = 0; c < nc; c++) colmask[c] = (unsigned char)(!masked || next_u32() % 4 != 0);
        if (masked) /* a hidden key's NaN must not reach an output */
            for (int c = 0; c < nc; c++)
                if (!colmask[c]) ((unsigned char *)rows[c])[next_u32() % (uint32_t)dp] = 0xff;
        /* (NaN after the rows: a kernel that reads a query past its row's dp dims fails) */
        for (int i = 0; i < NRMAX * DMAX; i++) q[i] = i < nr * dp ? (float)((int)(next_u32() % 2001) - 1000) / 256.0f : NAN;

        /* QK: S[r][c] = dot(Q[r], K[c]) for c < nc, the columns after untouched */
        for (int i = 0; i < NRMAX * CPU_KT; i++) s[i] = -7.0f;
        k.qk_src(dt, rows, nc, q, nr, dp, s, CPU_KT, NULL);
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < CPU_KT; c++) {
                const float got = s[r * CPU_KT + c];
                if (c >= nc) {
                    if (got != -7.0f && bad++ < 5)
                        TEST_FAIL("%s QK, %d rows x %d keys x %d dims: s[%d][%d] = %g written past nc", pa_dtype_name(dt),
                                  nr, nc, dp, r, c, got);
                    continue;
                }
                double want = 0.0, mag = 0.0;
                for (int j = 0; j < dp; j++) {
                    const double t = (double)q[r * dp + j] * fp8(dt, ((const unsigned char *)rows[c])[j]);
                    want += t, mag += fabs(t);
                }
                nonfinite += !isfinite(want);
                if (!close_to(want, mag, got, 1e-5) && bad++ < 5)
                    TEST_FAIL("%s QK, %d rows x %d keys x %d dims: s[%d][%d] = %.9g, want %.9g", pa_dtype_name(dt), nr,
                              nc, dp, r, c, got, want);
            }

        /* PV: O[r] = O[r] alpha[r] + sum over the listed keys of P[r][c] V[c] */
        for (int r = 0; r < nr; r++) {
            alpha[r] = (float)(next_u32() % 1000) / 1000.0f;
            for (int c = 0; c < nc; c++) p[r * CPU_KT + c] = (float)(next_u32() % 1001) / 1000.0f;
            for (int j = 0; j < dp; j++) o[r * dp + j] = o0[r * dp + j] = (float)(next_u32() % 2001) / 100.0f - 10.0f;
        }
        k.pv_src(dt, rows, nc, p, CPU_KT, nr, dp, scaled ? alpha : NULL, masked ? colmask : NULL, o, NULL);
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < dp; j++) {
                double want = (double)o0[r * dp + j] * (scaled ? alpha[r] : 1.0), mag = fabs(want);
                for (int c = 0; c < nc; c++) {
                    if (masked && !colmask[c]) continue;
                    const double t = (double)p[r * CPU_KT + c] * fp8(dt, ((const unsigned char *)rows[c])[j]);
                    want += t, mag += fabs(t);
                }
                nonfinite += !isfinite(want);
                const float got = o[r * dp + j];
                if (!close_to(want, mag, got, 1e-5) && bad++ < 5)
                    TEST_FAIL("%s PV, %d rows x %d keys x %d dims%s%s: o[%d][%d] = %.9g, want %.9g", pa_dtype_name(dt),
                              nr, nc, dp, masked ? ", masked" : "", scaled ? ", alpha" : "", r, j, got, want);
            }
        cases++;
        tails += dp % 64 != 0;
    }
    test__checks++;
    CHECK_INT(bad, 0);
    CHECK(nonfinite > 1000); /* (the rare bytes put NaN and infinities into many sums) */
    printf("%d cases (%d with a tail of 16-48 dims), %d non-finite sums\n", cases, tails, nonfinite);
    free(kv), free(q), free(s), free(p), free(o), free(o0);
    return test_exit();
}
