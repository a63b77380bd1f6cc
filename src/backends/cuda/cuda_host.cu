/* cuda_host.cu: the host side of the cuda backend: availability, contexts (device + stream),
 * plans (batch metadata and work lists uploaded once per step, workspace allocated once), the
 * forward launch sequence and the cache ops.
 *
 * Forward only launches kernels on the context's stream: no allocation, no copy from the host,
 * no synchronization, so an engine can capture a step in a CUDA graph (per-layer data such as
 * ALiBi slopes and sinks travel in the kernel's parameter block).
 */
#include "cuda_common.cuh"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- availability and info --------------------------------------------------------------- */

static void put_reason(char *reason, size_t size, const char *fmt, const char *a, const char *b)
{
    if (reason && size) snprintf(reason, size, fmt, a, b);
}

bool pa__cuda_available(char *reason, size_t reason_size)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        put_reason(reason, reason_size, "cudaGetDeviceCount failed: %s (%s)",
                   cudaGetErrorName(e), cudaGetErrorString(e));
        return false;
    }
    if (n <= 0) {
        put_reason(reason, reason_size, "%s%s", "no CUDA device present", "");
        return false;
    }
    return true;
}

static pthread_once_t g_info_once = PTHREAD_ONCE_INIT;
static char g_info[768];

static void make_info(void)
{
    int n = 0, rt = 0, drv = 0;
    (void)cudaRuntimeGetVersion(&rt);
    (void)cudaDriverGetVersion(&drv);
    int len = snprintf(g_info, sizeof g_info,
                       "cuda: checked on NVIDIA H200 and H100 (sm_90) with src/backends/cuda/devcheck.sh "
                       "(case grid, compute-sanitizer memcheck and racecheck); never run on sm_80\n"
                       "cuda: runtime %d.%d, driver %d.%d; tensor-core prefill tiles for 16-bit q == cache "
                       "dtype, tensor-core decode for that and for fp8 caches under 16-bit q (head 64/128), "
                       "SIMT kernels for the rest\n",
                       rt / 1000, (rt % 1000) / 10, drv / 1000, (drv % 1000) / 10);
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        snprintf(g_info + len, sizeof g_info - (size_t)len, "cuda: no device: %s\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device present");
        return;
    }
    for (int d = 0; d < n && len < (int)sizeof g_info - 1; d++) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        len += snprintf(g_info + len, sizeof g_info - (size_t)len,
                        "cuda: device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", d, prop.name,
                        prop.major, prop.minor, prop.multiProcessorCount,
                        (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    }
}

const char *pa__cuda_info(void)
{
    pthread_once(&g_info_once, make_info);
    return g_info;
}

/* ---- supports ------------------------------------------------------------------------------ */

pa_status pa__cuda_supports(const struct pa_layer *L)
{
    const pa_layer_config *c = &L->cfg;
    if (c->head_size < 1 || c->head_size > 512)
        return pa__fail(PA_STATUS_UNSUPPORTED, "cuda: head_size %d (supported: 1..512)",
                        c->head_size);
    if ((L->alibi || L->sinks || c->blocksparse.block_size > 0) && c->num_heads > PA_CU_MAXH)
        return pa__fail(PA_STATUS_UNSUPPORTED,
                        "cuda: num_heads %d with ALiBi, sinks or block-sparse (per-head data for "
                        "at most %d heads travels in the kernel parameters)",
                        c->num_heads, PA_CU_MAXH);
    if (c->num_kv_heads > 65535)
        return pa__fail(PA_STATUS_UNSUPPORTED, "cuda: num_kv_heads %d > 65535",
                        c->num_kv_heads);
    if (!pa__dtype_is_float(c->q_dtype) || !pa__dtype_is_float(c->kv_dtype) ||
        !pa__dtype_is_float(c->out_dtype) || !pa__dtype_valid(c->cache_dtype))
        return pa__fail(PA_STATUS_UNSUPPORTED, "cuda: dtype combination");
    return PA_STATUS_OK;
}

/* ---- contexts ------------------------------------------------------------------------------ */

