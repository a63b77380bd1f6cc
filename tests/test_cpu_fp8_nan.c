/* test_cpu_fp8_nan.c: an fp8 E4M3 cache holding NaN values (S.1111.111) among the keys a decode
 * step reads. The AVX2 decode kernels convert E4M3 rows without the NaN fix-up when a check of
 * the call's rows finds none, and exactly otherwise; this test makes both paths run and holds
 * each ISA path, under both E4M3 conversions (PAGEDATTN_CPU_FP8: f16 forms, and bf16 words
 * with their own NaN fix-up), to the reference: the same NaN positions in the output, the same values
 * elsewhere. NaN only in V reaches exactly the output dims it sits in (for the query heads of
 * its KV head); NaN in K makes that key's score NaN. The AVX-512 kernels test the bytes as they
 * convert them and redo a unit of work with the fix-up where they find a NaN: head sizes 128 and
 * 80 (64 + 16 bytes: the 16-byte steps of that test) with NaN bytes in first and last dims, and
 * GQA 40 (more rows than a decode tile reads from the cache directly: the converted copy's path);
 * then bf16 queries at GQA 8, 7 and 4 (the first two: QK by bf16 dot products, with its own
 * NaN test and redo). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "test_cpu_isa.h"

#include <stdbool.h>

enum { HMAX = 80, HKV = 2, DMAX = 128, BS = 16, CTX = 200, NB = (CTX + BS - 1) / BS };
static int H = 8, D = DMAX; /* the query heads and head size of the current round */
static pa_dtype QDT = PA_DTYPE_F32; /* and its query dtype (bf16: the avx512bf16 path's QK by bf16
                                     * dot products over E4M3 keys, at GQA 5-8) */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* A random E4M3 byte that is not a NaN, of modest size (|x| <= 2). */
static unsigned char e4m3_byte(void)
{
    unsigned char b = (unsigned char)next_u32();
    b &= 0x87;                                  /* sign, exponent 0, mantissa */
    b |= (unsigned char)((next_u32() % 9) << 3); /* exponent 0..8: up to 2^1 */
    return b;
}

static int64_t elem(const pa_cache *c, const int32_t *table, int64_t key, int kvh, int d)
{
    return table[key / BS] * c->block_stride + (key % BS) * c->token_stride + kvh * c->head_stride + d;
}

/* out of a decode step over the cache, by `be` (ISA path from the environment). */
static void step(const pa_backend *be, pa_layer *layer, pa_cache *cache, const int32_t *table,
                 const float *q, float *out)
{
    static uint16_t q16[HMAX * DMAX];
    if (QDT == PA_DTYPE_BF16)
        for (int i = 0; i < H * D; i++) q16[i] = pa_f32_to_bf16(q[i]);
    pa_context *ctx = NULL;
    pa_batch *batch = NULL;
    pa_plan *plan = NULL;
    pa_seq seq = {.context_len = CTX - 1, .query_len = 1, .is_prefill = false,
                  .block_table = table, .num_blocks = NB};
    pa_batch_config bc = {.block_size = BS, .num_blocks = NB};
    CHECK_OK(pa_context_create(be, NULL, &ctx));
    CHECK_OK(pa_batch_create(&bc, &seq, 1, &batch));
    CHECK_OK(pa_plan_create(ctx, layer, batch, &plan));
    for (int i = 0; i < H * D; i++) out[i] = -12345.0f;
    pa_forward_args a = {.q = QDT == PA_DTYPE_BF16 ? (const void *)q16 : (const void *)q, .cache = cache, .out = out};
    CHECK_OK(pa_attn_forward(ctx, layer, batch, plan, &a));
    pa_plan_destroy(plan);
    pa_batch_destroy(batch);
    pa_context_destroy(ctx);
}

/* Same NaN positions as the reference, values within fp32 rounding elsewhere; returns the
 * number of NaN elements. */
static int compare(const char *what, const float *ref, const float *got)
{
    int nans = 0, bad = 0;
    for (int i = 0; i < H * D; i++) {
        bool rn = isnan(ref[i]), gn = isnan(got[i]);
        nans += rn;
        if (rn != gn || (!rn && fabsf(ref[i] - got[i]) > 1e-4f * (1.0f + fabsf(ref[i])))) {
            if (bad++ < 3)
                TEST_FAIL("%s: out[h=%d][d=%d] = %g, reference %g", what, i / D, i % D, got[i], ref[i]);
        }
    }
    test__checks++;
    return nans;
}

