/* shapes.c: times the cpu backend's forward on shapes beyond the bench's standard cases (head
 * sizes, GQA ratios, speculative steps, block sizes, windows, block sparsity, encoder and cross
 * attention), one library thread, each call after a 1 GiB read so that the KV comes from DRAM,
 * and prints each case's floor (KV bytes over the best read pass, or useful flops over the
 * fp32 FMA peak, both measured in the same run) and the fraction reached. Written by the
 * forty-third pass's audit of performance cliffs (bench/NOTES.md); not part of the build.
 *
 *   gcc -O2 -march=native -Iinclude bench/micro/shapes.c -o /tmp/shapes -Lbuild -lpagedattn \
 *       -Wl,-rpath,$PWD/build -lm
 *   taskset -c 0 /tmp/shapes 3 "name=dec seqs=16x1x4095" "name=spec3_f16 cache=f16 q=f16 seqs=16x3x4093"
 *
 * Usage: shapes REPS "spec" ...; the cases run interleaved, REPS rounds. A spec is
 * space-separated key=value:
 *   hq hkv d bs layout(hnd|nhd) cache(f32|f16|bf16|e4m3|e5m2) q(f32|f16|bf16)
 *   seqs=COUNTxQLENxCTX[,COUNTxQLENxCTX...]
 *   pf=0|1 (is_prefill of those seqs; default qlen > 16)
 *   type=dec|enc|enconly|cross  enc=LEN (cross: encoder length per seq)
 *   win=W (sliding_window) alibi=1 cap=C sinks=1 bsp=BS,LOCAL,VERT[,HOMO[,STEP]] kscale=S name=...
 *   iters=N (forward calls per timed sample; default 1)
 *   hot=N (every block table entry taken modulo N and no read before the calls: with N = 2 the
 *   KV stays in L2, the arithmetic alone; the floor is then the flops')
 */
#define _GNU_SOURCE
#include "pagedattn.h"
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "micro.h"

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define FLUSH_BYTES ((size_t)1 << 30)
static unsigned char *g_flush;
/* AVX2 forms of the two probes below, for hosts without AVX-512 (the forty-sixth pass's Zen 3) */
__attribute__((target("avx2"))) static double read_pass_avx2(void)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    const unsigned char *p = g_flush;
    double t0 = now();
    for (size_t i = 0; i < FLUSH_BYTES; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const void *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const void *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const void *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const void *)(p + i + 96)));
    }
    double t = now() - t0;
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    volatile long long s = _mm256_extract_epi64(a0, 0) + _mm256_extract_epi64(a0, 3);
    (void)s;
    return (double)FLUSH_BYTES / t / 1e9;
}
__attribute__((target("avx2,fma"))) static double fma_peak_avx2(void)
{
    long iters = 20000000;
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    __m256 c[10];
    for (int i = 0; i < 10; i++) c[i] = _mm256_set1_ps((float)i);
    double t0 = now();
    for (long it = 0; it < iters; it++) {
        c[0] = _mm256_fmadd_ps(c[0], a, b); c[1] = _mm256_fmadd_ps(c[1], a, b);
        c[2] = _mm256_fmadd_ps(c[2], a, b); c[3] = _mm256_fmadd_ps(c[3], a, b);
        c[4] = _mm256_fmadd_ps(c[4], a, b); c[5] = _mm256_fmadd_ps(c[5], a, b);
        c[6] = _mm256_fmadd_ps(c[6], a, b); c[7] = _mm256_fmadd_ps(c[7], a, b);
        c[8] = _mm256_fmadd_ps(c[8], a, b); c[9] = _mm256_fmadd_ps(c[9], a, b);
    }
    double t = now() - t0;
    __m256 s = c[0];
    for (int i = 1; i < 10; i++) s = _mm256_add_ps(s, c[i]);
    float v[8];
    _mm256_storeu_ps(v, s);
    volatile float w = v[0] + v[7];
    (void)w;
    return 10.0 * 16 * iters / t / 1e9;
}
__attribute__((target("avx512f"))) static double read_pass(void)
{
    if (!__builtin_cpu_supports("avx512f")) return read_pass_avx2();
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    const unsigned char *p = g_flush;
    double t0 = now();
    for (size_t i = 0; i < FLUSH_BYTES; i += 256) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512((const void *)(p + i + 64)));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512((const void *)(p + i + 128)));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512((const void *)(p + i + 192)));
    }
    double t = now() - t0;
    a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    volatile long long s = _mm512_reduce_add_epi64(a0);
    (void)s;
    return (double)FLUSH_BYTES / t / 1e9;
}
__attribute__((target("avx512f"))) static double fma_peak(void)
{
    if (!__builtin_cpu_supports("avx512f")) return fma_peak_avx2();
    long iters = 20000000;
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    __m512 c[12];
    for (int i = 0; i < 12; i++) c[i] = _mm512_set1_ps((float)i);
    double t0 = now();
    for (long it = 0; it < iters; it++) {
        c[0] = _mm512_fmadd_ps(c[0], a, b); c[1] = _mm512_fmadd_ps(c[1], a, b);
        c[2] = _mm512_fmadd_ps(c[2], a, b); c[3] = _mm512_fmadd_ps(c[3], a, b);
        c[4] = _mm512_fmadd_ps(c[4], a, b); c[5] = _mm512_fmadd_ps(c[5], a, b);
        c[6] = _mm512_fmadd_ps(c[6], a, b); c[7] = _mm512_fmadd_ps(c[7], a, b);
        c[8] = _mm512_fmadd_ps(c[8], a, b); c[9] = _mm512_fmadd_ps(c[9], a, b);
        c[10] = _mm512_fmadd_ps(c[10], a, b); c[11] = _mm512_fmadd_ps(c[11], a, b);
    }
    double t = now() - t0;
    __m512 s = c[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, c[i]);
    volatile float v = _mm512_reduce_add_ps(s);
    (void)v;
    return 12.0 * 32 * iters / t / 1e9;
}