pa_status pa__cuda_context_create(const pa_context_options *opt, void **impl)
{
    char why[256];
    if (!pa__cuda_available(why, sizeof why))
        return pa__fail(PA_STATUS_UNAVAILABLE, "cuda: %s", why);
    int n = 0;
    PA_CU_TRY(cudaGetDeviceCount(&n));
    const int dev = opt ? opt->device : 0;
    if (dev < 0 || dev >= n)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "options->device: %d, but %d CUDA device(s) present", dev, n);
    PA_CU_TRY(cudaSetDevice(dev));
    cudaDeviceProp prop;
    PA_CU_TRY(cudaGetDeviceProperties(&prop, dev));
    if (prop.major < 8)
        return pa__fail(PA_STATUS_UNAVAILABLE,
                        "cuda: device %d (%s) is sm_%d%d; this build has kernels for sm_80 and "
                        "sm_90 (and sm_80 code runs on newer 8.x/9.x devices)",
                        dev, prop.name, prop.major, prop.minor);
    pa_cu_ctx *ctx = (pa_cu_ctx *)pa__calloc(1, sizeof *ctx);
    if (!ctx) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cuda: context");
    ctx->device = dev;
    ctx->sm_count = prop.multiProcessorCount;
    ctx->smem_optin = prop.sharedMemPerBlockOptin;
    {
        const char *e = getenv("PAGEDATTN_CUDA_MMA"); /* 0: long queries on the SIMT kernel */
        ctx->use_mma = !(e && e[0] == '0');
        /* PAGEDATTN_CUDA_DECODE: which kernel short queries take (for A/B runs) */
        static const char *const names[] = {"off", "simt", "mmat", "mmat4"};
        const char *d = getenv("PAGEDATTN_CUDA_DECODE");
        ctx->decode_variant = PA_CU_DEC_DEFAULT;
        for (int i = 0; d && i < (int)(sizeof names / sizeof names[0]); i++)
            if (!strcmp(d, names[i])) ctx->decode_variant = i;
        if (d && !strcmp(d, "0")) ctx->decode_variant = PA_CU_DEC_OFF;
        /* PAGEDATTN_CUDA_SPLIT_KEYS: keys per decode split, 64..8192, multiple of 32 (A/B) */
        const char *sk = getenv("PAGEDATTN_CUDA_SPLIT_KEYS");
        const long v = sk ? strtol(sk, NULL, 10) : 0;
        ctx->split_keys = v >= 64 && v <= 8192 && v % 32 == 0 ? (int)v : PA_CU_SPLIT_KEYS;
        /* PAGEDATTN_CUDA_DEC_ORDER=heads|items: decode blocks of one work item's KV heads side
         * by side (the default: 76.2% against 75.2% of the copy bandwidth on an H200, decode
         * 64 x 4096 bf16), or each KV head's items side by side (A/B) */
        const char *order = getenv("PAGEDATTN_CUDA_DEC_ORDER");
        ctx->dec_heads_fast = !(order && !strcmp(order, "items"));
        /* PAGEDATTN_CUDA_PREFILL: the tensor-core prefill kernel (A/B runs; PA_CU_PF_* order) */
        static const char *const pnames[PA_CU_PF_COUNT] = {"fa", "fa-ldg", "ldm", "fa-st", "fa32"};
        const char *pf = getenv("PAGEDATTN_CUDA_PREFILL");
        ctx->prefill_variant = PA_CU_PF_FA;
        for (int i = 0; pf && i < (int)(sizeof pnames / sizeof pnames[0]); i++)
            if (!strcmp(pf, pnames[i])) ctx->prefill_variant = i;
        /* PAGEDATTN_CUDA_PDL: which launches are programmatic dependent launches (sm_90+; A/B):
         * letters w (cache write), a (attention kernels), c (split combine); 0: none */
        const char *pdl = getenv("PAGEDATTN_CUDA_PDL");
        ctx->pdl = PA_CU_PDL_DEFAULT;
        if (pdl) {
            ctx->pdl = 0;
            for (const char *q = pdl; *q; q++)
                ctx->pdl |= *q == 'w' ? PA_CU_PDL_WRITE : *q == 'a' ? PA_CU_PDL_ATTN : *q == 'c' ? PA_CU_PDL_COMB : 0u;
        }
        if (prop.major < 9) ctx->pdl = 0;
    }
    if (opt && opt->stream) {
        ctx->stream = (cudaStream_t)opt->stream;
        ctx->own_stream = false;
    } else {
        cudaError_t e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            pa__free(ctx);
            return pa__fail(PA_STATUS_DEVICE_ERROR, "cuda: cudaStreamCreate failed: %s",
                            cudaGetErrorString(e));
        }
        ctx->own_stream = true;
    }
    pa_status st = pa_cu_attn_prepare(ctx);
    if (st != PA_STATUS_OK) {
        pa__cuda_context_destroy(ctx);
        return st;
    }
    *impl = ctx;
    return PA_STATUS_OK;
}

void pa__cuda_context_destroy(void *impl)
{
    pa_cu_ctx *ctx = (pa_cu_ctx *)impl;
    if (!ctx) return;
    (void)cudaSetDevice(ctx->device);
    (void)cudaStreamSynchronize(ctx->stream);
    if (ctx->scratch_dev) (void)cudaFree(ctx->scratch_dev);
    if (ctx->own_stream) (void)cudaStreamDestroy(ctx->stream);
    (void)cudaGetLastError();
    pa__free(ctx->scratch_host);
    pa__free(ctx);
}

pa_status pa__cuda_synchronize(void *impl)
{
    pa_cu_ctx *ctx = (pa_cu_ctx *)impl;
    PA_CU_TRY(cudaSetDevice(ctx->device));
    PA_CU_TRY(cudaStreamSynchronize(ctx->stream));
    return PA_STATUS_OK;
}

/* Copies `bytes` of a host array into device scratch, stream-ordered (a pageable host copy
 * first, so the caller's array is free to change on return). */
