/* test_cpu_big_scale.c: a layer scale above 1 over query values near the top of fp32's range
 * scores as the contract's s = scale * dot(q, k) does, on every ISA path and fp8 form of the cpu
 * backend (an independent oracle found the fault; bench/NOTES.md, thirty-eighth pass).
 * The backend folds the scale (times k_scale over fp8 caches) into the query rows before the
 * dot products. With scale 4 a query element of 2^126 became 2^128 = inf, and the rows scored
 * inf * 0 = NaN (or +inf) where every logit is finite: NaN out and lse from finite inputs.
 *  - ZERO: dim 0 of the query 2^126, of every key 0; the logits are 4 k[1] (-3 to 3), over every
 *    cache dtype, f32 and bf16 queries;
 *  - BIG: dim 0 of key j t 2^-126 (t = j mod 4), so that q[0] k[0] = t counts: logits 4 (t +
 *    k[1]), over f32 and bf16 caches (the others do not hold 2^-126);
 *  - HUGE: fp8 caches with scale 2^64 and k_scale 2^64, whose product (the factor the query rows
 *    take) overflows fp32: q[0] 2^-126, q[1] 0, key codes t / 4 in dim 0: logits t. The first fix
 *    of this fault looped forever on it (the factor inf); before, the rows were NaN.
 * In a decode (one KV split, and several merged), a prompt and a chunked prefill; each path
 * against the reference (double precision), and the reference's last row against the closed
 * form of its lse. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "test_cpu_isa.h"
#include "internal.h" /* pa__store_f32: a value rounded once to the cache dtype */

#include <stdbool.h>
#include <stdlib.h>

enum { H = 8, HKV = 2, D = 64, BS = 16 };
#define QBIG 0x1p126f
#define SCALE 4.0f
#define HUGE_S 0x1p64f /* HUGE's scale and k_scale */

typedef enum { ZERO, BIG, HUGE } kind;

/* key j's K or V at (kv head kh, dim d), before the cache's dtype */
static float key_value(kind what, int64_t j, int kh, int d, bool value)
{
    if (value) return (float)((j * 3 + d + 5 * kh) % 11) * 0.125f - 0.5f;
    if (d == 0) return what == BIG ? (float)(j % 4) * 0x1p-126f : what == HUGE ? (float)((j + kh) % 4) * 0.25f : 0.0f;
    if (d == 1) return what == HUGE ? 0.5f : (float)((j + kh) % 7) * 0.25f - 0.75f;
    return 0.0f;
}

/* x as a cache of dtype dt holds it */
static double cached(pa_dtype dt, float x)
{
    unsigned char b[4];
    pa__store_f32(dt, b, 0, x);
    return pa__load_f32(dt, b, 0);
}

