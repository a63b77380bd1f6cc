/* test_threads.c: the header's promises "distinct handles may be used from distinct threads"
 * and "layers and batches may be shared". Four application threads, each with its own context
 * (two pool workers each), layer, batch and plan, run forward over one shared KV cache at the
 * same time (three on the cpu backend, one on the reference), while also asking for backend
 * info and provoking an argument error between steps; then again with one layer and one batch
 * shared by all four (each still with its own context and plan). Every output must equal, bit
 * for bit, the same step run alone beforehand, and each thread must read back its own error
 * reason (pa_last_error is per thread). Run it under ThreadSanitizer to see races as well as
 * wrong results. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <pthread.h>
#include <stdbool.h>

enum { H = 16, HKV = 4, D = 64, BS = 16, NSEQ = 4, NTHR = 4, STEPS = 6 };
static const pa_seq SHAPE[NSEQ] = {
    {.context_len = 30, .query_len = 50, .is_prefill = 1},
    {.context_len = 300, .query_len = 1},
    {.context_len = 1000, .query_len = 1},
    {.context_len = 77, .query_len = 2},
};
static int32_t tables[NSEQ][80];
static int64_t ntok, nblocks;
static pa_cache cache;
static float *q;

static uint64_t rng = 0x853c49e6748fea9bull;
static float next_val(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((int64_t)(rng >> 40) - (1 << 23)) / (float)(1 << 23);
}

typedef struct job {
    const char *backend;
    int index;
    const pa_layer *layer; /* shared ones, or NULL: the thread makes its own */
    const pa_batch *batch;
    const float *want; /* the step run alone */
    float *out;
    int mismatches, errors, reason_wrong;
} job;

static pthread_barrier_t start; /* all threads begin their steps together */

/* One step on fresh handles; out receives [ntok, H, D] f32. 0 on success. */
static int one_step(pa_context *ctx, const pa_layer *layer, const pa_batch *batch, const pa_plan *plan,
                    float *out)
{
    for (int64_t i = 0; i < ntok * H * D; i++) out[i] = -777.0f;
    pa_forward_args a = {.q = q, .cache = &cache, .out = out};
    return pa_attn_forward(ctx, layer, batch, plan, &a) != PA_STATUS_OK;
}

/* A thread's handles: its own layer, batch, context (two workers) and, with plan set, plan. */
typedef struct handles {
    pa_layer *layer;
    pa_batch *batch;
    pa_context *ctx;
    pa_plan *plan;
    const pa_layer *use_layer; /* the layer and batch the steps use (own or shared) */
    const pa_batch *use_batch;
} handles;

/* Creates them; the number of failed calls. */
static int open_handles(const char *backend, handles *hd, bool plan, const pa_layer *shared_layer,
                        const pa_batch *shared_batch)
{
    pa_seq seqs[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        seqs[s] = SHAPE[s];
        seqs[s].block_table = tables[s];
        seqs[s].num_blocks = 80;
    }
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    cfg.cache_dtype = PA_DTYPE_BF16;
    pa_batch_config bc = {.block_size = BS, .num_blocks = nblocks};
    pa_context_options opt = {.num_threads = 2};
    memset(hd, 0, sizeof *hd);
    int errors = pa_layer_create(&cfg, &hd->layer) != PA_STATUS_OK;
    errors += pa_batch_create(&bc, seqs, NSEQ, &hd->batch) != PA_STATUS_OK;
    errors += pa_context_create(pa_backend_find(backend), &opt, &hd->ctx) != PA_STATUS_OK;
    hd->use_layer = shared_layer ? shared_layer : hd->layer;
    hd->use_batch = shared_batch ? shared_batch : hd->batch;
    if (plan && !errors)
        errors += pa_plan_create(hd->ctx, hd->use_layer, hd->use_batch, &hd->plan) != PA_STATUS_OK;
    return errors;
}

static void close_handles(handles *hd)
{
    pa_plan_destroy(hd->plan);
    pa_context_destroy(hd->ctx);
    pa_batch_destroy(hd->batch);
    pa_layer_destroy(hd->layer);
}

static void *worker(void *arg)
{
    job *j = arg;
    handles hd;
    pthread_barrier_wait(&start);
    j->errors += open_handles(j->backend, &hd, true, j->layer, j->batch);
    for (int step = 0; step < STEPS && !j->errors; step++) {
        j->errors += one_step(hd.ctx, hd.use_layer, hd.use_batch, hd.plan, j->out);
        j->mismatches += memcmp(j->out, j->want, (size_t)ntok * H * D * sizeof(float)) != 0;
        /* between steps: info of every backend, and an error of this thread's own */
        for (int b = 0; b < pa_backend_count(); b++)
            j->errors += pa_backend_info(pa_backend_at(b)) == NULL;
        int32_t bad = -(j->index + 2);
        char want[32];
        snprintf(want, sizeof want, "%d", (int)bad);
        pa_status st = pa_context_set_num_threads(hd.ctx, bad);
        j->reason_wrong += st != PA_STATUS_INVALID_ARGUMENT || !strstr(pa_last_error(), want);
        j->errors += pa_context_set_num_threads(hd.ctx, 2) != PA_STATUS_OK;
    }
    close_handles(&hd);
    return NULL;
}