static pa_status upload_scratch(pa_cu_ctx *ctx, const void *host, size_t bytes, void **dev)
{
    if (bytes > ctx->scratch_dev_cap) {
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
        if (ctx->scratch_dev) {
            PA_CU_TRY(cudaStreamSynchronize(ctx->stream)); /* earlier kernels may read it */
            PA_CU_TRY(cudaFree(ctx->scratch_dev));
            ctx->scratch_dev = NULL;
            ctx->scratch_dev_cap = 0;
        }
        PA_CU_TRY(cudaMalloc(&ctx->scratch_dev, cap));
        ctx->scratch_dev_cap = cap;
    }
    if (bytes > ctx->scratch_host_cap) {
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
        void *p = pa__alloc(cap);
        if (!p) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cuda: %zu bytes of scratch", cap);
        pa__free(ctx->scratch_host);
        ctx->scratch_host = p;
        ctx->scratch_host_cap = cap;
    }
    memcpy(ctx->scratch_host, host, bytes);
    PA_CU_TRY(cudaMemcpyAsync(ctx->scratch_dev, ctx->scratch_host, bytes, cudaMemcpyHostToDevice,
                              ctx->stream));
    *dev = ctx->scratch_dev;
    return PA_STATUS_OK;
}

/* ---- plans --------------------------------------------------------------------------------- */

/* The split rule: a function of the sequence's own lengths only. */
static void split_rule(int64_t qlen, int64_t kv_len, int64_t split_keys, int32_t *ns, int32_t *sl)
{
    if (qlen > PA_CU_SPLIT_MAX_Q || kv_len <= 2 * split_keys) {
        *ns = 1;
        *sl = 0;
        return;
    }
    /* the count nearest kv_len / split_keys (at least 2 here), then equal pieces rounded up to
     * whole chunks: no piece of a few keys past a multiple of split_keys (4097 keys: 8 pieces
     * of 544, not 8 of 512 and one of 1, whose block would cost a whole block's prologue,
     * epilogue and partials for one key) */
    int64_t n = (kv_len + split_keys / 2) / split_keys;
    if (n > PA_CU_MAX_SPLITS) n = PA_CU_MAX_SPLITS;
    int64_t len = (kv_len + n - 1) / n;
    len = (len + PA_CU_KCHUNK - 1) / PA_CU_KCHUNK * PA_CU_KCHUNK;
    n = (kv_len + len - 1) / len;
    *ns = (int32_t)n;
    *sl = (int32_t)len;
}

static size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

void pa__cuda_plan_destroy(void *plan)
{
    pa_cu_plan *p = (pa_cu_plan *)plan;
    if (!p) return;
    (void)cudaSetDevice(p->device);
    (void)cudaStreamSynchronize(p->stream); /* kernels of this plan may still run */
    if (p->dmem) (void)cudaFree(p->dmem);
    if (p->ws) (void)cudaFree(p->ws);
    (void)cudaGetLastError();
    pa__free(p->hmeta);
    pa__free(p);
}

