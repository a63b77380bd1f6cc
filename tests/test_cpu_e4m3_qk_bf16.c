/* test_cpu_e4m3_qk_bf16.c: the avx512bf16 path's decode QK of bf16 queries over E4M3 key rows
 * (qk_src_e4m3_bf16), called directly, in both of its forms: the byte tables of CPUs with
 * AVX512-VBMI (any row count, head sizes that are multiples of 16) and the conversion through f16
 * of those without (7 or 8 rows, multiples of 32; its NaN test and redo). Two checks:
 *  - every one of the 256 codes: keys holding one code in every dim, a query of ones in one dim
 *    and zeros elsewhere, scale 1: the score is the code's value exactly (NaN for S.1111.111),
 *    for each dim of the head in turn (each byte's place in the interleaves);
 *  - random codes (NaN among them), random bf16 queries, 1 to 12 rows, 1 to 70 keys, head sizes
 *    16 to 256, with and without the prefetch list: each score against a double-precision sum,
 *    NaN exactly where the key holds a NaN code, else within the fp32 rounding of the sums, and
 *    no score written outside the rows and keys asked for.
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

/* The E4M3 value of b (NaN for S.1111.111), from the format's definition. */
static double e4m3(unsigned char b)
{
    if ((b & 0x7f) == 0x7f) return NAN;
    const int e = b >> 3 & 15, m = b & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return b & 0x80 ? -v : v;
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
    pa__cpu_kernels k;
    int rows, dims; /* what the driver gives it: rows from `rows` to 8, head sizes multiples of `dims` */
} form;

