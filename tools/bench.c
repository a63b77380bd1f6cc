/* pagedattn bench: this machine's own limits, then the standard attention cases on each chosen
 * backend, as fractions of those limits.
 *
 * Limits (measured in the same run, for every thread count asked for): memory read bandwidth
 * on a buffer far larger than the last-level cache; fp32 FMA peak (register-only FMAs); the
 * AVX512-BF16 dot-product peak where the CPU has it. A case's floor is its roofline time,
 * max(KV bytes / bandwidth, useful flops / peak), and "frac" is floor / median time; the peak
 * is the faster of the bf16 dot-product and fp32 FMA ones for bf16 queries over a bf16 (or fp8)
 * cache where the CPU has bf16 dot products (on a Xeon with AVX512-BF16 they ran at half the FMA
 * rate, so the dot-product peak alone gave fractions above 1), else the FMA one. Useful
 * flops are 4 * head_size per (query head, visible key): causal halves are not counted. The read
 * probe's buffer and the KV that each timed pass of a case with decodes walks (its layers' caches
 * in turn) are both at least max(1 GiB, 4 x the last-level cache), so that decodes measure
 * memory, not the LLC (until the fortieth pass the pass was 256 MiB, at most 16 layers: a lone
 * 512-key decode then read 32 MiB from a 260 MiB L3 at 1.4x the probe's DRAM rate;
 * bench/NOTES.md).
 * Only the public API is used. */
#define _GNU_SOURCE
#include "tool.h"

#include "pagedattn.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#  include <immintrin.h>
#  define BENCH_X86 1
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#ifdef __OPTIMIZE__
static const int bench_optimized = 1;
#else
static const int bench_optimized = 0; /* Debug: the library's kernels are at -O0 as well */
#endif

static int g_progress;
static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...)
{
    if (!g_progress) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\r\033[K");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}

/* ---- machine limits ------------------------------------------------------------------------- */

typedef struct {
    int nthreads;
    pthread_barrier_t *bar;
    const unsigned char *buf;
    size_t bytes; /* per thread */
    int kind;     /* 0 read, 1 fma, 2 bf16 dot, 3 fma 512-bit */
    long iters;
    double sink;
} lim_arg;

#ifdef BENCH_X86
__attribute__((target("avx2"))) static double read_avx2(const unsigned char *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (double)_mm256_extract_epi64(a0, 0);
}

/* The FMA probes keep 12 accumulators in named variables, not in an array: at -O2 (CMake's
 * RelWithDebInfo) gcc 12 does not unroll a loop over an array of 12 vectors, so the array
 * stayed in memory and the probe read half the peak (20.1 against 40.2 GFLOP/s on one core of
 * the development host, same minute), which made every fraction of it read twice too high. 12
 * independent chains cover the FMA latency times two FMA pipes with room to spare. The body,
 * for a vector type V and a macro STEP (one dependent operation on an accumulator): */
#define PROBE_BODY(V, SET1, ADD, REDUCE)                                                             \
    V c0 = SET1(0.0f), c1 = SET1(1.0f), c2 = SET1(2.0f), c3 = SET1(3.0f), c4 = SET1(4.0f),          \
      c5 = SET1(5.0f), c6 = SET1(6.0f), c7 = SET1(7.0f), c8 = SET1(8.0f), c9 = SET1(9.0f),          \
      c10 = SET1(10.0f), c11 = SET1(11.0f);                                                          \
    for (long it = 0; it < iters; it++) {                                                            \
        c0 = STEP(c0), c1 = STEP(c1), c2 = STEP(c2), c3 = STEP(c3), c4 = STEP(c4), c5 = STEP(c5);    \
        c6 = STEP(c6), c7 = STEP(c7), c8 = STEP(c8), c9 = STEP(c9), c10 = STEP(c10), c11 = STEP(c11); \
    }                                                                                                \
    V s = ADD(ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7))),                     \
              ADD(ADD(c8, c9), ADD(c10, c11)));                                                      \
    return (double)REDUCE(s)

__attribute__((target("avx2,fma"))) static double fma_avx2(long iters)
{
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
#define STEP(x) _mm256_fmadd_ps(x, a, b)
    PROBE_BODY(__m256, _mm256_set1_ps, _mm256_add_ps, _mm256_cvtss_f32);
#undef STEP
}

/* 512-bit FMAs: on CPUs with two 512-bit FMA units (Intel server cores) twice the 256-bit peak;
 * on Zen 4 (256-bit units, 512-bit ops in two halves) the same */
__attribute__((target("avx512f"))) static double fma_avx512(long iters)
{
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
#define STEP(x) _mm512_fmadd_ps(x, a, b)
    PROBE_BODY(__m512, _mm512_set1_ps, _mm512_add_ps, _mm512_reduce_add_ps);
#undef STEP
}

__attribute__((target("avx512f,avx512bf16"))) static double bf16_avx512(long iters)
{
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
#define STEP(x) _mm512_dpbf16_ps(x, a, b)
    PROBE_BODY(__m512, _mm512_set1_ps, _mm512_add_ps, _mm512_reduce_add_ps);
#undef STEP
}
#endif

static double read_generic(const unsigned char *p, size_t n)
{
    uint64_t a[8] = {0};
    for (size_t i = 0; i + 64 <= n; i += 64)
        for (int u = 0; u < 8; u++) {
            uint64_t x;
            memcpy(&x, p + i + 8 * u, 8);
            a[u] ^= x;
        }
    return (double)(a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7]);
}

static double fma_generic(long iters)
{
    float acc[32];
    for (int i = 0; i < 32; i++) acc[i] = (float)i;
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 32; i++) acc[i] = fmaf(acc[i], 0.999999f, 1e-7f);
    double s = 0;
    for (int i = 0; i < 32; i++) s += acc[i];
    return s;
}

