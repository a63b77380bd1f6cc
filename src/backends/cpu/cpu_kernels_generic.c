/* cpu_kernels_generic.c: the portable kernel table (plain C, baseline flags). Every ISA file
 * overrides entries of this table; anything it leaves alone runs here. */
#include "cpu.h"

#include <string.h>

static void g_load_rows(pa_dtype dtype, const void *const *rows, int n, int d, int dp, float *dst)
{
    for (int i = 0; i < n; i++) {
        float *o = dst + (size_t)i * dp;
        const void *src = rows[i];
        switch (dtype) {
        case PA_DTYPE_F32: memcpy(o, src, (size_t)d * sizeof(float)); break;
        case PA_DTYPE_F16:
            for (int j = 0; j < d; j++) o[j] = pa_f16_to_f32(((const uint16_t *)src)[j]);
            break;
        case PA_DTYPE_BF16:
            for (int j = 0; j < d; j++) {
                uint32_t u = (uint32_t)((const uint16_t *)src)[j] << 16;
                memcpy(&o[j], &u, 4);
            }
            break;
        default:
            for (int j = 0; j < d; j++) o[j] = pa__load_f32(dtype, src, j);
            break;
        }
        for (int j = d; j < dp; j++) o[j] = 0.0f;
    }
}

static void g_qk(const float *q, int nr, const float *k, int nc, int dp, float *s, int lds)
{
    for (int r = 0; r < nr; r++) {
        const float *qr = q + (size_t)r * dp;
        for (int c = 0; c < nc; c++) {
            const float *kc = k + (size_t)c * dp;
            /* eight partial sums, added in a fixed tree: a fixed order on every run */
            float a[8] = {0};
            for (int j = 0; j < dp; j += 8)
                for (int u = 0; u < 8; u++) a[u] += qr[j + u] * kc[j + u];
            s[(size_t)r * lds + c] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        }
    }
}

static float g_row_max(const float *s, int n)
{
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isnan(s[i]) || s[i] > m) m = s[i]; /* once NaN, stays NaN */
    return m;
}

float pa__cpu_exp_row_generic(float *s, int n, float m)
{
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        float e = s[i] == -INFINITY ? -0.0f : expf(s[i] - m); /* masked: -0 (see cpu.h) */
        s[i] = e;
        sum += e;
    }
    return sum;
}

void pa__cpu_pv_masked(const float *p, int ldp, int nr, const float *v, int nc, int dp,
                       const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    for (int r = 0; r < nr; r++) {
        pf_share(pf, r, nr);
        float *orow = o + (size_t)r * dp;
        const float *pr = p + (size_t)r * ldp;
        float a = alpha[r];
        if (a != 1.0f)
            for (int j = 0; j < dp; j++) orow[j] *= a;
        for (int c = 0; c < nc; c++) {
            if (colmask && !colmask[c]) continue;
            float w = pr[c];
            if (pa__cpu_masked(w)) continue; /* never multiplied: its V may be NaN or inf */
            const float *vc = v + (size_t)c * dp;
            for (int j = 0; j < dp; j++) orow[j] += w * vc[j];
        }
    }
}

static void g_store_row(pa_dtype dtype, const float *src, int d, float mul, void *dst)
{
    for (int j = 0; j < d; j++) pa__store_f32(dtype, dst, j, src[j] * mul);
}

void pa__cpu_kernels_init_generic(pa__cpu_kernels *k)
{
    /* every optional entry NULL (and any added later: a table may live on the stack) */
    memset(k, 0, sizeof *k);
    k->name = "generic";
    k->decode_pf = CPU_DECODE_PF;
    k->load_rows = g_load_rows;
    k->qk = g_qk;
    k->row_max = g_row_max;
    k->exp_row = pa__cpu_exp_row_generic;
    k->pv = pa__cpu_pv_masked;
    k->store_row = g_store_row;
    k->pair_span = 16;
}
