/* cpu_attn.c: running a plan: one item = FlashAttention-2 over one key chunk for up to
 * CPU_ROWS query rows sharing one KV head (see cpu.h), then the LSE merge of chunked rows.
 *
 * Edge cases, all handled here rather than in the kernels: keys outside a row's visible range
 * (causal, window, block-sparse) get a score of -inf and a probability of exactly 0; key tiles
 * no row can see are never loaded; keys at or beyond the sequence's length are never read; a
 * row that sees nothing keeps m = -inf, l = 0 and yields out = 0, lse = -inf; the sink enters
 * the denominator once, as the initial state of an unchunked row or in the merge. */
#include "cpu.h"

/* Decode (direct) tiles: keys per tile, and how many kernel calls ahead (one KV head's K or V
 * rows of a tile each) their rows are prefetched: pa__cpu_kernels.decode_pf. Overridable for
 * experiments. */
#ifndef CPU_DECODE_KT
#  define CPU_DECODE_KT 32
#endif
#ifndef CPU_DECODE_KT8
#  define CPU_DECODE_KT8 64 /* over 1-byte (fp8) caches: the same bytes per call as 32 bf16 keys */
#endif
#ifndef CPU_DECODE_KT_B64
#  define CPU_DECODE_KT_B64 64 /* over 2-byte caches whose block size is a multiple of 64 */
#endif
#ifndef CPU_DECODE_PFL
#  define CPU_DECODE_PFL 3 /* __builtin_prefetch locality (where not pa__cpu_kernels.decode_pf_l2) */
#endif
_Static_assert(CPU_DECODE_KT >= 16 && CPU_DECODE_KT <= CPU_KT, "decode tile");
_Static_assert(CPU_DECODE_KT8 >= 16 && CPU_DECODE_KT8 <= CPU_KT, "decode tile, fp8");

typedef struct {
    pa__cpu_ctx *c;
    const pa__fwd *f;
    pa__cpu_plan *p;
} job;

/* Where a key row comes from: the paged cache, or the step's own K/V rows (encoder types). */
typedef struct {
    const char *kbase, *vbase;
    pa_dtype dtype;
    size_t esz;
    const pa_cache *cache; /* NULL: rows kbase + (row0 + j) * krs */
    const int32_t *table;
    int64_t head_off;      /* elements: kvh * head_stride, or kvh * head_size */
    int64_t row0, krs, vrs;
} key_src;

static void key_src_init(key_src *ks, const pa__fwd *f, int32_t s, int32_t kvh)
{
    const struct pa_layer *L = f->layer;
    const struct pa_batch *b = f->batch;
    const pa_forward_args *a = f->args;
    pa_attn_type type = L->cfg.attn_type;
    memset(ks, 0, sizeof *ks);
    if (type == PA_ATTN_ENCODER || type == PA_ATTN_ENCODER_ONLY) {
        ks->kbase = a->k;
        ks->vbase = a->v;
        ks->dtype = L->cfg.kv_dtype;
        ks->head_off = (int64_t)kvh * L->cfg.head_size;
        ks->row0 = b->md.query_start_loc[s];
        ks->krs = a->k_row_stride;
        ks->vrs = a->v_row_stride;
    } else {
        ks->cache = a->cache;
        ks->kbase = a->cache->key;
        ks->vbase = a->cache->value;
        ks->dtype = a->cache->dtype;
        ks->head_off = (int64_t)kvh * a->cache->head_stride;
        ks->table = pa__seq_table(b, type, s);
    }
    ks->esz = pa_dtype_size(ks->dtype);
}

static void key_rows(const key_src *ks, bool value, int64_t a, int n, const void **rows)
{
    const char *base = value ? ks->vbase : ks->kbase;
    if (!ks->cache) {
        int64_t rs = value ? ks->vrs : ks->krs;
        for (int i = 0; i < n; i++)
            rows[i] = base + ((ks->row0 + a + i) * rs + ks->head_off) * (int64_t)ks->esz;
        return;
    }
    const pa_cache *c = ks->cache;
    for (int i = 0; i < n; i++) {
        int64_t j = a + i;
        int64_t off = pa__cache_key_offset(c, ks->table, j) + ks->head_off;
        rows[i] = base + off * (int64_t)ks->esz;
    }
}

/* K and V rows of keys [a, a + n): one division per call, then a walk through the blocks. */
static void key_rows_kv(const key_src *ks, int64_t a, int n, const void **krows, const void **vrows)
{
    if (!ks->cache) {
        key_rows(ks, false, a, n, krows);
        key_rows(ks, true, a, n, vrows);
        return;
    }
    const pa_cache *c = ks->cache;
    /* the token stride only multiplies t < block_size - 1 (validated so); with block_size 1 it
     * may be anything (extent 1), so it is neither scaled nor added there */
    const int64_t bs = c->block_size, ts = bs > 1 ? c->token_stride * (int64_t)ks->esz : 0;
    int64_t b = a / bs, t = a % bs;
    for (int i = 0; i < n; b++, t = 0) {
        int64_t off = ((int64_t)ks->table[b] * c->block_stride + t * c->token_stride + ks->head_off) *
                      (int64_t)ks->esz;
        const char *kp = ks->kbase + off, *vp = ks->vbase + off;
        int m = (int)(bs - t < n - i ? bs - t : n - i); /* rows of this block */
        for (int j = 0; j < m; j++) {
            krows[i + j] = kp + j * ts;
            vrows[i + j] = vp + j * ts;
        }
        i += m;
    }
}

/* A tile's keys: runs [a, a + n) of consecutive keys, their columns one after another. A tile
 * is one run, but where a block-sparse prefill gathers the sparse blocks its rows see (below). */
typedef struct {
    int64_t a;
    int n;
} key_run;
#define CPU_TILE_RUNS (CPU_KT / 16 + 1)

/* K and V rows of a tile's runs, column after column. */
static void run_rows_kv(const key_src *ks, const key_run *run, int nrun, const void **krows, const void **vrows)
{
    for (int i = 0, c = 0; i < nrun; c += run[i].n, i++) key_rows_kv(ks, run[i].a, run[i].n, krows + c, vrows + c);
}

/* Asks for rows that the next kernel call will read (one KV head's K or V rows of a tile: 4 KiB
 * for bf16, 16 keys, d 128): issued one call ahead, so they arrive while the current call
 * computes. Always inlined: gcc 12 deletes calls to a non-inlined function whose only effect is
 * __builtin_prefetch, i.e. the prefetches silently vanish (they did in the first version). */
static inline __attribute__((always_inline)) void prefetch_rows(const void *const *rows, int n, int64_t row_bytes,
                                                                bool l2)
{
    /* rows of one block are contiguous in HND: one sweep per run of rows (measured 20-30% less
     * CPU time than 4 prefetches per row over the same lines, on a quiet host) */
    for (int i = 0; i < n;) {
        const char *p = rows[i], *q = p + row_bytes;
        for (i++; i < n && (const char *)rows[i] == q; i++) q += row_bytes;
        if (l2)
            for (; p < q; p += 64) __builtin_prefetch(p, 0, 2);
        else
            for (; p < q; p += 64) __builtin_prefetch(p, 0, CPU_DECODE_PFL);
    }
}

/* The rows of kernel call i of a decode tile in consumption order: K of its visible KV heads
 * vh[0..nv-1], V of the same heads, then K of the next tile's first visible heads (nkr[j]: nnc
 * keys; none when there is none). A head that no row sees is not read, so not prefetched either. */
static pa__cpu_pf decode_rows(const pa__cpu_kernels *K, const void *kr[][CPU_KT], const void *vr[][CPU_KT],
                              const void *nkr[][CPU_KT], const unsigned char *vh, int nv, int nnv, int i, int nc,
                              int nnc, int64_t row_bytes)
{
    pa__cpu_pf pf = {NULL, 0, (int)row_bytes, K->decode_pf_l2};
    if (i < nv) pf.rows = kr[vh[i]], pf.n = nc;
    else if (i < 2 * nv) pf.rows = vr[vh[i - nv]], pf.n = nc;
    else {
        int j = i - 2 * nv; /* >= 0 here; said again so that gcc's -Warray-bounds sees it */
        if (j >= 0 && j < nnv && j < K->decode_pf && nnc) pf.rows = nkr[j], pf.n = nnc;
    }
    return pf;
}

/* Prefetch of kernel call i: by the kernel table when it spreads prefetches over its loops
 * (returns the rows to pass it; NULL when there are none), else here, in one sweep (NULL). */
