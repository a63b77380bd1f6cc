/* pagedattn bench --backend cuda: the cuda backend on the device, against the device's own copy
 * bandwidth and PyTorch's scaled_dot_product_attention, measured in the same run.
 *
 *   copy    : a 1 GiB device-to-device cudaMemcpy, bytes read + bytes written over time: the
 *             limit for decode (KV bytes read / time as a fraction of it).
 *   decode  : batch 64 x context 4096, 32 query / 8 KV heads x 128, block 16, NHD (or --layout
 *             hnd), the blocks of all sequences a random permutation of the pool, KV in bf16,
 *             f16 and fp8 e4m3; then bf16 decodes that fill the GPU less: one sequence of
 *             32768 keys, and 8 x 4096.
 *   prefill : one 4096-token causal prompt, same heads, bf16: FLOP/s with the causal half
 *             counted (4 * S(S+1)/2 * D * H), beside SDPA (flash) on the same shape, run through
 *             `python3` when it has torch with CUDA (the ratio is time-equivalent throughput).
 *   graph   : every case's forward captured in a CUDA graph and replayed into a NaN-poisoned
 *             output must give eager mode's output bit for bit (forward may not allocate, copy
 *             from the host or synchronize).
 * Timing: CUDA events on the context's stream, warm-up first, min/median/max of the repeats.
 * Environment read by the backend at context creation (for A/B runs): PAGEDATTN_CUDA_MMA=0
 * (long queries without tensor cores), PAGEDATTN_CUDA_DECODE=0 (short queries on the general
 * SIMT kernel) or =simt (the decode kernel without tensor cores). */
#define _GNU_SOURCE
#include "tool.h"

#include "pagedattn.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PA_TOOL_HAVE_CUDA

int pa_tool_bench_cuda(int quick, int repeats, int json, const char *filter, int layout)
{
    (void)quick, (void)repeats, (void)json, (void)filter, (void)layout;
    fprintf(stderr, "bench: this pagedattn was built without the cuda backend's bench "
                    "(configure with -DPAGEDATTN_CUDA=ON)\n");
    return 2;
}

#else

#include <cuda_runtime_api.h>

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "bench: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,             \
                    cudaGetErrorString(e_));                                                  \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define PK(call)                                                                              \
    do {                                                                                      \
        pa_status s_ = (call);                                                                \
        if (s_ != PA_STATUS_OK) {                                                             \
            fprintf(stderr, "bench: %s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,         \
                    pa_status_name(s_), pa_last_error());                                     \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

enum { MAXREP = 64 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* n elements of dtype dt, uniform in [-1, 1), into device memory (a host pattern of 8 Mi
 * elements repeated with a shifting offset so that rows differ). */
static void fill_dev(void *dev, pa_dtype dt, size_t n)
{
    const size_t chunk = (size_t)8 << 20, es = pa_dtype_size(dt);
    unsigned char *h = malloc((chunk + 4096) * es);
    if (!h) exit(1);
    for (size_t i = 0; i < chunk + 4096; i++) {
        float x = (float)(next_u32() >> 8) / 16777216.0f * 2.0f - 1.0f;
        pa_convert(dt, h + i * es, PA_DTYPE_F32, &x, 1, 1.0f);
    }
    for (size_t off = 0, k = 0; off < n; off += chunk, k++) {
        size_t m = n - off < chunk ? n - off : chunk;
        CK(cudaMemcpy((unsigned char *)dev + off * es, h + ((k * 397) % 4096) * es, m * es,
                      cudaMemcpyHostToDevice));
    }
    free(h);
}

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef struct stats {
    float min, med, max; /* ms */
} stats;

/* Times `reps` runs of fn(arg) on `stream` with events. */
static stats time_it(cudaStream_t stream, int reps, void (*fn)(void *), void *arg)
{
    cudaEvent_t e[MAXREP][2];
    float ms[MAXREP];
    if (reps > MAXREP) reps = MAXREP;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventCreate(&e[i][0]));
        CK(cudaEventCreate(&e[i][1]));
        CK(cudaEventRecord(e[i][0], stream));
        fn(arg);
        CK(cudaEventRecord(e[i][1], stream));
    }
    for (int i = 0; i < reps; i++) {
        CK(cudaEventSynchronize(e[i][1]));
        CK(cudaEventElapsedTime(&ms[i], e[i][0], e[i][1]));
        CK(cudaEventDestroy(e[i][0]));
        CK(cudaEventDestroy(e[i][1]));
    }
    qsort(ms, (size_t)reps, sizeof ms[0], cmpf);
    stats s = {ms[0], reps % 2 ? ms[reps / 2] : 0.5f * (ms[reps / 2 - 1] + ms[reps / 2]), ms[reps - 1]};
    return s;
}

