/* cuda_common.cuh: what the cuda backend's .cu files share: dtype conversions on the device,
 * error helpers, the context and plan structs, kernel parameter blocks and launchers.
 * Unverified on hardware: see cuda_backend.h. */
#ifndef PAGEDATTN_CUDA_COMMON_CUH
#define PAGEDATTN_CUDA_COMMON_CUH

#include "cuda_backend.h"

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* Kernel launches and dynamic shared memory go through these two macros so that the same
 * kernels also build, with g++, against the CPU emulator in emu/ (PA_CU_EMULATE), which runs
 * them with one fiber per CUDA thread: a check of the logic without a GPU. */
#ifdef PA_CU_EMULATE
#  include "emu/cuda_emu.h"
#else
#  define PA_CU_LAUNCH(kernel, grid, block, smem, stream, ...) \
      kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#  define PA_CU_DYN_SMEM(type, name) extern __shared__ type name[]
#  define PA_CU_STATIC_SMEM __shared__
/* PA_CU_LAUNCH_PDL: the launch of a kernel of a forward; with `pdl`, programmatic dependent
 * launch (sm_90): the kernel's blocks may start while the kernel before it on the stream still
 * runs its last blocks, and wait in pa_cu_pdl_begin() for that kernel's end and memory. Every
 * kernel launched so begins with pa_cu_pdl_begin(). Returns DEVICE_ERROR from the enclosing
 * function when the launch is refused. */
