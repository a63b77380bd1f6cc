/* test_cuda_ops.c: the cuda backend's cache operations and merge_states against the host
 * implementations (ctx NULL): cache write (every cache dtype, fp8 with scales, NHD and HND,
 * padding slots), copy_blocks, swap_blocks device <-> host and device <-> device, merge_states
 * with empty (-inf / +inf) LSEs. Skips (77) with the reason when the backend is not built or
 * no device can be used. */
#include "test.h"

#include "cuda_test.h"

#include <stdint.h>

static const pa__cuda_test_hooks *H;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f * 4.0f - 2.0f;
}

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = NULL;
    if (H->malloc_dev(&d, bytes ? bytes : 1)) return NULL;
    if (host && H->memcpy_sync(d, host, bytes, 0)) return NULL;
    return d;
}

/* A host cache and a device mirror of the same geometry, both pools filled with `fill` bytes. */
typedef struct pair_cache {
    pa_cache h, d;
    size_t bytes;
} pair_cache;

static int make_pair(pair_cache *p, pa_cache_layout layout, pa_dtype dt, int64_t nb, int32_t bs,
                     int32_t hk, int32_t d, unsigned char fill)
{
    if (pa_cache_init(&p->h, layout, dt, nb, bs, hk, d) || pa_cache_alloc(&p->h)) return 1;
    p->bytes = (size_t)pa_cache_pool_elems(&p->h) * pa_dtype_size(dt);
    memset(p->h.key, fill, p->bytes);
    memset(p->h.value, fill, p->bytes);
    p->d = p->h;
    p->d.memory = PA_MEMORY_CUDA;
    p->d.key = dev_copy(p->h.key, p->bytes);
    p->d.value = dev_copy(p->h.value, p->bytes);
    return !p->d.key || !p->d.value;
}
static void free_pair(pair_cache *p)
{
    H->free_dev(p->d.key);
    H->free_dev(p->d.value);
    pa_cache_free(&p->h);
}
/* The device pools equal the host pools byte for byte. */
static int same_pools(const pair_cache *p)
{
    unsigned char *k = malloc(p->bytes), *v = malloc(p->bytes);
    int ok = k && v && !H->memcpy_sync(k, p->d.key, p->bytes, 1) &&
             !H->memcpy_sync(v, p->d.value, p->bytes, 1) && !memcmp(k, p->h.key, p->bytes) &&
             !memcmp(v, p->h.value, p->bytes);
    free(k);
    free(v);
    return ok;
}

static void test_cache_write(pa_context *ctx)
{
    const pa_dtype cds[] = {PA_DTYPE_F32, PA_DTYPE_F16, PA_DTYPE_BF16, PA_DTYPE_FP8_E4M3, PA_DTYPE_FP8_E5M2};
    const pa_dtype sds[] = {PA_DTYPE_F32, PA_DTYPE_BF16, PA_DTYPE_F16};
    for (int ci = 0; ci < 5; ci++)
        for (int layout = 0; layout < 2; layout++) {
            const pa_dtype cd = cds[ci], sd = sds[ci % 3];
            const int32_t bs = 5, hk = 3, D = 40;
            const int64_t nb = 7, n = 11;
            pair_cache pc;
            CHECK(make_pair(&pc, (pa_cache_layout)layout, cd, nb, bs, hk, D, 0x11) == 0);
            const int64_t rs = hk * D + 8; /* strided rows */
            size_t sb = (size_t)(n * rs) * pa_dtype_size(sd);
            unsigned char *k = malloc(sb), *v = malloc(sb);
            for (int64_t i = 0; i < n * rs; i++) {
                float a = frand() * 300.f, b = frand() * 0.01f;
                if (i == 5) a = 1e6f; /* saturates in fp8 */
                pa_convert(sd, k + (size_t)i * pa_dtype_size(sd), PA_DTYPE_F32, &a, 1, 1.f);
                pa_convert(sd, v + (size_t)i * pa_dtype_size(sd), PA_DTYPE_F32, &b, 1, 1.f);
            }
            int64_t slots[11] = {3, 34, -1, 0, 17, 9, 33, -1, 20, 5, 1};
            const float ks = pa_dtype_size(cd) == 1 ? 0.5f : 1.f, vs = pa_dtype_size(cd) == 1 ? 0.03f : 1.f;
            CHECK_OK(pa_cache_write(NULL, &pc.h, sd, k, rs, v, rs, slots, n, ks, vs));
            void *dk = dev_copy(k, sb), *dv = dev_copy(v, sb);
            /* pageable host rows for a device cache: refused before any kernel runs (a kernel
             * fault would poison the whole CUDA context), the cache untouched */
            unsigned char *before = malloc(pc.bytes), *after = malloc(pc.bytes);
            CHECK(!H->memcpy_sync(before, pc.d.value, pc.bytes, 1));
            CHECK(pa_cache_write(ctx, &pc.d, sd, k, rs, dv, rs, slots, n, ks, vs) == PA_STATUS_INVALID_ARGUMENT);
            CHECK(strstr(pa_last_error(), "pageable") != NULL);
            CHECK_OK(pa_context_synchronize(ctx));
            CHECK(!H->memcpy_sync(after, pc.d.value, pc.bytes, 1));
            CHECK(!memcmp(before, after, pc.bytes));
            free(before);
            free(after);
            CHECK_OK(pa_cache_write(ctx, &pc.d, sd, dk, rs, dv, rs, slots, n, ks, vs));
            CHECK_OK(pa_context_synchronize(ctx));
            if (!same_pools(&pc)) TEST_FAIL("cache write: cache %s, layout %d, src %s differs from host", pa_dtype_name(cd), layout, pa_dtype_name(sd));
            H->free_dev(dk);
            H->free_dev(dv);
            free(k);
            free(v);
            free_pair(&pc);
        }
}

