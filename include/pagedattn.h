/*
 * pagedattn.h: paged attention for LLM serving engines, as a plain C11 library.
 *
 * One engine step, in the words of this header:
 *
 *   1. Describe each attention layer once:     pa_layer_config -> pa_layer_create()
 *   2. Allocate (or wrap) its paged KV cache:  pa_cache (a view: pointers + geometry + strides)
 *   3. Describe the step's batch:              pa_seq[] -> pa_batch_create()
 *   4. Open a backend once:                    pa_backend_select() -> pa_context_create()
 *   5. Plan the step once, for every layer:    pa_plan_create()
 *   6. For every layer: write the new K/V into the cache and attend:  pa_attn_forward()
 *
 * Numerics (the contract every backend meets; ../DESIGN.md in the repository has the long form).
 * For a sequence with context_len c and query_len q, new token t sits at absolute position
 * p = c + t and, after this step's K/V were written, sees the keys j in [0, c + q):
 *
 *   s_j  = scale * dot(q_p, k_j)                      K, V dequantized from the cache dtype
 *   s_j  = cap * tanh(s_j / cap)                      if logits_soft_cap > 0
 *   s_j -= slope_h * |j - p|                          if ALiBi slopes are given
 *   visible(j): decoder: j <= p, and p - left <= j <= p + right for a local window
 *               (-1 = unbounded side), and the block-sparse rule if set;
 *               encoder, encoder_only, encoder_decoder: every key of the sequence
 *   out  = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) [+ exp(sink_h - m)])
 *   lse  = m + ln(denominator)                        natural log, fp32
 *
 * A row that sees no key and has no sink yields out = 0 and lse = -inf, never NaN. Keys beyond a
 * sequence's length never touch its result, whatever the cache holds there (NaN included).
 * Non-finite inputs the row does read propagate as in IEEE arithmetic, never silently dropped:
 * a visible logit that is NaN or +inf (from NaN or infinite q or k values, or a dot product
 * beyond fp32's range: the sums are fp32; the soft-cap makes +-inf +-cap first) makes every
 * element of the row's out and its lse NaN; a NaN or infinite v value reaches the out elements
 * it contributes to, including a visible key's whose logit is -inf (its weight exp(-inf - m) =
 * 0 times NaN is NaN; an infinite v whose fp32 weight is 0, as NaN), as long as the row has a
 * finite m (some finite visible logit, or a sink); a row whose visible logits are all -inf and
 * that has no sink sees nothing (out 0, lse -inf). The scale multiplies the dot product: scale q
 * need not be finite (a scale above 1 over query values near FLT_MAX scores as scale * dot(q,
 * k) does).
 * Query head h reads KV head h / (num_heads / num_kv_heads).
 * The caller's floating-point mode does not reach the results: every call that computes runs
 * (on all its threads) in the C default environment, round to nearest even with subnormals
 * kept, even where the caller flushes subnormals to zero (-ffast-math start-up code,
 * torch.set_flush_denormal) or rounds otherwise, and gives the caller's environment back,
 * exception flags included, before it returns.
 *
 * Errors: every function that can fail returns a pa_status. A failing call changes nothing (no
 * cache slot, no output element is written) and leaves a reason text, readable with
 * pa_last_error() on the same thread, naming the argument, the index and what was expected.
 *
 * Ownership: the library never keeps or frees a pointer the caller passed, beyond the call,
 * except where a function says so. Handles (pa_layer, pa_batch, pa_context, pa_plan) are
 * created and destroyed in pairs; destroying NULL does nothing. Layers and batches never
 * change after creation: one may be read by several threads at once (e.g. one batch used by the
 * contexts of several threads). Contexts and plans are used by one thread at a time (a plan
 * belongs to its context). Distinct handles may be used from distinct threads. The rule is
 * checked: a call that runs work on a context (forward, plan creation, set_num_threads,
 * synchronize, and cache operations a backend runs itself) while another call on it is running
 * fails with INVALID_ARGUMENT ("in use") and changes nothing; it does not wait. Queries that only
 * read a handle (pa_context_num_threads, pa_context_backend, pa_layer_get_config, ...) and the
 * destroy functions are not checked: they must not overlap a call that changes the handle. A
 * plan is written by the forward that runs it (its partial results), which the context's check
 * keeps to one at a time; it may be destroyed before or after its context.
 */
#ifndef PAGEDATTN_H
#define PAGEDATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(PAGEDATTN_SHARED)
#  ifdef PAGEDATTN_BUILDING
#    define PA_API __declspec(dllexport)
#  else
#    define PA_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__)
#  define PA_API __attribute__((visibility("default")))
#else
#  define PA_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */

#define PAGEDATTN_VERSION_MAJOR 0
#define PAGEDATTN_VERSION_MINOR 1
#define PAGEDATTN_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH: 0.1.0 is 100. */
#define PAGEDATTN_VERSION_NUMBER \
    (PAGEDATTN_VERSION_MAJOR * 10000 + PAGEDATTN_VERSION_MINOR * 100 + PAGEDATTN_VERSION_PATCH)
#define PAGEDATTN_VERSION_STRING "0.1.0"

