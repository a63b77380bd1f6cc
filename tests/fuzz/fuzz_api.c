/* fuzz_api.c: a libFuzzer target for the public API. The input bytes are decoded into a layer
 * configuration (any values, invalid ones included), a KV cache view (layout, dtype, geometry,
 * strides), per-sequence descriptors with block tables and cross tables, optional explicit slot
 * mappings, row and LSE strides, and cache-op arguments. It then calls pa_layer_create,
 * pa_batch_create (and pa_seqs_from_csr), pa_plan_create and pa_attn_forward on the reference
 * backend (and on "cpu" when built), pa_cache_write, pa_cache_copy_blocks,
 * pa_cache_swap_blocks, pa_merge_states, pa_convert and pa_cache_read_token.
 *
 * Properties checked (a violation aborts, which libFuzzer reports as a crash):
 *   - nothing crashes or trips ASan/UBSan, whatever the input;
 *   - every call returns a known status, and a failing call leaves a reason text;
 *   - a rejected forward / cache op leaves the cache pools and the output byte-identical.
 * The harness itself never lies about a length: every array it hands over is as long as the
 * count it passes (invalid counts are negative, or describe lengths the library must refuse
 * before reading), and all sizes are capped after decoding so one run stays small and fast. */
#include "pagedattn.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- caps --------------------------------------------------------------------------------- */

enum {
    MAX_SEQS = 8,
    MAX_TABLE = 40,           /* block table entries per sequence */
    MAX_POOL_ELEMS = 1 << 17, /* per cache pool */
    MAX_ROWS_ELEMS = 1 << 16, /* q / k / v / out buffer elements */
    MAX_LSE_ELEMS = 1 << 14,
    MAX_PAIRS = 16,
};
/* tokens * heads * keys * head_size above which forward is not run (keeps runs fast) */
#define WORK_BUDGET ((int64_t)1 << 21)

/* ---- input reader --------------------------------------------------------------------------- */

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;

static uint8_t u8(rd *r)
{
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

static uint32_t u32(rd *r)
{
    uint32_t v = u8(r);
    v |= (uint32_t)u8(r) << 8;
    v |= (uint32_t)u8(r) << 16;
    v |= (uint32_t)u8(r) << 24;
    return v;
}

static const int32_t SPECIAL32[16] = {0, 1, -1, 2, -2, 3, 4, 7, 8, 16, 64, INT32_MAX, INT32_MIN,
                                      INT32_MAX - 1, 1 << 30, 513};

/* Mostly a value in [lo, hi]; sometimes a special (often invalid) one; rarely raw 32 bits. */
static int32_t pick(rd *r, int32_t lo, int32_t hi)
{
    uint8_t b = u8(r);
    if (b < 24) return SPECIAL32[b & 15];
    if (b == 24) return (int32_t)u32(r);
    if (hi < lo) return lo; /* (an empty range from the caller's arithmetic) */
    uint32_t span = (uint32_t)((int64_t)hi - lo + 1);
    return (int32_t)((int64_t)lo + (int64_t)(u8(r) % span));
}

static int64_t pick64(rd *r, int64_t lo, int64_t hi)
{
    static const int64_t special[8] = {0, -1, 1, INT64_MAX, INT64_MIN, (int64_t)1 << 62,
                                       INT64_MAX / 2, (int64_t)1 << 31};
    uint8_t b = u8(r);
    if (b < 16) return special[b & 7];
    if (b == 16) return (int64_t)(((uint64_t)u32(r) << 32) | u32(r));
    /* an empty range (hi < lo, from the caller's arithmetic on drawn values) divided by zero
     * here until a fuzz run found it (UBSan); the span in unsigned arithmetic */
    if (hi < lo) return lo;
    uint64_t span = (uint64_t)hi - (uint64_t)lo + 1;
    return span ? (int64_t)((uint64_t)lo + (uint64_t)u8(r) % span) : lo + (int64_t)u8(r);
}

static float pick_float(rd *r)
{
    static const float special[8] = {1.0f, 0.5f, 2.0f, 0.0f, -1.0f, NAN, INFINITY, 0.125f};
    uint8_t b = u8(r);
    if (b < 128) return special[b & 7];
    return (float)(b - 128) / 32.0f + 0.03125f;
}

static pa_dtype pick_dtype(rd *r, int float_only)
{
    uint8_t b = u8(r);
    if (b == 255) return (pa_dtype)7; /* invalid */
    return (pa_dtype)(b % (float_only && b < 200 ? 3 : 5));
}

/* ---- helpers -------------------------------------------------------------------------------- */

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_api: property violated: %s (last error: %s)\n", what, pa_last_error());
        abort();
    }
}

static void check_status(pa_status s)
{
    check(s >= PA_STATUS_OK && s <= PA_STATUS_INTERNAL, "known status");
    check(strcmp(pa_status_name(s), "PA_STATUS_UNKNOWN") != 0, "named status");
    if (s != PA_STATUS_OK) check(pa_last_error()[0] != '\0', "a failure leaves a reason");
    check(s != PA_STATUS_INTERNAL, "no internal error");
}

