/* pagedattn run: the main job. Simulates a serving engine on random Q/K/V: sequences arrive
 * with mixed prompt lengths, prompts are prefilled in chunks under a per-step token budget while
 * other sequences decode, every step runs several layers of GQA attention through one plan,
 * finished sequences free their blocks for new ones, and a sample of results is checked against
 * the reference backend. Prints steps, tokens, time and tokens/s. */
#define _POSIX_C_SOURCE 200809L
#include "tool.h"

#include "pagedattn.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct run_opts {
    const char *backend;
    int seqs, max_running, layers, heads, kv_heads, head_size, block_size, budget;
    int min_prompt, max_prompt, min_gen, max_gen, threads, check_every;
    pa_dtype cache_dtype, io_dtype;
    int sliding_window;
    unsigned seed;
} run_opts;

typedef struct sim_seq {
    int prompt, gen;       /* prompt tokens, tokens to generate */
    int cached;            /* tokens in the cache */
    int generated;
    int32_t *blocks;       /* block table */
    int nblocks, cap;
    int state;             /* 0 waiting, 1 running, 2 done */
} sim_seq;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int usage(void)
{
    printf("usage: pagedattn run [options]\n"
           "  --backend NAME      cpu, reference, cuda (default: best available)\n"
           "  --seqs N            sequences to serve (default 32)\n"
           "  --max-running N     sequences in flight at once (default 16)\n"
           "  --layers N          attention layers per step (default 4)\n"
           "  --heads H --kv-heads K --head-size D   (default 32 / 8 / 128)\n"
           "  --block-size B      tokens per KV block (default 16)\n"
           "  --budget N          tokens per step (default 512)\n"
           "  --prompt MIN,MAX    prompt lengths (default 16,768)\n"
           "  --gen MIN,MAX       tokens to generate (default 8,64)\n"
           "  --cache-dtype T     f32, f16, bf16, fp8_e4m3, fp8_e5m2 (default bf16)\n"
           "  --dtype T           q/k/v/out dtype (default bf16)\n"
           "  --sliding-window W  vLLM sliding window (default none)\n"
           "  --threads N         cpu backend threads (default all cores)\n"
           "  --check-every N     check every Nth step's first layer against the reference (default 8; 0 = never)\n"
           "  --seed S\n");
    return 0;
}

static int parse(int argc, char **argv, run_opts *o)
{
    *o = (run_opts){NULL, 32, 16, 4, 32, 8, 128, 16, 512, 16, 768, 8, 64, 0, 8,
                    PA_DTYPE_BF16, PA_DTYPE_BF16, 0, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(), 1;
        if (!v) return fprintf(stderr, "pagedattn run: %s needs a value\n", a), -1;
        i++;
        if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--seqs")) o->seqs = atoi(v);
        else if (!strcmp(a, "--max-running")) o->max_running = atoi(v);
        else if (!strcmp(a, "--layers")) o->layers = atoi(v);
        else if (!strcmp(a, "--heads")) o->heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) o->kv_heads = atoi(v);
        else if (!strcmp(a, "--head-size")) o->head_size = atoi(v);
        else if (!strcmp(a, "--block-size")) o->block_size = atoi(v);
        else if (!strcmp(a, "--budget")) o->budget = atoi(v);
        else if (!strcmp(a, "--prompt")) { if (sscanf(v, "%d,%d", &o->min_prompt, &o->max_prompt) != 2) return fprintf(stderr, "pagedattn run: --prompt needs MIN,MAX\n"), -1; }
        else if (!strcmp(a, "--gen")) { if (sscanf(v, "%d,%d", &o->min_gen, &o->max_gen) != 2) return fprintf(stderr, "pagedattn run: --gen needs MIN,MAX\n"), -1; }
        else if (!strcmp(a, "--cache-dtype")) { if (pa_dtype_parse(v, &o->cache_dtype)) return fprintf(stderr, "%s\n", pa_last_error()), -1; }
        else if (!strcmp(a, "--dtype")) { if (pa_dtype_parse(v, &o->io_dtype)) return fprintf(stderr, "%s\n", pa_last_error()), -1; }
        else if (!strcmp(a, "--sliding-window")) o->sliding_window = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--check-every")) o->check_every = atoi(v);
        else if (!strcmp(a, "--seed")) o->seed = (unsigned)strtoul(v, NULL, 10);
        else return fprintf(stderr, "pagedattn run: unknown option %s\n", a), -1;
    }
    if (o->seqs > 4096) return fprintf(stderr, "pagedattn run: at most 4096 sequences\n"), -1;
    if (o->seqs < 1 || o->max_running < 1 || o->layers < 1 || o->block_size < 1 || o->budget < 1 ||
        o->min_prompt < 1 || o->max_prompt < o->min_prompt || o->min_gen < 1 || o->max_gen < o->min_gen)
        return fprintf(stderr, "pagedattn run: sizes must be positive and ranges ordered\n"), -1;
    if ((int64_t)o->max_prompt + o->max_gen > (1 << 30))
        return fprintf(stderr, "pagedattn run: a sequence may hold at most 2^30 tokens (prompt + generated)\n"), -1;
    if (o->max_running > o->seqs) o->max_running = o->seqs; /* the pool is sized by it */
    return 0;
}