static void one(const pa_backend *cpu, const pa_backend *ref, kind what, pa_dtype cache_dtype, pa_dtype q_dtype,
                int64_t ctx, int64_t qlen)
{
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    cfg.scale = what == HUGE ? HUGE_S : SCALE;
    if (what == HUGE) cfg.k_scale = HUGE_S; /* (the cache's codes are k / k_scale) */
    cfg.cache_dtype = cache_dtype;
    cfg.q_dtype = q_dtype; /* (the output stays f32) */
    pa_layer *layer = NULL;
    CHECK_OK(pa_layer_create(&cfg, &layer));
    const int64_t n = ctx + qlen;
    const int32_t nb = (int32_t)((n + BS - 1) / BS) + 1;
    pa_cache cache;
    CHECK_OK(pa_cache_init(&cache, PA_LAYOUT_HND, cache_dtype, nb, BS, HKV, D));
    CHECK_OK(pa_cache_alloc(&cache));
    int32_t *table = malloc(sizeof *table * (size_t)nb);
    for (int32_t b = 0; b < nb; b++) table[b] = nb - 1 - b;
    for (int64_t j = 0; j < ctx; j++)
        for (int kh = 0; kh < HKV; kh++)
            for (int d = 0; d < D; d++) {
                int64_t e = table[j / BS] * cache.block_stride + (j % BS) * cache.token_stride + kh * cache.head_stride + d;
                pa__store_f32(cache_dtype, cache.key, e, key_value(what, j, kh, d, false));
                pa__store_f32(cache_dtype, cache.value, e, key_value(what, j, kh, d, true));
            }
    const size_t nq = (size_t)(qlen * H * D), nk = (size_t)(qlen * HKV * D), nl = (size_t)(qlen * H);
    float *qf = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nk);
    uint16_t *qb = malloc(sizeof(uint16_t) * nq);
    for (size_t i = 0; i < nq; i++) {
        const int d = (int)(i % D);
        qf[i] = what == HUGE ? (d == 0 ? 0x1p-126f : 0.0f) : d == 0 ? QBIG : d == 1 ? 1.0f : 0.0f;
        qb[i] = pa_f32_to_bf16(qf[i]); /* (2^126, 2^-126 and 1: exact in bf16) */
    }
    for (int64_t t = 0; t < qlen; t++)
        for (int kh = 0; kh < HKV; kh++)
            for (int d = 0; d < D; d++) {
                k[(t * HKV + kh) * D + d] = key_value(what, ctx + t, kh, d, false) * cfg.k_scale;
                v[(t * HKV + kh) * D + d] = key_value(what, ctx + t, kh, d, true);
            }
    const void *q = q_dtype == PA_DTYPE_BF16 ? (const void *)qb : (const void *)qf;
    float *want = malloc(sizeof(float) * nq), *got = malloc(sizeof(float) * nq);
    float *wlse = malloc(sizeof(float) * nl), *glse = malloc(sizeof(float) * nl);
    unsetenv("PAGEDATTN_CPU_ISA");
    unsetenv("PAGEDATTN_CPU_FP8");
    test_cpu_forward_one(ref, layer, ctx, qlen, BS, &cache, table, nb, q, k, v, want, nq, wlse, nl);

    /* the reference's last row (it sees every key) against the closed form of its lse: the keys'
     * values as the cache holds them (step keys: rounded by the same store) */
    for (int h = 0; h < H; h++) {
        const int kh = h / (H / HKV);
        double m = -INFINITY, l = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int64_t j = 0; j < n; j++) {
                const double k0 = cached(cache_dtype, key_value(what, j, kh, 0, false));
                const double k1 = cached(cache_dtype, key_value(what, j, kh, 1, false));
                const double s = what == HUGE ? (double)HUGE_S * 0x1p-126 * k0 * HUGE_S
                                              : SCALE * ((double)QBIG * k0 + k1);
                if (pass == 0) m = s > m ? s : m;
                else l += exp(s - m);
            }
        const double x = m + log(l), y = wlse[(size_t)((qlen - 1) * H + h)];
        CHECK(fabs(x - y) <= 1e-5 * (1.0 + fabs(x)));
    }

    const bool fp8 = pa__dtype_is_fp8(cache_dtype);
    const bool narrow = cache_dtype != PA_DTYPE_F32 || q_dtype != PA_DTYPE_F32;
    int ran = 0;
    for (int i = 0; i < TEST_CPU_NISA * TEST_CPU_NFP8; i++) {
        const char *isa = test_cpu_isas[i / TEST_CPU_NFP8], *form = test_cpu_fp8_forms[i % TEST_CPU_NFP8];
        if ((!fp8 && i % TEST_CPU_NFP8) || !test_cpu_fp8_form_distinct(isa, form)) continue;
        setenv("PAGEDATTN_CPU_FP8", form, 1);
        if (!test_cpu_isa_set(cpu, isa)) continue;
        test_cpu_forward_one(cpu, layer, ctx, qlen, BS, &cache, table, nb, q, k, v, got, nq, glse, nl);
        ran++;
        int bad = 0;
        /* outputs lie in [-0.5, 0.75]: fp32 rounding, or the probabilities rounded to 16 bits */
        const double tol = narrow ? 4e-3 : 1e-4;
        for (size_t e = 0; e < nq; e++)
            if (!(fabs((double)want[e] - got[e]) <= tol) && bad++ < 3)
                TEST_FAIL("kind %d, %s cache, %s queries, ctx %lld + %lld, isa %s, fp8 %s: out[%zu] = %g, "
                          "reference %g", (int)what, pa_dtype_name(cache_dtype), pa_dtype_name(q_dtype),
                          (long long)ctx, (long long)qlen, isa, fp8 ? form : "-", e, got[e], want[e]);
        for (size_t e = 0; e < nl; e++)
            if (!(fabs((double)wlse[e] - glse[e]) <= 1e-5 * (1.0 + fabs((double)wlse[e]))) && bad++ < 3)
                TEST_FAIL("kind %d, %s cache, %s queries, ctx %lld + %lld, isa %s, fp8 %s: lse[%zu] = %g, "
                          "reference %g", (int)what, pa_dtype_name(cache_dtype), pa_dtype_name(q_dtype),
                          (long long)ctx, (long long)qlen, isa, fp8 ? form : "-", e, glse[e], wlse[e]);
        test__checks++;
    }
    CHECK(ran >= 1);
    unsetenv("PAGEDATTN_CPU_ISA");
    unsetenv("PAGEDATTN_CPU_FP8");
    free(want), free(got), free(wlse), free(glse), free(qf), free(qb), free(k), free(v), free(table);
    pa_cache_free(&cache);
    pa_layer_destroy(layer);
}

int main(void)
{
    const pa_backend *cpu = test_cpu_backend_or_skip(), *ref = pa_backend_find("reference");
    static const pa_dtype caches[] = {PA_DTYPE_F32, PA_DTYPE_F16, PA_DTYPE_BF16, PA_DTYPE_FP8_E4M3, PA_DTYPE_FP8_E5M2};
    static const pa_dtype queries[] = {PA_DTYPE_F32, PA_DTYPE_BF16};
    static const int64_t shapes[][2] = {{299, 1}, {2999, 1}, {0, 40}, {100, 20}}; /* ctx, qlen */
    for (int w = 0; w < 3; w++)
        for (int c = 0; c < 5; c++)
            for (int qd = 0; qd < 2; qd++)
                for (int s = 0; s < 4; s++) {
                    if (w == BIG && caches[c] != PA_DTYPE_F32 && caches[c] != PA_DTYPE_BF16) continue;
                    if (w == HUGE && !pa__dtype_is_fp8(caches[c])) continue;
                    one(cpu, ref, (kind)w, caches[c], queries[qd], shapes[s][0], shapes[s][1]);
                }
    return test_exit();
}
