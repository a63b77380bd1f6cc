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
 * read back token by token. Where the cuda backend runs, the same on device pools (real
 * allocations there: up to 2 x 16 GiB for the f32 case; a case the device cannot hold is
 * skipped). Skips (77) where the system will not reserve the address space. */
#define _DEFAULT_SOURCE
#include "test.h"
#include "cuda_test.h"
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

/* ---- the cuda backend, where it runs ------------------------------------------------------ */

static const pa__cuda_test_hooks *CU; /* NULL: no cuda backend here */

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = NULL;
    if (CU->malloc_dev(&d, bytes)) return NULL;
    if (host && CU->memcpy_sync(d, host, bytes, 0)) {
        CU->free_dev(d);
        return NULL;
    }
    return d;
}

/* Device pools of the geometry in p->c (key/value replaced); 0 if the device cannot hold them. */
static int dev_pools(pa_cache *c, int fill)
{
    size_t bytes = (size_t)pa_cache_pool_elems(c) * pa_dtype_size(c->dtype);
    c->key = c->value = NULL;
    if (CU->malloc_dev(&c->key, bytes) || CU->malloc_dev(&c->value, bytes)) return 0;
    c->memory = PA_MEMORY_CUDA;
    if (fill >= 0) {
        CHECK_INT(CU->memset_dev(c->key, fill, bytes), 0);
        CHECK_INT(CU->memset_dev(c->value, fill, bytes), 0);
    }
    return 1;
}

static void free_dev_pools(pa_cache *c)
{
    if (c->key) CU->free_dev(c->key);
    if (c->value) CU->free_dev(c->value);
    c->key = c->value = NULL;
}

/* Block b of both pools of device cache c, copied to host (k then v). */
static void read_block(const pa_cache *c, int64_t b, unsigned char *out)
{
    size_t es = pa_dtype_size(c->dtype), n = (size_t)c->block_stride * es;
    CHECK_INT(CU->memcpy_sync(out, (const char *)c->key + (size_t)b * n, n, 1), 0);
    CHECK_INT(CU->memcpy_sync(out + n, (const char *)c->value + (size_t)b * n, n, 1), 0);
}

static void check_same_block(const char *what, const pa_cache *c, int64_t b, const pa_cache *d, int64_t db)
{
    size_t n = 2 * (size_t)c->block_stride * pa_dtype_size(c->dtype);
    unsigned char *x = malloc(n), *y = malloc(n);
    read_block(c, b, x);
    read_block(d, db, y);
    if (memcmp(x, y, n)) TEST_FAIL("cuda %s: block %" PRId64 " and block %" PRId64 " differ", what, b, db);
    test__checks++;
    free(x), free(y);
}

/* Token slot `slot` of device cache c and `dslot` of d, compared through host copies of their
 * blocks (the rest of a block may differ: unwritten slots hold each pool's own filler). */
static void check_same_token_dev(const char *what, const pa_cache *c, int64_t slot, const pa_cache *d,
                                 int64_t dslot)
{
    size_t n = (size_t)c->block_stride * pa_dtype_size(c->dtype);
    unsigned char *x = malloc(2 * n), *y = malloc(2 * n);
    read_block(c, slot / BS, x);
    read_block(d, dslot / BS, y);
    pa_cache hc = *c, hd = *d;
    hc.num_blocks = hd.num_blocks = 1;
    hc.memory = hd.memory = PA_MEMORY_HOST;
    hc.key = x, hc.value = x + n, hd.key = y, hd.value = y + n;
    check_same_token(what, &hc, slot % BS, &hd, dslot % BS);
    free(x), free(y);
}