pa_status pa__cuda_plan_create(void *impl, const struct pa_layer *layer,
                               const struct pa_batch *batch, void **out)
{
    pa_cu_ctx *ctx = (pa_cu_ctx *)impl;
    const pa_layer_config *c = &layer->cfg;
    const pa_batch_metadata *md = &batch->md;
    const pa_attn_type type = c->attn_type;
    const int32_t S = md->num_seqs, G = layer->group, H = c->num_heads, D = c->head_size;

    const size_t smem = pa_cu_attn_smem(D <= 32 ? 32 : D <= 64 ? 64 : D <= 96 ? 96 : D <= 128 ? 128
                                        : D <= 192 ? 192 : D <= 256 ? 256 : 512);
    if (smem > ctx->smem_optin)
        return pa__fail(PA_STATUS_UNSUPPORTED,
                        "cuda: head_size %d needs %zu bytes of shared memory per block; this "
                        "device allows %zu",
                        D, smem, ctx->smem_optin);

    /* Host-side arrays, sized first. */
    int32_t table_stride = 0;
    const int32_t *tables = NULL;
    const int64_t *slots = NULL;
    int64_t num_slots = 0;
    if (type == PA_ATTN_DECODER) {
        table_stride = md->max_blocks_per_seq;
        tables = md->block_tables;
        slots = md->slot_mapping;
        num_slots = md->num_tokens;
    } else if (type == PA_ATTN_ENCODER_DECODER) {
        table_stride = md->max_cross_blocks_per_seq;
        tables = md->cross_block_tables;
        slots = md->cross_slot_mapping;
        num_slots = md->num_encoder_tokens;
    }
    if (!tables) table_stride = 0;
    if (!slots) num_slots = 0;

    int64_t num_items = 0, num_comb = 0, num_parts = 0, num_small = 0, num_mitems = 0;
    /* Tensor-core tiles (unless PAGEDATTN_CUDA_MMA=0) for sequences with query_len > 16, when
     * the head size has a kernel; the forward uses them only for 16-bit q and cache dtypes. */
    const bool mma_ok = ctx->use_mma && (D == 64 || D == 128) &&
                        (type == PA_ATTN_DECODER || type == PA_ATTN_ENCODER_DECODER);
    int32_t *nsplit = (int32_t *)pa__calloc((size_t)S * 2, sizeof(int32_t));
    int64_t *kvl = (int64_t *)pa__calloc((size_t)S, sizeof(int64_t));
    if (!nsplit || !kvl) {
        pa__free(nsplit);
        pa__free(kvl);
        return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cuda: plan");
    }
    int32_t *split_len = nsplit + S;
    for (int32_t s = 0; s < S; s++) {
        const int64_t q = md->query_lens[s];
        kvl[s] = pa__kv_len(batch, type, s);
        split_rule(q, kvl[s], ctx->split_keys, &nsplit[s], &split_len[s]);
        const int64_t tiles = (q * G + PA_CU_TILE_ROWS - 1) / PA_CU_TILE_ROWS;
        num_items += tiles * nsplit[s];
        if (q <= PA_CU_SPLIT_MAX_Q)
            num_small += tiles * nsplit[s];
        else if (mma_ok)
            num_mitems += (q * G + PA_CU_MMA_ROWS - 1) / PA_CU_MMA_ROWS;
        if (nsplit[s] > 1) {
            num_comb += q;
            num_parts += q * H * nsplit[s];
        }
    }

    size_t off = 0;
    const size_t o_qstart = off; off = align16(off + (size_t)(S + 1) * 4);
    const size_t o_ctx = off; off = align16(off + (size_t)S * 4);
    const size_t o_kvl = off; off = align16(off + (size_t)S * 4);
    const size_t o_ns = off; off = align16(off + (size_t)S * 4);
    const size_t o_sl = off; off = align16(off + (size_t)S * 4);
    const size_t o_pb = off; off = align16(off + (size_t)S * 8);
    const size_t o_tab = off; off = align16(off + (size_t)S * (size_t)table_stride * 4);
    const size_t o_slots = off; off = align16(off + (size_t)num_slots * 8);
    const size_t o_items = off;
    off = align16(off + (size_t)(num_items + num_mitems) * sizeof(pa_cu_item));
    const size_t o_comb = off; off = align16(off + (size_t)num_comb * sizeof(pa_cu_comb));
    const size_t total = off;

    pa_cu_plan *p = (pa_cu_plan *)pa__calloc(1, sizeof *p);
    unsigned char *h = (unsigned char *)pa__alloc(total);
    if (!p || !h) {
        pa__free(p);
        pa__free(h);
        pa__free(nsplit);
        pa__free(kvl);
        return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cuda: plan (%zu bytes)", total);
    }
    memcpy(h + o_qstart, md->query_start_loc, (size_t)(S + 1) * 4);
    int32_t *hctx = (int32_t *)(h + o_ctx), *hkvl = (int32_t *)(h + o_kvl);
    int64_t *hpb = (int64_t *)(h + o_pb);
    int64_t pb = 0;
    for (int32_t s = 0; s < S; s++) {
        hctx[s] = md->context_lens[s];
        hkvl[s] = (int32_t)kvl[s];
        hpb[s] = pb; /* in partial rows: (token, head, split) */
        if (nsplit[s] > 1) pb += (int64_t)md->query_lens[s] * H * nsplit[s];
    }
    memcpy(h + o_ns, nsplit, (size_t)S * 4);
    memcpy(h + o_sl, split_len, (size_t)S * 4);
    if (table_stride) memcpy(h + o_tab, tables, (size_t)S * (size_t)table_stride * 4);
    if (num_slots) memcpy(h + o_slots, slots, (size_t)num_slots * 8);
    pa_cu_item *items = (pa_cu_item *)(h + o_items);
    pa_cu_comb *comb = (pa_cu_comb *)(h + o_comb);
    int64_t ni = 0, nc = 0;
    /* SIMT tiles: those of the short-query sequences first (num_small of them: the decode
     * kernel can take these), then the others */
    for (int pass = 0; pass < 2; pass++)
        for (int32_t s = 0; s < S; s++) {
            const int64_t q = md->query_lens[s];
            if ((q <= PA_CU_SPLIT_MAX_Q) != (pass == 0)) continue;
            for (int64_t r = 0; r < q * G; r += PA_CU_TILE_ROWS)
                for (int32_t sp = 0; sp < nsplit[s]; sp++) {
                    items[ni].seq = s;
                    items[ni].row0 = (int32_t)r;
                    items[ni].split = sp;
                    items[ni].pad_ = 0;
                    ni++;
                }
        }
    for (int32_t s = 0; s < S; s++)
        if (nsplit[s] > 1)
            for (int64_t t = 0; t < md->query_lens[s]; t++) {
                comb[nc].seq = s;
                comb[nc].token = (int32_t)t;
                nc++;
            }
    if (mma_ok) {
        /* after the SIMT list: the tensor-core tiles of the long-query sequences */
        for (int32_t s = 0; s < S; s++) {
            const int64_t q = md->query_lens[s];
            if (q <= PA_CU_SPLIT_MAX_Q) continue;
            for (int64_t r = 0; r < q * G; r += PA_CU_MMA_ROWS) {
                items[ni].seq = s;
                items[ni].row0 = (int32_t)r;
                items[ni].split = 0;
                items[ni].pad_ = 0;
                ni++;
            }
        }
    }
    /* partial row of (token t, head h, split) = part_base[s] + (t * H + h) * nsplit + split */
    const int64_t parts_total = num_parts;
    pa__free(nsplit);
    pa__free(kvl);

    p->device = ctx->device;
    p->stream = ctx->stream;
    p->num_heads = H;
    p->num_kv_heads = c->num_kv_heads;
    p->head_size = D;
    p->group = G;
    p->type = type;
    p->num_seqs = S;
    p->num_items = num_items;
    p->num_small = num_small;
    p->num_mitems = num_mitems;
    p->mma_ok = mma_ok;
    p->num_comb = num_comb;
    p->num_parts = parts_total;
    p->num_slots = num_slots;
    p->table_stride = table_stride;
    p->smem_bytes = pa_cu_attn_smem(D);

    cudaError_t e = cudaSetDevice(ctx->device);
    if (e == cudaSuccess) e = cudaMalloc(&p->dmem, total);
    if (e == cudaSuccess && parts_total > 0)
        e = cudaMalloc((void **)&p->ws, (size_t)parts_total * (size_t)(D + 2) * sizeof(float));
    /* Stream-ordered upload: the context's non-blocking stream does not wait for the legacy
     * default stream, and a plain cudaMemcpy from pageable memory may return before its DMA
     * lands, so kernels on ctx->stream could read the metadata half-written (seen on an H200:
     * a few grid cases wrong, clean under compute-sanitizer). The host copy lives until the plan
     * is destroyed (after a stream sync), so the copy is safe whatever memory pa__alloc gave. */
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(p->dmem, h, total, cudaMemcpyHostToDevice, ctx->stream);
    p->hmeta = h;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        pa__cuda_plan_destroy(p);
        return pa__fail(PA_STATUS_DEVICE_ERROR, "cuda: plan upload failed: %s",
                        cudaGetErrorString(e));
    }
    unsigned char *d = (unsigned char *)p->dmem;
    p->qstart = (const int32_t *)(d + o_qstart);
    p->ctx_lens = (const int32_t *)(d + o_ctx);
    p->kv_lens = (const int32_t *)(d + o_kvl);
    p->nsplit = (const int32_t *)(d + o_ns);
    p->split_len = (const int32_t *)(d + o_sl);
    p->part_base = (const int64_t *)(d + o_pb);
    p->tables = table_stride ? (const int32_t *)(d + o_tab) : NULL;
    p->slots = num_slots ? (const int64_t *)(d + o_slots) : NULL;
    p->items = (const pa_cu_item *)(d + o_items);
    p->small_items = p->items;
    p->mitems = p->items + num_items;
    p->comb = (const pa_cu_comb *)(d + o_comb);
    *out = p;
    return PA_STATUS_OK;
}

