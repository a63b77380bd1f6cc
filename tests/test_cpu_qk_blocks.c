/* test_cpu_qk_blocks.c: the AVX-512 path's two prefill QK blockings (pa__cpu_kernels_init_avx512:
 * 12 rows x 16 keys on Zen 4, 8 rows x 32 keys elsewhere) give the same bits, and so do its two
 * prefill PV blockings (12 rows x 16 dims on Zen 4, 8 rows x 32 dims elsewhere). The case grid
 * runs only the one this machine's CPU gets, so here both tables are built directly and their qk_t
 * and pv run side by side over random tiles: every row count 1..CPU_ROWS that a tile can have,
 * tile widths across the 16-key boundaries, head sizes 16..256, and the prefetch list given or
 * not; for PV also alpha given or not, a column mask or none, and two probability strides.
 * Each score (each output) is the same FMAs in the same order in either blocking, so any
 * difference is a bug (a row or key left out, a block written over its neighbour, a partial chunk
 * summed twice). Skips where this build or this CPU has no AVX-512 path. */
#include "test.h"

#include "backends/cpu/cpu.h"
#include "test_cpu_tables.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x51eb851fu;
static float rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((int)(rng >> 40 & 0xffff) - 32768) / 8192.0f;
}

int main(void)
{
    const int skip = test_cpu_avx512_skip();
    if (skip) return skip;
    pa__cpu_kernels ka, kb;
    pa__cpu_kernels_init_generic(&ka);
    pa__cpu_kernels_init_generic(&kb);
    pa__cpu_kernels_init_avx512(&ka, true, false);
    pa__cpu_kernels_init_avx512(&kb, false, false);
    CHECK(ka.qk_t != NULL && kb.qk_t != NULL);
    if (!ka.qk_t || !kb.qk_t) return test_exit();
    CHECK(ka.qk_t != kb.qk_t); /* (two blockings: else this test compares a kernel with itself) */

    const int dmax = 256;
    float *q = aligned_alloc(64, sizeof(float) * CPU_ROWS * dmax);
    float *kt = aligned_alloc(64, sizeof(float) * CPU_KT * dmax);
    float *sa = aligned_alloc(64, sizeof(float) * CPU_ROWS * CPU_KT);
    float *sb = aligned_alloc(64, sizeof(float) * CPU_ROWS * CPU_KT);
    /* the prefetch list: rows of a buffer the kernels never read (prefetches alone) */
    static char pfbuf[CPU_KT][512];
    const void *pfrows[CPU_KT];
    for (int i = 0; i < CPU_KT; i++) pfrows[i] = pfbuf[i];
    const int dps[] = {16, 48, 64, 96, 128, 192, 256};
    int cases = 0, diffs = 0;
    for (int nr = 1; nr <= CPU_ROWS; nr += nr < 30 ? 1 : 7)
        for (int di = 0; di < (int)(sizeof dps / sizeof dps[0]); di++)
            for (int nc = 1; nc <= CPU_KT; nc += nc < 20 ? 3 : 11) {
                const int dp = dps[di];
                for (int i = 0; i < nr * dp; i++) q[i] = rnd();
                for (int i = 0; i < CPU_KT * dp; i++) kt[i] = rnd();
                /* the kernels write columns up to nc rounded up to 16 and nothing past them */
                for (int i = 0; i < CPU_ROWS * CPU_KT; i++) sa[i] = sb[i] = -7.0f;
                pa__cpu_pf pf = {pfrows, nc, 256, false};
                const pa__cpu_pf *pp = (nr + nc) % 2 ? &pf : NULL;
                ka.qk_t(q, nr, kt, nc, dp, sa, CPU_KT, pp);
                kb.qk_t(q, nr, kt, nc, dp, sb, CPU_KT, pp);
                cases++;
                if (memcmp(sa, sb, sizeof(float) * CPU_ROWS * CPU_KT)) {
                    if (diffs++ < 5) printf("nr %d dp %d nc %d: the two blockings differ\n", nr, dp, nc);
                    continue;
                }
                /* and the scores are scores: one spot check per case against a plain sum in the
                 * kernels' order (64-dim chunks, each summed from 0; exact equality is not
                 * promised across orders, so a tolerance) */
                const int r = nr / 2, c = nc / 2;
                double want = 0;
                for (int j = 0; j < dp; j++) want += (double)q[r * dp + j] * kt[j * CPU_KT + c];
                const double got = sa[r * CPU_KT + c], tol = 1e-4 * (1 + fabs(want));
                if (fabs(got - want) > tol) {
                    if (diffs++ < 5) printf("nr %d dp %d nc %d: s[%d][%d] = %g, want %g\n", nr, dp, nc, r, c, got, want);
                }
                const int n16 = (nc + 15) & ~15;
                for (int rr = 0; rr < CPU_ROWS; rr++)
                    for (int cc = 0; cc < CPU_KT; cc++)
                        if ((rr >= nr || cc >= n16) && sa[rr * CPU_KT + cc] != -7.0f && diffs++ < 5)
                            printf("nr %d dp %d nc %d: s[%d][%d] written\n", nr, dp, nc, rr, cc);
            }
    printf("qk_t: %d cases, %d differences\n", cases, diffs);
    CHECK(cases > 500);
    CHECK(diffs == 0);

    /* PV: O = alpha O + P V over a dense fp32 V tile (nc rows, dp apart) */
    CHECK(ka.pv != NULL && kb.pv != NULL && ka.pv != kb.pv);
    if (!ka.pv || !kb.pv) return test_exit();
    const int ldps[] = {CPU_KT, CPU_KT + 16};
    float *p = aligned_alloc(64, sizeof(float) * CPU_ROWS * (CPU_KT + 16));
    float *v = aligned_alloc(64, sizeof(float) * CPU_KT * dmax);
    float *o0 = aligned_alloc(64, sizeof(float) * CPU_ROWS * dmax);
    float *oa = aligned_alloc(64, sizeof(float) * (CPU_ROWS + 1) * dmax);
    float *ob = aligned_alloc(64, sizeof(float) * (CPU_ROWS + 1) * dmax);
    float alpha[CPU_ROWS];
    unsigned char colmask[CPU_KT];
    int pcases = 0, pdiffs = 0;
    for (int nr = 1; nr <= CPU_ROWS; nr += nr < 30 ? 1 : 7)
        for (int di = 0; di < (int)(sizeof dps / sizeof dps[0]); di++)
            for (int nc = 1; nc <= CPU_KT; nc += nc < 20 ? 3 : 11) {
                const int dp = dps[di], ldp = ldps[(nr + dp / 16) % 2];
                const bool masked = (nr + nc) % 3 == 0, scaled = (nr * 7 + nc) % 4 != 0;
                for (int i = 0; i < nr * ldp; i++) p[i] = rnd() * rnd() < 0 ? -0.0f : fabsf(rnd()) / 4;
                for (int i = 0; i < nc * dp; i++) v[i] = rnd();
                for (int i = 0; i < nr * dp; i++) o0[i] = rnd();
                for (int r = 0; r < nr; r++) alpha[r] = fabsf(rnd()) / 4;
                for (int c = 0; c < CPU_KT; c++) colmask[c] = (unsigned char)(c % 5 != 2);
                /* (a row past nr, poisoned: the kernels must not write it) */
                for (int i = 0; i < (CPU_ROWS + 1) * dp; i++) oa[i] = ob[i] = NAN;
                memcpy(oa, o0, sizeof(float) * nr * dp);
                memcpy(ob, o0, sizeof(float) * nr * dp);
                pa__cpu_pf pf = {pfrows, nc, 256, true};
                const pa__cpu_pf *pp = (nr + nc) % 2 ? &pf : NULL;
                ka.pv(p, ldp, nr, v, nc, dp, scaled ? alpha : NULL, masked ? colmask : NULL, oa, pp);
                kb.pv(p, ldp, nr, v, nc, dp, scaled ? alpha : NULL, masked ? colmask : NULL, ob, pp);
                pcases++;
                if (memcmp(oa, ob, sizeof(float) * nr * dp)) {
                    if (pdiffs++ < 5) printf("pv nr %d dp %d nc %d: the two blockings differ\n", nr, dp, nc);
                    continue;
                }
                for (int i = nr * dp; i < (nr + 1) * dp; i++)
                    if (!isnan(oa[i]) && pdiffs++ < 5) printf("pv nr %d dp %d nc %d: o[%d] written\n", nr, dp, nc, i);
                /* one spot check per case against a plain sum */
                const int r = nr / 2, j = dp - 1;
                double want = (double)o0[r * dp + j] * (scaled ? alpha[r] : 1.0f);
                for (int c = 0; c < nc; c++)
                    if (!masked || colmask[c]) want += (double)p[r * ldp + c] * v[c * dp + j];
                const double got = oa[r * dp + j], tol = 1e-4 * (1 + fabs(want));
                if (fabs(got - want) > tol && pdiffs++ < 5)
                    printf("pv nr %d dp %d nc %d: o[%d][%d] = %g, want %g\n", nr, dp, nc, r, j, got, want);
            }
    printf("pv: %d cases, %d differences\n", pcases, pdiffs);
    CHECK(pcases > 500);
    CHECK(pdiffs == 0);
    free(q), free(kt), free(sa), free(sb), free(p), free(v), free(o0), free(oa), free(ob);
    return test_exit();
}
