/* test_cpu_tiny_terms.c: terms at the bottom of fp32's range keep their value on every ISA path
 * of the cpu backend, as the contract's fp32 arithmetic with subnormals has them (an independent
 * oracle found both faults below; bench/NOTES.md, thirty-sixth pass).
 *  - Weights: a key whose logit lies more than 87.3 below its row's maximum weighs exp(s - m),
 *    an fp32 subnormal (0 beyond -103.97), not 2^-126: the SIMD exps had clamped their argument
 *    at -87.3. Made visible by V values of 2^126 on such keys, one output dim per key (logits
 *    88 to 96 and 120 below the others), over f32 and bf16 caches (bf16: the bf16 dot-product
 *    PV must leave a subnormal probability to the fp32 kernels, since vdpbf16ps takes it as 0),
 *    in a decode (one KV split and several), a prompt and a chunked prefill.
 *  - Scores: bf16 queries over bf16 keys whose product is far from both operands' ranges:
 *    queries of 2^126 over keys of 2^-130 (a bf16 subnormal), queries of 2^-130 over keys of
 *    2^126, and queries of 2^-130 over E4M3 keys of 448 with k_scale 2^118. Each such key scores
 *    4 to 7 where the others score 0; vdpbf16ps (AVX512-BF16), which takes subnormal operands as
 *    zero, would score it 0 too and weigh every key alike.
 *  - Outputs: an fp8 cache whose v_scale is 14 subnormal quanta, every V code 1 and every weight
 *    1, so every output is v_scale exactly: v_scale / l, the factor the output took before
 *    2026-11-30, underflowed (0 over 37 keys).
 * Each path against the reference (double precision), within fp32 rounding of the subnormal
 * weights (or, over a bf16 cache, the contract's rounding of the probabilities to bf16), and
 * the reference itself against the closed forms for one row. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "test_cpu_isa.h"
#include "internal.h" /* pa__store_f32: a value rounded once to the cache dtype */

#include <stdbool.h>
#include <stdlib.h>

enum { H = 8, HKV = 2, D = 64, BS = 16, NFAR = 6 };

typedef enum { WEIGHTS, Q_BIG, Q_TINY, Q_TINY_FP8, V_TINY } kind;

typedef struct {
    kind what;
    pa_dtype cache_dtype;
    int64_t ctx, qlen;
    int64_t special[NFAR]; /* key positions: far logits (WEIGHTS) or the scoring keys */
    int64_t late;          /* WEIGHTS: the other keys before this one score -200 (see LATE) */
    int tight;             /* WEIGHTS: 0 the subnormal weights' absolute tolerance; 1 relative
                            * only, on every path; 2 relative only where the path's weights are
                            * 2^64-scaled (pagedattn info: "softmax weights: 2^64") */
} scenario;

/* WEIGHTS with `late`: the plain keys (score 0) come only from key `late` on, the others before
 * it score -200 (weight e^-200, V 0), so that the far keys are their tiles' and KV chunks'
 * largest: the row's maximum then rises by more than 87 at a later tile (the rescale factor
 * e^(m - mn) below fp32's normals) or lies in a later chunk (the merge's weight of the far
 * chunk likewise). The cpu paths had weighed such far keys 0 or a subnormal times their due
 * (an audit, bench/NOTES.md, forty-first pass). */
#define LATE_SCORE (-200.0f)

static const float gaps[NFAR] = {88, 90, 92, 94, 96, 120};
#define VBIG 0x1p126f
#define VS_TINY (14 * 0x1p-149f) /* V_TINY's v_scale: 14 subnormal quanta */

static int special_index(const scenario *sc, int64_t j)
{
    for (int i = 0; i < NFAR; i++)
        if (sc->special[i] == j) return i;
    return -1;
}