/* ---- device pointers ------------------------------------------------------------------------ */

/* Every non-NULL pointer in ptrs[] must be memory the context's device can address (device,
 * managed or pinned host memory): a kernel that dereferences a pageable host pointer faults, and
 * a fault poisons the whole CUDA context (every later call fails), so such input is refused here
 * with INVALID_ARGUMENT and nothing is launched. cudaPointerGetAttributes is no stream operation:
 * forward stays capturable. */
static pa_status check_dev_ptrs(const pa_cu_ctx *ctx, const char *op, const void *const *ptrs,
                                const char *const *names, int n)
{
    for (int i = 0; i < n; i++) {
        if (!ptrs[i]) continue;
        cudaPointerAttributes at;
        cudaError_t e = cudaPointerGetAttributes(&at, ptrs[i]);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return pa__fail(PA_STATUS_INVALID_ARGUMENT, "%s: %s (%p) is not CUDA memory: %s", op,
                            names[i], ptrs[i], cudaGetErrorString(e));
        }
        if (at.type == cudaMemoryTypeUnregistered)
            return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                            "%s: %s (%p) is pageable host memory; the cuda backend needs device, "
                            "managed or pinned memory", op, names[i], ptrs[i]);
        if (at.type == cudaMemoryTypeDevice && at.device != ctx->device)
            return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                            "%s: %s (%p) lives on device %d; this context runs on device %d", op,
                            names[i], ptrs[i], at.device, ctx->device);
    }
    return PA_STATUS_OK;
}

/* ---- forward ------------------------------------------------------------------------------- */

