/* test_cpu_fp8_qk_bf16.c: the avx512bf16 path's decode QK of bf16 queries over fp8 key rows,
 * called directly, in each form this CPU runs: E4M3 by byte tables (qk_src_e4m3_bf16 where the
 * CPU has AVX512-VBMI: any row count, head sizes that are multiples of 16), E4M3 through f16
 * (the same entry without VBMI: 7 or 8 rows, multiples of 32; its NaN test and redo), and E5M2
 * by byte tables (qk_src_e5m2_bf16, VBMI; infinities). Two checks:
 *  - every one of the 256 codes: keys holding one code in every dim, a query of ones in one dim
 *    and zeros elsewhere, scale 1: the score is the code's value exactly (NaN for a NaN code,
 *    and for an infinite one, whose products with the zeros are NaN), for each dim of the head
 *    in turn (each byte's place in the interleaves);
 *  - random codes (NaN and infinities among them), random bf16 queries, 1 to 12 rows, 1 to 70
 *    keys, head sizes 16 to 256, with and without the prefetch list: each score against a
 *    double-precision sum (NaN where it is NaN, the same infinity where it is infinite, else
 *    within the fp32 rounding of the sums), and no score written outside the rows and keys
 *    asked for.
 * Skips where this build or this CPU has no avx512bf16 path. */
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

/* The value of code b, from the formats' definitions (OCP FP8: E4M3 bias 7, no infinities,
 * S.1111.111 NaN; E5M2 bias 15, IEEE-like). */
static double fp8v(bool e5, unsigned char b)
{
    const double sg = b & 0x80 ? -1.0 : 1.0;
    if (!e5) {
        if ((b & 0x7f) == 0x7f) return NAN;
        const int e = b >> 3 & 15, m = b & 7;
        return sg * (e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6));
    }
    const int e = b >> 2 & 31, m = b & 3;
    if (e == 31) return m ? NAN : sg * INFINITY;
    return sg * (e ? ldexp(1.0 + m / 4.0, e - 15) : ldexp(m / 4.0, -14));
}

/* whether b is one of the format's NaN or infinite codes */
static bool special(bool e5, unsigned char b)
{
    return e5 ? (b & 0x7c) == 0x7c : (b & 0x7f) == 0x7f;
}