static int has_avx2(void)
{
#ifdef BENCH_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static int has_avx512f(void)
{
#ifdef BENCH_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

static int has_bf16dot(void)
{
#ifdef BENCH_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

static void lim_work(lim_arg *a)
{
    switch (a->kind) {
    case 0:
#ifdef BENCH_X86
        if (has_avx2()) {
            a->sink += read_avx2(a->buf, a->bytes);
            break;
        }
#endif
        a->sink += read_generic(a->buf, a->bytes);
        break;
    case 1:
#ifdef BENCH_X86
        if (has_avx2()) {
            a->sink += fma_avx2(a->iters);
            break;
        }
#endif
        a->sink += fma_generic(a->iters);
        break;
    case 3:
#ifdef BENCH_X86
        a->sink += fma_avx512(a->iters);
#endif
        break;
    default:
#ifdef BENCH_X86
        a->sink += bf16_avx512(a->iters);
#endif
        break;
    }
}

static void *lim_thread(void *varg)
{
    lim_arg *a = varg;
    pthread_barrier_wait(a->bar);
    lim_work(a);
    pthread_barrier_wait(a->bar);
    return NULL;
}

/* Runs `kind` on n threads at once; returns the wall time from the start barrier to the end. */
static double lim_run(int n, int kind, const unsigned char *buf, size_t total, long iters)
{
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n);
    lim_arg *args = calloc((size_t)n, sizeof *args);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!args || !th) {
        fprintf(stderr, "bench: out of memory for %d probe threads\n", n);
        exit(1);
    }
    size_t per = total / (size_t)n / 4096 * 4096;
    for (int i = 0; i < n; i++)
        args[i] = (lim_arg){n, &bar, buf + per * (size_t)i, per, kind, iters, 0};
    for (int i = 1; i < n; i++)
        if (pthread_create(&th[i], NULL, lim_thread, &args[i])) { /* the barrier would wait forever */
            fprintf(stderr, "bench: cannot start probe thread %d of %d\n", i + 1, n);
            exit(1);
        }
    pthread_barrier_wait(&bar);
    double t0 = now_s();
    lim_work(&args[0]);
    pthread_barrier_wait(&bar);
    double t = now_s() - t0;
    for (int i = 1; i < n; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    volatile double sink = 0;
    for (int i = 0; i < n; i++) sink += args[i].sink;
    (void)sink;
    free(args);
    free(th);
    return t;
}

typedef struct {
    int threads;
    double read_gbs, fma_gflops, bf16_gflops; /* bf16 0: not present */
} limits;

static void measure_limits(int threads, int quick, unsigned char *buf, size_t bytes, limits *L)
{
    L->threads = threads;
    int passes = quick ? 3 : 7;
    double best = 1e30;
    for (int i = 0; i < passes; i++) {
        progress("limits: read bandwidth, %d thread(s), pass %d/%d", threads, i + 1, passes);
        double t = lim_run(threads, 0, buf, bytes, 0);
        if (t < best) best = t;
    }
    size_t per = bytes / (size_t)threads / 4096 * 4096;
    L->read_gbs = (double)(per * (size_t)threads) / best / 1e9;
    long iters = quick ? 20000000 : 50000000;
    best = 1e30;
    for (int i = 0; i < 3; i++) {
        progress("limits: fp32 FMA peak, %d thread(s)", threads);
        double t = lim_run(threads, 1, NULL, 0, iters);
        if (t < best) best = t;
    }
    double flops_per_iter = has_avx2() ? 12.0 * 8 * 2 : 32.0 * 2;
    L->fma_gflops = flops_per_iter * (double)iters * threads / best / 1e9;
    if (has_avx512f()) { /* the peak is the faster of the two widths */
        best = 1e30;
        for (int i = 0; i < 3; i++) {
            progress("limits: fp32 FMA peak (512-bit), %d thread(s)", threads);
            double t = lim_run(threads, 3, NULL, 0, iters / 2);
            if (t < best) best = t;
        }
        double g = 12.0 * 16 * 2 * (double)(iters / 2) * threads / best / 1e9;
        if (g > L->fma_gflops) L->fma_gflops = g;
    }
    L->bf16_gflops = 0;
    if (has_bf16dot()) {
        best = 1e30;
        for (int i = 0; i < 3; i++) {
            double t = lim_run(threads, 2, NULL, 0, iters / 2);
            if (t < best) best = t;
        }
        L->bf16_gflops = 12.0 * 16 * 4 * (double)(iters / 2) * threads / best / 1e9;
    }
}

/* ---- cases ---------------------------------------------------------------------------------- */

enum { HD = 128 };
static int BLK = 16; /* --block-size: tokens per cache block */
static int HQ = 32, HKV = 8; /* --heads */
static int LAYOUT = -1;        /* --layout: a pa_cache_layout, or -1 for the backend's preferred one */
/* --blocks: shuffled (default), in-order (0, 1, 2, ...) or hot (every decode's context in the
 * same HOT_BLOCKS blocks: the KV a step reads stays in the caches, so the arithmetic is timed
 * alone; the fraction is then of the compute peak only) */
enum { BLOCKS_SHUFFLED, BLOCKS_IN_ORDER, BLOCKS_HOT, HOT_BLOCKS = 2 };
static int BLOCKS = BLOCKS_SHUFFLED;
static const char *const BLOCKS_NAME[] = {"shuffled", "in-order", "hot"};

typedef struct {
    char name[64];
    pa_dtype io, cache;
    int nprefill, prefill_len;  /* prefill sequences (context 0) of prefill_len tokens */
    int ndecode, decode_ctx;    /* decodes: context decode_ctx, one new token */
} bcase;

typedef struct {
    bcase c;
    int nlayers;
    pa_layer *layer;
    pa_cache *caches;  /* [nlayers], their pools in the two arenas */
    void *karena, *varena;
    double pass_bytes; /* KV bytes of all layers' pools: what one timed pass walks through */
    pa_batch *batch;
    int64_t ntok;
    void *q, *k, *v, *out;
    double kv_bytes;   /* per layer step: K and V bytes attention must read */
    double flops;      /* per layer step: useful flops */
    double tokens;     /* new tokens per step */
} bsetup;

static void fill_pattern(void *dst, size_t bytes, const void *pat, size_t pat_bytes)
{
    for (size_t off = 0; off < bytes; off += pat_bytes)
        memcpy((char *)dst + off, pat, bytes - off < pat_bytes ? bytes - off : pat_bytes);
}

/* A 64 KiB block of random finite values in `dtype`, repeated to fill buffers. */
static void random_pattern(pa_dtype dtype, unsigned char *pat, size_t bytes, uint64_t seed)
{
    size_t es = pa_dtype_size(dtype), n = bytes / es;
    float *tmp = malloc(n * sizeof *tmp);
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        tmp[i] = (float)((seed >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    pa_convert(dtype, pat, PA_DTYPE_F32, tmp, n, 1.0f);
    free(tmp);
}

/* Whether every element of a filled window converts to a finite f32 that is zero or normal: a
 * subnormal operand or product costs a microcode assist per instruction on Intel cores (an odd
 * byte offset into a 2-byte pattern once timed bf16 decode 2.6x too slow on a Xeon). */
static int pattern_normal(pa_dtype dtype, const unsigned char *p, size_t bytes)
{
    size_t n = bytes / pa_dtype_size(dtype);
    float *tmp = malloc(n * sizeof *tmp);
    int ok = tmp && pa_convert(PA_DTYPE_F32, tmp, dtype, p, n, 1.0f) == PA_STATUS_OK;
    for (size_t i = 0; ok && i < n; i++) ok = tmp[i] == 0.0f || isnormal(tmp[i]);
    free(tmp);
    return ok;
}

/* The last-level cache's size in bytes (0: unknown): glibc's sysconf, else the largest cache
 * that Linux lists for cpu0. */
static size_t llc_bytes(void)
{
    long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    v = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    if (v > 0) return (size_t)v;
    size_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[80];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long n = 0;
        char unit = 0;
        if (fscanf(f, "%lu%c", &n, &unit) >= 1) {
            size_t b = (size_t)n * (unit == 'K' ? 1024u : unit == 'M' ? 1048576u : 1u);
            if (b > best) best = b;
        }
        fclose(f);
    }
    return best;
}

/* "All threads": the cpu backend's default pool size (the cores this process may run on, its
 * affinity mask and CPU quota counted), else the affinity mask's count, else the online cores.
 * (The online count alone ran two threads on one core under `taskset -c 1`.) */
static int all_threads(int online)
{
    const pa_backend *cpu = pa_backend_find("cpu");
    pa_context *ctx = NULL;
    int n = 0;
    if (cpu && pa_backend_available(cpu, NULL, 0) && pa_context_create(cpu, NULL, &ctx) == PA_STATUS_OK) {
        n = pa_context_num_threads(ctx);
        pa_context_destroy(ctx);
    }
#ifdef __linux__
    cpu_set_t set;
    if (n < 1 && sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
    return n >= 1 ? n : online;
}

/* How much memory a measurement walks so that it reads DRAM, not the LLC: the read probe's
 * buffer and each case's timed pass. Set in pa_tool_bench. */
static size_t FAR_BYTES = (size_t)1 << 30;
enum { MAX_LAYERS = 4096 }; /* (a 512-key decode at 1/1 heads, block 1: 256 KiB a layer) */

/* KV pools are the engine's memory (as in vLLM): 2 MiB aligned and, on Linux, backed by
 * transparent huge pages where the system allows it (madvise mode): a paged cache is read in
 * short runs spread over many pages, and 4 KiB pages cost ~13% more CPU per decode step here. */
static void *alloc_pool(size_t bytes)
{
    size_t huge = (size_t)2 << 20, n = (bytes + huge - 1) / huge * huge;
    void *p = NULL;
    if (posix_memalign(&p, huge, n ? n : huge)) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

enum { VOFF = 64 }; /* byte offset of the V cache's values into the KV pattern (K's: 0) */

static pa_status setup_case(const bcase *c, const pa_backend *be, int tiny, bsetup *S)
{
    memset(S, 0, sizeof *S);
    S->c = *c;
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, HQ, HKV, HD);
    cfg.q_dtype = cfg.kv_dtype = cfg.out_dtype = c->io;
    cfg.cache_dtype = c->cache;
    pa_status st = pa_layer_create(&cfg, &S->layer);
    if (st) return st;

    int nseq = c->nprefill + c->ndecode;
    pa_seq *seqs = calloc((size_t)nseq, sizeof *seqs);
    int32_t *tables = NULL;
    int64_t blocks = 0; /* table entries */
    for (int s = 0; s < nseq; s++) {
        int pre = s < c->nprefill;
        int64_t len = pre ? c->prefill_len : c->decode_ctx + 1;
        blocks += (len + BLK - 1) / BLK;
    }
    tables = malloc((size_t)blocks * sizeof *tables);
    for (int64_t i = 0; i < blocks; i++) tables[i] = (int32_t)i;
    /* an engine's block tables point all over the pool once requests have come and gone (vLLM
     * hands out blocks from a free list): a fixed shuffle, unless --blocks in-order or hot */
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int64_t i = blocks - 1; i > 0 && BLOCKS == BLOCKS_SHUFFLED; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int64_t j = (int64_t)(x % (uint64_t)(i + 1));
        int32_t t = tables[i];
        tables[i] = tables[j], tables[j] = t;
    }
    if (BLOCKS == BLOCKS_HOT) {
        /* a decode's context blocks: the pool's first HOT_BLOCKS, over and over; its last block
         * (where its new token is written) and a prefill's blocks: their own, after them */
        int64_t b = 0, next = HOT_BLOCKS;
        for (int s = 0; s < nseq; s++) {
            int pre = s < c->nprefill;
            int64_t nb = ((pre ? c->prefill_len : c->decode_ctx + 1) + BLK - 1) / BLK;
            for (int64_t j = 0; j < nb; j++, b++)
                tables[b] = (int32_t)(!pre && j < nb - 1 ? j % HOT_BLOCKS : next++);
        }
        blocks = next; /* pool blocks */
    }
    int64_t b0 = 0;
    S->ntok = 0;
    for (int s = 0; s < nseq; s++) {
        int pre = s < c->nprefill;
        int64_t len = pre ? c->prefill_len : c->decode_ctx + 1;
        seqs[s].context_len = pre ? 0 : c->decode_ctx;
        seqs[s].query_len = pre ? c->prefill_len : 1;
        seqs[s].is_prefill = pre;
        seqs[s].block_table = tables + b0;
        seqs[s].num_blocks = (int32_t)((len + BLK - 1) / BLK);
        b0 += seqs[s].num_blocks;
        S->ntok += seqs[s].query_len;
        /* useful work: every (query head, visible key) pair, QK and PV: 4 * HD flops */
        double pairs = pre ? (double)len * (double)(len + 1) / 2 : (double)len;
        S->flops += pairs * HQ * 4.0 * HD;
        S->kv_bytes += (double)len * HKV * HD * 2.0 * (double)pa_dtype_size(c->cache);
    }
    S->tokens = (double)S->ntok;
    pa_batch_config bc = {.block_size = BLK, .num_blocks = blocks};
    st = pa_batch_create(&bc, seqs, nseq, &S->batch);
    free(seqs);
    free(tables);
    if (st) return st;

    /* enough layers that the KV of one pass is far beyond the last-level cache (FAR_BYTES), each
     * layer's pools at their own place in two arenas (one allocation per layer rounded every
     * pool up to 2 MiB: a 512-key decode's 1 MiB pools took twice their size) */
    double per_layer = (double)blocks * BLK * HKV * HD * 2.0 * (double)pa_dtype_size(c->cache);
    S->nlayers = (int)ceil((double)FAR_BYTES / per_layer);
    if (S->nlayers < 1) S->nlayers = 1;
    if (S->nlayers > MAX_LAYERS) S->nlayers = MAX_LAYERS;
    /* a prompt alone is bound by its arithmetic, its K/V rows read many times over from the
     * caches whatever the pass: the 16 layers it always took (64 of a 2048-token f32 prompt
     * made the bench take six minutes) */
    if (c->ndecode == 0 && S->nlayers > 16) S->nlayers = 16;
    if (tiny) S->nlayers = 1; /* the scalar reference is compute-bound: one layer is enough */
    if (BLOCKS == BLOCKS_HOT) S->nlayers = 1; /* the point: one layer's few blocks stay cached */
    S->caches = calloc((size_t)S->nlayers, sizeof *S->caches);
    unsigned char *pat = malloc(65536);
    if (!S->caches || !pat) {
        free(pat);
        return PA_STATUS_OUT_OF_MEMORY;
    }
    random_pattern(c->cache, pat, 65536, 42);
    if (!pattern_normal(c->cache, pat + VOFF, 65536 - VOFF)) {
        fprintf(stderr, "bench: the %s KV pattern is not all normal finite values\n", pa_dtype_name(c->cache));
        abort();
    }
    const pa_cache_layout lay = LAYOUT >= 0 ? (pa_cache_layout)LAYOUT : pa_backend_preferred_layout(be);
    st = pa_cache_init(&S->caches[0], lay, c->cache, blocks, BLK, HKV, HD);
    if (st) {
        free(pat);
        return st;
    }
    const size_t bytes = (size_t)pa_cache_pool_elems(&S->caches[0]) * pa_dtype_size(c->cache);
    const size_t stride = (bytes + 4095) / 4096 * 4096; /* (each pool page-aligned) */
    S->karena = alloc_pool(stride * (size_t)S->nlayers);
    S->varena = alloc_pool(stride * (size_t)S->nlayers);
    if (!S->karena || !S->varena) {
        free(pat);
        return PA_STATUS_OUT_OF_MEMORY;
    }
    S->pass_bytes = 2.0 * (double)bytes * S->nlayers;
    for (int l = 0; l < S->nlayers; l++) {
        S->caches[l] = S->caches[0];
        S->caches[l].key = (char *)S->karena + stride * (size_t)l;
        S->caches[l].value = (char *)S->varena + stride * (size_t)l;
        /* V: the same values 64 bytes on, so whole elements of every dtype (an odd byte offset
         * made each 2-byte V element of one value's high byte and the next one's low byte: bf16
         * with random exponents, down to subnormals, and f16 with Inf and NaN) */
        fill_pattern(S->caches[l].key, bytes, pat, 65536);
        fill_pattern(S->caches[l].value, bytes, pat + VOFF, 65536 - VOFF);
    }
    size_t es = pa_dtype_size(c->io);
    size_t qb = (size_t)S->ntok * HQ * HD * es, kb = (size_t)S->ntok * HKV * HD * es;
    S->q = malloc(qb), S->k = malloc(kb), S->v = malloc(kb), S->out = malloc(qb);
    random_pattern(c->io, pat, 65536, 7);
    fill_pattern(S->q, qb, pat, 65536);
    fill_pattern(S->k, kb, pat + 64, 65536 - 64);
    fill_pattern(S->v, kb, pat + 128, 65536 - 128);
    free(pat);
    return PA_STATUS_OK;
}

static void free_case(bsetup *S)
{
    free(S->karena);
    free(S->varena);
    free(S->caches);
    pa_batch_destroy(S->batch);
    pa_layer_destroy(S->layer);
    free(S->q), free(S->k), free(S->v), free(S->out);
    memset(S, 0, sizeof *S);
}

typedef struct {
    const char *backend;
    int threads;
    double tmin, tmed, tmax; /* seconds per layer step */
    double gbs, gflops, tok_s, floor_s, frac;
    const char *bound;
    double steal_s; /* CPU time the hypervisor gave to others while the case ran; -1: unknown */
} bresult;

/* Steal time of the whole machine so far, in seconds (Linux: the 8th figure of /proc/stat's
 * "cpu" line, in clock ticks); -1 where there is none. On a virtual machine it is the time the
 * host ran something else while this machine's vCPUs had work: what a shared host takes from a
 * measurement, shown next to it. */
static double steal_seconds(void)
{
    double v = -1;
#ifdef __linux__
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long x[8];
    long hz = sysconf(_SC_CLK_TCK);
    if (f && hz > 0 &&
        fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &x[0], &x[1], &x[2], &x[3], &x[4], &x[5],
               &x[6], &x[7]) == 8)
        v = (double)x[7] / (double)hz;
    if (f) fclose(f);
#endif
    return v;
}

/* One step = forward over every layer once (writing the new K/V, then attending). */
/* JSON of a steal time: milliseconds, or null where unknown (static text; one use per printf) */
static const char *steal_json(double steal_s)
{
    static char buf[32];
    if (steal_s < 0) return "null";
    snprintf(buf, sizeof buf, "%.7g", steal_s * 1e3);
    return buf;
}

static pa_status time_case(bsetup *S, pa_context *ctx, int repeats, bresult *R)
{
    pa_plan *plan = NULL;
    pa_status st = pa_plan_create(ctx, S->layer, S->batch, &plan);
    if (st) return st;
    double *t = malloc((size_t)(repeats + 1) * sizeof *t);
    double steal0 = steal_seconds();
    for (int r = -1; r < repeats && !st; r++) {
        double t0 = now_s();
        for (int l = 0; l < S->nlayers && !st; l++) {
            pa_forward_args a = {.q = S->q, .k = S->k, .v = S->v, .cache = &S->caches[l], .out = S->out};
            st = pa_attn_forward(ctx, S->layer, S->batch, plan, &a);
        }
        double dt = (now_s() - t0) / S->nlayers;
        if (r >= 0) t[r] = dt;
    }
    double steal1 = steal_seconds();
    R->steal_s = steal0 >= 0 && steal1 >= steal0 ? steal1 - steal0 : -1;
    pa_plan_destroy(plan);
    if (!st) {
        qsort(t, (size_t)repeats, sizeof *t, cmp_double);
        R->tmin = t[0];
        R->tmax = t[repeats - 1];
        R->tmed = repeats % 2 ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
    }
    free(t);
    return st;
}

static void finish_result(const bsetup *S, const limits *L, bresult *R)
{
    R->gbs = S->kv_bytes / R->tmed / 1e9;
    R->gflops = S->flops / R->tmed / 1e9;
    R->tok_s = S->tokens / R->tmed;
    if (!L) { /* no limits at this thread count */
        R->bound = "n/a";
        R->floor_s = R->frac = 0;
        return;
    }
    /* bf16 queries over a bf16 or fp8 cache, where the CPU has bf16 dot products
     * (AVX512-BF16): the compute limit is the faster of the bf16 dot-product and the fp32 FMA
     * peaks (the cpu backend can take QK by dot products there, and PV in fp32 or by dot
     * products; no mix beats the faster unit alone); everything else: the fp32 FMA peak */
    const bool dotc = S->c.cache == PA_DTYPE_BF16 || S->c.cache == PA_DTYPE_FP8_E4M3 || S->c.cache == PA_DTYPE_FP8_E5M2;
    bool bf16 = S->c.io == PA_DTYPE_BF16 && dotc && L->bf16_gflops > L->fma_gflops;
    double peak = bf16 ? L->bf16_gflops : L->fma_gflops;
    double tm = S->kv_bytes / (L->read_gbs * 1e9), tc = S->flops / (peak * 1e9);
    if (BLOCKS == BLOCKS_HOT) tm = 0; /* the KV comes from the caches: the compute floor alone */
    R->floor_s = tm > tc ? tm : tc;
    R->bound = tm > tc ? "memory" : bf16 ? "bf16 dot" : "fp32 fma";
    R->frac = R->floor_s / R->tmed;
}

/* ---- the command ---------------------------------------------------------------------------- */

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s) {
        if (n == max) return -1; /* more entries than fit */
        char *end;
        if (*s < '0' || *s > '9') return -1; /* (strtol would take " 1" and "+1") */
        long v = strtol(s, &end, 10);
        if (v > 1024 || (*end && *end != ',') || (*end == ',' && !end[1])) return -1; /* (nor "1,") */
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pagedattn bench [options]\n"
            "  --backend LIST   backends to measure, comma-separated (default: cpu); the\n"
            "                   reference backend runs shrunken (tiny) variants of each case;\n"
            "                   `--backend cuda` (alone) measures the GPU: its copy bandwidth,\n"
            "                   decode 64 x 4096 (bf16, f16, fp8 KV), prefill 4096 causal beside\n"
            "                   PyTorch SDPA (flash) when python3 has torch with CUDA, over an\n"
            "                   NHD cache (--layout hnd: HND); its cases are fixed, so --heads,\n"
            "                   --block-size and --blocks are refused there\n"
            "  --threads LIST   thread counts (default: 1,<all>; 0 = all: the cores this process\n"
            "                   may run on, as the cpu backend's default pool counts them)\n"
            "  --repeats N      timed repetitions per case (default 5, prefill-only cases 3, the\n"
            "                   reference backend at most 2; one warm-up run more; --json: repeats)\n"
            "  --cases SUBSTR   only cases whose name contains SUBSTR\n"
            "  --quick          a very short run: smaller cases, 2 repeats, short limit probes\n"
            "  --heads HQ/HKV   query / KV heads of every case (default 32/8; HQ a multiple of\n"
            "                   HKV, at most 256): e.g. 32/32 (MHA), 16/8 (GQA 2), 28/4 (GQA 7)\n"
            "  --layout L       cache layout of every case: nhd ([block, token, head, dim]: FlashAttention's\n"
            "                   and vLLM's flash layout) or hnd ([block, head, token, dim]); default: the\n"
            "                   backend's preferred one (`pagedattn info`)\n"
            "  --blocks B       block tables: shuffled (default: each sequence's blocks spread over\n"
            "                   the pool in a fixed random order, as an engine's free list leaves them)\n"
            "                   or in-order (0, 1, 2, ...: consecutive blocks adjacent in memory)\n"
            "                   or hot (every decode's context in the same 2 blocks, its last block its\n"
            "                   own: the KV stays in the caches, so a decode's arithmetic is timed\n"
            "                   alone, to set beside a default run; frac is then of the compute peak)\n"
            "  --block-size N   tokens per cache block of every case (default 16, vLLM's; its CPU\n"
            "                   platform takes 128 with Intel's extension): how much the scatter of\n"
            "                   a paged cache costs against bigger, fewer pieces\n"
            "  --json           machine-readable output on stdout\n"
            "Cases: 32 query / 8 KV heads x 128 (or --heads), block 16 (or --block-size), the backend's preferred cache\n"
            "layout (or --layout), shuffled block tables (or --blocks).\n"
            "A row during which the hypervisor ran other work on this machine's cores (steal time,\n"
            "Linux) is followed by a note: its figures are disturbed (--json: steal_ms).\n"
            "frac = roofline floor / median time, floor = max(KV bytes / read bandwidth,\n"
            "useful flops / peak), both limits measured in this run at the same thread count; the peak\n"
            "is the fp32 FMA peak, or for bf16 queries over a bf16 or fp8 cache on CPUs with AVX512-BF16\n"
            "the bf16 dot-product peak where that is the faster one. The read probe's buffer and each\n"
            "timed pass of a case with decodes (its layers' caches in turn) are at least max(1 GiB,\n"
            "4 x the LLC); --quick: max(512 MiB, 2 x the LLC). A prompt alone rotates over 16 layers.\n");
}