static void fill_random(pair_cache *p)
{
    uint16_t *k = p->h.key, *v = p->h.value;
    for (size_t i = 0; i < p->bytes / 2; i++) {
        k[i] = (uint16_t)(rng = rng * 6364136223846793005ull + 1442695040888963407ull) ;
        v[i] = (uint16_t)(rng >> 17);
    }
    CHECK(!H->memcpy_sync(p->d.key, p->h.key, p->bytes, 0));
    CHECK(!H->memcpy_sync(p->d.value, p->h.value, p->bytes, 0));
}

static void test_copy_swap(pa_context *ctx)
{
    /* copy_blocks over two layers (NHD and HND) */
    pair_cache l[2];
    CHECK(make_pair(&l[0], PA_LAYOUT_NHD, PA_DTYPE_BF16, 9, 4, 2, 24, 0) == 0);
    CHECK(make_pair(&l[1], PA_LAYOUT_HND, PA_DTYPE_BF16, 9, 4, 2, 24, 0) == 0);
    fill_random(&l[0]);
    fill_random(&l[1]);
    const int64_t pairs[] = {1, 4, 1, 7, 8, 0, 3, 2};
    pa_cache hc[2] = {l[0].h, l[1].h}, dc[2] = {l[0].d, l[1].d};
    CHECK_OK(pa_cache_copy_blocks(NULL, hc, 2, pairs, 4));
    CHECK_OK(pa_cache_copy_blocks(ctx, dc, 2, pairs, 4));
    CHECK_OK(pa_context_synchronize(ctx));
    CHECK(same_pools(&l[0]));
    CHECK(same_pools(&l[1]));

    /* swap: device NHD -> host HND, host -> device, device -> device (different strides) */
    pair_cache a, b;
    CHECK(make_pair(&a, PA_LAYOUT_NHD, PA_DTYPE_BF16, 6, 4, 2, 24, 0) == 0);
    CHECK(make_pair(&b, PA_LAYOUT_HND, PA_DTYPE_BF16, 5, 4, 2, 24, 0) == 0);
    fill_random(&a);
    fill_random(&b);
    const int64_t sp[] = {0, 4, 5, 1, 2, 0};
    /* device a -> host b (b.h), compared with host a -> host copy of b */
    pa_cache bref = b.h;
    CHECK(pa_cache_alloc(&bref) == PA_STATUS_OK);
    memcpy(bref.key, b.h.key, b.bytes);
    memcpy(bref.value, b.h.value, b.bytes);
    CHECK_OK(pa_cache_swap_blocks(NULL, &a.h, &bref, sp, 3));
    CHECK_OK(pa_cache_swap_blocks(ctx, &a.d, &b.h, sp, 3));
    CHECK_OK(pa_context_synchronize(ctx));
    CHECK(!memcmp(bref.key, b.h.key, b.bytes) && !memcmp(bref.value, b.h.value, b.bytes));
    /* host b -> device a */
    const int64_t sp2[] = {4, 3, 1, 1};
    CHECK_OK(pa_cache_swap_blocks(NULL, &b.h, &a.h, sp2, 2));
    CHECK_OK(pa_cache_swap_blocks(ctx, &b.h, &a.d, sp2, 2));
    CHECK_OK(pa_context_synchronize(ctx));
    CHECK(same_pools(&a));
    /* device a -> device b */
    CHECK(!H->memcpy_sync(b.d.key, b.h.key, b.bytes, 0));
    CHECK(!H->memcpy_sync(b.d.value, b.h.value, b.bytes, 0));
    CHECK_OK(pa_cache_swap_blocks(NULL, &a.h, &b.h, sp, 3));
    CHECK_OK(pa_cache_swap_blocks(ctx, &a.d, &b.d, sp, 3));
    CHECK_OK(pa_context_synchronize(ctx));
    CHECK(same_pools(&b));
    pa_cache_free(&bref);
    free_pair(&a);
    free_pair(&b);
    free_pair(&l[0]);
    free_pair(&l[1]);
}

