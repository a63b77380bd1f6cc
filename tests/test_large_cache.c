/* test_large_cache.c: KV pools larger than 2^32 elements, as a serving engine allocates when it
 * gives most of a machine's memory to the cache. The pools are reserved with MAP_NORESERVE and
 * only the blocks a sequence uses are ever touched, so the test needs a few MiB of real memory.
 * Any 32-bit element or byte offset anywhere on the way (slot mapping, cache write, block-table
 * walk in a kernel, copy and swap of blocks) would read or write the wrong place here.
 *
 * The same tokens are stored twice: in the huge pools at block ids scattered up to the top of
 * the pool, and in small pools (unused space filled with NaN) at low ids. A batch of one chunked
 * prefill and two decodes must then give bit-identical outputs and LSEs over both, on every
 * backend and every ISA path of the cpu backend this machine runs; the cpu results must also
 * agree with the reference. Then block copies and swaps inside and across the huge pools are
 * read back token by token. Skips (77) where the system will not reserve the address space. */
#define _DEFAULT_SOURCE
#include "test.h"
#include "test_cpu_isa.h"

#include <stdbool.h>
#include <sys/mman.h>

enum { H = 8, HKV = 2, D = 128, BS = 16, NSEQ = 3 };
/* 4096 elements per block: 2^20 + 64 blocks span 2^32 + 2^18 elements. */
static const int64_t BIG_BLOCKS = ((int64_t)1 << 20) + 64;