/* Outcome counts, printed at exit when FUZZ_API_STATS is set (to see what a corpus reaches). */
static long stat_layer_ok, stat_batch_ok, stat_fwd_ok, stat_fwd_rejected, stat_status[PA_STATUS_INTERNAL + 1];
static void print_stats(void)
{
    fprintf(stderr, "fuzz_api: layers ok %ld, batches ok %ld, forward ok %ld, forward rejected %ld\n",
            stat_layer_ok, stat_batch_ok, stat_fwd_ok, stat_fwd_rejected);
    for (int i = 0; i <= PA_STATUS_INTERNAL; i++)
        if (stat_status[i]) fprintf(stderr, "  %s: %ld\n", pa_status_name((pa_status)i), stat_status[i]);
}

static uint64_t rng_state;
static float rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xFFFF) / 16384.0f - 2.0f;
}

/* Fills n elements of dtype with small values (NaN now and then when nan_ok). */
static void fill(void *buf, pa_dtype dt, int64_t n, int nan_ok)
{
    for (int64_t i = 0; i < n; i++) {
        float x = rnd();
        if (nan_ok && (rng_state & 0x3F) == 1) x = NAN;
        switch (dt) {
        case PA_DTYPE_F16: ((uint16_t *)buf)[i] = pa_f32_to_f16(x); break;
        case PA_DTYPE_BF16: ((uint16_t *)buf)[i] = pa_f32_to_bf16(x); break;
        case PA_DTYPE_FP8_E4M3: ((uint8_t *)buf)[i] = pa_f32_to_fp8e4m3(x); break;
        case PA_DTYPE_FP8_E5M2: ((uint8_t *)buf)[i] = pa_f32_to_fp8e5m2(x); break;
        default: ((float *)buf)[i] = x; break;
        }
    }
}

static size_t esize(pa_dtype d)
{
    size_t s = pa_dtype_size(d);
    return s ? s : 4;
}

/* Largest element offset + 1 of a [rows, cols] array with strides (rs, cs), or -1 if it
 * does not fit the caps (or the strides are negative). */
static int64_t extent2d(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t cap)
{
    if (rs < 0 || cs < 0 || rows < 0 || cols < 0) return -1;
    if (rows == 0 || cols == 0) return 0;
    if (rs > cap || cs > cap || rows > cap || cols > cap) return -1;
    int64_t e = (rows - 1) * rs + (cols - 1) * cs + 1;
    return e <= cap ? e : -1;
}

/* How to back a [rows, cols] fp32 array with strides (rs, cs): returns 0 with *e elements to
 * allocate; 1 when the library must refuse the strides (a tiny buffer is given, *e = 1); -1
 * when the strides are acceptable but address more than `cap` elements (the caller skips: the
 * library cannot know a buffer's length). */
static int strided_extent(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t cap, int64_t *e)
{
    *e = 1;
    if (rs < 0 || cs < 0) return 1;
    if (rows <= 0 || cols <= 0) return 0;
    __int128 last = (__int128)(rows - 1) * rs + (__int128)(cols - 1) * cs;
    if (last > INT64_MAX) return 1; /* not addressable with int64 offsets */
    if (last + 1 > cap) return -1;
    *e = (int64_t)last + 1;
    return 0;
}

/* ---- the harness ---------------------------------------------------------------------------- */

typedef struct world {
    pa_layer_config lc;
    float alibi[64], sinks[64];
    pa_layer *layer;
    pa_cache cache;
    void *pool; /* one allocation holding key and value */
    size_t pool_bytes;
    pa_seq seqs[MAX_SEQS];
    int32_t tables[MAX_SEQS][MAX_TABLE], cross[MAX_SEQS][MAX_TABLE];
    int32_t num_seqs;
    pa_batch_config bc;
    int64_t slots[512], cross_slots[512];
    pa_batch *batch;
} world;

