/* cuda_bench.c: speed of the cuda backend on the two target shapes, with the device's
 * own copy bandwidth measured in the same run (built and run by ../devcheck.sh; not part of the
 * library; `pagedattn bench` drives host backends only so far).
 *
 *   decode : batch 64 x context 4096, 32 query / 8 KV heads x 128, bf16 everything, block 16,
 *            NHD: KV bytes read / time vs the device-to-device copy bandwidth.
 *   prefill: one 4096-token causal prompt, same heads: FLOP/s (4 * S^2/2 * D * H, the causal
 *            half), to compare with PyTorch SDPA (devcheck.sh runs that side).
 *
 * Timing: CUDA events on the context's stream, warm-up first, median of the repeats.
 * Usage: cuda_bench [--quick]   (--quick: tiny shapes, for a smoke run) */
#include "pagedattn.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define PK(call)                                                                              \
    do {                                                                                      \
        pa_status s_ = (call);                                                                \
        if (s_ != PA_STATUS_OK) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,                \
                    pa_status_name(s_), pa_last_error());                                     \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint16_t rand_bf16(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return pa_f32_to_bf16((float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f);
}

/* Fills n bf16 elements of device memory with random values (a 16 MiB host pattern, repeated
 * with an offset so rows differ). */
static void fill_dev(void *dev, size_t n)
{
    const size_t chunk = (size_t)8 << 20;
    uint16_t *h = malloc((chunk + 4096) * 2);
    for (size_t i = 0; i < chunk + 4096; i++) h[i] = rand_bf16();
    for (size_t off = 0, k = 0; off < n; off += chunk, k++) {
        size_t m = n - off < chunk ? n - off : chunk;
        CK(cudaMemcpy((uint16_t *)dev + off, h + (k * 397) % 4096, m * 2, cudaMemcpyHostToDevice));
    }
    free(h);
}

static int graph_failures;

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef struct timer {
    cudaEvent_t e[64][2];
    int n;
} timer;

static float median_ms(timer *t)
{
    float ms[64];
    for (int i = 0; i < t->n; i++) {
        CK(cudaEventSynchronize(t->e[i][1]));
        CK(cudaEventElapsedTime(&ms[i], t->e[i][0], t->e[i][1]));
    }
    qsort(ms, (size_t)t->n, sizeof ms[0], cmpf);
    return ms[t->n / 2];
}

/* One attention workload: a batch of num_seqs sequences of (ctx, q) on a fresh bf16 NHD cache. */
static float run_attn(pa_context *ctx, cudaStream_t stream, int num_seqs, int ctx_len, int q_len,
                      int H, int HKV, int D, int repeats, double *kv_bytes, double *flops)
{
    const int BS = 16;
    const int per_seq = (ctx_len + q_len + BS - 1) / BS;
    const int64_t nblocks = (int64_t)num_seqs * per_seq;
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    cfg.q_dtype = cfg.kv_dtype = cfg.out_dtype = cfg.cache_dtype = PA_DTYPE_BF16;
    pa_layer *layer = NULL;
    PK(pa_layer_create(&cfg, &layer));
    pa_cache cache;
    PK(pa_cache_init(&cache, PA_LAYOUT_NHD, PA_DTYPE_BF16, nblocks, BS, HKV, D));
    size_t pool = (size_t)pa_cache_pool_elems(&cache);
    CK(cudaMalloc(&cache.key, pool * 2));
    CK(cudaMalloc(&cache.value, pool * 2));
    cache.memory = PA_MEMORY_CUDA;
    fill_dev(cache.key, pool);
    fill_dev(cache.value, pool);

    /* block tables: a random permutation of the pool */
    int32_t *perm = malloc((size_t)nblocks * 4);
    for (int64_t i = 0; i < nblocks; i++) perm[i] = (int32_t)i;
    for (int64_t i = nblocks - 1; i > 0; i--) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int64_t j = (int64_t)(rng % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    pa_seq *seqs = calloc((size_t)num_seqs, sizeof *seqs);
    for (int s = 0; s < num_seqs; s++) {
        seqs[s].context_len = ctx_len;
        seqs[s].query_len = q_len;
        seqs[s].is_prefill = q_len > 1;
        seqs[s].block_table = perm + (int64_t)s * per_seq;
        seqs[s].num_blocks = per_seq;
    }
    pa_batch_config bc = {BS, nblocks, 0, NULL, NULL};
    pa_batch *batch = NULL;
    PK(pa_batch_create(&bc, seqs, num_seqs, &batch));
    const int64_t ntok = (int64_t)num_seqs * q_len;
    void *q, *k, *v, *out;
    CK(cudaMalloc(&q, (size_t)ntok * H * D * 2));
    CK(cudaMalloc(&k, (size_t)ntok * HKV * D * 2));
    CK(cudaMalloc(&v, (size_t)ntok * HKV * D * 2));
    CK(cudaMalloc(&out, (size_t)ntok * H * D * 2));
    fill_dev(q, (size_t)ntok * H * D);
    fill_dev(k, (size_t)ntok * HKV * D);
    fill_dev(v, (size_t)ntok * HKV * D);
    pa_forward_args a;
    memset(&a, 0, sizeof a);
    a.q = q, a.k = k, a.v = v, a.cache = &cache, a.out = out;
    pa_plan *plan = NULL;
    PK(pa_plan_create(ctx, layer, batch, &plan));
    for (int i = 0; i < 3; i++) PK(pa_attn_forward(ctx, layer, batch, plan, &a));
    PK(pa_context_synchronize(ctx));
    timer t;
    t.n = repeats;
    for (int i = 0; i < repeats; i++) {
        CK(cudaEventCreate(&t.e[i][0]));
        CK(cudaEventCreate(&t.e[i][1]));
        CK(cudaEventRecord(t.e[i][0], stream));
        PK(pa_attn_forward(ctx, layer, batch, plan, &a));
        CK(cudaEventRecord(t.e[i][1], stream));
    }
    float ms = median_ms(&t);
    for (int i = 0; i < repeats; i++) cudaEventDestroy(t.e[i][0]), cudaEventDestroy(t.e[i][1]);

    /* CUDA graph: forward captured on the context's stream (it must not allocate, copy from the
     * host or synchronize), replayed into a poisoned output, equal bit for bit to eager mode. */
    const size_t out_bytes = (size_t)ntok * H * D * 2;
    unsigned char *eager = malloc(out_bytes), *replay = malloc(out_bytes);
    PK(pa_attn_forward(ctx, layer, batch, plan, &a));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(eager, out, out_bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemset(out, 0xff, out_bytes)); /* bf16 0xffff: NaN */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    pa_status cs = pa_attn_forward(ctx, layer, batch, plan, &a);
    CK(cudaStreamEndCapture(stream, &graph));
    if (cs != PA_STATUS_OK) {
        fprintf(stderr, "graph: forward under capture failed: %s: %s\n", pa_status_name(cs), pa_last_error());
        exit(1);
    }
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(replay, out, out_bytes, cudaMemcpyDeviceToHost));
    const int same = !memcmp(eager, replay, out_bytes);
    printf("graph: forward captured and replayed: output %s eager mode bit for bit\n",
           same ? "equals" : "DIFFERS FROM");
    if (!same) graph_failures++;
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    free(eager);
    free(replay);
    const double S = ctx_len + q_len;
    *kv_bytes = (double)num_seqs * S * HKV * D * 2 * 2;
    /* causal: query t of a prefill sees ctx + t + 1 keys */
    double pairs = 0;
    for (int tq = 0; tq < q_len; tq++) pairs += ctx_len + tq + 1;
    *flops = 4.0 * num_seqs * pairs * D * H;
    pa_plan_destroy(plan);
    pa_batch_destroy(batch);
    pa_layer_destroy(layer);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(cache.key), cudaFree(cache.value);
    free(perm);
    free(seqs);
    return ms;
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    const pa_backend *be = pa_backend_find("cuda");
    char why[256] = "";
    if (!be || !pa_backend_available(be, why, sizeof why)) {
        printf("cuda_bench: the cuda backend cannot run here: %s\n", be ? why : "not built");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    pa_context_options opt = {0, 0, stream};
    pa_context *ctx = NULL;
    PK(pa_context_create(be, &opt, &ctx));

    /* copy bandwidth: 1 GiB device to device, bytes read + bytes written */
    const size_t cb = quick ? (size_t)1 << 20 : (size_t)1 << 30;
    void *src, *dst;
    CK(cudaMalloc(&src, cb));
    CK(cudaMalloc(&dst, cb));
    CK(cudaMemset(src, 1, cb));
    const int reps = quick ? 3 : 15;
    timer t;
    t.n = reps;
    for (int i = 0; i < 2; i++) CK(cudaMemcpyAsync(dst, src, cb, cudaMemcpyDeviceToDevice, stream));
    for (int i = 0; i < reps; i++) {
        CK(cudaEventCreate(&t.e[i][0]));
        CK(cudaEventCreate(&t.e[i][1]));
        CK(cudaEventRecord(t.e[i][0], stream));
        CK(cudaMemcpyAsync(dst, src, cb, cudaMemcpyDeviceToDevice, stream));
        CK(cudaEventRecord(t.e[i][1], stream));
    }
    const float copy_ms = median_ms(&t);
    const double copy_bw = 2.0 * (double)cb / (copy_ms * 1e-3); /* read + write */
    cudaFree(src), cudaFree(dst);
    printf("copy: %.3f ms for %zu MiB -> %.1f GB/s (read + write), %.1f GB/s read side\n", copy_ms,
           cb >> 20, copy_bw / 1e9, copy_bw / 2e9);

    double kvb, fl;
    const float dms = quick ? run_attn(ctx, stream, 4, 255, 1, 32, 8, 128, reps, &kvb, &fl)
                            : run_attn(ctx, stream, 64, 4095, 1, 32, 8, 128, reps, &kvb, &fl);
    const double dfrac = kvb / (dms * 1e-3) / copy_bw;
    printf("decode: batch %d x ctx %d, 32/8 x 128 bf16: %.3f ms, KV %.1f MiB -> %.1f GB/s = %.1f%% "
           "of copy (read+write) bandwidth (target >= 80%%)\n",
           quick ? 4 : 64, quick ? 256 : 4096, dms, kvb / 1048576.0, kvb / (dms * 1e-3) / 1e9,
           100.0 * kvb / (dms * 1e-3) / copy_bw);
    const float pms = quick ? run_attn(ctx, stream, 1, 0, 64, 32, 8, 128, reps, &kvb, &fl)
                            : run_attn(ctx, stream, 1, 0, 4096, 32, 8, 128, reps, &kvb, &fl);
    printf("prefill: %d-token causal prompt, 32/8 x 128 bf16: %.3f ms -> %.2f TFLOP/s (causal half "
           "counted)\n",
           quick ? 64 : 4096, pms, fl / (pms * 1e-3) / 1e12);
    printf("RESULT copy_gbps=%.1f decode_ms=%.4f decode_frac=%.3f prefill_ms=%.4f prefill_tflops=%.2f\n",
           copy_bw / 1e9, dms, dfrac, pms, fl / (pms * 1e-3) / 1e12);
    pa_context_destroy(ctx);
    cudaStreamDestroy(stream);
    return graph_failures ? 1 : 0;
}