static double bf16v(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

enum { NRMAX = 12, DMAX = 256, NCMAX = 70 };

typedef struct {
    const char *name;
    bool e5;
    void (*qk)(const void *const *krows, int nc, const uint16_t *q16, int nr, int dp, float scale, float *s, int lds,
               const pa__cpu_pf *pf);
    int rows, dims; /* what the driver gives it: rows from `rows` to 8, head sizes multiples of `dims` */
} form;

/* Scores of all rows and keys: s[r * NCMAX + c]. */
static void run(const form *f, unsigned char *const *krows, int nc, const uint16_t *q, int nr, int dp, float scale,
                float *s, bool pf)
{
    static char pfbuf[CPU_KT][DMAX];
    const void *pfrows[CPU_KT];
    for (int i = 0; i < CPU_KT; i++) pfrows[i] = pfbuf[i];
    const pa__cpu_pf list = {pfrows, nc < CPU_KT ? nc : CPU_KT, dp, true};
    for (int i = 0; i < NRMAX * NCMAX; i++) s[i] = -12345.0f; /* poison: every score must be written */
    f->qk((const void *const *)krows, nc, q, nr, dp, scale, s, NCMAX, pf ? &list : NULL);
}

/* got against want: NaN for NaN, the same infinity, else within tol */
static bool agrees(float got, double want, double tol)
{
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return (double)got == want;
    return fabs(got - want) <= tol;
}

int main(void)
{
    const int skip = test_cpu_avx512_skip();
    if (skip) return skip;
    pa__cpu_features feat;
    pa__cpu_detect(&feat);
    if (!pa__cpu_kernels_init_avx512bf16 || !pa__cpu_isa_usable(PA__ISA_AVX512BF16, &feat)) {
        printf("SKIP: this build or this CPU has no avx512bf16 path\n");
        return 77;
    }
    /* the forms this CPU runs: the tables need VBMI, the f16 route runs on any of them */
    form forms[3];
    int nf = 0;
    for (int v = feat.avx512vbmi ? 1 : 0; v >= 0; v--) {
        pa__cpu_kernels k;
        pa__cpu_kernels_init_generic(&k);
        pa__cpu_kernels_init_avx512(&k, false, false);
        pa__cpu_kernels_init_avx512bf16(&k, v != 0);
        CHECK(k.qk_src_e4m3_bf16 != NULL && k.qk_e4m3_bf16_rows >= 1 && k.qk_e4m3_bf16_rows <= 8 &&
              k.qk_e4m3_bf16_dims >= 16);
        CHECK((k.qk_src_e5m2_bf16 != NULL) == (v != 0));
        if (!k.qk_src_e4m3_bf16 || k.qk_e4m3_bf16_dims < 16) return test_exit();
        forms[nf++] = (form){v ? "E4M3 by byte tables (VBMI)" : "E4M3 through f16", false, k.qk_src_e4m3_bf16,
                             k.qk_e4m3_bf16_rows, k.qk_e4m3_bf16_dims};
        if (k.qk_src_e5m2_bf16) forms[nf++] = (form){"E5M2 by byte tables (VBMI)", true, k.qk_src_e5m2_bf16, 1, 16};
    }
    if (!feat.avx512vbmi) printf("note: no AVX512-VBMI here: the byte tables are not tested\n");

    unsigned char *kbuf = malloc((size_t)NCMAX * DMAX);
    unsigned char *krows[NCMAX];
    for (int c = 0; c < NCMAX; c++) krows[c] = kbuf + (size_t)c * DMAX;
    uint16_t *q = malloc(sizeof(uint16_t) * NRMAX * DMAX);
    float *s = malloc(sizeof(float) * NRMAX * NCMAX);
    long checks = 0, bad = 0;

    /* 1. every code, every dim: key c holds code 64 * blk + c in all dims (nc = 64 keys per call),
     * query row r is one at dim (j + r) % dp */
    for (int fi = 0; fi < nf; fi++) {
        const form *f = &forms[fi];
        const int dp = 2 * f->dims > 64 ? 2 * f->dims : 64 + f->dims; /* a whole step and a partial one */
        const int nr = 8;
        for (int blk = 0; blk < 4; blk++) {
            for (int c = 0; c < 64; c++) memset(krows[c], 64 * blk + c, (size_t)dp);
            for (int j = 0; j < dp; j += nr) {
                memset(q, 0, sizeof(uint16_t) * NRMAX * DMAX);
                for (int r = 0; r < nr; r++) q[(size_t)r * dp + (j + r) % dp] = 0x3f80; /* 1.0 */
                run(f, krows, 64, q, nr, dp, 1.0f, s, false);
                for (int r = 0; r < nr; r++)
                    for (int c = 0; c < 64; c++) {
                        const double v = fp8v(f->e5, (unsigned char)(64 * blk + c));
                        const double want = isinf(v) ? NAN : v; /* (inf times the query's zeros) */
                        const float got = s[r * NCMAX + c];
                        checks++;
                        if (!agrees(got, want, 0.0) && bad++ < 10)
                            printf("FAIL %s: code 0x%02x dim %d row %d: score %.9g, want %.9g\n", f->name,
                                   64 * blk + c, (j + r) % dp, r, got, want);
                    }
            }
        }
    }

    /* 2. random codes and queries against double sums */
    static const int dps[] = {16, 32, 48, 64, 80, 96, 112, 128, 192, 256};
    int cases = 0;
    for (int it = 0; it < 900; it++) {
        const form *f = &forms[it % nf];
        const int dp = dps[next_u32() % (sizeof dps / sizeof dps[0])];
        if (dp % f->dims) continue;
        const int nr = 1 + (int)(next_u32() % NRMAX);
        const int nc = it % 5 == 0 ? 64 : 1 + (int)(next_u32() % NCMAX);
        const bool sp = next_u32() % 3 == 0, pf = it % 2 == 0;
        const float scale = it % 4 == 0 ? 1.0f : 0.0883883476f;
        for (int c = 0; c < nc; c++)
            for (int j = 0; j < dp; j++) {
                unsigned char b = (unsigned char)next_u32();
                /* mostly finite: a special code kept in a third of the cases, one time in 4 */
                if (special(f->e5, b) && !(sp && next_u32() % 4 == 0)) b &= 0xf7;
                krows[c][j] = b;
            }
        for (int i = nr * dp; i < NRMAX * DMAX; i++) q[i] = 0x7fc0; /* NaN past the rows: never read */
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < dp; j++) {
                /* bf16 of modest size, either sign, zero now and then */
                uint16_t h = (uint16_t)((next_u32() & 0x807f) | (0x3c00 + (next_u32() % 8) * 0x80));
                q[(size_t)r * dp + j] = next_u32() % 16 == 0 ? 0 : h;
            }
        cases++;
        run(f, krows, nc, q, nr, dp, scale, s, pf);
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < nc; c++) {
                double sum = 0, mag = 0;
                for (int j = 0; j < dp; j++) {
                    const double x = bf16v(q[(size_t)r * dp + j]) * fp8v(f->e5, krows[c][j]);
                    sum += x, mag += fabs(x);
                }
                const float got = s[r * NCMAX + c];
                const double want = scale * sum, tol = scale * mag * 0x1p-16; /* fp32 sums of <= 256 terms */
                checks++;
                if (!agrees(got, want, tol) && bad++ < 10)
                    printf("FAIL %s: dp %d nr %d nc %d row %d key %d: %.9g, want %.9g (tol %.3g)\n", f->name, dp, nr,
                           nc, r, c, got, want, tol);
            }
        /* nothing written past the rows and keys asked for */
        for (int r = 0; r < NRMAX; r++)
            for (int c = 0; c < NCMAX; c++)
                if ((r >= nr || c >= nc) && s[r * NCMAX + c] != -12345.0f) {
                    checks++;
                    if (bad++ < 10) printf("FAIL %s: wrote score (%d, %d) outside %d x %d\n", f->name, r, c, nr, nc);
                }
    }
    printf("%d forms, %d random cases, %ld checks, %ld failures\n", nf, cases, checks, bad);
    CHECK(bad == 0);
    CHECK(cases > 0);
    free(kbuf), free(q), free(s);
    return test_exit();
}
