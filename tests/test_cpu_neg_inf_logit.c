/* test_cpu_neg_inf_logit.c: a visible key whose logit is -inf (an infinite key value times a
 * query value of the other sign) is not a masked key. The reference computes its weight as
 * exp(-inf - m) = 0 and multiplies its V by it, so a NaN or inf in that V reaches the row's out
 * elements (IEEE arithmetic, pagedattn.h); a row whose every logit is -inf and that has no sink
 * sees nothing (out 0, LSE -inf), and with a sink its LSE is the sink's. Keys a row does not see
 * (causal) stay out whatever they hold. Each ISA path of the cpu backend against the reference
 * (the same NaN positions in out and LSE, the same infinities, values within fp32 rounding),
 * over f32, bf16 and fp8 E5M2 caches (E4M3 has no infinity; fp8 only for cached keys: a step's
 * own +inf is written as the largest finite code), plus the expected pattern itself:
 *  - decode over 200 keys (one KV split) and 9000 keys (several, merged by their LSEs), a +inf
 *    in K of one key with a NaN in the same key's V: the query heads whose query is negative
 *    there get NaN in that one dim, those whose query is positive (+inf logit) a NaN row;
 *  - a step's only key with a -inf logit (context 0, one token), with and without a sink;
 *  - a 40-token prompt with the +inf and the NaN in token 10's K and V: rows before it
 *    (which do not see it) stay finite;
 *  - the decodes and the prompt again under ALiBi slopes of 1e30, which take the -inf logit's
 *    stand-in (the lowest finite float) back to -inf at a distance of 10 keys or more. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "test_cpu_isa.h"

#include <stdbool.h>
#include <stdlib.h>

enum { H = 8, HKV = 2, D = 64, BS = 16, KDIM = 3, VDIM = 5 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void) /* in [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1u << 23) - 1.0f;
}

typedef struct {
    pa_dtype cache_dtype;
    int64_t ctx, qlen;     /* the sequence: context_len, query_len */
    int64_t inf_key;       /* key holding +inf in K (KV head 1, dim KDIM) and NaN in V (dim VDIM) */
    bool sink;
    bool alibi; /* ALiBi slopes of 1e30: the -inf logit's key is then 10 or more from the query */
} scenario;

static void store(pa_dtype dt, void *base, int64_t i, float x)
{
    switch (dt) {
    case PA_DTYPE_F32: ((float *)base)[i] = x; break;
    case PA_DTYPE_BF16: ((uint16_t *)base)[i] = pa_f32_to_bf16(x); break;
    default: ((uint8_t *)base)[i] = isnan(x) ? 0x7f : isinf(x) ? (x > 0 ? 0x7c : 0xfc) : pa_f32_to_fp8e5m2(x); break;
    }
}

/* tol: fp32 rounding, or for a bf16 cache the contract's rounding of the probabilities to bf16
 * (2^-8 of the largest |V|, 1 here) */
static bool same(float want, float got, float tol)
{
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return want == got;
    return fabsf(want - got) <= tol * (1.0f + fabsf(want));
}