static const pa_seq SEQ_SHAPE[NSEQ] = {
    {.context_len = 90, .query_len = 37, .is_prefill = 1}, /* a chunk of a prefill */
    {.context_len = 700, .query_len = 1},
    {.context_len = 41, .query_len = 3}, /* speculative decode */
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float next_val(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((int64_t)(rng >> 40) - (1 << 23)) / (float)(1 << 23); /* [-1, 1) */
}

typedef struct pools {
    pa_cache c;
    void *map[2];
    size_t map_bytes;
} pools;

/* Huge pools: address space only. 0 if the system refuses the reservation. */
static int big_pools(pools *p, pa_cache_layout layout, pa_dtype dt)
{
    memset(p, 0, sizeof *p);
    if (pa_cache_init(&p->c, layout, dt, BIG_BLOCKS, BS, HKV, D) != PA_STATUS_OK) return 0;
    p->map_bytes = (size_t)pa_cache_pool_elems(&p->c) * pa_dtype_size(dt);
    for (int i = 0; i < 2; i++) {
        p->map[i] = mmap(NULL, p->map_bytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p->map[i] == MAP_FAILED) {
            p->map[i] = NULL;
            return 0;
        }
    }
    p->c.key = p->map[0];
    p->c.value = p->map[1];
    return 1;
}

static void unmap_pools(pools *p)
{
    for (int i = 0; i < 2; i++)
        if (p->map[i]) munmap(p->map[i], p->map_bytes);
}

/* Small pools of nblocks, every byte 0xff first: NaN in f32/f16/bf16 and in both fp8 formats. */
static void small_pools(pools *p, pa_cache_layout layout, pa_dtype dt, int64_t nblocks)
{
    memset(p, 0, sizeof *p);
    CHECK_OK(pa_cache_init(&p->c, layout, dt, nblocks, BS, HKV, D));
    CHECK_OK(pa_cache_alloc(&p->c));
    size_t bytes = (size_t)pa_cache_pool_elems(&p->c) * pa_dtype_size(dt);
    memset(p->c.key, 0xff, bytes);
    memset(p->c.value, 0xff, bytes);
}

typedef struct layout_run {
    int32_t big_table[NSEQ][64], small_table[NSEQ][64];
    int32_t nblk[NSEQ];
    pa_seq big_seqs[NSEQ], small_seqs[NSEQ];
} layout_run;

/* Block tables: the huge pool's ids run down from the top of the pool, every fourth one taken
 * from just above 2^31 / 4096 blocks (the first byte offset past 2^31 for 1-byte types) instead;
 * the small pool's ids are 0, 1, 2, ... */
static int64_t make_tables(layout_run *r)
{
    int64_t next_small = 0, top = BIG_BLOCKS - 1, mid = ((int64_t)1 << 19) + 1;
    for (int s = 0; s < NSEQ; s++) {
        r->nblk[s] = (SEQ_SHAPE[s].context_len + SEQ_SHAPE[s].query_len + BS - 1) / BS;
        for (int b = 0; b < r->nblk[s]; b++) {
            r->big_table[s][b] = (int32_t)((b % 4 == 3) ? mid++ : top);
            if (b % 4 != 3) top -= 3;
            r->small_table[s][b] = (int32_t)next_small++;
        }
        r->big_seqs[s] = SEQ_SHAPE[s];
        r->big_seqs[s].block_table = r->big_table[s];
        r->big_seqs[s].num_blocks = r->nblk[s];
        r->small_seqs[s] = r->big_seqs[s];
        r->small_seqs[s].block_table = r->small_table[s];
    }
    return next_small;
}

typedef struct result {
    float *out, *lse;
} result;

/* One forward of the batch over `cache`, new K/V written by the forward itself. */
static void forward(const pa_backend *be, const pa_layer *layer, const pa_seq *seqs,
                    int64_t num_blocks, const pa_cache *cache, const float *q, const float *k,
                    const float *v, int64_t ntok, result *res)
{
    pa_context *ctx = NULL;
    pa_batch *batch = NULL;
    pa_plan *plan = NULL;
    pa_batch_config bc = {.block_size = BS, .num_blocks = num_blocks};
    CHECK_OK(pa_context_create(be, NULL, &ctx));
    CHECK_OK(pa_batch_create(&bc, seqs, NSEQ, &batch));
    CHECK_OK(pa_plan_create(ctx, layer, batch, &plan));
    for (int64_t i = 0; i < ntok * H * D; i++) res->out[i] = -12345.0f;
    for (int64_t i = 0; i < ntok * H; i++) res->lse[i] = -12345.0f;
    pa_forward_args a = {.q = q, .k = k, .v = v, .cache = cache, .out = res->out, .lse = res->lse};
    CHECK_OK(pa_attn_forward(ctx, layer, batch, plan, &a));
    pa_plan_destroy(plan);
    pa_batch_destroy(batch);
    pa_context_destroy(ctx);
}

static int bits_equal(const float *a, const float *b, int64_t n)
{
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* Reads token slot `slot` of `c` and `d` back and compares them bit for bit. */
static void check_same_token(const char *what, const pa_cache *c, int64_t slot, const pa_cache *d,
                             int64_t dslot)
{
    float k1[HKV * D], v1[HKV * D], k2[HKV * D], v2[HKV * D];
    CHECK_OK(pa_cache_read_token(c, slot, 1.0f, 1.0f, k1, v1));
    CHECK_OK(pa_cache_read_token(d, dslot, 1.0f, 1.0f, k2, v2));
    if (memcmp(k1, k2, sizeof k1) || memcmp(v1, v2, sizeof v1))
        TEST_FAIL("%s: slot %" PRId64 " and slot %" PRId64 " differ", what, slot, dslot);
    test__checks++;
}

static void run_case(pa_cache_layout layout, pa_dtype cache_dt)
{
    const char *lname = layout == PA_LAYOUT_NHD ? "NHD" : "HND";
    pools big, small;
    if (!big_pools(&big, layout, cache_dt)) {
        unmap_pools(&big);
        printf("SKIP %s %s: the system would not reserve 2 x %zu bytes of address space\n", lname,
               pa_dtype_name(cache_dt), big.map_bytes);
        return;
    }
    layout_run r;
    const int64_t small_blocks = make_tables(&r);
    small_pools(&small, layout, cache_dt, small_blocks);

    /* Context tokens into both pools by pa_cache_write; slots past 2^32 in the huge one. */
    int64_t nctx = 0, ntok = 0;
    for (int s = 0; s < NSEQ; s++) nctx += SEQ_SHAPE[s].context_len, ntok += SEQ_SHAPE[s].query_len;
    float *ck = malloc((size_t)nctx * HKV * D * sizeof(float));
    float *cv = malloc((size_t)nctx * HKV * D * sizeof(float));
    int64_t *big_slots = malloc((size_t)nctx * sizeof(int64_t));
    int64_t *small_slots = malloc((size_t)nctx * sizeof(int64_t));
    for (int64_t i = 0; i < nctx * HKV * D; i++) ck[i] = next_val(), cv[i] = next_val();
    int64_t t = 0;
    for (int s = 0; s < NSEQ; s++)
        for (int p = 0; p < SEQ_SHAPE[s].context_len; p++, t++) {
            big_slots[t] = (int64_t)r.big_table[s][p / BS] * BS + p % BS;
            small_slots[t] = (int64_t)r.small_table[s][p / BS] * BS + p % BS;
        }
    CHECK(big_slots[0] > ((int64_t)1 << 24)); /* slot ids past 2^24, elements past 2^32 */
    CHECK_OK(pa_cache_write(NULL, &big.c, PA_DTYPE_F32, ck, 0, cv, 0, big_slots, nctx, 1.0f, 1.0f));
    CHECK_OK(pa_cache_write(NULL, &small.c, PA_DTYPE_F32, ck, 0, cv, 0, small_slots, nctx, 1.0f, 1.0f));
    for (int64_t i = 0; i < nctx; i += 97)
        check_same_token("pa_cache_write", &big.c, big_slots[i], &small.c, small_slots[i]);

    /* The layer: f32 queries and new K/V, cache dtype under test. */
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    cfg.cache_dtype = cache_dt;
    pa_layer *layer = NULL;
    CHECK_OK(pa_layer_create(&cfg, &layer));
    float *q = malloc((size_t)ntok * H * D * sizeof(float));
    float *k = malloc((size_t)ntok * HKV * D * sizeof(float));
    float *v = malloc((size_t)ntok * HKV * D * sizeof(float));
    for (int64_t i = 0; i < ntok * H * D; i++) q[i] = 2.0f * next_val();
    for (int64_t i = 0; i < ntok * HKV * D; i++) k[i] = next_val(), v[i] = next_val();

    result ref = {malloc((size_t)ntok * H * D * sizeof(float)), malloc((size_t)ntok * H * sizeof(float))};
    result rb = {malloc((size_t)ntok * H * D * sizeof(float)), malloc((size_t)ntok * H * sizeof(float))};
    result rs = {malloc((size_t)ntok * H * D * sizeof(float)), malloc((size_t)ntok * H * sizeof(float))};

    const pa_backend *refbe = pa_backend_find("reference"), *cpu = pa_backend_find("cpu");
    /* reference over both pools: bit-identical, and the reference's values for the cpu checks */
    forward(refbe, layer, r.big_seqs, BIG_BLOCKS, &big.c, q, k, v, ntok, &ref);
    forward(refbe, layer, r.small_seqs, small_blocks, &small.c, q, k, v, ntok, &rs);
    if (!bits_equal(ref.out, rs.out, ntok * H * D) || !bits_equal(ref.lse, rs.lse, ntok * H))
        TEST_FAIL("%s %s reference: huge and small pools differ", lname, pa_dtype_name(cache_dt));
    test__checks++;
    int bad = 0;
    for (int64_t i = 0; i < ntok * H * D; i++) bad += !isfinite(ref.out[i]);
    CHECK_INT(bad, 0);
    /* the forward wrote the new tokens into both pools at the same logical places */
    for (int s = 0, p; s < NSEQ; s++) {
        p = SEQ_SHAPE[s].context_len + SEQ_SHAPE[s].query_len - 1;
        check_same_token("forward's cache write", &big.c,
                         (int64_t)r.big_table[s][p / BS] * BS + p % BS, &small.c,
                         (int64_t)r.small_table[s][p / BS] * BS + p % BS);
    }

    for (int i = 0; i < TEST_CPU_NISA; i++) {
        if (!test_cpu_isa_set(cpu, test_cpu_isas[i])) continue;
        forward(cpu, layer, r.big_seqs, BIG_BLOCKS, &big.c, q, k, v, ntok, &rb);
        forward(cpu, layer, r.small_seqs, small_blocks, &small.c, q, k, v, ntok, &rs);
        const bool same = bits_equal(rb.out, rs.out, ntok * H * D) && bits_equal(rb.lse, rs.lse, ntok * H);
        if (!same)
            TEST_FAIL("%s %s cpu/%s: huge and small pools differ", lname, pa_dtype_name(cache_dt),
                      test_cpu_isas[i]);
        test__checks++;
        double worst = 0;
        for (int64_t j = 0; j < ntok * H * D; j++) {
            double e = fabs((double)rb.out[j] - ref.out[j]);
            if (!(e <= worst)) worst = e; /* NaN sticks */
        }
        for (int64_t j = 0; j < ntok * H; j++) {
            double e = fabs((double)rb.lse[j] - ref.lse[j]);
            if (!(e <= worst)) worst = e;
        }
        if (!(worst <= 1e-4))
            TEST_FAIL("%s %s cpu/%s: %g from the reference", lname, pa_dtype_name(cache_dt),
                      test_cpu_isas[i], worst);
        test__checks++;
        printf("%s %s cpu/%s: %s over both pools, %.2g from the reference\n", lname,
               pa_dtype_name(cache_dt), test_cpu_isas[i], same ? "bit-identical" : "DIFFERENT", worst);
    }
    unsetenv("PAGEDATTN_CPU_ISA");

    /* Block copy inside the huge pool, from the top to just past 2^31 elements and back down,
     * then a swap of the top blocks into the small pools and back to other top blocks. */
    pa_context *ctx = NULL;
    CHECK_OK(pa_context_create(cpu, NULL, &ctx));
    const int64_t src = r.big_table[1][0], lowdst = ((int64_t)1 << 19) - 7, hidst = BIG_BLOCKS - 2;
    const int64_t cp[4] = {src, lowdst, src, hidst};
    CHECK_OK(pa_cache_copy_blocks(ctx, &big.c, 1, cp, 2));
    const int64_t sw_out[2] = {r.big_table[1][1], 0}, sw_in[2] = {0, BIG_BLOCKS - 3};
    CHECK_OK(pa_cache_swap_blocks(ctx, &big.c, &small.c, sw_out, 1));
    CHECK_OK(pa_cache_swap_blocks(ctx, &small.c, &big.c, sw_in, 1));
    for (int tk = 0; tk < BS; tk += 5) {
        /* block 0 and 1 of sequence 1 were written from context tokens 90 + tk and 106 + tk */
        int64_t c0 = SEQ_SHAPE[0].context_len + tk, c1 = c0 + BS;
        check_same_token("copy to a low block", &big.c, lowdst * BS + tk, &small.c, small_slots[c0]);
        check_same_token("copy to a high block", &big.c, hidst * BS + tk, &small.c, small_slots[c0]);
        check_same_token("swap out and in", &big.c, (BIG_BLOCKS - 3) * BS + tk, &big.c,
                         big_slots[c1]);
    }
    pa_context_destroy(ctx);

    free(ref.out), free(ref.lse), free(rb.out), free(rb.lse), free(rs.out), free(rs.lse);
    free(q), free(k), free(v), free(ck), free(cv), free(big_slots), free(small_slots);
    pa_layer_destroy(layer);
    pa_cache_free(&small.c);
    unmap_pools(&big);
}

int main(void)
{
    const pa_dtype dts[] = {PA_DTYPE_BF16, PA_DTYPE_F32, PA_DTYPE_FP8_E4M3};
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < sizeof dts / sizeof *dts; i++)
            run_case(l ? PA_LAYOUT_HND : PA_LAYOUT_NHD, dts[i]);
    if (test__checks == 0) return 77;
    return test_exit();
}