/* The step alone on the calling thread (a temporary plan). */
static void alone(const char *backend, float *out)
{
    handles hd;
    CHECK_INT(open_handles(backend, &hd, false, NULL, NULL), 0);
    CHECK_INT(one_step(hd.ctx, hd.layer, hd.batch, NULL, out), 0);
    close_handles(&hd);
}

int main(void)
{
    if (!pa_backend_find("cpu")) {
        printf("SKIP: this build has no cpu backend\n");
        return 77;
    }
    /* blocks: sequence s uses 80 consecutive ids from s * 80, in reverse order */
    nblocks = NSEQ * 80;
    for (int s = 0; s < NSEQ; s++)
        for (int b = 0; b < 80; b++) tables[s][b] = s * 80 + 79 - b;
    CHECK_OK(pa_cache_init(&cache, PA_LAYOUT_HND, PA_DTYPE_BF16, nblocks, BS, HKV, D));
    CHECK_OK(pa_cache_alloc(&cache));
    uint16_t *kp = cache.key, *vp = cache.value;
    for (int64_t i = 0; i < pa_cache_pool_elems(&cache); i++)
        kp[i] = pa_f32_to_bf16(next_val()), vp[i] = pa_f32_to_bf16(next_val());
    ntok = 0;
    for (int s = 0; s < NSEQ; s++) ntok += SHAPE[s].query_len;
    q = malloc((size_t)ntok * H * D * sizeof(float));
    for (int64_t i = 0; i < ntok * H * D; i++) q[i] = 2.0f * next_val();

    const size_t n = (size_t)ntok * H * D;
    float *want_cpu = malloc(n * sizeof(float)), *want_ref = malloc(n * sizeof(float));
    alone("cpu", want_cpu);
    alone("reference", want_ref);
    /* the two differ (different summation orders) and are both a real answer */
    int finite = 0;
    for (size_t i = 0; i < n; i++) finite += isfinite(want_cpu[i]) && want_cpu[i] != -777.0f;
    CHECK_INT(finite, (long long)n);
    double worst = 0;
    /* (a NaN difference sticks; written with fmax, this loop crashes gcc 12 for AArch64) */
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)want_cpu[i] - want_ref[i]);
        if (!(e <= worst)) worst = e;
    }
    /* fp32 accumulation, and the contract's rounding of the probabilities to the bf16 value
     * dtype before P*V (the avx512bf16 path, the default on AMD; values in [-1, 1): at most 2^-9
     * of one) */
    printf("cpu alone vs the reference: worst difference %.3g\n", worst);
    CHECK(worst < 1e-4 + 1.0 / 256);

    /* round 0: every thread its own layer and batch; round 1: one of each, shared by all */
    handles shared;
    CHECK_INT(open_handles("cpu", &shared, false, NULL, NULL), 0);
    for (int round = 0; round < 2; round++) {
        job jobs[NTHR];
        pthread_t th[NTHR];
        CHECK_INT(pthread_barrier_init(&start, NULL, NTHR + 1), 0);
        for (int t = 0; t < NTHR; t++) {
            jobs[t] = (job){.backend = t == NTHR - 1 ? "reference" : "cpu", .index = t,
                            .layer = round ? shared.layer : NULL, .batch = round ? shared.batch : NULL,
                            .want = t == NTHR - 1 ? want_ref : want_cpu, .out = malloc(n * sizeof(float))};
            CHECK_INT(pthread_create(&th[t], NULL, worker, &jobs[t]), 0);
        }
        pthread_barrier_wait(&start);
        for (int t = 0; t < NTHR; t++) {
            CHECK_INT(pthread_join(th[t], NULL), 0);
            printf("%s, thread %d (%s): %d steps, %d mismatches, %d errors, %d wrong reasons\n",
                   round ? "shared layer and batch" : "own handles", t, jobs[t].backend, STEPS,
                   jobs[t].mismatches, jobs[t].errors, jobs[t].reason_wrong);
            CHECK_INT(jobs[t].mismatches, 0);
            CHECK_INT(jobs[t].errors, 0);
            CHECK_INT(jobs[t].reason_wrong, 0);
            free(jobs[t].out);
        }
        pthread_barrier_destroy(&start);
    }
    close_handles(&shared);
    free(want_cpu), free(want_ref), free(q);
    pa_cache_free(&cache);
    return test_exit();
}
