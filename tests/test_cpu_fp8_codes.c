/* test_cpu_fp8_codes.c: every one of the 256 codes of both fp8 formats through the cpu backend's
 * conversions, on every ISA path this machine runs, in a decode step (the kernels that read the
 * cache rows in place) and in a prefill tile (the tile copies), against values computed here from
 * the formats' definitions (OCP FP8: E4M3 bias 7, no infinities, S.1111.111 NaN; E5M2 bias 15,
 * IEEE-like). The V rows hold code j at dim j (head size 256), every key alike, all K zero: each
 * row's probabilities are equal, so every output element is the value of its code (exactly for
 * the rows that see 1, 2, 4, 8 or 16 keys, within rounding of 1/count otherwise); a NaN code must
 * give NaN, an infinite one its infinity. E4M3 runs twice: with its NaN codes, and with them
 * replaced by zero (the AVX2 kernels then take their conversion without the NaN fix-up); every
 * ISA path under both E4M3 conversions (PAGEDATTN_CPU_FP8). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "test_cpu_isa.h"

#include <stdbool.h>

enum { H = 4, HKV = 1, D = 256, BS = 16, KEYS = 16 };

/* The value of fp8 code b in format dt, from the definition. */
static float fp8_value(pa_dtype dt, unsigned b)
{
    double s = (b & 0x80) ? -1.0 : 1.0;
    if (dt == PA_DTYPE_FP8_E4M3) {
        unsigned e = (b >> 3) & 15, m = b & 7;
        if (e == 15 && m == 7) return NAN;
        return (float)(s * (e == 0 ? ldexp(m, -9) : ldexp(8 + m, (int)e - 10)));
    }
    unsigned e = (b >> 2) & 31, m = b & 3;
    if (e == 31) return m == 0 ? (float)(s * INFINITY) : NAN;
    return (float)(s * (e == 0 ? ldexp(m, -16) : ldexp(4 + m, (int)e - 17)));
}

/* One forward over the cache: `nq` new tokens after `ctx` cached ones (all keys from the cache:
 * no new K/V given), f32 queries and outputs. */
static void run(const pa_backend *be, pa_layer *layer, pa_cache *cache, const int32_t *table, int ctx, int nq,
                float *out)
{
    pa_context *c = NULL;
    pa_batch *batch = NULL;
    pa_plan *plan = NULL;
    pa_seq seq = {.context_len = ctx, .query_len = nq, .is_prefill = ctx == 0 && nq > 1,
                  .block_table = table, .num_blocks = 1};
    pa_batch_config bc = {.block_size = BS, .num_blocks = 1};
    static float q[KEYS * H * D];
    for (int i = 0; i < nq * H * D; i++) q[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    CHECK_OK(pa_context_create(be, NULL, &c));
    CHECK_OK(pa_batch_create(&bc, &seq, 1, &batch));
    CHECK_OK(pa_plan_create(c, layer, batch, &plan));
    for (int i = 0; i < nq * H * D; i++) out[i] = -12345.0f;
    pa_forward_args a = {.q = q, .cache = cache, .out = out};
    CHECK_OK(pa_attn_forward(c, layer, batch, plan, &a));
    pa_plan_destroy(plan);
    pa_batch_destroy(batch);
    pa_context_destroy(c);
}

/* Every element of the nq x H rows against its code's value; returns the mismatches. */
static int check(const char *what, pa_dtype dt, const unsigned char *codes, const float *out, int nq)
{
    int bad = 0;
    for (int t = 0; t < nq; t++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < D; j++) {
                float want = fp8_value(dt, codes[j]), got = out[((size_t)t * H + h) * D + j];
                bool ok = isnan(want) ? isnan(got)
                          : isinf(want) ? got == want
                                        : fabsf(got - want) <= 1e-6f * fabsf(want);
                if (!ok && bad++ < 4)
                    TEST_FAIL("%s: token %d head %d code 0x%02x: %.9g, want %.9g", what, t, h, codes[j], got,
                              want);
            }
    test__checks++;
    return bad;
}

int main(void)
{
    const pa_backend *cpu = test_cpu_backend_or_skip();
    static const pa_dtype dts[] = {PA_DTYPE_FP8_E4M3, PA_DTYPE_FP8_E4M3, PA_DTYPE_FP8_E5M2};
    static float out[KEYS * H * D];
    int ran = 0;
    for (int v = 0; v < 3; v++) {
        pa_dtype dt = dts[v];
        unsigned char codes[D];
        for (int j = 0; j < D; j++) {
            codes[j] = (unsigned char)j;
            if (v == 1 && (j & 0x7f) == 0x7f) codes[j] = 0; /* E4M3 without its NaN codes */
        }
        pa_layer_config cfg;
        pa_layer_config_init(&cfg, H, HKV, D);
        cfg.q_dtype = cfg.kv_dtype = cfg.out_dtype = PA_DTYPE_F32;
        cfg.cache_dtype = dt;
        pa_layer *layer = NULL;
        CHECK_OK(pa_layer_create(&cfg, &layer));
        pa_cache cache;
        CHECK_OK(pa_cache_init(&cache, PA_LAYOUT_HND, dt, 1, BS, HKV, D));
        CHECK_OK(pa_cache_alloc(&cache));
        int32_t table[1] = {0};
        unsigned char *kp = cache.key, *vp = cache.value;
        for (int k = 0; k < KEYS; k++)
            for (int j = 0; j < D; j++) {
                int64_t e = k * cache.token_stride + j;
                kp[e] = 0;
                vp[e] = codes[j];
            }
        for (int i = 0; i < TEST_CPU_NISA * TEST_CPU_NFP8; i++) {
            setenv("PAGEDATTN_CPU_FP8", test_cpu_fp8_forms[i % TEST_CPU_NFP8], 1);
            if (!test_cpu_isa_set(cpu, test_cpu_isas[i / TEST_CPU_NFP8])) continue;
            char what[128];
            /* decode: one new token over 16 keys; prefill: 16 causal tokens (1..16 keys each) */
            snprintf(what, sizeof what, "%s%s decode, isa %s, fp8 forms %s", pa_dtype_name(dt),
                     v == 1 ? " (no NaN)" : "", test_cpu_isas[i / TEST_CPU_NFP8], test_cpu_fp8_forms[i % TEST_CPU_NFP8]);
            run(cpu, layer, &cache, table, KEYS - 1, 1, out);
            CHECK_INT(check(what, dt, codes, out, 1), 0);
            snprintf(what, sizeof what, "%s%s prefill, isa %s, fp8 forms %s", pa_dtype_name(dt),
                     v == 1 ? " (no NaN)" : "", test_cpu_isas[i / TEST_CPU_NFP8], test_cpu_fp8_forms[i % TEST_CPU_NFP8]);
            run(cpu, layer, &cache, table, 0, KEYS, out);
            CHECK_INT(check(what, dt, codes, out, KEYS), 0);
            ran++;
        }
        unsetenv("PAGEDATTN_CPU_ISA");
        unsetenv("PAGEDATTN_CPU_FP8");
        pa_cache_free(&cache);
        pa_layer_destroy(layer);
    }
    CHECK(ran >= 3);
    return test_exit();
}