static inline __attribute__((always_inline)) const pa__cpu_pf *
decode_prefetch(const pa__cpu_kernels *K, pa__cpu_pf *pf, const void *kr[][CPU_KT], const void *vr[][CPU_KT],
                const void *nkr[][CPU_KT], const unsigned char *vh, int nv, int nnv, int i, int nc, int nnc,
                int64_t row_bytes)
{
    *pf = decode_rows(K, kr, vr, nkr, vh, nv, nnv, i, nc, nnc, row_bytes);
    if (!pf->n) return NULL;
    if (K->pf_spread) return pf;
    prefetch_rows(pf->rows, pf->n, row_bytes, pf->l2);
    return NULL;
}

/* Block-sparse visibility of the keys [a, b) from row (h, p): 0 none, 1 all, 2 some. The rule
 * is constant over a sparse block up to the causal cut j <= p, which the range already has. */
static int bs_tile_vis(const struct pa_layer *L, int32_t h, int64_t p, int64_t a, int64_t b)
{
    int64_t bsz = L->cfg.blocksparse.block_size;
    bool any = false, all = true;
    for (int64_t j = a; j < b; j = (j / bsz + 1) * bsz) {
        bool v = pa__blocksparse_visible(L, h, p, j);
        any |= v;
        all &= v;
    }
    return any ? (all ? 1 : 2) : 0;
}

/* A block-sparse prefill's query rows by (query head, sparse query block), whose rows share
 * the sparse rule: p one of their positions, [lo, hi) a range holding every key any of them may
 * see (their ranges' hull; rows that see nothing left out). Returns the number of groups. */
typedef struct {
    int32_t h;
    int64_t p, lo, hi;
} bs_group;

static int bs_groups(const struct pa_layer *L, const pa__cpu_scratch *sc, int nr, bs_group *g)
{
    const int64_t bsz = L->cfg.blocksparse.block_size;
    int n = 0;
    for (int r = 0; r < nr; r++) {
        if (sc->lo[r] >= sc->hi[r]) continue;
        int i = 0;
        while (i < n && !(g[i].h == sc->head[r] && g[i].p / bsz == sc->pos[r] / bsz)) i++;
        if (i == n) {
            g[n++] = (bs_group){sc->head[r], sc->pos[r], sc->lo[r], sc->hi[r]};
        } else {
            if (sc->lo[r] < g[i].lo) g[i].lo = sc->lo[r];
            if (sc->hi[r] > g[i].hi) g[i].hi = sc->hi[r];
        }
    }
    return n;
}

/* Whether group g sees a key of the sparse block [j, be) (one block, cut to a range). */
static inline bool group_sees(const struct pa_layer *L, const bs_group *g, int64_t j, int64_t be)
{
    return g->lo < be && g->hi > j && pa__blocksparse_visible(L, g->h, g->p, j);
}

/* The next tile of a block-sparse prefill: up to kt keys from *next on (before end), gathered
 * from the sparse blocks that some group sees, as at most CPU_TILE_RUNS runs; *next moves past
 * them and past the blocks no row sees. Returns the number of runs (0: no keys left). With
 * sparse blocks shorter than the tile, contiguous tiles computed every key of blocks their rows
 * mostly could not see: a 1024-token prompt at sparse block 16, vertical stride 4, took longer
 * than a dense one (bench/NOTES.md, forty-ninth pass). */
static int gather_tile(const struct pa_layer *L, const bs_group *g, int ng, int64_t *next, int64_t end, int kt,
                       key_run *run)
{
    const int64_t bsz = L->cfg.blocksparse.block_size;
    int n = 0, nc = 0;
    int64_t j = *next;
    while (j < end && nc < kt) {
        int64_t be = (j / bsz + 1) * bsz;
        if (be > end) be = end;
        bool seen = false;
        for (int i = 0; i < ng && !seen; i++)
            seen = group_sees(L, &g[i], j, be);
        if (!seen) {
            j = be;
            continue;
        }
        const bool joins = n > 0 && run[n - 1].a + run[n - 1].n == j;
        if (!joins && n == CPU_TILE_RUNS) break;
        const int m = (int)(be - j < kt - nc ? be - j : kt - nc);
        if (joins) run[n - 1].n += m;
        else run[n++] = (key_run){j, m};
        nc += m;
        j += m;
    }
    *next = j;
    return n;
}

/* Which of a tile's nr rows (nrk per KV head) see which of its keys (the runs run[0 .. nrun)):
 * vis[r] 0 none, 1 all, 2 some; hv[k]: some row of KV head k sees a key; any, full (every row
 * all), every (every row some). [vlo, vhi): the keys within every row's range (a tile of one
 * run inside it needs no test per row, but under block sparsity). */
static inline void tile_vis(const struct pa_layer *L, const pa__cpu_scratch *sc, bool bs, int nr, int nrk,
                            const key_run *run, int nrun, int64_t vlo, int64_t vhi, unsigned char *vis,
                            unsigned char hv[CPU_KROWS / 16], bool *any, bool *full, bool *every)
{
    const bool whole = !bs && nrun == 1 && run[0].a >= vlo && run[0].a + run[0].n <= vhi;
    bool an = whole, fu = true, ev = true;
    memset(hv, whole, CPU_KROWS / 16);
    if (whole) memset(vis, 1, (size_t)nr);
    for (int r = 0; r < nr && !whole; r++) {
        bool some = false, all = true;
        for (int i = 0; i < nrun; i++) {
            const int64_t a = run[i].a, e = a + run[i].n;
            int v;
            if (sc->hi[r] <= a || sc->lo[r] >= e) v = 0;
            else v = (sc->lo[r] <= a && sc->hi[r] >= e) ? 1 : 2;
            if (v && bs) {
                int64_t ca = a > sc->lo[r] ? a : sc->lo[r];
                int64_t ce = e < sc->hi[r] ? e : sc->hi[r];
                int w = bs_tile_vis(L, sc->head[r], sc->pos[r], ca, ce);
                v = w == 0 ? 0 : (v == 1 && w == 1 ? 1 : 2);
            }
            some |= v != 0;
            all &= v == 1;
        }
        const int v = !some ? 0 : all ? 1 : 2;
        vis[r] = (unsigned char)v;
        hv[r / nrk] |= v != 0;
        an |= v != 0;
        fu &= v == 1;
        ev &= v != 0;
    }
    *any = an, *full = fu, *every = ev;
}

/* bad: a NaN or +inf logit reached the row: every element and the lse are NaN. */
static void write_row(const pa__fwd *f, int64_t tok, int32_t h, const float *o, float m, float l, bool bad,
                      const pa__cpu_kernels *k)
{
    const pa_forward_args *a = f->args;
    const pa_layer_config *cfg = &f->layer->cfg;
    int32_t d = cfg->head_size;
    float vs = pa__dtype_is_fp8(cfg->cache_dtype) && cfg->attn_type != PA_ATTN_ENCODER &&
                       cfg->attn_type != PA_ATTN_ENCODER_ONLY
                   ? cfg->v_scale
                   : 1.0f;
    size_t osz = pa_dtype_size(cfg->out_dtype);
    char *dst = (char *)a->out + (tok * a->out_row_stride + (int64_t)h * d) * (int64_t)osz;
    static const float none[512];
    if (m == PA__CPU_NEG_INF_LOGIT && !bad) o = none, l = 0.0f; /* every key it saw had a logit of -inf */
    const float rl = bad ? NAN : l > 0.0f ? 1.0f / l : 0.0f;
    if (vs == 1.0f) {
        k->store_row(cfg->out_dtype, o, d, rl, dst);
    } else {
        /* fp8: (o / l) v_scale, o / l within the V codes' range, so that a tiny v_scale rounds
         * once into the subnormals and a huge one overflows only where the result does (v_scale
         * / l first underflowed: v_scale 14 2^-149 over 37 keys gave 0; an independent oracle
         * found it, bench/NOTES.md, thirty-sixth pass) */
        float t[512];
        for (int32_t i = 0; i < d; i++) t[i] = o[i] * rl;
        k->store_row(cfg->out_dtype, t, d, vs, dst);
    }
    if (a->lse)
        a->lse[tok * a->lse_token_stride + h * a->lse_head_stride] =
            bad ? NAN : l > 0.0f ? m + logf(l) : -INFINITY;
}