#  define PA_CU_LAUNCH_PDL(pdl_, kernel_, grid_, block_, smem_, stream_, ...)                 \
      do {                                                                                    \
          if (pdl_) {                                                                         \
              cudaLaunchAttribute pa_cu_at_[1];                                               \
              pa_cu_at_[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;           \
              pa_cu_at_[0].val.programmaticStreamSerializationAllowed = 1;                    \
              cudaLaunchConfig_t pa_cu_cfg_ = {};                                             \
              pa_cu_cfg_.gridDim = dim3(grid_);                                               \
              pa_cu_cfg_.blockDim = dim3(block_);                                             \
              pa_cu_cfg_.dynamicSmemBytes = (smem_);                                          \
              pa_cu_cfg_.stream = (stream_);                                                  \
              pa_cu_cfg_.attrs = pa_cu_at_;                                                   \
              pa_cu_cfg_.numAttrs = 1;                                                        \
              const cudaError_t pa_cu_le_ = cudaLaunchKernelEx(&pa_cu_cfg_, kernel_, __VA_ARGS__); \
              if (pa_cu_le_ != cudaSuccess)                                                   \
                  return pa__fail(PA_STATUS_DEVICE_ERROR, "cuda: launch of %s refused: %s",   \
                                  #kernel_, cudaGetErrorString(pa_cu_le_));                   \
          } else {                                                                            \
              PA_CU_LAUNCH(kernel_, grid_, block_, smem_, stream_, __VA_ARGS__);              \
          }                                                                                   \
      } while (0)
#endif

/* The first statement of every kernel a forward launches (see PA_CU_LAUNCH_PDL): lets the next
 * kernel on the stream launch (its blocks then wait here in turn; they take the SMs only as
 * this kernel's last blocks leave them), then waits until the kernel before this one has ended
 * and its writes are visible. Nothing of global memory is touched before it. Without a
 * programmatic launch (or before sm_90) both are no-ops. */
__device__ __forceinline__ void pa_cu_pdl_begin()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* ---- errors ------------------------------------------------------------------------------- */

/* Returns DEVICE_ERROR with the call and CUDA's reason when `call` fails. */
#define PA_CU_TRY(call)                                                                       \
    do {                                                                                      \
        cudaError_t pa_cu_err_ = (call);                                                      \
        if (pa_cu_err_ != cudaSuccess) {                                                      \
            (void)cudaGetLastError();                                                         \
            return pa__fail(PA_STATUS_DEVICE_ERROR, "cuda: %s failed: %s (%s)", #call,        \
                            cudaGetErrorName(pa_cu_err_), cudaGetErrorString(pa_cu_err_));    \
        }                                                                                     \
    } while (0)

/* After a kernel launch: launch-configuration errors surface here (no synchronization). */
#define PA_CU_CHECK_LAUNCH(what)                                                              \
    do {                                                                                      \
        cudaError_t pa_cu_err_ = cudaGetLastError();                                          \
        if (pa_cu_err_ != cudaSuccess)                                                        \
            return pa__fail(PA_STATUS_DEVICE_ERROR, "cuda: launching %s failed: %s (%s)",     \
                            (what), cudaGetErrorName(pa_cu_err_),                             \
                            cudaGetErrorString(pa_cu_err_));                                  \
    } while (0)

/* ---- dtypes on the device ------------------------------------------------------------------ */

/* fp8 -> f32, exact (the byte's value, not scaled). */
__host__ __device__ static inline float pa_cu_e4m3_to_f32(uint8_t x)
{
    const uint32_t sign = (uint32_t)(x >> 7) << 31;
    const uint32_t e = (x >> 3) & 15u, m = x & 7u;
    float mag;
    if (e == 15u && m == 7u) {
        uint32_t bits = sign | 0x7fc00000u;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    if (e == 0u) {
        mag = (float)m * 0.001953125f; /* m * 2^-9 */
    } else {
        uint32_t bits = ((e - 7u + 127u) << 23) | (m << 20);
        memcpy(&mag, &bits, 4);
    }
    return sign ? -mag : mag;
}
__host__ __device__ static inline float pa_cu_e5m2_to_f32(uint8_t x)
{
    /* E5M2 is the upper byte of an IEEE binary16. */
    return __half2float(__ushort_as_half((unsigned short)((unsigned)x << 8)));
}

/* Element i of a buffer of dtype `dt`, as f32 (fp8 unscaled). Branches are warp-uniform. */
__device__ __forceinline__ float pa_cu_load(int dt, const void *base, int64_t i)
{
    switch (dt) {
    case PA_DTYPE_F32: return ((const float *)base)[i];
    case PA_DTYPE_F16: return __half2float(((const __half *)base)[i]);
    case PA_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
    case PA_DTYPE_FP8_E4M3: return pa_cu_e4m3_to_f32(((const uint8_t *)base)[i]);
    case PA_DTYPE_FP8_E5M2: return pa_cu_e5m2_to_f32(((const uint8_t *)base)[i]);
    default: return __int_as_float(0x7fc00000);
    }
}

/* Stores f as element i, rounded once to nearest-even; fp8 saturates to the largest finite
 * value; NaN stays NaN with its sign, in the same codes as the library's pa_f32_to_* (the cuda
 * intrinsics' canonical NaNs differ, and the cache must hold what the reference writes).
 * pa_cu_to16 gives the bits pa_cu_store writes for an f16 or bf16 element. */
__device__ __forceinline__ uint16_t pa_cu_to16(float f, bool bf16)
{
    if (isnan(f)) { /* the library's NaN codes (pa_f32_to_*): sign kept, quiet */
        const uint32_t u = __float_as_uint(f);
        return bf16 ? (uint16_t)((u >> 16) | 0x0040u) : (uint16_t)(((u >> 31) << 15) | 0x7e00u);
    }
    return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(f)) : __half_as_ushort(__float2half_rn(f));
}
__device__ __forceinline__ void pa_cu_store(int dt, void *base, int64_t i, float f)
{
    if (dt == PA_DTYPE_F16 || dt == PA_DTYPE_BF16) {
        ((uint16_t *)base)[i] = pa_cu_to16(f, dt == PA_DTYPE_BF16);
        return;
    }
    if (isnan(f)) { /* the library's NaN codes (pa_f32_to_*): sign kept, quiet */
        const uint32_t u = __float_as_uint(f), sg = u >> 31;
        switch (dt) {
        case PA_DTYPE_F32: ((float *)base)[i] = f; return;
        case PA_DTYPE_FP8_E4M3: ((uint8_t *)base)[i] = (uint8_t)((sg << 7) | 0x7fu); return;
        case PA_DTYPE_FP8_E5M2: ((uint8_t *)base)[i] = (uint8_t)((sg << 7) | 0x7eu); return;
        default: return;
        }
    }
    switch (dt) {
    case PA_DTYPE_F32: ((float *)base)[i] = f; break;
    case PA_DTYPE_FP8_E4M3:
        ((uint8_t *)base)[i] = (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
        break;
    case PA_DTYPE_FP8_E5M2:
        ((uint8_t *)base)[i] = (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2);
        break;
    default: break;
    }
}

__host__ __device__ static inline bool pa_cu_is_fp8(int dt)
{
    return dt == PA_DTYPE_FP8_E4M3 || dt == PA_DTYPE_FP8_E5M2;
}

/* ---- context and plan ---------------------------------------------------------------------- */

typedef struct pa_cu_ctx {
    int device;
    cudaStream_t stream;
    bool own_stream;
    int sm_count;
    size_t smem_optin; /* the most dynamic shared memory one block may have */
    /* Growable scratch for host arrays (slots, block pairs) that cache ops upload: a pageable
     * host copy first (so the caller's array, pinned or not, is free on return), then a
     * stream-ordered copy into device scratch. */
    void *scratch_dev;
    size_t scratch_dev_cap;
    void *scratch_host;
    size_t scratch_host_cap;
    bool use_mma; /* tensor-core prefill tiles (PAGEDATTN_CUDA_MMA=0 at context creation: off) */
    int decode_variant; /* PA_CU_DEC_*: PAGEDATTN_CUDA_DECODE at context creation */
    int split_keys;     /* keys per decode split (PAGEDATTN_CUDA_SPLIT_KEYS, default PA_CU_SPLIT_KEYS) */
    bool dec_heads_fast; /* decode blocks ordered KV head fastest (PAGEDATTN_CUDA_DEC_ORDER=items: not) */
    int prefill_variant; /* PA_CU_PF_*: PAGEDATTN_CUDA_PREFILL at context creation */
    unsigned pdl; /* PA_CU_PDL_*: the launches made programmatic dependent (PAGEDATTN_CUDA_PDL) */
} pa_cu_ctx;

/* The tensor-core prefill kernels (PAGEDATTN_CUDA_PREFILL, for A/B runs; names in this order):
 * fa = FlashAttention-2 style tiles (4 warps x 32 rows, K/V chunks double-buffered, lazy
 * rescale, 16-bit outputs staged in shared memory and stored 16 bytes at a time): at head size
 * 128 without soft-cap, ALiBi or block-sparse pattern, 64-key chunks whose keys' pool offsets
 * are computed a chunk ahead into shared memory; otherwise 32-key chunks with the block-table
 * entries loaded a chunk ahead (per key with those features). fa-ldg = the 32-key kernels with
 * every table entry loaded where its copy is issued, ldm = the first tensor-core tiles (8 warps
 * x 16 rows, 32-key chunks, ldmatrix fragments), fa-st = fa with every output element stored
 * from the mma fragments (2-byte stores), fa32 = the 32-key kernels everywhere (fa-so, 32-key
 * chunks with the offsets in shared memory, 0.610 against fa's 0.587 ms: removed). The fa kernels need
 * 16-byte cache loads; without them ldm runs. */
enum { PA_CU_PF_FA, PA_CU_PF_FA_LDG, PA_CU_PF_LDM, PA_CU_PF_FA_ST, PA_CU_PF_FA32, PA_CU_PF_COUNT };

/* Launches that may be programmatic dependent launches (PA_CU_LAUNCH_PDL; PAGEDATTN_CUDA_PDL
 * letters w, a, c): the cache write, the attention kernels, the split-combine kernel. By
 * default the attention kernels only, which then start while the cache write ends. H200,
 * 2026-11-29, medians of two rounds, ms (none / a / all three / a and c): decode 64 x 4096 bf16
 * 0.3101 / 0.3091 / 0.3085 / 0.3083; a lone 32768-key decode 0.0693 / 0.0680 / 0.0721 / 0.0724;
 * 8 x 4096 0.0575 / 0.0566 / 0.0582 / 0.0584: the combine as a dependent of the decode kernel
 * costs small decodes 3-6%, the cache write as a dependent of the kernel before it changes
 * nothing measurable. */
enum { PA_CU_PDL_WRITE = 1u, PA_CU_PDL_ATTN = 2u, PA_CU_PDL_COMB = 4u };
#define PA_CU_PDL_DEFAULT PA_CU_PDL_ATTN

/* The kernels short queries take (PAGEDATTN_CUDA_DECODE=off|simt|mmat|mmat4, for A/B runs; the
 * default is PA_CU_DEC_DEFAULT): off = the general SIMT kernel, simt = the decode kernel without
 * tensor cores, mmat = tensor-core decode (S^T = K Q^T), mmat4 = capped at 128 registers. The
 * tensor-core ones apply to 16-bit q == cache dtype and to fp8 caches under 16-bit q (one
 * kernel, 4 blocks, whichever of the two), head size 64/128; other layers take simt. */
enum {
    PA_CU_DEC_OFF,
    PA_CU_DEC_SIMT,
    PA_CU_DEC_MMAT,
    PA_CU_DEC_MMAT4,
};
/* mmat: 69.5% of the copy bandwidth on an H200 (decode 64 x 4096 bf16); mmat4 63.7%, the
 * general SIMT kernel 17.4%; variants with an L2 prefetch of the next step (58.8%, and 54.9%
 * later) were removed (NOTES.md) */
#define PA_CU_DEC_DEFAULT PA_CU_DEC_MMAT

/* One unit of attention work: rows [row0, row0 + PA_CU_TILE_ROWS) of sequence `seq`'s
 * (token, head-in-group) rows, KV split `split`; the KV head is blockIdx.y. */
typedef struct pa_cu_item {
    int32_t seq, row0, split, pad_;
} pa_cu_item;

/* One (token) row whose splits the combine kernel merges. */
typedef struct pa_cu_comb {
    int32_t seq, token; /* token: index within the sequence */
} pa_cu_comb;

typedef struct pa_cu_plan {
    int device;
    cudaStream_t stream;
    int32_t num_heads, num_kv_heads, head_size, group;
    pa_attn_type type;
    int32_t num_seqs;
    void *dmem;  /* one allocation: every array below */
    void *hmeta; /* its host image, kept until the stream-ordered upload is surely done */
    const int32_t *qstart;    /* [S+1] */
    const int32_t *ctx_lens;  /* [S] query position offset (context_len) */
    const int32_t *kv_lens;   /* [S] keys per sequence for this attention type */
    const int32_t *nsplit;    /* [S] */
    const int32_t *split_len; /* [S] */
    const int64_t *part_base; /* [S] first partial row of the sequence (split sequences) */
    const int32_t *tables;    /* [S * table_stride] or NULL (encoder types) */
    int32_t table_stride;
    const int64_t *slots; /* [num_slots] write slots (decoder: per token; enc-dec: per encoder
                             token), or NULL */
    int64_t num_slots;
    /* every sequence as SIMT tiles: the short-query (query_len <= PA_CU_SPLIT_MAX_Q) ones
     * first, num_small of them (small_items == items), then the others */
    const pa_cu_item *items;
    int64_t num_items;
    /* mma_ok: the long-query sequences also as tensor-core tiles of PA_CU_MMA_ROWS rows
     * (mitems, after the SIMT list) */
    bool mma_ok;
    const pa_cu_item *small_items, *mitems;
    int64_t num_small, num_mitems;
    const pa_cu_comb *comb;
    int64_t num_comb;
    float *ws; /* partial results: acc [parts * head_size] then (m, l) [parts * 2] */
    int64_t num_parts;
    size_t smem_bytes;
} pa_cu_plan;

/* ---- attention kernel geometry ------------------------------------------------------------- */

#define PA_CU_WARPS 4
#define PA_CU_ROWS_PER_WARP 2
#define PA_CU_TILE_ROWS (PA_CU_WARPS * PA_CU_ROWS_PER_WARP)
#define PA_CU_KCHUNK 32
#define PA_CU_MMA_ROWS 128 /* tensor-core prefill tile rows */
#define PA_CU_MAXH 256 /* heads with per-head data (ALiBi, sinks, block-sparse) */
/* Split rule for decode-like sequences (query_len <= PA_CU_SPLIT_MAX_Q) longer than twice
 * PA_CU_SPLIT_KEYS: as many pieces as PA_CU_SPLIT_KEYS goes into the keys, to the nearest (at
 * most PA_CU_MAX_SPLITS), of equal length rounded up to whole PA_CU_KCHUNK chunks (the last
 * piece the rest); a function of the sequence's own lengths only, so results never depend on
 * the batch. The length trades per-block work (each piece's block loads its queries, stores
 * its partials, and the combine kernel reads them) against blocks to spread over the SMs for a
 * lone long decode: 704 on an H200 (2026-11-29, decode 64 x 4096 bf16, forward median, share of
 * the copy bandwidth: 512 -> 8 pieces 77.1%, 640 and 704 -> 6 pieces 82.0%, 768-896 -> 5 pieces
 * 81.6%, 1024 -> 4 pieces 79.6%, 1280 -> 3 pieces 87.2%; 1280 is not taken: a lone 32 K-key
 * decode would then fill 208 of the 396 decode-block slots, at 704 it fills 376).
 * (PAGEDATTN_CUDA_SPLIT_KEYS sets another length for A/B runs.) */
#define PA_CU_SPLIT_MAX_Q 16
#define PA_CU_SPLIT_KEYS 704
#define PA_CU_MAX_SPLITS 64

static inline size_t pa_cu_attn_smem(int head_size)
{
    return (size_t)(PA_CU_KCHUNK * (head_size + 1) + PA_CU_KCHUNK * head_size +
                    PA_CU_TILE_ROWS * head_size) *
           sizeof(float);
}

/* Everything the attention kernels read, by value (passed as a __grid_constant__ parameter, so
 * a CUDA graph captures it and nothing is copied in forward). */
typedef struct pa_cu_attn_params {
    int32_t num_heads, num_kv_heads, head_size, group;
    int32_t attn_type;
    float scale, softcap;
    int32_t window_left, window_right;
    int32_t has_alibi, has_sinks;
    int32_t bs_block, bs_local, bs_vert;
    float k_scale, v_scale; /* 1 for non-fp8 caches */
    /* The factor of the dot products over raw codes (scale * k_scale; scale for 16/32-bit
     * caches): kmul 2^kexp. kexp is 0 wherever the product rounds to a normal fp32 value (kmul
     * then that fp32 product, as before); beyond fp32's range or below its normals kmul is the
     * product's mantissa in [0.5, 1), and the dot times kmul is scaled by 2^kexp after (a product
     * that overflowed made every logit of such a layer inf or NaN: bench/NOTES.md, thirty-ninth
     * pass). */
    float kmul;
    int32_t kexp;
    int32_t vec8;           /* cache K/V loads 8 elements at a time (see load8) */
    int32_t dec_hfast;      /* decode grid: one dimension, KV head fastest (see dec_block) */
    int32_t fa_o16;         /* fa tiles: 16-bit outputs in 16-byte row pieces (0: per element) */
    int32_t q_dtype, kv_dtype, out_dtype, cache_dtype;
    const void *q;
    int64_t q_rs;
    const void *k, *v; /* encoder types: the new K/V rows */
    int64_t k_rs, v_rs;
    const void *kc, *vc; /* cache pools */
    int64_t c_block, c_token, c_head;
    int32_t c_bs;
    int32_t c_bs_log2; /* log2(c_bs) when c_bs is a power of two, else -1 */
    void *out;
    int64_t out_rs;
    float *lse;
    int64_t lse_ts, lse_hs;
    const int32_t *qstart, *ctx_lens, *kv_lens, *tables;
    int32_t table_stride;
    const int32_t *nsplit, *split_len;
    const int64_t *part_base;
    const pa_cu_item *items;
    const pa_cu_comb *comb;
    float *ws_acc, *ws_ml;
    float alibi[PA_CU_MAXH];
    float sinks[PA_CU_MAXH];
    int32_t bs_off[PA_CU_MAXH];
} pa_cu_attn_params;

/* Launchers (cuda_attn.cu). */
pa_status pa_cu_attn_prepare(const pa_cu_ctx *ctx);
pa_status pa_cu_attn_launch(const pa_cu_ctx *ctx, const pa_cu_plan *plan,
                            const pa_cu_attn_params *p);

/* Launchers (cuda_ops.cu). slots/pairs are device arrays. */
pa_status pa_cu_launch_cache_write(cudaStream_t stream, bool pdl, const pa_cache *c, int src_dtype,
                                   const void *key, int64_t k_rs, const void *value, int64_t v_rs,
                                   const int64_t *slots_dev, int64_t n, float k_scale,
                                   float v_scale);
/* Copies block pairs[2p] of `src` pool to block pairs[2p+1] of `dst` pool, element by element
 * through both caches' strides (same dtype and block geometry). Both pools on the device. */
pa_status pa_cu_launch_block_copy(cudaStream_t stream, const pa_cache *src, const void *src_pool,
                                  const pa_cache *dst, void *dst_pool, const int64_t *pairs_dev,
                                  int64_t num_pairs);
pa_status pa_cu_launch_merge(cudaStream_t stream, const pa_merge_args *a, int64_t lse_ts,
                             int64_t lse_hs);

#endif