/* The version of the library actually linked, to compare with PAGEDATTN_VERSION_NUMBER: a
 * program built against one header and run against another library can detect it. */
PA_API int pa_version_number(void);
PA_API const char *pa_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------- */

/* X(name, value, message): the one list from which the enum, pa_status_name() and
 * pa_strerror() are generated. */
#define PA_STATUS_LIST(X)                                                                      \
    X(OK, 0, "success")                                                                        \
    X(INVALID_ARGUMENT, 1, "an argument has an invalid value")                                 \
    X(NULL_POINTER, 2, "a required pointer is NULL")                                           \
    X(OUT_OF_RANGE, 3, "an index, block id, slot or length is out of range")                   \
    X(SHAPE_MISMATCH, 4, "shapes or geometries of the arguments do not agree")                 \
    X(UNSUPPORTED, 5, "the backend does not support this configuration")                       \
    X(NOT_FOUND, 6, "no backend of that name")                                                 \
    X(UNAVAILABLE, 7, "the backend is built but cannot run on this machine")                   \
    X(OUT_OF_MEMORY, 8, "memory allocation failed")                                            \
    X(OVERFLOW, 9, "a size computation overflows")                                             \
    X(DEVICE_ERROR, 10, "the accelerator runtime reported an error")                           \
    X(INTERNAL, 11, "internal error (a bug in pagedattn; please report it)")

typedef enum pa_status {
#define PA__STATUS_ENUM(name, value, msg) PA_STATUS_##name = value,
    PA_STATUS_LIST(PA__STATUS_ENUM)
#undef PA__STATUS_ENUM
} pa_status;

/* "PA_STATUS_OUT_OF_RANGE" etc.; "PA_STATUS_UNKNOWN" for a value not in the list. */
PA_API const char *pa_status_name(pa_status status);
/* One-line generic description of a status (static text). */
PA_API const char *pa_strerror(pa_status status);
/* The reason for the last failure on the calling thread ("" if none): which argument, which
 * index, what was expected. Valid until the next failing call on this thread. */
PA_API const char *pa_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Data types and conversions
 * ------------------------------------------------------------------------------------------- */

typedef enum pa_dtype {
    PA_DTYPE_F32 = 0,      /* IEEE binary32 */
    PA_DTYPE_F16 = 1,      /* IEEE binary16 */
    PA_DTYPE_BF16 = 2,     /* bfloat16: the upper half of a binary32 */
    PA_DTYPE_FP8_E4M3 = 3, /* OCP fp8 E4M3 ("e4m3fn"): bias 7, no inf, NaN = S.1111.111, max 448 */
    PA_DTYPE_FP8_E5M2 = 4, /* OCP fp8 E5M2: bias 15, inf and NaN as in IEEE, max finite 57344 */
    PA_DTYPE_COUNT_ = 5
} pa_dtype;

/* Bytes per element (4, 2, 2, 1, 1); 0 for an invalid dtype. */
PA_API size_t pa_dtype_size(pa_dtype dtype);
/* "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"; NULL for an invalid dtype. */
PA_API const char *pa_dtype_name(pa_dtype dtype);
/* Parses the names above and the aliases "float32", "float16", "half", "bfloat16", "fp8" (=
 * e4m3, as in vLLM), "e4m3", "e5m2". INVALID_ARGUMENT for anything else; NULL_POINTER for a
 * NULL name or out. */
PA_API pa_status pa_dtype_parse(const char *name, pa_dtype *out);

/* Scalar conversions. Narrowing rounds to nearest, ties to even; NaN stays NaN (sign kept);
 * f16/bf16 keep infinities and overflow to infinity as IEEE does; fp8 saturates: every value
 * beyond the largest finite one, infinities included, becomes +-448 (E4M3) or +-57344 (E5M2),
 * as vLLM's SATFINITE conversion does. Widening is exact. */
PA_API float pa_f16_to_f32(uint16_t h);
PA_API uint16_t pa_f32_to_f16(float f);
PA_API float pa_bf16_to_f32(uint16_t b);
PA_API uint16_t pa_f32_to_bf16(float f);
PA_API float pa_fp8e4m3_to_f32(uint8_t x);
PA_API uint8_t pa_f32_to_fp8e4m3(float f);
PA_API float pa_fp8e5m2_to_f32(uint8_t x);
PA_API uint8_t pa_f32_to_fp8e5m2(float f);

/* Converts n elements of src_dtype into dst_dtype. Into fp8 the value is first divided by scale
 * (quantization: quant(x / scale)); out of fp8 it is multiplied by scale after decoding
 * (dequantization); fp8 to fp8 and pairs without fp8 ignore its value (it must still be finite
 * and > 0). src and dst must not overlap.
 * INVALID_ARGUMENT for a bad dtype, a non-finite or non-positive scale, or overlapping buffers;
 * NULL_POINTER for NULL buffers with n > 0; OVERFLOW if n elements exceed the address space. */
PA_API pa_status pa_convert(pa_dtype dst_dtype, void *dst, pa_dtype src_dtype, const void *src,
                            size_t n, float scale);

