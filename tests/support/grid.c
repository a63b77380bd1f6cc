/* grid.c: the shared case grid, its harness and the independent oracle.
 *
 * A case is a layer, a cache layout and a batch of sequences. Running it builds every input from
 * the case's seed (so two runs see identical inputs), fills every cache element no sequence owns
 * with NaN, poisons every output element with NaN and every byte around and between them with a
 * canary, runs forward, and checks: the status, that every output element was written and is
 * finite, that no canary changed, and the values against the reference backend (or, for
 * grid_check_reference, the reference against the oracle at the end of this file). The cache
 * after forward must equal the reference's byte for byte. */
#include "grid.h"

#include <fenv.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- cases ------------------------------------------------------------------------------- */

enum { LAYOUT_NHD, LAYOUT_HND, LAYOUT_INTERLEAVED, LAYOUT_PADDED };
enum { LSE_NONE, LSE_TH, LSE_HT };
#define MAX_SEQS 8
#define MAX_HEADS 256 /* query heads of a case (the per-head arrays of ginputs) */

typedef struct gseq {
    int32_t ctx, q, prefill, enc;
} gseq;

typedef struct gcase {
    char name[256];
    int32_t H, Hkv, D, B;
    int layout;
    pa_dtype cache, qd, kvd, outd;
    pa_attn_type type;
    int32_t wl, wr, sw;
    int alibi, sinks;
    float softcap;
    pa_blocksparse bs;
    float kscale, vscale;
    int nseq;
    gseq seqs[MAX_SEQS];
    int share_prefix;   /* seq 1 reuses seq 0's full context blocks (repeated physical ids) */
    int fused;          /* q, k, v (and out) are strided views into one buffer */
    int lse_mode;
    int no_kv;          /* K/V of new tokens pre-written; forward gets k = v = NULL */
    int explicit_slots; /* explicit slot mapping: every third new token -1 (pre-written) */
    float qscale;       /* query magnitude: sharper or flatter softmax */
    int nonfinite;      /* NaN/inf in cached K and V, new K and V rows and a query (poison_inputs) */
    float fp8mag;       /* fp8 caches: cached K/V codes' values up to this (0: 8) */
    float vmag;         /* 16- and 32-bit values (cached and new): up to this (0: 1) */
    float lscale;       /* the layer's scale (0: pa_layer_config_init's 1 / sqrt(D)) */
    uint64_t seed;      /* inputs' seed; 0: drawn from the case's index in the grid */
} gcase;

static float fp8_mag(const gcase *c) { return c->fp8mag > 0 ? c->fp8mag : 8.0f; }
static float v_mag(const gcase *c) { return c->vmag > 0 ? c->vmag : 1.0f; }

static gcase cases[512];
static int ncases;

static gcase base_case(void)
{
    gcase c;
    memset(&c, 0, sizeof c);
    c.H = 8, c.Hkv = 2, c.D = 64, c.B = 16;
    c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_F32;
    c.type = PA_ATTN_DECODER;
    c.wl = c.wr = -1;
    c.kscale = c.vscale = 1.0f;
    c.nseq = 3;
    c.seqs[0] = (gseq){0, 37, 1, 0};  /* prefill */
    c.seqs[1] = (gseq){21, 9, 1, 0};  /* chunked prefill */
    c.seqs[2] = (gseq){50, 1, 0, 0};  /* decode */
    c.lse_mode = LSE_TH;
    c.qscale = 1.0f;
    return c;
}

static const char *layout_name(int l)
{
    static const char *const n[] = {"nhd", "hnd", "kvint", "padded"};
    return n[l];
}

static void name_case(gcase *c, const char *tag)
{
    char seqs[96] = "", *p = seqs, feat[96] = "", *f = feat;
    for (int i = 0; i < c->nseq && p < seqs + sizeof seqs - 24; i++)
        p += snprintf(p, (size_t)(seqs + sizeof seqs - p), "%s%d+%d%s", i ? "," : "", c->seqs[i].ctx,
                      c->seqs[i].q, c->seqs[i].enc ? "e" : "");
#define FEAT(...) f += snprintf(f, (size_t)(feat + sizeof feat - f), __VA_ARGS__)
    if (c->sw) FEAT(" sw%d", c->sw);
    if (c->wl != -1 || c->wr != -1) FEAT(" win(%d,%d)", c->wl, c->wr);
    if (c->alibi) FEAT(" alibi");
    if (c->softcap > 0) FEAT(" cap%g", (double)c->softcap);
    if (c->sinks) FEAT(" sinks");
    if (c->bs.block_size) FEAT(" sparse(%d,%d,%d,%s%d)", c->bs.block_size, c->bs.local_blocks, c->bs.vert_stride,
                               c->bs.homo_head ? "homo," : "", c->bs.head_sliding_step);
    if (c->kscale != 1.0f || c->vscale != 1.0f) FEAT(" ks%g vs%g", (double)c->kscale, (double)c->vscale);
    if (c->fused) FEAT(" fused");
    if (c->lse_mode == LSE_HT) FEAT(" lse[h,t]");
    if (c->lse_mode == LSE_NONE) FEAT(" no-lse");
    if (c->no_kv) FEAT(" kv-cached");
    if (c->explicit_slots) FEAT(" slots-1");
    if (c->share_prefix) FEAT(" shared-blocks");
    if (c->nonfinite) FEAT(" nan-inf");
    if (c->vmag > 0) FEAT(" v%a", (double)c->vmag);
    if (c->lscale > 0) FEAT(" scale%a", (double)c->lscale);
#undef FEAT
    snprintf(c->name, sizeof c->name, "%s/%s h%d/%d d%d bs%d %s q%s kv%s o%s c%s%s [%s]", tag,
             pa_attn_type_name(c->type), c->H, c->Hkv, c->D, c->B, layout_name(c->layout),
             pa_dtype_name(c->qd), pa_dtype_name(c->kvd), pa_dtype_name(c->outd),
             pa_dtype_name(c->cache), feat, seqs);
}

/* tokens one case may write to its cache (ginputs.slots) */
#define GRID_MAX_SLOTS 16384

static void push(gcase c, const char *tag)
{
    int64_t tokens = 0;
    for (int s = 0; s < c.nseq; s++) tokens += (int64_t)c.seqs[s].ctx + c.seqs[s].q + c.seqs[s].enc;
    if (ncases >= (int)(sizeof cases / sizeof cases[0]) || tokens > GRID_MAX_SLOTS) abort();
    name_case(&c, tag);
    cases[ncases++] = c;
}

static void decode_only(gcase *c, int32_t ctx_len, int nseq)
{
    c->nseq = nseq;
    for (int i = 0; i < nseq; i++) c->seqs[i] = (gseq){ctx_len + 7 * i, 1, 0, 0};
}

static void build_geometry_cases(void)
{
    /* wide groups (MQA models: 32 or 71 query heads on one KV head) and groups that fill or
     * pass the cpu backend's 128 query rows per item (256 heads on two KV heads, 160 on one) */
    static const int32_t heads[][2] = {{4, 4}, {8, 2}, {16, 2}, {8, 1}, {12, 3},
                                       {32, 1}, {71, 1}, {48, 3}, {160, 1}, {256, 2}};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        gcase c = base_case();
        c.H = heads[i][0], c.Hkv = heads[i][1];
        push(c, "gqa");
    }
    {   /* wide-group decodes on a bf16 cache whose long contexts split their keys */
        gcase c = base_case();
        c.H = 64, c.Hkv = 2, c.D = 128, c.layout = LAYOUT_HND;
        c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
        decode_only(&c, 1500, 2);
        push(c, "gqa");
    }
    static const int32_t dims[] = {1, 7, 32, 80, 96, 112, 120, 128, 256, 512};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        gcase c = base_case();
        c.D = dims[i];
        if (c.D >= 256) c.H = 4, c.Hkv = 1;
        push(c, "headsize");
    }
    static const int32_t blocks[] = {1, 5, 8, 32, 64, 13};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        gcase c = base_case();
        c.B = blocks[i];
        /* lengths 1, exactly a block, block - 1, block + 1 */
        c.nseq = 5;
        c.seqs[0] = (gseq){0, c.B, 1, 0};
        c.seqs[1] = (gseq){c.B > 1 ? c.B - 1 : 0, 2, 1, 0};
        c.seqs[2] = (gseq){0, 1, 0, 0};
        c.seqs[3] = (gseq){c.B, 1, 0, 0};
        c.seqs[4] = (gseq){c.B + 1 - 1, 1, 0, 0};
        push(c, "blocksize");
    }
    for (int l = 0; l < 4; l++) {
        gcase c = base_case();
        c.layout = l;
        push(c, "layout");
        c.cache = PA_DTYPE_BF16;
        push(c, "layout");
    }
}

static void build_dtype_cases(void)
{
    static const pa_dtype caches[] = {PA_DTYPE_F32, PA_DTYPE_F16, PA_DTYPE_BF16, PA_DTYPE_FP8_E4M3,
                                      PA_DTYPE_FP8_E5M2};
    static const pa_dtype io[] = {PA_DTYPE_F32, PA_DTYPE_F16, PA_DTYPE_BF16};
    for (size_t i = 0; i < 5; i++)
        for (size_t j = 0; j < 3; j++) {
            gcase c = base_case();
            c.cache = caches[i];
            c.qd = c.kvd = c.outd = io[j];
            push(c, "dtype");
        }
    gcase c = base_case(); /* mixed: each of q, kv, out different */
    c.qd = PA_DTYPE_BF16, c.kvd = PA_DTYPE_F16, c.outd = PA_DTYPE_F32, c.cache = PA_DTYPE_F16;
    push(c, "dtype-mixed");
    c.qd = PA_DTYPE_F16, c.kvd = PA_DTYPE_F32, c.outd = PA_DTYPE_BF16, c.cache = PA_DTYPE_FP8_E4M3;
    push(c, "dtype-mixed");
    for (int e = 0; e < 2; e++) { /* fp8 with non-unit scales */
        c = base_case();
        c.cache = e ? PA_DTYPE_FP8_E5M2 : PA_DTYPE_FP8_E4M3;
        c.kscale = 0.0625f, c.vscale = 0.03f;
        c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
        push(c, "fp8-scaled");
        c.kscale = 3.5f, c.vscale = 0.5f;
        decode_only(&c, 700, 4);
        push(c, "fp8-scaled");
    }
}

static void build_feature_cases(void)
{
    gcase c;
    static const int32_t windows[][3] = {{-1, -1, 1}, {-1, -1, 8}, {-1, -1, 17}, {0, 0, 0},
                                         {5, 0, 0},   {5, 3, 0},   {-1, 4, 0},  {30, -1, 0}};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        c = base_case();
        c.wl = windows[i][0], c.wr = windows[i][1], c.sw = windows[i][2];
        push(c, "window");
    }
    c = base_case();
    c.alibi = 1;
    push(c, "alibi");
    c = base_case();
    c.softcap = 5.0f, c.qscale = 8.0f;
    push(c, "softcap");
    c = base_case();
    c.sinks = 1;
    push(c, "sinks");
    c.sinks = 1, c.sw = 6; /* a sink with a window: rows that see few keys */
    push(c, "sinks");
    static const pa_blocksparse bss[] = {
        {16, 2, 4, 0, 1, 0}, {16, 1, 3, 1, 0, 0}, {8, 2, 4, 0, -1, 0}, {32, 1, 2, 0, 3, 1}, {5, 0, 3, 0, 2, 0}};
    for (size_t i = 0; i < sizeof bss / sizeof bss[0]; i++) {
        c = base_case();
        c.bs = bss[i];
        c.nseq = 3;
        c.seqs[0] = (gseq){0, 100, 1, 0};
        c.seqs[1] = (gseq){70, 30, 1, 0};
        c.seqs[2] = (gseq){150, 1, 0, 0};
        push(c, "blocksparse");
    }
    c = base_case(); /* everything at once */
    c.alibi = 1, c.softcap = 10.0f, c.sinks = 1, c.sw = 20, c.qscale = 4.0f;
    c.cache = PA_DTYPE_FP8_E4M3, c.kscale = 0.5f, c.vscale = 0.25f;
    c.qd = c.kvd = PA_DTYPE_BF16, c.outd = PA_DTYPE_F16;
    push(c, "combined");
    c.bs = (pa_blocksparse){16, 1, 2, 0, 1, 0};
    c.sw = 0;
    c.layout = LAYOUT_HND;
    push(c, "combined");
    c = base_case();
    c.alibi = 1, c.sinks = 1, c.wl = 9, c.wr = 0, c.softcap = 2.0f;
    c.lse_mode = LSE_HT, c.fused = 1;
    push(c, "combined");
}

static void build_batch_cases(void)
{
    gcase c = base_case();
    c.nseq = 8; /* the classic mixed step */
    int32_t lens[8][3] = {{0, 64, 1}, {100, 33, 1}, {17, 1, 1}, {0, 5, 1}, {3, 1, 0},
                          {80, 1, 0}, {31, 3, 0},   {200, 2, 0}};
    for (int i = 0; i < 8; i++) c.seqs[i] = (gseq){lens[i][0], lens[i][1], lens[i][2], 0};
    push(c, "mixed");
    c.share_prefix = 1;
    c.seqs[0] = (gseq){96, 4, 1, 0};
    c.seqs[1] = (gseq){96, 8, 1, 0};
    push(c, "shared-blocks");
    c = base_case();
    c.no_kv = 1;
    push(c, "kv-precached");
    c = base_case();
    c.explicit_slots = 1;
    push(c, "explicit-slots");
    c = base_case();
    c.fused = 1;
    push(c, "fused-qkv");
    c.lse_mode = LSE_HT;
    push(c, "lse-ht");
    c.lse_mode = LSE_NONE;
    push(c, "no-lse");
    c = base_case(); /* long sequences: several thousand tokens */
    decode_only(&c, 3000, 2);
    c.H = 8, c.Hkv = 1, c.cache = PA_DTYPE_BF16, c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    push(c, "long");
    c.seqs[0] = (gseq){4500, 1, 0, 0};
    c.seqs[1] = (gseq){2049, 1, 0, 0};
    c.cache = PA_DTYPE_FP8_E5M2;
    push(c, "long");
    c = base_case();
    c.nseq = 1;
    c.seqs[0] = (gseq){1800, 300, 1, 0};
    c.H = 4, c.Hkv = 2, c.D = 32;
    push(c, "long-chunk");
    c.seqs[0] = (gseq){0, 700, 1, 0};
    c.sw = 100;
    push(c, "long-prefill");
    c = base_case(); /* speculative decoding: several tokens after a context */
    c.nseq = 3;
    c.seqs[0] = (gseq){40, 4, 0, 0};
    c.seqs[1] = (gseq){9, 3, 0, 0};
    c.seqs[2] = (gseq){0, 1, 0, 0};
    push(c, "spec-decode");
    c = base_case();
    c.qscale = 30.0f; /* very peaked softmax */
    push(c, "peaked");
    c.qscale = 0.0f; /* uniform softmax */
    push(c, "flat");
}

static void build_type_cases(void)
{
    for (int t = PA_ATTN_ENCODER; t <= PA_ATTN_ENCODER_ONLY; t++) {
        gcase c = base_case();
        c.type = (pa_attn_type)t;
        c.nseq = 3;
        c.seqs[0] = (gseq){0, 19, 1, 0};
        c.seqs[1] = (gseq){0, 1, 1, 0};
        c.seqs[2] = (gseq){0, 40, 1, 0};
        push(c, "encoder");
        c.wl = 3, c.wr = 5, c.alibi = 1, c.sinks = 1;
        push(c, "encoder-features");
        c.fused = 1, c.qd = c.kvd = c.outd = PA_DTYPE_F16, c.lse_mode = LSE_HT;
        push(c, "encoder-fused");
    }
    gcase c = base_case();
    c.type = PA_ATTN_ENCODER_DECODER;
    c.nseq = 3;
    c.seqs[0] = (gseq){0, 5, 1, 23};
    c.seqs[1] = (gseq){0, 1, 1, 7};
    c.seqs[2] = (gseq){0, 3, 1, 40};
    push(c, "cross-prefill");
    c.no_kv = 1;
    c.seqs[0] = (gseq){5, 1, 0, 23};
    c.seqs[1] = (gseq){1, 1, 0, 7};
    c.seqs[2] = (gseq){30, 1, 0, 40};
    push(c, "cross-decode");
    c.cache = PA_DTYPE_FP8_E4M3, c.kscale = 0.2f, c.vscale = 0.1f, c.sinks = 1, c.softcap = 3.0f;
    c.qd = c.outd = PA_DTYPE_BF16;
    push(c, "cross-decode");
    c.no_kv = 0, c.B = 5, c.seqs[1].enc = 0; /* a sequence with no encoder tokens: empty rows */
    c.seqs[0] = (gseq){0, 5, 1, 23};
    c.seqs[1] = (gseq){0, 2, 1, 0};
    c.seqs[2] = (gseq){0, 1, 1, 12};
    c.sinks = 0;
    push(c, "cross-empty");
}