pa_status pa__cuda_forward(void *impl, const pa__fwd *f, void *plan)
{
    pa_cu_ctx *ctx = (pa_cu_ctx *)impl;
    const struct pa_layer *L = f->layer;
    const pa_layer_config *c = &L->cfg;
    const pa_forward_args *a = f->args;
    pa_cu_plan *p = (pa_cu_plan *)plan;
    bool temp = false;
    PA_CU_TRY(cudaSetDevice(ctx->device));
    if (!p) { /* the core normally passes a plan; a temporary one allocates (documented) */
        void *tp = NULL;
        pa_status st = pa__cuda_plan_create(impl, L, f->batch, &tp);
        if (st != PA_STATUS_OK) return st;
        p = (pa_cu_plan *)tp;
        temp = true;
    }
    const bool cached = c->attn_type == PA_ATTN_DECODER || c->attn_type == PA_ATTN_ENCODER_DECODER;
    {
        const void *ptrs[] = {a->q, a->k, a->v, a->out, a->lse, cached && a->cache ? a->cache->key : NULL,
                              cached && a->cache ? a->cache->value : NULL};
        static const char *const names[] = {"q", "k", "v", "out", "lse", "cache key pool",
                                            "cache value pool"};
        pa_status cs = check_dev_ptrs(ctx, "forward", ptrs, names, 7);
        if (cs != PA_STATUS_OK) return cs;
    }
    pa_status st = PA_STATUS_OK;
    const float ks = pa__dtype_is_fp8(c->cache_dtype) ? c->k_scale : 1.f;
    const float vs = pa__dtype_is_fp8(c->cache_dtype) ? c->v_scale : 1.f;

    /* 1. New K/V into the (cross) cache. */
    if (f->write_kv && cached && a->cache && p->slots) {
        st = pa_cu_launch_cache_write(ctx->stream, (ctx->pdl & PA_CU_PDL_WRITE) != 0, a->cache, (int)c->kv_dtype, a->k, a->k_row_stride,
                                      a->v, a->v_row_stride, p->slots, p->num_slots, ks, vs);
        if (st != PA_STATUS_OK) goto done;
    }

    /* 2. Attention. */
    {
        pa_cu_attn_params P;
        memset(&P, 0, sizeof P);
        P.num_heads = c->num_heads;
        P.num_kv_heads = c->num_kv_heads;
        P.head_size = c->head_size;
        P.group = L->group;
        P.attn_type = (int32_t)c->attn_type;
        P.scale = c->scale;
        P.softcap = c->logits_soft_cap;
        P.window_left = c->window_left;
        P.window_right = c->window_right;
        P.has_alibi = L->alibi != NULL;
        P.has_sinks = L->sinks != NULL;
        P.bs_block = c->blocksparse.block_size;
        P.bs_local = c->blocksparse.local_blocks;
        P.bs_vert = c->blocksparse.vert_stride > 0 ? c->blocksparse.vert_stride : 1;
        P.k_scale = ks;
        P.v_scale = vs;
        {
            const double f = (double)c->scale * (double)ks; /* (exact: two fp32 factors) */
            const float ff = (float)f; /* the fp32 product, rounded once */
            if (isfinite(ff) && ff >= FLT_MIN) {
                P.kmul = ff, P.kexp = 0;
            } else {
                int e;
                P.kmul = (float)frexp(f, &e);
                P.kexp = e;
            }
        }
        P.q_dtype = (int32_t)c->q_dtype;
        P.kv_dtype = (int32_t)c->kv_dtype;
        P.out_dtype = (int32_t)c->out_dtype;
        P.cache_dtype = (int32_t)c->cache_dtype;
        P.q = a->q;
        P.q_rs = a->q_row_stride;
        P.k = a->k;
        P.v = a->v;
        P.k_rs = a->k_row_stride;
        P.v_rs = a->v_row_stride;
        if (cached && a->cache) {
            P.kc = a->cache->key;
            P.vc = a->cache->value;
            P.c_block = a->cache->block_stride;
            P.c_token = a->cache->token_stride;
            P.c_head = a->cache->head_stride;
            P.c_bs = a->cache->block_size;
            const size_t es = pa_dtype_size(c->cache_dtype);
            P.vec8 = (es == 1 || es == 2) && c->head_size % 8 == 0 &&
                     P.c_block % 8 == 0 && P.c_token % 8 == 0 && P.c_head % 8 == 0 &&
                     (uintptr_t)P.kc % 16 == 0 && (uintptr_t)P.vc % 16 == 0;
        } else {
            P.c_bs = 1;
        }
        P.out = a->out;
        P.out_rs = a->out_row_stride;
        P.lse = a->lse;
        P.lse_ts = a->lse_token_stride;
        P.lse_hs = a->lse_head_stride;
        P.qstart = p->qstart;
        P.ctx_lens = p->ctx_lens;
        P.kv_lens = p->kv_lens;
        P.tables = p->tables;
        P.table_stride = p->table_stride;
        P.nsplit = p->nsplit;
        P.split_len = p->split_len;
        P.part_base = p->part_base;
        P.items = p->items;
        P.comb = p->comb;
        P.ws_acc = p->ws;
        P.ws_ml = p->ws ? p->ws + (size_t)p->num_parts * (size_t)c->head_size : NULL;
        const int nh = c->num_heads < PA_CU_MAXH ? c->num_heads : PA_CU_MAXH;
        for (int h = 0; h < nh; h++) {
            if (L->alibi) P.alibi[h] = L->alibi[h];
            if (L->sinks) P.sinks[h] = L->sinks[h];
            if (L->bs_offset) P.bs_off[h] = L->bs_offset[h];
        }
        if (cached && !P.tables) {
            /* Every sequence has zero keys here (no table rows): the kernel never reads one. */
            P.c_bs = P.c_bs > 0 ? P.c_bs : 1;
        }
        P.c_bs_log2 = -1; /* a power-of-two block size: table index and offset by shift and mask */
        for (int sh = 0; sh < 31; sh++)
            if (P.c_bs == (int32_t)1 << sh) P.c_bs_log2 = sh;
        st = pa_cu_attn_launch(ctx, p, &P);
    }

done:
    if (temp) pa__cuda_plan_destroy(p);
    return st;
}

