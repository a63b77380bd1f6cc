/* test_cpu_softmax_rows.c: a kernel table's whole-tile softmax step (cpu.h, softmax_rows) gives
 * the bits of the driver's row-by-row loop over the same table's row_max and exp_row, and
 * declines, having written nothing, what that loop treats apart (a NaN score, a row whose
 * maximum is +inf or -inf). The driver takes the kernel for some tiles and the loop for others
 * (a tile with a partly visible row, a row gone bad), so a difference in one bit between the two
 * would make a row's result depend on which tiles it met, and the determinism across thread
 * counts and batches would rest on luck. Random tiles: every row count up to CPU_ROWS around
 * the 16-row groups, widths 1..CPU_KT, masked (-inf) keys, and running maxima below, equal to
 * and above the tile's, or none yet (-inf). Each table that has the kernel and that this CPU
 * runs; skips where none does. */
#include "test.h"

#include "backends/cpu/cpu.h"
#include "test_cpu_tables.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint32_t rnd_u(uint32_t n)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32) % n;
}
static float rnd_f(float lo, float hi)
{
    return lo + (hi - lo) * (float)rnd_u(1u << 24) / (float)(1u << 24);
}

#define LDS CPU_KT
#define SENT 12345.678f /* past a row's nc keys: must stay */

typedef struct {
    float s[CPU_ROWS * LDS], m[CPU_ROWS], l[CPU_ROWS], alpha[CPU_ROWS];
} tile;

/* The driver's loop (cpu_attn.c, run_item) for rows that all see every key and are not bad. */
static void loop_step(const pa__cpu_kernels *K, tile *t, int nr, int nc)
{
    for (int r = 0; r < nr; r++) {
        float *s = t->s + r * LDS;
        float mx = K->row_max(s, nc);
        float mn = mx > t->m[r] ? mx : t->m[r];
        float al = t->m[r] == mn ? 1.0f : (t->m[r] == -INFINITY ? 0.0f : expf(t->m[r] - mn));
        float sum = K->exp_row(s, nc, mn);
        t->l[r] = t->l[r] * al + sum;
        t->m[r] = mn;
        t->alpha[r] = al;
    }
}

static void make_tile(tile *t, int nr, int nc)
{
    for (int i = 0; i < CPU_ROWS * LDS; i++) t->s[i] = SENT;
    for (int r = 0; r < nr; r++) {
        float *s = t->s + r * LDS;
        const float spread = rnd_u(2) ? 4.0f : 40.0f;
        float mx = -INFINITY;
        for (int c = 0; c < nc; c++) {
            s[c] = rnd_u(8) == 0 ? -INFINITY : rnd_f(-spread, spread);
            if (s[c] > mx) mx = s[c];
        }
        if (mx == -INFINITY) s[rnd_u((uint32_t)nc)] = mx = rnd_f(-spread, spread); /* one key visible */
        if (rnd_u(6) == 0) s[rnd_u((uint32_t)nc)] = mx; /* ties */
        switch (rnd_u(4)) {
        case 0: t->m[r] = -INFINITY, t->l[r] = 0.0f; break;     /* the row's first tile */
        case 1: t->m[r] = mx, t->l[r] = rnd_f(0.5f, 30.0f); break; /* the same maximum */
        case 2: t->m[r] = mx + rnd_f(0.0f, 50.0f), t->l[r] = rnd_f(0.5f, 30.0f); break;
        default: t->m[r] = mx - rnd_f(0.0f, 50.0f), t->l[r] = rnd_f(0.5f, 30.0f); break;
        }
        if (rnd_u(9) == 0) t->m[r] = 0.0f, s[rnd_u((uint32_t)nc)] = -0.0f; /* signed zeros */
    }
    for (int r = 0; r < CPU_ROWS; r++) t->alpha[r] = NAN;
}

static int row_count(void)
{
    static const int edge[] = {1, 2, 4, 8, 15, 16, 17, 31, 32, 33, 48, 64, 96, 127, CPU_ROWS};
    return rnd_u(2) ? edge[rnd_u(sizeof edge / sizeof edge[0])] : 1 + (int)rnd_u(CPU_ROWS);
}