/* The scale the query rows take: the layer's, times k_scale over an fp8 cache (its keys are
 * read unscaled). In double: the product of two finite floats is exact there, and finite even
 * where fp32 would overflow (scale 2^64 over k_scale 2^64); rounded to float it is the fp32
 * product. */
static double q_scale(const pa_layer_config *cfg)
{
    bool cached = cfg->attn_type == PA_ATTN_DECODER || cfg->attn_type == PA_ATTN_ENCODER_DECODER;
    return (double)cfg->scale * (cached && pa__dtype_is_fp8(cfg->cache_dtype) ? (double)cfg->k_scale : 1.0);
}

/* The least e >= 0 for which qsc / 2^e and every finite element of the n at q times it are
 * finite floats: the query rows' pre-scaling by qsc (> 1) would otherwise overflow where the
 * contract's order, the scale after the dot product, need not (an independent oracle found the
 * NaN rows: q 2^126, scale 4, k 0; bench/NOTES.md, thirty-eighth pass). 0 for nearly every
 * call. Ends: qsc is finite, and so is the largest finite |q|. */
static int q_overflow_exp(const float *q, size_t n, double qsc)
{
    float mx = 0.0f;
    for (size_t i = 0; i < n; i++) {
        const float a = fabsf(q[i]);
        mx = a > mx && a != INFINITY ? a : mx; /* (inf or NaN: so they stay, scaled or not) */
    }
    int e = 0;
    while (ldexp(qsc, -e) > (double)FLT_MAX || (double)mx * ldexp(qsc, -e) > (double)FLT_MAX) e++;
    return e;
}

/* The nr rows' scores of a tile times 2^e (e > 0): exact, but where the result overflows (as the
 * contract's scale dot(q, k) does then) */
static void scores_times_pow2(pa__cpu_scratch *sc, int nr, int nc, int e)
{
    const double f = ldexp(1.0, e);
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) sc->s[r * CPU_KT + c] = (float)((double)sc->s[r * CPU_KT + c] * f);
}

/* Whether some value among the first d of the n rows is NaN or inf (all exponent bits set). Only
 * asked for tiles with masked entries (see pa__cpu_pv_masked). */
static bool rows_nonfinite(pa_dtype dt, const void *const *rows, int n, int d)
{
    for (int i = 0; i < n; i++) {
        unsigned acc = 0;
        switch (dt) {
        case PA_DTYPE_F32: {
            const uint32_t *x = rows[i];
            for (int j = 0; j < d; j++) acc |= (x[j] & 0x7f800000u) == 0x7f800000u;
            break;
        }
        case PA_DTYPE_F16:
        case PA_DTYPE_BF16: {
            const uint16_t *x = rows[i];
            unsigned e = dt == PA_DTYPE_F16 ? 0x7c00u : 0x7f80u;
            for (int j = 0; j < d; j++) acc |= (x[j] & e) == e;
            break;
        }
        default: { /* fp8: E4M3 has no inf, NaN is S.1111.111; E5M2 as IEEE */
            const uint8_t *x = rows[i];
            unsigned e = dt == PA_DTYPE_FP8_E4M3 ? 0x7fu : 0x7cu;
            for (int j = 0; j < d; j++) acc |= (x[j] & e) == e;
            break;
        }
        }
        if (acc) return true;
    }
    return false;
}

/* Whether some score of the nr rows' first nc is -inf (any_neg_inf, for tables without it): on
 * the bits, which the compiler vectorizes; a float minimum it leaves scalar (-fno-fast-math), and
 * that cost 10% of a cache-resident decode */
static bool any_neg_inf(const pa__cpu_kernels *K, const float *s, int nr, int nc)
{
    if (K->any_neg_inf) return K->any_neg_inf(s, CPU_KT, nr, nc);
    uint32_t any = 0;
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) {
            uint32_t b;
            memcpy(&b, s + (size_t)r * CPU_KT + c, sizeof b);
            any |= b == 0xff800000u;
        }
    return any != 0;
}

/* -inf on the scores of the keys a + c (c < nc) that row r does not see: outside its range
 * [lo, hi) or in a hidden sparse block. Run by run of keys that share their visibility (a
 * sparse block's keys within the range): a test per key, two 64-bit divisions and a remainder
 * each, made block-sparse layers slower than dense ones at small sparse blocks (a prefill of
 * 1024 tokens at block 16: 3.5x; an audit, forty-third pass). */
static void mask_hidden(const struct pa_layer *L, const pa__cpu_scratch *sc, int r, int64_t a, int nc, float *s)
{
    const int64_t lo = sc->lo[r], hi = sc->hi[r], bsz = L->cfg.blocksparse.block_size;
    for (int c = 0; c < nc;) {
        const int64_t j = a + c;
        int64_t end = a + nc; /* the run [j, end) */
        bool seen;
        if (j < lo) {
            seen = false;
            if (lo < end) end = lo;
        } else if (j >= hi) {
            seen = false;
        } else {
            if (hi < end) end = hi;
            if (bsz > 0 && (j / bsz + 1) * bsz < end) end = (j / bsz + 1) * bsz;
            seen = pa__blocksparse_visible(L, sc->head[r], sc->pos[r], j);
        }
        const int ce = (int)(end - a);
        if (!seen)
            for (; c < ce; c++) s[c] = -INFINITY;
        c = ce;
    }
}

/* Scores of one tile after the QK product: soft-cap, ALiBi, mask (in the contract's order). */
static void score_fix(const pa__cpu_kernels *K, const struct pa_layer *L, pa__cpu_scratch *sc, int nr,
                      const key_run *run, int nrun, int nc)
{
    const pa_layer_config *cfg = &L->cfg;
    /* A logit of -inf before the hidden keys are masked (an infinite q or k value) is a visible
     * key's, not a masked one: as IEEE arithmetic has it (the reference), its V is multiplied by
     * exp(-inf - m) = 0, so a NaN or inf there reaches the row. Made the lowest finite float, it
     * gets a probability of (about) +0, not the masked -0 that keeps a V out; a row that sees
     * nothing above it comes out empty (PA__CPU_NEG_INF_LOGIT, write_row). The hidden keys' are
     * masked below whatever they held. */
    if (any_neg_inf(K, sc->s, nr, nc))
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < nc; c++)
                if (sc->s[r * CPU_KT + c] == -INFINITY) sc->s[r * CPU_KT + c] = PA__CPU_NEG_INF_LOGIT;
    /* the soft-cap by the table where it has one (rows that see nothing: -inf below anyway) */
    const bool capped = cfg->logits_soft_cap > 0.0f && K->softcap_rows;
    if (capped) K->softcap_rows(sc->s, CPU_KT, nr, nc, cfg->logits_soft_cap);
    for (int r = 0; r < nr; r++) {
        float *s = sc->s + r * CPU_KT;
        if (sc->vis[r] == 0) {
            for (int c = 0; c < nc; c++) s[c] = -INFINITY;
            continue;
        }
        if (cfg->logits_soft_cap > 0.0f && !capped) {
            float cap = cfg->logits_soft_cap, inv = 1.0f / cap;
            for (int c = 0; c < nc; c++) s[c] = cap * tanhf(s[c] * inv);
        }
        if (L->alibi) {
            /* (a visible logit the penalty takes to -inf, from -FLT_MAX above or by overflow,
             * goes back to the lowest finite float: an ALiBi slope of 1e30 dropped a visible
             * -inf logit's NaN V; an audit, forty-ninth pass) */
            float slope = L->alibi[sc->head[r]];
            for (int i = 0, c = 0; i < nrun; i++)
                for (int64_t j = run[i].a; j < run[i].a + run[i].n; j++, c++) {
                    int64_t dj = j - sc->pos[r];
                    const float x = s[c] - slope * (float)(dj < 0 ? -dj : dj);
                    s[c] = x == -INFINITY ? PA__CPU_NEG_INF_LOGIT : x;
                }
        }
        if (sc->vis[r] == 2)
            for (int i = 0, c = 0; i < nrun; c += run[i].n, i++) mask_hidden(L, sc, r, run[i].a, run[i].n, s + c);
    }
}

/* Token (relative to the tile) and query head of row r of an item or merge (see cpu.h). */
static inline void row_of(int r, int32_t h0, int32_t nh, int32_t nt, int32_t group, int *t, int32_t *h)
{
    int per = nh * nt, k = r / per, rem = r % per;
    *t = rem / nh;
    *h = h0 + k * group + rem % nh;
}

/* The item's row (token-major: row_of) of row r of an item kept head after head (byhead:
 * item_pass), r itself otherwise. */