/* Short queries over 16-bit and fp8 caches at head sizes 64/128/256: what a device backend's
 * decode kernel takes (8-element vector loads, key streams, splits of long contexts), with each
 * feature, every group size and tiles of 8 rows (spec decode at GQA 8). */
static void build_decode_cases(void)
{
    gcase c = base_case();
    c.D = 128, c.H = 16, c.Hkv = 4, c.cache = PA_DTYPE_BF16, c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    decode_only(&c, 1500, 4); /* 1500..1521 keys: split pieces of 512 with a short last one */
    push(c, "decode");
    c.bs = (pa_blocksparse){16, 2, 3, 0, 1, 0};
    push(c, "decode");
    c.bs = (pa_blocksparse){0, 0, 0, 0, 0, 0};
    c.wl = 700, c.wr = 0, c.sinks = 1, c.alibi = 1;
    push(c, "decode");
    c = base_case();
    c.D = 256, c.H = 4, c.Hkv = 4, c.cache = PA_DTYPE_F16, c.qd = c.kvd = PA_DTYPE_F16, c.outd = PA_DTYPE_F32;
    c.softcap = 7.0f, c.qscale = 3.0f;
    decode_only(&c, 2100, 3);
    push(c, "decode");
    c = base_case();
    c.D = 128, c.H = 32, c.Hkv = 4, c.cache = PA_DTYPE_FP8_E5M2, c.kscale = 0.7f, c.vscale = 1.3f;
    c.qd = c.kvd = c.outd = PA_DTYPE_BF16, c.B = 32;
    c.nseq = 3; /* speculative decoding at GQA 8: 8-row tiles, two passes of 4 rows */
    c.seqs[0] = (gseq){1300, 16, 0, 0};
    c.seqs[1] = (gseq){60, 5, 0, 0};
    c.seqs[2] = (gseq){3, 1, 0, 0};
    push(c, "decode");
    c.cache = PA_DTYPE_FP8_E4M3, c.layout = LAYOUT_HND, c.sw = 40;
    push(c, "decode");
    /* long queries over a 16-bit cache at head size 128: a device backend's tensor-core tiles
     * (several 128-row tiles per sequence, key chunks crossing blocks, a chunk after a context) */
    c = base_case();
    c.D = 128, c.H = 8, c.Hkv = 2, c.cache = PA_DTYPE_BF16, c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    c.nseq = 3;
    c.seqs[0] = (gseq){0, 100, 1, 0};
    c.seqs[1] = (gseq){50, 40, 1, 0};
    c.seqs[2] = (gseq){77, 1, 0, 0};
    push(c, "prefill16");
    c.cache = c.qd = c.kvd = PA_DTYPE_F16, c.outd = PA_DTYPE_F32;
    c.wl = 30, c.wr = 0, c.alibi = 1, c.sinks = 1, c.softcap = 8.0f, c.qscale = 2.0f;
    push(c, "prefill16");
    /* logits that grow along the keys: ALiBi (slope 1/4 on head 0) over a 640-token prompt
     * raises a late row's maximum by up to 160 along its keys (e^160 overflows fp32): a kernel
     * that rescales its output lazily must still rescale then */
    c = base_case();
    c.D = 128, c.H = 8, c.Hkv = 2, c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    c.nseq = 2, c.alibi = 1;
    c.seqs[0] = (gseq){0, 640, 1, 0};
    c.seqs[1] = (gseq){100, 70, 1, 0};
    push(c, "prefill16");
    /* the same tiles with whole key chunks that no row masks between masked ones: head size 64
     * at GQA 8 after a context, block size 24 (no power of two); a 300-token prompt under a 100-key window at
     * GQA 1; a block-sparse prompt (every chunk masked per element) */
    c = base_case();
    c.D = 64, c.H = 16, c.Hkv = 2, c.B = 24, c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_F16;
    c.nseq = 2;
    c.seqs[0] = (gseq){70, 200, 1, 0};
    c.seqs[1] = (gseq){0, 33, 1, 0};
    push(c, "prefill16");
    c = base_case();
    c.D = 128, c.H = 4, c.Hkv = 4, c.cache = c.qd = c.kvd = PA_DTYPE_BF16, c.outd = PA_DTYPE_F32;
    c.nseq = 1;
    c.seqs[0] = (gseq){0, 300, 1, 0};
    c.wl = 100;
    push(c, "prefill16");
    c.wl = -1;
    c.bs = (pa_blocksparse){16, 2, 3, 0, 1, 0};
    c.seqs[0] = (gseq){0, 160, 1, 0};
    push(c, "prefill16");
}

static uint64_t rng_next(uint64_t *s);

/* One random combination: every feature, dtype, layout and geometry drawn independently from
 * the stream r. `wide` (the sweeps of grid_random_sweep) widens the draw: more head shapes and
 * head sizes, up to MAX_SEQS sequences, long decodes that split their keys, shared blocks and
 * non-finite values. The grid's own rows use wide = 0, so they keep their draws. */
static double seq_work(const gcase *c, int k) /* ~ the reference's multiply-adds for sequence k */
{
    const gseq *q = &c->seqs[k];
    return (double)q->q * (q->ctx + q->q + q->enc) * c->H * c->D;
}

/* Keeps a case to about a second of reference and oracle time: halves the context of the
 * costliest sequence while the work is above budget. */
static void fit_budget(gcase *c)
{
    for (;;) {
        double work = 0;
        int big = 0;
        for (int k = 0; k < c->nseq; k++) {
            work += seq_work(c, k);
            if (seq_work(c, k) > seq_work(c, big)) big = k;
        }
        if (work <= 4e7 || c->seqs[big].ctx < 2) break;
        c->seqs[big].ctx /= 2;
    }
}

static gcase random_case(uint64_t *r, bool wide)
{
    static const int32_t heads[][2] = {{4, 4}, {8, 2}, {16, 2}, {8, 1}, {6, 3},
                                       {32, 8}, {2, 1}, {1, 1}, {12, 4}, {64, 8}};
    static const int32_t dims[] = {16, 32, 48, 64, 80, 96, 112, 120, 128, 160, 256, 24, 72,
                                   1, 7, 8, 40, 200, 512, 136};
    static const int32_t blocks[] = {1, 3, 8, 16, 32, 64, 7, 13, 2, 128};
#define DRAW(narrow, all) (rng_next(r) % (uint64_t)(wide ? (all) : (narrow)))
#define COIN(n) (rng_next(r) % (n) == 0)
    gcase c = base_case();
    int hi = (int)DRAW(5, 10);
    c.H = heads[hi][0], c.Hkv = heads[hi][1];
    c.D = dims[DRAW(13, 20)];
    c.B = blocks[DRAW(8, 10)];
    c.layout = (int)(rng_next(r) % 4);
    c.cache = (pa_dtype)(rng_next(r) % 5);
    c.qd = (pa_dtype)(rng_next(r) % 3), c.kvd = (pa_dtype)(rng_next(r) % 3), c.outd = (pa_dtype)(rng_next(r) % 3);
    c.type = COIN(5) ? (pa_attn_type)(1 + rng_next(r) % 3) : PA_ATTN_DECODER;
    bool cross = c.type == PA_ATTN_ENCODER_DECODER, self_only = c.type == PA_ATTN_ENCODER || c.type == PA_ATTN_ENCODER_ONLY;
    c.nseq = 1 + (int)DRAW(6, MAX_SEQS);
    int64_t slots = 0; /* cached tokens the inputs write (ginputs.slots) */
    for (int k = 0; k < c.nseq; k++) {
        int32_t ctx = self_only ? 0 : (int32_t)(rng_next(r) % 300);
        int32_t q = COIN(2) ? 1 + (int32_t)(rng_next(r) % 3) : 1 + (int32_t)(rng_next(r) % 90);
        int prefill = k < c.nseq / 2 || self_only || cross;
        if (wide && !self_only && !cross && COIN(4)) /* a long context: split keys, merged partials */
            ctx = 600 + (int32_t)(rng_next(r) % 5000);
        int32_t cap = 1000 * c.B - 100; /* ginputs.tables holds 1024 blocks per sequence */
        if (ctx > cap) ctx = cap;
        if (slots + ctx + q > 7900) ctx = 0;
        slots += ctx + q;
        c.seqs[k] = (gseq){ctx, q, prefill, cross ? (int32_t)(rng_next(r) % 60) : 0};
    }
    if (!cross && COIN(3)) {
        if (COIN(2)) c.sw = 1 + (int32_t)(rng_next(r) % 64);
        else c.wl = (int32_t)(rng_next(r) % 40) - 1, c.wr = (int32_t)(rng_next(r) % 10) - 1;
    }
    if (!cross && COIN(3)) c.alibi = 1;
    if (COIN(3)) c.softcap = 1.0f + (float)(rng_next(r) % 30);
    if (COIN(3)) c.sinks = 1;
    if (c.type == PA_ATTN_DECODER && COIN(5))
        c.bs = (pa_blocksparse){(int32_t)(4 + rng_next(r) % 29), (int32_t)(rng_next(r) % 3),
                                (int32_t)(1 + rng_next(r) % 4), (int32_t)COIN(3),
                                (int32_t)(rng_next(r) % 5) - 2, (int32_t)(rng_next(r) % 2)};
    if (pa_dtype_size(c.cache) == 1 && COIN(2)) c.kscale = 0.05f * (float)(1 + rng_next(r) % 40), c.vscale = 0.05f * (float)(1 + rng_next(r) % 40);
    c.fused = !cross && COIN(4);
    c.lse_mode = (int)(rng_next(r) % 3);
    c.no_kv = !self_only && COIN(6);
    c.explicit_slots = c.type == PA_ATTN_DECODER && !c.no_kv && COIN(6);
    c.qscale = (float)(rng_next(r) % 4) * 2.0f + 0.5f;
    if (wide) {
        fit_budget(&c);
        c.share_prefix = c.type == PA_ATTN_DECODER && c.nseq >= 2 && COIN(5);
        c.nonfinite = c.type == PA_ATTN_DECODER && !c.no_kv && COIN(6);
        if (COIN(8)) { /* a wide group (MQA-like models), drawn after the rest of the case,
                        * whose other features are thus the ones it had without this draw */
            static const int32_t wideh[][2] = {{32, 1}, {71, 1}, {64, 2}, {160, 1}};
            int w = (int)(rng_next(r) % 4);
            c.H = wideh[w][0], c.Hkv = wideh[w][1];
            fit_budget(&c);
        } else if (COIN(6)) { /* GQA 5, 6, 7, 3, 12, 16 or 1 on several KV heads: the cpu decode
                               * kernels' paths for 1-3 rows and for 9-16 rows per KV head */
            static const int32_t oddh[][2] = {{10, 2}, {12, 2}, {14, 2}, {12, 4}, {24, 2}, {32, 2}, {3, 3}};
            int w = (int)(rng_next(r) % 7);
            c.H = oddh[w][0], c.Hkv = oddh[w][1];
            fit_budget(&c);
        }
    }
#undef DRAW
#undef COIN
    return c;
}

/* One case of a random sweep (grid_random_sweep) and the seed of its inputs, both from r: a grid
 * row replays a sweep's case from the stream state the sweep printed. */
static gcase sweep_case(uint64_t *r)
{
    gcase c = random_case(r, true);
    c.seed = rng_next(r) | 1;
    /* one bf16-cache case in 12 holds its values near the bottom of the fp32 range (see
     * build_tiny_v_cases); decided by the seed's bits, no draw of the stream, so that the cases
     * of a sweep and the grid rows that replay some stay what they were */
    if (c.cache == PA_DTYPE_BF16 && (c.seed >> 33) % 12 == 0) c.vmag = (c.seed >> 37) % 2 ? 0x1p-125f : 0x1p-100f;
    return c;
}

static void sharpen(gcase *c); /* (random sweeps, below) */

/* The grid's random rows (fixed seed). */
static void build_random_cases(void)
{
    uint64_t r = 0xC0FFEE;
    for (int i = 0; i < 48; i++) push(random_case(&r, false), "random");
}

/* Non-finite values the rows read (see poison_inputs): the NaN or +inf logit rule of the
 * numerics contract, on each cache dtype, the mixed batch, and long decodes whose key splits are
 * merged (the NaN sits in a later split). */
static void build_nonfinite_cases(void)
{
    static const pa_dtype caches[] = {PA_DTYPE_F32, PA_DTYPE_BF16, PA_DTYPE_FP8_E4M3, PA_DTYPE_FP8_E5M2};
    for (size_t i = 0; i < sizeof caches / sizeof caches[0]; i++) {
        gcase c = base_case();
        c.cache = caches[i];
        c.nonfinite = 1;
        push(c, "nonfinite");
    }
    for (size_t i = 1; i < 3; i++) {
        gcase c = base_case();
        c.D = 128, c.H = 8, c.Hkv = 2, c.layout = LAYOUT_HND, c.cache = caches[i];
        c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
        decode_only(&c, 1500, 3);
        c.nonfinite = 1;
        push(c, "nonfinite");
    }
    gcase c = base_case(); /* tensor-core prefill tiles of a device backend */
    c.D = 128, c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    c.seqs[0] = (gseq){0, 100, 1, 0};
    c.nonfinite = 1;
    push(c, "nonfinite");
    /* block-sparse decode, heads with different patterns: the NaN V key is visible to some rows
     * of its KV group's tile and masked for others (the cpu decode kernels' listed columns) */
    c = base_case();
    c.D = 128, c.H = 8, c.Hkv = 2, c.layout = LAYOUT_HND;
    c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    c.bs = (pa_blocksparse){16, 1, 3, 0, 1, 0};
    decode_only(&c, 1500, 3);
    c.nonfinite = 1;
    push(c, "nonfinite");
}

/* Decode at the group sizes whose query rows per KV head are not a multiple of 4 (GQA 1, 2, 3,
 * 5, 6, 7: MHA models, Gemma 2, Qwen2), on every cache dtype: the cpu decode kernels' paths for
 * 1-3 rows, over every key tail (contexts 7 apart) and dims chunk (head sizes 48-128); a window
 * with a speculative step (rows at different positions mask different columns of a tile), and
 * non-finite cache values. GQA 12 and 16: the cpu decode tiles of 9-16 rows (bf16, fp32). */
static void build_group_cases(void)
{
    static const struct {
        int32_t g, D;
        pa_dtype cache;
        int win, nonfinite;
    } rows[] = {{1, 112, PA_DTYPE_BF16, 0, 0},    {2, 80, PA_DTYPE_F16, 0, 0},
                {3, 48, PA_DTYPE_FP8_E4M3, 0, 0}, {5, 128, PA_DTYPE_BF16, 1, 0},
                {6, 128, PA_DTYPE_FP8_E5M2, 0, 0}, {7, 128, PA_DTYPE_F32, 1, 0},
                {2, 128, PA_DTYPE_BF16, 1, 0},    {1, 128, PA_DTYPE_FP8_E4M3, 1, 0},
                {3, 128, PA_DTYPE_BF16, 0, 1},    {7, 96, PA_DTYPE_FP8_E4M3, 0, 1},
                {1, 64, PA_DTYPE_F16, 1, 1},      {12, 128, PA_DTYPE_BF16, 0, 0},
                {16, 64, PA_DTYPE_F32, 1, 0},     {16, 128, PA_DTYPE_BF16, 0, 1}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        gcase c = base_case();
        c.H = 2 * rows[i].g, c.Hkv = 2, c.D = rows[i].D, c.cache = rows[i].cache;
        c.layout = i % 2 ? LAYOUT_HND : LAYOUT_NHD;
        c.qd = c.kvd = c.outd = i % 3 ? PA_DTYPE_BF16 : PA_DTYPE_F16;
        if (pa_dtype_size(c.cache) == 1) c.kscale = 0.5f, c.vscale = 2.0f;
        decode_only(&c, 200, 4);
        c.nseq = 6; /* speculative steps of 2 and 3 tokens */
        c.seqs[4] = (gseq){150, 2, 0, 0};
        c.seqs[5] = (gseq){97, 3, 0, 0};
        if (rows[i].win) c.sw = 70;
        c.nonfinite = rows[i].nonfinite;
        push(c, "group");
    }
}