/* ---- the block pool ------------------------------------------------------------------------- */

typedef struct pool {
    int32_t *free_ids;
    int nfree;
    int64_t num_blocks;
} pool;

static int grow_table(sim_seq *s, pool *p, int tokens, int B)
{
    int need = (tokens + B - 1) / B;
    if (need > s->cap) {
        int cap = need * 2;
        int32_t *b = realloc(s->blocks, (size_t)cap * sizeof *b);
        if (!b) return -1;
        s->blocks = b;
        s->cap = cap;
    }
    while (s->nblocks < need) {
        if (p->nfree == 0) return -1;
        s->blocks[s->nblocks++] = p->free_ids[--p->nfree];
    }
    return 0;
}

static void release(sim_seq *s, pool *p)
{
    for (int i = s->nblocks - 1; i >= 0; i--) p->free_ids[p->nfree++] = s->blocks[i];
    s->nblocks = 0;
}

/* ---- one step --------------------------------------------------------------------------------- */

typedef struct sim {
    run_opts o;
    sim_seq *seqs;
    pool pool;
    pa_cache *caches;       /* [layers] */
    pa_layer *layer;
    pa_context *ctx, *ref_ctx;
    void *noise, *q, *out, *ref_q, *ref_out; /* q points into noise */
    size_t noise_elems; /* [budget, heads, D] etc. */
    size_t io_size;
    uint64_t rng;
    long steps, prefill_tokens, decode_tokens, checks, finished;
    double fwd_seconds, max_err;
    int failures;
} sim;

/* Picks this step's sequences: every running decode (1 token), then prompt chunks while the
 * budget lasts; admits waiting sequences up to max_running. Fills seqs (prefills first). */
static int schedule(sim *S, pa_seq *seqs, int *ids)
{
    int n = 0, budget = S->o.budget, running = 0, B = S->o.block_size;
    for (int i = 0; i < S->o.seqs; i++) running += S->seqs[i].state == 1;
    for (int i = 0; i < S->o.seqs && running < S->o.max_running; i++)
        if (S->seqs[i].state == 0) S->seqs[i].state = 1, running++;
    int ndec = 0, decode_ids[4096];
    for (int i = 0; i < S->o.seqs; i++) {
        sim_seq *s = &S->seqs[i];
        if (s->state != 1) continue;
        if (s->cached >= s->prompt) { /* decoding */
            if (budget >= 1 && grow_table(s, &S->pool, s->cached + 1, B) == 0) decode_ids[ndec++] = i, budget--;
            continue;
        }
    }
    for (int i = 0; i < S->o.seqs && budget > 0; i++) {
        sim_seq *s = &S->seqs[i];
        if (s->state != 1 || s->cached >= s->prompt) continue;
        int chunk = s->prompt - s->cached < budget ? s->prompt - s->cached : budget;
        if (grow_table(s, &S->pool, s->cached + chunk, B)) continue;
        seqs[n] = (pa_seq){s->cached, chunk, 1, s->blocks, s->nblocks, 0, NULL, 0};
        ids[n++] = i;
        budget -= chunk;
    }
    for (int d = 0; d < ndec; d++) {
        sim_seq *s = &S->seqs[decode_ids[d]];
        seqs[n] = (pa_seq){s->cached, 1, 0, s->blocks, s->nblocks, 0, NULL, 0};
        ids[n++] = decode_ids[d];
    }
    return n;
}

