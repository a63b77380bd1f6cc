/* decode_ab.c: A/B of builds of the library on one decode step, in one process (a development
 * measurement behind bench/NOTES.md, twenty-fifth pass; not part of the build).
 *
 *   gcc -O2 -Iinclude bench/micro/decode_ab.c -o /tmp/decode_ab -ldl
 *   /tmp/decode_ab build/libpagedattn.so /tmp/other-build/libpagedattn.so [...]
 *
 * Each library is dlopen'ed on its own (RTLD_LOCAL, so two builds of the same symbols coexist)
 * and runs decode 16 x 4096 (32 query / 8 KV heads x 128, HND, each sequence's blocks shuffled
 * over the pool) on the cpu backend over ONE cache, allocated by the first. Rounds alternate the
 * libraries (forwards, then backwards), REPS forwards each, so every library sees the same drift
 * of a shared host; the slow and fast phases of the development VM (bench/NOTES.md, seventeenth
 * pass) otherwise decide separate runs. Prints min / first quartile / median per library and a
 * checksum of the output (equal for builds that compute the same bits).
 * Environment: THR (threads, default 1), ROUNDS (8), REPS (3), DT (bf16 | f16 | e4m3 | e5m2 | f32),
 * D (head size, default 128), HQ (query heads, default 32; a multiple of 8: 64 for GQA 8), SEQS and CTX (the decode batch:
 * sequences, default 16, at most 64; keys each, default 4096, a multiple of 16),
 * PREFILL=n (one causal prompt of n tokens, n a multiple of 16, read from the cache, instead),
 * MIXPRE=n (one causal prompt of n tokens, a multiple of 16, first in the batch, beside the decodes:
 * a mixed step),
 * SMALL=n (every table entry modulo n: n = 2 keeps the KV in L2, the arithmetic alone), Q16=1
 * (bf16 queries, as the bench's bf16 rows: the avx512bf16 path's QK then takes vdpbf16ps),
 * ISAS=a,b,... (PAGEDATTN_CPU_ISA for each library's context in turn: one build under several
 * paths, given as copies of the .so at different paths so that each dlopen is its own),
 * LAYOUTS=a,b,... (hnd | nhd: each library's cache layout in turn, over two caches holding the
 * same values; copies of one .so again compare the layouts).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pagedattn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    void (*layer_config_init)(pa_layer_config *, int32_t, int32_t, int32_t);
    pa_status (*layer_create)(const pa_layer_config *, pa_layer **);
    pa_status (*backend_select)(const char *, const pa_layer *, const pa_backend **);
    pa_status (*batch_create)(const pa_batch_config *, const pa_seq *, int32_t, pa_batch **);
    pa_status (*context_create)(const pa_backend *, const void *, pa_context **);
    pa_status (*context_set_num_threads)(pa_context *, int32_t);
    pa_status (*plan_create)(pa_context *, const pa_layer *, const pa_batch *, pa_plan **);
    pa_status (*attn_forward)(pa_context *, const pa_layer *, const pa_batch *, const pa_plan *,
                              const pa_forward_args *);
    const char *(*last_error)(void);
    pa_layer *layer;
    pa_batch *batch;
    pa_context *ctx;
    pa_plan *plan;
} lib;

#define SYM(h, l, f)                                                                                 \
    do {                                                                                             \
        *(void **)&(l)->f = dlsym(h, "pa_" #f);                                                      \
        if (!(l)->f) {                                                                               \
            fprintf(stderr, "no pa_%s in %s\n", #f, path);                                           \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)
#define CK(l, x)                                                                                     \
    do {                                                                                             \
        if ((x) != PA_STATUS_OK) {                                                                       \
            fprintf(stderr, "%s: %s\n", #x, (l)->last_error());                                      \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v ? atoi(v) : def;
}

int main(int argc, char **argv)
{
    enum { HKV = 8, BS = 16 };
    const int D = env_int("D", 128); /* head size */
    const int H = env_int("HQ", 32); /* query heads (a multiple of the 8 KV heads) */
    /* PREFILL=n: one causal prompt of n tokens (n a multiple of 16) instead of the decode batch */
    const int prefill = env_int("PREFILL", 0), S = prefill ? 1 : env_int("SEQS", 16);
    const int C = prefill ? prefill : env_int("CTX", 4096);
    if (S < 1 || S > 64 || C < 16 || C % 16) {
        fprintf(stderr, "SEQS: 1..64, CTX: a multiple of 16\n");
        return 2;
    }
    const int QL = prefill ? prefill : 1; /* query tokens per sequence */
    const int mix = env_int("MIXPRE", 0); /* one prefill of mix tokens first, then the decodes */
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIBPAGEDATTN.so [...]\n", argv[0]);
        return 2;
    }
    const int nl = argc - 1, thr = env_int("THR", 1), rounds = env_int("ROUNDS", 8), reps = env_int("REPS", 3);
    const int small = env_int("SMALL", 0), q16 = env_int("Q16", 0);
    const char *dts = getenv("DT") ? getenv("DT") : "bf16";
    const pa_dtype cd = !strcmp(dts, "bf16") ? PA_DTYPE_BF16 : !strcmp(dts, "f16") ? PA_DTYPE_F16
                          : !strcmp(dts, "f32") ? PA_DTYPE_F32 : !strcmp(dts, "e5m2") ? PA_DTYPE_FP8_E5M2
                                                : PA_DTYPE_FP8_E4M3;
    const int fp8 = cd == PA_DTYPE_FP8_E4M3 || cd == PA_DTYPE_FP8_E5M2;
    const int nbps = C / BS, nb = S * nbps + mix / BS;
    lib *libs = calloc((size_t)nl, sizeof(lib));
    void **handles = calloc((size_t)nl, sizeof(void *));
    for (int k = 0; k < nl; k++) {
        const char *path = argv[k + 1];
        handles[k] = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!handles[k]) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        lib *l = &libs[k];
        SYM(handles[k], l, layer_config_init);
        SYM(handles[k], l, layer_create);
        SYM(handles[k], l, backend_select);
        SYM(handles[k], l, batch_create);
        SYM(handles[k], l, context_create);
        SYM(handles[k], l, context_set_num_threads);
        SYM(handles[k], l, plan_create);
        SYM(handles[k], l, attn_forward);
        SYM(handles[k], l, last_error);
    }

    /* the cache: allocated by the first library (2 MiB aligned, huge pages advised), values that
     * are finite in every dtype */
    pa_status (*cache_init)(pa_cache *, pa_cache_layout, pa_dtype, int64_t, int32_t, int32_t, int32_t);
    pa_status (*cache_alloc)(pa_cache *);
    *(void **)&cache_init = dlsym(handles[0], "pa_cache_init");
    *(void **)&cache_alloc = dlsym(handles[0], "pa_cache_alloc");
    /* LAYOUTS=a,b,...: each library's cache layout in turn (hnd | nhd; default hnd), over two
     * caches of the same bytes (the NHD one is the HND one's values rearranged, so every layout
     * computes the same attention and the checksums agree) */
    pa_cache caches[2];
    for (int L = 0; L < 2; L++)
        if (!cache_init || !cache_alloc || cache_init(&caches[L], L ? PA_LAYOUT_NHD : PA_LAYOUT_HND, cd, nb, BS, HKV, D) ||
            cache_alloc(&caches[L])) {
            fprintf(stderr, "cache: %s\n", libs[0].last_error());
            return 1;
        }
    pa_cache cache = caches[0];
    const size_t bytes = (size_t)nb * BS * HKV * D * (cd == PA_DTYPE_F32 ? 4 : fp8 ? 1 : 2);
    uint64_t x = 1;
    for (int w = 0; w < 2; w++) {
        unsigned char *p = w ? cache.value : cache.key;
        for (size_t i = 0; i < bytes; i += 8) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint64_t v = cd == PA_DTYPE_FP8_E4M3   ? x & 0x7777777777777777ull
                         : cd == PA_DTYPE_FP8_E5M2 ? x & 0xbbbbbbbbbbbbbbbbull /* |x| < 2^0: no inf, no NaN */
                         : cd == PA_DTYPE_F32    ? (x & 0x3f7fffff3f7fffffull) | 0x3c0000003c000000ull
                                                 : (x & 0x3f7f3f7f3f7f3f7full) | 0x3000300030003000ull;
            memcpy(p + i, &v, 8);
        }
    }
    { /* the NHD copy: [block][token][head][dim] from HND's [block][head][token][dim] */
        const size_t es = bytes / ((size_t)nb * BS * HKV * D), row = (size_t)D * es;
        for (int w = 0; w < 2; w++) {
            const unsigned char *src = w ? caches[0].value : caches[0].key;
            unsigned char *dst = w ? caches[1].value : caches[1].key;
            for (size_t b = 0; b < (size_t)nb; b++)
                for (size_t h = 0; h < HKV; h++)
                    for (size_t t = 0; t < BS; t++)
                        memcpy(dst + ((b * BS + t) * HKV + h) * row, src + ((b * HKV + h) * BS + t) * row, row);
        }
    }
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) perm[i] = i;
    x = 7;
    for (int i = nb - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int j = (int)(x % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    if (small > 0)
        for (int i = 0; i < nb; i++) perm[i] %= small;
    pa_seq seqs[65];
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)(S * QL + mix));
    int ns = 0;
    if (mix) seqs[ns++] = (pa_seq){.context_len = 0, .query_len = mix, .block_table = perm + S * nbps, .num_blocks = mix / BS};
    for (int s = 0; s < S; s++)
        seqs[ns++] = (pa_seq){.context_len = C - QL, .query_len = QL, .block_table = perm + s * nbps, .num_blocks = nbps};
    for (int i = 0; i < S * QL + mix; i++) slots[i] = -1; /* no new token written: the step only reads */
    const int64_t nq = (int64_t)(S * QL + mix) * H * D;
    float *q = malloc(sizeof(float) * (size_t)nq), *o = malloc(sizeof(float) * (size_t)nq);
    for (int64_t i = 0; i < nq; i++) q[i] = (float)((i * 7919) % 200 - 100) / 400.f;
    if (q16) /* (the same queries truncated to bf16, in place: word i never overlaps float j > i) */
        for (int64_t i = 0; i < nq; i++) {
            uint32_t w;
            memcpy(&w, &q[i], 4);
            uint16_t h = (uint16_t)(w >> 16);
            memcpy((uint16_t *)q + i, &h, 2);
        }
    for (int k = 0; k < nl; k++) {
        lib *l = &libs[k];
        pa_layer_config cfg;
        l->layer_config_init(&cfg, H, HKV, D);
        cfg.cache_dtype = cd;
        if (q16) cfg.q_dtype = PA_DTYPE_BF16;
        CK(l, l->layer_create(&cfg, &l->layer));
        const pa_backend *be;
        CK(l, l->backend_select("cpu", l->layer, &be));
        pa_batch_config bc = {.block_size = BS, .num_blocks = nb, .slot_mapping = slots};
        CK(l, l->batch_create(&bc, seqs, ns, &l->batch));
        if (getenv("ISAS")) { /* the k-th comma-separated entry */
            char isa[32] = "";
            const char *p = getenv("ISAS");
            for (int i = 0; i < k && p; i++) p = strchr(p, ','), p = p ? p + 1 : NULL;
            if (p) snprintf(isa, sizeof isa, "%.*s", (int)strcspn(p, ","), p);
            setenv("PAGEDATTN_CPU_ISA", isa, 1);
        }
        CK(l, l->context_create(be, NULL, &l->ctx));
        CK(l, l->context_set_num_threads(l->ctx, thr));
        CK(l, l->plan_create(l->ctx, l->layer, l->batch, &l->plan));
    }
    pa_forward_args a = {.q = q, .cache = &cache, .out = o};
    pa_forward_args *args = malloc(sizeof(pa_forward_args) * (size_t)nl);
    for (int k = 0; k < nl; k++) { /* the k-th comma-separated entry of LAYOUTS */
        const char *p = getenv("LAYOUTS");
        for (int i = 0; i < k && p; i++) p = strchr(p, ','), p = p ? p + 1 : NULL;
        args[k] = a;
        args[k].cache = p && !strncmp(p, "nhd", 3) ? &caches[1] : &caches[0];
    }
    double *t = malloc(sizeof(double) * (size_t)nl * rounds * reps), *sum = calloc((size_t)nl, sizeof(double));
    for (int k = 0; k < nl; k++) { /* one warm-up forward each, and its checksum */
        lib *l = &libs[k];
        CK(l, l->attn_forward(l->ctx, l->layer, l->batch, l->plan, &args[k]));
        for (int64_t i = 0; i < nq; i++) sum[k] += o[i];
    }
    for (int r = 0; r < rounds; r++)
        for (int kk = 0; kk < nl; kk++) {
            const int k = r & 1 ? nl - 1 - kk : kk;
            lib *l = &libs[k];
            for (int e = 0; e < reps; e++) {
                double t0 = now();
                CK(l, l->attn_forward(l->ctx, l->layer, l->batch, l->plan, &args[k]));
                t[(size_t)k * rounds * reps + (size_t)r * reps + e] = (now() - t0) * 1e3;
            }
        }
    const int n = rounds * reps;
    for (int k = 0; k < nl; k++) {
        double *tk = t + (size_t)k * n;
        qsort(tk, (size_t)n, sizeof(double), cmp);
        printf("%-44s min %8.3f  p25 %8.3f  med %8.3f ms  (%.2f GB/s at min)  checksum %.9g\n", argv[k + 1], tk[0],
               tk[n / 4], tk[n / 2], 2.0 * (double)bytes / tk[0] / 1e6, sum[k]);
    }
    return 0;
}