/* ---------------------------------------------------------------------------------------------
 * Layers (vLLM's AttentionImpl): the fixed configuration of one attention layer
 * ------------------------------------------------------------------------------------------- */

typedef enum pa_attn_type {
    PA_ATTN_DECODER = 0,         /* causal self-attention over the paged KV cache */
    PA_ATTN_ENCODER = 1,         /* bidirectional over the step's own tokens, no cache (the
                                    encoder of an encoder-decoder model) */
    PA_ATTN_ENCODER_ONLY = 2,    /* bidirectional over the step's own tokens, no cache (BERT) */
    PA_ATTN_ENCODER_DECODER = 3, /* cross-attention: decoder queries over the encoder's K/V, held
                                    in a separate cross cache */
    PA_ATTN_TYPE_COUNT_ = 4
} pa_attn_type;

/* "decoder", "encoder", "encoder_only", "encoder_decoder"; NULL if invalid. */
PA_API const char *pa_attn_type_name(pa_attn_type type);

/* vLLM's block-sparse pattern (vllm/attention/ops/blocksparse_attention). With sparse blocks of
 * block_size tokens, query position p in block qb = p / block_size may see key j in block
 * kb = j / block_size iff kb <= qb and (qb - kb < local_blocks or (kb + o_h) % vert_stride == 0),
 * and j <= p, where for query head h (global index g = tp_rank * num_heads + h):
 *   head_sliding_step >= 0:  o_h = g * head_sliding_step + 1
 *   head_sliding_step <  0:  o_h = (tp_rank * num_kv_heads + h / group) * (-head_sliding_step) + 1
 *                            (vLLM's homo_head_group: the pattern slides along KV heads)
 * homo_head != 0 forces head_sliding_step = 0 (every head has the same pattern). vLLM derives
 * the default step as max(1, vert_stride / total_num_heads); pass what vLLM would use.
 * block_size == 0 disables block sparsity; it requires the decoder attention type. */
typedef struct pa_blocksparse {
    int32_t block_size;        /* tokens per sparse block (vLLM's blocksparse block_size, e.g. 64),
                                  0 = off */
    int32_t local_blocks;      /* >= 0: the qb - kb < local_blocks band is always visible */
    int32_t vert_stride;       /* >= 1: every vert_stride-th block column is visible */
    int32_t homo_head;         /* != 0: same pattern for every head */
    int32_t head_sliding_step; /* see above; negative = slide per KV head */
    int32_t tp_rank;           /* tensor-parallel rank: heads are numbered globally */
} pa_blocksparse;

typedef struct pa_layer_config {
    int32_t num_heads;    /* query heads, 1..65536 */
    int32_t num_kv_heads; /* KV heads, >= 1, divides num_heads (MHA: equal; MQA: 1) */
    int32_t head_size;    /* 1..512 (a backend may support fewer; see pa_backend_supports) */
    float scale;          /* logit scale, finite and > 0 (usually 1/sqrt(head_size); the
                             default from pa_layer_config_init) */
    pa_attn_type attn_type;

    /* Local attention window: key j is visible from position p iff p - window_left <= j <=
     * p + window_right; -1 = unbounded on that side. Default (-1, -1). For the decoder type
     * window_right > 0 changes nothing (causal already hides j > p). encoder_decoder layers
     * take no window and no ALiBi (decoder and encoder positions are unrelated). */
    int32_t window_left, window_right;
    /* vLLM's sliding_window W (> 0): the same as window (W - 1, 0): at most W keys, the token
     * itself included. 0 = none. Must not be combined with window_left/right other than -1. */
    int32_t sliding_window;

    const float *alibi_slopes; /* [num_heads] fp32 or NULL; copied by pa_layer_create */
    float logits_soft_cap;     /* > 0: s = cap * tanh(s / cap); 0 = off */
    const float *sinks;        /* [num_heads] fp32 attention-sink logits or NULL; copied */
    pa_blocksparse blocksparse;

    pa_dtype q_dtype;   /* dtype of the queries: f32, f16 or bf16 */
    pa_dtype kv_dtype;  /* dtype of the new keys/values handed to forward: f32, f16 or bf16 */
    pa_dtype out_dtype; /* dtype of the output: f32, f16 or bf16 */
    pa_dtype cache_dtype; /* dtype stored in the KV cache: any pa_dtype */
    float k_scale, v_scale; /* fp8 caches: stored = quant(x / scale), the quotient an fp32
                               division (as vLLM's) rounded once to the code; read =
                               dequant(byte) * scale; must be 1 for other cache dtypes.
                               Default 1. */
} pa_layer_config;

/* Fills cfg with defaults for the given geometry: scale = 1/sqrt(head_size), decoder, no
 * window, no ALiBi, no soft-cap, no sinks, no block sparsity, every dtype f32, scales 1. */
PA_API void pa_layer_config_init(pa_layer_config *cfg, int32_t num_heads, int32_t num_kv_heads,
                                 int32_t head_size);

typedef struct pa_layer pa_layer;

