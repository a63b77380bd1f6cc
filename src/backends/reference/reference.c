/* reference.c: the exact backend. Every feature, every dtype, any geometry, computed in double
 * precision straight from the contract in pagedattn.h, one (token, head) at a time. It is the
 * oracle the other backends are checked against, so it favours clarity over speed. */
#include "internal.h"

/* Where the keys and values of one sequence come from: the paged cache through a block table
 * (decoder, cross), or the step's own k/v rows (encoder, encoder_only). */
typedef struct kv_source {
    const pa_cache *cache;  /* NULL for the step's own rows */
    const int32_t *table;   /* block table row */
    const void *k, *v;      /* [rows, num_kv_heads, head_size] (no cache) */
    int64_t k_rs, v_rs;     /* row strides */
    int64_t first_row;      /* row of key 0 */
    pa_dtype dtype;
    double k_scale, v_scale;
    float lut[256];         /* fp8 dtypes: each code's value (pa_fp8e4m3_to_f32 or _e5m2) */
} kv_source;

/* Key (or value) j of KV head kh, dequantized, into row[0..head_size). */
static void kv_row(const kv_source *s, bool value, int64_t j, int32_t kh, int32_t head_size, double *row)
{
    const void *base;
    int64_t off;
    double scale = 1.0;
    if (s->cache) {
        base = value ? s->cache->value : s->cache->key;
        off = pa__cache_key_offset(s->cache, s->table, j) + kh * s->cache->head_stride;
        scale = value ? s->v_scale : s->k_scale;
    } else {
        base = value ? s->v : s->k;
        off = (s->first_row + j) * (value ? s->v_rs : s->k_rs) + (int64_t)kh * head_size;
    }
    if (pa__dtype_is_fp8(s->dtype)) /* (pa__load_f32's values, by the table of source_for) */
        for (int32_t d = 0; d < head_size; d++) row[d] = s->lut[((const uint8_t *)base)[off + d]] * scale;
    else
        for (int32_t d = 0; d < head_size; d++) row[d] = pa__load_f32(s->dtype, base, off + d) * scale;
}

/* The logit s_j of the contract, steps 1-3: scale * q.k, soft-cap, ALiBi. */
static double logit(const struct pa_layer *L, const kv_source *s, const double *q, int32_t h,
                    int64_t p, int64_t j)
{
    const pa_layer_config *c = &L->cfg;
    double k[512], dot = 0;
    kv_row(s, false, j, h / L->group, c->head_size, k);
    for (int32_t d = 0; d < c->head_size; d++) dot += q[d] * k[d];
    double x = (double)c->scale * dot;
    if (c->logits_soft_cap > 0) x = c->logits_soft_cap * tanh(x / c->logits_soft_cap);
    if (L->alibi) x += pa__alibi_bias(L->alibi[h], p, j);
    return x;
}

/* Pass 2 reads the logits of the row's first REF_KEPT_LOGITS keys from pass 1 and computes the
 * others again (the same value: the same function of the same operands). A stack array: forward
 * allocates nothing (DESIGN.md), and the reference runs on the caller's thread. */
#define REF_KEPT_LOGITS 2048

/* One query row: token `tok` at position p, head h, over keys [lo, hi) of source s. */
static void attend_row(const pa__fwd *f, const kv_source *s, int64_t tok, int32_t h, int64_t p,
                       int64_t lo, int64_t hi)
{
    const struct pa_layer *L = f->layer;
    const pa_layer_config *c = &L->cfg;
    const pa_forward_args *a = f->args;
    int32_t D = c->head_size;
    double q[512], acc[512], lg[REF_KEPT_LOGITS];
    for (int32_t d = 0; d < D; d++) {
        q[d] = pa__load_f32(c->q_dtype, a->q, tok * a->q_row_stride + (int64_t)h * D + d);
        acc[d] = 0;
    }
    /* Pass 1: the maximum over visible logits and the sink. A NaN or +inf logit makes the whole
     * row NaN (IEEE: exp(s_j - m) is NaN for it), never an empty or finite result. */
    double m = L->sinks ? L->sinks[h] : -INFINITY;
    bool poisoned = false;
    for (int64_t j = lo; j < hi; j++) {
        if (!pa__blocksparse_visible(L, h, p, j)) continue;
        double x = logit(L, s, q, h, p, j);
        if (j - lo < REF_KEPT_LOGITS) lg[j - lo] = x;
        poisoned |= isnan(x) || x == INFINITY;
        m = fmax(m, x);
    }
    if (poisoned) {
        for (int32_t d = 0; d < D; d++)
            pa__store_f32(c->out_dtype, a->out, tok * a->out_row_stride + (int64_t)h * D + d, NAN);
        if (a->lse) a->lse[tok * a->lse_token_stride + h * a->lse_head_stride] = NAN;
        return;
    }
    /* Pass 2: weights exp(s_j - m), their sum, and the weighted sum of values. */
    double denom = 0;
    for (int64_t j = lo; j < hi && m > -INFINITY; j++) {
        if (!pa__blocksparse_visible(L, h, p, j)) continue;
        double w = exp((j - lo < REF_KEPT_LOGITS ? lg[j - lo] : logit(L, s, q, h, p, j)) - m), v[512];
        denom += w;
        kv_row(s, true, j, h / L->group, D, v);
        for (int32_t d = 0; d < D; d++) acc[d] += w * v[d];
    }
    if (L->sinks && m > -INFINITY) denom += exp(L->sinks[h] - m);
    /* No visible key and no sink: out = 0, lse = -inf. */
    for (int32_t d = 0; d < D; d++)
        pa__store_f32(c->out_dtype, a->out, tok * a->out_row_stride + (int64_t)h * D + d,
                      denom > 0 ? (float)(acc[d] / denom) : 0.0f);
    if (a->lse)
        a->lse[tok * a->lse_token_stride + h * a->lse_head_stride] =
            denom > 0 ? (float)(m + log(denom)) : -INFINITY;
}