static void fill_random(sim *S, void *buf, size_t elems)
{
    for (size_t i = 0; i < elems; i++) {
        float x = (float)((double)(rng(&S->rng) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
        if (S->o.io_dtype == PA_DTYPE_F32) ((float *)buf)[i] = x;
        else ((uint16_t *)buf)[i] = S->o.io_dtype == PA_DTYPE_F16 ? pa_f32_to_f16(x) : pa_f32_to_bf16(x);
    }
}

static double load(pa_dtype d, const void *p, size_t i)
{
    return d == PA_DTYPE_F32 ? ((const float *)p)[i]
           : d == PA_DTYPE_F16 ? pa_f16_to_f32(((const uint16_t *)p)[i]) : pa_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* The sample check: the last (up to 4) tokens of the step's first prefill and of its last decode,
 * recomputed on the reference backend as a batch of their own. Their K/V are already in the
 * cache, so the sub-batch passes none, and each sub-sequence sees exactly the keys the original
 * tokens saw. */
static void check_against_reference(sim *S, const pa_seq *seqs, int n, const pa_batch_metadata *md,
                                    const pa_cache *cache)
{
    int pick[2], np = 0;
    if (seqs[0].is_prefill) pick[np++] = 0;
    if (!seqs[n - 1].is_prefill) pick[np++] = n - 1;
    pa_seq sub[2];
    size_t es = pa_dtype_size(S->o.io_dtype), row = (size_t)S->o.heads * S->o.head_size;
    int64_t rows = 0, first[2];
    for (int i = 0; i < np; i++) {
        const pa_seq *q = &seqs[pick[i]];
        int qt = q->query_len < 4 ? q->query_len : 4;
        sub[i] = *q;
        sub[i].context_len = q->context_len + q->query_len - qt;
        sub[i].query_len = qt;
        first[i] = md->query_start_loc[pick[i]] + q->query_len - qt;
        memcpy((char *)S->ref_q + rows * row * es, (char *)S->q + first[i] * row * es, (size_t)qt * row * es);
        rows += qt;
    }
    pa_batch_config bc = {S->o.block_size, S->pool.num_blocks, 0, NULL, NULL};
    pa_batch *batch = NULL;
    pa_forward_args r = {S->ref_q, 0, NULL, 0, NULL, 0, cache, S->ref_out, 0, NULL, 0, 0};
    pa_status s = pa_batch_create(&bc, sub, np, &batch);
    if (!s) s = pa_attn_forward(S->ref_ctx, S->layer, batch, NULL, &r);
    pa_batch_destroy(batch);
    if (s) {
        fprintf(stderr, "reference forward failed: %s\n", pa_last_error());
        S->failures++;
        return;
    }
    double tol = S->o.io_dtype == PA_DTYPE_F32 ? 1e-4 : S->o.io_dtype == PA_DTYPE_F16 ? 4e-3 : 2e-2;
    for (int i = 0, k = 0; i < np; k += sub[i].query_len, i++)
        for (size_t e = 0; e < (size_t)sub[i].query_len * row; e++) {
            double x = load(S->o.io_dtype, S->out, (size_t)first[i] * row + e);
            double y = load(S->o.io_dtype, S->ref_out, (size_t)k * row + e);
            double err = fabs(x - y);
            if (!(err <= tol * (1 + fabs(y)))) {
                if (!S->failures) fprintf(stderr, "mismatch: %g vs reference %g\n", x, y);
                S->failures++;
            }
            if (err > S->max_err || err != err) S->max_err = err;
        }
    S->checks++;
}

static int step(sim *S, pa_seq *seqs, int *ids)
{
    int n = schedule(S, seqs, ids);
    if (n == 0) return 0;
    pa_batch_config bc = {S->o.block_size, S->pool.num_blocks, 0, NULL, NULL};
    pa_batch *batch = NULL;
    pa_plan *plan = NULL;
    pa_status s = pa_batch_create(&bc, seqs, n, &batch);
    if (!s) s = pa_plan_create(S->ctx, S->layer, batch, &plan);
    if (s) return fprintf(stderr, "step %ld: %s: %s\n", S->steps, pa_status_name(s), pa_last_error()), -1;
    const pa_batch_metadata *md = pa_batch_get_metadata(batch);
    for (int l = 0; l < S->o.layers && !s; l++) {
        /* fresh activations each layer: random windows into a pre-generated noise buffer */
        size_t es = pa_dtype_size(S->o.io_dtype), span = S->noise_elems / 2;
        S->q = (char *)S->noise + (rng(&S->rng) % span) * es;
        const void *k = (char *)S->noise + (rng(&S->rng) % span) * es;
        const void *v = (char *)S->noise + (rng(&S->rng) % span) * es;
        pa_forward_args a = {S->q, 0, k, 0, v, 0, &S->caches[l], S->out, 0, NULL, 0, 0};
        double t0 = now();
        s = pa_attn_forward(S->ctx, S->layer, batch, plan, &a);
        if (!s) s = pa_context_synchronize(S->ctx);
        S->fwd_seconds += now() - t0;
        if (!s && l == 0 && S->o.check_every > 0 && S->steps % S->o.check_every == 0)
            check_against_reference(S, seqs, n, md, &S->caches[l]);
    }
    if (s) fprintf(stderr, "step %ld: forward: %s: %s\n", S->steps, pa_status_name(s), pa_last_error());
    S->prefill_tokens += md->num_prefill_tokens;
    S->decode_tokens += md->num_decode_tokens;
    for (int i = 0; i < n; i++) { /* advance: cached tokens, generation, completion */
        sim_seq *q = &S->seqs[ids[i]];
        int was_decode = q->cached >= q->prompt;
        q->cached += seqs[i].query_len;
        if (was_decode || q->cached == q->prompt) q->generated++;
        if (q->generated >= q->gen) {
            q->state = 2;
            release(q, &S->pool);
            S->finished++;
        }
    }
    pa_plan_destroy(plan);
    pa_batch_destroy(batch);
    S->steps++;
    return s ? -1 : 1;
}

/* ---- setup ------------------------------------------------------------------------------------ */

static int setup(sim *S)
{
    run_opts *o = &S->o;
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, o->heads, o->kv_heads, o->head_size);
    cfg.q_dtype = cfg.kv_dtype = cfg.out_dtype = o->io_dtype;
    cfg.cache_dtype = o->cache_dtype;
    cfg.sliding_window = o->sliding_window;
    const pa_backend *b = NULL;
    pa_status s = pa_layer_create(&cfg, &S->layer);
    if (!s) s = pa_backend_select(o->backend, S->layer, &b);
    pa_context_options opt = {o->threads, 0, NULL};
    if (!s) s = pa_context_create(b, &opt, &S->ctx);
    if (!s) s = pa_context_create(pa_backend_find("reference"), NULL, &S->ref_ctx);
    if (s) return fprintf(stderr, "pagedattn run: %s: %s\n", pa_status_name(s), pa_last_error()), -1;
    if (pa_backend_memory(b) != PA_MEMORY_HOST)
        return fprintf(stderr, "pagedattn run: backend %s needs device buffers; run drives host backends\n", pa_backend_name(b)), -1;
    /* Enough blocks for max_running sequences of the longest length. */
    int64_t per_seq = ((int64_t)o->max_prompt + o->max_gen + o->block_size - 1) / o->block_size + 1;
    S->pool.num_blocks = per_seq * o->max_running;
    /* the caches are touched whole below (NaN fill): refuse what this machine cannot hold */
    double cache_bytes = (double)S->pool.num_blocks * o->block_size * o->kv_heads * o->head_size *
                         (double)pa_dtype_size(o->cache_dtype) * 2 * o->layers;
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (S->pool.num_blocks > INT32_MAX || (phys > 0 && cache_bytes > 0.75 * phys))
        return fprintf(stderr,
                       "pagedattn run: the KV caches would take %.1f GiB (%d layers x %lld blocks of %d tokens), "
                       "more than 3/4 of this machine's %.1f GiB; lower --max-running, --prompt, --gen or --layers\n",
                       cache_bytes / 1073741824.0, o->layers, (long long)S->pool.num_blocks, o->block_size,
                       phys / 1073741824.0), -1;
    S->pool.free_ids = malloc((size_t)S->pool.num_blocks * sizeof(int32_t));
    S->caches = calloc((size_t)o->layers, sizeof *S->caches);
    if (!S->pool.free_ids || !S->caches) return fprintf(stderr, "pagedattn run: out of memory\n"), -1;
    for (int64_t i = 0; i < S->pool.num_blocks; i++) S->pool.free_ids[i] = (int32_t)(S->pool.num_blocks - 1 - i);
    S->pool.nfree = (int)S->pool.num_blocks;
    for (int l = 0; l < o->layers; l++) {
        s = pa_cache_init(&S->caches[l], pa_backend_preferred_layout(b), o->cache_dtype, S->pool.num_blocks,
                          o->block_size, o->kv_heads, o->head_size);
        if (!s) s = pa_cache_alloc(&S->caches[l]);
        if (s) return fprintf(stderr, "pagedattn run: cache: %s\n", pa_last_error()), -1;
        /* NaN in every slot never written: a kernel that reads past a sequence shows up as NaN */
        memset(S->caches[l].key, 0xff, (size_t)pa_cache_pool_elems(&S->caches[l]) * pa_dtype_size(o->cache_dtype));
        memset(S->caches[l].value, 0xff, (size_t)pa_cache_pool_elems(&S->caches[l]) * pa_dtype_size(o->cache_dtype));
    }
    size_t es = pa_dtype_size(o->io_dtype), T = (size_t)o->budget;
    S->noise_elems = 2 * T * o->heads * o->head_size;
    S->noise = malloc(S->noise_elems * es);
    S->out = malloc(T * o->heads * o->head_size * es);
    S->ref_out = malloc(8 * o->heads * o->head_size * es);
    S->ref_q = malloc(8 * o->heads * o->head_size * es);
    S->seqs = calloc((size_t)o->seqs, sizeof *S->seqs);
    if (!S->noise || !S->out || !S->ref_out || !S->ref_q || !S->seqs)
        return fprintf(stderr, "pagedattn run: out of memory (--budget %d tokens of %d heads x %d)\n", o->budget,
                       o->heads, o->head_size), -1;
    S->rng = 0x9E3779B97F4A7C15ull ^ o->seed;
    fill_random(S, S->noise, S->noise_elems);
    for (int i = 0; i < o->seqs; i++) {
        S->seqs[i].prompt = o->min_prompt + (int)(rng(&S->rng) % (uint64_t)(o->max_prompt - o->min_prompt + 1));
        S->seqs[i].gen = o->min_gen + (int)(rng(&S->rng) % (uint64_t)(o->max_gen - o->min_gen + 1));
    }
    printf("pagedattn run: backend %s (%d threads), %d sequences (<= %d at once), %d layers, %d/%d heads x %d, "
           "block %d, cache %s, activations %s, budget %d tokens/step, %lld blocks/layer\n",
           pa_backend_name(b), pa_context_num_threads(S->ctx), o->seqs, o->max_running, o->layers, o->heads,
           o->kv_heads, o->head_size, o->block_size, pa_dtype_name(o->cache_dtype), pa_dtype_name(o->io_dtype),
           o->budget, (long long)S->pool.num_blocks);
    return 0;
}

static void teardown(sim *S)
{
    for (int l = 0; S->caches && l < S->o.layers; l++) pa_cache_free(&S->caches[l]);
    for (int i = 0; S->seqs && i < S->o.seqs; i++) free(S->seqs[i].blocks);
    free(S->caches);
    free(S->seqs);
    free(S->pool.free_ids);
    free(S->noise), free(S->out), free(S->ref_out), free(S->ref_q);
    pa_layer_destroy(S->layer);
    pa_context_destroy(S->ctx);
    pa_context_destroy(S->ref_ctx);
}

int pa_tool_run(int argc, char **argv)
{
    sim S;
    memset(&S, 0, sizeof S);
    int r = parse(argc, argv, &S.o);
    if (r) return r > 0 ? 0 : 2;
    if (setup(&S)) return teardown(&S), 1;
    pa_seq *seqs = calloc((size_t)S.o.seqs, sizeof *seqs);
    int *ids = calloc((size_t)S.o.seqs, sizeof *ids);
    double t0 = now();
    while ((r = step(&S, seqs, ids)) > 0) {
    }
    double wall = now() - t0;
    long tokens = S.prefill_tokens + S.decode_tokens;
    printf("steps %ld, sequences finished %ld/%d, tokens %ld (prefill %ld, decode %ld)\n", S.steps, S.finished,
           S.o.seqs, tokens, S.prefill_tokens, S.decode_tokens);
    printf("attention time %.3f s for %d layers (wall %.3f s): %.0f tokens/s through all layers, %.0f layer-tokens/s\n",
           S.fwd_seconds, S.o.layers, wall, tokens / S.fwd_seconds * 1.0, tokens * (double)S.o.layers / S.fwd_seconds);
    printf("reference checks: %ld steps checked, max |error| %.3g: %s\n", S.checks, S.max_err,
           S.failures ? "MISMATCH" : S.checks ? "ok" : "none run");
    free(seqs);
    free(ids);
    int bad = r < 0 || S.failures || S.finished != S.o.seqs;
    teardown(&S);
    return bad ? 1 : 0;
}