static void decode_layer(rd *r, world *w)
{
    pa_layer_config *c = &w->lc;
    int32_t kvh = pick(r, 1, 4), group = pick(r, 1, 4), d = pick(r, 1, 48);
    int64_t heads64 = (int64_t)kvh * group;
    int32_t heads = heads64 >= INT32_MIN && heads64 <= INT32_MAX ? (int32_t)heads64 : kvh;
    if (u8(r) < 16) heads = pick(r, -1, 12); /* possibly not a multiple */
    pa_layer_config_init(c, heads, kvh, d);
    uint8_t f = u8(r);
    if (f & 1) c->scale = pick_float(r);
    c->attn_type = (pa_attn_type)(u8(r) % 4);
    if (u8(r) == 7) c->attn_type = (pa_attn_type)pick(r, -1, 5);
    if (f & 2) {
        c->window_left = pick(r, -2, 20);
        c->window_right = pick(r, -2, 20);
    }
    if (f & 4) c->sliding_window = pick(r, -1, 20);
    int per_head_ok = c->num_heads >= 1 && c->num_heads <= 64;
    if ((f & 8) && per_head_ok) {
        for (int h = 0; h < c->num_heads; h++) w->alibi[h] = u8(r) == 0 ? NAN : (float)(u8(r) % 16) / 16.0f;
        c->alibi_slopes = w->alibi;
    }
    if (f & 16) c->logits_soft_cap = pick_float(r) * 10.0f;
    if ((f & 32) && per_head_ok) {
        for (int h = 0; h < c->num_heads; h++) w->sinks[h] = u8(r) == 0 ? INFINITY : (float)(u8(r) % 32) / 8.0f - 2.0f;
        c->sinks = w->sinks;
    }
    if ((f & 64) && per_head_ok) {
        c->blocksparse.block_size = pick(r, -1, 8);
        c->blocksparse.local_blocks = pick(r, -1, 4);
        c->blocksparse.vert_stride = pick(r, 0, 4);
        c->blocksparse.homo_head = u8(r) & 1;
        c->blocksparse.head_sliding_step = pick(r, -3, 3);
        c->blocksparse.tp_rank = pick(r, -1, 3);
    }
    if (f & 128) {
        c->q_dtype = pick_dtype(r, 1);
        c->kv_dtype = pick_dtype(r, 1);
        c->out_dtype = pick_dtype(r, 1);
        c->cache_dtype = pick_dtype(r, 0);
        if (u8(r) & 1) {
            c->k_scale = pick_float(r);
            c->v_scale = pick_float(r);
        }
    }
}

/* The cache view: layout or decoded strides; geometry mostly that of the layer, sometimes not.
 * The pools are only allocated at the size the strides address when that size is within the
 * caps; strides the library must refuse get a small buffer. */
static int decode_cache(rd *r, world *w)
{
    pa_cache *c = &w->cache;
    const pa_layer_config *lc = &w->lc;
    int32_t bs = pick(r, 1, 8), nb = pick(r, 1, 24);
    int32_t kvh = lc->num_kv_heads, d = lc->head_size;
    pa_dtype dt = lc->cache_dtype;
    uint8_t f = u8(r);
    if (f & 1) kvh = pick(r, 0, 4);
    if (f & 2) d = pick(r, 0, 48);
    if (f & 4) dt = pick_dtype(r, 0);
    /* a pool beyond the caps would not be allocatable: shrink to something valid-looking */
    if (bs < 1 || bs > 64) bs = bs < 1 ? bs : 4;
    if (nb < 1 || nb > 64) nb = nb < 1 ? nb : 8;
    if (kvh > 16) kvh = 2;
    if (d > 600) d = 8;
    if (pa_cache_init(c, (pa_cache_layout)(f >> 7), dt, nb, bs, kvh, d) != PA_STATUS_OK) {
        /* an invalid geometry: a raw view the library must refuse */
        memset(c, 0, sizeof *c);
        c->dtype = dt, c->num_blocks = nb, c->block_size = bs, c->num_kv_heads = kvh, c->head_size = d;
        c->block_stride = c->token_stride = c->head_stride = 1;
    }
    int interleaved = (f & 0x18) == 0x08;
    if (interleaved) c->block_stride *= 2;
    if ((f & 0x18) == 0x10) { /* decoded strides, possibly overlapping or negative */
        c->block_stride = pick64(r, 0, 4096);
        c->token_stride = pick64(r, 0, 512);
        c->head_stride = pick64(r, 0, 256);
    }
    if (u8(r) == 3) c->memory = (pa_memory)pick(r, 0, 3);
    int64_t span = pa_cache_pool_elems(c);
    int64_t alloc = span;
    if (span < 0 || span > MAX_POOL_ELEMS) {
        if (span > MAX_POOL_ELEMS && (f & 0x18) == 0x10) { /* valid but too big: use NHD */
            if (pa_cache_init(c, PA_LAYOUT_NHD, c->dtype, nb, bs, kvh, d) != PA_STATUS_OK) return 0;
            span = pa_cache_pool_elems(c);
            if (span < 0 || span > MAX_POOL_ELEMS) return 0;
            alloc = span;
        } else if (span > MAX_POOL_ELEMS) {
            return 0;
        } else {
            alloc = 64; /* the library must refuse these strides */
        }
    }
    int64_t off = interleaved ? (int64_t)(bs > 0 ? bs : 1) * (kvh > 0 ? kvh : 1) * (d > 0 ? d : 1) : alloc;
    if (off > MAX_POOL_ELEMS) off = alloc;
    size_t es = esize(c->dtype);
    w->pool_bytes = (size_t)(off + alloc) * es + 64;
    w->pool = malloc(w->pool_bytes);
    if (!w->pool) return 0;
    memset(w->pool, 0, w->pool_bytes);
    fill(w->pool, c->dtype, off + alloc, 1);
    c->key = w->pool;
    c->value = (char *)w->pool + (size_t)off * es;
    if (u8(r) == 5) c->key = NULL;
    return 1;
}

/* Per-sequence descriptors. Lengths are mostly small; specials (0, -1, 2^31-1, ...) appear. A
 * table's declared length is the length of the array behind it (or negative: invalid). */