static void one(const pa_backend *cpu, const pa_backend *ref, const scenario *sc)
{
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    cfg.cache_dtype = sc->cache_dtype;
    float sinks[H];
    for (int h = 0; h < H; h++) sinks[h] = 0.25f * (float)h - 1.0f;
    if (sc->sink) cfg.sinks = sinks;
    float slopes[H];
    for (int h = 0; h < H; h++) slopes[h] = 1e30f;
    if (sc->alibi) cfg.alibi_slopes = slopes;
    pa_layer *layer = NULL;
    CHECK_OK(pa_layer_create(&cfg, &layer));
    const int64_t n = sc->ctx + sc->qlen;
    const int32_t nb = (int32_t)((n + BS - 1) / BS);
    pa_cache cache;
    CHECK_OK(pa_cache_init(&cache, PA_LAYOUT_HND, sc->cache_dtype, nb, BS, HKV, D));
    CHECK_OK(pa_cache_alloc(&cache));
    int32_t *table = malloc(sizeof *table * (size_t)nb);
    for (int32_t b = 0; b < nb; b++) table[b] = nb - 1 - b;
    /* the cached keys (positions < ctx); the step's own come from k and v */
    for (int64_t j = 0; j < sc->ctx; j++)
        for (int kh = 0; kh < HKV; kh++)
            for (int d = 0; d < D; d++) {
                int64_t e = table[j / BS] * cache.block_stride + (j % BS) * cache.token_stride + kh * cache.head_stride + d;
                store(sc->cache_dtype, cache.key, e, uniform());
                store(sc->cache_dtype, cache.value, e, uniform());
            }
    float *q = malloc(sizeof *q * (size_t)(sc->qlen * H * D)), *k = malloc(sizeof *k * (size_t)(sc->qlen * HKV * D));
    float *v = malloc(sizeof *v * (size_t)(sc->qlen * HKV * D));
    for (int64_t i = 0; i < sc->qlen * H * D; i++) q[i] = uniform();
    for (int64_t i = 0; i < sc->qlen * HKV * D; i++) k[i] = uniform(), v[i] = uniform();
    /* KV head 1 serves query heads 4-7: 4 and 5 negative at KDIM (a -inf logit), 6 and 7
     * positive (+inf: a NaN row) */
    for (int64_t t = 0; t < sc->qlen; t++)
        for (int h = 4; h < 8; h++) q[(t * H + h) * D + KDIM] = h < 6 ? -0.75f : 0.75f;
    if (sc->inf_key < sc->ctx) {
        int64_t j = sc->inf_key, e = table[j / BS] * cache.block_stride + (j % BS) * cache.token_stride + cache.head_stride;
        store(sc->cache_dtype, cache.key, e + KDIM, INFINITY);
        store(sc->cache_dtype, cache.value, e + VDIM, NAN);
    } else {
        int64_t t = sc->inf_key - sc->ctx;
        k[(t * HKV + 1) * D + KDIM] = INFINITY;
        v[(t * HKV + 1) * D + VDIM] = NAN;
    }
    const size_t no = (size_t)(sc->qlen * H * D), nl = (size_t)(sc->qlen * H);
    float *want = malloc(sizeof(float) * no), *got = malloc(sizeof(float) * no);
    float *wlse = malloc(sizeof(float) * nl), *glse = malloc(sizeof(float) * nl);
    unsetenv("PAGEDATTN_CPU_ISA");
    test_cpu_forward_one(ref, layer, sc->ctx, sc->qlen, BS, &cache, table, nb, q, k, v, want, no, wlse, nl);

    /* the reference's pattern: heads 4-5 of a row that sees the key NaN in dim VDIM alone, or
     * (the key its only one, no sink) out 0 and LSE -inf; heads 6-7 all NaN; others finite */
    for (int64_t t = 0; t < sc->qlen; t++) {
        const bool sees = sc->ctx + t >= sc->inf_key, only = n == 1;
        for (int h = 0; h < H; h++) {
            const float *o = want + (t * H + h) * D;
            int nans = 0;
            for (int d = 0; d < D; d++) nans += isnan(o[d]);
            const float l = wlse[t * H + h];
            if (!sees || h < 4) {
                CHECK(nans == 0 && isfinite(l));
            } else if (h >= 6) {
                CHECK(nans == D && isnan(l));
            } else if (only && !sc->sink) {
                CHECK(nans == 0 && o[VDIM] == 0.0f && l == -INFINITY);
            } else {
                CHECK(nans == 1 && isnan(o[VDIM]) && isfinite(l));
                if (only) CHECK(l == sinks[h]);
            }
        }
    }

    const float tol = sc->cache_dtype == PA_DTYPE_BF16 ? 1.0f / 256 : 1e-4f;
    int ran = 0;
    for (int i = 0; i < TEST_CPU_NISA; i++) {
        if (!test_cpu_isa_set(cpu, test_cpu_isas[i])) continue;
        test_cpu_forward_one(cpu, layer, sc->ctx, sc->qlen, BS, &cache, table, nb, q, k, v, got, no, glse, nl);
        ran++;
        int bad = 0;
        for (size_t e = 0; e < no; e++)
            if (!same(want[e], got[e], tol) && bad++ < 3)
                TEST_FAIL("%s cache, ctx %lld + %lld, inf key %lld%s%s, isa %s: out[t=%lld][h=%lld][d=%lld] = %g, "
                          "reference %g", pa_dtype_name(sc->cache_dtype), (long long)sc->ctx, (long long)sc->qlen,
                          (long long)sc->inf_key, sc->sink ? ", sinks" : "", sc->alibi ? ", alibi" : "", test_cpu_isas[i],
                          (long long)(e / (H * D)), (long long)(e / D % H), (long long)(e % D), got[e], want[e]);
        for (size_t e = 0; e < nl; e++)
            if (!same(wlse[e], glse[e], 1e-4f) && bad++ < 3)
                TEST_FAIL("%s cache, ctx %lld + %lld, isa %s: lse[t=%lld][h=%lld] = %g, reference %g",
                          pa_dtype_name(sc->cache_dtype), (long long)sc->ctx, (long long)sc->qlen, test_cpu_isas[i],
                          (long long)(e / H), (long long)(e % H), glse[e], wlse[e]);
        test__checks++;
    }
    CHECK(ran >= 1);
    unsetenv("PAGEDATTN_CPU_ISA");
    free(want), free(got), free(wlse), free(glse), free(q), free(k), free(v), free(table);
    pa_cache_free(&cache);
    pa_layer_destroy(layer);
}

int main(void)
{
    const pa_backend *cpu = test_cpu_backend_or_skip(), *ref = pa_backend_find("reference");
    static const pa_dtype caches[] = {PA_DTYPE_F32, PA_DTYPE_BF16, PA_DTYPE_FP8_E5M2};
    for (int c = 0; c < 3; c++) {
        const pa_dtype dt = caches[c];
        const scenario s[] = {
            {dt, 199, 1, 37, false, false},  /* decode, one KV split */
            {dt, 8999, 1, 4100, false, false}, /* decode, several splits merged */
            {dt, 8999, 1, 4100, true, false},
            {dt, 0, 1, 0, false, false},     /* the step's only key */
            {dt, 0, 1, 0, true, false},
            {dt, 0, 40, 10, false, false},   /* a prompt: rows 0-9 do not see key 10 */
            {dt, 0, 40, 10, true, false},
            /* ALiBi's penalty on the -inf logit (the lowest finite float before it): a visible
             * key still, whatever the distance (an audit, forty-ninth pass) */
            {dt, 199, 1, 37, false, true},
            {dt, 8999, 1, 4100, true, true},
            {dt, 0, 40, 10, false, true},
        };
        /* (fp8: only keys already cached hold the infinity; a step's own +inf is written as the
         * largest finite code, saturating) */
        for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
            if (dt != PA_DTYPE_FP8_E5M2 || s[i].inf_key < s[i].ctx) one(cpu, ref, &s[i]);
    }
    return test_exit();
}