/* ---- cache ops ----------------------------------------------------------------------------- */

pa_status pa__cuda_cache_write(void *impl, const pa_cache *c, pa_dtype src_dtype, const void *key,
                               int64_t k_row_stride, const void *value, int64_t v_row_stride,
                               const int64_t *slots, int64_t n, float k_scale, float v_scale)
{
    pa_cu_ctx *ctx = (pa_cu_ctx *)impl;
    if (n <= 0) return PA_STATUS_OK;
    if (c->memory != PA_MEMORY_CUDA)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "cache: the cuda backend writes device pools only (memory %d)",
                        (int)c->memory);
    PA_CU_TRY(cudaSetDevice(ctx->device));
    {
        const void *ptrs[] = {key, value, c->key, c->value};
        static const char *const names[] = {"key", "value", "cache key pool", "cache value pool"};
        pa_status cs = check_dev_ptrs(ctx, "cache_write", ptrs, names, 4);
        if (cs != PA_STATUS_OK) return cs;
    }
    const int64_t hd = (int64_t)c->num_kv_heads * c->head_size;
    if (k_row_stride == 0) k_row_stride = hd;
    if (v_row_stride == 0) v_row_stride = hd;
    void *dslots = NULL;
    pa_status st = upload_scratch(ctx, slots, (size_t)n * sizeof(int64_t), &dslots);
    if (st != PA_STATUS_OK) return st;
    const bool fp8 = pa__dtype_is_fp8(c->dtype);
    return pa_cu_launch_cache_write(ctx->stream, (ctx->pdl & PA_CU_PDL_WRITE) != 0, c, (int)src_dtype, key, k_row_stride, value,
                                    v_row_stride, (const int64_t *)dslots, n,
                                    fp8 ? k_scale : 1.f, fp8 ? v_scale : 1.f);
}

pa_status pa__cuda_copy_blocks(void *impl, const pa_cache *caches, int32_t num_layers,
                               const int64_t *pairs, int64_t num_pairs)
{
    pa_cu_ctx *ctx = (pa_cu_ctx *)impl;
    if (num_pairs <= 0 || num_layers <= 0) return PA_STATUS_OK;
    for (int32_t l = 0; l < num_layers; l++)
        if (caches[l].memory != PA_MEMORY_CUDA)
            return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                            "caches[%d]: the cuda backend copies blocks of device pools only",
                            (int)l);
    PA_CU_TRY(cudaSetDevice(ctx->device));
    for (int32_t l = 0; l < num_layers; l++) {
        const void *ptrs[] = {caches[l].key, caches[l].value};
        static const char *const names[] = {"cache key pool", "cache value pool"};
        pa_status cs = check_dev_ptrs(ctx, "copy_blocks", ptrs, names, 2);
        if (cs != PA_STATUS_OK) return cs;
    }
    void *dpairs = NULL;
    pa_status st = upload_scratch(ctx, pairs, (size_t)num_pairs * 2 * sizeof(int64_t), &dpairs);
    if (st != PA_STATUS_OK) return st;
    for (int32_t l = 0; l < num_layers; l++) {
        const pa_cache *c = &caches[l];
        st = pa_cu_launch_block_copy(ctx->stream, c, c->key, c, c->key, (const int64_t *)dpairs,
                                     num_pairs);
        if (st != PA_STATUS_OK) return st;
        st = pa_cu_launch_block_copy(ctx->stream, c, c->value, c, c->value,
                                     (const int64_t *)dpairs, num_pairs);
        if (st != PA_STATUS_OK) return st;
    }
    return PA_STATUS_OK;
}

/* One pool's blocks between host and device (or device and device through cudaMemcpy2D):
 * per block, per token, the num_kv_heads rows of head_size elements, heads head_stride apart.
 * Whole blocks go in one 2D copy when both sides store a block's (token, head) rows at one
 * pitch. */
static pa_status swap_pool(pa_cu_ctx *ctx, const pa_cache *src, const void *sp, const pa_cache *dst,
                           void *dp, const int64_t *pairs, int64_t num_pairs, cudaMemcpyKind kind)
{
    const size_t es = pa_dtype_size(src->dtype);
    const int32_t bs = src->block_size, H = src->num_kv_heads, D = src->head_size;
    const size_t width = (size_t)D * es;
    /* Rows r = t * H + h at pitch head_stride when token_stride == H * head_stride (NHD-like);
     * rows r = h * bs + t at pitch token_stride when head_stride == bs * token_stride (HND). */
    const bool nhd_s = src->token_stride == (int64_t)H * src->head_stride;
    const bool nhd_d = dst->token_stride == (int64_t)H * dst->head_stride;
    const bool hnd_s = src->head_stride == (int64_t)bs * src->token_stride;
    const bool hnd_d = dst->head_stride == (int64_t)bs * dst->token_stride;
    for (int64_t p = 0; p < num_pairs; p++) {
        const unsigned char *sb = (const unsigned char *)sp + (size_t)(pairs[2 * p] * src->block_stride) * es;
        unsigned char *db = (unsigned char *)dp + (size_t)(pairs[2 * p + 1] * dst->block_stride) * es;
        if (nhd_s && nhd_d) {
            PA_CU_TRY(cudaMemcpy2DAsync(db, (size_t)dst->head_stride * es, sb,
                                        (size_t)src->head_stride * es, width, (size_t)bs * H, kind,
                                        ctx->stream));
        } else if (hnd_s && hnd_d) {
            PA_CU_TRY(cudaMemcpy2DAsync(db, (size_t)dst->token_stride * es, sb,
                                        (size_t)src->token_stride * es, width, (size_t)bs * H, kind,
                                        ctx->stream));
        } else {
            for (int32_t t = 0; t < bs; t++)
                PA_CU_TRY(cudaMemcpy2DAsync(db + (size_t)(t * dst->token_stride) * es,
                                            (size_t)dst->head_stride * es,
                                            sb + (size_t)(t * src->token_stride) * es,
                                            (size_t)src->head_stride * es, width, (size_t)H, kind,
                                            ctx->stream));
        }
    }
    return PA_STATUS_OK;
}