static void decode_batch(rd *r, world *w)
{
    int32_t n = pick(r, 1, MAX_SEQS);
    if (n > MAX_SEQS) n = MAX_SEQS;
    w->num_seqs = n;
    pa_batch_config *bc = &w->bc;
    memset(bc, 0, sizeof *bc);
    bc->block_size = u8(r) < 200 ? w->cache.block_size : pick(r, 0, 8);
    bc->num_blocks = u8(r) < 200 ? w->cache.num_blocks : pick64(r, 0, 32);
    bc->num_cross_blocks = u8(r) < 128 ? w->cache.num_blocks : pick64(r, 0, 32);
    int bs = bc->block_size > 0 ? bc->block_size : 1;
    int32_t nb_pool = bc->num_blocks > 0 && bc->num_blocks < INT32_MAX ? (int32_t)bc->num_blocks : 1;
    int32_t nc_pool = bc->num_cross_blocks > 0 && bc->num_cross_blocks < INT32_MAX ? (int32_t)bc->num_cross_blocks : 1;
    uint8_t shape = u8(r);
    int64_t tokens = 0, enc_tokens = 0;
    for (int32_t i = 0; i < n; i++) {
        pa_seq *q = &w->seqs[i];
        memset(q, 0, sizeof *q);
        q->is_prefill = (shape >> (i % 8)) & 1;
        q->context_len = u8(r) < 64 ? 0 : pick(r, 0, 40);
        q->query_len = pick(r, 1, 12);
        if (!q->is_prefill && u8(r) < 160) q->query_len = 1;
        /* table: enough blocks (usually), random or sequential ids, some out of range */
        int64_t need = ((int64_t)(q->context_len > 0 ? q->context_len : 0) +
                        (q->query_len > 0 ? q->query_len : 0) + bs - 1) / bs;
        uint8_t tf = u8(r);
        int32_t len = need <= MAX_TABLE ? (int32_t)need : MAX_TABLE;
        if (tf < 16) len = pick(r, -1, MAX_TABLE);
        if (len > MAX_TABLE) len = MAX_TABLE;
        for (int32_t b = 0; b < MAX_TABLE; b++)
            w->tables[i][b] = (tf & 0x20) ? (int32_t)((i * 7 + b * 3 + u8(r)) % nb_pool) : (int32_t)((i * need + b) % nb_pool);
        if (tf == 17) w->tables[i][len > 0 ? len - 1 : 0] = pick(r, -2, nb_pool + 2);
        if (tf >= 250) { /* no table: encoder-style */
            q->block_table = NULL;
            q->num_blocks = 0;
        } else if (tf == 249) { /* a count without an array: must be refused */
            q->block_table = NULL;
            q->num_blocks = len > 0 ? len : 1;
        } else {
            q->block_table = w->tables[i];
            q->num_blocks = len;
        }
        if (tf & 0x40) { /* encoder-decoder: encoder tokens and a cross table */
            q->encoder_len = pick(r, 0, 20);
            int64_t cneed = ((int64_t)(q->encoder_len > 0 ? q->encoder_len : 0) + bs - 1) / bs;
            int32_t clen = cneed <= MAX_TABLE ? (int32_t)cneed : MAX_TABLE;
            if (u8(r) < 16) clen = pick(r, -1, MAX_TABLE);
            if (clen > MAX_TABLE) clen = MAX_TABLE;
            for (int32_t b = 0; b < MAX_TABLE; b++) w->cross[i][b] = (int32_t)((i * cneed + b) % nc_pool);
            q->cross_block_table = clen != 0 ? w->cross[i] : NULL;
            q->num_cross_blocks = clen;
        }
        if (q->query_len > 0) tokens += q->query_len;
        if (q->encoder_len > 0) enc_tokens += q->encoder_len;
    }
    /* A valid batch of millions of tokens is legal but would allocate gigabytes of metadata:
     * past 2^16 new or encoder tokens, make the tables (<= MAX_TABLE blocks of <= 8 tokens)
     * too short for the long sequences, which the library must then refuse before allocating. */
    if (tokens > (1 << 16) || enc_tokens > (1 << 16)) {
        if (bc->block_size > 8) bc->block_size = 8;
        for (int32_t i = 0; i < n; i++) {
            pa_seq *q = &w->seqs[i];
            if (q->query_len > 64 && q->num_blocks <= 0) q->block_table = w->tables[i], q->num_blocks = 1;
            if (q->encoder_len > 64 && q->num_cross_blocks <= 0) q->cross_block_table = w->cross[i], q->num_cross_blocks = 1;
        }
    }
    uint8_t sf = u8(r);
    if ((sf & 1) && tokens <= 512) { /* explicit slot mapping, -1 padding, possibly bad */
        int64_t pool = (int64_t)nb_pool * bs;
        for (int64_t t = 0; t < tokens; t++) w->slots[t] = (t * 5 + u8(r)) % (pool + 1) - 1;
        if (tokens && u8(r) < 64) w->slots[tokens - 1] = pick64(r, -3, pool + 3);
        bc->slot_mapping = w->slots;
    }
    if ((sf & 2) && enc_tokens <= 512) {
        int64_t pool = (int64_t)nc_pool * bs;
        for (int64_t t = 0; t < enc_tokens; t++) w->cross_slots[t] = (t * 3 + u8(r)) % (pool + 1) - 1;
        bc->cross_slot_mapping = w->cross_slots;
    }
}