/* Validates cfg and makes an immutable layer (ALiBi slopes and sinks copied). Errors:
 * NULL_POINTER, INVALID_ARGUMENT (bad sizes, num_heads % num_kv_heads, non-finite or
 * non-positive scale, non-finite slope or sink, bad window, soft-cap < 0 or non-finite, bad
 * block-sparse parameters, block-sparse on a non-decoder layer, bad dtype, scale != 1 for a
 * non-fp8 cache), OUT_OF_MEMORY. */
PA_API pa_status pa_layer_create(const pa_layer_config *cfg, pa_layer **out);
PA_API void pa_layer_destroy(pa_layer *layer);
/* The validated configuration (sliding_window already folded into window_left/right; pointers
 * point at the layer's own copies). */
PA_API const pa_layer_config *pa_layer_get_config(const pa_layer *layer);

/* ---------------------------------------------------------------------------------------------
 * KV cache: a view of a key pool and a value pool
 * ------------------------------------------------------------------------------------------- */

typedef enum pa_memory {
    PA_MEMORY_HOST = 0, /* ordinary (or pinned) host memory */
    PA_MEMORY_CUDA = 1  /* CUDA device memory of the context's device */
} pa_memory;

/* A KV cache is described, not owned: key and value point at caller memory (or memory from
 * pa_cache_alloc). Element (block b, token t, KV head h, dim d) of each pool sits at
 *     base[b * block_stride + t * token_stride + h * head_stride + d]    (in elements)
 * with the head_size dims contiguous. Common layouts are stride choices:
 *   NHD [num_blocks, block_size, num_kv_heads, head_size] (FlashAttention, vLLM flash):
 *        block_stride = block_size*H*D, token_stride = H*D, head_stride = D
 *   HND [num_blocks, num_kv_heads, block_size, head_size] (vLLM CPU, FlashInfer option):
 *        block_stride = H*block_size*D, token_stride = D, head_stride = block_size*D
 *   K/V interleaved [num_blocks, 2, ...] (FlashInfer): value = key + block_size*H*D and a
 *        block_stride of 2*block_size*H*D.
 * The strides must nest: with the dimensions of extent > 1 sorted by stride (the head_size dims
 * at stride 1), each stride at least the span of the dimensions inside it, so that distinct
 * (b, t, h, d) lie at distinct elements. Every dense or padded layout, and the interleaved one,
 * nests; stride sets that interleave dimensions are refused (INVALID_ARGUMENT) even where they
 * happen to address distinct elements (e.g. 2 tokens x 3 heads x 1 dim at token stride 3, head
 * stride 2). */
typedef struct pa_cache {
    void *key;              /* key pool base, dtype `dtype` */
    void *value;            /* value pool base, dtype `dtype` */
    pa_dtype dtype;         /* storage dtype (must equal the layer's cache_dtype) */
    pa_memory memory;       /* where key and value live */
    int64_t num_blocks;     /* >= 1 */
    int32_t block_size;     /* tokens per block, >= 1 */
    int32_t num_kv_heads;   /* >= 1 */
    int32_t head_size;      /* >= 1 */
    int64_t block_stride;   /* elements between blocks */
    int64_t token_stride;   /* elements between tokens of a block */
    int64_t head_stride;    /* elements between KV heads of a token */
} pa_cache;

typedef enum pa_cache_layout {
    PA_LAYOUT_NHD = 0, /* [num_blocks, block_size, num_kv_heads, head_size] */
    PA_LAYOUT_HND = 1  /* [num_blocks, num_kv_heads, block_size, head_size] */
} pa_cache_layout;

/* Fills the geometry and contiguous strides of `layout` (key/value left NULL, memory HOST).
 * INVALID_ARGUMENT for non-positive sizes or a bad dtype/layout; OVERFLOW if the pool's element
 * count is 2^60 or more (the limit every cache view has: its byte size at up to 8 bytes per
 * element stays below 2^63, an int64). */
PA_API pa_status pa_cache_init(pa_cache *cache, pa_cache_layout layout, pa_dtype dtype,
                               int64_t num_blocks, int32_t block_size, int32_t num_kv_heads,
                               int32_t head_size);
/* Elements one pool spans: the largest addressed element + 1; -1 for NULL, a size below 1 or a
 * span of 2^60 elements or more. */
PA_API int64_t pa_cache_pool_elems(const pa_cache *cache);
/* Checks a cache view as every call that takes one does, touching no memory: pools not NULL, a
 * pa_dtype and pa_memory, sizes >= 1, strides >= 0 whose span is below 2^60 elements
 * (OVERFLOW otherwise), and nested strides (see pa_cache; INVALID_ARGUMENT otherwise). A
 * dimension of extent 1 may have any stride >= 0. The two pools may share memory (value = key
 * reads V = K); every call that writes a cache (pa_cache_write, the destinations of
 * pa_cache_copy_blocks and pa_cache_swap_blocks, a forward given new k/v) also requires that no
 * element of the value pool lies on one of the key pool (INVALID_ARGUMENT), but for one pool as
 * both (value == key) written with the same values in K and V (equal new rows and scales, a
 * copy within it, a swap from another such cache). Interleaved pools, as FlashInfer's
 * [num_blocks, 2, ...], share no element and pass. */