typedef struct copy_arg {
    void *dst, *src;
    size_t bytes;
    cudaStream_t stream;
} copy_arg;
static void do_copy(void *p)
{
    copy_arg *a = p;
    CK(cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice, a->stream));
}

typedef struct fwd_arg {
    pa_context *ctx;
    pa_layer *layer;
    pa_batch *batch;
    pa_plan *plan;
    pa_forward_args a;
} fwd_arg;
static void do_fwd(void *p)
{
    fwd_arg *f = p;
    PK(pa_attn_forward(f->ctx, f->layer, f->batch, f->plan, &f->a));
}

typedef struct attn_result {
    stats t;
    double kv_bytes, flops;
    int graph_ok;
} attn_result;

/* One workload: num_seqs sequences of (ctx_len cached tokens, q_len new ones), KV in cache_dt,
 * q/k/v/out in the cache dtype (bf16 for an fp8 cache), on a fresh cache of the given layout
 * whose blocks are a random permutation of the pool. */
static attn_result run_attn(pa_context *ctx, cudaStream_t stream, int num_seqs, int ctx_len,
                            int q_len, pa_dtype cache_dt, int reps, pa_cache_layout layout)
{
    const int H = 32, HKV = 8, D = 128, BS = 16;
    const int per_seq = (ctx_len + q_len + BS - 1) / BS;
    const int64_t nblocks = (int64_t)num_seqs * per_seq;
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    const pa_dtype io = pa_dtype_size(cache_dt) == 2 ? cache_dt : PA_DTYPE_BF16;
    cfg.q_dtype = cfg.kv_dtype = cfg.out_dtype = io;
    cfg.cache_dtype = cache_dt;
    pa_layer *layer = NULL;
    PK(pa_layer_create(&cfg, &layer));
    pa_cache cache;
    PK(pa_cache_init(&cache, layout, cache_dt, nblocks, BS, HKV, D));
    const size_t pool = (size_t)pa_cache_pool_elems(&cache), ces = pa_dtype_size(cache_dt);
    CK(cudaMalloc(&cache.key, pool * ces));
    CK(cudaMalloc(&cache.value, pool * ces));
    cache.memory = PA_MEMORY_CUDA;
    fill_dev(cache.key, cache_dt, pool);
    fill_dev(cache.value, cache_dt, pool);

    int32_t *perm = malloc((size_t)nblocks * 4);
    pa_seq *seqs = calloc((size_t)num_seqs, sizeof *seqs);
    if (!perm || !seqs) exit(1);
    for (int64_t i = 0; i < nblocks; i++) perm[i] = (int32_t)i;
    for (int64_t i = nblocks - 1; i > 0; i--) {
        int64_t j = (int64_t)(next_u32() % (uint32_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int s = 0; s < num_seqs; s++) {
        seqs[s].context_len = ctx_len;
        seqs[s].query_len = q_len;
        seqs[s].is_prefill = q_len > 1;
        seqs[s].block_table = perm + (int64_t)s * per_seq;
        seqs[s].num_blocks = per_seq;
    }
    pa_batch_config bc = {BS, nblocks, 0, NULL, NULL};
    fwd_arg f;
    memset(&f, 0, sizeof f);
    f.ctx = ctx, f.layer = layer;
    PK(pa_batch_create(&bc, seqs, num_seqs, &f.batch));
    const int64_t ntok = (int64_t)num_seqs * q_len;
    const size_t out_bytes = (size_t)ntok * H * D * 2;
    void *q, *k, *v, *out;
    CK(cudaMalloc(&q, (size_t)ntok * H * D * 2));
    CK(cudaMalloc(&k, (size_t)ntok * HKV * D * 2));
    CK(cudaMalloc(&v, (size_t)ntok * HKV * D * 2));
    CK(cudaMalloc(&out, out_bytes));
    fill_dev(q, io, (size_t)ntok * H * D);
    fill_dev(k, io, (size_t)ntok * HKV * D);
    fill_dev(v, io, (size_t)ntok * HKV * D);
    f.a.q = q, f.a.k = k, f.a.v = v, f.a.cache = &cache, f.a.out = out;
    PK(pa_plan_create(ctx, layer, f.batch, &f.plan));
    for (int i = 0; i < 3; i++) do_fwd(&f);
    PK(pa_context_synchronize(ctx));

    attn_result R;
    R.t = time_it(stream, reps, do_fwd, &f);

    /* graph capture and replay, bit for bit against eager mode */
    unsigned char *eager = malloc(out_bytes), *replay = malloc(out_bytes);
    if (!eager || !replay) exit(1);
    do_fwd(&f);
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(eager, out, out_bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemset(out, 0xff, out_bytes)); /* 0xffff: NaN in f16 and bf16 */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    pa_status cs = pa_attn_forward(ctx, layer, f.batch, f.plan, &f.a);
    CK(cudaStreamEndCapture(stream, &graph));
    R.graph_ok = 0;
    if (cs == PA_STATUS_OK) {
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaGraphLaunch(exec, stream));
        CK(cudaStreamSynchronize(stream));
        CK(cudaMemcpy(replay, out, out_bytes, cudaMemcpyDeviceToHost));
        R.graph_ok = !memcmp(eager, replay, out_bytes);
        CK(cudaGraphExecDestroy(exec));
    } else {
        fprintf(stderr, "bench: forward under graph capture: %s: %s\n", pa_status_name(cs), pa_last_error());
    }
    CK(cudaGraphDestroy(graph));
    free(eager);
    free(replay);

    R.kv_bytes = (double)num_seqs * (ctx_len + q_len) * HKV * D * 2 * (double)ces;
    double pairs = 0; /* query t of a sequence sees ctx_len + t + 1 keys */
    for (int tq = 0; tq < q_len; tq++) pairs += ctx_len + tq + 1;
    R.flops = 4.0 * num_seqs * pairs * D * H;
    pa_plan_destroy(f.plan);
    pa_batch_destroy(f.batch);
    pa_layer_destroy(layer);
    CK(cudaFree(q));
    CK(cudaFree(k));
    CK(cudaFree(v));
    CK(cudaFree(out));
    CK(cudaFree(cache.key));
    CK(cudaFree(cache.value));
    free(perm);
    free(seqs);
    return R;
}

/* PyTorch SDPA (flash) on a causal prefill of S tokens, 32/8 x 128 bf16: median ms, or -1 with
 * the reason printed when python3/torch/CUDA is not there. */
static double sdpa_ms(int S, int reps)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 - 2>&1 <<'PY'\n"
             "import sys\n"
             "try:\n"
             "    import torch, torch.nn.functional as F\n"
             "    assert torch.cuda.is_available(), 'torch sees no CUDA device'\n"
             "except Exception as e:\n"
             "    print('SDPA_UNAVAILABLE', e); sys.exit(0)\n"
             "S, H, HKV, D = %d, 32, 8, 128\n"
             "q = torch.randn(1, H, S, D, device='cuda', dtype=torch.bfloat16)\n"
             "k = torch.randn(1, HKV, S, D, device='cuda', dtype=torch.bfloat16).repeat_interleave(H // HKV, 1)\n"
             "v = torch.randn(1, HKV, S, D, device='cuda', dtype=torch.bfloat16).repeat_interleave(H // HKV, 1)\n"
             "from torch.nn.attention import sdpa_kernel, SDPBackend\n"
             "with sdpa_kernel(SDPBackend.FLASH_ATTENTION):\n"
             "    for _ in range(3): F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
             "    ts = []\n"
             "    for _ in range(%d):\n"
             "        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)\n"
             "        a.record(); F.scaled_dot_product_attention(q, k, v, is_causal=True); b.record()\n"
             "        torch.cuda.synchronize(); ts.append(a.elapsed_time(b))\n"
             "ts.sort()\n"
             "print('SDPA_MS', ts[len(ts) // 2], torch.__version__)\n"
             "PY\n",
             S, reps);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[512];
    double ms = -1;
    while (fgets(line, sizeof line, p)) {
        double x;
        if (sscanf(line, "SDPA_MS %lf", &x) == 1) ms = x;
        else if (!strncmp(line, "SDPA_UNAVAILABLE", 16)) fprintf(stderr, "bench: SDPA not measured: %s", line + 17);
    }
    int rc = pclose(p);
    if (ms < 0 && rc != 0) fprintf(stderr, "bench: SDPA not measured: python3 exited with %d\n", rc);
    return ms;
}