/* Decodes over fp8 caches with f16 and bf16 queries at head sizes 64 and 128 (a device
 * backend's tensor-core decode over fp8: 16-bit forms of the codes): cached codes of every
 * exponent range, subnormal codes only (queries large enough that the scores hang on them: a
 * flushed subnormal changes every output), the largest codes, a masked key holding a NaN V
 * beside rows that see it (block-sparse heads), and NaN codes in keys a window hides under
 * speculative steps; queries too large to scale by 2^120. */
static void build_fp8_decode_cases(void)
{
    static const struct {
        int32_t D;
        pa_dtype cache, q;
        float mag, kscale, vscale, qscale;
    } rows[] = {
        {128, PA_DTYPE_FP8_E4M3, PA_DTYPE_BF16, 0.0078125f, 1.0f, 0.5f, 64.0f},  /* E4M3 subnormals */
        {64, PA_DTYPE_FP8_E4M3, PA_DTYPE_F16, 0.0078125f, 1.0f, 2.0f, 64.0f},
        {128, PA_DTYPE_FP8_E5M2, PA_DTYPE_F16, 3.0517578e-5f, 1.0f, 0.5f, 16384.0f}, /* E5M2 subnormals */
        {64, PA_DTYPE_FP8_E5M2, PA_DTYPE_BF16, 3.0517578e-5f, 1.0f, 2.0f, 16384.0f},
        {64, PA_DTYPE_FP8_E4M3, PA_DTYPE_BF16, 440.0f, 0.00390625f, 0.015625f, 1.0f}, /* largest codes */
        {128, PA_DTYPE_FP8_E5M2, PA_DTYPE_F16, 57000.0f, 1.52587890625e-5f, 6.103515625e-5f, 1.0f},
        {128, PA_DTYPE_FP8_E4M3, PA_DTYPE_F16, 0.0f, 0.5f, 2.0f, 1.0f},
        {64, PA_DTYPE_FP8_E5M2, PA_DTYPE_BF16, 0.0f, 0.7f, 1.3f, 1.0f},
        /* queries of up to ~360 after the softmax scale (a kernel that scales them up to meet
         * 16-bit forms of the codes must see that it cannot) */
        {128, PA_DTYPE_FP8_E4M3, PA_DTYPE_F16, 0.25f, 1.0f, 1.0f, 4096.0f},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        gcase c = base_case();
        c.D = rows[i].D, c.H = 16, c.Hkv = 4, c.cache = rows[i].cache;
        c.qd = c.kvd = c.outd = rows[i].q;
        c.layout = i % 2 ? LAYOUT_HND : LAYOUT_NHD;
        c.fp8mag = rows[i].mag, c.kscale = rows[i].kscale, c.vscale = rows[i].vscale, c.qscale = rows[i].qscale;
        if (i < 6) c.no_kv = 1; /* every key from the cache at the row's magnitude (no new token's) */
        if (i < 4) c.outd = PA_DTYPE_F32; /* outputs as small as the subnormal values, exactly */
        decode_only(&c, 300 + 37 * (int32_t)i, 3);
        c.nseq = 4;
        c.seqs[3] = (gseq){700, 3, 0, 0}; /* a speculative step of 3 tokens, 2 splits */
        push(c, "fp8-decode");
    }
    /* a NaN V key that some heads mask and others see, NaN K codes (poison_inputs) */
    gcase c = base_case();
    c.D = 128, c.H = 8, c.Hkv = 2, c.layout = LAYOUT_HND;
    c.cache = PA_DTYPE_FP8_E4M3, c.qd = c.kvd = c.outd = PA_DTYPE_BF16, c.kscale = 0.5f, c.vscale = 2.0f;
    c.bs = (pa_blocksparse){16, 1, 3, 0, 1, 0};
    decode_only(&c, 1500, 3);
    c.nonfinite = 1;
    push(c, "fp8-decode");
    c = base_case();
    c.D = 64, c.H = 8, c.Hkv = 2, c.cache = PA_DTYPE_FP8_E5M2, c.qd = c.kvd = c.outd = PA_DTYPE_F16;
    c.sw = 30, c.kscale = 0.7f, c.vscale = 1.3f;
    c.nseq = 3;
    c.seqs[0] = (gseq){200, 4, 0, 0};
    c.seqs[1] = (gseq){60, 5, 0, 0};
    c.seqs[2] = (gseq){1100, 3, 0, 0};
    c.nonfinite = 1;
    push(c, "fp8-decode");
    c.cache = PA_DTYPE_FP8_E4M3, c.qd = c.kvd = c.outd = PA_DTYPE_BF16, c.D = 128;
    push(c, "fp8-decode");
}

/* 16-bit values near and below the bottom of the fp32 range (outputs f32, as small as they
 * are): 2^-125 (about half of them bf16 subnormals), 2^-100 (normal, but products with small
 * weights are not) and 2^-80, in decodes, chunked prefills and an encoder's own rows. The cpu
 * backend's AVX512-BF16 PV (vdpbf16ps takes subnormals as zero and flushes subnormal results)
 * must leave the first two to its fp32 kernels; a flushed value changes the output by far more
 * than these rows' tolerance, which scales with the values. Under the sharper queries most
 * weights are small too. */
static void build_tiny_v_cases(void)
{
    static const float mags[] = {0x1p-125f, 0x1p-100f, 0x1p-80f};
    for (int i = 0; i < 3; i++) {
        gcase c = base_case();
        c.D = 128, c.H = 16, c.Hkv = 4, c.cache = c.kvd = PA_DTYPE_BF16, c.outd = PA_DTYPE_F32;
        c.qd = i == 1 ? PA_DTYPE_F16 : PA_DTYPE_BF16;
        c.layout = i % 2 ? LAYOUT_HND : LAYOUT_NHD;
        c.vmag = mags[i], c.qscale = i == 1 ? 8.0f : 1.0f;
        c.no_kv = 1; /* every value from the cache, at the row's magnitude */
        decode_only(&c, 300 + 37 * i, 3);
        c.nseq = 4;
        c.seqs[3] = (gseq){700, 3, 0, 0};
        push(c, "tiny-v");
        c = base_case();
        c.D = 128, c.H = 12, c.Hkv = 4, c.cache = c.qd = c.kvd = PA_DTYPE_BF16, c.outd = PA_DTYPE_F32;
        c.vmag = mags[i], c.qscale = i == 2 ? 8.0f : 1.0f;
        c.nseq = 2;
        c.seqs[0] = (gseq){0, 150, 0, 0};
        c.seqs[1] = (gseq){40, 90, 0, 0};
        push(c, "tiny-v");
    }
    gcase c = base_case();
    c.type = PA_ATTN_ENCODER_ONLY, c.D = 96, c.H = 8, c.Hkv = 2;
    c.cache = c.qd = c.kvd = PA_DTYPE_BF16, c.outd = PA_DTYPE_F32, c.vmag = 0x1p-125f;
    c.nseq = 2;
    c.seqs[0] = (gseq){0, 70, 1, 0};
    c.seqs[1] = (gseq){0, 33, 1, 0};
    push(c, "tiny-v");
}