typedef struct bufs {
    void *q, *k, *v, *out;
    float *lse;
    size_t out_bytes, lse_elems;
} bufs;

/* Runs one forward on ctx with decoded strides; a rejection must change nothing. */
static void run_forward(rd *r, world *w, pa_context *ctx, const pa_plan *plan)
{
    const pa_batch_metadata *m = pa_batch_get_metadata(w->batch);
    const pa_layer_config *lc = pa_layer_get_config(w->layer);
    int64_t T = m->num_tokens, ET = m->num_encoder_tokens, H = lc->num_heads, KVH = lc->num_kv_heads,
            D = lc->head_size;
    int64_t keys = m->max_seq_len > m->max_encoder_seq_len ? m->max_seq_len : m->max_encoder_seq_len;
    if (T > WORK_BUDGET || H > WORK_BUDGET || keys > WORK_BUDGET || D > WORK_BUDGET ||
        T * H > WORK_BUDGET || T * H * (keys + 1) > WORK_BUDGET || T * H * (keys + 1) * D > WORK_BUDGET)
        return;
    int64_t qrow = H * D, kvrow = KVH * D;
    pa_forward_args a;
    memset(&a, 0, sizeof a);
    /* row strides: 0 (contiguous), a padded row, or something the library must refuse */
    int64_t st[4];
    const int64_t row[4] = {qrow, kvrow, kvrow, qrow};
    for (int i = 0; i < 4; i++) {
        uint8_t b = u8(r);
        st[i] = b < 160 ? 0 : b < 240 ? row[i] + (b & 7) : pick64(r, -2, row[i]);
    }
    int64_t rows_kv = T > ET ? T : ET;
    int64_t eq = extent2d(T, 1, st[0] ? st[0] : qrow, 1, MAX_ROWS_ELEMS);
    int64_t ek = extent2d(rows_kv, 1, st[1] > 0 ? st[1] : kvrow, 1, MAX_ROWS_ELEMS);
    int64_t ev = extent2d(rows_kv, 1, st[2] > 0 ? st[2] : kvrow, 1, MAX_ROWS_ELEMS);
    int64_t eo = extent2d(T, 1, st[3] ? st[3] : qrow, 1, MAX_ROWS_ELEMS);
    if (eq < 0 || ek < 0 || ev < 0 || eo < 0) return;
    /* +row: the last row is a full row; byte sizes for the widest dtype */
    bufs b;
    b.q = malloc((size_t)(eq + qrow) * 4);
    b.k = malloc((size_t)(ek + kvrow) * 4);
    b.v = malloc((size_t)(ev + kvrow) * 4);
    b.out_bytes = (size_t)(eo + qrow) * 4;
    b.out = malloc(b.out_bytes);
    b.lse = NULL;
    b.lse_elems = 0;
    if (!b.q || !b.k || !b.v || !b.out) goto done;
    fill(b.q, lc->q_dtype, eq + qrow, 0);
    fill(b.k, lc->kv_dtype, ek + kvrow, 0);
    fill(b.v, lc->kv_dtype, ev + kvrow, 0);
    memset(b.out, 0xEE, b.out_bytes);
    uint8_t lf = u8(r);
    if (lf & 1) {
        int64_t ts = 0, hs = 0;
        if (lf & 2) ts = 1, hs = T; /* FlashAttention's [H, T] */
        if (lf & 4) ts = pick64(r, -1, 8), hs = pick64(r, -1, 8);
        int64_t e;
        int how = (ts == 0 && hs == 0) ? strided_extent(T, H, H, 1, MAX_LSE_ELEMS, &e)
                                       : strided_extent(T, H, ts, hs, MAX_LSE_ELEMS, &e);
        if (how >= 0) {
            b.lse_elems = (size_t)e + 1;
            b.lse = malloc(b.lse_elems * sizeof(float));
            if (!b.lse) goto done;
            for (size_t i = 0; i < b.lse_elems; i++) b.lse[i] = -12345.0f;
            a.lse = b.lse;
            a.lse_token_stride = ts;
            a.lse_head_stride = hs;
        }
    }
    a.q = b.q, a.q_row_stride = st[0];
    uint8_t kf = u8(r);
    if (kf < 200) a.k = b.k, a.v = b.v;
    else if (kf < 210) a.k = b.k; /* k without v */
    a.k_row_stride = st[1], a.v_row_stride = st[2];
    a.cache = u8(r) == 1 ? NULL : &w->cache;
    a.out = u8(r) == 1 ? NULL : b.out;
    a.out_row_stride = st[3];

    void *pool_copy = malloc(w->pool_bytes), *out_copy = malloc(b.out_bytes);
    void *lse_copy = b.lse ? malloc(b.lse_elems * sizeof(float)) : NULL;
    if (!pool_copy || !out_copy || (b.lse && !lse_copy)) {
        free(pool_copy), free(out_copy), free(lse_copy);
        goto done;
    }
    memcpy(pool_copy, w->pool, w->pool_bytes);
    memcpy(out_copy, b.out, b.out_bytes);
    if (b.lse) memcpy(lse_copy, b.lse, b.lse_elems * sizeof(float));
    pa_status s = pa_attn_forward(ctx, w->layer, w->batch, plan, &a);
    check_status(s);
    stat_status[s]++;
    if (s) stat_fwd_rejected++;
    else stat_fwd_ok++;
    if (s != PA_STATUS_OK) {
        check(memcmp(pool_copy, w->pool, w->pool_bytes) == 0, "a rejected forward left the cache unchanged");
        check(memcmp(out_copy, b.out, b.out_bytes) == 0, "a rejected forward left the output unchanged");
        check(!b.lse || memcmp(lse_copy, b.lse, b.lse_elems * sizeof(float)) == 0,
              "a rejected forward left the LSE unchanged");
    } else if (lc->out_dtype == PA_DTYPE_F32 && !st[3]) {
        /* every output element was written */
        const uint32_t *o = b.out;
        for (int64_t i = 0; i < T * qrow; i++) check(o[i] != 0xEEEEEEEEu, "forward wrote every output element");
    }
    free(pool_copy), free(out_copy), free(lse_copy);
done:
    free(b.q), free(b.k), free(b.v), free(b.out), free(b.lse);
}

