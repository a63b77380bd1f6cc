/* test_cpu_determinism.c: the cpu backend's output bits for one sequence do not depend on the
 * thread count (1, 2, 3) nor on the batch around it (alone, or at different positions among
 * other prefills and decodes), on every ISA path this machine runs. Also checks that forward
 * allocates nothing once the plan exists (a counting allocator), and that an explicit
 * PAGEDATTN_CPU_ISA the machine cannot run is an error, not a fallback. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <stdlib.h>

enum { H = 8, HKV = 2, D = 128, BS = 16, NBLK = 1024 };

/* ---- counting allocator ---- */
static long n_allocs;
static void *count_alloc(void *user, size_t size, size_t align)
{
    (void)user;
    n_allocs++;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size ? size : 1)) return NULL;
    return p;
}
static void count_free(void *user, void *p)
{
    (void)user;
    free(p);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

typedef struct {
    int32_t ctx, q, prefill;
    int32_t first_block; /* its blocks: first_block .. */
} seqdesc;

typedef struct {
    pa_layer *layer;
    pa_cache cache;
    uint16_t *q;   /* [max tokens, H, D] bf16: each sequence's rows generated from its id */
} world;

/* Query rows of sequence `id`, token t: a fixed function of (id, t), wherever it sits. */
static void fill_q(uint16_t *dst, int id, int t)
{
    uint64_t save = rng;
    rng = 0x1234567ull * (uint64_t)(id + 1) + 0x9876543ull * (uint64_t)(t + 1);
    for (int i = 0; i < H * D; i++) dst[i] = pa_f32_to_bf16(frand() * 2.0f);
    rng = save;
}

/* Runs the batch `seqs` (ids index `all`) and copies the rows of sequence `target` into out/lse. */
static void run(world *w, pa_context *ctx, const seqdesc *all, const int *ids, int n, int target,
                uint16_t *out_rows, float *lse_rows)
{
    pa_seq seqs[8];
    int32_t tables[8][256];
    int64_t ntok = 0, tstart = 0;
    for (int i = 0; i < n; i++) {
        const seqdesc *s = &all[ids[i]];
        int32_t nb = (s->ctx + s->q + BS - 1) / BS;
        for (int b = 0; b < nb; b++) tables[i][b] = s->first_block + b;
        seqs[i] = (pa_seq){.context_len = s->ctx, .query_len = s->q, .is_prefill = s->prefill,
                           .block_table = tables[i], .num_blocks = nb};
        if (ids[i] == target) tstart = ntok;
        ntok += s->q;
    }
    uint16_t *q = malloc((size_t)ntok * H * D * 2), *out = malloc((size_t)ntok * H * D * 2);
    float *lse = malloc((size_t)ntok * H * 4);
    int64_t tok = 0;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < all[ids[i]].q; t++, tok++) fill_q(q + tok * H * D, ids[i], t);
    pa_batch_config bc = {.block_size = BS, .num_blocks = NBLK};
    pa_batch *batch = NULL;
    pa_plan *plan = NULL;
    CHECK_OK(pa_batch_create(&bc, seqs, n, &batch));
    CHECK_OK(pa_plan_create(ctx, w->layer, batch, &plan));
    pa_forward_args a = {.q = q, .cache = &w->cache, .out = out, .lse = lse};
    long before = n_allocs;
    CHECK_OK(pa_attn_forward(ctx, w->layer, batch, plan, &a));
    CHECK_OK(pa_attn_forward(ctx, w->layer, batch, plan, &a)); /* a second layer's worth */
    CHECK_INT(n_allocs - before, 0);                            /* forward never allocates */
    int32_t tq = all[target].q;
    memcpy(out_rows, out + tstart * H * D, (size_t)tq * H * D * 2);
    memcpy(lse_rows, lse + tstart * H, (size_t)tq * H * 4);
    pa_plan_destroy(plan);
    pa_batch_destroy(batch);
    free(q);
    free(out);
    free(lse);
}

static void check_same(const char *what, const uint16_t *a, const uint16_t *b, const float *la,
                       const float *lb, int32_t rows)
{
    test__checks++;
    if (memcmp(a, b, (size_t)rows * H * D * 2) || memcmp(la, lb, (size_t)rows * H * 4))
        TEST_FAIL("%s: output bits differ", what);
}