static int make_cases(int quick, int tiny, bcase *cs)
{
    int n = 0;
    int ctxs = tiny ? 256 : quick ? 1024 : 4096, ctxl = tiny ? 2048 : quick ? 8192 : 32768;
    int pre = tiny ? 256 : quick ? 512 : 2048, mixp = tiny ? 32 : 256, mixc = tiny ? 256 : 2048;
    const pa_dtype kv[3] = {PA_DTYPE_BF16, PA_DTYPE_F16, PA_DTYPE_FP8_E4M3};
    for (int i = 0; i < 3; i++) {
        bcase c = {{0}, PA_DTYPE_BF16, kv[i], 0, 0, 16, ctxs - 1};
        snprintf(c.name, sizeof c.name, "decode b16 x %d %s", ctxs, pa_dtype_name(kv[i]));
        cs[n++] = c;
    }
    for (int i = 0; i < 3; i++) {
        bcase c = {{0}, PA_DTYPE_BF16, kv[i], 0, 0, 1, ctxl - 1};
        snprintf(c.name, sizeof c.name, "decode b1 x %d %s", ctxl, pa_dtype_name(kv[i]));
        cs[n++] = c;
    }
    /* a lone short decode: the latency of one user's step, which two threads halve only when
     * the sequence's keys come in several chunks (cpu_plan.c) */
    int ctxo = tiny ? 256 : 512;
    bcase o = {{0}, PA_DTYPE_BF16, PA_DTYPE_BF16, 0, 0, 1, ctxo - 1};
    snprintf(o.name, sizeof o.name, "decode b1 x %d %s", ctxo, pa_dtype_name(PA_DTYPE_BF16));
    cs[n++] = o;
    const pa_dtype pd[2] = {PA_DTYPE_F32, PA_DTYPE_BF16};
    for (int i = 0; i < 2; i++) {
        bcase c = {{0}, pd[i], pd[i], 1, pre, 0, 0};
        snprintf(c.name, sizeof c.name, "prefill %d causal %s", pre, pa_dtype_name(pd[i]));
        cs[n++] = c;
    }
    bcase m = {{0}, PA_DTYPE_BF16, PA_DTYPE_BF16, 1, mixp, 32, mixc - 1};
    snprintf(m.name, sizeof m.name, "mixed %d prefill + 32 x %d decode bf16", mixp, mixc);
    cs[n++] = m;
    return n;
}