PA_API pa_status pa_cache_validate(const pa_cache *cache);
/* Allocates both pools in host memory for the geometry in *cache, filled with zero bytes: 64-byte
 * aligned, and pools of 4 MiB or more 2 MiB aligned and advised for transparent huge pages. Free
 * with pa_cache_free. */
PA_API pa_status pa_cache_alloc(pa_cache *cache);
/* Frees pools from pa_cache_alloc and sets key/value to NULL. NULL or unallocated: no-op. */
PA_API void pa_cache_free(pa_cache *cache);

/* Reads one token's K and V back, dequantized (fp8 times scale) and converted to f32:
 * key_out and value_out are [num_kv_heads, head_size] (either may be NULL). Host memory only.
 * The scales are read for fp8 caches only, and must then be finite and > 0 (INVALID_ARGUMENT).
 * For tests and tools. */
PA_API pa_status pa_cache_read_token(const pa_cache *cache, int64_t slot, float k_scale,
                                     float v_scale, float *key_out, float *value_out);

/* ---------------------------------------------------------------------------------------------
 * Batches (vLLM's AttentionMetadata and its builder)
 * ------------------------------------------------------------------------------------------- */

/* One sequence of the step, as the engine knows it. */
typedef struct pa_seq {
    int32_t context_len;          /* tokens already in the cache, >= 0 */
    int32_t query_len;            /* new tokens this step, >= 1 (encoder and encoder_only
                                     layers: the sequence's tokens, with context_len 0) */
    int32_t is_prefill;           /* != 0: a (possibly chunked) prefill; 0: a decode (one token,
                                     or several for speculative decoding). Prefills come first. */
    const int32_t *block_table;   /* [num_blocks] physical block ids of this sequence's logical
                                     blocks; must cover context_len + query_len tokens. May be
                                     NULL with num_blocks 0 for encoder / encoder_only layers. */
    int32_t num_blocks;
    /* Encoder-decoder models only (else 0 / NULL): */
    int32_t encoder_len;              /* encoder tokens of this sequence */
    const int32_t *cross_block_table; /* [num_cross_blocks] blocks of the cross cache holding
                                         them; must cover encoder_len tokens */
    int32_t num_cross_blocks;
} pa_seq;

typedef struct pa_batch_config {
    int32_t block_size;       /* tokens per KV block of the caches this batch will address */
    int64_t num_blocks;       /* blocks in the pool: every block id must be < num_blocks */
    int64_t num_cross_blocks; /* blocks in the cross pool (0 if none) */
    /* Optional explicit slot mapping [num_tokens] (int64, -1 = do not write this token's K/V):
     * vLLM's engines compute it themselves. NULL: derived from the block tables,
     * slot = table[pos / block_size] * block_size + pos % block_size. */
    const int64_t *slot_mapping;
    /* Optional explicit cross slot mapping [sum of encoder_len]; NULL: derived likewise. */
    const int64_t *cross_slot_mapping;
} pa_batch_config;

/* The flattened metadata, read-only, owned by the batch. Arrays indexed by sequence hold
 * num_seqs entries (prefills first); block_tables is [num_seqs, max_blocks_per_seq] padded with
 * 0, as vLLM's. */
typedef struct pa_batch_metadata {
    int32_t num_seqs;
    int32_t num_prefills;           /* prefill sequences */
    int64_t num_prefill_tokens;
    int64_t num_decode_tokens;
    int64_t num_tokens;             /* num_prefill_tokens + num_decode_tokens */
    int32_t max_query_len, max_seq_len;
    int32_t max_prefill_seq_len, max_decode_seq_len, max_decode_query_len;
    const int32_t *query_start_loc; /* [num_seqs + 1] exclusive cumsum of query_len */
    const int32_t *seq_start_loc;   /* [num_seqs + 1] exclusive cumsum of seq_len */
    const int32_t *seq_lens;        /* [num_seqs] context_len + query_len */
    const int32_t *context_lens;    /* [num_seqs] */
    const int32_t *query_lens;      /* [num_seqs] */
    const int32_t *block_tables;    /* [num_seqs, max_blocks_per_seq] */
    int32_t max_blocks_per_seq;
    const int64_t *slot_mapping;    /* [num_tokens], -1 = not written */
    /* encoder-decoder fields (all zero / NULL when no sequence has an encoder) */
    int64_t num_encoder_tokens;
    int32_t max_encoder_seq_len;
    const int32_t *encoder_seq_lens;     /* [num_seqs] */
    const int32_t *encoder_start_loc;    /* [num_seqs + 1] */
    const int32_t *cross_block_tables;   /* [num_seqs, max_cross_blocks_per_seq] */
    int32_t max_cross_blocks_per_seq;
    const int64_t *cross_slot_mapping;   /* [num_encoder_tokens] */
    int32_t block_size;
} pa_batch_metadata;

typedef struct pa_batch pa_batch;