static inline int ext_row(bool byhead, int r, int32_t nh, int32_t nt)
{
    return byhead ? (int)(r % nt * nh + r / nt) : r;
}

/* Swaps the n rows from a with those from b (a + n <= b): everything item_pass keeps per row
 * across tiles. */
static void swap_rows(pa__cpu_scratch *sc, int a, int b, int n, int32_t dp)
{
    for (int i = 0; i < n; i++) {
        const int x = a + i, y = b + i;
        float tf;
        int64_t ti;
        tf = sc->m[x], sc->m[x] = sc->m[y], sc->m[y] = tf;
        tf = sc->l[x], sc->l[x] = sc->l[y], sc->l[y] = tf;
        ti = sc->lo[x], sc->lo[x] = sc->lo[y], sc->lo[y] = ti;
        ti = sc->hi[x], sc->hi[x] = sc->hi[y], sc->hi[y] = ti;
        ti = sc->pos[x], sc->pos[x] = sc->pos[y], sc->pos[y] = ti;
        const int32_t th = sc->head[x];
        sc->head[x] = sc->head[y], sc->head[y] = th;
        const unsigned char tb = sc->bad[x];
        sc->bad[x] = sc->bad[y], sc->bad[y] = tb;
        for (int32_t j = 0; j < dp; j++) {
            const size_t u = (size_t)x * dp + j, w = (size_t)y * dp + j;
            tf = sc->q[u], sc->q[u] = sc->q[w], sc->q[w] = tf;
            tf = sc->o[u], sc->o[u] = sc->o[w], sc->o[w] = tf;
            const uint16_t t16 = sc->q16[u];
            sc->q16[u] = sc->q16[w], sc->q16[w] = t16;
        }
    }
}

/* Whether passes per query head (item_pass, perhead) pay over one pass of the union: the keys
 * of [lo, hi) the heads h0 .. h0 + nh - 1 see, summed over the heads, at most half of nh times
 * those some head sees. Each head's pass computes its rows over its own keys only, but transposes
 * the K tiles the heads share once per head: over a 2048-token prompt with Phi-3-small's
 * pattern (64-key blocks, 16 local, stride 8; this test declines) passes took 1.15x the union's
 * time; at 16-key blocks, 2 local, stride 4 (taken), 0.53x (bench/NOTES.md, forty-ninth pass). */
static bool perhead_pays(const struct pa_layer *L, const bs_group *g, int ng, int64_t lo, int64_t hi, int32_t h0,
                         int32_t nh)
{
    const int64_t bsz = L->cfg.blocksparse.block_size;
    int64_t uni = 0, sum = 0;
    for (int64_t j = lo; j < hi;) {
        int64_t be = (j / bsz + 1) * bsz;
        if (be > hi) be = hi;
        unsigned char seen[CPU_ROWS] = {0};
        int heads = 0;
        for (int i = 0; i < ng; i++)
            if (!seen[g[i].h - h0] && group_sees(L, &g[i], j, be))
                seen[g[i].h - h0] = 1, heads++;
        uni += heads ? be - j : 0;
        sum += heads * (be - j);
        j = be;
    }
    return 2 * sum <= uni * nh;
}

/* Whether some row of a tile (sequence s, tokens t0 .. t0 + nt - 1) sees a key of [k0, k1) in
 * this layer: the plan is made for every layer of its geometry, so a chunk that this layer's
 * window hides from the whole tile is an item with nothing to do, and no part of its merge
 * (items and merges decide alike; the union of the rows' key ranges is that of the first
 * row's low bound and the last row's high one, both growing with the position). */
static bool chunk_seen(const struct pa_layer *L, const struct pa_batch *b, int32_t s, int32_t t0, int32_t nt,
                       int64_t k0, int64_t k1)
{
    const int64_t kv = pa__kv_len(b, L->cfg.attn_type, s);
    const int64_t p0 = (int64_t)b->md.context_lens[s] + t0;
    int64_t lo, hi, unused;
    pa__key_range(L, p0, kv, &lo, &unused);
    pa__key_range(L, p0 + nt - 1, kv, &unused, &hi);
    return (lo > k0 ? lo : k0) < (hi < k1 ? hi : k1);
}

/* Whether a row's sum l or some element of its o is NaN or infinite, and then o[0 .. d) times
 * un, in one pass that the compiler vectorizes (a signed compare of the magnitudes' bits: SSE2
 * has it): the check and the scaling apart, the check element by element, were a tenth of the
 * instructions of a cache-resident decode of 64 sequences x 16 keys
 * (bench/NOTES.md, forty-sixth pass) */
static bool row_nonfinite_scale(float *o, int d, float l, float un)
{
    int32_t acc = 0, b;
    memcpy(&b, &l, sizeof b);
    acc |= (b & 0x7fffffff) > 0x7f7fffff ? -1 : 0;
    for (int i = 0; i < d; i++) {
        memcpy(&b, o + i, sizeof b);
        acc |= (b & 0x7fffffff) > 0x7f7fffff ? -1 : 0;
        o[i] *= un;
    }
    return acc != 0;
}

/* One item with the kernels K, writing the rows that `only` (NULL: all) marks. Where K's weights
 * are scaled (p_exp), a row that is not NaN anyway and ended with a non-finite sum or o is not
 * written but marked in redo (true returned): its scaled sums overflowed where the unscaled ones
 * may not (V values beyond ~2^64 / l), or its V held an inf or NaN, whose results the unscaled
 * weights give as the contract's fp32 arithmetic has them. The other rows keep the scaled
 * weights' results (an audit found a rerun of the whole item changing rows that had not
 * overflowed, even through a key they mask). */