/* key j's K and V at (head, dim), as floats (before the cache's dtype) */
static float key_value(const scenario *sc, int64_t j, int d, bool value)
{
    const int s = special_index(sc, j);
    if (sc->what == WEIGHTS) {
        if (value) return s >= 0 && d == 1 + s ? VBIG : 0.0f;
        if (s < 0 && j < sc->late) return d == 0 ? LATE_SCORE : 0.0f;
        return s >= 0 && d == 0 ? -gaps[s] : 0.0f;
    }
    if (sc->what == V_TINY) return value ? 1.0f : 0.0f; /* (cache codes: V = v_scale everywhere) */
    if (value) return s >= 0 && d == 0 ? 1.0f : 0.0f;
    if (s < 0) return 0.0f;
    return sc->what == Q_BIG ? 0x1p-130f : sc->what == Q_TINY ? 0x1p126f : 448.0f;
}

static float query_value(const scenario *sc, int d)
{
    if (sc->what == WEIGHTS) return d == 0 ? 1.0f : 0.0f;
    if (sc->what == V_TINY) return 0.0f;
    return sc->what == Q_BIG ? 0x1p126f : 0x1p-130f;
}

static void one(const pa_backend *cpu, const pa_backend *ref, const scenario *sc)
{
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    cfg.scale = 1.0f;
    cfg.cache_dtype = sc->cache_dtype;
    const bool q16 = sc->what != WEIGHTS && sc->what != V_TINY;
    if (q16) cfg.q_dtype = PA_DTYPE_BF16; /* (the output stays f32) */
    if (sc->what == Q_TINY_FP8) cfg.k_scale = 0x1p118f;
    if (sc->what == V_TINY) cfg.v_scale = VS_TINY;
    pa_layer *layer = NULL;
    CHECK_OK(pa_layer_create(&cfg, &layer));
    const int64_t n = sc->ctx + sc->qlen;
    const int32_t nb = (int32_t)((n + BS - 1) / BS) + 1;
    pa_cache cache;
    CHECK_OK(pa_cache_init(&cache, PA_LAYOUT_HND, sc->cache_dtype, nb, BS, HKV, D));
    CHECK_OK(pa_cache_alloc(&cache));
    int32_t *table = malloc(sizeof *table * (size_t)nb);
    for (int32_t b = 0; b < nb; b++) table[b] = nb - 1 - b;
    for (int64_t j = 0; j < sc->ctx; j++)
        for (int kh = 0; kh < HKV; kh++)
            for (int d = 0; d < D; d++) {
                int64_t e = table[j / BS] * cache.block_stride + (j % BS) * cache.token_stride + kh * cache.head_stride + d;
                pa__store_f32(sc->cache_dtype, cache.key, e, key_value(sc, j, d, false));
                pa__store_f32(sc->cache_dtype, cache.value, e, key_value(sc, j, d, true));
            }
    const size_t nq = (size_t)(sc->qlen * H * D), nk = (size_t)(sc->qlen * HKV * D);
    float *qf = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nk);
    uint16_t *qb = malloc(sizeof(uint16_t) * nq);
    for (size_t i = 0; i < nq; i++) qf[i] = query_value(sc, (int)(i % D)), qb[i] = pa_f32_to_bf16(qf[i]);
    for (int64_t t = 0; t < sc->qlen; t++)
        for (int kh = 0; kh < HKV; kh++)
            for (int d = 0; d < D; d++) {
                k[(t * HKV + kh) * D + d] = key_value(sc, sc->ctx + t, d, false);
                v[(t * HKV + kh) * D + d] = key_value(sc, sc->ctx + t, d, true) * cfg.v_scale; /* (/ v_scale: the code) */
            }
    /* (an E4M3 step's own 448 would be quantized by k_scale: the scoring keys are cached ones) */
    if (sc->what == Q_TINY_FP8)
        for (int i = 0; i < NFAR; i++) CHECK(sc->special[i] < sc->ctx);
    const void *q = q16 ? (const void *)qb : (const void *)qf;
    const size_t nl = (size_t)(sc->qlen * H);
    float *want = malloc(sizeof(float) * nq), *got = malloc(sizeof(float) * nq);
    float *wlse = malloc(sizeof(float) * nl), *glse = malloc(sizeof(float) * nl);
    unsetenv("PAGEDATTN_CPU_ISA");
    test_cpu_forward_one(ref, layer, sc->ctx, sc->qlen, BS, &cache, table, nb, q, k, v, want, nq, wlse, nl);

    /* the reference against the closed form, in the last row (which sees every key), with the
     * plain keys (score 0) weighing 1 each: the ratio is the same whatever m is */
    {
        const int64_t t = sc->qlen - 1;
        double l = 0, num[D] = {0};
        const double score = sc->what == Q_BIG || sc->what == Q_TINY ? 4.0 : 7.0;
        for (int64_t j = 0; j < n; j++) {
            const int s = special_index(sc, j);
            double w = s < 0 ? (j < sc->late ? exp((double)LATE_SCORE) : 1.0)
                             : sc->what == WEIGHTS ? exp(-(double)gaps[s]) : exp(score);
            l += w;
            if (s >= 0) num[sc->what == WEIGHTS ? 1 + s : 0] += w * (sc->what == WEIGHTS ? (double)VBIG : 1.0);
        }
        for (int d = 0; d < D; d++) {
            const double x = sc->what == V_TINY ? (double)VS_TINY : num[d] / l, y = want[t * H * D + d];
            CHECK(fabs(x - y) <= 1e-5 * fabs(x) + (sc->what == V_TINY ? 0.0 : 1e-30));
        }
    }

    int ran = 0;
    for (int i = 0; i < TEST_CPU_NISA; i++) {
        if (!test_cpu_isa_set(cpu, test_cpu_isas[i])) continue;
        test_cpu_forward_one(cpu, layer, sc->ctx, sc->qlen, BS, &cache, table, nb, q, k, v, got, nq, glse, nl);
        ran++;
        const bool tight = sc->tight == 1 || (sc->tight == 2 && strstr(pa_backend_info(cpu), "softmax weights: 2^64"));
        int bad = 0;
        for (int64_t t = 0; t < sc->qlen; t++) {
            /* the row's plain keys: each weighs exp(0 - m) >= 2^-10 of the special ones' sum */
            double rows = 0;
            for (int64_t j = 0; j <= sc->ctx + t; j++) rows += special_index(sc, j) < 0 && j >= sc->late;
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    const size_t e = (size_t)((t * H + h) * D + d);
                    const double w = want[e], g = got[e];
                    /* fp32 rounding of each subnormal weight (an absolute 2^-149, times 2^126 / l)
                     * and of everything else; bf16 caches may round the probabilities to bf16 */
                    double tol = (sc->what == WEIGHTS && !tight ? 0x1p-148 * (double)VBIG / rows : 0.0) +
                                 (sc->cache_dtype == PA_DTYPE_BF16 || q16 ? 0x1p-7 : 2e-3) * fabs(w) + 1e-30;
                    if (sc->what == V_TINY) tol = 0x1p-149; /* v_scale, one subnormal quantum */
                    if (!(fabs(w - g) <= tol) && bad++ < 3)
                        TEST_FAIL("kind %d, %s cache, ctx %lld + %lld, isa %s: out[t=%lld][h=%d][d=%d] = %g, "
                                  "reference %g", (int)sc->what, pa_dtype_name(sc->cache_dtype), (long long)sc->ctx,
                                  (long long)sc->qlen, test_cpu_isas[i], (long long)t, h, d, g, w);
                }
        }
        for (size_t e = 0; e < nl; e++)
            if (!(fabs((double)wlse[e] - glse[e]) <= 1e-5 * (1.0 + fabs((double)wlse[e]))) && bad++ < 3)
                TEST_FAIL("kind %d, %s cache, ctx %lld + %lld, isa %s: lse[%zu] = %g, reference %g", (int)sc->what,
                          pa_dtype_name(sc->cache_dtype), (long long)sc->ctx, (long long)sc->qlen, test_cpu_isas[i], e,
                          glse[e], wlse[e]);
        test__checks++;
    }
    CHECK(ran >= 1);
    unsetenv("PAGEDATTN_CPU_ISA");
    free(want), free(got), free(wlse), free(glse), free(qf), free(qb), free(k), free(v), free(table);
    pa_cache_free(&cache);
    pa_layer_destroy(layer);
}