/* Cache ops on the fuzzed cache: write by slot mapping, copy_blocks; rejections change nothing. */
static void run_cache_ops(rd *r, world *w, pa_context *ctx)
{
    const pa_cache *c = &w->cache;
    int64_t kvrow = (int64_t)(c->num_kv_heads > 0 ? c->num_kv_heads : 1) * (c->head_size > 0 ? c->head_size : 1);
    int64_t n = pick64(r, -1, 24);
    if (n > 64 || kvrow > 4096) n = 3;
    int64_t slots[64];
    int64_t pool = (int64_t)(c->num_blocks > 0 ? c->num_blocks : 1) * (c->block_size > 0 ? c->block_size : 1);
    for (int64_t i = 0; i < 64; i++) slots[i] = (i * 11 + u8(r)) % (pool + 2) - 1;
    if (u8(r) < 200) /* mostly distinct slots */
        for (int64_t i = 0; i < 64; i++) slots[i] = i < pool ? (i * 7 + 3) % pool : -1;
    if (n > 0 && u8(r) < 40) slots[n - 1] = pick64(r, -3, pool + 3);
    int64_t rows = n > 0 ? n : 1;
    float *src = malloc((size_t)(rows * kvrow) * 4);
    void *copy = malloc(w->pool_bytes);
    if (!src || !copy) goto done;
    fill(src, PA_DTYPE_F32, rows * kvrow, 0);
    pa_dtype sd = pick_dtype(r, 1);
    float ks = u8(r) < 200 ? 1.0f : pick_float(r), vs = u8(r) < 200 ? 1.0f : pick_float(r);
    memcpy(copy, w->pool, w->pool_bytes);
    pa_status s = pa_cache_write(u8(r) & 1 ? ctx : NULL, c, sd, src, 0, src, 0, slots, n, ks, vs);
    check_status(s);
    if (s) check(memcmp(copy, w->pool, w->pool_bytes) == 0, "a rejected cache_write changed nothing");

    int64_t pairs[2 * MAX_PAIRS];
    int64_t np = pick64(r, -1, MAX_PAIRS);
    if (np > MAX_PAIRS) np = 2;
    int64_t nb = c->num_blocks > 0 ? c->num_blocks : 1;
    for (int i = 0; i < 2 * MAX_PAIRS; i++) pairs[i] = (int64_t)(u8(r) % (nb + 1));
    memcpy(copy, w->pool, w->pool_bytes);
    s = pa_cache_copy_blocks(u8(r) & 1 ? ctx : NULL, c, 1, pairs, np);
    check_status(s);
    if (s) check(memcmp(copy, w->pool, w->pool_bytes) == 0, "a rejected copy_blocks changed nothing");

    /* swap_blocks to and from a second pool of (usually) the same geometry, other layout */
    pa_cache d;
    uint8_t sf = u8(r);
    int32_t dbs = sf & 1 ? pick(r, 1, 8) : c->block_size, dkv = sf & 2 ? pick(r, 1, 4) : c->num_kv_heads;
    int32_t dnb = pick(r, 1, 24);
    if (pa_cache_init(&d, (pa_cache_layout)((sf >> 2) & 1), sf & 8 ? pick_dtype(r, 0) : c->dtype, dnb, dbs, dkv,
                      c->head_size) == PA_STATUS_OK) {
        int64_t de = pa_cache_pool_elems(&d);
        if (de > 0 && de <= MAX_POOL_ELEMS) {
            size_t dbytes = (size_t)de * esize(d.dtype);
            void *dk = malloc(dbytes), *dv = malloc(dbytes), *dkc = malloc(dbytes), *dvc = malloc(dbytes);
            if (dk && dv && dkc && dvc) {
                fill(dk, d.dtype, de, 0);
                fill(dv, d.dtype, de, 0);
                d.key = dk, d.value = dv;
                memcpy(dkc, dk, dbytes), memcpy(dvc, dv, dbytes);
                memcpy(copy, w->pool, w->pool_bytes);
                int64_t n2 = pick64(r, -1, MAX_PAIRS);
                if (n2 > MAX_PAIRS) n2 = 1;
                int back = u8(r) & 1;
                s = pa_cache_swap_blocks(u8(r) & 1 ? ctx : NULL, back ? &d : c, back ? c : &d, pairs, n2);
                check_status(s);
                if (s) {
                    check(memcmp(copy, w->pool, w->pool_bytes) == 0, "a rejected swap_blocks changed nothing");
                    check(memcmp(dkc, dk, dbytes) == 0 && memcmp(dvc, dv, dbytes) == 0,
                          "a rejected swap_blocks changed nothing");
                }
            }
            free(dk), free(dv), free(dkc), free(dvc);
        }
    }
done:
    free(src);
    free(copy);
}