/* Builds and validates a batch of num_seqs sequences (>= 1). Checks: lengths non-negative and
 * within int32, query_len >= 1, prefills before decodes, every block id a sequence uses in [0,
 * num_blocks) (the table entries its keys cover; entries past them are never read and may hold
 * anything, as vLLM's padded tables do), every table long enough for its sequence, every slot (derived or given) in the pool or -1,
 * no slot written twice in one step (within the batch's slot mapping, and within its cross
 * slot mapping). Errors: NULL_POINTER, INVALID_ARGUMENT, OUT_OF_RANGE, OVERFLOW,
 * OUT_OF_MEMORY. The batch copies everything it needs. */
PA_API pa_status pa_batch_create(const pa_batch_config *cfg, const pa_seq *seqs,
                                 int32_t num_seqs, pa_batch **out);
PA_API void pa_batch_destroy(pa_batch *batch);
PA_API const pa_batch_metadata *pa_batch_get_metadata(const pa_batch *batch);

/* FlashInfer's CSR page table to pa_seq block tables. For sequence i of num_seqs: pages
 * indices[indptr[i] .. indptr[i+1]), the last page holding last_page_len[i] tokens (1..
 * block_size), so kv_len = (pages - 1) * block_size + last_page_len. Fills seqs[i].block_table
 * (pointing into indices), num_blocks and, given qo_indptr [num_seqs + 1] (query cumsum),
 * query_len = qo_indptr[i+1] - qo_indptr[i] and context_len = kv_len - query_len (without it,
 * query_len 1; qo_indptr[0] must be 0); is_prefill is set for query_len > 1. Errors for
 * non-monotonic indptr, a qo_indptr not starting at 0, last_page_len out of range, query_len >
 * kv_len (so a sequence with no pages, whose kv_len is 0, is an error: every sequence has at
 * least its query's tokens). pa_batch_create then wants
 * the prefills first (vLLM's order; FlashInfer has none): reorder the CSR rows if need be. */
PA_API pa_status pa_seqs_from_csr(int32_t num_seqs, const int32_t *qo_indptr,
                                  const int32_t *kv_indptr, const int32_t *kv_indices,
                                  const int32_t *kv_last_page_len, int32_t block_size,
                                  pa_seq *seqs);

/* ---------------------------------------------------------------------------------------------
 * Backends (vLLM's AttentionBackend) and contexts
 * ------------------------------------------------------------------------------------------- */

typedef struct pa_backend pa_backend; /* a registry entry: static, never freed */

/* Backends built into this library, in order of preference (fastest first): "cuda" (when
 * built with CUDA), "cpu", "reference". */
PA_API int pa_backend_count(void);
PA_API const pa_backend *pa_backend_at(int index); /* NULL if out of range */
PA_API const pa_backend *pa_backend_find(const char *name); /* NULL if none */
PA_API const char *pa_backend_name(const pa_backend *backend);
PA_API const char *pa_backend_description(const pa_backend *backend);
/* Whether the backend can run on this machine and in this build; if not, why (reason may be
 * NULL). A backend's environment settings (the cpu backend's PAGEDATTN_CPU_ISA and
 * PAGEDATTN_CPU_FP8) are not asked here: a setting that cannot run here makes pa_context_create
 * fail (UNAVAILABLE or INVALID_ARGUMENT, with the reason) rather than the automatic choice move
 * on to another backend; `pagedattn info` shows both. */
PA_API int pa_backend_available(const pa_backend *backend, char *reason, size_t reason_size);
/* The layout the backend reads fastest (vLLM's get_kv_cache_shape). Any layout is accepted. */
PA_API pa_cache_layout pa_backend_preferred_layout(const pa_backend *backend);
/* The memory its caches and tensors must live in. */
PA_API pa_memory pa_backend_memory(const pa_backend *backend);
/* Free-form lines on what the backend runs here (ISA chosen and why, device name). The text
 * stays valid until the next call of pa_backend_info on the same thread; any thread may call it. */
PA_API const char *pa_backend_info(const pa_backend *backend);

/* Chooses a backend: `name` if non-NULL and non-empty; else the environment variable
 * PAGEDATTN_BACKEND if set; else the first available backend that supports `layer` (any layer
 * when NULL). An explicit choice that is unknown is NOT_FOUND; one that cannot run here is
 * UNAVAILABLE; one that cannot run `layer` is UNSUPPORTED; each with the reason. There is no
 * silent fallback from an explicit choice. */
PA_API pa_status pa_backend_select(const char *name, const pa_layer *layer,
                                   const pa_backend **out);

/* Whether the backend computes `layer` (every feature and dtype in it) exactly as the contract
 * says: OK, or UNSUPPORTED with the reason in pa_last_error() and in reason (may be NULL). */
PA_API pa_status pa_backend_supports(const pa_backend *backend, const pa_layer *layer,
                                     char *reason, size_t reason_size);

/* A context is an opened backend: its threads, device, stream, workspaces.
 * fork(): a cpu context made before a fork keeps working in the child, running its work on the
 * calling thread alone (its workers are threads of the parent, which a child does not have;
 * pa_context_num_threads says 1 there, and pa_context_set_num_threads gives it workers of the
 * child), and may be destroyed there; a context created in the child has its own workers. The
 * results are the same bits either way. A context that was inside a call on another thread at
 * the moment of the fork stays "in use" in the child: destroy it there, or fork only between
 * calls. (CUDA does not survive a fork: create cuda contexts after it.) */