int main(void)
{
    if (!pa_backend_find("cpu")) {
        printf("SKIP: this build has no cpu backend (configured with -DPAGEDATTN_CPU=OFF)\n");
        return 77;
    }
    pa_allocator al = {count_alloc, count_free, NULL};
    pa_set_allocator(&al);

    /* a layer with the features that change the code path: window, ALiBi, sinks, soft-cap */
    float slopes[H], sinks[H];
    for (int h = 0; h < H; h++) slopes[h] = 0.001f * (h + 1), sinks[h] = 0.5f + 0.1f * h;
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    cfg.q_dtype = cfg.kv_dtype = cfg.out_dtype = PA_DTYPE_BF16;
    cfg.cache_dtype = PA_DTYPE_BF16;
    cfg.alibi_slopes = slopes;
    cfg.sinks = sinks;
    cfg.logits_soft_cap = 30.0f;
    cfg.window_left = 2500;
    world w;
    CHECK_OK(pa_layer_create(&cfg, &w.layer));
    CHECK_OK(pa_cache_init(&w.cache, PA_LAYOUT_HND, PA_DTYPE_BF16, NBLK, BS, HKV, D));
    CHECK_OK(pa_cache_alloc(&w.cache));
    int64_t elems = pa_cache_pool_elems(&w.cache);
    for (int64_t i = 0; i < elems; i++) {
        ((uint16_t *)w.cache.key)[i] = pa_f32_to_bf16(frand());
        ((uint16_t *)w.cache.value)[i] = pa_f32_to_bf16(frand());
    }

    /* 0: long decode (split into KV chunks); 1: chunked prefill; 2-5: neighbours */
    const seqdesc all[6] = {
        {2999, 1, 0, 0},   {700, 100, 1, 200}, {0, 77, 1, 300},
        {40, 3, 0, 400},   {1500, 1, 0, 450},  {0, 300, 1, 560},
    };
    /* batches (prefills first) containing sequence 0 and sequence 1 in various positions */
    const int b_alone0[] = {0}, b_alone1[] = {1};
    const int b_a[] = {2, 1, 3, 0}, b_b[] = {1, 5, 0, 4, 3}, b_c[] = {5, 2, 1, 4, 0};
    static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "neon"};
    int ran = 0;
    for (int ii = 0; ii < (int)(sizeof isas / sizeof *isas); ii++) {
        setenv("PAGEDATTN_CPU_ISA", isas[ii], 1);
        pa_context *ctx = NULL;
        pa_status st = pa_context_create(pa_backend_find("cpu"), NULL, &ctx);
        if (st == PA_STATUS_UNAVAILABLE) {
            printf("isa %s: cannot run here, skipped (%s)\n", isas[ii], pa_last_error());
            continue;
        }
        CHECK_OK(st);
        if (st) continue;
        ran++;
        for (int target = 0; target < 2; target++) {
            int32_t rows = all[target].q;
            uint16_t *ref = malloc((size_t)rows * H * D * 2), *got = malloc((size_t)rows * H * D * 2);
            float *lref = malloc((size_t)rows * H * 4), *lgot = malloc((size_t)rows * H * 4);
            CHECK_OK(pa_context_set_num_threads(ctx, 1));
            run(&w, ctx, all, target ? b_alone1 : b_alone0, 1, target, ref, lref);
            for (int nt = 1; nt <= 3; nt++) {
                char what[96];
                CHECK_OK(pa_context_set_num_threads(ctx, nt));
                run(&w, ctx, all, target ? b_alone1 : b_alone0, 1, target, got, lgot);
                snprintf(what, sizeof what, "%s seq %d alone, %d threads", isas[ii], target, nt);
                check_same(what, ref, got, lref, lgot, rows);
                run(&w, ctx, all, b_a, 4, target, got, lgot);
                snprintf(what, sizeof what, "%s seq %d in batch a, %d threads", isas[ii], target, nt);
                check_same(what, ref, got, lref, lgot, rows);
                run(&w, ctx, all, b_b, 5, target, got, lgot);
                snprintf(what, sizeof what, "%s seq %d in batch b, %d threads", isas[ii], target, nt);
                check_same(what, ref, got, lref, lgot, rows);
                run(&w, ctx, all, b_c, 5, target, got, lgot);
                snprintf(what, sizeof what, "%s seq %d in batch c, %d threads", isas[ii], target, nt);
                check_same(what, ref, got, lref, lgot, rows);
            }
            /* not all zero: the comparison means something */
            int nonzero = 0;
            for (int i = 0; i < rows * H * D; i++) nonzero |= ref[i] != 0;
            CHECK(nonzero);
            free(ref), free(got), free(lref), free(lgot);
        }
        pa_context_destroy(ctx);
    }
    CHECK(ran >= 1);

    /* an ISA name that is not one is an error with a reason */
    setenv("PAGEDATTN_CPU_ISA", "sse9", 1);
    pa_context *bad = NULL;
    CHECK_FAILS_WITH(pa_context_create(pa_backend_find("cpu"), NULL, &bad), PA_STATUS_INVALID_ARGUMENT,
                     "PAGEDATTN_CPU_ISA");
    CHECK(bad == NULL);
    unsetenv("PAGEDATTN_CPU_ISA");
    /* so is an E4M3 conversion name that is not one */
    setenv("PAGEDATTN_CPU_FP8", "fp4", 1);
    CHECK_FAILS_WITH(pa_context_create(pa_backend_find("cpu"), NULL, &bad), PA_STATUS_INVALID_ARGUMENT,
                     "PAGEDATTN_CPU_FP8");
    CHECK(bad == NULL);
    unsetenv("PAGEDATTN_CPU_FP8");

    pa_cache_free(&w.cache);
    pa_layer_destroy(w.layer);
    pa_set_allocator(NULL);
    return test_exit();
}