/* pa_convert between decoded dtypes, with decoded counts, scales and (sometimes) overlapping
 * or NULL buffers; pa_cache_read_token at a decoded slot. A rejected call writes nothing. */
static void run_convert(rd *r, const world *w)
{
    enum { N = 256 };
    static uint8_t buf[2 * N * 4], before[2 * N * 4];
    pa_dtype sd = pick_dtype(r, 0), dd = pick_dtype(r, 0);
    if (u8(r) < 16) sd = (pa_dtype)pick(r, -2, 9);
    if (u8(r) < 16) dd = (pa_dtype)pick(r, -2, 9);
    /* dst at an offset into src's buffer: overlapping when the offset is small */
    size_t off = (size_t)(u8(r) % 4) * (N / 2) * 4;
    size_t ss = esize(sd) ? esize(sd) : 4, ds = esize(dd) ? esize(dd) : 4;
    size_t cnt = (size_t)pick64(r, 0, N);
    while (cnt && (cnt * ss > sizeof buf || off + cnt * ds > sizeof buf)) cnt /= 2; /* never lie */
    void *src = u8(r) < 10 ? NULL : (void *)buf, *dst = u8(r) < 10 ? NULL : (void *)(buf + off);
    float scale = u8(r) < 200 ? 1.0f : pick_float(r);
    fill(buf, PA_DTYPE_F32, 2 * N, 1);
    memcpy(before, buf, sizeof buf);
    pa_status s = pa_convert(dd, dst, sd, src, cnt, scale);
    check_status(s);
    if (s) check(memcmp(before, buf, sizeof buf) == 0, "a rejected convert changed nothing");
    if (w->pool && w->cache.key && w->cache.value && w->cache.num_kv_heads > 0 && w->cache.head_size > 0 &&
        (int64_t)w->cache.num_kv_heads * w->cache.head_size <= 4096) {
        static float kout[4096], vout[4096];
        int64_t pool = w->cache.num_blocks * w->cache.block_size;
        s = pa_cache_read_token(&w->cache, pick64(r, -2, pool + 2), u8(r) < 128 ? 1.0f : pick_float(r),
                                u8(r) < 128 ? 1.0f : pick_float(r), u8(r) & 1 ? kout : NULL, u8(r) & 1 ? vout : NULL);
        check_status(s);
    }
}

/* merge_states on small decoded shapes with decoded LSE strides. */
static void run_merge(rd *r)
{
    pa_merge_args m;
    memset(&m, 0, sizeof m);
    m.num_tokens = pick64(r, -1, 6);
    m.num_heads = pick(r, 0, 4);
    m.head_size = pick(r, 0, 8);
    m.dtype = pick_dtype(r, 1);
    if (m.num_tokens > 16 || m.num_heads > 8 || m.head_size > 16) return;
    int64_t T = m.num_tokens > 0 ? m.num_tokens : 0, H = m.num_heads > 0 ? m.num_heads : 1;
    int64_t n = T * H * (m.head_size > 0 ? m.head_size : 1);
    m.lse_token_stride = u8(r) < 128 ? 0 : pick64(r, -1, 8);
    m.lse_head_stride = u8(r) < 128 ? 0 : pick64(r, -1, 8);
    int64_t ts = m.lse_token_stride, hs = m.lse_head_stride;
    if (ts == 0 && hs == 0) ts = H, hs = 1; /* the documented default */
    int64_t e;
    if (strided_extent(T, H, ts, hs, 1 << 12, &e) < 0) return;
    float *la = malloc((size_t)(e + 1) * 4), *lb = malloc((size_t)(e + 1) * 4), *lo = malloc((size_t)(e + 1) * 4);
    float *a = malloc((size_t)(n + 1) * 4), *b = malloc((size_t)(n + 1) * 4), *o = malloc((size_t)(n + 1) * 4);
    if (la && lb && lo && a && b && o) {
        for (int64_t i = 0; i <= e; i++) {
            uint8_t x = u8(r);
            la[i] = x == 1 ? INFINITY : x == 2 ? -INFINITY : rnd();
            x = u8(r);
            lb[i] = x == 1 ? INFINITY : x == 2 ? -INFINITY : rnd();
        }
        fill(a, m.dtype, n + 1, 0);
        fill(b, m.dtype, n + 1, 0);
        memset(o, 0xCD, (size_t)(n + 1) * 4);
        m.out_a = a, m.lse_a = la, m.out_b = b, m.lse_b = lb, m.out = o, m.out_lse = u8(r) & 1 ? lo : NULL;
        pa_status s = pa_merge_states(NULL, &m);
        check_status(s);
        if (s) {
            for (int64_t i = 0; i <= n; i++) check(((uint32_t *)o)[i] == 0xCDCDCDCDu, "a rejected merge changed nothing");
        } else if (m.dtype == PA_DTYPE_F32) {
            for (int64_t i = 0; i < n; i++) check(!isnan(o[i]), "merge of finite inputs is not NaN");
        }
    }
    free(la), free(lb), free(lo), free(a), free(b), free(o);
}