static bool item_pass(job *J, int64_t index, int thread, const pa__cpu_kernels *K, const unsigned char *only,
                      unsigned char *redo)
{
    const pa__cpu_item *it = &J->p->items[index];
    const pa__fwd *f = J->f;
    const struct pa_layer *L = f->layer;
    const pa_layer_config *cfg = &L->cfg;
    const struct pa_batch *b = f->batch;
    pa__cpu_scratch *sc = &J->c->scratch[thread];
    const int32_t d = cfg->head_size, dp = J->p->dp;
    const int nrk = it->nh * it->nt, nr = nrk * it->nkv; /* rows per KV head, in all */
    int kt = CPU_KROWS / it->nkv < CPU_KT ? CPU_KROWS / it->nkv : CPU_KT;
    const int64_t qs = b->md.query_start_loc[it->seq];
    const int64_t ctxl = b->md.context_lens[it->seq];
    const int64_t kvlen = pa__kv_len(b, cfg->attn_type, it->seq);
    bool split = it->part >= 0;
    const bool bs = cfg->blocksparse.block_size > 0;
    if (split) {
        /* a chunk the layer's window hides from every row: its merge passes over it; the only
         * chunk the window leaves: its rows finish here, as an unsplit item's, and its merge
         * does nothing (run_merge) */
        if (!chunk_seen(L, b, it->seq, it->t0, it->nt, it->k0, it->k1)) return false;
        split = chunk_seen(L, b, it->seq, it->t0, it->nt, 0, it->k0) ||
                chunk_seen(L, b, it->seq, it->t0, it->nt, it->k1, INT64_MAX);
    }

    /* A block-sparse prompt whose query heads see different sparse blocks (vLLM's per-head
     * pattern) keeps its rows head after head here (byhead: row r is the item's row ext_row(r);
     * merges and partial rows see the item's order), so that each head's rows can take their
     * keys alone where that pays (perhead_pays): the four query heads of a KV head together saw
     * every block of a stride-4 pattern (bench/NOTES.md, forty-ninth pass). Items of more than 32
     * rows (no decode tiles) and 9 tokens or more (the transposed prefill kernels). */
    bool byhead = false;
    if (bs && it->nkv == 1 && it->nh > 1 && it->nt > 8 && nr > 32 && cfg->blocksparse.block_size >= 16)
        for (int32_t i = 1; i < it->nh && !byhead; i++) byhead = L->bs_offset[it->h0 + i] != L->bs_offset[it->h0];
    int64_t ulo = INT64_MAX, uhi = INT64_MIN;
    int64_t vlo = INT64_MIN, vhi = INT64_MAX; /* every row sees [vlo, vhi) (maybe empty) */
    size_t qsz = pa_dtype_size(cfg->q_dtype);
    for (int r = 0; r < nr; r++) {
        int t;
        int32_t h;
        row_of(ext_row(byhead, r, it->nh, it->nt), it->h0, it->nh, it->nt, L->group, &t, &h);
        int64_t tok = qs + it->t0 + t, lo, hi;
        sc->head[r] = h;
        sc->pos[r] = ctxl + it->t0 + t;
        pa__key_range(L, sc->pos[r], kvlen, &lo, &hi);
        if (lo < it->k0) lo = it->k0;
        if (hi > it->k1) hi = it->k1;
        sc->lo[r] = lo;
        sc->hi[r] = hi;
        if (lo > vlo) vlo = lo;
        if (hi < vhi) vhi = hi;
        if (lo < hi) {
            if (lo < ulo) ulo = lo;
            if (hi > uhi) uhi = hi;
        }
        bool sink = L->sinks && !split;
        sc->m[r] = sink ? L->sinks[h] : -INFINITY;
        sc->l[r] = sink ? ldexpf(1.0f, K->p_exp) : 0.0f; /* the sink's weight, exp(0) */
        sc->bad[r] = 0;
        sc->rows[r] = (const char *)f->args->q + (tok * f->args->q_row_stride + (int64_t)h * d) * (int64_t)qsz;
    }
    memset(sc->o, 0, (size_t)nr * dp * sizeof(float));

    if (ulo < uhi) {
        /* the layer's scale: on the fp32 query rows (below), or on the sums of the bf16 dot
         * products over the query rows as given */
        const double qsc_d = q_scale(cfg);
        const float qsc = (float)qsc_d; /* (inf where the product overflows fp32: fp32 kernels only) */
        key_src ks[CPU_KROWS / 16];
        for (int k = 0; k < it->nkv; k++) key_src_init(&ks[k], f, it->seq, it->kvh + k);
        /* short tiles (decode) read K and V straight from the cache, converting in registers:
         * nothing to amortize a converted copy over. Up to 8 query rows per KV head, 16 over
         * bf16 and fp32 caches, whose conversion costs a shift or nothing (AVX2, 16 x 4096 one
         * thread, direct against the converted copy at 12 and 16 rows: bf16 -7 to -12%, fp32 -23
         * to -27%, f16 +0 to +7%, E4M3 +4 to +11%; bench/NOTES.md, thirteenth pass) */
        const bool narrow = ks[0].dtype != PA_DTYPE_BF16 && ks[0].dtype != PA_DTYPE_F32;
        const int narrow_rows = ks[0].dtype == PA_DTYPE_F16 ? K->direct_rows_f16 : K->direct_rows_fp8;
        const int direct_rows = !narrow ? 16 : narrow_rows > 0 ? narrow_rows : 8;
        /* past direct_rows, over 2- and 4-byte caches, up to 32 rows in calls of 16 (a 5-token
         * step at GQA 4, one thread: bf16 82 -> 68 ms against the transposed copies; over E4M3
         * 10% slower, so fp8 keeps them; bench/NOTES.md, forty-third pass) */
        const bool fp8 = ks[0].esz == 1;
        /* head sizes not a multiple of 16 where the table has qk_src_tail and pv_src_tail
         * (and the head size is a multiple of its tail_align), with those kernels only: the
         * other direct kernels read whole 16- or 32-dim steps (one thread, 16 x 4096 bf16 at
         * head size 120, against copies: bench/NOTES.md, forty-fourth pass; AVX2, forty-sixth) */
        const bool tail_ok = K->qk_src_tail && K->pv_src_tail && K->tail_align > 0 && d % K->tail_align == 0;
        const bool direct = K->qk_src && (d == dp || tail_ok) && nrk <= (direct_rows == 16 && !fp8 ? 32 : direct_rows);
        /* bf16 queries as given, for bf16 dot products over bf16 keys (scale after the sums);
         * the item's KV heads share one key source dtype */
        bool q16 = K->qk_src_bf16 && cfg->q_dtype == PA_DTYPE_BF16 && ks[0].dtype == PA_DTYPE_BF16 && isfinite(qsc) &&
                   (d == dp || !direct);
        /* bf16 queries as given over fp8 keys too, where a table has qk_src_e4m3_bf16 (or
         * qk_src_e5m2_bf16), for the rows per KV head and head sizes it is meant for (decode
         * tiles: those rows are within the direct ones). One thread, 16 x 4096 from DRAM: E4M3
         * through f16 at GQA 8 16.3 -> 15.3 ms (GQA 6 equal, GQA 4 slower: 7 rows and up); by
         * byte tables (AVX512-VBMI) at GQA 4 7.7 -> 6.7 ms, GQA 8 14.2 -> 13.0 (bench/NOTES.md,
         * thirty-first and thirty-second passes) */
        const bool e4 = ks[0].dtype == PA_DTYPE_FP8_E4M3, e5 = ks[0].dtype == PA_DTYPE_FP8_E5M2;
        void (*const qk8)(const void *const *, int, const uint16_t *, int, int, float, float *, int,
                          const pa__cpu_pf *) = e4 ? K->qk_src_e4m3_bf16 : e5 ? K->qk_src_e5m2_bf16 : NULL;
        bool q16e = !q16 && qk8 && K->qk_src && cfg->q_dtype == PA_DTYPE_BF16 &&
                    d % (e4 ? K->qk_e4m3_bf16_dims : 16) == 0 && nrk >= (e4 ? K->qk_e4m3_bf16_rows : 1) && nrk <= 8 &&
                    isfinite(qsc);
        /* the rows copied for those kernels, and tested on the way: rows that bf16 dot products
         * would not score as the contract does go to the fp32 kernels (cpu.h, q16_load) */
        if ((q16 || q16e) && !K->q16_load(sc->rows, nr, d, dp, sc->q16, qsc, q16)) q16 = q16e = false;
        const int64_t row_bytes = (int64_t)d * (int64_t)ks[0].esz;
        /* direct tiles use no K/V scratch; their key tile is CPU_DECODE_KT (32: with the
         * prefetches spread over the kernels' loops, measured equal to 16 from DRAM for bf16 and
         * 5-10% faster L3-resident and for fp8; 16 was better while the driver prefetched each
         * call's rows in one sweep), over fp8 caches CPU_DECODE_KT8 (64: the same bytes per
         * kernel call; on a Zen 5, one thread, 16 x 4096 E4M3 11.43 -> 10.03 ms, while 64 bf16
         * keys were 11% slower than 32 from DRAM; bench/NOTES.md, twenty-eighth pass), and over
         * 2-byte HND caches whose blocks hold a multiple of 64 keys CPU_DECODE_KT_B64 (64: each
         * call then reads 64 keys of one block and KV head end to end, 16 KiB at d 128, and at
         * block 64 the next call the next head's; one thread, 16 x 4096 bf16 at block 64: 72% of
         * the read probe against 59-60% with 32-key tiles; NHD 52% against 55%: not there;
         * bench/NOTES.md, thirty-fifth pass) */
        const int dpf = K->decode_pf;
        /* (a block's rows of one KV head end to end, as in HND, in blocks of 64 keys or more) */
        const pa_cache *kc = ks[0].cache;
        const bool b64 = kc && kc->token_stride == d && kc->block_size % 64 == 0;
        if (direct) kt = ks[0].esz == 1 ? CPU_DECODE_KT8 : ks[0].esz == 2 && b64 ? CPU_DECODE_KT_B64 : CPU_DECODE_KT;
        /* bf16 keys: the query rows pair-split once per item, each 16-dim block of a key then
         * converts by one shift and one AND (qk_src_pairs). E4M3 keys on e4m3_bf16 tables: as
         * bf16 (or f32) words 2^-120 times their value (PA__CPU_E4M3B), with the query rows
         * 2^120 times theirs where that is exact (else the f16 forms); pair-split too where the
         * table has qk_src_pairs. Their V rows go as PA__CPU_E4M3B whatever the queries (as
         * E4M3, to the byte tables, where the table has pv_fp8_lut). */
        const bool e4b = ks[0].dtype == PA_DTYPE_FP8_E4M3 && K->e4m3_bf16;
        /* bf16 V: PV by bf16 dot products where the table has them (AVX512-BF16), for any
         * query dtype; their kernels decline rows they cannot take exactly (cpu.h). The
         * probabilities are rounded to the cache's dtype only, as the cuda backend's tensor-core
         * paths round them: not for an encoder's own bf16 rows beside a cache of another dtype. */
        const bool vpairs = ks[0].dtype == PA_DTYPE_BF16 && cfg->cache_dtype == PA_DTYPE_BF16 &&
                            (direct ? K->pv_src_bf16 != NULL && d == dp : K->pv_bf16 != NULL);
        /* long tiles (prefill) transpose K once and take outer products; needs the tile's
         * CPU_KT x dp transposed copy to fit the K scratch of one KV head */
        const bool transposed = !direct && K->qk_t && nrk > 8 && kt == CPU_KT && kt * it->nkv <= CPU_KROWS;
        /* the query rows as fp32, pre-scaled: for every QK but the bf16 dot products. Where
         * scale q would overflow (a scale above 1 over query values near FLT_MAX) and the
         * contract's scale dot(q, k) need not, by scale 2^-e, the scores then times 2^e (exact),
         * e the least that keeps every q finite (post_e) */
        int post_e = 0;
        /* the pair split in registers where the table can (the driver's loop, through a scratch
         * copy of each group, was a fifth of a cache-resident decode of 64 sequences x 16 keys;
         * bench/NOTES.md, forty-sixth pass), over bf16 keys with the scale in the same pass */
        const bool split_k = direct && !q16 && K->qk_src_pairs && K->pair_split && d == dp &&
                             dp % K->pair_span == 0 && K->pair_span % 16 == 0 && K->pair_span <= 64;
        float split_mul = 1.0f;
        if (!(q16e || (q16 && (direct || (transposed && K->qk_t_bf16 && d % 2 == 0))))) {
            K->load_rows(cfg->q_dtype, sc->rows, nr, d, dp, sc->q); /* nr <= CPU_ROWS */
            float qm = qsc;
            if (qsc_d > 1.0) {
                post_e = q_overflow_exp(sc->q, (size_t)nr * dp, qsc_d);
                qm = (float)ldexp(qsc_d, -post_e); /* (e = 0: qsc) */
            }
            if (split_k && ks[0].dtype == PA_DTYPE_BF16) split_mul = qm; /* (pairs below) */
            else
                for (int64_t i = 0; i < (int64_t)nr * dp; i++) sc->q[i] *= qm;
        }
        const bool e4p = direct && e4b && !q16e && pa__cpu_e4m3_up_ok(sc->q, (size_t)nr * dp);
        const bool pairs = direct && !q16 && K->qk_src_pairs && d == dp && dp % K->pair_span == 0 &&
                           (ks[0].dtype == PA_DTYPE_BF16 || e4p);
        if (split_k && pairs) {
            K->pair_split(sc->q, (size_t)nr * dp, K->pair_span, e4p ? PA__CPU_E4M3_UP : split_mul);
        } else {
            if (pairs) pa__cpu_pair_split(sc->q, nr, dp, K->pair_span);
            if (e4p)
                for (size_t i = 0; i < (size_t)nr * dp; i++) sc->q[i] *= PA__CPU_E4M3_UP;
        }
        const void *kr[CPU_KROWS / 16][CPU_KT], *vr[CPU_KROWS / 16][CPU_KT];
        const void *nkr[CPU_DECODE_PF_MAX + 1][CPU_KT], *nvr[CPU_KT];
        int nnc = 0, nnv = 0;
        bool first = true, anybad = false;
        /* block-sparse prefills gather their tiles from the sparse blocks their rows see, per
         * query head where that pays (perhead: a pass over the keys per head, its rows swapped
         * to the front for it) */
        const bool gather = bs && !direct && cfg->blocksparse.block_size >= 16; /* (byhead: true) */
        bs_group grp[CPU_ROWS];
        int ngrp = gather ? bs_groups(L, sc, nr, grp) : 0;
        const bool perhead = byhead && perhead_pays(L, grp, ngrp, ulo, uhi, it->h0, it->nh);
        const int npass = perhead ? it->nh : 1;
        for (int pass = 0; pass < npass; pass++) {
            if (pass) swap_rows(sc, 0, pass * it->nt, it->nt, dp);
            const int nrp = perhead ? it->nt : nr, nrkp = perhead ? it->nt : nrk; /* the pass's rows */
            if (perhead) ngrp = bs_groups(L, sc, nrp, grp);
            for (int64_t j0 = it->k0 + (ulo - it->k0) / kt * kt, next = ulo;;) {
                key_run run[CPU_TILE_RUNS];
                int nrun = 1;
                if (gather) {
                    nrun = gather_tile(L, grp, ngrp, &next, uhi, kt, run);
                    if (!nrun) break;
                } else {
                    if (j0 >= uhi) break;
                    run[0].a = j0 > ulo ? j0 : ulo;
                    run[0].n = (int)((j0 + kt < uhi ? j0 + kt : uhi) - run[0].a);
                    j0 += kt;
                }
                /* the tile's first key, the key after its last, its columns */
                const int64_t a = run[0].a, e = run[nrun - 1].a + run[nrun - 1].n;
                int nc = 0;
                for (int i = 0; i < nrun; i++) nc += run[i].n;
                /* hv[k]: some row of KV head k sees a key of the tile; a head none of whose rows
                 * does is passed over (its rows' weights would be -0 and their alpha 1: the same
                 * bits), and in decode tiles so is each row that sees none of it. A block-sparse
                 * layer whose heads see different sparse blocks (vLLM's per-head pattern) read every
                 * key of every head, and was slower than dense (an audit, forty-third pass); then
                 * still, through the hidden heads' prefetches and the scans of V for the rows that
                 * see part of a tile (forty-fifth pass). */
                unsigned char hv[CPU_KROWS / 16], vh[CPU_KROWS / 16];
                bool any, full, every;
                tile_vis(L, sc, bs, nrp, nrkp, run, nrun, vlo, vhi, sc->vis, hv, &any, &full, &every);
                if (!any) continue;
                int nv = 0;
                for (int k = 0; k < it->nkv; k++)
                    if (hv[k]) vh[nv++] = (unsigned char)k;

                int64_t ne = e + kt < uhi ? e + kt : uhi;
                /* prefill tiles (transposed): this tile's V rows are prefetched while QK computes, the
                 * next tile's K rows while PV computes, each spread over the kernel call (pf_share).
                 * The copies of the tile had waited on memory: ~12% of a 2048-token f32 prefill in
                 * load_rows and load_rows_t, ~5% after; all at once before the call, the prefetches
                 * had stalled as long as the loads they replaced. */
                pa__cpu_pf pfkr = {nkr[0], 0, (int)row_bytes, false};
                if (direct) {
                    /* the item's KV heads differ only by their head offset: the first head's walk
                     * through the block table, moved (a division and a walk per head took ~5% of the
                     * samples of a cache-resident decode; 16 x 4096 bf16 5.90 -> 5.82 ms, E4M3 9.28
                     * -> 9.12; bench/NOTES.md, twenty-eighth pass) */
                    key_rows_kv(&ks[0], a, nc, kr[0], vr[0]);
                    for (int k = 1; k < it->nkv; k++) {
                        const int64_t dk = (ks[k].head_off - ks[0].head_off) * (int64_t)ks[0].esz;
                        for (int i = 0; i < nc; i++) {
                            kr[k][i] = (const char *)kr[0][i] + dk;
                            vr[k][i] = (const char *)vr[0][i] + dk;
                        }
                    }
                    /* the next tile's first visible heads' K rows, for the prefetch at this tile's
                     * end (a next tile that no row sees: none; the tile after it then prefetches
                     * its own first calls) */
                    nnc = e < uhi ? (int)(ne - e) : 0;
                    nnv = 0;
                    if (nnc && !bs && e >= vlo && ne <= vhi) {
                        for (int k = 0; k < it->nkv && nnv < dpf; k++) key_rows_kv(&ks[k], e, nnc, nkr[nnv++], nvr);
                    } else if (nnc) {
                        unsigned char nvis[CPU_ROWS], nhv[CPU_KROWS / 16];
                        bool nany, nfull, nevery;
                        const key_run nrn = {e, nnc};
                        tile_vis(L, sc, bs, nrp, nrkp, &nrn, 1, vlo, vhi, nvis, nhv, &nany, &nfull, &nevery);
                        for (int k = 0; k < it->nkv && nnv < dpf; k++)
                            if (nhv[k]) key_rows_kv(&ks[k], e, nnc, nkr[nnv++], nvr);
                    }
                    if (!nnv) nnc = 0;
                    /* the first tile's first calls (later tiles': prefetched at the previous one's end) */
                    for (int k = 0; k < dpf && first; k++) {
                        pa__cpu_pf r = decode_rows(K, kr, vr, nkr, vh, nv, nnv, k, nc, nnc, row_bytes);
                        prefetch_rows(r.rows, r.n, row_bytes, r.l2);
                    }
                    first = nnc == 0;
                }
                /* K of every KV head (head after head: whole blocks front to back in HND), scores */
                for (int vi = 0; vi < nv; vi++) {
                    const int k = vh[vi];
                    float *kk = sc->k + (size_t)k * kt * dp;
                    float *sk = sc->s + (size_t)k * nrkp * CPU_KT;
                    if (direct) {
                        pa__cpu_pf pfr;
                        const pa__cpu_pf *pf =
                            dpf ? decode_prefetch(K, &pfr, kr, vr, nkr, vh, nv, nnv, vi + dpf, nc, nnc, row_bytes) : NULL;
                        /* the runs of rows that see the tile, in calls of up to direct_rows (rows past
                         * them: further calls over the tile's keys, from L1); a row that sees none of
                         * it keeps its scores of before, which score_fix masks */
                        const unsigned char *vk = sc->vis + (size_t)k * nrkp;
                        for (int r0 = 0, r1; r0 < nrkp; r0 = r1) {
                            if (full) r1 = r0 + direct_rows < nrkp ? r0 + direct_rows : nrkp;
                            else
                                for (r1 = r0; r1 < nrkp && r1 - r0 < direct_rows && vk[r1]; r1++) {}
                            if (r1 == r0) {
                                r1++;
                                continue;
                            }
                            const int n = r1 - r0;
                            const size_t qo = ((size_t)k * nrkp + (size_t)r0) * dp;
                            float *skr = sk + (size_t)r0 * CPU_KT;
                            const pa__cpu_pf *pfc = pf;
                            pf = NULL;
                            if (q16)
                                K->qk_src_bf16(kr[k], nc, sc->q16 + qo, n, dp, qsc, skr, CPU_KT, pfc);
                            else if (q16e)
                                qk8(kr[k], nc, sc->q16 + qo, n, dp, qsc, skr, CPU_KT, pfc);
                            else if (pairs)
                                K->qk_src_pairs(e4p ? PA__CPU_E4M3B : ks[k].dtype, kr[k], nc, sc->q + qo, n, dp, skr, CPU_KT, pfc);
                            else if (d != dp)
                                K->qk_src_tail(e4p ? PA__CPU_E4M3B : ks[k].dtype, kr[k], nc, sc->q + qo, n, d, dp, skr,
                                               CPU_KT, pfc);
                            else
                                K->qk_src(e4p ? PA__CPU_E4M3B : ks[k].dtype, kr[k], nc, sc->q + qo, n, dp, skr, CPU_KT, pfc);
                        }
                    } else if (transposed) {
                        run_rows_kv(&ks[k], run, nrun, kr[k], vr[k]);
                        pa__cpu_pf pfvr = {vr[k], nc, (int)row_bytes, false};
                        if (q16 && K->qk_t_bf16 && d % 2 == 0) {
                            /* the tile as transposed 32-bit pairs of bf16 (the same transpose, on words) */
                            K->load_rows_t(PA_DTYPE_F32, kr[k], nc, d / 2, dp / 2, kk);
                            K->qk_t_bf16(sc->q16 + (size_t)k * nrkp * dp, nrkp, (const uint32_t *)kk, nc, dp, qsc, sk,
                                         CPU_KT, &pfvr);
                        } else {
                            K->load_rows_t(ks[k].dtype, kr[k], nc, d, dp, kk);
                            K->qk_t(sc->q + (size_t)k * nrkp * dp, nrkp, kk, nc, dp, sk, CPU_KT, &pfvr);
                        }
                    } else {
                        /* (other tiles: this head's V rows prefetched for the PV after the softmax,
                         * the next tile's K rows during the PV; a decode of head size 120 waited on
                         * its reads here without them: an audit, forty-third pass) */
                        run_rows_kv(&ks[k], run, nrun, sc->rows, vr[k]);
                        prefetch_rows(vr[k], nc, row_bytes, K->decode_pf_l2);
                        K->load_rows(ks[k].dtype, sc->rows, nc, d, dp, kk);
                        K->qk(sc->q + (size_t)k * nrkp * dp, nrkp, kk, nc, dp, sk, CPU_KT);
                    }
                }
                if (post_e) scores_times_pow2(sc, nrp, nc, post_e);
                score_fix(K, L, sc, nrp, run, nrun, nc);

                /* every row sees some key of the tile (score_fix has put -inf where it does not) and
                 * none has gone bad: the table's whole-tile step where it has one (the same bits as
                 * the loop below, which treats a visible row's -inf scores like any other) */
                const bool fused = every && !anybad && K->softmax_rows &&
                                   K->softmax_rows(sc->s, CPU_KT, nrp, nc, sc->m, sc->l, sc->alpha);
                for (int r = 0; r < nrp && !fused; r++) {
                    float *s = sc->s + r * CPU_KT;
                    float mx = sc->vis[r] && !sc->bad[r] ? K->row_max(s, nc) : -INFINITY;
                    if (isnan(mx) || mx == INFINITY) sc->bad[r] = 1, anybad = true; /* the row is NaN from now on */
                    float mn = mx > sc->m[r] ? mx : sc->m[r];
                    if (mn == -INFINITY || sc->bad[r]) {
                        for (int c = 0; c < nc; c++) s[c] = -0.0f; /* masked (bad rows: NaN anyway) */
                        sc->alpha[r] = 1.0f;
                        continue;
                    }
                    float al = pa__cpu_alpha(sc->m[r], mn);
                    float sum = sc->vis[r] ? K->exp_row(s, nc, mn) : 0.0f;
                    if (!sc->vis[r])
                        for (int c = 0; c < nc; c++) s[c] = -0.0f;
                    if (pa__cpu_far(sc->m[r] - mn)) {
                        /* the maximum rose by more than 87: e^(m - mn) is below fp32's normals, where
                         * the rows' earlier keys would weigh a subnormal or 0 times their due (an audit
                         * found keys before a much larger one dropped). o and l take it in two exact
                         * steps instead: 2^64 e^(m - mn) here, 2^-64 as the PV's alpha. */
                        const float a2 = pa__cpu_far_up(sc->m[r] - mn);
                        float *orow = sc->o + (size_t)r * dp;
                        for (int j = 0; j < dp; j++) orow[j] *= a2;
                        sc->l[r] = sc->l[r] * a2 * 0x1p-64f + sum;
                        al = 0x1p-64f;
                    } else {
                        sc->l[r] = sc->l[r] * al + sum;
                    }
                    sc->m[r] = mn;
                    sc->alpha[r] = al;
                }
                for (int vi = 0; vi < nv; vi++) {
                    const int k = vh[vi];
                    const float *pk = sc->s + (size_t)k * nrkp * CPU_KT;
                    float *vv = sc->v + (size_t)k * kt * dp, *ok = sc->o + (size_t)k * nrkp * dp;
                    const float *ak = sc->alpha + k * nrkp;
                    if (direct) {
                        pa__cpu_pf pfr;
                        const pa__cpu_pf *pf =
                            dpf ? decode_prefetch(K, &pfr, kr, vr, nkr, vh, nv, nnv, nv + vi + dpf, nc, nnc, row_bytes)
                                : NULL;
                        /* runs of up to direct_rows rows that see the same keys of the tile, each with
                         * the column mask of those keys (none where they see all): a listed key is
                         * then seen by every row the call sums it into, so a NaN or inf in its V is
                         * theirs, and the rows that mask it never take it. A row that sees none of the
                         * tile is passed over (alpha 1 and weights -0: its row unchanged). Before,
                         * a tile some rows saw in part went to one call with the union of the rows'
                         * masks, after a scan of its V rows for NaN and inf (and through the generic
                         * PV where it found one): vLLM's per-head sparse blocks took 1.8x the time
                         * of dense attention (bench/NOTES.md, forty-fifth pass). */
                        for (int r0 = 0, r1; r0 < nrkp; r0 = r1) {
                            const unsigned char *cm = NULL;
                            if (full) {
                                r1 = r0 + direct_rows < nrkp ? r0 + direct_rows : nrkp;
                            } else {
                                const float *p0 = pk + (size_t)r0 * CPU_KT;
                                unsigned char *m0 = sc->colmask;
                                int seen = 0;
                                for (int c = 0; c < nc; c++) seen += m0[c] = !pa__cpu_masked(p0[c]);
                                for (r1 = r0 + 1; seen && r1 < nrkp && r1 - r0 < direct_rows; r1++) {
                                    const float *p1 = pk + (size_t)r1 * CPU_KT;
                                    int c = 0;
                                    while (c < nc && m0[c] == !pa__cpu_masked(p1[c])) c++;
                                    if (c < nc) break;
                                }
                                if (!seen) {
                                    r1 = r0 + 1;
                                    continue;
                                }
                                if (seen < nc) cm = m0;
                            }
                            const int n = r1 - r0;
                            const float *pkr = pk + (size_t)r0 * CPU_KT;
                            float *okr = ok + (size_t)r0 * dp;
                            const pa__cpu_pf *pfc = pf;
                            pf = NULL;
                            /* (bf16 dot products where the table has them and the rows suit them) */
                            const pa_dtype vt = e4b && !K->pv_fp8_lut ? PA__CPU_E4M3B : ks[k].dtype;
                            if (vpairs && K->pv_src_bf16(vr[k], nc, pkr, CPU_KT, n, dp, ak + r0, cm, okr, pfc)) continue;
                            if (d != dp) K->pv_src_tail(vt, vr[k], nc, pkr, CPU_KT, n, d, dp, ak + r0, cm, okr, pfc);
                            else K->pv_src(vt, vr[k], nc, pkr, CPU_KT, n, dp, ak + r0, cm, okr, pfc);
                        }
                        continue;
                    }
                    const unsigned char *cm = NULL;
                    if (!full) {
                        for (int c = 0; c < nc; c++) {
                            unsigned char v = 0;
                            for (int r = 0; r < nrkp && !v; r++) v = !pa__cpu_masked(pk[r * CPU_KT + c]);
                            sc->colmask[c] = v;
                        }
                        cm = sc->colmask;
                    }
                    {
                        const void *const *vrows = vr[k]; /* (set with the tile's K rows) */
                        /* the next tile's K rows of this head (read next) */
                        pfkr.n = e < uhi ? (int)(ne - e) : 0;
                        if (pfkr.n) key_rows_kv(&ks[k], e, pfkr.n, nkr[0], nvr);
                        const pa__cpu_pf *pf = pfkr.n ? &pfkr : NULL;
                        if (vpairs && K->load_v_pairs(vrows, nc, d, dp, cm, (uint32_t *)vv) &&
                            K->pv_bf16(pk, CPU_KT, nrkp, (const uint32_t *)vv, nc, dp, ak, ok, pf)) {
                            /* the tile as bf16 pairs, for bf16 dot products (cpu.h, pv_bf16) */
                            continue;
                        }
                        if (K->pv_rows && ks[k].dtype == PA_DTYPE_F32 && d == dp &&
                            !(cm && rows_nonfinite(ks[k].dtype, vrows, nc, d))) {
                            /* fp32 V rows as they lie: the scratch copy would change nothing */
                            K->pv_rows(pk, CPU_KT, nrkp, vrows, nc, dp, ak, cm, ok, pf);
                            continue;
                        }
                        K->load_rows(ks[k].dtype, vrows, nc, d, dp, vv);
                        if (cm && rows_nonfinite(ks[k].dtype, vrows, nc, d))
                            pa__cpu_pv_masked(pk, CPU_KT, nrkp, vv, nc, dp, ak, cm, ok, pf);
                        else
                            K->pv(pk, CPU_KT, nrkp, vv, nc, dp, ak, cm, ok, pf);
                    }
                }
            }
            if (pass) swap_rows(sc, 0, pass * it->nt, it->nt, dp);
        }
    }

    bool again = false;
    if (K->p_exp) {
        /* back to exp(s - m): exact where the unscaled values are normal */
        const float un = ldexpf(1.0f, -K->p_exp);
        for (int r = 0; r < nr; r++) {
            float *o = sc->o + (size_t)r * dp;
            redo[r] = row_nonfinite_scale(o, d, sc->l[r], un) && !sc->bad[r];
            again |= redo[r];
            sc->l[r] *= un;
        }
    }
    for (int r = 0; r < nr; r++) {
        const float *o = sc->o + (size_t)r * dp;
        if ((only && !only[r]) || (K->p_exp && redo[r])) continue;
        if (split) {
            float *pr = J->p->part + (size_t)(it->part + ext_row(byhead, r, it->nh, it->nt)) * (dp + 2);
            pr[0] = sc->m[r];
            pr[1] = sc->bad[r] ? NAN : sc->l[r]; /* NaN l: the merge makes the row NaN */
            memcpy(pr + 2, o, (size_t)d * sizeof(float));
        } else {
            int t;
            int32_t h;
            row_of(ext_row(byhead, r, it->nh, it->nt), it->h0, it->nh, it->nt, L->group, &t, &h);
            write_row(f, qs + it->t0 + t, h, o, sc->m[r], sc->l[r], sc->bad[r], K);
        }
    }
    return again;
}

