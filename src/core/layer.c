/* layer.c: the configuration of one attention layer, validated once at creation. */
#include "internal.h"

#define PA__MAX_HEADS 65536

const char *pa_attn_type_name(pa_attn_type type)
{
    static const char *const names[] = {"decoder", "encoder", "encoder_only", "encoder_decoder"};
    return (unsigned)type < (unsigned)PA_ATTN_TYPE_COUNT_ ? names[type] : NULL;
}

void pa_layer_config_init(pa_layer_config *cfg, int32_t num_heads, int32_t num_kv_heads,
                          int32_t head_size)
{
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->num_heads = num_heads;
    cfg->num_kv_heads = num_kv_heads;
    cfg->head_size = head_size;
    pa__fpenv fe; /* the default scale is the same bits whatever the caller's rounding mode */
    pa__fpenv_enter(&fe);
    cfg->scale = head_size > 0 ? (float)(1.0 / sqrt((double)head_size)) : 1.0f;
    pa__fpenv_leave(&fe);
    cfg->attn_type = PA_ATTN_DECODER;
    cfg->window_left = cfg->window_right = -1;
    cfg->q_dtype = cfg->kv_dtype = cfg->out_dtype = cfg->cache_dtype = PA_DTYPE_F32;
    cfg->k_scale = cfg->v_scale = 1.0f;
}

static pa_status check_geometry(const pa_layer_config *c)
{
    if (c->num_heads < 1 || c->num_kv_heads < 1)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: num_heads (%d) and num_kv_heads (%d) must be >= 1", c->num_heads,
                        c->num_kv_heads);
    if (c->num_heads > PA__MAX_HEADS)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "layer: num_heads %d exceeds %d", c->num_heads,
                        PA__MAX_HEADS);
    if (c->num_heads % c->num_kv_heads != 0)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: num_heads (%d) must be a multiple of num_kv_heads (%d)",
                        c->num_heads, c->num_kv_heads);
    if (c->head_size < 1 || c->head_size > 512)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "layer: head_size %d not in [1, 512]",
                        c->head_size);
    if (!(isfinite(c->scale) && c->scale > 0))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "layer: scale %g must be finite and > 0",
                        (double)c->scale);
    if ((unsigned)c->attn_type >= (unsigned)PA_ATTN_TYPE_COUNT_)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "layer: attn_type %d is not a pa_attn_type",
                        (int)c->attn_type);
    return PA_STATUS_OK;
}

static pa_status check_window(const pa_layer_config *c)
{
    if (c->window_left < -1 || c->window_right < -1)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: window (%d, %d): each side must be >= 0, or -1 for unbounded",
                        c->window_left, c->window_right);
    if (c->sliding_window < 0)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "layer: sliding_window %d must be >= 0",
                        c->sliding_window);
    if (c->sliding_window > 0 && (c->window_left != -1 || c->window_right != -1))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: sliding_window %d given together with window (%d, %d); set one",
                        c->sliding_window, c->window_left, c->window_right);
    if (c->attn_type == PA_ATTN_ENCODER_DECODER &&
        (c->window_left != -1 || c->window_right != -1 || c->sliding_window > 0))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: encoder_decoder (cross) attention has no relative positions, so no "
                        "window");
    if (!(isfinite(c->logits_soft_cap) && c->logits_soft_cap >= 0))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: logits_soft_cap %g must be finite and >= 0 (0 = off)",
                        (double)c->logits_soft_cap);
    return PA_STATUS_OK;
}

static pa_status check_per_head(const float *v, int32_t n, const char *what)
{
    for (int32_t h = 0; v && h < n; h++)
        if (!isfinite(v[h]))
            return pa__fail(PA_STATUS_INVALID_ARGUMENT, "layer: %s[%d] = %g is not finite", what,
                            h, (double)v[h]);
    return PA_STATUS_OK;
}

static pa_status check_blocksparse(const pa_layer_config *c)
{
    const pa_blocksparse *b = &c->blocksparse;
    if (b->block_size < 0)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: blocksparse.block_size %d must be >= 0 (0 = off)", b->block_size);
    if (b->block_size == 0) return PA_STATUS_OK;
    if (c->attn_type != PA_ATTN_DECODER)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: block-sparse attention requires attn_type decoder, not %s",
                        pa_attn_type_name(c->attn_type));
    if (b->local_blocks < 0 || b->vert_stride < 1 || b->tp_rank < 0)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: blocksparse local_blocks %d (>= 0), vert_stride %d (>= 1), "
                        "tp_rank %d (>= 0)",
                        b->local_blocks, b->vert_stride, b->tp_rank);
    return PA_STATUS_OK;
}