static float gauss(void)
{
    double u1 = ((micro_next() >> 11) + 1.0) / 9007199254740993.0, u2 = (micro_next() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
}
/* fill n elements of dtype at p with N(0, sd) values (a 1 MiB pattern tiled) */
static void fill(pa_dtype dt, void *p, size_t n, float sd)
{
    size_t es = pa_dtype_size(dt), pn = (1u << 20) / 4;
    float *t = malloc(pn * 4);
    void *pat = malloc(pn * es);
    for (size_t i = 0; i < pn; i++) t[i] = gauss() * sd;
    pa_convert(dt, pat, PA_DTYPE_F32, t, pn, 1.0f);
    for (size_t i = 0; i < n; i += pn) {
        size_t m = n - i < pn ? n - i : pn;
        memcpy((char *)p + i * es, pat, m * es);
    }
    free(t);
    free(pat);
}

typedef struct {
    char name[256];
    pa_layer *layer;
    pa_batch *batch;
    pa_context *ctx;
    pa_plan *plan;
    pa_cache cache;
    pa_forward_args args;
    void *q, *out, *knew, *vnew;
    double bytes, flops;
    double *t;
    int iters, hot;
    int ok;
} cs;

static pa_dtype pdt(const char *s)
{
    pa_dtype d;
    if (pa_dtype_parse(s, &d) != PA_STATUS_OK) {
        fprintf(stderr, "bad dtype %s\n", s);
        exit(2);
    }
    return d;
}

static int setup(cs *c, const char *spec, int reps)
{
    int hq = 32, hkv = 8, d = 128, bs = 16, layout = PA_LAYOUT_HND, pf = -1, alibi = 0, sinks = 0;
    int win = 0, enc = 0, iters = 1, hot = 0;
    float cap = 0, kscale = 1;
    int bsp[5] = {0, 0, 0, 0, 1};
    char cache_s[32] = "bf16", q_s[32] = "bf16", type_s[32] = "dec", seqs_s[512] = "16x1x4095", name[200] = "";
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        if (!strcmp(k, "hq")) hq = atoi(v);
        else if (!strcmp(k, "hkv")) hkv = atoi(v);
        else if (!strcmp(k, "d")) d = atoi(v);
        else if (!strcmp(k, "bs")) bs = atoi(v);
        else if (!strcmp(k, "layout")) layout = !strcmp(v, "nhd") ? PA_LAYOUT_NHD : PA_LAYOUT_HND;
        else if (!strcmp(k, "cache")) snprintf(cache_s, sizeof cache_s, "%s", v);
        else if (!strcmp(k, "q")) snprintf(q_s, sizeof q_s, "%s", v);
        else if (!strcmp(k, "type")) snprintf(type_s, sizeof type_s, "%s", v);
        else if (!strcmp(k, "seqs")) snprintf(seqs_s, sizeof seqs_s, "%s", v);
        else if (!strcmp(k, "name")) snprintf(name, sizeof name, "%s", v);
        else if (!strcmp(k, "pf")) pf = atoi(v);
        else if (!strcmp(k, "alibi")) alibi = atoi(v);
        else if (!strcmp(k, "sinks")) sinks = atoi(v);
        else if (!strcmp(k, "win")) win = atoi(v);
        else if (!strcmp(k, "enc")) enc = atoi(v);
        else if (!strcmp(k, "cap")) cap = (float)atof(v);
        else if (!strcmp(k, "kscale")) kscale = (float)atof(v);
        else if (!strcmp(k, "iters")) iters = atoi(v);
        else if (!strcmp(k, "hot")) hot = atoi(v);
        else if (!strcmp(k, "bsp")) sscanf(v, "%d,%d,%d,%d,%d", &bsp[0], &bsp[1], &bsp[2], &bsp[3], &bsp[4]);
    }
    snprintf(c->name, sizeof c->name, "%s", name[0] ? name : spec);
    c->iters = iters;
    c->hot = hot;
    pa_attn_type type = !strcmp(type_s, "enc") ? PA_ATTN_ENCODER
                        : !strcmp(type_s, "enconly") ? PA_ATTN_ENCODER_ONLY
                        : !strcmp(type_s, "cross") ? PA_ATTN_ENCODER_DECODER
                                                   : PA_ATTN_DECODER;
    pa_dtype cdt = pdt(cache_s), qdt = pdt(q_s);
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, hq, hkv, d);
    cfg.attn_type = type;
    cfg.q_dtype = qdt;
    cfg.out_dtype = qdt;
    cfg.kv_dtype = qdt;
    cfg.cache_dtype = cdt;
    if (win) cfg.sliding_window = win;
    float *sl = calloc(hq, 4), *sk = calloc(hq, 4);
    for (int h = 0; h < hq; h++) sl[h] = powf(2.0f, -8.0f * (h + 1) / hq), sk[h] = 0.5f;
    if (alibi) cfg.alibi_slopes = sl;
    if (sinks) cfg.sinks = sk;
    cfg.logits_soft_cap = cap;
    if (bsp[0]) {
        cfg.blocksparse.block_size = bsp[0];
        cfg.blocksparse.local_blocks = bsp[1];
        cfg.blocksparse.vert_stride = bsp[2];
        cfg.blocksparse.homo_head = bsp[3];
        cfg.blocksparse.head_sliding_step = bsp[4];
    }
    if (kscale != 1) cfg.k_scale = cfg.v_scale = kscale;
    pa_status st = pa_layer_create(&cfg, &c->layer);
    if (st) { fprintf(stderr, "%s: layer: %s\n", c->name, pa_last_error()); return 0; }

    /* sequences */
    int ng = 0, cnt[16], ql[16], cx[16];
    {
        char sb[512];
        snprintf(sb, sizeof sb, "%s", seqs_s);
        for (char *g = strtok(sb, ","); g; g = strtok(NULL, ",")) {
            sscanf(g, "%dx%dx%d", &cnt[ng], &ql[ng], &cx[ng]);
            ng++;
        }
    }
    int ns = 0;
    for (int g = 0; g < ng; g++) ns += cnt[g];
    pa_seq *seqs = calloc(ns, sizeof *seqs);
    int64_t nblocks = 0, ncross = 0, ntok = 0;
    double bytes_keys = 0, flop_keys = 0; /* keys read x hkv; q-head x key pairs */
    int si = 0;
    int enc_like = type == PA_ATTN_ENCODER || type == PA_ATTN_ENCODER_ONLY;
    for (int g = 0; g < ng; g++)
        for (int i = 0; i < cnt[g]; i++, si++) {
            pa_seq *s = &seqs[si];
            s->context_len = enc_like ? 0 : cx[g];
            s->query_len = ql[g];
            s->is_prefill = pf >= 0 ? pf : (ql[g] > 16);
            int64_t kv = enc_like ? ql[g] : (type == PA_ATTN_ENCODER_DECODER ? enc : cx[g] + ql[g]);
            if (!enc_like) {
                int nb = (int)((cx[g] + ql[g] + bs - 1) / bs);
                s->num_blocks = nb;
                nblocks += nb;
            }
            if (type == PA_ATTN_ENCODER_DECODER) {
                s->encoder_len = enc;
                s->num_cross_blocks = (enc + bs - 1) / bs;
                ncross += s->num_cross_blocks;
            }
            ntok += ql[g];
            /* visible keys per query token */
            int64_t lo_u = INT64_MAX, hi_u = 0;
            if (bsp[0]) { /* exact: per kv head, union over its query heads and tokens */
                int grp = hq / hkv;
                unsigned char *seen = malloc(kv + 1);
                for (int kh = 0; kh < hkv; kh++) {
                    memset(seen, 0, kv + 1);
                    for (int hh = 0; hh < grp; hh++) {
                        int h = kh * grp + hh;
                        int64_t o = bsp[3] ? 1 : (bsp[4] >= 0 ? (int64_t)h * bsp[4] + 1 : (int64_t)kh * (-bsp[4]) + 1);
                        for (int t = 0; t < ql[g]; t++) {
                            int64_t p = s->context_len + t, qb = p / bsp[0];
                            for (int64_t j = 0; j <= p && j < kv; j++) {
                                int64_t kb = j / bsp[0];
                                if (qb - kb < bsp[1] || (kb + o) % bsp[2] == 0) { flop_keys += 1; seen[j] = 1; }
                            }
                        }
                    }
                    for (int64_t j = 0; j < kv; j++) bytes_keys += seen[j];
                }
                free(seen);
                continue;
            }
            for (int t = 0; t < ql[g]; t++) {
                int64_t p = s->context_len + t, lo = 0, hi = kv;
                if (type == PA_ATTN_DECODER) {
                    if (p + 1 < hi) hi = p + 1;
                    if (win && p - (win - 1) > lo) lo = p - (win - 1);
                }
                if (hi > lo) {
                    flop_keys += (double)(hi - lo) * hq;
                    if (lo < lo_u) lo_u = lo;
                    if (hi > hi_u) hi_u = hi;
                }
            }
            if (hi_u > lo_u) bytes_keys += (double)(hi_u - lo_u) * hkv;
        }
    c->bytes = bytes_keys * d * 2 * pa_dtype_size(cdt);
    c->flops = flop_keys * 4.0 * d;
    /* pool: decoder -> blocks; cross -> cross blocks */
    int64_t pool_blocks = type == PA_ATTN_ENCODER_DECODER ? ncross : nblocks;
    if (pool_blocks < 1) pool_blocks = 1;
    int32_t *perm = malloc(sizeof(int32_t) * (pool_blocks > 0 ? pool_blocks : 1));
    for (int64_t i = 0; i < pool_blocks; i++) perm[i] = (int32_t)i;
    for (int64_t i = pool_blocks - 1; i > 0; i--) {
        int64_t j = (int64_t)(micro_next() % (uint64_t)(i + 1));
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    /* decoder: self blocks from perm; cross: self blocks need a pool too; use a separate tiny
     * block space for the decoder tables of cross (unused by cross layers except validation) */
    int64_t off = 0;
    int32_t *tables = malloc(sizeof(int32_t) * (nblocks + ncross + 1));
    int64_t toff = 0;
    int64_t self_pool = nblocks > 0 ? nblocks : 1;
    int32_t *sperm = perm;
    int32_t *selfperm = NULL;
    if (type == PA_ATTN_ENCODER_DECODER) {
        selfperm = malloc(sizeof(int32_t) * self_pool);
        for (int64_t i = 0; i < self_pool; i++) selfperm[i] = (int32_t)i;
    }
    int64_t coff = 0;
    for (int i = 0; i < ns; i++) {
        pa_seq *s = &seqs[i];
        if (s->num_blocks) {
            s->block_table = tables + toff;
            for (int b = 0; b < s->num_blocks; b++) {
                tables[toff + b] = type == PA_ATTN_ENCODER_DECODER ? selfperm[off + b] : sperm[off + b];
                if (hot > 0) tables[toff + b] %= hot;
            }
            toff += s->num_blocks;
            off += s->num_blocks;
        }
        if (s->num_cross_blocks) {
            s->cross_block_table = tables + toff;
            for (int b = 0; b < s->num_cross_blocks; b++) tables[toff + b] = perm[coff + b];
            toff += s->num_cross_blocks;
            coff += s->num_cross_blocks;
        }
    }
    pa_batch_config bc = {0};
    bc.block_size = bs;
    bc.num_blocks = self_pool;
    bc.num_cross_blocks = type == PA_ATTN_ENCODER_DECODER ? ncross : 0;
    int64_t *slots = NULL;
    if (hot > 0) { /* (the tables alias blocks: no new token written, the step only reads) */
        slots = malloc(sizeof(int64_t) * (size_t)(ntok > 0 ? ntok : 1));
        for (int64_t i = 0; i < ntok; i++) slots[i] = -1;
        bc.slot_mapping = slots;
    }
    st = pa_batch_create(&bc, seqs, ns, &c->batch);
    free(slots);
    if (st) { fprintf(stderr, "%s: batch: %s\n", c->name, pa_last_error()); return 0; }
    pa_context_options co = {0};
    co.num_threads = 1;
    st = pa_context_create(pa_backend_find("cpu"), &co, &c->ctx);
    if (st) { fprintf(stderr, "%s: ctx: %s\n", c->name, pa_last_error()); return 0; }
    st = pa_plan_create(c->ctx, c->layer, c->batch, &c->plan);
    if (st) { fprintf(stderr, "%s: plan: %s\n", c->name, pa_last_error()); return 0; }
    memset(&c->args, 0, sizeof c->args);
    if (!enc_like) {
        pa_cache_init(&c->cache, layout, cdt, pool_blocks, bs, hkv, d);
        st = pa_cache_alloc(&c->cache);
        if (st) { fprintf(stderr, "%s: cache: %s\n", c->name, pa_last_error()); return 0; }
        size_t n = (size_t)pa_cache_pool_elems(&c->cache);
        float sdk = 1.0f;
        if (cdt == PA_DTYPE_FP8_E4M3 || cdt == PA_DTYPE_FP8_E5M2) {
            /* quantize N(0,1)/kscale */
            fill(cdt, c->cache.key, n, 1.0f / kscale);
            fill(cdt, c->cache.value, n, 1.0f / kscale);
        } else {
            fill(cdt, c->cache.key, n, sdk);
            fill(cdt, c->cache.value, n, 1.0f);
        }
        c->args.cache = &c->cache;
    }
    size_t qes = pa_dtype_size(qdt);
    c->q = aligned_alloc(64, ((size_t)ntok * hq * d * qes + 63) / 64 * 64);
    c->out = aligned_alloc(64, ((size_t)ntok * hq * d * qes + 63) / 64 * 64);
    fill(qdt, c->q, (size_t)ntok * hq * d, 1.0f);
    c->args.q = c->q;
    c->args.out = c->out;
    if (enc_like) {
        c->knew = aligned_alloc(64, ((size_t)ntok * hkv * d * qes + 63) / 64 * 64);
        c->vnew = aligned_alloc(64, ((size_t)ntok * hkv * d * qes + 63) / 64 * 64);
        fill(qdt, c->knew, (size_t)ntok * hkv * d, 1.0f);
        fill(qdt, c->vnew, (size_t)ntok * hkv * d, 1.0f);
        c->args.k = c->knew;
        c->args.v = c->vnew;
    }
    c->t = calloc(reps, sizeof(double));
    /* warm-up */
    st = pa_attn_forward(c->ctx, c->layer, c->batch, c->plan, &c->args);
    if (st) { fprintf(stderr, "%s: forward: %s\n", c->name, pa_last_error()); return 0; }
    free(seqs);
    c->ok = 1;
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    int reps = atoi(argv[1]);
    int n = argc - 2;
    g_flush = aligned_alloc(64, FLUSH_BYTES);
    memset(g_flush, 1, FLUSH_BYTES);
    cs *cases = calloc(n, sizeof *cases);
    for (int i = 0; i < n; i++) setup(&cases[i], argv[2 + i], reps);
    double peak = 0;
    for (int i = 0; i < 3; i++) { double p = fma_peak(); if (p > peak) peak = p; }
    double *bw = calloc((size_t)reps * n, sizeof(double));
    int nb = 0;
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < n; i++) {
            cs *c = &cases[i];
            if (!c->ok) continue;
            if (!c->hot) bw[nb++] = read_pass();
            else pa_attn_forward(c->ctx, c->layer, c->batch, c->plan, &c->args); /* (warm) */
            double t0 = now();
            for (int k = 0; k < c->iters; k++) pa_attn_forward(c->ctx, c->layer, c->batch, c->plan, &c->args);
            c->t[r] = (now() - t0) / c->iters;
        }
    qsort(bw, nb, sizeof(double), cmpd);
    if (nb == 0) bw[nb++] = read_pass();
    double bwm = bw[nb - 1]; /* best read pass */
    printf("# read %.2f GB/s (best of %d, median %.2f)  fma peak %.1f GFLOP/s\n", bwm, nb, bw[nb / 2], peak);
    printf("%-70s %10s %10s %10s %6s %8s\n", "case", "min_ms", "med_ms", "floor_ms", "frac", "bound");
    for (int i = 0; i < n; i++) {
        cs *c = &cases[i];
        if (!c->ok) { printf("%-70s FAILED\n", c->name); continue; }
        qsort(c->t, reps, sizeof(double), cmpd);
        double fm = c->hot ? 0 : c->bytes / (bwm * 1e9), fc = c->flops / (peak * 1e9);
        double fl = fm > fc ? fm : fc;
        double med = c->t[reps / 2];
        printf("%-70s %10.3f %10.3f %10.3f %5.0f%% %8s\n", c->name, c->t[0] * 1e3, med * 1e3, fl * 1e3,
               100 * fl / med, fm > fc ? "mem" : "flop");
    }
    fflush(stdout);
    return 0;
}