/* FlashInfer CSR decoding of a few decoded arrays (the harness sizes indices by indptr). */
static void run_csr(rd *r)
{
    int32_t n = pick(r, 1, 4);
    if (n > 4) n = 4;
    int32_t qo[5], kv[5], last[4], idx[64];
    pa_seq seqs[4];
    kv[0] = 0;
    qo[0] = 0;
    for (int i = 0; i < 64; i++) idx[i] = u8(r) % 16;
    for (int i = 1; i <= (n > 0 ? n : 0); i++) {
        kv[i] = kv[i - 1] + (int32_t)(u8(r) % 5);
        qo[i] = qo[i - 1] + (int32_t)(u8(r) % 4);
    }
    if (n > 0 && u8(r) < 30) kv[u8(r) % (n + 1)] = pick(r, -2, 20); /* may be non-monotonic */
    int32_t bs = pick(r, 0, 8);
    for (int i = 0; i < 4; i++) last[i] = pick(r, 0, 8);
    /* indptr values must stay inside idx[] for valid (monotonic, non-negative) inputs */
    for (int i = 0; i <= (n > 0 ? n : 0); i++)
        if (kv[i] > 64) return;
    pa_status s = pa_seqs_from_csr(n, u8(r) & 1 ? qo : NULL, kv, idx, last, bs, seqs);
    check_status(s);
    if (s == PA_STATUS_OK && bs >= 1) {
        pa_batch_config bc = {bs, 16, 0, NULL, NULL};
        pa_batch *b = NULL;
        s = pa_batch_create(&bc, seqs, n, &b);
        check_status(s);
        pa_batch_destroy(b);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rd r = {data, size};
    static int stats_registered;
    if (!stats_registered) {
        stats_registered = 1;
        if (getenv("FUZZ_API_STATS")) atexit(print_stats);
    }
    static world W;
    world *w = &W;
    memset(w, 0, sizeof *w);
    rng_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)size;
    for (size_t i = 0; i < size && i < 16; i++) rng_state = rng_state * 31 + data[i] + 1;

    decode_layer(&r, w);
    pa_status s = pa_layer_create(&w->lc, &w->layer);
    check_status(s);
    if (s) check(w->layer == NULL, "a failed create returns no layer");
    else stat_layer_ok++;
    if (!decode_cache(&r, w)) goto out;
    decode_batch(&r, w);
    s = pa_batch_create(&w->bc, w->seqs, w->num_seqs, &w->batch);
    check_status(s);
    if (s) check(w->batch == NULL, "a failed create returns no batch");
    else stat_batch_ok++;

    if (w->layer && w->batch) {
        for (int bi = 0; bi < pa_backend_count(); bi++) {
            const pa_backend *be = pa_backend_at(bi);
            const char *name = pa_backend_name(be);
            if (strcmp(name, "reference") != 0 && strcmp(name, "cpu") != 0) continue;
            if (!pa_backend_available(be, NULL, 0)) continue;
            pa_context_options o = {1 + (int32_t)(u8(&r) % 2), 0, NULL};
            pa_context *ctx = NULL;
            s = pa_context_create(be, &o, &ctx);
            check_status(s);
            if (s) continue;
            pa_plan *plan = NULL;
            if (u8(&r) & 1) {
                s = pa_plan_create(ctx, w->layer, w->batch, &plan);
                check_status(s);
            }
            run_forward(&r, w, ctx, plan);
            pa_plan_destroy(plan);
            run_cache_ops(&r, w, ctx);
            pa_context_destroy(ctx);
        }
    } else {
        run_cache_ops(&r, w, NULL);
    }
    run_merge(&r);
    run_csr(&r);
    run_convert(&r, w);
out:
    pa_batch_destroy(w->batch);
    pa_layer_destroy(w->layer);
    free(w->pool);
    return 0;
}