typedef struct pa_context pa_context;

/* The most worker threads a context takes (more: INVALID_ARGUMENT; "online cores" is capped).
 * The cpu backend keeps a scratch of its own per thread, allocated at context creation and
 * grown with the largest head size planned: about 0.5 MB per thread at head size 128, 2 MB at
 * 512. More threads than CPUs work (a job wakes only the threads it has tasks for, and they
 * do not spin where they outnumber the CPUs) but gain nothing.
 * "Online cores" (the cpu backend's default) counts the CPUs this process may use: the online
 * ones, within its affinity mask (taskset, cpusets) and its cgroup's CPU quota rounded up (a
 * container's --cpus, a Kubernetes CPU limit; cgroup v1 and v2). */
#define PA_MAX_THREADS 1024

typedef struct pa_context_options {
    int32_t num_threads; /* 0..PA_MAX_THREADS for every backend (else INVALID_ARGUMENT); cpu: worker
                            threads (0 = online cores); others ignore the value */
    int32_t device;      /* cuda: device ordinal */
    void *stream;        /* cuda: a cudaStream_t to run on (NULL = the context's own stream) */
} pa_context_options;

/* options may be NULL (defaults). UNAVAILABLE if the backend cannot run here. */
PA_API pa_status pa_context_create(const pa_backend *backend, const pa_context_options *options,
                                   pa_context **out);
PA_API void pa_context_destroy(pa_context *ctx);
PA_API const pa_backend *pa_context_backend(const pa_context *ctx);
/* cpu: resizes the thread pool (0 = online cores; at most PA_MAX_THREADS). Other backends accept
 * and ignore a count in that range; outside it is INVALID_ARGUMENT for every backend. */
PA_API pa_status pa_context_set_num_threads(pa_context *ctx, int32_t num_threads);
PA_API int32_t pa_context_num_threads(const pa_context *ctx);
/* Waits for work queued on the context to finish (cuda); a no-op on host backends. */
PA_API pa_status pa_context_synchronize(pa_context *ctx);

/* ---------------------------------------------------------------------------------------------
 * Plans and forward
 * ------------------------------------------------------------------------------------------- */

/* A plan is a backend's schedule for one batch and one head geometry (num_heads, num_kv_heads,
 * head_size, attention type): built once per step and reused by every layer of that geometry.
 * It refers to `batch`, which must outlive it. Running a plan never allocates. */
typedef struct pa_plan pa_plan;
PA_API pa_status pa_plan_create(pa_context *ctx, const pa_layer *layer, const pa_batch *batch,
                                pa_plan **out);
PA_API void pa_plan_destroy(pa_plan *plan);

/* The tensors of one forward call. Token rows: element (token i, head h, dim d) of q sits at
 * q[i * q_row_stride + h * head_size + d] (heads and dims contiguous), so q, k and v may be
 * views into one fused QKV buffer. A row stride of 0 means contiguous (heads * head_size); one
 * below a row is INVALID_ARGUMENT, one whose last row ends beyond 2^63 bytes counted at 4 bytes
 * per element (whatever the dtype: a limit no real buffer nears) OVERFLOW. */
typedef struct pa_forward_args {
    const void *q;        /* [num_tokens, num_heads, head_size], layer q_dtype */
    int64_t q_row_stride;
    /* New keys/values, layer kv_dtype, [rows, num_kv_heads, head_size] where rows is num_tokens
     * for decoder / encoder / encoder_only layers and num_encoder_tokens for encoder_decoder
     * layers. decoder: written into `cache` by the batch's slot mapping before attending; may
     * be NULL (both) when the cache already holds them. encoder, encoder_only: required, used
     * directly, never cached. encoder_decoder: when given, written into `cache` (the cross
     * cache) by the cross slot mapping; NULL at decode steps reads the cross cache as is. */
    const void *k;
    int64_t k_row_stride;
    const void *v;
    int64_t v_row_stride;
    /* decoder: the layer's KV cache; encoder_decoder: the cross cache; encoder, encoder_only:
     * NULL (ignored). Its dtype must be the layer's cache_dtype. */
    const pa_cache *cache;
    void *out;            /* [num_tokens, num_heads, head_size], layer out_dtype */
    int64_t out_row_stride;
    /* Optional LSE, fp32: lse[i * lse_token_stride + h * lse_head_stride] for token i, head h.
     * NULL: not written. Both strides 0: [num_tokens, num_heads] contiguous. FlashAttention's
     * [num_heads, num_tokens] is lse_token_stride 1, lse_head_stride num_tokens. Negative
     * strides, or strides that do not nest (one of them, where both dimensions have more than
     * one entry, must be at least the other times its extent: two (token, head) at one element
     * otherwise, or interleaved), are INVALID_ARGUMENT; a last LSE ending
     * beyond 2^63 bytes is OVERFLOW (the same rules hold for pa_merge_args). */
    float *lse;
    int64_t lse_token_stride, lse_head_stride;
} pa_forward_args;