pa_status pa__cuda_swap_blocks(void *impl, const pa_cache *src, const pa_cache *dst,
                               const int64_t *pairs, int64_t num_pairs)
{
    pa_cu_ctx *ctx = (pa_cu_ctx *)impl;
    if (num_pairs <= 0) return PA_STATUS_OK;
    PA_CU_TRY(cudaSetDevice(ctx->device));
    const bool sdev = src->memory == PA_MEMORY_CUDA, ddev = dst->memory == PA_MEMORY_CUDA;
    {
        const void *ptrs[] = {sdev ? src->key : NULL, sdev ? src->value : NULL,
                              ddev ? dst->key : NULL, ddev ? dst->value : NULL};
        static const char *const names[] = {"src key pool", "src value pool", "dst key pool",
                                            "dst value pool"};
        pa_status cs = check_dev_ptrs(ctx, "swap_blocks", ptrs, names, 4);
        if (cs != PA_STATUS_OK) return cs;
    }
    if (!sdev && !ddev) {
        /* Host to host: wait for queued device work that may still read or fill these pools. */
        PA_CU_TRY(cudaStreamSynchronize(ctx->stream));
        pa__cache_swap_blocks_host(src, dst, pairs, num_pairs);
        return PA_STATUS_OK;
    }
    if (sdev && ddev) {
        void *dpairs = NULL;
        pa_status st =
            upload_scratch(ctx, pairs, (size_t)num_pairs * 2 * sizeof(int64_t), &dpairs);
        if (st != PA_STATUS_OK) return st;
        st = pa_cu_launch_block_copy(ctx->stream, src, src->key, dst, dst->key,
                                     (const int64_t *)dpairs, num_pairs);
        if (st != PA_STATUS_OK) return st;
        return pa_cu_launch_block_copy(ctx->stream, src, src->value, dst, dst->value,
                                       (const int64_t *)dpairs, num_pairs);
    }
    const cudaMemcpyKind kind = sdev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    pa_status st = swap_pool(ctx, src, src->key, dst, dst->key, pairs, num_pairs, kind);
    if (st != PA_STATUS_OK) return st;
    return swap_pool(ctx, src, src->value, dst, dst->value, pairs, num_pairs, kind);
}

pa_status pa__cuda_merge_states(void *impl, const pa_merge_args *a)
{
    pa_cu_ctx *ctx = (pa_cu_ctx *)impl;
    PA_CU_TRY(cudaSetDevice(ctx->device));
    {
        const void *ptrs[] = {a->out_a, a->lse_a, a->out_b, a->lse_b, a->out, a->out_lse};
        static const char *const names[] = {"out_a", "lse_a", "out_b", "lse_b", "out", "out_lse"};
        pa_status cs = check_dev_ptrs(ctx, "merge_states", ptrs, names, 6);
        if (cs != PA_STATUS_OK) return cs;
    }
    int64_t ts = a->lse_token_stride, hs = a->lse_head_stride;
    if (ts == 0 && hs == 0) {
        ts = a->num_heads;
        hs = 1;
    }
    return pa_cu_launch_merge(ctx->stream, a, ts, hs);
}

/* ---- test hooks ---------------------------------------------------------------------------- */

static int t_malloc(void **ptr, size_t size) { return (int)cudaMalloc(ptr, size); }
static int t_free(void *ptr) { return (int)cudaFree(ptr); }
static int t_memcpy(void *dst, const void *src, size_t size, int kind)
{
    const cudaMemcpyKind k = kind == 0   ? cudaMemcpyHostToDevice
                             : kind == 1 ? cudaMemcpyDeviceToHost
                                         : cudaMemcpyDeviceToDevice;
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(dst, src, size, k);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return (int)e;
}
static int t_memset(void *ptr, int value, size_t size)
{
    cudaError_t e = cudaMemset(ptr, value, size);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return (int)e;
}
static const pa__cuda_test_hooks g_hooks = {t_malloc, t_free, t_memcpy, t_memset};

const pa__cuda_test_hooks *pa__cuda_testing(void) { return &g_hooks; }