static void run_item(void *arg, int64_t index, int thread)
{
    job *J = arg;
    unsigned char redo[CPU_ROWS], unused[CPU_ROWS];
    if (item_pass(J, index, thread, &J->c->kern, NULL, redo))
        item_pass(J, index, thread, &J->c->kern_exact, redo, unused);
}

/* Combines the chunks of one tile of rows in chunk order; the sink joins here, once. */
static void run_merge(void *arg, int64_t index, int thread)
{
    job *J = arg;
    const pa__cpu_merge *mg = &J->p->merges[index];
    const pa__fwd *f = J->f;
    const struct pa_layer *L = f->layer;
    const int32_t d = L->cfg.head_size, dp = J->p->dp;
    const int nr = mg->nh * mg->nt * mg->nkv;
    const int64_t qs = f->batch->md.query_start_loc[mg->seq];
    float *acc = J->c->scratch[thread].o;
    /* the chunks this layer's window leaves to the tile (chunk_seen: their items ran; the
     * visible ones are consecutive); none: empty rows (or the sink's) */
    int c0 = 0, c1 = mg->nchunks;
    while (c0 < c1 && !chunk_seen(L, f->batch, mg->seq, mg->t0, mg->nt, c0 * mg->chunk, (c0 + 1) * mg->chunk)) c0++;
    while (c1 > c0 && !chunk_seen(L, f->batch, mg->seq, mg->t0, mg->nt, (c1 - 1) * mg->chunk, c1 * mg->chunk)) c1--;
    if (c1 - c0 == 1) return; /* (its item wrote the rows) */
    for (int r = 0; r < nr; r++) {
        int t;
        int32_t h;
        row_of(r, mg->h0, mg->nh, mg->nt, L->group, &t, &h);
        float M = L->sinks ? L->sinks[h] : -INFINITY;
        bool bad = false;
        for (int c = c0; c < c1; c++) {
            const float *pr = J->p->part + (size_t)(mg->part + (int64_t)c * nr + r) * (dp + 2);
            bad |= isnan(pr[1]);
            if (pr[1] > 0.0f && pr[0] > M) M = pr[0];
        }
        float Lsum = 0.0f;
        memset(acc, 0, (size_t)d * sizeof(float));
        if (M != -INFINITY) {
            if (L->sinks) Lsum = expf(L->sinks[h] - M);
            for (int c = c0; c < c1; c++) {
                const float *pr = J->p->part + (size_t)(mg->part + (int64_t)c * nr + r) * (dp + 2);
                if (!(pr[1] > 0.0f)) continue;
                if (pa__cpu_far(pr[0] - M)) {
                    /* a chunk more than 87 below the largest: e^(m - M) is below fp32's normals
                     * (an audit found such chunks weighed 0): its terms in two steps, 2^64
                     * e^(m - M) and then 2^-64, as the items' rescale does */
                    const float w2 = pa__cpu_far_up(pr[0] - M);
                    Lsum += pr[1] * w2 * 0x1p-64f;
                    for (int j = 0; j < d; j++) acc[j] += pr[2 + j] * w2 * 0x1p-64f;
                    continue;
                }
                float w = expf(pr[0] - M);
                Lsum += pr[1] * w;
                for (int j = 0; j < d; j++) acc[j] += w * pr[2 + j];
            }
        }
        write_row(f, qs + mg->t0 + t, h, acc, M, Lsum, bad, &J->c->kern);
    }
}

pa_status pa__cpu_attend(pa__cpu_ctx *c, const pa__fwd *f, pa__cpu_plan *p)
{
    job J = {c, f, p};
    pa__cpu_pool_run(c->pool, p->nitems, run_item, &J);
    pa__cpu_pool_run(c->pool, p->nmerges, run_merge, &J);
    return PA_STATUS_OK;
}