int main(void)
{
    const pa_backend *cpu = test_cpu_backend_or_skip(), *ref = pa_backend_find("reference");
    static const pa_dtype wcaches[] = {PA_DTYPE_F32, PA_DTYPE_BF16};
    for (int c = 0; c < 2; c++) {
        const pa_dtype dt = wcaches[c];
        const scenario s[] = {
            {WEIGHTS, dt, 299, 1, {5, 77, 150, 222, 260, 298}, 0, 0},         /* decode, one KV split */
            {WEIGHTS, dt, 2999, 1, {5, 600, 1100, 1700, 2300, 2998}, 0, 0}, /* several, merged */
            {WEIGHTS, dt, 0, 48, {2, 9, 17, 25, 33, 41}, 0, 0},              /* a prompt */
            {WEIGHTS, dt, 100, 20, {3, 30, 60, 90, 101, 110}, 0, 0},         /* a chunked prefill */
            /* the far keys first, the row's maximum 88 and more above them later (the rescale
             * factor below fp32's normals): in a later tile, in a later KV chunk (the merge),
             * in a prompt */
            /* (the 120-below key first, alone among keys of -200: its tile's and chunk's
             * maximum; the others after the row's maximum) */
            {WEIGHTS, dt, 299, 1, {100, 110, 120, 130, 140, 5}, 64, 1},
            {WEIGHTS, dt, 2999, 1, {1200, 1300, 1400, 1500, 1600, 5}, 1100, 1},
            {WEIGHTS, dt, 0, 100, {81, 82, 83, 84, 85, 3}, 80, 1},
            /* the 120-below key alone in a decode's last tile (AVX2: exp_row's scalar tail),
             * weighed to fp32's relative precision where the weights are scaled */
            {WEIGHTS, dt, 32, 1, {1, 2, 3, 4, 5, 32}, 0, 2},
        };
        for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) one(cpu, ref, &s[i]);
    }
    const scenario q[] = {
        {Q_BIG, PA_DTYPE_BF16, 299, 1, {5, 77, 150, 222, 260, 299}, 0, 0},
        {Q_BIG, PA_DTYPE_BF16, 0, 40, {2, 9, 17, 25, 33, 39}, 0, 0},
        {Q_TINY, PA_DTYPE_BF16, 299, 1, {5, 77, 150, 222, 260, 299}, 0, 0},
        {Q_TINY, PA_DTYPE_BF16, 0, 40, {2, 9, 17, 25, 33, 39}, 0, 0},
        {Q_TINY_FP8, PA_DTYPE_FP8_E4M3, 299, 1, {5, 77, 150, 222, 260, 298}, 0, 0},
        {Q_TINY_FP8, PA_DTYPE_FP8_E4M3, 60, 40, {2, 9, 17, 25, 33, 59}, 0, 0},
    };
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) one(cpu, ref, &q[i]);
    /* a tiny v_scale: every V code 1, every weight 1, so each output is v_scale exactly */
    static const pa_dtype f8[] = {PA_DTYPE_FP8_E4M3, PA_DTYPE_FP8_E5M2};
    for (int c = 0; c < 2; c++) {
        const scenario v[] = {
            {V_TINY, f8[c], 36, 1, {-1, -1, -1, -1, -1, -1}, 0, 0},   /* 37 keys */
            {V_TINY, f8[c], 2999, 1, {-1, -1, -1, -1, -1, -1}, 0, 0}, /* split, merged */
            {V_TINY, f8[c], 0, 37, {-1, -1, -1, -1, -1, -1}, 0, 0},   /* a prompt */
        };
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) one(cpu, ref, &v[i]);
    }
    return test_exit();
}