/* One round at head size D: phases 0 (no NaN) to 3 over one cache. */
static void round_at(const pa_backend *cpu, const pa_backend *ref)
{
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    cfg.q_dtype = QDT;
    cfg.kv_dtype = cfg.out_dtype = PA_DTYPE_F32;
    cfg.cache_dtype = PA_DTYPE_FP8_E4M3;
    pa_layer *layer = NULL;
    CHECK_OK(pa_layer_create(&cfg, &layer));
    pa_cache cache;
    CHECK_OK(pa_cache_init(&cache, PA_LAYOUT_HND, PA_DTYPE_FP8_E4M3, NB, BS, HKV, D));
    CHECK_OK(pa_cache_alloc(&cache));
    int32_t table[NB];
    for (int b = 0; b < NB; b++) table[b] = NB - 1 - b;
    unsigned char *kp = cache.key, *vp = cache.value;
    for (int64_t i = 0; i < pa_cache_pool_elems(&cache); i++) kp[i] = e4m3_byte(), vp[i] = e4m3_byte();
    static float q[HMAX * DMAX], want[HMAX * DMAX], got[HMAX * DMAX];
    for (int i = 0; i < H * D; i++) q[i] = (float)(next_u32() % 2001) / 1000.0f - 1.0f;

    /* 0: no NaN; 1: NaN in V (key 37, KV head 1, dim 5, and key 150, head 0, the last dim, a
     * negative one); 2: also NaN in K (key 70, KV head 0, dim 9); 3: and in K of key 180, KV
     * head 1, the last dim */
    for (int phase = 0; phase < 4; phase++) {
        if (phase == 1) {
            vp[elem(&cache, table, 37, 1, 5)] = 0x7f;
            vp[elem(&cache, table, 150, 0, D - 1)] = 0xff;
        }
        if (phase == 2) kp[elem(&cache, table, 70, 0, 9)] = 0x7f;
        if (phase == 3) kp[elem(&cache, table, 180, 1, D - 1)] = 0xff;
        unsetenv("PAGEDATTN_CPU_ISA");
        step(ref, layer, &cache, table, q, want);
        int ran = 0;
        for (int i = 0; i < TEST_CPU_NISA * TEST_CPU_NFP8; i++) {
            setenv("PAGEDATTN_CPU_FP8", test_cpu_fp8_forms[i % TEST_CPU_NFP8], 1);
            if (!test_cpu_isa_set(cpu, test_cpu_isas[i / TEST_CPU_NFP8])) continue;
            char what[128];
            snprintf(what, sizeof what, "%s q, %d/%d heads x %d, phase %d, isa %s, fp8 forms %s", QDT == PA_DTYPE_BF16 ? "bf16" : "f32", H, HKV, D, phase,
                     test_cpu_isas[i / TEST_CPU_NFP8], test_cpu_fp8_forms[i % TEST_CPU_NFP8]);
            step(cpu, layer, &cache, table, q, got);
            int nans = compare(what, want, got);
            /* the expected NaN counts follow from the reference's own semantics */
            if (phase == 0) CHECK_INT(nans, 0);
            if (phase == 1) CHECK_INT(nans, 2 * (H / HKV)); /* one dim of each head of a KV head, twice */
            if (phase == 2) CHECK(nans >= (H / HKV) * D);    /* KV head 0's heads see the NaN score */
            if (phase == 3) CHECK_INT(nans, H * D);          /* and KV head 1's */
            ran++;
        }
        CHECK(ran >= 1);
    }
    pa_cache_free(&cache);
    pa_layer_destroy(layer);
}

int main(void)
{
    const pa_backend *cpu = test_cpu_backend_or_skip(), *ref = pa_backend_find("reference");
    H = 8, D = 128;
    round_at(cpu, ref);
    H = 8, D = 80;
    round_at(cpu, ref);
    H = 80, D = 128;
    round_at(cpu, ref);
    QDT = PA_DTYPE_BF16;
    H = 16, D = 128; /* GQA 8 */
    round_at(cpu, ref);
    H = 14, D = 64; /* GQA 7 */
    round_at(cpu, ref);
    H = 8, D = 128; /* GQA 4: the fp32 path's kernels under bf16 queries */
    round_at(cpu, ref);
    unsetenv("PAGEDATTN_CPU_ISA");
    unsetenv("PAGEDATTN_CPU_FP8");
    return test_exit();
}