static void test_merge(pa_context *ctx)
{
    const pa_dtype dts[] = {PA_DTYPE_F32, PA_DTYPE_F16, PA_DTYPE_BF16};
    for (int di = 0; di < 3; di++) {
        const int64_t T = 5;
        const int32_t Hn = 3, D = 33;
        const pa_dtype dt = dts[di];
        const size_t n = (size_t)(T * Hn * D), es = pa_dtype_size(dt);
        unsigned char *oa = malloc(n * es), *ob = malloc(n * es), *oh = malloc(n * es), *od = malloc(n * es);
        float la[15], lb[15], lh[15], ld[15];
        for (size_t i = 0; i < n; i++) {
            float x = frand(), y = frand();
            pa_convert(dt, oa + i * es, PA_DTYPE_F32, &x, 1, 1.f);
            pa_convert(dt, ob + i * es, PA_DTYPE_F32, &y, 1, 1.f);
        }
        for (int i = 0; i < 15; i++) {
            la[i] = frand() * 5;
            lb[i] = frand() * 5;
        }
        la[1] = -INFINITY;
        lb[2] = -INFINITY;
        la[3] = lb[3] = -INFINITY;
        la[4] = INFINITY;
        lb[4] = -INFINITY;
        /* NaN LSEs (a NaN row and LSE), a weight underflowing to 0 beside a NaN out (NaN shows),
         * an empty part's NaN out (ignored) */
        la[5] = NAN;
        lb[6] = NAN;
        la[7] = lb[7] = NAN;
        la[8] = 0.0f, lb[8] = -200.0f;
        la[9] = -INFINITY, lb[9] = 1.0f;
        {
            const float nan = NAN;
            pa_convert(dt, ob + (size_t)(8 * D + 3) * es, PA_DTYPE_F32, &nan, 1, 1.f);
            pa_convert(dt, oa + (size_t)(9 * D + 4) * es, PA_DTYPE_F32, &nan, 1, 1.f);
        }
        pa_merge_args m = {T, Hn, D, dt, oa, la, ob, lb, oh, lh, 0, 0};
        CHECK_OK(pa_merge_states(NULL, &m));
        void *doa = dev_copy(oa, n * es), *dob = dev_copy(ob, n * es), *dout = dev_copy(NULL, n * es);
        void *dla = dev_copy(la, sizeof la), *dlb = dev_copy(lb, sizeof lb), *dlo = dev_copy(NULL, sizeof ld);
        pa_merge_args md = {T, Hn, D, dt, doa, dla, dob, dlb, dout, dlo, 0, 0};
        pa_merge_args bad = md;
        bad.out = oh; /* pageable host memory: refused, nothing launched */
        CHECK(pa_merge_states(ctx, &bad) == PA_STATUS_INVALID_ARGUMENT);
        CHECK(strstr(pa_last_error(), "out (") != NULL);
        CHECK_OK(pa_merge_states(ctx, &md));
        CHECK_OK(pa_context_synchronize(ctx));
        CHECK(!H->memcpy_sync(od, dout, n * es, 1));
        CHECK(!H->memcpy_sync(ld, dlo, sizeof ld, 1));
        for (size_t i = 0; i < n; i++) {
            float x = 0, y = 0;
            pa_convert(PA_DTYPE_F32, &x, dt, oh + i * es, 1, 1.f);
            pa_convert(PA_DTYPE_F32, &y, dt, od + i * es, 1, 1.f);
            if (isnan(x)) CHECK(isnan(y));
            else CHECK_NEAR(y, x, 1e-5 + fabs(x) * (dt == PA_DTYPE_F32 ? 1e-5 : 1.0 / 128));
        }
        CHECK(isnan(lh[5]) && isnan(lh[6]) && isnan(lh[7]) && lh[8] == 0.0f && lh[9] == 1.0f);
        for (int i = 0; i < 15; i++) {
            if (isnan(lh[i])) CHECK(isnan(ld[i]));
            else if (isinf(lh[i])) CHECK(isinf(ld[i]) && ld[i] < 0 && lh[i] < 0);
            else CHECK_NEAR(ld[i], lh[i], 1e-5 * (1 + fabs(lh[i])));
        }
        H->free_dev(doa), H->free_dev(dob), H->free_dev(dout), H->free_dev(dla), H->free_dev(dlb), H->free_dev(dlo);
        free(oa), free(ob), free(oh), free(od);
    }
}

int main(void)
{
    const pa_backend *cuda = cuda_test_open(&H);
    if (!cuda) return 77;
    pa_context *ctx = NULL;
    CHECK_OK(pa_context_create(cuda, NULL, &ctx));
    if (!ctx) return test_exit();
    test_cache_write(ctx);
    test_copy_swap(ctx);
    test_merge(ctx);
    pa_context_destroy(ctx);
    return test_exit();
}