static kv_source source_for(const pa__fwd *f, int32_t seq)
{
    const pa_batch_metadata *m = &f->batch->md;
    const pa_layer_config *c = &f->layer->cfg;
    kv_source s = {0};
    if (c->attn_type == PA_ATTN_DECODER || c->attn_type == PA_ATTN_ENCODER_DECODER) {
        s.cache = f->args->cache;
        s.table = pa__seq_table(f->batch, c->attn_type, seq);
        s.dtype = s.cache->dtype;
        s.k_scale = pa__dtype_is_fp8(s.dtype) ? c->k_scale : 1.0;
        s.v_scale = pa__dtype_is_fp8(s.dtype) ? c->v_scale : 1.0;
    } else {
        s.k = f->args->k;
        s.v = f->args->v;
        s.k_rs = f->args->k_row_stride;
        s.v_rs = f->args->v_row_stride;
        s.first_row = m->query_start_loc[seq];
        s.dtype = c->kv_dtype;
    }
    if (pa__dtype_is_fp8(s.dtype))
        for (int i = 0; i < 256; i++) s.lut[i] = pa__load_f32(s.dtype, &(uint8_t){(uint8_t)i}, 0);
    return s;
}

static void write_new_kv(const pa__fwd *f)
{
    const pa_batch_metadata *m = &f->batch->md;
    const pa_layer_config *c = &f->layer->cfg;
    const pa_forward_args *a = f->args;
    bool cross = c->attn_type == PA_ATTN_ENCODER_DECODER;
    pa__cache_write_host(a->cache, c->kv_dtype, a->k, a->k_row_stride, a->v, a->v_row_stride,
                         cross ? m->cross_slot_mapping : m->slot_mapping,
                         cross ? m->num_encoder_tokens : m->num_tokens, c->k_scale, c->v_scale);
}

void pa__reference_forward(const pa__fwd *f)
{
    const pa_batch_metadata *m = &f->batch->md;
    const pa_layer_config *c = &f->layer->cfg;
    if (f->write_kv && f->args->cache) write_new_kv(f);
    for (int32_t seq = 0; seq < m->num_seqs; seq++) {
        kv_source s = source_for(f, seq);
        int64_t kv_len = pa__kv_len(f->batch, c->attn_type, seq);
        for (int32_t t = 0; t < m->query_lens[seq]; t++) {
            int64_t tok = m->query_start_loc[seq] + t;
            int64_t p = (int64_t)m->context_lens[seq] + t; /* absolute position */
            int64_t lo = 0, hi = kv_len;
            if (c->attn_type != PA_ATTN_ENCODER_DECODER) pa__key_range(f->layer, p, kv_len, &lo, &hi);
            for (int32_t h = 0; h < c->num_heads; h++) attend_row(f, &s, tok, h, p, lo, hi);
        }
    }
}

static pa_status reference_forward(void *impl, const pa__fwd *f, void *plan)
{
    (void)impl;
    (void)plan;
    pa__reference_forward(f);
    return PA_STATUS_OK;
}

static const char *reference_info(void)
{
    return "exact: double-precision accumulation, every feature, any head size 1..512, any block size";
}

const struct pa_backend pa__backend_reference = {
    .name = "reference",
    .description = "exact scalar oracle (double precision, single thread)",
    .preferred_layout = PA_LAYOUT_NHD,
    .memory = PA_MEMORY_HOST,
    .info = reference_info,
    .forward = reference_forward,
};