int pa_tool_bench_cuda(int quick, int repeats, int json, const char *filter, int layout)
{
    /* --layout: NHD unless hnd was asked for */
    const pa_cache_layout lay = layout == (int)PA_LAYOUT_HND ? PA_LAYOUT_HND : PA_LAYOUT_NHD;
    const pa_backend *be = pa_backend_find("cuda");
    char why[256] = "";
    if (!be || !pa_backend_available(be, why, sizeof why)) {
        fprintf(stderr, "bench: the cuda backend cannot run here: %s\n", be ? why : "not built");
        return 2;
    }
    if (repeats < 1) repeats = quick ? 3 : 20; /* (0: not given; a given count is taken as it is) */
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    pa_context_options opt = {0, 0, stream};
    pa_context *ctx = NULL;
    PK(pa_context_create(be, &opt, &ctx));

    const size_t cb = quick ? (size_t)64 << 20 : (size_t)1 << 30;
    copy_arg ca = {NULL, NULL, cb, stream};
    CK(cudaMalloc(&ca.src, cb));
    CK(cudaMalloc(&ca.dst, cb));
    CK(cudaMemset(ca.src, 1, cb));
    do_copy(&ca), do_copy(&ca);
    const stats copy = time_it(stream, repeats, do_copy, &ca);
    CK(cudaFree(ca.src));
    CK(cudaFree(ca.dst));
    const double copy_bw = 2.0 * (double)cb / (copy.med * 1e-3); /* read + write, bytes/s */

    const char *mma = getenv("PAGEDATTN_CUDA_MMA"), *dec = getenv("PAGEDATTN_CUDA_DECODE");
    if (!json) {
        const char *ord = getenv("PAGEDATTN_CUDA_DEC_ORDER"), *sk = getenv("PAGEDATTN_CUDA_SPLIT_KEYS");
        printf("pagedattn %s bench, cuda backend on %s (sm_%d%d, %d SMs), %s cache%s%s%s%s%s%s%s%s\n",
               pa_version_string(), prop.name, prop.major, prop.minor, prop.multiProcessorCount,
               lay == PA_LAYOUT_HND ? "HND" : "NHD", quick ? ", --quick" : "",
               mma && mma[0] == '0' ? ", PAGEDATTN_CUDA_MMA=0" : "", dec ? ", PAGEDATTN_CUDA_DECODE=" : "",
               dec ? dec : "", ord ? ", PAGEDATTN_CUDA_DEC_ORDER=" : "", ord ? ord : "",
               sk ? ", PAGEDATTN_CUDA_SPLIT_KEYS=" : "", sk ? sk : "");
        printf("copy bandwidth (device to device, %zu MiB, read + write): %.1f GB/s "
               "(min/median/max %.3f/%.3f/%.3f ms)\n\n", cb >> 20, copy_bw / 1e9, copy.min, copy.med, copy.max);
        printf("%d timed repeats per row (CUDA events), after a warm-up; decode: KV bytes read / median time, "
               "frac = that over the copy bandwidth (target >= 80%% for bf16)\n", repeats);
        printf("%-38s %9s %9s %9s %9s %9s %7s %5s\n", "case", "min ms", "med ms", "max ms", "GB/s",
               "TFLOP/s", "frac", "graph");
    } else {
        printf("{\"device\": \"%s\", \"copy_gbps\": %.1f, \"repeats\": %d, \"results\": [", prop.name,
               copy_bw / 1e9, repeats);
    }
    const int B = quick ? 8 : 64, C = quick ? 1023 : 4095, S = quick ? 512 : 4096;
    /* the target's batch in three KV dtypes, then bf16 decodes that fill the GPU less: a lone
     * long sequence (its splits are all the blocks there are) and a batch of 8 */
    static const struct {
        int lone;
        pa_dtype dt;
    } dcase[] = {{0, PA_DTYPE_BF16}, {0, PA_DTYPE_F16}, {0, PA_DTYPE_FP8_E4M3}, {1, PA_DTYPE_BF16}, {2, PA_DTYPE_BF16}};
    const int ndec = (int)(sizeof dcase / sizeof dcase[0]);
    int fails = 0, nres = 0;
    double prefill_ms = -1, prefill_tflops = 0;
    for (int i = 0; i <= ndec; i++) {
        const int decode = i < ndec;
        if (filter && !strstr(decode ? "decode" : "prefill", filter)) continue;
        const int nb = !decode ? 1 : dcase[i].lone == 1 ? 1 : dcase[i].lone == 2 ? 8 : B;
        const int nc = decode && dcase[i].lone == 1 ? (quick ? 8191 : 32767) : C;
        const attn_result R = decode ? run_attn(ctx, stream, nb, nc, 1, dcase[i].dt, repeats, lay)
                                     : run_attn(ctx, stream, 1, 0, S, PA_DTYPE_BF16, repeats, lay);
        char name[64];
        if (decode) snprintf(name, sizeof name, "decode %d x %d, KV %s", nb, nc + 1, pa_dtype_name(dcase[i].dt));
        else snprintf(name, sizeof name, "prefill %d causal bf16", S);
        const double gbs = R.kv_bytes / (R.t.med * 1e-3) / 1e9, tfl = R.flops / (R.t.med * 1e-3) / 1e12;
        const double frac = decode ? gbs * 1e9 / copy_bw : 0;
        if (!decode) prefill_ms = R.t.med, prefill_tflops = tfl;
        fails += !R.graph_ok;
        char fr[16] = "-";
        if (decode) snprintf(fr, sizeof fr, "%.1f%%", 100 * frac);
        if (!json)
            printf("%-38s %9.4f %9.4f %9.4f %9.1f %9.2f %7s %5s\n", name, R.t.min, R.t.med, R.t.max, gbs, tfl,
                   fr, R.graph_ok ? "ok" : "FAIL");
        if (json)
            printf("%s\n  {\"case\": \"%s\", \"min_ms\": %.4f, \"median_ms\": %.4f, \"max_ms\": %.4f, "
                   "\"gbps\": %.1f, \"tflops\": %.3f, \"frac_copy_bw\": %.3f, \"graph_ok\": %s}",
                   nres ? "," : "", name, R.t.min, R.t.med, R.t.max, gbs, tfl, frac,
                   R.graph_ok ? "true" : "false");
        nres++;
    }
    const double sd = prefill_ms > 0 ? sdpa_ms(S, repeats) : -1;
    if (!json) {
        if (sd > 0) {
            const double fl = 4.0 * ((double)S * (S + 1) / 2) * 128 * 32;
            printf("\nPyTorch SDPA (flash), prefill %d causal bf16: %.4f ms = %.2f TFLOP/s; pagedattn / SDPA "
                   "throughput: %.3fx (target >= 0.8x)\n", S, sd, fl / (sd * 1e-3) / 1e12, sd / prefill_ms);
        } else if (prefill_ms > 0) {
            printf("\nPyTorch SDPA: not measured (see above); pagedattn prefill %.2f TFLOP/s\n", prefill_tflops);
        }
    } else {
        printf("\n], \"sdpa_prefill_ms\": %.4f, \"prefill_vs_sdpa\": %.3f}\n", sd, sd > 0 ? sd / prefill_ms : 0.0);
    }
    pa_context_destroy(ctx);
    CK(cudaStreamDestroy(stream));
    if (fails) fprintf(stderr, "bench: %d case(s) gave a different output when replayed from a CUDA graph\n", fails);
    return fails ? 1 : 0;
}

#endif