/* forward on the cuda backend: host q/k/v in, host out/lse back. */
static void forward_cuda(const pa_layer *layer, const pa_seq *seqs, int64_t num_blocks, const pa_cache *cache,
                         const float *q, const float *k, const float *v, int64_t ntok, result *res)
{
    pa_context *ctx = NULL;
    pa_batch *batch = NULL;
    pa_plan *plan = NULL;
    pa_batch_config bc = {.block_size = BS, .num_blocks = num_blocks};
    const size_t qb = (size_t)ntok * H * D * sizeof(float), kb = (size_t)ntok * HKV * D * sizeof(float);
    for (size_t i = 0; i < qb / sizeof(float); i++) res->out[i] = -12345.0f;
    for (int64_t i = 0; i < ntok * H; i++) res->lse[i] = -12345.0f;
    void *dq = dev_copy(q, qb), *dk = dev_copy(k, kb), *dv = dev_copy(v, kb);
    void *dout = dev_copy(res->out, qb), *dlse = dev_copy(res->lse, (size_t)ntok * H * sizeof(float));
    CHECK(dq && dk && dv && dout && dlse);
    CHECK_OK(pa_context_create(pa_backend_find("cuda"), NULL, &ctx));
    CHECK_OK(pa_batch_create(&bc, seqs, NSEQ, &batch));
    CHECK_OK(pa_plan_create(ctx, layer, batch, &plan));
    pa_forward_args a = {.q = dq, .k = dk, .v = dv, .cache = cache, .out = dout, .lse = dlse};
    CHECK_OK(pa_attn_forward(ctx, layer, batch, plan, &a));
    CHECK_OK(pa_context_synchronize(ctx));
    CHECK_INT(CU->memcpy_sync(res->out, dout, qb, 1), 0);
    CHECK_INT(CU->memcpy_sync(res->lse, dlse, (size_t)ntok * H * sizeof(float), 1), 0);
    pa_plan_destroy(plan);
    pa_batch_destroy(batch);
    pa_context_destroy(ctx);
    CU->free_dev(dq), CU->free_dev(dk), CU->free_dev(dv), CU->free_dev(dout), CU->free_dev(dlse);
}

typedef struct case_data {
    const char *lname;
    pa_cache_layout layout;
    pa_dtype dt;
    const layout_run *r;
    int64_t small_blocks, nctx, ntok;
    const float *ck, *cv, *q, *k, *v;
    const int64_t *big_slots, *small_slots;
    const pa_layer *layer;
    const result *ref;
} case_data;