int pa_tool_bench(int argc, char **argv)
{
    const char *backends = "cpu", *filter = NULL;
    int threads[16], nthreads = 0, repeats = 5, quick = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quick")) {
            quick = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--backend") && val) {
            backends = val, i++;
        } else if (!strcmp(a, "--heads") && val) {
            int hq = 0, hkv = 0, end = 0;
            if (sscanf(val, "%d/%d%n", &hq, &hkv, &end) != 2 || val[end] || hkv < 1 || hq < hkv || hq > 256 ||
                hq % hkv) {
                fprintf(stderr, "bench: bad --heads '%s' (HQ/HKV: 1 <= HKV <= HQ <= 256, HQ a multiple of HKV)\n", val);
                return 2;
            }
            HQ = hq, HKV = hkv, i++;
        } else if (!strcmp(a, "--blocks") && val) {
            if (!strcmp(val, "in-order")) BLOCKS = BLOCKS_IN_ORDER;
            else if (!strcmp(val, "shuffled")) BLOCKS = BLOCKS_SHUFFLED;
            else if (!strcmp(val, "hot")) BLOCKS = BLOCKS_HOT;
            else {
                fprintf(stderr, "bench: bad --blocks '%s' (shuffled, in-order or hot)\n", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--block-size") && val) {
            char *end = NULL;
            long b = strtol(val, &end, 10);
            if (end == val || *end || b < 1 || b > 1024) {
                fprintf(stderr, "bench: bad --block-size '%s' (tokens per block, 1..1024)\n", val);
                return 2;
            }
            BLK = (int)b, i++;
        } else if (!strcmp(a, "--layout") && val) {
            if (!strcmp(val, "nhd") || !strcmp(val, "NHD")) LAYOUT = PA_LAYOUT_NHD;
            else if (!strcmp(val, "hnd") || !strcmp(val, "HND")) LAYOUT = PA_LAYOUT_HND;
            else {
                fprintf(stderr, "bench: bad --layout '%s' (nhd or hnd)\n", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--cases") && val) {
            filter = val, i++;
        } else if (!strcmp(a, "--threads") && val) {
            nthreads = parse_list(val, threads, 16), i++;
            if (nthreads <= 0) {
                fprintf(stderr, "bench: bad --threads '%s'\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--repeats") && val) {
            char *end = NULL;
            long r = strtol(val, &end, 10);
            repeats = end == val || *end || r < 1 || r > 1000 ? 0 : (int)r, i++;
            if (repeats < 1) {
                fprintf(stderr, "bench: --repeats must be 1..1000\n");
                return 2;
            }
        } else {
            fprintf(stderr, "bench: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    int repeats_given = 0;
    for (int i = 1; i < argc; i++) repeats_given |= !strcmp(argv[i], "--repeats");
    if (quick && !repeats_given) repeats = 2;
    const int threads_given = nthreads > 0;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    const int all = all_threads((int)online);
    if (nthreads == 0) {
        threads[nthreads++] = 1;
        if (all > 1) threads[nthreads++] = all;
    }
    for (int i = 0; i < nthreads; i++)
        if (threads[i] == 0) threads[i] = all;
    g_progress = isatty(2);
    const size_t llc = llc_bytes();
    FAR_BYTES = (size_t)(quick ? 512 : 1024) << 20;
    if (llc && (quick ? 2 : 4) * llc > FAR_BYTES) FAR_BYTES = (quick ? 2 : 4) * llc;

    /* the cuda backend has a bench of its own (device memory, CUDA events, SDPA beside it) */
    if (!strcmp(backends, "cuda")) {
        /* (its cases are fixed: 32 / 8 heads, block 16, shuffled tables; say so, not ignore) */
        const char *no = HQ != 32 || HKV != 8 ? "--heads" : BLK != 16 ? "--block-size" : BLOCKS != BLOCKS_SHUFFLED ? "--blocks"
                         : threads_given ? "--threads" : NULL;
        if (no) {
            fprintf(stderr, "bench: %s is not taken by --backend cuda (its cases: 32 / 8 heads, block 16, shuffled tables; "
                            "one GPU)\n", no);
            return 2;
        }
        return pa_tool_bench_cuda(quick, repeats_given ? repeats : 0, json, filter, LAYOUT);
    }

    /* backends */
    const pa_backend *bes[8];
    int nbe = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", backends);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        const pa_backend *b = pa_backend_find(tok);
        if (nbe == 8) {
            fprintf(stderr, "bench: more than 8 backends in --backend '%s'\n", backends);
            return 2;
        }
        char why[256] = "";
        if (!b) {
            fprintf(stderr, "bench: no backend '%s'\n", tok);
            return 2;
        }
        if (!pa_backend_available(b, why, sizeof why)) {
            fprintf(stderr, "bench: backend '%s' cannot run here: %s\n", tok, why);
            return 2;
        }
        if (pa_backend_memory(b) != PA_MEMORY_HOST) {
            fprintf(stderr, "bench: backend '%s' uses device memory: measure it alone (--backend %s)\n", tok, tok);
            return 2;
        }
        bes[nbe++] = b;
    }
    if (!nbe) {
        fprintf(stderr, "bench: --backend '%s' names no backend\n", backends);
        return 2;
    }

    if (filter) { /* before the limit probes: a typo should not cost a minute and then pass */
        int hits = 0, nc = 0;
        bcase cs[16];
        for (int bi = nbe - 1; bi >= 0; bi--) { /* backwards: cs ends as the first backend's list */
            nc = make_cases(quick, !strcmp(pa_backend_name(bes[bi]), "reference"), cs);
            for (int ci = 0; ci < nc; ci++) hits += strstr(cs[ci].name, filter) != NULL;
        }
        if (!hits) {
            fprintf(stderr, "bench: no case matches --cases '%s'; the cases%s are:\n", filter, quick ? " (--quick)" : "");
            for (int ci = 0; ci < nc; ci++) fprintf(stderr, "  %s\n", cs[ci].name);
            return 2;
        }
    }

    /* limits */
    size_t bw_bytes = FAR_BYTES;
    unsigned char *buf = alloc_pool(bw_bytes); /* same kind of memory as the KV pools */
    if (!buf) {
        fprintf(stderr, "bench: cannot allocate the bandwidth buffer\n");
        return 1;
    }
    memset(buf, 1, bw_bytes);
    limits lims[16];
    for (int i = 0; i < nthreads; i++) measure_limits(threads[i], quick, buf, bw_bytes, &lims[i]);
    free(buf);

    double load = -1;
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fscanf(lf, "%lf", &load) != 1) load = -1;
        fclose(lf);
    }
    if (!json) {
        char llcs[48] = "LLC size unknown";
        if (llc) snprintf(llcs, sizeof llcs, "LLC %zu MiB", llc >> 20);
        printf("pagedattn %s bench%s: limits measured now (read buffer %zu MiB; %s)\n", pa_version_string(),
               quick ? " --quick" : "", bw_bytes >> 20, llcs);
        if (!bench_optimized)
            printf("  note: this is an unoptimized (Debug) build: the kernels and the probes run at -O0, "
                   "so the times and fractions below say nothing about the library's speed\n");
        if (load >= 0)
            printf("  load average %.2f on %ld online cores%s\n", load, online,
                   load > 0.5 * (double)online ? ": other processes compete, figures are low and noisy" : "");
        if (all != online) printf("  this process may run on %d of them (affinity or CPU quota): \"all\" threads is %d\n", all, all);
        for (int i = 0; i < nthreads; i++) {
            printf("  %2d thread(s): read %6.1f GB/s   fp32 FMA %7.1f GFLOP/s   bf16 dot ",
                   lims[i].threads, lims[i].read_gbs, lims[i].fma_gflops);
            if (lims[i].bf16_gflops > 0) printf("%7.1f GFLOP/s\n", lims[i].bf16_gflops);
            else printf("n/a (no AVX512-BF16 here: bf16 cases are held to the fp32 FMA peak)\n");
        }
        /* a core taken by another process while the limits were probed (or SMT siblings) shows
         * as poor scaling of the register-only FMA probe: fractions at that count read high */
        for (int i = 0; i < nthreads; i++)
            for (int j = 0; j < nthreads; j++)
                if (lims[j].threads == 1 && lims[i].threads > 1 &&
                    lims[i].fma_gflops < 0.75 * lims[i].threads * lims[j].fma_gflops)
                    printf("  note: %d threads probed only %.2fx the one-thread FMA peak (SMT siblings, or cores "
                           "taken by other processes during the probe): fractions at %d threads may overstate\n",
                           lims[i].threads, lims[i].fma_gflops / lims[j].fma_gflops, lims[i].threads);
        printf("  heads: %d query / %d KV x %d (GQA %d)%s\n", HQ, HKV, HD, HQ / HKV,
               HQ == 32 && HKV == 8 ? "" : " (--heads: not the standard cases' 32/8)");
        printf("  block size: %d tokens%s\n", BLK, BLK == 16 ? "" : " (--block-size: not the standard cases' 16)");
        printf("  cache layout: %s; block tables %s\n",
               LAYOUT < 0 ? "each backend's preferred (`pagedattn info`)"
               : LAYOUT == PA_LAYOUT_NHD ? "NHD (--layout)" : "HND (--layout)",
               BLOCKS == BLOCKS_IN_ORDER ? "in order (--blocks in-order)"
               : BLOCKS == BLOCKS_HOT ? "hot (--blocks hot: each decode's context in the same 2 "
                                        "blocks, cache-resident; frac of the compute peak)"
                                      : "shuffled over the pool");
        printf("\n%-40s %-9s %3s %9s %9s %9s %8s %8s %10s %-8s %6s\n", "case", "backend", "thr",
               "min ms", "med ms", "max ms", "KV GB/s", "GFLOP/s", "tok/s", "bound", "frac");
    } else {
        printf("{\n  \"version\": \"%s\",\n  \"optimized_build\": %s,\n  \"load_average\": %.2f,\n"
               "  \"online_cores\": %ld,\n  \"all_threads\": %d,\n  \"llc_bytes\": %zu,\n  \"read_buffer_mib\": %zu,\n  \"heads\": {\"query\": %d, \"kv\": %d, \"size\": %d},\n"
               "  \"block_size\": %d,\n  \"cache_layout\": \"%s\",\n  \"block_tables\": \"%s\",\n  \"limits\": [",
               pa_version_string(), bench_optimized ? "true" : "false", load, online, all, llc, bw_bytes >> 20, HQ,
               HKV, HD, BLK,
               LAYOUT < 0 ? "preferred" : LAYOUT == PA_LAYOUT_NHD ? "nhd" : "hnd",
               BLOCKS_NAME[BLOCKS]);
        for (int i = 0; i < nthreads; i++) {
            char bf[32] = "null";
            if (lims[i].bf16_gflops > 0) snprintf(bf, sizeof bf, "%.7g", lims[i].bf16_gflops);
            printf("%s\n    {\"threads\": %d, \"read_gbs\": %.7g, \"fma_gflops\": %.7g, \"bf16_dot_gflops\": %s}",
                   i ? "," : "", lims[i].threads, lims[i].read_gbs, lims[i].fma_gflops, bf);
        }
        printf("\n  ],\n  \"results\": [");
    }

    int nres = 0, failures = 0;
    for (int bi = 0; bi < nbe; bi++) {
        int tiny = !strcmp(pa_backend_name(bes[bi]), "reference");
        bcase cs[16];
        int nc = make_cases(quick, tiny, cs);
        pa_context *ctx = NULL;
        pa_status st = pa_context_create(bes[bi], NULL, &ctx);
        if (st) {
            fprintf(stderr, "bench: %s: %s\n", pa_backend_name(bes[bi]), pa_last_error());
            return 1;
        }
        for (int ci = 0; ci < nc; ci++) {
            if (filter && !strstr(cs[ci].name, filter)) continue;
            bsetup S;
            progress("%s: setting up %s", pa_backend_name(bes[bi]), cs[ci].name);
            st = setup_case(&cs[ci], bes[bi], tiny, &S);
            if (st) {
                fprintf(stderr, "bench: %s: setup failed: %s\n", cs[ci].name, pa_last_error());
                free_case(&S);
                failures++;
                continue;
            }
            int done[16], ndone = 0; /* thread counts this case has run at (the reference: 1 whatever asked) */
            for (int ti = 0; ti < nthreads; ti++) {
                bresult R = {pa_backend_name(bes[bi]), threads[ti], 0, 0, 0, 0, 0, 0, 0, 0, "", -1};
                pa_context_set_num_threads(ctx, threads[ti]);
                R.threads = pa_context_num_threads(ctx);
                bool again = false;
                for (int k = 0; k < ndone; k++) again |= done[k] == R.threads;
                if (again) continue; /* (a second row of the same count said nothing new) */
                done[ndone++] = R.threads;
                /* held to the limits of the count it runs at: probed for it, or none (frac n/a) */
                const limits *lim = NULL;
                for (int k = 0; k < nthreads; k++)
                    if (lims[k].threads == R.threads) lim = &lims[k];
                progress("%s: %s, %d thread(s), %d repeats", R.backend, cs[ci].name, R.threads, repeats);
                /* prefill steps take seconds: 3 repeats unless asked otherwise */
                int reps = repeats;
                if (!repeats_given && cs[ci].nprefill && !cs[ci].ndecode && reps > 3) reps = 3;
                if (tiny && reps > 2) reps = 2;
                st = time_case(&S, ctx, reps, &R);
                if (st) {
                    progress("%s", "");
                    fprintf(stderr, "bench: %s on %s: %s\n", cs[ci].name, R.backend, pa_last_error());
                    failures++;
                    continue;
                }
                finish_result(&S, lim, &R);
                if (g_progress) progress("%s", "");
                if (json) {
                    /* (7 significant digits: a fixed number of decimals lost most of them on a
                     * small fraction or bandwidth, e.g. in a sanitizer build) */
                    char fl[32] = "null", fr[32] = "null";
                    if (lim) snprintf(fl, sizeof fl, "%.7g", R.floor_s * 1e3), snprintf(fr, sizeof fr, "%.7g", R.frac);
                    printf("%s\n    {\"case\": \"%s\", \"backend\": \"%s\", \"threads\": %d, \"layers\": %d, "
                           "\"pass_mib\": %.1f, \"repeats\": %d, "
                           "\"min_ms\": %.7g, \"median_ms\": %.7g, \"max_ms\": %.7g, \"kv_gbs\": %.7g, "
                           "\"gflops\": %.7g, \"tokens_per_s\": %.7g, \"bound\": \"%s\", \"floor_ms\": %s, "
                           "\"fraction\": %s, \"steal_ms\": %s}",
                           nres ? "," : "", cs[ci].name, R.backend, R.threads, S.nlayers, S.pass_bytes / 1048576.0,
                           reps, R.tmin * 1e3, R.tmed * 1e3, R.tmax * 1e3, R.gbs, R.gflops, R.tok_s, R.bound, fl,
                           fr, steal_json(R.steal_s));
                } else {
                    char fr[16] = "     -";
                    if (lim) snprintf(fr, sizeof fr, "%5.0f%%", R.frac * 100);
                    printf("%-40s %-9s %3d %9.3f %9.3f %9.3f %8.2f %8.2f %10.1f %-8s %s\n", cs[ci].name, R.backend,
                           R.threads, R.tmin * 1e3, R.tmed * 1e3, R.tmax * 1e3, R.gbs, R.gflops, R.tok_s, R.bound, fr);
                    if (!lim)
                        printf("  note: no limits were probed at %d thread(s) (--threads): the row above has no "
                               "fraction\n", R.threads);
                    if (!tiny && BLOCKS != BLOCKS_HOT && cs[ci].ndecode && S.pass_bytes < 0.99 * (double)FAR_BYTES)
                        printf("  note: the row above walks only %.0f MiB of KV per pass (%d layers at most): part "
                               "of it may come from the LLC\n", S.pass_bytes / 1048576.0, MAX_LAYERS);
                    /* more than a tick (10 ms at USER_HZ 100) per repeat: the host took the cores */
                    if (R.steal_s > 0.01 * (reps + 1))
                        printf("  note: the hypervisor ran other work for %.2f s of CPU time during the row above "
                               "(steal time): its figures are disturbed\n",
                               R.steal_s);
                    fflush(stdout);
                }
                nres++;
            }
            free_case(&S);
        }
        pa_context_destroy(ctx);
    }
    progress("%s", "");
    if (g_progress) fprintf(stderr, "\r\033[K");
    if (json) printf("\n  ]\n}\n");
    else
        printf("\nKV GB/s: K and V bytes attention must read per layer step / median time; GFLOP/s: "
               "useful flops (causal: visible half only) / median time.\n");
    return failures ? 1 : 0;
}