static void check_table(const char *name, const pa__cpu_kernels *K)
{
    static tile a, b;
    int same = 0, declined = 0, diffs = 0, wrote = 0, took_odd = 0, narrow = 0;
    for (int it = 0; it < 3000; it++) {
        const int nr = row_count(), nc = rnd_u(3) ? (rnd_u(2) ? 32 : CPU_KT) : 1 + (int)rnd_u(CPU_KT);
        make_tile(&a, nr, nc);
        /* a tile the loop treats apart, every fourth time: NaN, +inf, or a row all -inf */
        const int odd = it % 4 == 3 ? 1 + (int)rnd_u(3) : 0;
        if (odd) {
            const int r = (int)rnd_u((uint32_t)nr);
            float *s = a.s + r * LDS;
            if (odd == 1) s[rnd_u((uint32_t)nc)] = NAN;
            else if (odd == 2) s[rnd_u((uint32_t)nc)] = INFINITY;
            else
                for (int c = 0; c < nc; c++) s[c] = -INFINITY;
        }
        b = a;
        const bool took = K->softmax_rows(b.s, LDS, nr, nc, b.m, b.l, b.alpha);
        if (odd) {
            took_odd += took;
            declined += !took;
            wrote += memcmp(&a, &b, sizeof a) != 0;
            continue;
        }
        if (!took) {
            /* a width the table does not take: nothing written; never a multiple of 16 */
            if (nc % 16 == 0) TEST_FAIL("%s: declined a plain tile (%d rows x %d keys)", name, nr, nc);
            wrote += memcmp(&a, &b, sizeof a) != 0;
            narrow++;
            continue;
        }
        loop_step(K, &a, nr, nc);
        if (memcmp(&a, &b, sizeof a)) {
            if (!diffs)
                for (int r = 0; r < nr; r++) {
                    if (memcmp(&a.l[r], &b.l[r], 4) || memcmp(&a.m[r], &b.m[r], 4) || memcmp(&a.alpha[r], &b.alpha[r], 4))
                        printf("%s: %d x %d row %d: l %.9g / %.9g m %.9g / %.9g alpha %.9g / %.9g\n", name, nr, nc, r,
                               a.l[r], b.l[r], a.m[r], b.m[r], a.alpha[r], b.alpha[r]);
                    for (int c = 0; c < LDS; c++)
                        if (memcmp(&a.s[r * LDS + c], &b.s[r * LDS + c], 4)) {
                            printf("%s: %d x %d row %d key %d: %.9g / %.9g\n", name, nr, nc, r, c, a.s[r * LDS + c],
                                   b.s[r * LDS + c]);
                            break;
                        }
                }
            diffs++;
        } else {
            same++;
        }
    }
    printf("%s: %d tiles the same bits, %d odd ones declined, %d of other widths declined\n", name, same, declined,
           narrow);
    CHECK(same > 1400);
    CHECK_INT(diffs, 0);
    CHECK_INT(took_odd, 0);
    CHECK_INT(wrote, 0);
    CHECK(declined > 500);
}

int main(void)
{
    /* (a strong reference into the library's backend list, so that the static link pulls in the
     * cpu backend's objects, and with them the kernels the weak names above refer to) */
    if (!pa_backend_find("cpu")) {
        printf("SKIP: the cpu backend is not built\n");
        return 77;
    }
    if (!pa__cpu_kernels_init_generic || !pa__cpu_detect || !pa__cpu_isa_usable) {
        printf("SKIP: this build has no x86 kernels\n");
        return 77;
    }
    pa__cpu_features f;
    pa__cpu_detect(&f);
    int tables = 0;
    pa__cpu_kernels k;
    if (pa__cpu_kernels_init_avx2 && pa__cpu_isa_usable(PA__ISA_AVX2, &f)) {
        pa__cpu_kernels_init_generic(&k);
        pa__cpu_kernels_init_avx2(&k);
        if (k.softmax_rows) check_table("avx2", &k), tables++;
    }
    if (pa__cpu_kernels_init_avx2 && pa__cpu_kernels_init_avx512 && pa__cpu_isa_usable(PA__ISA_AVX512, &f)) {
        pa__cpu_kernels_init_generic(&k);
        pa__cpu_kernels_init_avx2(&k);
        pa__cpu_kernels_init_avx512(&k, false, false);
        CHECK(k.softmax_rows != NULL);
        if (k.softmax_rows) check_table("avx512", &k), tables++;
    }
    if (!tables) {
        printf("SKIP: no kernel table with softmax_rows runs on this CPU\n");
        return 77;
    }
    return test_exit();
}