/* The cpu part's steps on device pools: writes, forward over both, block copy and swap. */
static void cuda_case(const case_data *cd)
{
    pa_cache big, small;
    CHECK_OK(pa_cache_init(&big, cd->layout, cd->dt, BIG_BLOCKS, BS, HKV, D));
    CHECK_OK(pa_cache_init(&small, cd->layout, cd->dt, cd->small_blocks, BS, HKV, D));
    if (!dev_pools(&big, -1)) {
        printf("%s %s cuda: SKIP, the device cannot hold 2 x %" PRId64 " bytes\n", cd->lname,
               pa_dtype_name(cd->dt), pa_cache_pool_elems(&big) * (int64_t)pa_dtype_size(cd->dt));
        free_dev_pools(&big);
        return;
    }
    CHECK(dev_pools(&small, 0xff));
    pa_context *ctx = NULL;
    CHECK_OK(pa_context_create(pa_backend_find("cuda"), NULL, &ctx));
    const size_t cb = (size_t)cd->nctx * HKV * D * sizeof(float);
    void *dck = dev_copy(cd->ck, cb), *dcv = dev_copy(cd->cv, cb);
    CHECK(dck && dcv);
    CHECK_OK(pa_cache_write(ctx, &big, PA_DTYPE_F32, dck, 0, dcv, 0, cd->big_slots, cd->nctx, 1.0f, 1.0f));
    CHECK_OK(pa_cache_write(ctx, &small, PA_DTYPE_F32, dck, 0, dcv, 0, cd->small_slots, cd->nctx, 1.0f, 1.0f));
    CHECK_OK(pa_context_synchronize(ctx));
    CU->free_dev(dck), CU->free_dev(dcv);
    for (int s = 0; s < NSEQ; s++)
        check_same_block("pa_cache_write", &big, cd->r->big_table[s][0], &small, cd->r->small_table[s][0]);

    const int64_t no = cd->ntok * H * D, nl = cd->ntok * H;
    result rb = {malloc((size_t)no * sizeof(float)), malloc((size_t)nl * sizeof(float))};
    result rs = {malloc((size_t)no * sizeof(float)), malloc((size_t)nl * sizeof(float))};
    forward_cuda(cd->layer, cd->r->big_seqs, BIG_BLOCKS, &big, cd->q, cd->k, cd->v, cd->ntok, &rb);
    forward_cuda(cd->layer, cd->r->small_seqs, cd->small_blocks, &small, cd->q, cd->k, cd->v, cd->ntok, &rs);
    const bool same = bits_equal(rb.out, rs.out, no) && bits_equal(rb.lse, rs.lse, nl);
    if (!same) TEST_FAIL("%s %s cuda: huge and small pools differ", cd->lname, pa_dtype_name(cd->dt));
    test__checks++;
    double worst = 0;
    for (int64_t j = 0; j < no; j++) {
        double e = fabs((double)rb.out[j] - cd->ref->out[j]);
        if (!(e <= worst)) worst = e;
    }
    for (int64_t j = 0; j < nl; j++) {
        double e = fabs((double)rb.lse[j] - cd->ref->lse[j]);
        if (!(e <= worst)) worst = e;
    }
    /* (16-bit caches may take the tensor-core paths, which round P to the value dtype) */
    if (!(worst <= 1e-2)) TEST_FAIL("%s %s cuda: %g from the reference", cd->lname, pa_dtype_name(cd->dt), worst);
    test__checks++;
    printf("%s %s cuda: %s over both pools, %.2g from the reference\n", cd->lname, pa_dtype_name(cd->dt),
           same ? "bit-identical" : "DIFFERENT", worst);
    /* the forward's own writes of the new tokens, at the top of the pool */
    for (int s = 0; s < NSEQ; s++) {
        int p = SEQ_SHAPE[s].context_len + SEQ_SHAPE[s].query_len - 1;
        check_same_token_dev("forward's cache write", &big, (int64_t)cd->r->big_table[s][p / BS] * BS + p % BS,
                             &small, (int64_t)cd->r->small_table[s][p / BS] * BS + p % BS);
    }

    const int64_t src = cd->r->big_table[1][0], lowdst = ((int64_t)1 << 19) - 7, hidst = BIG_BLOCKS - 2;
    const int64_t cp[4] = {src, lowdst, src, hidst};
    CHECK_OK(pa_cache_copy_blocks(ctx, &big, 1, cp, 2));
    const int64_t sw_out[2] = {cd->r->big_table[1][1], 0}, sw_in[2] = {0, BIG_BLOCKS - 3};
    CHECK_OK(pa_cache_swap_blocks(ctx, &big, &small, sw_out, 1));
    CHECK_OK(pa_cache_swap_blocks(ctx, &small, &big, sw_in, 1));
    CHECK_OK(pa_context_synchronize(ctx));
    check_same_block("copy to a low block", &big, lowdst, &small, cd->r->small_table[1][0]);
    check_same_block("copy to a high block", &big, hidst, &small, cd->r->small_table[1][0]);
    check_same_block("swap out and in", &big, BIG_BLOCKS - 3, &big, cd->r->big_table[1][1]);
    pa_context_destroy(ctx);
    free(rb.out), free(rb.lse), free(rs.out), free(rs.lse);
    free_dev_pools(&big);
    free_dev_pools(&small);
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

    for (int i = 0; cpu && i < TEST_CPU_NISA; i++) {
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
        /* fp32 accumulation, and the contract's rounding of the probabilities to a 16-bit
         * value dtype (values in [-1, 1): at most 2^-9 of one for bf16) */
        const double tol = 1e-4 + (cache_dt == PA_DTYPE_BF16 ? 1.0 / 256 : cache_dt == PA_DTYPE_F16 ? 1.0 / 2048 : 0);
        if (!(worst <= tol))
            TEST_FAIL("%s %s cpu/%s: %g from the reference", lname, pa_dtype_name(cache_dt),
                      test_cpu_isas[i], worst);
        test__checks++;
        printf("%s %s cpu/%s: %s over both pools, %.2g from the reference\n", lname,
               pa_dtype_name(cache_dt), test_cpu_isas[i], same ? "bit-identical" : "DIFFERENT", worst);
    }
    unsetenv("PAGEDATTN_CPU_ISA");

    /* Block copy inside the huge pool, from the top to just past 2^31 elements and back down,
     * then a swap of the top blocks into the small pools and back to other top blocks. */
    pa_context *ctx = NULL; /* (host cache ops: the cpu backend's where it is built) */
    if (cpu) CHECK_OK(pa_context_create(cpu, NULL, &ctx));
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

    if (CU) {
        case_data cd = {lname, layout, cache_dt, &r, small_blocks, nctx, ntok, ck, cv, q, k, v,
                        big_slots, small_slots, layer, &ref};
        cuda_case(&cd);
    }

    free(ref.out), free(ref.lse), free(rb.out), free(rb.lse), free(rs.out), free(rs.lse);
    free(q), free(k), free(v), free(ck), free(cv), free(big_slots), free(small_slots);
    pa_layer_destroy(layer);
    pa_cache_free(&small.c);
    unmap_pools(&big);
}

int main(void)
{
    const pa__cuda_test_hooks *hooks = NULL;
    if (cuda_test_open(&hooks)) CU = hooks; /* (else it printed why the cuda part is skipped) */
    const pa_dtype dts[] = {PA_DTYPE_BF16, PA_DTYPE_F32, PA_DTYPE_FP8_E4M3};
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < sizeof dts / sizeof *dts; i++)
            run_case(l ? PA_LAYOUT_HND : PA_LAYOUT_NHD, dts[i]);
    if (test__checks == 0) return 77;
    return test_exit();
}
