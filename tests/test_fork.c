/* test_fork.c: a process that forks after using the cpu backend (Python's multiprocessing with
 * the fork start method, a pre-forking server) gets the same answers in the child. After fork()
 * only the forking thread exists in the child, so a context's pool workers stay with the parent:
 * the header promises that such a context runs its work on the calling thread in the child, that
 * destroying it there is safe, and that a context created in the child has its own workers.
 * The child checks, bit for bit against the parent's step, (1) the inherited two-worker context,
 * (2) a new two-worker context, (3) the inherited context after the new one, then destroys both.
 * A child that hangs (waiting for workers that do not exist) is killed by an alarm: the parent
 * sees a signal instead of exit status 0. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

enum { H = 8, HKV = 2, D = 64, BS = 16, NSEQ = 3, NB = 64 };
static const pa_seq SHAPE[NSEQ] = {
    {.context_len = 0, .query_len = 40, .is_prefill = 1},
    {.context_len = 700, .query_len = 1},
    {.context_len = 90, .query_len = 3},
};

static int32_t tables[NSEQ][NB];
static int64_t ntok;
static pa_cache cache;
static pa_layer *layer;
static pa_batch *batch;
static float *q;

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float next_val(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((int64_t)(rng >> 40) - (1 << 23)) / (float)(1 << 23);
}

/* One forward step into out ([ntok, H, D], poisoned first). 0 on success. */
static int step(pa_context *ctx, float *out)
{
    for (int64_t i = 0; i < ntok * H * D; i++) out[i] = -777.0f;
    pa_plan *plan = NULL;
    if (pa_plan_create(ctx, layer, batch, &plan) != PA_STATUS_OK) return 1;
    pa_forward_args a = {.q = q, .cache = &cache, .out = out};
    int bad = pa_attn_forward(ctx, layer, batch, plan, &a) != PA_STATUS_OK;
    pa_plan_destroy(plan);
    return bad;
}

static int same(const float *a, const float *b)
{
    return memcmp(a, b, (size_t)ntok * H * D * sizeof(float)) == 0;
}

/* The child's checks; its exit status is the number of failures (0: all passed). */
static int child(pa_context *inherited, const float *want, float *out)
{
    alarm(60); /* a hang is a failure, not a stuck test run */
    int fails = 0;
    fails += step(inherited, out) || !same(out, want);
    pa_context *fresh = NULL;
    pa_context_options opt = {.num_threads = 2};
    fails += pa_context_create(pa_backend_find("cpu"), &opt, &fresh) != PA_STATUS_OK;
    if (fresh) {
        fails += pa_context_num_threads(fresh) != 2;
        fails += step(fresh, out) || !same(out, want);
        fails += step(inherited, out) || !same(out, want);
        pa_context_destroy(fresh);
    }
    /* the inherited context says what it runs on here (the calling thread: it said 2), and
     * asking it for its old count makes workers of this process (a no-op until an audit) */
    fails += pa_context_num_threads(inherited) != 1;
    fails += pa_context_set_num_threads(inherited, 2) != PA_STATUS_OK;
    fails += pa_context_num_threads(inherited) != 2;
    fails += step(inherited, out) || !same(out, want);
    int nthr = 0; /* (Linux: the child's own threads, from /proc/self/status) */
    FILE *st = fopen("/proc/self/status", "r");
    char line[256];
    while (st && fgets(line, sizeof line, st))
        if (sscanf(line, "Threads: %d", &nthr) == 1) break;
    if (st) fclose(st);
    fails += st && nthr != 2;
    pa_context_destroy(inherited);
    return fails;
}

int main(void)
{
    const pa_backend *cpu = pa_backend_find("cpu");
    if (!cpu || !pa_backend_available(cpu, NULL, 0)) {
        printf("SKIP: no cpu backend here\n");
        return 77;
    }
    CHECK_OK(pa_cache_init(&cache, PA_LAYOUT_HND, PA_DTYPE_BF16, NB * NSEQ, BS, HKV, D));
    CHECK_OK(pa_cache_alloc(&cache));
    size_t pool = (size_t)pa_cache_pool_elems(&cache);
    for (size_t i = 0; i < pool; i++) {
        float k = next_val(), v = next_val();
        pa_convert(PA_DTYPE_BF16, (uint16_t *)cache.key + i, PA_DTYPE_F32, &k, 1, 1.0f);
        pa_convert(PA_DTYPE_BF16, (uint16_t *)cache.value + i, PA_DTYPE_F32, &v, 1, 1.0f);
    }
    pa_seq seqs[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        for (int b = 0; b < NB; b++) tables[s][b] = (int32_t)((b * NSEQ + s * 7) % (NB * NSEQ));
        seqs[s] = SHAPE[s];
        seqs[s].block_table = tables[s];
        seqs[s].num_blocks = NB;
        ntok += SHAPE[s].query_len;
    }
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    cfg.cache_dtype = PA_DTYPE_BF16;
    CHECK_OK(pa_layer_create(&cfg, &layer));
    pa_batch_config bc = {.block_size = BS, .num_blocks = NB * NSEQ};
    CHECK_OK(pa_batch_create(&bc, seqs, NSEQ, &batch));
    q = malloc((size_t)ntok * H * D * sizeof *q);
    float *want = malloc((size_t)ntok * H * D * sizeof *want);
    float *out = malloc((size_t)ntok * H * D * sizeof *out);
    for (int64_t i = 0; i < ntok * H * D; i++) q[i] = next_val();

    pa_context *ctx = NULL;
    pa_context_options opt = {.num_threads = 2};
    CHECK_OK(pa_context_create(cpu, &opt, &ctx));
    CHECK_INT(pa_context_num_threads(ctx), 2);
    CHECK_INT(step(ctx, want), 0); /* the workers have run a job before the fork */
    CHECK(want[0] != -777.0f);

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) _exit(child(ctx, want, out));
    CHECK(pid > 0);
    int status = 0;
    CHECK_INT(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) TEST_FAIL("child killed by signal %d (SIGALRM %d: it hung)", WTERMSIG(status), SIGALRM);
    CHECK(WIFEXITED(status));
    CHECK_INT(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);

    /* the parent's context still has its workers */
    CHECK_INT(step(ctx, out), 0);
    CHECK(same(out, want));
    pa_context_destroy(ctx);
    pa_batch_destroy(batch);
    pa_layer_destroy(layer);
    pa_cache_free(&cache);
    free(q);
    free(want);
    free(out);
    return test_exit();
}