/* Scores of all rows and keys: s[r * NCMAX + c]. */
static void run(const form *f, unsigned char *const *krows, int nc, const uint16_t *q, int nr, int dp, float scale,
                float *s, bool pf)
{
    static char pfbuf[CPU_KT][DMAX];
    const void *pfrows[CPU_KT];
    for (int i = 0; i < CPU_KT; i++) pfrows[i] = pfbuf[i];
    const pa__cpu_pf list = {pfrows, nc < CPU_KT ? nc : CPU_KT, dp};
    for (int i = 0; i < NRMAX * NCMAX; i++) s[i] = -12345.0f; /* poison: every score must be written */
    f->k.qk_src_e4m3_bf16((const void *const *)krows, nc, q, nr, dp, scale, s, NCMAX, pf ? &list : NULL);
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
    /* the forms this CPU runs: the tables need VBMI, the f16 conversion runs on any of them */
    form forms[2];
    int nf = 0;
    for (int v = feat.avx512vbmi ? 1 : 0; v >= 0; v--) {
        form *f = &forms[nf++];
        f->name = v ? "byte tables (VBMI)" : "through f16";
        pa__cpu_kernels_init_generic(&f->k);
        pa__cpu_kernels_init_avx512(&f->k, false);
        pa__cpu_kernels_init_avx512bf16(&f->k, v != 0);
        f->rows = f->k.qk_e4m3_bf16_rows, f->dims = f->k.qk_e4m3_bf16_dims;
        CHECK(f->k.qk_src_e4m3_bf16 != NULL && f->rows >= 1 && f->rows <= 8 && f->dims >= 16);
        if (!f->k.qk_src_e4m3_bf16 || f->dims < 16) return test_exit();
    }
    if (!feat.avx512vbmi) printf("note: no AVX512-VBMI here: the byte tables are not tested\n");

    unsigned char *kbuf = malloc((size_t)NCMAX * DMAX);
    unsigned char *krows[NCMAX];
    for (int c = 0; c < NCMAX; c++) krows[c] = kbuf + (size_t)c * DMAX;
    uint16_t *q = malloc(sizeof(uint16_t) * NRMAX * DMAX);
    float *s = malloc(sizeof(float) * NRMAX * NCMAX), *s2 = malloc(sizeof(float) * NRMAX * NCMAX);
    long checks = 0, bad = 0;

    /* 1. every code, every dim: key c holds code 64 * blk + c in all dims (nc = 64 keys per call),
     * query row r is one at dim (j + r) % dp */
    for (int fi = 0; fi < nf; fi++) {
        const form *f = &forms[fi];
        const int dp = 2 * f->dims > 64 ? 2 * f->dims : 64 + f->dims; /* a whole step and a partial one */
        const int nr = 8;
        if (nr < f->rows) continue;
        for (int blk = 0; blk < 4; blk++) {
            for (int c = 0; c < 64; c++) memset(krows[c], 64 * blk + c, (size_t)dp);
            for (int j = 0; j < dp; j += nr) {
                memset(q, 0, sizeof(uint16_t) * NRMAX * DMAX);
                for (int r = 0; r < nr; r++) q[(size_t)r * dp + (j + r) % dp] = 0x3f80; /* 1.0 */
                run(f, krows, 64, q, nr, dp, 1.0f, s, false);
                for (int r = 0; r < nr; r++)
                    for (int c = 0; c < 64; c++) {
                        const double want = e4m3((unsigned char)(64 * blk + c));
                        const float got = s[r * NCMAX + c];
                        checks++;
                        if (isnan(want) ? !isnan(got) : got != (float)want) {
                            if (bad++ < 10)
                                printf("FAIL %s: code 0x%02x dim %d row %d: score %.9g, want %.9g\n", f->name,
                                       64 * blk + c, (j + r) % dp, r, got, want);
                        }
                    }
            }
        }
    }

    /* 2. random codes and queries against double sums */
    static const int dps[] = {16, 32, 48, 64, 80, 96, 112, 128, 192, 256};
    int cases = 0;
    for (int it = 0; it < 600; it++) {
        const int dp = dps[next_u32() % (sizeof dps / sizeof dps[0])];
        const int nr = 1 + (int)(next_u32() % NRMAX);
        const int nc = it % 5 == 0 ? 64 : 1 + (int)(next_u32() % NCMAX);
        const bool nan = it % 3 == 0, pf = it % 2 == 0;
        const float scale = it % 4 == 0 ? 1.0f : 0.0883883476f;
        for (int c = 0; c < nc; c++)
            for (int j = 0; j < dp; j++) {
                unsigned char b = (unsigned char)next_u32();
                if ((b & 0x7f) == 0x7f && !(nan && next_u32() % 4 == 0)) b &= 0xf7; /* mostly no NaN */
                krows[c][j] = b;
            }
        for (int i = nr * dp; i < NRMAX * DMAX; i++) q[i] = 0x7fc0; /* NaN past the rows: never read */
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < dp; j++) {
                /* bf16 of modest size, either sign, zero now and then */
                uint16_t h = (uint16_t)((next_u32() & 0x807f) | (0x3c00 + (next_u32() % 8) * 0x80));
                q[(size_t)r * dp + j] = next_u32() % 16 == 0 ? 0 : h;
            }
        float *out[2] = {s, s2};
        for (int fi = 0; fi < nf; fi++) {
            const form *f = &forms[fi];
            if (dp % f->dims) continue;
            cases++;
            run(f, krows, nc, q, nr, dp, scale, out[fi], pf);
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < nc; c++) {
                    double sum = 0, mag = 0;
                    bool isn = false;
                    for (int j = 0; j < dp; j++) {
                        const double kv = e4m3(krows[c][j]), qv = bf16v(q[(size_t)r * dp + j]);
                        if (isnan(kv)) isn = true;
                        else sum += qv * kv, mag += fabs(qv * kv);
                    }
                    const float got = out[fi][r * NCMAX + c];
                    const double want = scale * sum, tol = scale * mag * 0x1p-16 + 1e-30; /* fp32 sums of <= 256 terms */
                    checks++;
                    if (isn ? !isnan(got) : !(fabs(got - want) <= tol)) {
                        if (bad++ < 10)
                            printf("FAIL %s: dp %d nr %d nc %d row %d key %d: %.9g, want %.9g (tol %.3g)\n",
                                   f->name, dp, nr, nc, r, c, got, want, tol);
                    }
                }
            /* nothing written past the rows and keys asked for */
            for (int r = 0; r < NRMAX; r++)
                for (int c = 0; c < NCMAX; c++)
                    if ((r >= nr || c >= nc) && out[fi][r * NCMAX + c] != -12345.0f) {
                        checks++;
                        if (bad++ < 10) printf("FAIL %s: wrote score (%d, %d) outside %d x %d\n", f->name, r, c, nr, nc);
                    }
        }
    }
    printf("%d random cases, %ld checks, %ld failures\n", cases, checks, bad);
    CHECK(bad == 0);
    CHECK(cases > 0);
    free(kbuf), free(q), free(s), free(s2);
    return test_exit();
}