/* One layer of one step: writes the new K/V (see pa_forward_args) and computes attention for
 * every token of the batch. plan may be NULL: a temporary plan is made (this allocates).
 * Validates everything first (geometry of layer, batch, cache and plan agree; dtypes; strides;
 * memory kind; the backend supports the layer); on any error nothing is written. */
PA_API pa_status pa_attn_forward(pa_context *ctx, const pa_layer *layer, const pa_batch *batch,
                                 const pa_plan *plan, const pa_forward_args *args);

/* ---------------------------------------------------------------------------------------------
 * Cache operations. ctx selects the backend that runs them (and the memory the pools live
 * in); ctx NULL runs them on the calling thread for host memory.
 * ------------------------------------------------------------------------------------------- */

/* vLLM's reshape_and_cache_flash: for i < num_tokens with slot = slot_mapping[i] >= 0, writes
 * key[i] and value[i] ([num_kv_heads, head_size], `src_dtype`, rows k_row_stride/v_row_stride
 * elements apart, 0 = contiguous; strides as in pa_forward_args) into token slot % block_size of block slot / block_size,
 * converting to the cache dtype (fp8: quant(x / k_scale), quant(x / v_scale), each quotient an
 * fp32 division rounded once to the code). Negative slots
 * are skipped. OUT_OF_RANGE for a slot beyond the pool; INVALID_ARGUMENT for a slot twice. */
PA_API pa_status pa_cache_write(pa_context *ctx, const pa_cache *cache, pa_dtype src_dtype,
                                const void *key, int64_t k_row_stride, const void *value,
                                int64_t v_row_stride, const int64_t *slot_mapping,
                                int64_t num_tokens, float k_scale, float v_scale);

/* vLLM's copy_blocks: for every layer l < num_layers and pair p < num_pairs, copies block
 * pairs[2p] to block pairs[2p+1] in both pools of caches[l]. One source may feed many
 * destinations; a destination may appear once only and may not also be a source (so the order
 * of copies cannot matter). All ids are validated against every layer first. */
PA_API pa_status pa_cache_copy_blocks(pa_context *ctx, const pa_cache *caches, int32_t num_layers,
                                      const int64_t *pairs, int64_t num_pairs);

/* vLLM's swap_blocks: copies whole blocks pairs[2p] of src to pairs[2p+1] of dst (both pools),
 * e.g. device <-> host. src and dst must have the same dtype, block_size, num_kv_heads and
 * head_size (strides may differ); they must be different pools (INVALID_ARGUMENT if the byte
 * ranges that dst's key and value pools span meet those of src's); destinations distinct. */
PA_API pa_status pa_cache_swap_blocks(pa_context *ctx, const pa_cache *src, const pa_cache *dst,
                                      const int64_t *pairs, int64_t num_pairs);

/* vLLM's merge_attn_states / FlashInfer's merge_state: combines two partial attentions over
 * disjoint key sets, per (token, head): an LSE of +inf is treated as -inf; M = max(a, b);
 * wa = exp(a - M), wb = exp(b - M); out = (out_a * wa + out_b * wb) / (wa + wb);
 * out_lse = M + ln(wa + wb), in IEEE arithmetic: a NaN LSE makes out and out_lse NaN, and a
 * part whose weight underflows to 0 still multiplies in (0 times a NaN out is NaN); a part whose
 * LSE is -inf is empty and adds nothing, whatever its out holds. Both -inf: out = 0, out_lse =
 * -inf. Tensors [num_tokens,
 * num_heads, head_size] contiguous in `dtype` (f32, f16, bf16); LSEs fp32 with the strides
 * given (0, 0 = [num_tokens, num_heads]); out_lse may be NULL. out and out_lse share no byte
 * with an input or with each other (INVALID_ARGUMENT otherwise: not even in place). */
typedef struct pa_merge_args {
    int64_t num_tokens;
    int32_t num_heads, head_size;
    pa_dtype dtype;
    const void *out_a;
    const float *lse_a;
    const void *out_b;
    const float *lse_b;
    void *out;
    float *out_lse;
    int64_t lse_token_stride, lse_head_stride; /* shared by all three LSE arrays */
} pa_merge_args;
PA_API pa_status pa_merge_states(pa_context *ctx, const pa_merge_args *args);

/* ---------------------------------------------------------------------------------------------
 * Allocator: every allocation of the library goes through these hooks.
 * ------------------------------------------------------------------------------------------- */

typedef struct pa_allocator {
    /* Returns size bytes aligned to `alignment` (a power of two >= sizeof(void*)), or NULL. */
    void *(*alloc)(void *user, size_t size, size_t alignment);
    void (*free)(void *user, void *ptr);
    void *user;
} pa_allocator;

/* Replaces the allocator (NULL restores the default, aligned malloc). Call before creating any
 * handle; objects must be freed by the allocator that made them. Not thread-safe. The hooks are
 * called from the library's own threads too (a cpu context's workers free their start-up data
 * while the creating thread still allocates), and from every thread that calls the library: they
 * must be thread-safe themselves. */
PA_API void pa_set_allocator(const pa_allocator *allocator);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDATTN_H */