static void build_cases(void)
{
    if (ncases) return;
    build_geometry_cases();
    build_dtype_cases();
    build_feature_cases();
    build_batch_cases();
    build_type_cases();
    build_decode_cases();
    build_random_cases();
    build_nonfinite_cases(); /* earlier cases keep their seeds (drawn from the index) */
    build_group_cases();
    /* bf16 decode at a head size that is a multiple of 16 but not of 32 (the bf16 dot-product
     * kernels' half step) */
    gcase c = base_case();
    c.D = 80, c.layout = LAYOUT_HND;
    c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    decode_only(&c, 700, 3);
    push(c, "decode");
    /* sharp rows over a 512-dim head (fp8 keys up to 8, queries up to 6.5): a random sweep's
     * case on which the prefill QK kernels' one fp32 chain per score erred 1.8e-4 (tolerance
     * 1.6e-4; cpu.h, CPU_QK_CHUNK); replayed from its sweep seed */
    uint64_t r = 0xef673bea9efe4df2ull;
    push(sweep_case(&r), "long-head");
    /* decodes of 257..1024 keys, cut in 256-key chunks (cpu_plan.c): three chunks with a short
     * last one, at GQA 4 over bf16; a window that hides the first chunk whole, with sinks (the
     * sink enters in the merge); speculative steps of 3 tokens over E4M3 at a head size that is
     * not a multiple of 16 (converted tiles) */
    c = base_case();
    c.D = 128, c.H = 16, c.Hkv = 4, c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    decode_only(&c, 600, 4);
    push(c, "chunks");
    c.wl = 300, c.wr = 0, c.sinks = 1, c.layout = LAYOUT_HND;
    push(c, "chunks");
    c = base_case();
    c.D = 120, c.H = 8, c.Hkv = 8, c.cache = PA_DTYPE_FP8_E4M3, c.kscale = 0.5f, c.vscale = 2.0f;
    c.qd = c.kvd = c.outd = PA_DTYPE_F16;
    c.nseq = 3;
    c.seqs[0] = (gseq){1020, 3, 0, 0}; /* 1023 keys: four chunks, the last one key short */
    c.seqs[1] = (gseq){510, 3, 0, 0};
    c.seqs[2] = (gseq){256, 1, 0, 0}; /* 257 keys: one key in a second chunk */
    push(c, "chunks");
    /* a visible key whose fp32 weight underflows to 0 holding a NaN in V: in exact arithmetic
     * its weight is positive, so the out element is NaN (0 x NaN in IEEE); the cuda SIMT
     * kernels skipped zero weights and returned a finite value. A random sweep's case on an
     * H200 (head 512 over E5M2, k_scale 1.75: the general kernel), replayed from its sweep
     * seed; then sharp decodes over E5M2 (k_scale 4, queries up to 30: most weights
     * underflow), one of 1800 keys (split, and the splits' key streams merged), on the decode
     * kernel's fp8 path */
    r = 0xf82a653e3ecdf016ull;
    push(sweep_case(&r), "nonfinite");
    c = base_case();
    c.D = 128, c.H = 8, c.Hkv = 2, c.cache = PA_DTYPE_FP8_E5M2, c.kscale = 4.0f, c.qscale = 30.0f;
    c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    c.nonfinite = 1;
    c.nseq = 2;
    c.seqs[0] = (gseq){300, 1, 0, 0};
    c.seqs[1] = (gseq){1800, 1, 0, 0}; /* NaN V at key 1200 (poison_inputs) */
    push(c, "nonfinite");
    /* 16-bit prefill tiles whose 128 rows start inside a token's group of heads (3 query heads
     * per KV head: 128 is no multiple of 3), so the cuda fa kernel's staged 16-byte output
     * stores map tile rows back to (token, head) from a mid-group start; a fresh prompt and a
     * chunk after 40 cached tokens, head 128 (64-key chunks) and head 64 (32-key chunks) */
    c = base_case();
    c.D = 128, c.H = 12, c.Hkv = 4, c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    c.nseq = 2;
    c.seqs[0] = (gseq){0, 150, 0, 0};
    c.seqs[1] = (gseq){40, 90, 0, 0};
    push(c, "prefill16");
    c.D = 64, c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_F16;
    push(c, "prefill16");
    build_fp8_decode_cases();
    build_tiny_v_cases();
    /* decodes over blocks smaller than a 16-key step (8 and 2 tokens): a device backend's
     * tensor-core decode step spans several blocks, each key through its own table entry (one
     * lookup per step serves blocks of 16 or more); bf16 at head 128, f16 at head 64 */
    c = base_case();
    c.D = 128, c.H = 8, c.Hkv = 2, c.B = 8, c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    decode_only(&c, 600, 3);
    push(c, "decode");
    c.D = 64, c.B = 2, c.cache = c.qd = c.kvd = PA_DTYPE_F16, c.outd = PA_DTYPE_F32;
    decode_only(&c, 130, 2);
    push(c, "decode");
    /* bf16 decodes with 5 to 8 query rows per KV head (GQA 7 and 8), whose QK takes the rows two
     * to a vector on the avx512bf16 path: head 80 (an odd number of 16-dim steps) and 128,
     * contexts of 301..315 keys (key blocks of 4 with 1 to 3 left over), a window and NaN/inf
     * in cached K and V and a query (nonfinite) */
    c = base_case();
    c.D = 80, c.H = 28, c.Hkv = 4, c.layout = LAYOUT_HND, c.cache = c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    decode_only(&c, 301, 3);
    push(c, "gqa8");
    c.D = 128, c.H = 16, c.Hkv = 2, c.wl = 100, c.wr = 0, c.nonfinite = 1;
    decode_only(&c, 302, 3);
    push(c, "gqa8");
    /* E4M3 decodes with 8 and 12 query rows per KV head, whose PV takes the rows in groups of 8
     * on the AVX-512 paths: scaled, with bf16 queries; then with NaN bytes in the cached K and V
     * read (the rows' NaN check, and their conversion with the fix-up) and a window */
    c = base_case();
    c.D = 128, c.H = 16, c.Hkv = 2, c.layout = LAYOUT_HND, c.cache = PA_DTYPE_FP8_E4M3;
    c.kscale = 0.75f, c.vscale = 1.5f, c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    decode_only(&c, 301, 3);
    push(c, "gqa8");
    c.H = 24, c.D = 96, c.nonfinite = 1, c.wl = 90, c.wr = 0, c.qd = c.kvd = c.outd = PA_DTYPE_F16;
    decode_only(&c, 305, 2);
    push(c, "gqa8");
    /* E4M3 decodes with bf16 queries and 7 query rows per KV head, whose QK is bf16 dot products
     * over keys converted exactly, rows two to a vector, on the avx512bf16 path: head 64 over an
     * NHD cache, scaled; then NaN bytes in the cached K and V read (that kernel's NaN test and
     * its redo with the fix-up; no window, so that the NaN key is seen), then a window */
    c = base_case();
    c.D = 64, c.H = 14, c.Hkv = 2, c.layout = LAYOUT_NHD, c.cache = PA_DTYPE_FP8_E4M3;
    c.kscale = 1.25f, c.vscale = 0.5f, c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
    decode_only(&c, 303, 3);
    push(c, "gqa7");
    c.nonfinite = 1;
    decode_only(&c, 307, 2);
    push(c, "gqa7");
    c.wl = 120, c.wr = 0;
    decode_only(&c, 309, 2);
    push(c, "gqa7");
    /* fp8 decodes with bf16 queries, whose QK on the avx512bf16 path with AVX512-VBMI is bf16 dot
     * products over keys converted by byte tables. E4M3 at 1 to 6 query rows per KV head (1 to 4
     * rows: rows in order; 5 and 6: row pairs, the last pair half empty for 5), at head sizes whose
     * last step is partial (48, 80, 112: 64-dim steps) and whole (128); NaN bytes in the cached K
     * and V read for some, a window for one. Then E5M2 (its own tables: infinities): GQA 4 at head
     * 128 with NaN and infinite codes in the K and V read, GQA 2 at 80 (NHD), GQA 8 at 64 with a
     * window, GQA 1 at 112. */
    static const struct {
        int32_t H, Hkv, D;
        int layout, nonfinite, wl;
        pa_dtype cache;
        int32_t ctx;
        float kscale, vscale;
        const char *name;
    } f8q[] = {
        {8, 8, 80, LAYOUT_NHD, 0, 0, PA_DTYPE_FP8_E4M3, 200, 0.75f, 1.25f, "e4m3-bf16q"},
        {8, 4, 112, LAYOUT_HND, 1, 0, PA_DTYPE_FP8_E4M3, 237, 0.75f, 1.25f, "e4m3-bf16q"},
        {6, 2, 48, LAYOUT_HND, 0, 0, PA_DTYPE_FP8_E4M3, 274, 0.75f, 1.25f, "e4m3-bf16q"},
        {10, 2, 128, LAYOUT_NHD, 0, 70, PA_DTYPE_FP8_E4M3, 311, 0.75f, 1.25f, "e4m3-bf16q"},
        {12, 2, 80, LAYOUT_HND, 1, 0, PA_DTYPE_FP8_E4M3, 348, 0.75f, 1.25f, "e4m3-bf16q"},
        {16, 4, 128, LAYOUT_HND, 1, 0, PA_DTYPE_FP8_E4M3, 385, 0.75f, 1.25f, "e4m3-bf16q"},
        {16, 4, 128, LAYOUT_HND, 1, 0, PA_DTYPE_FP8_E5M2, 230, 1.5f, 0.5f, "e5m2-bf16q"},
        {8, 4, 80, LAYOUT_NHD, 0, 0, PA_DTYPE_FP8_E5M2, 271, 1.5f, 0.5f, "e5m2-bf16q"},
        {16, 2, 64, LAYOUT_HND, 0, 90, PA_DTYPE_FP8_E5M2, 312, 1.5f, 0.5f, "e5m2-bf16q"},
        {4, 4, 112, LAYOUT_HND, 1, 0, PA_DTYPE_FP8_E5M2, 353, 1.5f, 0.5f, "e5m2-bf16q"},
    };
    for (size_t i = 0; i < sizeof f8q / sizeof f8q[0]; i++) {
        c = base_case();
        c.H = f8q[i].H, c.Hkv = f8q[i].Hkv, c.D = f8q[i].D, c.layout = f8q[i].layout;
        c.cache = f8q[i].cache, c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
        c.kscale = f8q[i].kscale, c.vscale = f8q[i].vscale, c.nonfinite = f8q[i].nonfinite;
        if (f8q[i].wl) c.wl = f8q[i].wl, c.wr = 0;
        decode_only(&c, f8q[i].ctx, 3);
        push(c, f8q[i].name);
    }
    /* sharp rows again: an encoder_only batch at head 136 over E4M3 keys scaled by 2, f16
     * queries, on which the prefill QK kernels' chunks of 64 dims erred 2.41e-4 against a
     * tolerance of 2.2e-4 on every SIMD path (cpu.h, CPU_QK_CHUNK); replayed from its sweep seed */
    r = 0x9303b454d7efceedull;
    push(sweep_case(&r), "sharp-fp8");
    /* and a row of a sharp sweep (--sharp): decoder, head 512, 64 / 8 heads, E5M2 keys scaled by
     * 2, ALiBi, f32 queries, a 5-token chunk beside shorter steps, on which the prefill QK's 32
     * chunk sums of 16 dims, added to the total in one chain, erred 1.47e-4 against a tolerance
     * of 1.4e-4 on every SIMD path (cpu.h, CPU_QK_GROUP); replayed from its sweep seed */
    r = 0xa065af9a272aa3c8ull;
    c = sweep_case(&r);
    sharpen(&c);
    push(c, "sharp-512");
    /* a visible key's logit of -inf: a 1 + 87 token step whose cached key 0 holds +inf in K and
     * NaN in V (poison_inputs), so the query heads negative there give that key exp(-inf - m) =
     * 0 times a NaN, which the reference (IEEE) puts into their out; every cpu path had dropped
     * it as a masked key's (a sharp sweep's case, replayed from its seed) */
    r = 0x53c6ba42dfe95bddull;
    c = sweep_case(&r);
    sharpen(&c);
    push(c, "neg-inf-logit");
    /* 2-byte HND caches in blocks of 64 and 128 keys, whose cpu decode tiles are 64 keys
     * (cpu_attn.c, CPU_DECODE_KT_B64): contexts a key short of a block, a block, one past, a
     * tile past a block of 128, and long enough for split chunks (600 keys and more) with a
     * last tile cut short; GQA 4 at head 128 (the bench's heads, fewer), NaN and inf in the
     * cache and a query, a window that starts inside a tile, sinks, an f16 cache beside bf16
     * queries */
    static const struct {
        const char *name;
        pa_dtype cache;
        int32_t B, ctx, sw, sinks, nonfinite;
    } b64[] = {
        {"hnd-b64", PA_DTYPE_BF16, 64, 63, 0, 0, 1},
        {"hnd-b64", PA_DTYPE_BF16, 64, 650, 100, 1, 0},
        {"hnd-b64", PA_DTYPE_F16, 64, 1201, 0, 0, 1},
        {"hnd-b128", PA_DTYPE_BF16, 128, 191, 0, 1, 1},
        {"hnd-b128", PA_DTYPE_F16, 128, 700, 77, 0, 0},
    };
    for (size_t i = 0; i < sizeof b64 / sizeof b64[0]; i++) {
        c = base_case();
        c.H = 16, c.Hkv = 4, c.D = 128, c.B = b64[i].B, c.layout = LAYOUT_HND;
        c.cache = b64[i].cache, c.qd = c.kvd = c.outd = PA_DTYPE_BF16;
        c.sw = b64[i].sw, c.sinks = b64[i].sinks, c.nonfinite = b64[i].nonfinite;
        decode_only(&c, b64[i].ctx, 4);
        c.seqs[1].ctx = b64[i].B, c.seqs[2].ctx = b64[i].B + 1;
        push(c, b64[i].name);
    }
    /* fp8 decodes whose AVX-512 kernels take the rows by byte tables (cpu_avx512.c, f8l_cvt; the
     * default off AMD): query rows per KV head in a group of 8 beside one of 4 (GQA 12) and of 1
     * (GQA 9), and one group of 8 (GQA 8); head sizes whose last 64-dim step is 16 dims (80, 144,
     * 208); f32 and bf16 queries; NaN and inf in the cache read, a window, sinks, and a context
     * long enough for split chunks */
    static const struct {
        int32_t H, Hkv, D, ctx, wl, sinks;
        int layout, nonfinite;
        pa_dtype cache, qd;
    } f8l[] = {
        {24, 2, 80, 333, 0, 0, LAYOUT_HND, 1, PA_DTYPE_FP8_E4M3, PA_DTYPE_F32},
        {16, 2, 208, 407, 150, 0, LAYOUT_NHD, 0, PA_DTYPE_FP8_E5M2, PA_DTYPE_BF16},
        {9, 1, 144, 1300, 0, 1, LAYOUT_HND, 1, PA_DTYPE_FP8_E4M3, PA_DTYPE_BF16},
    };
    for (size_t i = 0; i < sizeof f8l / sizeof f8l[0]; i++) {
        c = base_case();
        c.H = f8l[i].H, c.Hkv = f8l[i].Hkv, c.D = f8l[i].D, c.layout = f8l[i].layout;
        c.cache = f8l[i].cache, c.qd = c.kvd = f8l[i].qd, c.outd = PA_DTYPE_F32;
        c.kscale = 0.75f, c.vscale = 1.25f, c.nonfinite = f8l[i].nonfinite, c.sinks = f8l[i].sinks;
        if (f8l[i].wl) c.wl = f8l[i].wl, c.wr = 0;
        decode_only(&c, f8l[i].ctx, 3);
        push(c, "fp8-tables");
    }
    /* chunked prefills over more than 4096 keys, the cpu backend's prefill key chunk
     * (cpu_plan.c): their rows split in two and merged; sinks (counted once in the merge), and
     * ALiBi with a window that starts inside the first chunk, over bf16 at head size 128 */
    c = base_case();
    c.nseq = 2, c.sinks = 1;
    c.seqs[0] = (gseq){4200, 40, 1, 0};
    c.seqs[1] = (gseq){100, 1, 0, 0};
    push(c, "long-chunk");
    c = base_case();
    c.D = 128, c.cache = c.qd = c.kvd = PA_DTYPE_BF16, c.outd = PA_DTYPE_F32;
    c.nseq = 1, c.alibi = 1, c.wl = 4100, c.wr = 0;
    c.seqs[0] = (gseq){4150, 24, 1, 0};
    push(c, "long-chunk");
    /* fp8 caches whose scale times k_scale (2^64 x 2^64) lies beyond fp32's range while every
     * logit is moderate (queries near 2^-131): a backend that folds the product into one fp32
     * factor scores inf or NaN (the cuda kernels did until the thirty-ninth pass); a prompt, a
     * chunked prefill and decodes, one long enough for split keys */
    c = base_case();
    c.cache = PA_DTYPE_FP8_E4M3, c.kscale = 0x1p64f, c.lscale = 0x1p64f, c.qscale = 0x1p-131f;
    push(c, "huge-scale");
    c = base_case();
    c.D = 128, c.cache = PA_DTYPE_FP8_E5M2, c.kscale = 0x1p64f, c.vscale = 0.5f, c.lscale = 0x1p65f;
    c.qscale = 0x1p-132f, c.sinks = 1;
    c.seqs[2] = (gseq){1500, 1, 0, 0};
    push(c, "huge-scale");
    c = base_case();
    c.D = 128, c.cache = PA_DTYPE_FP8_E4M3, c.qd = c.kvd = PA_DTYPE_BF16, c.kscale = 0x1p64f, c.lscale = 0x1p64f;
    c.qscale = 0x1p-131f;
    decode_only(&c, 700, 3);
    push(c, "huge-scale");
    /* logits spread over some 300 (queries 48 times the usual), so that many keys lie 87 to 131
     * below their row's maximum, where exp(s - m) is an fp32 subnormal (the cpu backend's
     * AVX-512 kernels weigh keys 2^64 times, normal down to -131), and values up to 2^100, over
     * which those scaled sums overflow while the unscaled ones do not (the item then runs again
     * unscaled): a prompt with sinks, a chunked prefill and a decode split in KV chunks, over
     * bf16 and f32; then the spread alone, with a window and ALiBi */
    c = base_case();
    c.D = 128, c.cache = c.qd = c.kvd = PA_DTYPE_BF16, c.outd = PA_DTYPE_F32;
    c.qscale = 48.0f, c.vmag = 0x1p100f, c.sinks = 1;
    c.seqs[2] = (gseq){1500, 1, 0, 0};
    push(c, "wide-logits");
    c = base_case();
    c.qscale = 48.0f, c.vmag = 0x1p100f;
    decode_only(&c, 2000, 3);
    push(c, "wide-logits");
    c = base_case();
    c.D = 96, c.cache = c.kvd = PA_DTYPE_F16, c.qd = PA_DTYPE_BF16, c.outd = PA_DTYPE_BF16;
    c.qscale = 48.0f, c.wl = 300, c.wr = 0, c.alibi = 1;
    c.seqs[2] = (gseq){700, 1, 0, 0};
    push(c, "wide-logits");

    /* key chunks a local window hides wholly are not planned (cpu_plan.c, tile_keys), and
     * prompts of 1024 tokens or more are not split by keys: decodes far past their window
     * (several hidden 512-key chunks before the visible ones, the window's start inside a
     * chunk or on a chunk boundary), a speculative step, a long chunk of a prompt over a long
     * context with and without a window, beside a short chunk that is still split */
    c = base_case();
    c.H = 2, c.Hkv = 1, c.D = 16, c.sw = 100; /* (small heads: the prompts' reference sums are long) */
    c.nseq = 4;
    c.seqs[0] = (gseq){1500, 1030, 1, 0};
    c.seqs[1] = (gseq){4100, 17, 1, 0}; /* 4096-key chunks, the window's start in the first */
    c.seqs[2] = (gseq){3000, 1, 0, 0};  /* 512-key chunks: only the last is planned */
    c.seqs[3] = (gseq){2947, 4, 0, 0};  /* speculative: the window starts inside a chunk */
    push(c, "window-chunks");
    c = base_case();
    c.H = 2, c.Hkv = 1, c.D = 16, c.wl = 1023, c.wr = 0, c.cache = c.kvd = PA_DTYPE_BF16, c.layout = LAYOUT_HND;
    c.nseq = 3;
    c.seqs[0] = (gseq){2000, 1024, 1, 0};
    c.seqs[1] = (gseq){5631, 1, 0, 0}; /* from 5631 - 1023 = 4608, a chunk boundary: 2 chunks */
    c.seqs[2] = (gseq){6000, 2, 0, 0};
    push(c, "window-chunks");
    c = base_case();
    c.H = 2, c.Hkv = 1, c.D = 16;
    c.nseq = 2;
    c.seqs[0] = (gseq){1200, 1030, 1, 0}; /* no window: one chunk of 2230 keys */
    c.seqs[1] = (gseq){4500, 1, 0, 0};
    push(c, "window-chunks");

    /* 9-16 query rows per KV head over f16 and fp8 caches (speculative steps, GQA 9-16): the
     * decode kernels straight from the cache where the table's direct_rows_* allow (cpu.h) */
    c = base_case();
    c.H = 16, c.Hkv = 4, c.D = 128, c.layout = LAYOUT_HND;
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_F16;
    c.nseq = 4;
    c.seqs[0] = (gseq){300, 3, 0, 0};  /* 12 rows per KV head */
    c.seqs[1] = (gseq){1100, 4, 0, 0}; /* 16, key chunks merged */
    c.seqs[2] = (gseq){77, 2, 0, 0};   /* 8 */
    c.seqs[3] = (gseq){500, 5, 0, 0};  /* 20: converted copies */
    push(c, "spec-rows");
    c.nonfinite = 1, c.sinks = 1, c.wl = 200, c.wr = 0, c.qd = PA_DTYPE_F32, c.outd = PA_DTYPE_F32;
    push(c, "spec-rows");
    c = base_case();
    c.H = 18, c.Hkv = 2, c.D = 64; /* GQA 9 */
    c.cache = c.kvd = PA_DTYPE_F16, c.qd = c.outd = PA_DTYPE_BF16;
    c.nseq = 2;
    c.seqs[0] = (gseq){900, 1, 0, 0};
    c.seqs[1] = (gseq){40, 1, 0, 0};
    push(c, "spec-rows");
    c = base_case();
    c.H = 16, c.Hkv = 2, c.D = 128, c.layout = LAYOUT_HND; /* GQA 8 x 2 tokens */
    c.cache = PA_DTYPE_FP8_E4M3, c.kvd = c.qd = c.outd = PA_DTYPE_BF16, c.kscale = 0.75f, c.vscale = 1.5f;
    c.nonfinite = 1;
    c.nseq = 2;
    c.seqs[0] = (gseq){700, 2, 0, 0};
    c.seqs[1] = (gseq){95, 2, 0, 0};
    push(c, "spec-rows");
    c.cache = PA_DTYPE_FP8_E5M2, c.qd = PA_DTYPE_F16, c.kvd = PA_DTYPE_F16, c.outd = PA_DTYPE_F32;
    push(c, "spec-rows");
    /* 17-32 rows over 2- and 4-byte caches: the decode kernels in two calls per head */
    c = base_case();
    c.H = 16, c.Hkv = 4, c.D = 64, c.layout = LAYOUT_HND;
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_BF16;
    c.nseq = 4;
    c.seqs[0] = (gseq){300, 5, 0, 0};  /* 20 rows per KV head */
    c.seqs[1] = (gseq){1100, 8, 0, 0}; /* 32, key chunks merged */
    c.seqs[2] = (gseq){40, 6, 0, 0};   /* 24 */
    c.seqs[3] = (gseq){600, 9, 0, 0};  /* 36: converted copies */
    push(c, "spec-rows");
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_F32, c.nonfinite = 1, c.sw = 100, c.D = 128;
    push(c, "spec-rows");
    c.cache = c.kvd = PA_DTYPE_F16, c.nonfinite = 0, c.sw = 0, c.sinks = 1, c.softcap = 20.0f;
    push(c, "spec-rows");
    /* decodes and short steps at head sizes that are not multiples of 16, which the AVX-512
     * decode kernels take by masked loads (qk_src_tail, pv_src_tail): each sequence ending
     * inside a block (the NaN of the unused slots right after its last row in HND), windows
     * (partial tiles), values that are not finite, every cache dtype */
    c = base_case();
    c.H = 32, c.Hkv = 8, c.D = 120, c.layout = LAYOUT_HND;
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_BF16;
    c.nseq = 3;
    c.seqs[0] = (gseq){1001, 1, 0, 0};
    c.seqs[1] = (gseq){37, 1, 0, 0};
    c.seqs[2] = (gseq){300, 3, 0, 0};
    push(c, "tail-rows");
    c.cache = c.kvd = PA_DTYPE_F16, c.qd = PA_DTYPE_F32, c.sw = 100, c.nonfinite = 1;
    push(c, "tail-rows");
    c.cache = PA_DTYPE_F32, c.kvd = c.qd = c.outd = PA_DTYPE_F32, c.D = 200, c.sw = 0, c.sinks = 1, c.softcap = 30.0f;
    push(c, "tail-rows");
    c = base_case();
    c.H = 16, c.Hkv = 2, c.D = 72, c.layout = LAYOUT_HND; /* GQA 8 x 2 tokens */
    c.cache = PA_DTYPE_FP8_E4M3, c.kvd = c.qd = c.outd = PA_DTYPE_BF16, c.kscale = 0.75f, c.vscale = 1.5f;
    c.nonfinite = 1;
    c.nseq = 2;
    c.seqs[0] = (gseq){700, 2, 0, 0};
    c.seqs[1] = (gseq){95, 1, 0, 0};
    push(c, "tail-rows");
    c.cache = PA_DTYPE_FP8_E5M2, c.qd = PA_DTYPE_F16, c.D = 40, c.layout = LAYOUT_NHD, c.sw = 64;
    push(c, "tail-rows");
    c = base_case();
    c.H = 16, c.Hkv = 1, c.D = 8, c.layout = LAYOUT_HND; /* 16 rows per KV head */
    c.cache = PA_DTYPE_FP8_E4M3, c.kvd = c.qd = c.outd = PA_DTYPE_F16;
    c.nseq = 2;
    c.seqs[0] = (gseq){2000, 1, 0, 0};
    c.seqs[1] = (gseq){5, 1, 0, 0};
    push(c, "tail-rows");
    /* decode tiles whose rows of one KV head see different keys, which the cpu decode sums in
     * runs of rows that see the same keys, each run with its own column mask: vLLM's per-head
     * sparse blocks (head_sliding_step 1) of 16 keys, two to a 32-key tile, so that a row sees
     * half of it and its neighbour the other half; of 64 keys (a row sees all of a tile or none);
     * a slide per KV head with a speculative step; every cache dtype, a head size that is not a
     * multiple of 16. The NaN V key of poison_inputs (the last sequence's key at 2/3 of its
     * context, on the last KV head, query heads 4-7) lies where one row of that KV head sees it
     * and the others mask it. */
    c = base_case();
    c.H = 8, c.Hkv = 2, c.D = 128, c.layout = LAYOUT_HND;
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_BF16;
    c.bs = (pa_blocksparse){16, 2, 8, 0, 1, 0};
    c.nonfinite = 1;
    c.nseq = 3;
    c.seqs[0] = (gseq){1300, 1, 0, 0};
    c.seqs[1] = (gseq){333, 1, 0, 0};
    c.seqs[2] = (gseq){1424, 1, 0, 0}; /* NaN V at key 949, sparse block 59: head 4 sees it, 5 sees block 58 */
    push(c, "sparse-runs");
    c.cache = c.kvd = PA_DTYPE_F16, c.qd = PA_DTYPE_F32, c.D = 120;
    push(c, "sparse-runs");
    c.cache = PA_DTYPE_F32, c.kvd = c.qd = c.outd = PA_DTYPE_F32, c.D = 64;
    push(c, "sparse-runs");
    c.cache = PA_DTYPE_FP8_E4M3, c.kvd = c.qd = c.outd = PA_DTYPE_BF16, c.D = 128, c.kscale = 0.5f, c.vscale = 2.0f;
    c.bs.block_size = 64;
    c.seqs[2] = (gseq){1100, 1, 0, 0}; /* NaN V at key 733, sparse block 11: head 4 alone sees it */
    push(c, "sparse-runs");
    c.cache = PA_DTYPE_FP8_E5M2, c.qd = PA_DTYPE_F16, c.bs.block_size = 16;
    c.seqs[2] = (gseq){1424, 1, 0, 0};
    push(c, "sparse-runs");
    c = base_case();
    c.H = 16, c.Hkv = 4, c.D = 64, c.layout = LAYOUT_HND;
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_BF16;
    c.bs = (pa_blocksparse){16, 1, 4, 0, -1, 0};
    c.nonfinite = 1;
    c.nseq = 2;
    c.seqs[0] = (gseq){900, 3, 0, 0};
    c.seqs[1] = (gseq){1210, 2, 0, 0};
    push(c, "sparse-runs");
    /* head sizes that are not multiples of 8: the AVX-512 decode kernels by masked loads, the
     * AVX2 decode (whose tail kernels take multiples of 8) and prefill through converted copies,
     * each sequence ending inside a block; a prompt chunk, a decode and a speculative step, every
     * cache dtype */
    c = base_case();
    c.H = 32, c.Hkv = 8, c.D = 100, c.layout = LAYOUT_HND;
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_BF16;
    c.nonfinite = 1;
    c.nseq = 3;
    c.seqs[0] = (gseq){77, 40, 1, 0};
    c.seqs[1] = (gseq){1001, 1, 0, 0};
    c.seqs[2] = (gseq){300, 3, 0, 0};
    push(c, "odd-heads");
    c.cache = PA_DTYPE_FP8_E4M3, c.kscale = 0.75f, c.vscale = 1.5f, c.D = 36;
    push(c, "odd-heads");
    c.cache = c.kvd = PA_DTYPE_F16, c.qd = PA_DTYPE_F32, c.outd = PA_DTYPE_F16, c.kscale = c.vscale = 1.0f, c.D = 20;
    c.sw = 50;
    push(c, "odd-heads");
    c.cache = PA_DTYPE_FP8_E5M2, c.D = 4, c.sw = 0, c.layout = LAYOUT_NHD;
    push(c, "odd-heads");
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_F32, c.D = 130, c.softcap = 25.0f;
    push(c, "odd-heads");
    /* block-sparse prompts whose tiles the cpu backend gathers from the sparse blocks their rows
     * see (runs of keys that are not consecutive, ALiBi's distances and the masks taken per
     * run): every other block of 16 (local 0, stride 2: up to five runs to a 64-key tile, one
     * of them cut short, then the tile's run limit) under ALiBi and sinks, a prompt and a chunk
     * over a context; blocks of 24 (runs that cut cache blocks) per head with a window; blocks of
     * 64 per KV head's slide. The NaN inputs of poison_inputs sit where some rows see them. */
    c = base_case();
    c.H = 8, c.Hkv = 2, c.D = 64, c.layout = LAYOUT_HND;
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_BF16;
    c.bs = (pa_blocksparse){16, 0, 2, 1, 0, 0};
    c.alibi = 1, c.sinks = 1;
    c.nonfinite = 1;
    c.nseq = 3;
    c.seqs[0] = (gseq){0, 300, 1, 0};
    c.seqs[1] = (gseq){203, 133, 1, 0};
    c.seqs[2] = (gseq){410, 1, 0, 0};
    push(c, "sparse-gather");
    c.cache = c.kvd = PA_DTYPE_F16, c.qd = PA_DTYPE_F32, c.outd = PA_DTYPE_F32;
    c.bs = (pa_blocksparse){24, 1, 3, 0, 1, 0};
    c.alibi = c.sinks = 0, c.wl = 90, c.wr = -1;
    push(c, "sparse-gather");
    c.cache = PA_DTYPE_FP8_E4M3, c.kvd = c.qd = c.outd = PA_DTYPE_BF16, c.kscale = 0.5f, c.vscale = 2.0f;
    c.bs = (pa_blocksparse){64, 1, 3, 0, -1, 0};
    c.wl = -1;
    c.seqs[0] = (gseq){0, 400, 1, 0};
    push(c, "sparse-gather");
    /* vLLM's per-head pattern at blocks of 16, stride 4: the cpu backend's prompt items keep
     * their rows head after head and take the keys in a pass per head; a 64-token chunk over
     * 5000 keys splits its keys (partial rows, then the merge, in the item's own row order) */
    c = base_case();
    c.H = 8, c.Hkv = 2, c.D = 64, c.layout = LAYOUT_HND;
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_BF16;
    c.bs = (pa_blocksparse){16, 1, 4, 0, 1, 0};
    c.nonfinite = 1;
    c.nseq = 3;
    c.seqs[0] = (gseq){0, 300, 1, 0};
    c.seqs[1] = (gseq){5000, 64, 1, 0};
    c.seqs[2] = (gseq){410, 1, 0, 0};
    push(c, "sparse-perhead");
    c.cache = c.kvd = c.qd = c.outd = PA_DTYPE_F32, c.sinks = 1, c.softcap = 20.0f;
    push(c, "sparse-perhead");
}