static pa_status check_dtypes(const pa_layer_config *c)
{
    const pa_dtype io[3] = {c->q_dtype, c->kv_dtype, c->out_dtype};
    static const char *const io_name[3] = {"q_dtype", "kv_dtype", "out_dtype"};
    for (int i = 0; i < 3; i++)
        if (!pa__dtype_is_float(io[i]))
            return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                            "layer: %s %d must be f32, f16 or bf16", io_name[i], (int)io[i]);
    if (!pa__dtype_valid(c->cache_dtype))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "layer: cache_dtype %d is not a pa_dtype",
                        (int)c->cache_dtype);
    if (!(isfinite(c->k_scale) && c->k_scale > 0 && isfinite(c->v_scale) && c->v_scale > 0))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: k_scale %g and v_scale %g must be finite and > 0",
                        (double)c->k_scale, (double)c->v_scale);
    if (!pa__dtype_is_fp8(c->cache_dtype) && (c->k_scale != 1.0f || c->v_scale != 1.0f))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: k_scale %g / v_scale %g must be 1 for a %s cache (scales apply "
                        "to fp8 caches only)",
                        (double)c->k_scale, (double)c->v_scale, pa_dtype_name(c->cache_dtype));
    return PA_STATUS_OK;
}

static pa_status validate(const pa_layer_config *c)
{
    pa_status s;
    if (c->attn_type == PA_ATTN_ENCODER_DECODER && c->alibi_slopes)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "layer: encoder_decoder (cross) attention has no relative positions, so no "
                        "ALiBi");
    if ((s = check_geometry(c)) || (s = check_window(c)) ||
        (s = check_per_head(c->alibi_slopes, c->num_heads, "alibi_slopes")) ||
        (s = check_per_head(c->sinks, c->num_heads, "sinks")) || (s = check_blocksparse(c)) ||
        (s = check_dtypes(c)))
        return s;
    return PA_STATUS_OK;
}

/* o_h of pagedattn.h's block-sparse rule, reduced modulo vert_stride. */
static void fill_blocksparse_offsets(struct pa_layer *L)
{
    const pa_blocksparse *b = &L->cfg.blocksparse;
    /* Only o_h mod vert_stride matters; reducing the factors first keeps the products in range
     * for any tp_rank, head count and step (the unreduced product can exceed int64). */
    int64_t vs = b->vert_stride, step = b->homo_head ? 0 : b->head_sliding_step;
    int64_t step_mod = (step >= 0 ? step : -step) % vs;
    for (int32_t h = 0; h < L->cfg.num_heads; h++) {
        int64_t g = step >= 0 ? (int64_t)b->tp_rank * L->cfg.num_heads + h
                              : (int64_t)b->tp_rank * L->cfg.num_kv_heads + h / L->group;
        L->bs_offset[h] = (int32_t)(((g % vs) * step_mod + 1) % vs);
    }
}

static float *copy_floats(const float *src, int32_t n, bool *oom)
{
    if (!src) return NULL;
    float *dst = pa__alloc((size_t)n * sizeof *dst);
    if (!dst) *oom = true;
    else memcpy(dst, src, (size_t)n * sizeof *dst);
    return dst;
}

pa_status pa_layer_create(const pa_layer_config *cfg, pa_layer **out)
{
    if (!cfg || !out) return pa__fail(PA_STATUS_NULL_POINTER, "pa_layer_create: cfg and out must not be NULL");
    *out = NULL;
    pa_status s = validate(cfg);
    if (s) return s;
    struct pa_layer *L = pa__calloc(1, sizeof *L);
    if (!L) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "pa_layer_create: out of memory");
    L->cfg = *cfg;
    L->group = cfg->num_heads / cfg->num_kv_heads;
    if (cfg->sliding_window > 0) {
        L->cfg.window_left = cfg->sliding_window - 1;
        L->cfg.window_right = 0;
        L->cfg.sliding_window = 0;
    }
    bool oom = false;
    L->alibi = copy_floats(cfg->alibi_slopes, cfg->num_heads, &oom);
    L->sinks = copy_floats(cfg->sinks, cfg->num_heads, &oom);
    L->cfg.alibi_slopes = L->alibi;
    L->cfg.sinks = L->sinks;
    if (cfg->blocksparse.block_size > 0) {
        L->bs_offset = pa__alloc((size_t)cfg->num_heads * sizeof *L->bs_offset);
        if (L->bs_offset) fill_blocksparse_offsets(L);
        else oom = true;
    }
    if (oom) {
        pa_layer_destroy(L);
        return pa__fail(PA_STATUS_OUT_OF_MEMORY, "pa_layer_create: out of memory");
    }
    *out = L;
    return PA_STATUS_OK;
}

void pa_layer_destroy(pa_layer *layer)
{
    if (!layer) return;
    pa__free(layer->alibi);
    pa__free(layer->sinks);
    pa__free(layer->bs_offset);
    pa__free(layer);
}

const pa_layer_config *pa_layer_get_config(const pa_layer *layer)
{
    return layer ? &layer->cfg : NULL;
}
