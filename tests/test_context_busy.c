/* test_context_busy.c: the header's rule "a context is used by one thread at a time", checked
 * by the library. One thread runs a long forward on a context; meanwhile another thread calls
 * forward and plan creation on the same context. Whichever call comes second must fail with
 * INVALID_ARGUMENT and a reason naming the rule, and write nothing; a call that runs must give
 * the same bits as alone; and once the long forward is done the context takes calls again.
 * Without the check two calls would share the pool and the scratch of the context (wrong
 * outputs, a freed workspace, a hang). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <pthread.h>
#include <time.h>

enum { H = 32, HKV = 8, D = 128, BS = 16, CTX = 8192, NSEQ = 8 };

static pa_cache cache;
static pa_layer *layer;
static pa_batch *batch, *small, *batch_for_long;
static pa_context *ctx;
static float *q, *want, *got;
static int64_t ntok = NSEQ;
static int long_running, long_status = -1;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *long_forward(void *arg)
{
    (void)arg;
    pa_forward_args a = {.q = q, .cache = &cache, .out = got};
    __atomic_store_n(&long_running, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&long_status, (int)pa_attn_forward(ctx, layer, batch_for_long, NULL, &a), __ATOMIC_RELAXED);
    __atomic_store_n(&long_running, 2, __ATOMIC_RELEASE);
    return NULL;
}

static int in_use(pa_status s)
{
    return s == PA_STATUS_INVALID_ARGUMENT && strstr(pa_last_error(), "in use") != NULL;
}

int main(void)
{
    const pa_backend *cpu = pa_backend_find("cpu");
    if (!cpu || !pa_backend_available(cpu, NULL, 0)) {
        printf("SKIP: no cpu backend here\n");
        return 77;
    }
    const int nb = NSEQ * (CTX / BS + 1);
    CHECK_OK(pa_cache_init(&cache, PA_LAYOUT_HND, PA_DTYPE_F32, nb, BS, HKV, D));
    CHECK_OK(pa_cache_alloc(&cache));
    size_t pool = (size_t)pa_cache_pool_elems(&cache);
    for (size_t i = 0; i < pool; i++) {
        ((float *)cache.key)[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
        ((float *)cache.value)[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
    }
    int32_t *tab = malloc((size_t)nb * sizeof *tab);
    for (int i = 0; i < nb; i++) tab[i] = i;
    pa_seq seqs[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        seqs[s] = (pa_seq){.context_len = CTX - 1, .query_len = 1};
        seqs[s].block_table = tab + s * (CTX / BS + 1);
        seqs[s].num_blocks = CTX / BS + 1;
    }
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    CHECK_OK(pa_layer_create(&cfg, &layer));
    pa_batch_config bc = {.block_size = BS, .num_blocks = nb};
    CHECK_OK(pa_batch_create(&bc, seqs, NSEQ, &batch));
    CHECK_OK(pa_batch_create(&bc, seqs, 1, &small));
    batch_for_long = batch;
    q = malloc((size_t)ntok * H * D * sizeof *q);
    want = malloc((size_t)ntok * H * D * sizeof *want);
    got = malloc((size_t)ntok * H * D * sizeof *got);
    float *other = malloc((size_t)ntok * H * D * sizeof *other);
    for (int64_t i = 0; i < ntok * H * D; i++) q[i] = (float)((i * 31) % 97) / 97.0f - 0.5f;
    pa_context_options opt = {.num_threads = 1};
    CHECK_OK(pa_context_create(cpu, &opt, &ctx));

    /* the long step alone, timed: the other thread's calls must fall inside a later one */
    pa_forward_args a = {.q = q, .cache = &cache, .out = want};
    double t0 = now();
    CHECK_OK(pa_attn_forward(ctx, layer, batch, NULL, &a));
    printf("long forward alone: %.1f ms\n", (now() - t0) * 1e3);

    /* Rounds: the long forward on a thread of its own while this thread keeps calling forward
     * (a small batch) and plan creation on the same context. Either call may get there first;
     * the other must then fail as "in use" and write nothing, and one that succeeds must give
     * the right bits. Without the check both would run at once on one scratch. */
    int seen = 0, probes = 0;
    for (int round = 0; round < 50 && seen < 20; round++) {
        for (int64_t i = 0; i < ntok * H * D; i++) got[i] = -777.0f;
        long_running = 0;
        pthread_t th;
        CHECK_INT(pthread_create(&th, NULL, long_forward, NULL), 0);
        while (!__atomic_load_n(&long_running, __ATOMIC_ACQUIRE)) {
        }
        while (__atomic_load_n(&long_running, __ATOMIC_ACQUIRE) == 1) {
            for (int64_t i = 0; i < H * D; i++) other[i] = -555.0f;
            pa_forward_args b = {.q = q, .cache = &cache, .out = other};
            pa_plan *plan = NULL;
            pa_status s1 = pa_attn_forward(ctx, layer, small, NULL, &b);
            int busy1 = in_use(s1);
            pa_status s2 = pa_plan_create(ctx, layer, small, &plan);
            int busy2 = in_use(s2);
            probes++;
            CHECK(s1 == PA_STATUS_OK || busy1);
            CHECK(s2 == PA_STATUS_OK || busy2);
            if (s1 == PA_STATUS_OK) CHECK(memcmp(other, want, (size_t)H * D * sizeof *other) == 0);
            for (int64_t i = 0; busy1 && i < H * D; i++)
                if (other[i] != -555.0f) {
                    TEST_FAIL("a refused forward wrote out[%lld]", (long long)i);
                    break;
                }
            CHECK(busy2 ? plan == NULL : plan != NULL);
            pa_plan_destroy(plan);
            seen += busy1 && busy2;
        }
        pthread_join(th, NULL);
        pa_status ls = (pa_status)long_status;
        CHECK(ls == PA_STATUS_OK || ls == PA_STATUS_INVALID_ARGUMENT);
        if (ls == PA_STATUS_OK) CHECK(memcmp(got, want, (size_t)ntok * H * D * sizeof *got) == 0);
    }
    printf("%d probes during the long forwards, %d refused as in use\n", probes, seen);
    CHECK(seen > 0);

    /* afterwards the context takes them again */
    pa_forward_args b = {.q = q, .cache = &cache, .out = other};
    CHECK_OK(pa_attn_forward(ctx, layer, small, NULL, &b));
    CHECK(memcmp(other, want, (size_t)H * D * sizeof *other) == 0);
    CHECK_OK(pa_context_set_num_threads(ctx, 2));
    CHECK_INT(pa_context_num_threads(ctx), 2);

    pa_context_destroy(ctx);

    /* synchronize and set_num_threads are in the rule on every backend, also where the backend
     * has nothing to do (the reference's set_num_threads, the host backends' synchronize: they
     * returned OK during a forward until an audit, bench/NOTES.md, thirty-ninth pass). One long
     * forward of the reference (the small batch) on a thread; the probes meanwhile. */
    const pa_backend *ref = pa_backend_find("reference");
    if (ref) {
        CHECK_OK(pa_context_create(ref, NULL, &ctx));
        int refused_sync = 0, refused_threads = 0, rprobes = 0;
        for (int round = 0; round < 20 && !(refused_sync && refused_threads); round++) {
            long_running = 0;
            pthread_t th;
            batch_for_long = small;
            CHECK_INT(pthread_create(&th, NULL, long_forward, NULL), 0);
            while (!__atomic_load_n(&long_running, __ATOMIC_ACQUIRE)) {
            }
            while (__atomic_load_n(&long_running, __ATOMIC_ACQUIRE) == 1) {
                pa_status s1 = pa_context_synchronize(ctx), s2 = pa_context_set_num_threads(ctx, 3);
                CHECK(s1 == PA_STATUS_OK || in_use(s1));
                CHECK(s2 == PA_STATUS_OK || in_use(s2));
                refused_sync += in_use(s1);
                refused_threads += in_use(s2);
                rprobes++;
            }
            pthread_join(th, NULL);
            CHECK(long_status == PA_STATUS_OK || long_status == PA_STATUS_INVALID_ARGUMENT); /* (a probe first) */
        }
        printf("reference: %d probes, synchronize refused %d times, set_num_threads %d\n", rprobes, refused_sync,
               refused_threads);
        CHECK(refused_sync > 0 && refused_threads > 0);
        CHECK_OK(pa_context_synchronize(ctx));
        CHECK_OK(pa_context_set_num_threads(ctx, 3));
        pa_context_destroy(ctx);
    }
    pa_batch_destroy(batch);
    pa_batch_destroy(small);
    pa_layer_destroy(layer);
    pa_cache_free(&cache);
    free(tab), free(q), free(want), free(got), free(other);
    return test_exit();
}