int grid_count(void)
{
    build_cases();
    return ncases;
}

const char *grid_case_name(int i)
{
    build_cases();
    return i >= 0 && i < ncases ? cases[i].name : NULL;
}

int grid_case_dtypes(int i, pa_dtype *q, pa_dtype *kv, pa_dtype *cache)
{
    build_cases();
    if (i < 0 || i >= ncases) return -1;
    *q = cases[i].qd;
    *kv = cases[i].kvd;
    *cache = cases[i].cache;
    return 0;
}

/* ---- inputs ------------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_uniform(uint64_t *s) /* [-1, 1) */
{
    return (float)((double)(rng_next(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* A host buffer with canary guards: `bytes` usable bytes at .p, GUARD canary bytes each side. */
#define GUARD 64
#define CANARY 0xA5
typedef struct gbuf {
    unsigned char *base;
    void *p;
    size_t bytes;
} gbuf;

static int gbuf_alloc(gbuf *b, size_t bytes)
{
    b->bytes = bytes;
    b->base = malloc(bytes + 2 * GUARD);
    if (!b->base) return -1;
    memset(b->base, CANARY, bytes + 2 * GUARD);
    b->p = b->base + GUARD;
    return 0;
}
static void gbuf_free(gbuf *b)
{
    free(b->base);
    b->base = NULL;
}
static int guards_intact(const gbuf *b)
{
    for (size_t i = 0; i < GUARD; i++)
        if (b->base[i] != CANARY || b->base[GUARD + b->bytes + i] != CANARY) return 0;
    return 1;
}

static void store_inf(pa_dtype d, void *base, int64_t i)
{
    switch (d) {
    case PA_DTYPE_F32: ((float *)base)[i] = INFINITY; break;
    case PA_DTYPE_F16: ((uint16_t *)base)[i] = 0x7c00; break;
    case PA_DTYPE_BF16: ((uint16_t *)base)[i] = 0x7f80; break;
    case PA_DTYPE_FP8_E5M2: ((uint8_t *)base)[i] = 0x7c; break;
    default: break;
    }
}

static void store_nan(pa_dtype d, void *base, int64_t i)
{
    switch (d) {
    case PA_DTYPE_F32: ((float *)base)[i] = NAN; break;
    case PA_DTYPE_F16: ((uint16_t *)base)[i] = 0x7e00; break;
    case PA_DTYPE_BF16: ((uint16_t *)base)[i] = 0x7fc0; break;
    case PA_DTYPE_FP8_E4M3: ((uint8_t *)base)[i] = 0x7f; break;
    default: ((uint8_t *)base)[i] = 0x7f; break;
    }
}
static void store_float(pa_dtype d, void *base, int64_t i, float x)
{
    switch (d) {
    case PA_DTYPE_F32: ((float *)base)[i] = x; break;
    case PA_DTYPE_F16: ((uint16_t *)base)[i] = pa_f32_to_f16(x); break;
    default: ((uint16_t *)base)[i] = pa_f32_to_bf16(x); break;
    }
}
static double load_float(pa_dtype d, const void *base, int64_t i)
{
    switch (d) {
    case PA_DTYPE_F32: return ((const float *)base)[i];
    case PA_DTYPE_F16: return pa_f16_to_f32(((const uint16_t *)base)[i]);
    case PA_DTYPE_BF16: return pa_bf16_to_f32(((const uint16_t *)base)[i]);
    case PA_DTYPE_FP8_E4M3: return pa_fp8e4m3_to_f32(((const uint8_t *)base)[i]);
    default: return pa_fp8e5m2_to_f32(((const uint8_t *)base)[i]);
    }
}

typedef struct ginputs {
    const gcase *c;
    pa_layer *layer;
    pa_batch *batch;
    const pa_batch_metadata *md;
    float alibi[MAX_HEADS], sinks[MAX_HEADS];
    int32_t tables[MAX_SEQS][1024];
    int32_t ntable[MAX_SEQS];
    int32_t xtables[MAX_SEQS][256];
    int32_t nxtable[MAX_SEQS];
    int64_t slots[GRID_MAX_SLOTS];
    pa_cache cache;       /* pools point into pool_buf */
    gbuf pool_buf;        /* holds both pools (NaN where unowned) */
    size_t key_off, value_off; /* byte offsets of the pools in pool_buf */
    gbuf qkv;             /* q rows (and k, v when fused) */
    gbuf kbuf, vbuf;      /* k, v rows when not fused */
    int64_t q_rs, k_rs, v_rs, out_rs;
    int64_t kv_rows;      /* rows of k and v */
    size_t q_off, k_off, v_off; /* byte offsets in their buffers */
    int64_t ntok;
    int64_t nblocks;      /* blocks in each pool */
    pa_layer *plan_layer; /* the layer plans are made from (NULL: layer); see plan_sibling */
} ginputs;

static int32_t blocks_for(int64_t n, int32_t b) { return (int32_t)((n + b - 1) / b); }

static pa_status make_layer(ginputs *in, uint64_t *rng)
{
    const gcase *c = in->c;
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, c->H, c->Hkv, c->D);
    cfg.attn_type = c->type;
    cfg.window_left = c->wl, cfg.window_right = c->wr, cfg.sliding_window = c->sw;
    cfg.logits_soft_cap = c->softcap;
    cfg.blocksparse = c->bs;
    cfg.q_dtype = c->qd, cfg.kv_dtype = c->kvd, cfg.out_dtype = c->outd, cfg.cache_dtype = c->cache;
    cfg.k_scale = c->kscale, cfg.v_scale = c->vscale;
    if (c->lscale > 0) cfg.scale = c->lscale;
    if (c->H > MAX_HEADS) abort(); /* a case the arrays cannot describe: a bug in the grid */
    for (int h = 0; h < c->H; h++) {
        in->alibi[h] = (float)pow(2.0, -8.0 * (h + 1) / c->H) * 0.5f;
        in->sinks[h] = 2.0f * rng_uniform(rng) + 0.5f;
    }
    if (c->alibi) cfg.alibi_slopes = in->alibi;
    if (c->sinks) cfg.sinks = in->sinks;
    return pa_layer_create(&cfg, &in->layer);
}

/* Another layer of the case's geometry and dtypes with its other features switched: the local
 * window (none where the case has one, else 2 keys back, and ahead for the encoder types;
 * cross attention takes neither a window nor ALiBi), ALiBi, the soft cap, sinks, and block
 * sparsity off where the case has it. A plan serves every
 * layer of its geometry (pagedattn.h), as an engine whose sliding-window and full-attention
 * layers alternate (Gemma-2, Mistral) uses it: forward over this layer and then the case's with
 * a plan made from this one must give the case's layer the same bits (an audit found the cpu
 * backend's plan following the window it was made for, and dropping a full-attention layer's
 * keys). */
static pa_status plan_sibling(const ginputs *in, pa_layer **out)
{
    const gcase *c = in->c;
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, c->H, c->Hkv, c->D);
    cfg.attn_type = c->type;
    const bool cross = c->type == PA_ATTN_ENCODER_DECODER; /* (no window, no ALiBi) */
    if (!cross && c->wl < 0 && c->wr < 0 && c->sw <= 0) {
        cfg.window_left = 2;
        if (c->type != PA_ATTN_DECODER) cfg.window_right = 2;
    }
    cfg.logits_soft_cap = c->softcap > 0 ? 0.0f : 30.0f;
    cfg.q_dtype = c->qd, cfg.kv_dtype = c->kvd, cfg.out_dtype = c->outd, cfg.cache_dtype = c->cache;
    cfg.k_scale = c->kscale, cfg.v_scale = c->vscale;
    if (c->lscale > 0) cfg.scale = c->lscale;
    if (!c->alibi && !cross) cfg.alibi_slopes = in->alibi;
    if (!c->sinks) cfg.sinks = in->sinks;
    return pa_layer_create(&cfg, out);
}

/* Cache strides for the case's layout; returns the elements one allocation of both pools
 * needs and sets the value pool's element offset. */
static int64_t set_layout(ginputs *in, int64_t nb, int64_t *value_elem_off)
{
    const gcase *c = in->c;
    pa_cache *k = &in->cache;
    pa_cache_init(k, c->layout == LAYOUT_HND ? PA_LAYOUT_HND : PA_LAYOUT_NHD, c->cache, nb, c->B, c->Hkv, c->D);
    int64_t per_block = (int64_t)c->B * c->Hkv * c->D;
    if (c->layout == LAYOUT_INTERLEAVED) {
        k->block_stride = 2 * per_block;
        *value_elem_off = per_block;
        return nb * 2 * per_block;
    }
    if (c->layout == LAYOUT_PADDED) {
        k->head_stride = c->D + 3;
        k->token_stride = (int64_t)c->Hkv * (c->D + 3) + 1;
        k->block_stride = c->B * k->token_stride + 5;
    }
    int64_t span = pa_cache_pool_elems(k);
    *value_elem_off = span;
    return 2 * span;
}

/* Assigns physical blocks (a random permutation, a few left over and NaN-filled). */
static int64_t assign_blocks(ginputs *in, uint64_t *rng)
{
    const gcase *c = in->c;
    int64_t need = 0;
    for (int s = 0; s < c->nseq; s++)
        need += blocks_for(c->seqs[s].ctx + c->seqs[s].q, c->B) + blocks_for(c->seqs[s].enc, c->B);
    int64_t nb = need + 3;
    int32_t *perm = malloc((size_t)nb * sizeof *perm);
    for (int64_t i = 0; i < nb; i++) perm[i] = (int32_t)i;
    for (int64_t i = nb - 1; i > 0; i--) {
        int64_t j = (int64_t)(rng_next(rng) % (uint64_t)(i + 1));
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    int64_t next = 0;
    bool self = c->type == PA_ATTN_DECODER;
    for (int s = 0; s < c->nseq; s++) {
        in->ntable[s] = self ? blocks_for(c->seqs[s].ctx + c->seqs[s].q, c->B) : 0;
        for (int32_t b = 0; b < in->ntable[s]; b++) in->tables[s][b] = perm[next++];
        in->nxtable[s] = blocks_for(c->seqs[s].enc, c->B);
        for (int32_t b = 0; b < in->nxtable[s]; b++) in->xtables[s][b] = perm[next++];
    }
    if (c->share_prefix && self) {
        int32_t shared = (c->seqs[0].ctx < c->seqs[1].ctx ? c->seqs[0].ctx : c->seqs[1].ctx) / c->B;
        for (int32_t b = 0; b < shared; b++) in->tables[1][b] = in->tables[0][b];
    }
    free(perm);
    return nb;
}

static int64_t slot_of(const ginputs *in, int s, int64_t pos, bool cross)
{
    const int32_t *t = cross ? in->xtables[s] : in->tables[s];
    return (int64_t)t[pos / in->c->B] * in->c->B + pos % in->c->B;
}

/* Writes n random K/V tokens into the given slots (through the library's cache write, which
 * test_cache checks exactly). */
static pa_status write_random_tokens(ginputs *in, const int64_t *slots, int64_t n, uint64_t *rng)
{
    const gcase *c = in->c;
    int64_t row = (int64_t)c->Hkv * c->D;
    float *k = malloc((size_t)(n * row + 1) * sizeof *k), *v = malloc((size_t)(n * row + 1) * sizeof *v);
    const float mag = fp8_mag(c);
    for (int64_t i = 0; i < n * row; i++) {
        k[i] = rng_uniform(rng) * (pa_dtype_size(c->cache) == 1 ? c->kscale * mag : 1.0f);
        v[i] = rng_uniform(rng) * (pa_dtype_size(c->cache) == 1 ? c->vscale * mag : v_mag(c));
    }
    pa_status s = pa_cache_write(NULL, &in->cache, PA_DTYPE_F32, k, 0, v, 0, slots, n, c->kscale, c->vscale);
    free(k);
    free(v);
    return s;
}

/* Fills the pools: NaN everywhere, then the cached context of every sequence. */
static pa_status fill_cache(ginputs *in, uint64_t *rng)
{
    const gcase *c = in->c;
    size_t es = pa_dtype_size(c->cache);
    int64_t total = (int64_t)(in->pool_buf.bytes / es);
    for (int64_t i = 0; i < total; i++) store_nan(c->cache, in->pool_buf.p, i);
    int64_t n = 0;
    for (int s = 0; s < c->nseq; s++) {
        bool cross = c->type == PA_ATTN_ENCODER_DECODER;
        int64_t upto = cross ? (c->no_kv ? c->seqs[s].enc : 0) : c->seqs[s].ctx;
        int64_t from = (!cross && c->share_prefix && s == 1) ? (int64_t)in->ntable[0] * 0 + (c->seqs[0].ctx < c->seqs[1].ctx ? c->seqs[0].ctx : c->seqs[1].ctx) / c->B * c->B : 0;
        if (c->type == PA_ATTN_ENCODER || c->type == PA_ATTN_ENCODER_ONLY) continue;
        for (int64_t pos = from; pos < upto; pos++) in->slots[n++] = slot_of(in, s, pos, cross);
        /* precached new tokens (no_kv), and the -1 tokens of an explicit slot mapping */
        if (!cross)
            for (int32_t t = 0; t < c->seqs[s].q; t++)
                if (c->no_kv || (c->explicit_slots && t % 3 == 1))
                    in->slots[n++] = slot_of(in, s, c->seqs[s].ctx + t, false);
    }
    return write_random_tokens(in, in->slots, n, rng);
}

/* The batch of sequences [s0, s1) of the case (all of them: the case's own batch; one: that
 * sequence alone, as the batch-composition check runs it). */
static pa_status batch_of(const ginputs *in, int s0, int s1, pa_batch **out)
{
    const gcase *c = in->c;
    pa_seq seqs[MAX_SEQS];
    memset(seqs, 0, sizeof seqs);
    int64_t tok0 = 0;
    for (int s = 0; s < s0; s++) tok0 += c->seqs[s].q;
    for (int s = s0; s < s1; s++) {
        pa_seq *q = &seqs[s - s0];
        q->context_len = c->seqs[s].ctx;
        q->query_len = c->seqs[s].q;
        q->is_prefill = c->seqs[s].prefill;
        q->block_table = in->ntable[s] ? in->tables[s] : NULL;
        q->num_blocks = in->ntable[s];
        q->encoder_len = c->seqs[s].enc;
        q->cross_block_table = in->nxtable[s] ? in->xtables[s] : NULL;
        q->num_cross_blocks = in->nxtable[s];
    }
    pa_batch_config bc = {c->B, in->nblocks, in->nblocks, c->explicit_slots ? in->slots + tok0 : NULL, NULL};
    return pa_batch_create(&bc, seqs, s1 - s0, out);
}

static pa_status make_batch(ginputs *in, int64_t nb)
{
    const gcase *c = in->c;
    in->nblocks = nb;
    if (c->explicit_slots) {
        int64_t k = 0;
        for (int s = 0; s < c->nseq; s++)
            for (int32_t t = 0; t < c->seqs[s].q; t++, k++)
                in->slots[k] = t % 3 == 1 ? -1 : slot_of(in, s, c->seqs[s].ctx + t, false);
    }
    pa_status st = batch_of(in, 0, c->nseq, &in->batch);
    if (!st) in->md = pa_batch_get_metadata(in->batch);
    return st;
}

/* q, k, v rows: one fused buffer [tokens, q | k | v | pad] or three buffers. */
static int make_qkv(ginputs *in, uint64_t *rng)
{
    const gcase *c = in->c;
    int64_t T = in->md->num_tokens, qrow = (int64_t)c->H * c->D, kvrow = (int64_t)c->Hkv * c->D;
    bool cross = c->type == PA_ATTN_ENCODER_DECODER;
    in->ntok = T;
    in->kv_rows = cross ? in->md->num_encoder_tokens : T;
    size_t qs = pa_dtype_size(c->qd), ks = pa_dtype_size(c->kvd);
    if (c->fused && c->qd == c->kvd && !cross) {
        int64_t rs = qrow + 2 * kvrow + 5;
        if (gbuf_alloc(&in->qkv, (size_t)(T * rs) * qs)) return -1;
        in->q_rs = in->k_rs = in->v_rs = rs;
        in->q_off = 0, in->k_off = (size_t)qrow * qs, in->v_off = (size_t)(qrow + kvrow) * qs;
    } else {
        if (gbuf_alloc(&in->qkv, (size_t)(T * qrow) * qs) || gbuf_alloc(&in->kbuf, (size_t)(in->kv_rows * kvrow + 1) * ks) ||
            gbuf_alloc(&in->vbuf, (size_t)(in->kv_rows * kvrow + 1) * ks))
            return -1;
        in->q_rs = qrow, in->k_rs = in->v_rs = kvrow;
    }
    in->out_rs = c->fused ? qrow + 7 : qrow;
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < qrow; e++)
            store_float(c->qd, (char *)in->qkv.p + in->q_off, t * in->q_rs + e, rng_uniform(rng) * c->qscale);
    void *kb = in->kbuf.base ? in->kbuf.p : (char *)in->qkv.p + in->k_off;
    void *vb = in->vbuf.base ? in->vbuf.p : (char *)in->qkv.p + in->v_off;
    float amp_k = pa_dtype_size(c->cache) == 1 ? c->kscale * 8 : 1.0f;
    float amp_v = pa_dtype_size(c->cache) == 1 ? c->vscale * 8 : v_mag(c);
    for (int64_t t = 0; t < in->kv_rows; t++)
        for (int64_t e = 0; e < kvrow; e++) {
            store_float(c->kvd, kb, t * in->k_rs + e, rng_uniform(rng) * amp_k);
            store_float(c->kvd, vb, t * in->v_rs + e, rng_uniform(rng) * amp_v);
        }
    return 0;
}

static int64_t pool_offset(const ginputs *in, int32_t block, int32_t t, int32_t h);

/* nonfinite cases: NaN in the cached V of the last sequence (two thirds into its context, last
 * KV head, dim 3), NaN in the cached K of sequence 1 (position 5, KV head 0, dim 0), +inf in
 * the cached K of sequence 0 (position ctx / 2, last KV head, dim 7; not E4M3, which has none), +inf in
 * the new K row of sequence 0's token 20 (last KV head, dim 7) when it has one (every query row
 * that sees that key gets a logit of +inf or -inf by the sign of its q there), NaN in the new V
 * row of sequence 0's token 30 (KV head 0, dim 2) when it has one (the causal rows of tokens 0-29
 * do not see it and stay finite, though it sits in their key tiles), and NaN in the query of the
 * last sequence's last token, head 0, dim 1 (every logit of that row is NaN). */
static void poison_inputs(ginputs *in)
{
    const gcase *c = in->c;
    int last = c->nseq - 1;
    int64_t pos = c->seqs[last].ctx * 2 / 3;
    if (c->seqs[last].ctx > 0) {
        int64_t off = pool_offset(in, in->tables[last][pos / c->B], (int32_t)(pos % c->B), c->Hkv - 1) + 3 % c->D;
        store_nan(c->cache, (char *)in->pool_buf.p + in->value_off, off);
    }
    if (c->nseq > 1 && c->seqs[1].ctx > 5)
        store_nan(c->cache, in->pool_buf.p, pool_offset(in, in->tables[1][0], 5, 0));
    /* +inf in the cached K of sequence 0 (position ctx / 2, last KV head, dim 7) where the cache
     * dtype has an infinity (all but E4M3) */
    if (c->seqs[0].ctx > 0 && c->cache != PA_DTYPE_FP8_E4M3) {
        int64_t p0 = c->seqs[0].ctx / 2;
        store_inf(c->cache, in->pool_buf.p,
                  pool_offset(in, in->tables[0][p0 / c->B], (int32_t)(p0 % c->B), c->Hkv - 1) + 7 % c->D);
    }
    if (c->seqs[0].ctx == 0 && c->seqs[0].q > 20) {
        void *kb = in->kbuf.base ? in->kbuf.p : (char *)in->qkv.p + in->k_off;
        store_float(c->kvd, kb, 20 * in->k_rs + (int64_t)(c->Hkv - 1) * c->D + 7 % c->D, INFINITY);
    }
    if (c->seqs[0].ctx == 0 && c->seqs[0].q > 30) {
        void *vb = in->vbuf.base ? in->vbuf.p : (char *)in->qkv.p + in->v_off;
        store_float(c->kvd, vb, 30 * in->v_rs + 2 % c->D, NAN);
    }
    store_float(c->qd, (char *)in->qkv.p + in->q_off, (in->ntok - 1) * in->q_rs + 1 % c->D, NAN);
}

static void free_inputs(ginputs *in)
{
    pa_layer_destroy(in->layer);
    pa_layer_destroy(in->plan_layer);
    pa_batch_destroy(in->batch);
    gbuf_free(&in->pool_buf);
    gbuf_free(&in->qkv);
    gbuf_free(&in->kbuf);
    gbuf_free(&in->vbuf);
}

static int make_inputs(ginputs *in, const gcase *c, char *why, size_t why_size)
{
    memset(in, 0, sizeof *in);
    in->c = c;
    uint64_t rng = c->seed ? c->seed : 0x1234567ull + (uint64_t)(c - cases) * 7919;
    pa_status s = make_layer(in, &rng);
    int64_t nb = assign_blocks(in, &rng), voff = 0;
    int64_t elems = set_layout(in, nb, &voff);
    if (!s && gbuf_alloc(&in->pool_buf, (size_t)elems * pa_dtype_size(c->cache))) s = PA_STATUS_OUT_OF_MEMORY;
    if (!s) {
        in->cache.key = in->pool_buf.p;
        in->cache.value = (char *)in->pool_buf.p + voff * (int64_t)pa_dtype_size(c->cache);
        in->value_off = (size_t)voff * pa_dtype_size(c->cache);
        s = fill_cache(in, &rng);
    }
    if (!s) s = make_batch(in, nb);
    if (!s && make_qkv(in, &rng)) s = PA_STATUS_OUT_OF_MEMORY;
    if (!s && c->nonfinite) poison_inputs(in);
    if (s) snprintf(why, why_size, "setting up the case failed: %s: %s", pa_status_name(s), pa_last_error());
    return s ? -1 : 0;
}

/* ---- running ----------------------------------------------------------------------------- */

typedef struct goutputs {
    gbuf out, lse, pool;
    int64_t lse_ts, lse_hs;
} goutputs;

static void free_outputs(goutputs *o)
{
    gbuf_free(&o->out);
    gbuf_free(&o->lse);
    gbuf_free(&o->pool);
}

/* Poison: NaN in every output element, the canary everywhere else. */
static int make_outputs(const ginputs *in, goutputs *o)
{
    const gcase *c = in->c;
    int64_t T = in->ntok, qrow = (int64_t)c->H * c->D;
    memset(o, 0, sizeof *o);
    if (gbuf_alloc(&o->out, (size_t)(T * in->out_rs) * pa_dtype_size(c->outd)) ||
        gbuf_alloc(&o->lse, (size_t)(T * c->H) * sizeof(float)) || gbuf_alloc(&o->pool, in->pool_buf.bytes))
        return -1;
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < qrow; e++) store_nan(c->outd, o->out.p, t * in->out_rs + e);
    for (int64_t i = 0; i < T * c->H; i++) ((float *)o->lse.p)[i] = NAN;
    o->lse_ts = c->lse_mode == LSE_HT ? 1 : c->H;
    o->lse_hs = c->lse_mode == LSE_HT ? T : 1;
    memcpy(o->pool.p, in->pool_buf.p, in->pool_buf.bytes);
    return 0;
}

static grid_device_hooks dev_hooks;
static bool have_dev_hooks;

void grid_set_device_hooks(const grid_device_hooks *h)
{
    have_dev_hooks = h != NULL;
    if (h) dev_hooks = *h;
}

/* One forward of batch (the case's own, or a part of it whose first sequence starts at token
 * tok0 and encoder token enc0 of the case's rows: its rows are read and written in place), with
 * every buffer where the backend wants it (staged through device memory for a device backend). */
static pa_status run_forward_of(pa_context *ctx, const ginputs *in, goutputs *o, bool device, const pa_batch *batch,
                                int64_t tok0, int64_t enc0)
{
    const gcase *c = in->c;
    pa_cache cache = in->cache;
    pa_forward_args a;
    memset(&a, 0, sizeof a);
    void *dev[6] = {0};
    const gbuf *host[6] = {&o->pool, &in->qkv, &in->kbuf, &in->vbuf, &o->out, &o->lse};
    void *ptr[6];
    for (int i = 0; i < 6; i++) {
        ptr[i] = host[i]->base ? host[i]->p : NULL;
        if (device && ptr[i]) {
            dev[i] = dev_hooks.alloc(host[i]->bytes);
            if (!dev[i] || dev_hooks.to_device(dev[i], ptr[i], host[i]->bytes)) return PA_STATUS_DEVICE_ERROR;
            ptr[i] = dev[i];
        }
    }
    cache.key = ptr[0];
    cache.value = (char *)ptr[0] + in->value_off;
    cache.memory = device ? PA_MEMORY_CUDA : PA_MEMORY_HOST;
    const int64_t kv0 = c->type == PA_ATTN_ENCODER_DECODER ? enc0 : tok0;
    const size_t qs = pa_dtype_size(c->qd), ks = pa_dtype_size(c->kvd);
    a.q = (char *)ptr[1] + in->q_off + (size_t)(tok0 * in->q_rs) * qs;
    a.q_row_stride = in->q_rs;
    bool pass_kv = !c->no_kv;
    if (pass_kv) {
        a.k = (ptr[2] ? (char *)ptr[2] : (char *)ptr[1] + in->k_off) + (size_t)(kv0 * in->k_rs) * ks;
        a.v = (ptr[3] ? (char *)ptr[3] : (char *)ptr[1] + in->v_off) + (size_t)(kv0 * in->v_rs) * ks;
        a.k_row_stride = in->k_rs;
        a.v_row_stride = in->v_rs;
    }
    a.cache = (c->type == PA_ATTN_DECODER || c->type == PA_ATTN_ENCODER_DECODER) ? &cache : NULL;
    a.out = (char *)ptr[4] + (size_t)(tok0 * in->out_rs) * pa_dtype_size(c->outd);
    a.out_row_stride = in->out_rs;
    if (c->lse_mode != LSE_NONE) {
        a.lse = (float *)ptr[5] + tok0 * o->lse_ts;
        a.lse_token_stride = o->lse_ts;
        a.lse_head_stride = o->lse_hs;
    }
    pa_plan *plan = NULL;
    pa_status s = pa_plan_create(ctx, in->plan_layer ? in->plan_layer : in->layer, batch, &plan);
    /* a plan made from another layer serves that layer first, as an engine's layers share one:
     * nothing it leaves in the plan (partial rows) may reach the case's layer */
    if (!s && in->plan_layer) s = pa_attn_forward(ctx, in->plan_layer, batch, plan, &a);
    if (!s) s = pa_attn_forward(ctx, in->layer, batch, plan, &a);
    if (!s) s = pa_context_synchronize(ctx);
    pa_plan_destroy(plan);
    for (int i = 0; i < 6; i++)
        if (dev[i]) {
            if (!s && (i == 0 || i >= 4) && dev_hooks.to_host(host[i]->p, dev[i], host[i]->bytes))
                s = PA_STATUS_DEVICE_ERROR;
            dev_hooks.free(dev[i]);
        }
    return s;
}

static pa_status run_forward(pa_context *ctx, const ginputs *in, goutputs *o, bool device)
{
    return run_forward_of(ctx, in, o, device, in->batch, 0, 0);
}

/* Every sequence of the case alone, one forward each, into o: a sequence's bits may not depend
 * on the batch around it (DESIGN.md, determinism). */
static pa_status run_alone(pa_context *ctx, const ginputs *in, goutputs *o, bool device)
{
    const gcase *c = in->c;
    int64_t tok0 = 0, enc0 = 0;
    pa_status s = PA_STATUS_OK;
    for (int q = 0; q < c->nseq && !s; q++) {
        pa_batch *one = NULL;
        s = batch_of(in, q, q + 1, &one);
        if (!s) s = run_forward_of(ctx, in, o, device, one, tok0, enc0);
        pa_batch_destroy(one);
        tok0 += c->seqs[q].q;
        enc0 += c->seqs[q].enc;
    }
    return s;
}

/* ---- comparing ----------------------------------------------------------------------------- */

static bool sweep_sharp;        /* grid_set_sweep_options */
static double tol_margin = 1.0; /* the fraction of the fp32 part of the tolerance */

void grid_set_sweep_options(bool sharp, double margin)
{
    sweep_sharp = sharp;
    tol_margin = margin > 0 && margin <= 1 ? margin : 1.0;
}

/* Tolerance for one output element: the output's own rounding, fp32 accumulation (its part
 * times tol_margin), and the contract's allowance to round probabilities to a 16-bit value
 * dtype. */
static void tolerance(const gcase *c, double *atol, double *rtol)
{
    /* one unit in the last place of the output dtype, relative: an fp32 result next to a
     * rounding boundary may round to the neighbour of the exact result's rounding */
    double out_eps = c->outd == PA_DTYPE_F32 ? 0 : c->outd == PA_DTYPE_F16 ? 1.0 / 1024 : 1.0 / 128;
    double p_eps = c->cache == PA_DTYPE_F16 ? 1.0 / 2048 : c->cache == PA_DTYPE_BF16 ? 1.0 / 256 : 0;
    double vmax = pa_dtype_size(c->cache) == 1 ? c->vscale * fp8_mag(c) : v_mag(c);
    *rtol = out_eps;
    *atol = vmax * (2e-5 * tol_margin + p_eps) + out_eps * 1e-3;
}

typedef struct cmp_ctx {
    grid_result *res;
    int fail;
} cmp_ctx;

static void fail(cmp_ctx *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(cmp_ctx *k, const char *fmt, ...)
{
    if (!k->fail) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(k->res->reason, sizeof k->res->reason, fmt, ap);
        va_end(ap);
    }
    k->fail = 1;
}

/* Canaries in the gaps of a strided output stay intact. */
static void check_gaps(cmp_ctx *k, const ginputs *in, const goutputs *o)
{
    const gcase *c = in->c;
    size_t es = pa_dtype_size(c->outd);
    int64_t qrow = (int64_t)c->H * c->D;
    if (!guards_intact(&o->out) || !guards_intact(&o->lse)) fail(k, "a guard canary around out/lse changed");
    for (int64_t t = 0; t < in->ntok; t++)
        for (int64_t e = qrow; e < in->out_rs; e++)
            for (size_t b = 0; b < es; b++)
                if (((unsigned char *)o->out.p)[(size_t)(t * in->out_rs + e) * es + b] != CANARY)
                    return fail(k, "out row gap at token %lld written", (long long)t);
    if (c->lse_mode == LSE_NONE)
        for (int64_t i = 0; i < in->ntok * c->H; i++)
            if (!isnan(((float *)o->lse.p)[i])) return fail(k, "lse written although not requested");
}

static void compare(cmp_ctx *k, const ginputs *in, const goutputs *got, const double *want_out,
                    const double *want_lse)
{
    const gcase *c = in->c;
    grid_result *r = k->res;
    double atol, rtol;
    tolerance(c, &atol, &rtol);
    int64_t qrow = (int64_t)c->H * c->D;
    for (int64_t t = 0; t < in->ntok; t++)
        for (int32_t h = 0; h < c->H; h++) {
            for (int32_t d = 0; d < c->D; d++) {
                double a = load_float(c->outd, got->out.p, t * in->out_rs + (int64_t)h * c->D + d);
                double w = want_out[t * qrow + (int64_t)h * c->D + d];
                double err = fabs(a - w);
                if (isnan(w)) { /* a NaN input the row reads */
                    if (!isnan(a)) return fail(k, "out[t=%lld,h=%d,d=%d] = %g, want NaN", (long long)t, h, d, a);
                    continue;
                }
                if (!isfinite(a))
                    return fail(k, "out[t=%lld,h=%d,d=%d] = %g (unwritten or NaN leak)", (long long)t, h, d, a);
                if (err > r->max_abs_err) r->max_abs_err = err;
                if (err / fmax(fabs(w), 1e-3) > r->max_rel_err) r->max_rel_err = err / fmax(fabs(w), 1e-3);
                if (err > atol + rtol * fabs(w))
                    return fail(k, "out[t=%lld,h=%d,d=%d] = %.8g, want %.8g (tol %.2g + %.2g*|want|)",
                                (long long)t, h, d, a, w, atol, rtol);
            }
            if (c->lse_mode == LSE_NONE) continue;
            double a = ((float *)got->lse.p)[t * got->lse_ts + h * got->lse_hs], w = want_lse[t * c->H + h];
            if (isnan(w)) {
                if (!isnan(a)) return fail(k, "lse[t=%lld,h=%d] = %g, want NaN", (long long)t, h, a);
                continue;
            }
            if (isinf(w) || isinf(a)) {
                if (a != w) return fail(k, "lse[t=%lld,h=%d] = %g, want %g", (long long)t, h, a, w);
                continue;
            }
            double err = fabs(a - w);
            if (err > r->max_lse_err) r->max_lse_err = err;
            if (!(err <= 1e-4 * fmax(1.0, fabs(w))))
                return fail(k, "lse[t=%lld,h=%d] = %.8g, want %.8g", (long long)t, h, a, w);
        }
}

/* Reads a run's outputs as doubles ([T, H*D] and [T, H]). */
static void as_doubles(const ginputs *in, const goutputs *o, double *out, double *lse)
{
    const gcase *c = in->c;
    int64_t qrow = (int64_t)c->H * c->D;
    for (int64_t t = 0; t < in->ntok; t++) {
        for (int64_t e = 0; e < qrow; e++) out[t * qrow + e] = load_float(c->outd, o->out.p, t * in->out_rs + e);
        for (int32_t h = 0; h < c->H; h++) lse[t * c->H + h] = ((float *)o->lse.p)[t * o->lse_ts + h * o->lse_hs];
    }
}

static pa_status run_reference(const ginputs *in, goutputs *ref)
{
    pa_context *rctx = NULL;
    pa_status s = pa_context_create(pa_backend_find("reference"), NULL, &rctx);
    if (!s) s = run_forward(rctx, in, ref, false);
    pa_context_destroy(rctx);
    return s;
}

/* The reference's results per grid case, kept for the rest of the process. test_cpu_grid runs
 * every case once per ISA path (and the E4M3 rows once more per conversion), and the reference's
 * forward was most of its time (~2/3 natively: it converts each key row once per query row), the
 * same function of the same inputs each time. A result is reused only where every input byte
 * hashes as when it was made: the q, k and v rows, the cache before forward, the block tables,
 * slots, ALiBi slopes and sinks (the case's geometry and metadata are its index's). What is kept:
 * the output and LSE as doubles and a 64-bit hash of the cache after forward (the cache check
 * compares hashes then, not bytes), up to REF_MEMO_BYTES in all; past that, cases recompute. */
#define REF_MEMO_BYTES ((size_t)1 << 30)
typedef struct ref_memo {
    uint64_t in_hash, pool_hash;
    double *out, *lse; /* NULL: none kept */
    int64_t nout, nlse;
} ref_memo;
static ref_memo ref_memos[sizeof cases / sizeof cases[0]];
static size_t ref_memo_bytes;

#define FNV_BASIS 0xcbf29ce484222325ull
/* FNV-1a over n bytes at p, continuing from h */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t inputs_hash(const ginputs *in)
{
    uint64_t h = FNV_BASIS;
    const gbuf *bufs[] = {&in->qkv, &in->kbuf, &in->vbuf, &in->pool_buf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->base) h = fnv1a(h, bufs[i]->p, bufs[i]->bytes);
    h = fnv1a(h, in->tables, sizeof in->tables);
    h = fnv1a(h, in->ntable, sizeof in->ntable);
    h = fnv1a(h, in->xtables, sizeof in->xtables);
    h = fnv1a(h, in->nxtable, sizeof in->nxtable);
    h = fnv1a(h, in->slots, sizeof in->slots);
    h = fnv1a(h, in->alibi, sizeof in->alibi);
    return fnv1a(h, in->sinks, sizeof in->sinks);
}

/* The reference's output and LSE (as doubles, into wo and wl) and the hash of its cache after
 * forward, for the case of `in`: from the memo where it holds this case with these inputs, else
 * by running the reference (and keeping the result where the budget allows). */
static pa_status reference_result(const ginputs *in, double *wo, double *wl, uint64_t *pool_hash)
{
    const gcase *c = in->c;
    const int64_t nout = in->ntok * c->H * c->D, nlse = in->ntok * c->H;
    const bool in_grid = (uintptr_t)c >= (uintptr_t)cases && (uintptr_t)c < (uintptr_t)(cases + ncases);
    ref_memo *m = in_grid ? &ref_memos[c - cases] : NULL;
    const uint64_t ih = m ? inputs_hash(in) : 0;
    if (m && m->out && m->in_hash == ih && m->nout == nout && m->nlse == nlse) {
        memcpy(wo, m->out, (size_t)nout * sizeof *wo);
        memcpy(wl, m->lse, (size_t)nlse * sizeof *wl);
        *pool_hash = m->pool_hash;
        return PA_STATUS_OK;
    }
    goutputs ref;
    memset(&ref, 0, sizeof ref);
    pa_status rs = make_outputs(in, &ref) ? PA_STATUS_OUT_OF_MEMORY : run_reference(in, &ref);
    if (!rs) {
        as_doubles(in, &ref, wo, wl);
        *pool_hash = fnv1a(FNV_BASIS, ref.pool.p, ref.pool.bytes);
        const size_t bytes = (size_t)(nout + nlse) * sizeof(double);
        if (m && !m->out && ref_memo_bytes + bytes <= REF_MEMO_BYTES) {
            m->out = malloc((size_t)nout * sizeof *wo + 1);
            m->lse = malloc((size_t)nlse * sizeof *wl + 1);
            if (m->out && m->lse) {
                memcpy(m->out, wo, (size_t)nout * sizeof *wo);
                memcpy(m->lse, wl, (size_t)nlse * sizeof *wl);
                m->in_hash = ih, m->pool_hash = *pool_hash, m->nout = nout, m->nlse = nlse;
                ref_memo_bytes += bytes;
            } else {
                free(m->out);
                free(m->lse);
                m->out = m->lse = NULL;
            }
        }
    }
    free_outputs(&ref);
    return rs;
}

static int run_case(const pa_backend *backend, const gcase *c, int num_threads, int det_threads, grid_result *res);

int grid_run_case(const pa_backend *backend, int index, int num_threads, grid_result *res)
{
    build_cases();
    memset(res, 0, sizeof *res);
    if (index < 0 || index >= ncases || !backend) {
        snprintf(res->reason, sizeof res->reason, "no case %d or no backend", index);
        return res->failed = 1;
    }
    return run_case(backend, &cases[index], num_threads, 0, res);
}

/* The case once more on a fresh context of `threads` threads, into o (all sequences in one
 * batch, or each alone); *same: whether out, lse and cache equal want's bit for bit. */
static pa_status rerun(const pa_backend *backend, const ginputs *in, goutputs *o, bool device, int threads, int alone,
                       const goutputs *want, int *same, const fenv_t *caller)
{
    pa_context *ctx = NULL;
    pa_context_options opt = {threads, 0, NULL};
    pa_status s = make_outputs(in, o) ? PA_STATUS_OUT_OF_MEMORY : PA_STATUS_OK;
    fesetenv(caller);
    if (!s) s = pa_context_create(backend, &opt, &ctx);
    if (!s) s = alone ? run_alone(ctx, in, o, device) : run_forward(ctx, in, o, device);
    pa_context_destroy(ctx);
    fesetenv(FE_DFL_ENV);
    *same = !s && !memcmp(o->out.p, want->out.p, want->out.bytes) && !memcmp(o->lse.p, want->lse.p, want->lse.bytes) &&
            !memcmp(o->pool.p, want->pool.p, want->pool.bytes);
    return s;
}

/* det_threads > 0: the backend runs the case a second time with that many threads, and the two
 * outputs, LSEs and caches must be bitwise identical (DESIGN.md, determinism); then, for a case
 * of several sequences, once more with each sequence in a batch of its own: the same bits again.
 * The backend under test runs in the caller's floating-point environment (a rounding mode or
 * flush-to-zero mode set by the caller reaches it as it would reach any library call); the
 * harness's own arithmetic (inputs, reference, comparison) runs in the default one. */
static int run_case(const pa_backend *backend, const gcase *c, int num_threads, int det_threads, grid_result *res)
{
    bool device = pa_backend_memory(backend) != PA_MEMORY_HOST;
    if (device && !have_dev_hooks) {
        snprintf(res->reason, sizeof res->reason, "device backend without staging hooks");
        res->skipped = 1;
        return 0;
    }
    fenv_t caller;
    fegetenv(&caller);
    fesetenv(FE_DFL_ENV);
    ginputs in;
    goutputs got;
    cmp_ctx k = {res, 0};
    memset(&got, 0, sizeof got);
    if (make_inputs(&in, c, res->reason, sizeof res->reason) || make_outputs(&in, &got)) {
        res->failed = 1;
        goto done;
    }
    char why[200];
    if (pa_backend_supports(backend, in.layer, why, sizeof why) == PA_STATUS_UNSUPPORTED) {
        res->skipped = 1;
        snprintf(res->reason, sizeof res->reason, "unsupported: %s", why);
        goto done;
    }
    pa_context_options opt = {num_threads, 0, NULL};
    pa_context *ctx = NULL;
    fesetenv(&caller);
    pa_status s = pa_context_create(backend, &opt, &ctx);
    if (!s) s = run_forward(ctx, &in, &got, device);
    pa_context_destroy(ctx);
    fesetenv(FE_DFL_ENV);
    int64_t n = in.ntok * c->H * c->D;
    double *wo = malloc((size_t)(n + 1) * sizeof *wo), *wl = malloc((size_t)(in.ntok * c->H + 1) * sizeof *wl);
    uint64_t ref_pool_hash = 0;
    pa_status rs = s ? PA_STATUS_OK
                 : !wo || !wl ? PA_STATUS_OUT_OF_MEMORY
                              : reference_result(&in, wo, wl, &ref_pool_hash);
    if (s || rs) {
        fail(&k, "forward failed: %s: %s", pa_status_name(s ? s : rs), pa_last_error());
    } else {
        check_gaps(&k, &in, &got);
        compare(&k, &in, &got, wo, wl);
        res->digest = fnv1a(fnv1a(FNV_BASIS, got.out.p, got.out.bytes), got.lse.p, got.lse.bytes);
        if (!k.fail && fnv1a(FNV_BASIS, got.pool.p, got.pool.bytes) != ref_pool_hash)
            fail(&k, "the cache after forward differs from the reference's");
        /* again with the plan made from another layer of the geometry (plan_sibling) */
        if (!k.fail) {
            goutputs again;
            memset(&again, 0, sizeof again);
            int same = 0;
            pa_status s2 = plan_sibling(&in, &in.plan_layer);
            if (!s2) s2 = rerun(backend, &in, &again, device, num_threads, 0, &got, &same, &caller);
            if (s2)
                fail(&k, "forward with a plan made from another layer failed: %s: %s", pa_status_name(s2),
                     pa_last_error());
            else if (!same)
                fail(&k, "a plan made from another layer of the geometry (window, ALiBi, soft cap, sinks, "
                         "block sparsity switched) gives other bits");
            free_outputs(&again);
            pa_layer_destroy(in.plan_layer);
            in.plan_layer = NULL;
        }
        /* again with det_threads threads, then each sequence alone: the same bits each time */
        for (int alone = 0; alone < 2 && !k.fail && det_threads > 0 && (!alone || c->nseq > 1); alone++) {
            goutputs again;
            int same = 0;
            pa_status s2 = rerun(backend, &in, &again, device, det_threads, alone, &got, &same, &caller);
            if (s2)
                fail(&k, "forward %s failed: %s: %s", alone ? "of each sequence alone" : "with other threads",
                     pa_status_name(s2), pa_last_error());
            else if (!same && alone)
                fail(&k, "each sequence alone (%d threads) gives other bits than the whole batch", det_threads);
            else if (!same)
                fail(&k, "%d threads and %d threads give different bits", num_threads, det_threads);
            free_outputs(&again);
        }
    }
    free(wo);
    free(wl);
    res->failed = k.fail;
done:
    free_outputs(&got);
    free_inputs(&in);
    fesetenv(&caller);
    return res->failed;
}

int grid_run_all(const pa_backend *backend, const char *filter, int num_threads, FILE *out)
{
    build_cases();
    /* PAGEDATTN_GRID_DIGEST=1: each line ends with a hash of the output bits, so that two builds
     * (a kernel rewritten to keep its arithmetic, say) can be compared bit for bit */
    const char *de = getenv("PAGEDATTN_GRID_DIGEST");
    const bool digest = de && *de && *de != '0';
    int failures = 0, passed = 0, skipped = 0;
    if (out)
        fprintf(out, "%-4s %-6s %10s %10s %10s  %s%s\n", "#", "result", "max_abs", "max_rel", "lse_err", "case",
                digest ? "  digest" : "");
    for (int i = 0; i < ncases; i++) {
        if (filter && !strstr(cases[i].name, filter)) continue;
        grid_result r;
        grid_run_case(backend, i, num_threads, &r);
        failures += r.failed;
        skipped += r.skipped;
        passed += !r.failed && !r.skipped;
        if (out) {
            fprintf(out, "%-4d %-6s %10.3g %10.3g %10.3g  %s", i, r.failed ? "FAIL" : r.skipped ? "skip" : "ok",
                    r.max_abs_err, r.max_rel_err, r.max_lse_err, cases[i].name);
            if (digest) fprintf(out, "  %016llx", (unsigned long long)r.digest);
            fputc('\n', out);
            if (r.failed || r.skipped) fprintf(out, "     -> %s\n", r.reason);
            fflush(out);
        }
    }
    if (out)
        fprintf(out, "%s: %d passed, %d failed, %d skipped\n", pa_backend_name(backend), passed, failures, skipped);
    return failures;
}

/* ---- the independent oracle ------------------------------------------------------------------
 * Written from the contract, sharing nothing with the library but the scalar dtype conversions
 * (tested exhaustively on their own): for each sequence, gather its keys and values into
 * contiguous arrays (emulating this step's cache write), build the visibility of every
 * (query, key) pair explicitly, and take the softmax in long double. */

/* Dequantized element as stored in a cache of the case's dtype. */
static long double stored(const gcase *c, double x, double scale)
{
    bool fp8 = pa_dtype_size(c->cache) == 1;
    float f = (float)(fp8 ? (float)x / (float)scale : x);
    switch (c->cache) {
    case PA_DTYPE_F32: return f;
    case PA_DTYPE_F16: return pa_f16_to_f32(pa_f32_to_f16(f));
    case PA_DTYPE_BF16: return pa_bf16_to_f32(pa_f32_to_bf16(f));
    case PA_DTYPE_FP8_E4M3: return (long double)pa_fp8e4m3_to_f32(pa_f32_to_fp8e4m3(f)) * scale;
    default: return (long double)pa_fp8e5m2_to_f32(pa_f32_to_fp8e5m2(f)) * scale;
    }
}

/* Element offset of (block, token, head) in the case's pool layout, recomputed here. */
static int64_t pool_offset(const ginputs *in, int32_t block, int32_t t, int32_t h)
{
    const gcase *c = in->c;
    int64_t D = c->D, Hkv = c->Hkv, B = c->B;
    switch (c->layout) {
    case LAYOUT_HND: return ((block * Hkv + h) * B + t) * D;
    case LAYOUT_INTERLEAVED: return block * 2 * B * Hkv * D + (t * Hkv + h) * D;
    case LAYOUT_PADDED: return block * (B * (Hkv * (D + 3) + 1) + 5) + t * (Hkv * (D + 3) + 1) + h * (D + 3);
    default: return ((block * B + t) * Hkv + h) * D;
    }
}

/* Keys and values of sequence s: [n, Hkv, D]. */
static int64_t gather(const ginputs *in, int s, int64_t tok0, int64_t enc0, long double *K, long double *V)
{
    const gcase *c = in->c;
    int64_t kvrow = (int64_t)c->Hkv * c->D;
    const void *kb = in->kbuf.base ? in->kbuf.p : (char *)in->qkv.p + in->k_off;
    const void *vb = in->vbuf.base ? in->vbuf.p : (char *)in->qkv.p + in->v_off;
    bool cross = c->type == PA_ATTN_ENCODER_DECODER, cached = c->type == PA_ATTN_DECODER || cross;
    int64_t n = cross ? c->seqs[s].enc : c->type == PA_ATTN_DECODER ? c->seqs[s].ctx + c->seqs[s].q : c->seqs[s].q;
    for (int64_t j = 0; j < n; j++) {
        /* Does key j come from this step's k/v rows? */
        int64_t row = -1;
        if (!c->no_kv) {
            if (cross) row = enc0 + j;
            else if (!cached) row = tok0 + j;
            else if (j >= c->seqs[s].ctx && !(c->explicit_slots && (j - c->seqs[s].ctx) % 3 == 1))
                row = tok0 + (j - c->seqs[s].ctx);
        }
        for (int64_t e = 0; e < kvrow; e++) {
            if (row >= 0) {
                double k = load_float(c->kvd, kb, row * in->k_rs + e), v = load_float(c->kvd, vb, row * in->v_rs + e);
                K[j * kvrow + e] = cached ? stored(c, k, c->kscale) : k;
                V[j * kvrow + e] = cached ? stored(c, v, c->vscale) : v;
                continue;
            }
            const int32_t *table = cross ? in->xtables[s] : in->tables[s];
            int64_t off = pool_offset(in, table[j / c->B], (int32_t)(j % c->B), (int32_t)(e / c->D)) + e % c->D;
            bool fp8 = pa_dtype_size(c->cache) == 1;
            K[j * kvrow + e] = load_float(c->cache, in->pool_buf.p, off) * (fp8 ? c->kscale : 1.0);
            V[j * kvrow + e] = load_float(c->cache, (char *)in->pool_buf.p + in->value_off, off) * (fp8 ? c->vscale : 1.0);
        }
    }
    return n;
}

static bool visible(const gcase *c, int32_t h, int64_t p, int64_t j)
{
    if (c->type == PA_ATTN_ENCODER_DECODER) return true;
    if (c->type == PA_ATTN_DECODER && j > p) return false;
    int64_t wl = c->sw > 0 ? c->sw - 1 : c->wl, wr = c->sw > 0 ? 0 : c->wr;
    if (wl >= 0 && j < p - wl) return false;
    if (wr >= 0 && j > p + wr) return false;
    if (c->bs.block_size > 0) {
        int64_t qb = p / c->bs.block_size, kb = j / c->bs.block_size;
        if (kb > qb) return false;
        if (qb - kb < c->bs.local_blocks) return true;
        int64_t step = c->bs.homo_head ? 0 : c->bs.head_sliding_step, off;
        if (step >= 0) off = ((int64_t)c->bs.tp_rank * c->H + h) * step + 1;
        else off = ((int64_t)c->bs.tp_rank * c->Hkv + h / (c->H / c->Hkv)) * -step + 1;
        return (kb + off) % c->bs.vert_stride == 0;
    }
    return true;
}

static void oracle(const ginputs *in, double *want_out, double *want_lse)
{
    const gcase *c = in->c;
    int64_t qrow = (int64_t)c->H * c->D, kvrow = (int64_t)c->Hkv * c->D, tok0 = 0, enc0 = 0;
    int64_t maxn = 1;
    for (int s = 0; s < c->nseq; s++) maxn = fmax(maxn, c->seqs[s].ctx + c->seqs[s].q + c->seqs[s].enc);
    long double *K = malloc((size_t)(maxn * kvrow) * sizeof *K), *V = malloc((size_t)(maxn * kvrow) * sizeof *V);
    long double *S = malloc((size_t)maxn * sizeof *S);
    float scale = c->lscale > 0 ? c->lscale : (float)(1.0 / sqrt((double)c->D));
    for (int s = 0; s < c->nseq; s++) {
        int64_t n = gather(in, s, tok0, enc0, K, V);
        for (int32_t t = 0; t < c->seqs[s].q; t++)
            for (int32_t h = 0; h < c->H; h++) {
                int64_t p = c->seqs[s].ctx + t, kh = h / (c->H / c->Hkv);
                long double m = c->sinks ? in->sinks[h] : -INFINITY, qv[512];
                for (int32_t d = 0; d < c->D; d++)
                    qv[d] = load_float(c->qd, (char *)in->qkv.p + in->q_off, (tok0 + t) * in->q_rs + h * c->D + d);
                bool poisoned = false; /* a visible logit is NaN or +inf: the row is NaN */
                for (int64_t j = 0; j < n; j++) {
                    long double dot = 0;
                    for (int32_t d = 0; d < c->D; d++) dot += qv[d] * K[j * kvrow + kh * c->D + d];
                    long double x = scale * dot;
                    if (c->softcap > 0) x = c->softcap * tanhl(x / c->softcap);
                    if (c->alibi) x -= (long double)in->alibi[h] * fabsl((long double)(j - p));
                    bool vis = visible(c, h, p, j);
                    poisoned |= vis && (isnan(x) || x == INFINITY);
                    S[j] = vis ? x : NAN; /* NaN: not visible (a visible NaN poisoned the row) */
                    if (!isnan(S[j]) && S[j] > m) m = S[j];
                }
                if (poisoned) {
                    for (int32_t d = 0; d < c->D; d++) want_out[(tok0 + t) * qrow + h * c->D + d] = NAN;
                    want_lse[(tok0 + t) * c->H + h] = NAN;
                    continue;
                }
                long double den = 0, acc[512] = {0};
                for (int64_t j = 0; j < n && m > -INFINITY; j++) {
                    if (isnan(S[j])) continue;
                    long double w = expl(S[j] - m);
                    den += w;
                    for (int32_t d = 0; d < c->D; d++) acc[d] += w * V[j * kvrow + kh * c->D + d];
                }
                if (c->sinks && m > -INFINITY) den += expl(in->sinks[h] - m);
                for (int32_t d = 0; d < c->D; d++) {
                    double o = den > 0 ? (double)(acc[d] / den) : 0.0;
                    /* the library rounds once to the output dtype; so does the oracle */
                    want_out[(tok0 + t) * qrow + h * c->D + d] =
                        c->outd == PA_DTYPE_F32 ? (float)o : c->outd == PA_DTYPE_F16 ? pa_f16_to_f32(pa_f32_to_f16((float)o)) : pa_bf16_to_f32(pa_f32_to_bf16((float)o));
                }
                want_lse[(tok0 + t) * c->H + h] = den > 0 ? (double)(m + logl(den)) : -INFINITY;
            }
        tok0 += c->seqs[s].q;
        enc0 += c->seqs[s].enc;
    }
    free(K);
    free(V);
    free(S);
}

static int check_reference(const gcase *c, grid_result *res);

int grid_check_reference(int index, grid_result *res)
{
    build_cases();
    memset(res, 0, sizeof *res);
    if (index < 0 || index >= ncases) {
        snprintf(res->reason, sizeof res->reason, "no case %d", index);
        return res->failed = 1;
    }
    return check_reference(&cases[index], res);
}

static int check_reference(const gcase *c, grid_result *res)
{
    ginputs in;
    goutputs ref;
    memset(&ref, 0, sizeof ref);
    cmp_ctx k = {res, 0};
    if (make_inputs(&in, c, res->reason, sizeof res->reason) || make_outputs(&in, &ref)) {
        res->failed = 1;
    } else if (run_reference(&in, &ref)) {
        fail(&k, "reference forward failed: %s", pa_last_error());
    } else {
        int64_t n = in.ntok * c->H * c->D;
        double *wo = malloc((size_t)(n + 1) * sizeof *wo), *wl = malloc((size_t)(in.ntok * c->H + 1) * sizeof *wl);
        oracle(&in, wo, wl);
        check_gaps(&k, &in, &ref);
        compare(&k, &in, &ref, wo, wl);
        free(wo);
        free(wl);
    }
    res->failed |= k.fail;
    free_outputs(&ref);
    free_inputs(&in);
    return res->failed;
}

/* ---- random sweeps ----------------------------------------------------------------------- */

/* A swept case made as sharp as its space allows (grid_set_sweep_options); its head size from
 * the case's seed (no draw of the stream, so the sweep's other cases stay what they were). */
static void sharpen(gcase *c)
{
    static const int32_t dims[] = {128, 136, 200, 256, 512};
    c->D = dims[(c->seed >> 40) % 5];
    c->qscale = 6.5f; /* random_case's largest */
    if (pa_dtype_size(c->cache) == 1) c->kscale = 2.0f;
    c->outd = PA_DTYPE_F32;
    fit_budget(c);
}

int grid_random_sweep(const pa_backend *backend, uint64_t seed, int count, int num_threads, int det_threads,
                      bool oracle_too, FILE *out)
{
    build_cases();
    /* PAGEDATTN_SWEEP_VERBOSE=1: a line for every case, not only for failures and skips */
    const char *ve = getenv("PAGEDATTN_SWEEP_VERBOSE");
    const bool verbose = ve && *ve && *ve != '0';
    int failures = 0, passed = 0, skipped = 0, worst = -1;
    double worst_err = 0;
    uint64_t r = seed;
    for (int i = 0; i < count; i++) {
        uint64_t at = r; /* replaying from here (seed at, count 1) draws this case again */
        gcase c = sweep_case(&r);
        if (sweep_sharp) sharpen(&c);
        name_case(&c, "sweep");
        grid_result a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        if (backend) run_case(backend, &c, num_threads, det_threads, &a);
        if (oracle_too) check_reference(&c, &b);
        bool fail = a.failed || b.failed;
        if (a.max_abs_err > worst_err) worst_err = a.max_abs_err, worst = i;
        failures += fail;
        skipped += !fail && a.skipped;
        passed += !fail && !a.skipped;
        if (out && (verbose || fail || a.skipped)) {
            fprintf(out, "%-6d %-6s %10.3g %10.3g %10.3g  %s", i, fail ? "FAIL" : a.skipped ? "skip" : "ok",
                    a.max_abs_err, a.max_rel_err, a.max_lse_err, c.name);
            if (fail || a.skipped)
                fprintf(out, " (replay: --seed %#llx --random 1%s)", (unsigned long long)at, sweep_sharp ? " --sharp" : "");
            fputc('\n', out);
            if (a.failed || a.skipped) fprintf(out, "       -> %s\n", a.reason);
            if (b.failed) fprintf(out, "       -> reference vs oracle: %s\n", b.reason);
        }
        if (out && (i + 1) % 100 == 0) {
            fprintf(out, "... %d cases: %d passed, %d failed, %d skipped\n", i + 1, passed, failures, skipped);
            fflush(out);
        }
    }
    if (out)
        fprintf(out, "%s sweep from seed %#llx: %d passed, %d failed, %d skipped; largest error %.3g (case %d)\n",
                backend ? pa_backend_name(backend) : "oracle", (unsigned long long)seed, passed, failures, skipped,
                worst_err, worst);
    return failures;
}
