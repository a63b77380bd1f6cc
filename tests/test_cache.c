/* test_cache.c: exact unit tests of the KV-cache operations with hand-worked examples: the
 * strides of pa_cache_init, pool sizes, pa_cache_write by slot mapping (skipped slots, fp8
 * quantization with scales, f16/bf16 conversion, fused-QKV row strides, NHD / HND / K-V
 * interleaved layouts, block sizes 1 and odd), read-back, copy_blocks, swap_blocks between
 * layouts, and merge_states. Every expected integer and value is written out. */
#include "test.h"

#include <stdbool.h>
#include <stdint.h>

/* A recognisable byte pattern for "never written". */
#define POISON 0xA5

/* ---- pa_cache_init / pa_cache_pool_elems ---------------------------------------------------- */

static void test_init_strides(void)
{
    pa_cache c;
    /* NHD, 5 blocks x 3 tokens x 2 heads x 4 dims: a block is 3*2*4 = 24 elements. */
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_NHD, PA_DTYPE_F16, 5, 3, 2, 4));
    CHECK_INT(c.block_stride, 24);
    CHECK_INT(c.token_stride, 8);
    CHECK_INT(c.head_stride, 4);
    CHECK_INT(c.num_blocks, 5);
    CHECK_INT(c.block_size, 3);
    CHECK_INT(c.num_kv_heads, 2);
    CHECK_INT(c.head_size, 4);
    CHECK_INT(c.dtype, PA_DTYPE_F16);
    CHECK_INT(c.memory, PA_MEMORY_HOST);
    CHECK(c.key == NULL && c.value == NULL);
    /* 4*24 + 2*8 + 1*4 + 4 = 120 = 5 * 24 */
    CHECK_INT(pa_cache_pool_elems(&c), 120);

    /* HND, same geometry: token stride is head_size, head stride block_size*head_size. */
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_HND, PA_DTYPE_FP8_E4M3, 5, 3, 2, 4));
    CHECK_INT(c.block_stride, 24);
    CHECK_INT(c.token_stride, 4);
    CHECK_INT(c.head_stride, 12);
    CHECK_INT(c.dtype, PA_DTYPE_FP8_E4M3);
    CHECK_INT(pa_cache_pool_elems(&c), 120); /* 4*24 + 2*4 + 1*12 + 4 */

    /* block_size 1, one head: NHD and HND coincide. */
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_NHD, PA_DTYPE_F32, 7, 1, 1, 3));
    CHECK_INT(c.block_stride, 3);
    CHECK_INT(c.token_stride, 3);
    CHECK_INT(c.head_stride, 3);
    CHECK_INT(pa_cache_pool_elems(&c), 21);
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_HND, PA_DTYPE_F32, 7, 1, 1, 3));
    CHECK_INT(c.block_stride, 3);
    CHECK_INT(c.token_stride, 3);
    CHECK_INT(c.head_stride, 3);

    /* odd geometry: 2 blocks x 5 tokens x 3 heads x 7 dims = 105 per block */
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_HND, PA_DTYPE_BF16, 2, 5, 3, 7));
    CHECK_INT(c.block_stride, 105);
    CHECK_INT(c.token_stride, 7);
    CHECK_INT(c.head_stride, 35);
    CHECK_INT(pa_cache_pool_elems(&c), 210);

    /* K/V interleaved [num_blocks, 2, block_size, H, D]: block stride doubled; each pool spans
     * (nb-1)*48 + (bs-1)*8 + (H-1)*4 + 4 = 4*48 + 16 + 4 + 4 = 216 elements. */
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_NHD, PA_DTYPE_F32, 5, 3, 2, 4));
    c.block_stride = 48;
    CHECK_INT(pa_cache_pool_elems(&c), 216);
    CHECK_INT(pa_cache_pool_elems(NULL), -1);
}

/* ---- pa_cache_write + read-back ------------------------------------------------------------- */

/* Source value of token i, kv head h, dim d: distinct and exact in f32, f16 and bf16. */
static float src_val(int i, int h, int d, int which) { return (float)(which ? -1 : 1) * (float)(i * 16 + h * 4 + d + 1) * 0.25f; }

/* NHD and HND f32 caches, 5 blocks x 3 tokens x 2 heads x 4 dims; slots 7, -1, 0, 14, -5:
 *   token 0 -> slot 7  = block 2, token 1
 *   token 1 -> skipped (-1)
 *   token 2 -> slot 0  = block 0, token 0
 *   token 3 -> slot 14 = block 4, token 2
 *   token 4 -> skipped (-5: any negative slot is skipped)
 * Exactly 3 tokens x 8 elements change in each pool; every other element keeps its bytes. */
static void test_write_f32_layouts(void)
{
    for (int layout = 0; layout < 2; layout++) {
        pa_cache c;
        CHECK_OK(pa_cache_init(&c, (pa_cache_layout)layout, PA_DTYPE_F32, 5, 3, 2, 4));
        float K[120], V[120];
        memset(K, POISON, sizeof K);
        memset(V, POISON, sizeof V);
        float poison;
        memset(&poison, POISON, sizeof poison);
        c.key = K;
        c.value = V;
        float k[5 * 8], v[5 * 8];
        for (int i = 0; i < 5; i++)
            for (int e = 0; e < 8; e++) {
                k[i * 8 + e] = src_val(i, e / 4, e % 4, 0);
                v[i * 8 + e] = src_val(i, e / 4, e % 4, 1);
            }
        const int64_t slots[5] = {7, -1, 0, 14, -5};
        CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 5, 1.0f, 1.0f));
        /* token 0, head 1, dim 2 = 0.25 * (0 + 4 + 2 + 1) = 1.75 */
        if (layout == PA_LAYOUT_NHD) {
            /* block 2, token 1, head 1, dim 2: 2*24 + 1*8 + 1*4 + 2 = 62 */
            CHECK(K[62] == 1.75f);
            CHECK(V[62] == -1.75f);
            /* token 2 (slot 0), head 0, dim 0 = 0.25 * 33 = 8.25 at offset 0 */
            CHECK(K[0] == 8.25f);
            /* token 3 (slot 14 = block 4, token 2), head 1, dim 3 = 0.25*(48+4+3+1) = 14 at
             * 4*24 + 2*8 + 4 + 3 = 119, the last element */
            CHECK(K[119] == 14.0f);
            CHECK(V[119] == -14.0f);
        } else {
            /* HND: block 2, head 1, token 1, dim 2: 2*24 + 1*12 + 1*4 + 2 = 66 */
            CHECK(K[66] == 1.75f);
            CHECK(V[66] == -1.75f);
            CHECK(K[0] == 8.25f);
            /* block 4, head 1, token 2, dim 3: 96 + 12 + 8 + 3 = 119 */
            CHECK(K[119] == 14.0f);
            /* block 4, head 0, token 2, dim 3: 96 + 0 + 8 + 3 = 107 = 0.25*(48+0+3+1) = 13 */
            CHECK(K[107] == 13.0f);
        }
        int changed = 0, poisoned = 0;
        for (int e = 0; e < 120; e++) {
            changed += memcmp(&K[e], &poison, 4) != 0;
            poisoned += memcmp(&V[e], &poison, 4) == 0;
        }
        CHECK_INT(changed, 24);
        CHECK_INT(poisoned, 96);
        /* read back every written token by slot */
        const int64_t wslot[3] = {7, 0, 14};
        const int wtok[3] = {0, 2, 3};
        for (int w = 0; w < 3; w++) {
            float kr[8], vr[8];
            CHECK_OK(pa_cache_read_token(&c, wslot[w], 1.0f, 1.0f, kr, vr));
            for (int e = 0; e < 8; e++) {
                CHECK(kr[e] == k[wtok[w] * 8 + e]);
                CHECK(vr[e] == v[wtok[w] * 8 + e]);
            }
        }
        /* either output may be NULL */
        float kr[8];
        CHECK_OK(pa_cache_read_token(&c, 14, 1.0f, 1.0f, kr, NULL));
        CHECK(kr[7] == 14.0f);
        CHECK_OK(pa_cache_read_token(&c, 14, 1.0f, 1.0f, NULL, kr));
        CHECK(kr[7] == -14.0f);
        /* scales apply to fp8 caches only: an f32 cache reads back as stored */
        CHECK_OK(pa_cache_read_token(&c, 14, 2.0f, 4.0f, kr, NULL));
        CHECK(kr[7] == 14.0f);
        CHECK_OK(pa_cache_read_token(&c, 14, 2.0f, 4.0f, NULL, kr));
        CHECK(kr[7] == -14.0f);
        /* num_tokens 0 writes nothing, NULL pointers allowed */
        CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, NULL, 0, NULL, 0, NULL, 0, 1.0f, 1.0f));
    }
}

/* fp8 with non-unit scales: stored byte = quant(x / scale); read = dequant(byte) * scale. */
static void test_write_fp8(void)
{
    /* Hand-worked bytes, k_scale 0.5, v_scale 2:
     *   k = 1.0  -> 1.0/0.5 = 2.0   -> e4m3 0 1000 000 = 0x40,  e5m2 0 10000 00 = 0x40
     *   v = 1.0  -> 1.0/2   = 0.5   -> e4m3 0 0110 000 = 0x30,  e5m2 0 01110 00 = 0x38
     *   k = 300  -> 600 saturates   -> e4m3 448 = 0x7E,         e5m2 600 -> 640? no: 600 rounds
     *              between 512 (0x60) and 640 (0x61); 600 is nearer 640 -> 0x61
     *   k = -0.75 -> -1.5           -> e4m3 1 0111 100 = 0xBC,  e5m2 1 01111 10 = 0xBE
     *   v = 3.0  -> 1.5             -> e4m3 0x3C,               e5m2 0x3E */
    static const struct {
        pa_dtype dt;
        uint8_t k[3], v[3];
        float kback[3];
    } cases[2] = {
        {PA_DTYPE_FP8_E4M3, {0x40, 0x7E, 0xBC}, {0x30, 0x30, 0x3C}, {1.0f, 224.0f, -0.75f}},
        {PA_DTYPE_FP8_E5M2, {0x40, 0x61, 0xBE}, {0x38, 0x38, 0x3E}, {1.0f, 320.0f, -0.75f}},
    };
    for (int ci = 0; ci < 2; ci++) {
        pa_cache c;
        /* HND, 3 blocks of 1 token, 1 head, 3 dims */
        CHECK_OK(pa_cache_init(&c, PA_LAYOUT_HND, cases[ci].dt, 3, 1, 1, 3));
        uint8_t K[9], V[9];
        memset(K, POISON, sizeof K);
        memset(V, POISON, sizeof V);
        c.key = K;
        c.value = V;
        const float k[3] = {1.0f, 300.0f, -0.75f}, v[3] = {1.0f, 1.0f, 3.0f};
        const int64_t slot = 1;
        CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, &slot, 1, 0.5f, 2.0f));
        for (int d = 0; d < 3; d++) {
            CHECK_INT(K[3 + d], cases[ci].k[d]);
            CHECK_INT(V[3 + d], cases[ci].v[d]);
            /* the documented rule, through the public scalar conversions */
            uint8_t qk = cases[ci].dt == PA_DTYPE_FP8_E4M3 ? pa_f32_to_fp8e4m3(k[d] / 0.5f)
                                                           : pa_f32_to_fp8e5m2(k[d] / 0.5f);
            uint8_t qv = cases[ci].dt == PA_DTYPE_FP8_E4M3 ? pa_f32_to_fp8e4m3(v[d] / 2.0f)
                                                           : pa_f32_to_fp8e5m2(v[d] / 2.0f);
            CHECK_INT(K[3 + d], qk);
            CHECK_INT(V[3 + d], qv);
        }
        for (int e = 0; e < 9; e++)
            if (e < 3 || e >= 6) {
                CHECK_INT(K[e], POISON);
                CHECK_INT(V[e], POISON);
            }
        float kr[3], vr[3];
        CHECK_OK(pa_cache_read_token(&c, 1, 0.5f, 2.0f, kr, vr));
        for (int d = 0; d < 3; d++) CHECK(kr[d] == cases[ci].kback[d]);
        CHECK(vr[0] == 1.0f && vr[1] == 1.0f && vr[2] == 3.0f);
        /* scale 1 reads the raw fp8 value */
        CHECK_OK(pa_cache_read_token(&c, 1, 1.0f, 1.0f, kr, vr));
        CHECK(kr[0] == 2.0f && vr[0] == 0.5f);
        /* from f16 and bf16 sources too: x = 1.0 in each */
        const uint16_t k16[3] = {0x3C00, 0x3C00, 0x3C00}, kb16[3] = {0x3F80, 0x3F80, 0x3F80};
        const int64_t slot2 = 2;
        CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F16, k16, 0, k16, 0, &slot2, 1, 0.5f, 2.0f));
        CHECK_INT(K[6], 0x40);
        CHECK_INT(V[6], cases[ci].v[0]);
        const int64_t slot0 = 0;
        CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_BF16, kb16, 0, kb16, 0, &slot0, 1, 0.5f, 2.0f));
        CHECK_INT(K[0], 0x40);
        CHECK_INT(V[2], cases[ci].v[0]);
    }
}

/* f16 and bf16 caches from f32 (round to nearest even) and between 16-bit types. */
static void test_write_16bit(void)
{
    pa_cache c;
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_NHD, PA_DTYPE_F16, 2, 2, 1, 4));
    uint16_t K[16], V[16];
    memset(K, POISON, sizeof K);
    memset(V, POISON, sizeof V);
    c.key = K;
    c.value = V;
    /* 0.1f -> f16 0x2E66; 1 + 2^-11 (a tie) -> 0x3C00 (even); 1 + 3*2^-11 -> 0x3C02 (even);
     * 70000 -> +inf 0x7C00 */
    const float k[4] = {0.1f, 1.00048828125f, 1.00146484375f, 70000.0f};
    const float v[4] = {-2.0f, 0.5f, 65504.0f, -0.0f};
    const int64_t slot = 3; /* block 1, token 1: offset 1*8 + 1*4 = 12 */
    CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, &slot, 1, 1.0f, 1.0f));
    CHECK_INT(K[12], 0x2E66);
    CHECK_INT(K[13], 0x3C00);
    CHECK_INT(K[14], 0x3C02);
    CHECK_INT(K[15], 0x7C00);
    CHECK_INT(V[12], 0xC000);
    CHECK_INT(V[13], 0x3800);
    CHECK_INT(V[14], 0x7BFF);
    CHECK_INT(V[15], 0x8000);
    for (int e = 0; e < 12; e++) CHECK_INT(K[e], 0xA5A5);
    float kr[4];
    CHECK_OK(pa_cache_read_token(&c, 3, 1.0f, 1.0f, kr, NULL));
    CHECK(kr[0] == 0.0999755859375f);
    CHECK(kr[1] == 1.0f);
    CHECK(kr[3] == INFINITY);

    /* bf16 cache from f32 and from f16 */
    pa_cache b;
    CHECK_OK(pa_cache_init(&b, PA_LAYOUT_HND, PA_DTYPE_BF16, 1, 2, 2, 2));
    uint16_t BK[8], BV[8];
    memset(BK, 0, sizeof BK);
    memset(BV, 0, sizeof BV);
    b.key = BK;
    b.value = BV;
    /* 0.1f = 0x3DCCCCCD -> bf16 0x3DCD; 1 + 2^-8 (tie) -> 0x3F80; 1 + 3*2^-8 -> 0x3F82;
     * -3.0 -> 0xC040 */
    const float bk[4] = {0.1f, 1.00390625f, 1.01171875f, -3.0f};
    const int64_t s1 = 1;
    CHECK_OK(pa_cache_write(NULL, &b, PA_DTYPE_F32, bk, 0, bk, 0, &s1, 1, 1.0f, 1.0f));
    /* HND: token 1 head 0 at 1*2 = 2, head 1 at 4 + 2 = 6 */
    CHECK_INT(BK[2], 0x3DCD);
    CHECK_INT(BK[3], 0x3F80);
    CHECK_INT(BK[6], 0x3F82);
    CHECK_INT(BK[7], 0xC040);
    CHECK_INT(BK[0], 0);
    CHECK_INT(BK[4], 0);
    /* f16 source 0x3555 = 0.333251953125 -> bf16 rounds 0x3EAA A000... = 0x3EAAA000 -> 0x3EAB?
     * 0.333251953125 = 0x3EAAA000: lower half 0xA000 > 0x8000, rounds up to 0x3EAB. */
    const uint16_t h16[4] = {0x3555, 0x3555, 0x3C00, 0x3C00};
    const int64_t s0 = 0;
    CHECK_OK(pa_cache_write(NULL, &b, PA_DTYPE_F16, h16, 0, h16, 0, &s0, 1, 1.0f, 1.0f));
    CHECK_INT(BK[0], 0x3EAB);
    CHECK_INT(BK[1], 0x3EAB);
    CHECK_INT(BK[4], 0x3F80);
    CHECK_INT(BV[5], 0x3F80);
    /* an f16 source into an f16 cache is copied bit for bit (NaN payload kept) */
    const uint16_t nan16[4] = {0x7E01, 0xFC00, 0x0001, 0x8001};
    const int64_t s2 = 2;
    CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F16, nan16, 0, nan16, 0, &s2, 1, 1.0f, 1.0f));
    CHECK_INT(K[8], 0x7E01);
    CHECK_INT(K[9], 0xFC00);
    CHECK_INT(K[10], 0x0001);
    CHECK_INT(V[11], 0x8001);
}

/* Fused QKV: one buffer [tokens, (4 q heads + 2 k heads + 2 v heads) * 2 dims] = 16 per row; k
 * is a view at column 8, v at column 12, both with row stride 16. Cache: 1 block x 5 tokens
 * (odd) x 2 heads x 2 dims, NHD. */
static void test_write_fused_qkv(void)
{
    float qkv[3 * 16];
    for (int i = 0; i < 3 * 16; i++) qkv[i] = (float)i;
    pa_cache c;
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_NHD, PA_DTYPE_F32, 1, 5, 2, 2));
    float K[20], V[20];
    for (int i = 0; i < 20; i++) K[i] = V[i] = -1.0f;
    c.key = K;
    c.value = V;
    const int64_t slots[3] = {4, 2, -1};
    CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, qkv + 8, 16, qkv + 12, 16, slots, 3, 1.0f, 1.0f));
    /* token 0 -> slot 4: K = qkv[8..11], V = qkv[12..15] at 4*4 = 16 */
    const float want_k4[4] = {8, 9, 10, 11}, want_v4[4] = {12, 13, 14, 15};
    const float want_k2[4] = {24, 25, 26, 27}, want_v2[4] = {28, 29, 30, 31};
    CHECK(memcmp(K + 16, want_k4, sizeof want_k4) == 0);
    CHECK(memcmp(V + 16, want_v4, sizeof want_v4) == 0);
    CHECK(memcmp(K + 8, want_k2, sizeof want_k2) == 0);
    CHECK(memcmp(V + 8, want_v2, sizeof want_v2) == 0);
    for (int i = 0; i < 8; i++) CHECK(K[i] == -1.0f && V[i] == -1.0f);
    for (int i = 12; i < 16; i++) CHECK(K[i] == -1.0f && V[i] == -1.0f);
}

/* K/V interleaved in one allocation [num_blocks=3, 2, block_size=2, H=1, D=2]: value pointer is
 * key + 4, block stride 8. A write must land in the key half and the value half of the block. */
static void test_write_interleaved(void)
{
    float buf[24];
    for (int i = 0; i < 24; i++) buf[i] = 0.0f;
    pa_cache c;
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_NHD, PA_DTYPE_F32, 3, 2, 1, 2));
    c.block_stride = 8;
    c.key = buf;
    c.value = buf + 4;
    CHECK_INT(pa_cache_pool_elems(&c), 20);
    const float k[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
    const int64_t slots[2] = {3, 4}; /* block 1 token 1; block 2 token 0 */
    CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 2, 1.0f, 1.0f));
    const float want[24] = {0, 0, 0, 0, 0, 0, 0, 0,   /* block 0: K | V */
                            0, 0, 1, 2, 0, 0, 5, 6,   /* block 1: K t1 | V t1 */
                            3, 4, 0, 0, 7, 8, 0, 0};  /* block 2: K t0 | V t0 */
    CHECK(memcmp(buf, want, sizeof want) == 0);
    float kr[2], vr[2];
    CHECK_OK(pa_cache_read_token(&c, 4, 1.0f, 1.0f, kr, vr));
    CHECK(kr[0] == 3 && kr[1] == 4 && vr[0] == 7 && vr[1] == 8);
}

/* Pools that share elements: refused by every call that writes (the write's keys went into the
 * values and it returned OK until an audit: bench/NOTES.md, fortieth pass), allowed to reads;
 * pools that interleave without sharing an element (here V in each token's padding) pass. */
static void test_overlapping_pools(void)
{
    float buf[64], before[64];
    for (int i = 0; i < 64; i++) buf[i] = (float)(i + 100);
    memcpy(before, buf, sizeof buf);
    pa_cache c;
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_NHD, PA_DTYPE_F32, 4, 2, 1, 2)); /* 4 blocks x 2 tokens x 2 */
    c.key = c.value = buf;
    CHECK_OK(pa_cache_validate(&c)); /* (a view: V = K is a valid thing to read) */
    const float k[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
    const int64_t slots[2] = {1, 6};
    CHECK_FAILS_WITH(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 2, 1.0f, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "key and value pools overlap (value - key = 0 bytes)");
    const int64_t pairs[2] = {0, 3};
    float other[64] = {0};
    pa_cache d = c;
    d.key = other, d.value = other + 32;
    CHECK_FAILS_WITH(pa_cache_swap_blocks(NULL, &d, &c, pairs, 1), PA_STATUS_INVALID_ARGUMENT,
                     "pa_cache_swap_blocks (dst): the cache's key and value pools overlap");
    CHECK(memcmp(buf, before, sizeof buf) == 0);
    /* a read of such a cache: fine (swap from it, read a token) */
    CHECK_OK(pa_cache_swap_blocks(NULL, &c, &d, pairs, 1));
    CHECK(memcmp(other + 12, buf, 4 * sizeof(float)) == 0 && memcmp(other + 32 + 12, buf, 4 * sizeof(float)) == 0);
    float kr[2], vr[2];
    CHECK_OK(pa_cache_read_token(&c, 1, 1.0f, 1.0f, kr, vr));
    CHECK(kr[0] == 102 && vr[0] == 102);
    /* ... and writes that put the same data in both (V = K kept): the same rows for key and
     * value, a copy of blocks within the one pool */
    CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, k, 0, slots, 2, 1.0f, 1.0f));
    CHECK(buf[2] == 1 && buf[3] == 2 && buf[12] == 3 && buf[13] == 4);
    const float k2[4] = {1, 2, 3, 4}; /* (equal bytes in another buffer: the same data) */
    CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, k2, 0, slots, 2, 1.0f, 1.0f));
    CHECK_OK(pa_cache_copy_blocks(NULL, &c, 1, pairs, 1));
    CHECK(memcmp(buf + 12, buf, 4 * sizeof(float)) == 0);
    memcpy(buf, before, sizeof buf);
    /* V one element on from K, and V two bytes on (elements overlapping in part): refused */
    c.value = buf + 1;
    CHECK_FAILS_WITH(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 2, 1.0f, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "value - key = 4 bytes");
    CHECK_FAILS_WITH(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, k, 0, slots, 2, 1.0f, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "value - key = 4 bytes"); /* (not one pool: no V = K) */
    CHECK_FAILS_WITH(pa_cache_copy_blocks(NULL, &c, 1, pairs, 1), PA_STATUS_INVALID_ARGUMENT, "pools overlap");
    c.key = buf + 1, c.value = buf;
    CHECK_FAILS_WITH(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 2, 1.0f, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "value - key = -4 bytes");
    c.key = buf, c.value = (char *)buf + 2;
    CHECK_FAILS_WITH(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 2, 1.0f, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "value - key = 2 bytes");
    /* the last element of K's span on V's first: refused; V just past K's span: fine */
    c.value = buf + 15;
    CHECK_FAILS_WITH(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 2, 1.0f, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "pools overlap");
    CHECK(memcmp(buf, before, sizeof buf) == 0);
    c.value = buf + 16;
    CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 2, 1.0f, 1.0f));
    /* each token padded to 4 elements, V in the padding (value = key + 2): no element shared */
    memcpy(buf, before, sizeof buf);
    c.token_stride = 4, c.block_stride = 8, c.key = buf, c.value = buf + 2;
    CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 2, 1.0f, 1.0f));
    /* slot 1: block 0 token 1 at 4..7 (K 4, 5; V 6, 7); slot 6: block 3 token 0 at 24..27 */
    for (int i = 0; i < 64; i++) {
        float want = i == 4 ? 1 : i == 5 ? 2 : i == 6 ? 5 : i == 7 ? 6 : i == 24 ? 3 : i == 25 ? 4 : i == 26 ? 7
                     : i == 27 ? 8 : before[i];
        CHECK(buf[i] == want);
    }
    /* ... but V on the next token's K (value = key + 4): refused */
    c.value = buf + 4;
    CHECK_FAILS_WITH(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 2, 1.0f, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "value - key = 16 bytes");
}

/* block_size 1: slot == block id. 4 blocks x 1 token x 3 heads x 1 dim, NHD. */
static void test_write_block_size_1(void)
{
    pa_cache c;
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_NHD, PA_DTYPE_F32, 4, 1, 3, 1));
    float K[12] = {0}, V[12] = {0};
    c.key = K;
    c.value = V;
    const float k[6] = {1, 2, 3, 4, 5, 6}, v[6] = {-1, -2, -3, -4, -5, -6};
    const int64_t slots[2] = {3, 1};
    CHECK_OK(pa_cache_write(NULL, &c, PA_DTYPE_F32, k, 0, v, 0, slots, 2, 1.0f, 1.0f));
    const float wk[12] = {0, 0, 0, 4, 5, 6, 0, 0, 0, 1, 2, 3};
    const float wv[12] = {0, 0, 0, -4, -5, -6, 0, 0, 0, -1, -2, -3};
    CHECK(memcmp(K, wk, sizeof wk) == 0);
    CHECK(memcmp(V, wv, sizeof wv) == 0);
}

/* pa_cache_alloc gives zeroed pools of pool_elems * dtype size; free resets the pointers. */
static void test_alloc(void)
{
    pa_cache c;
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_HND, PA_DTYPE_BF16, 3, 5, 2, 3));
    CHECK_OK(pa_cache_alloc(&c));
    CHECK(c.key != NULL && c.value != NULL && c.key != c.value);
    CHECK(((uintptr_t)c.key % 64) == 0 && ((uintptr_t)c.value % 64) == 0);
    int nonzero = 0;
    for (int i = 0; i < 90 * 2; i++) nonzero += ((uint8_t *)c.key)[i] | ((uint8_t *)c.value)[i];
    CHECK_INT(nonzero, 0);
    pa_cache_free(&c);
    CHECK(c.key == NULL && c.value == NULL);
    pa_cache_free(&c); /* twice: no-op */
    pa_cache_free(NULL);
}

/* Pools of 4 MiB or more (pa_cache_alloc's header comment): 2 MiB aligned, zeroed, and on Linux
 * advised for transparent huge pages. The advice is checked in /proc/self/smaps: the mapping
 * holding the pool carries VmFlags "hg" (MADV_HUGEPAGE), whatever the system's THP mode. Until
 * 2026-11-28 the advice compiled to nothing (alloc.c's feature macros hid MADV_HUGEPAGE). */

/* The VmFlags line of the mapping that holds addr, into line; false if there is none (no
 * /proc/self/smaps, or a kernel that does not list VmFlags). */
static bool vma_flags(const void *addr, char *line, size_t size)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    bool in = false, found = false;
    uintptr_t a = (uintptr_t)addr;
    while (fgets(line, (int)size, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = a >= lo && a < hi;
        } else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            found = true;
            break;
        }
    }
    fclose(f);
    return found;
}

/* Whether the VmFlags line holds the two-letter flag. */
static bool has_flag(const char *line, const char *flag)
{
    for (const char *t = line + 8; (t = strstr(t, flag)) != NULL; t += 2)
        if (t[-1] == ' ' && (t[2] == ' ' || t[2] == '\n' || t[2] == '\0')) return true;
    return false;
}

static void test_alloc_large(void)
{
    pa_cache c;
    /* 256 blocks x 16 tokens x 8 heads x 128 dims of bf16: 8 MiB per pool */
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_HND, PA_DTYPE_BF16, 256, 16, 8, 128));
    CHECK_OK(pa_cache_alloc(&c));
    CHECK(((uintptr_t)c.key % (2u << 20)) == 0 && ((uintptr_t)c.value % (2u << 20)) == 0);
    const uint8_t *k = c.key, *v = c.value;
    size_t bytes = (size_t)8 << 20, nonzero = 0;
    for (size_t i = 0; i < bytes; i += 4093) nonzero += k[i] | v[i];
    nonzero += k[bytes - 1] | v[bytes - 1];
    CHECK_INT((int)nonzero, 0);
#if defined(__linux__)
    /* (a kernel without transparent huge pages refuses the advice: nothing to check there) */
    FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[512];
    if (thp && vma_flags(c.key, line, sizeof line)) {
        CHECK(has_flag(line, "hg"));
        CHECK(vma_flags(c.value, line, sizeof line) && has_flag(line, "hg"));
        CHECK(vma_flags(v + bytes - 1, line, sizeof line) && has_flag(line, "hg"));
    } else {
        printf("  (skipped the huge-page advice check: no THP in this kernel, or no VmFlags in "
               "/proc/self/smaps)\n");
    }
    if (thp) fclose(thp);
#endif
    pa_cache_free(&c);
}

/* ---- copy_blocks ------------------------------------------------------------------------------ */

/* Three layers (NHD f32, HND f16, interleaved fp8), 6 blocks each, pairs (1->4), (1->5), (2->0):
 * one source feeds two destinations. Afterwards block 4 and 5 equal the old block 1, block 0
 * equals the old block 2, and blocks 1, 2, 3 are byte-identical to before, in every layer. */
static void test_copy_blocks(void)
{
    enum { NB = 6, BS = 3, H = 2, D = 2, PER = BS * H * D };
    pa_cache c[3];
    CHECK_OK(pa_cache_init(&c[0], PA_LAYOUT_NHD, PA_DTYPE_F32, NB, BS, H, D));
    CHECK_OK(pa_cache_init(&c[1], PA_LAYOUT_HND, PA_DTYPE_F16, NB, BS, H, D));
    CHECK_OK(pa_cache_init(&c[2], PA_LAYOUT_NHD, PA_DTYPE_FP8_E5M2, NB, BS, H, D));
    c[2].block_stride = 2 * PER;
    static uint8_t k0[NB * PER * 4], v0[NB * PER * 4], k1[NB * PER * 2], v1[NB * PER * 2];
    static uint8_t kv2[NB * 2 * PER];
    uint8_t *bufs[5] = {k0, v0, k1, v1, kv2};
    size_t sizes[5] = {sizeof k0, sizeof v0, sizeof k1, sizeof v1, sizeof kv2};
    for (int b = 0; b < 5; b++)
        for (size_t i = 0; i < sizes[b]; i++) bufs[b][i] = (uint8_t)(i * 7 + b * 31 + 1);
    c[0].key = k0, c[0].value = v0;
    c[1].key = k1, c[1].value = v1;
    c[2].key = kv2, c[2].value = kv2 + PER;
    static uint8_t before[5][NB * PER * 4];
    for (int b = 0; b < 5; b++) memcpy(before[b], bufs[b], sizes[b]);
    const int64_t pairs[6] = {1, 4, 1, 5, 2, 0};
    CHECK_OK(pa_cache_copy_blocks(NULL, c, 3, pairs, 3));
    /* where block `blk` of each pool starts, in bytes, and its length */
    const int src_of[NB] = {2, 1, 2, 3, 1, 1}; /* block b now holds old block src_of[b] */
    for (int b = 0; b < 4; b++) {
        size_t blk = sizes[b] / NB;
        for (int x = 0; x < NB; x++)
            CHECK(memcmp(bufs[b] + x * blk, before[b] + src_of[x] * blk, blk) == 0);
    }
    for (int x = 0; x < NB; x++) /* interleaved: key half then value half of each block */
        CHECK(memcmp(kv2 + x * 2 * PER, before[4] + src_of[x] * 2 * PER, 2 * PER) == 0);
    /* a spot value, NHD f32 layer: block 4, token 2, head 1, dim 1 == old block 1's */
    float now, old;
    memcpy(&now, k0 + (4 * PER + 2 * 4 + 1 * 2 + 1) * 4, 4);
    memcpy(&old, before[0] + (1 * PER + 2 * 4 + 1 * 2 + 1) * 4, 4);
    CHECK(memcmp(&now, &old, 4) == 0);
    /* zero pairs and zero layers are no-ops */
    for (int b = 0; b < 5; b++) memcpy(before[b], bufs[b], sizes[b]);
    CHECK_OK(pa_cache_copy_blocks(NULL, c, 3, NULL, 0));
    CHECK_OK(pa_cache_copy_blocks(NULL, NULL, 0, pairs, 3));
    for (int b = 0; b < 5; b++) CHECK(memcmp(before[b], bufs[b], sizes[b]) == 0);
}

/* ---- swap_blocks ------------------------------------------------------------------------------ */

/* NHD f16 source (4 blocks) -> HND f16 destination (5 blocks), 3 tokens x 2 heads x 2 dims;
 * pairs (0->3), (2->1). dst block 3 token t head h dim d == src block 0 (t, h, d), and so on;
 * dst blocks 0, 2, 4 and the whole src are unchanged. Then back again HND -> NHD. */
static void test_swap_blocks(void)
{
    enum { BS = 3, H = 2, D = 2, PER = BS * H * D };
    pa_cache s, d;
    CHECK_OK(pa_cache_init(&s, PA_LAYOUT_NHD, PA_DTYPE_F16, 4, BS, H, D));
    CHECK_OK(pa_cache_init(&d, PA_LAYOUT_HND, PA_DTYPE_F16, 5, BS, H, D));
    uint16_t sk[4 * PER], sv[4 * PER], dk[5 * PER], dv[5 * PER];
    for (int i = 0; i < 4 * PER; i++) sk[i] = (uint16_t)(0x1000 + i), sv[i] = (uint16_t)(0x2000 + i);
    for (int i = 0; i < 5 * PER; i++) dk[i] = dv[i] = 0xFFFF;
    s.key = sk, s.value = sv, d.key = dk, d.value = dv;
    uint16_t sk0[4 * PER], sv0[4 * PER];
    memcpy(sk0, sk, sizeof sk);
    memcpy(sv0, sv, sizeof sv);
    const int64_t pairs[4] = {0, 3, 2, 1};
    CHECK_OK(pa_cache_swap_blocks(NULL, &s, &d, pairs, 2));
    CHECK(memcmp(sk, sk0, sizeof sk) == 0 && memcmp(sv, sv0, sizeof sv) == 0);
    for (int t = 0; t < BS; t++)
        for (int h = 0; h < H; h++)
            for (int e = 0; e < D; e++) {
                /* NHD src offset b*12 + t*4 + h*2 + e; HND dst offset b*12 + h*6 + t*2 + e */
                CHECK_INT(dk[3 * PER + h * 6 + t * 2 + e], 0x1000 + 0 * PER + t * 4 + h * 2 + e);
                CHECK_INT(dv[3 * PER + h * 6 + t * 2 + e], 0x2000 + 0 * PER + t * 4 + h * 2 + e);
                CHECK_INT(dk[1 * PER + h * 6 + t * 2 + e], 0x1000 + 2 * PER + t * 4 + h * 2 + e);
                CHECK_INT(dv[1 * PER + h * 6 + t * 2 + e], 0x2000 + 2 * PER + t * 4 + h * 2 + e);
            }
    /* explicit: dst block 3, head 1, token 2, dim 1 = dk[36 + 6 + 4 + 1] = dk[47]
     *         = src block 0, token 2, head 1, dim 1 = 0x1000 + 8 + 2 + 1 = 0x100B */
    CHECK_INT(dk[47], 0x100B);
    int untouched = 0;
    for (int b = 0; b < 5; b++)
        if (b == 0 || b == 2 || b == 4)
            for (int i = 0; i < PER; i++) untouched += dk[b * PER + i] == 0xFFFF && dv[b * PER + i] == 0xFFFF;
    CHECK_INT(untouched, 3 * PER);
    /* read_token agrees across layouts: src slot 0*3+1 == dst slot 3*3+1 */
    float a[4], b2[4];
    CHECK_OK(pa_cache_read_token(&s, 1, 1.0f, 1.0f, a, NULL));
    CHECK_OK(pa_cache_read_token(&d, 10, 1.0f, 1.0f, b2, NULL));
    CHECK(memcmp(a, b2, sizeof a) == 0);
    /* and back: dst block 1 -> src block 3 (HND -> NHD) */
    const int64_t back[2] = {1, 3};
    CHECK_OK(pa_cache_swap_blocks(NULL, &d, &s, back, 1));
    CHECK(memcmp(sk + 3 * PER, sk0 + 2 * PER, PER * 2) == 0);
    CHECK(memcmp(sv + 3 * PER, sv0 + 2 * PER, PER * 2) == 0);
    CHECK(memcmp(sk, sk0, 3 * PER * 2) == 0);
}

/* ---- merge_states ----------------------------------------------------------------------------- */

static void test_merge_f32(void)
{
    /* 6 tokens x 1 head x 2 dims:
     *   t0: lse 0, 0          -> (a + b) / 2,        lse ln 2
     *   t1: lse ln 3, 0       -> 3/4 a + 1/4 b,      lse ln 4
     *   t2: lse -inf, 5       -> b (a = NaN ignored), lse 5
     *   t3: lse +inf, 2       -> +inf is -inf: b,    lse 2
     *   t4: lse -inf, -inf    -> 0 (NaN inputs),     lse -inf
     *   t5: lse +inf, +inf    -> 0,                  lse -inf */
    const float lse_a[6] = {0.0f, logf(3.0f), -INFINITY, INFINITY, -INFINITY, INFINITY};
    const float lse_b[6] = {0.0f, 0.0f, 5.0f, 2.0f, -INFINITY, INFINITY};
    const float a[12] = {1, 2, 4, 0, NAN, NAN, NAN, 9, NAN, NAN, 7, 7};
    const float b[12] = {3, 6, 0, 8, 1.5f, -2, 3, 4, NAN, NAN, 7, 7};
    float out[12], out_lse[6];
    for (int i = 0; i < 12; i++) out[i] = 99.0f;
    pa_merge_args m = {6, 1, 2, PA_DTYPE_F32, a, lse_a, b, lse_b, out, out_lse, 0, 0};
    CHECK_OK(pa_merge_states(NULL, &m));
    CHECK_NEAR(out[0], 2.0, 1e-6);
    CHECK_NEAR(out[1], 4.0, 1e-6);
    CHECK_NEAR(out_lse[0], 0.69314718, 1e-6);
    CHECK_NEAR(out[2], 3.0, 1e-6);
    CHECK_NEAR(out[3], 2.0, 1e-6);
    CHECK_NEAR(out_lse[1], 1.38629436, 1e-6);
    CHECK(out[4] == 1.5f && out[5] == -2.0f && out_lse[2] == 5.0f);
    CHECK(out[6] == 3.0f && out[7] == 4.0f && out_lse[3] == 2.0f);
    CHECK(out[8] == 0.0f && out[9] == 0.0f && out_lse[4] == -INFINITY);
    CHECK(out[10] == 0.0f && out[11] == 0.0f && out_lse[5] == -INFINITY);
    /* out_lse NULL: out still written */
    for (int i = 0; i < 12; i++) out[i] = 99.0f;
    m.out_lse = NULL;
    CHECK_OK(pa_merge_states(NULL, &m));
    CHECK_NEAR(out[0], 2.0, 1e-6);
    CHECK(out[10] == 0.0f);
    /* IEEE arithmetic (pagedattn.h): a NaN LSE gives a NaN row and LSE (until 2026-11-30: out 0,
     * LSE -inf); a part whose weight underflows to 0 still multiplies in, so its NaN shows,
     * while an empty part's (LSE -inf, t2 above) does not */
    {
        const float na[3] = {0.0f, NAN, 0.0f}, nb[3] = {NAN, NAN, -200.0f};
        const float xa[6] = {1, 2, 3, 4, 5, 6}, xb[6] = {7, 8, 9, 10, NAN, 11};
        float xo[6], xl[3];
        pa_merge_args mn = {3, 1, 2, PA_DTYPE_F32, xa, na, xb, nb, xo, xl, 0, 0};
        CHECK_OK(pa_merge_states(NULL, &mn));
        CHECK(isnan(xo[0]) && isnan(xo[1]) && isnan(xl[0]));
        CHECK(isnan(xo[2]) && isnan(xo[3]) && isnan(xl[1]));
        CHECK(isnan(xo[4]) && xo[5] == 6.0f && xl[2] == 0.0f);
    }
    /* a lopsided merge: lse 100 vs 0: weight of b is e^-100, out == a to f32 precision */
    const float la2 = 100.0f, lb2 = 0.0f, a2[2] = {1, -1}, b2[2] = {1000, 1000};
    float o2[2], ol2;
    pa_merge_args m2 = {1, 1, 2, PA_DTYPE_F32, a2, &la2, b2, &lb2, o2, &ol2, 0, 0};
    CHECK_OK(pa_merge_states(NULL, &m2));
    CHECK(o2[0] == 1.0f && o2[1] == -1.0f && ol2 == 100.0f);
}

/* f16 / bf16: the merged value is rounded once, to nearest even. Equal LSEs average:
 *   f16 (0x3C00 + 0x3C01) / 2 = 1 + 2^-11: a tie, to even 0x3C00;
 *       (0x3C01 + 0x3C02) / 2 = 1 + 3*2^-11: a tie, to even 0x3C02;
 *       (0x3C00 + 0x3C03) / 2 = 1 + 3*2^-11 too -> 0x3C02;  (1.0 + 2.0) / 2 = 1.5 = 0x3E00
 *   bf16 likewise with 0x3F80.. and 2^-8. */
static void test_merge_16bit(void)
{
    for (int bf = 0; bf < 2; bf++) {
        uint16_t one = bf ? 0x3F80 : 0x3C00, two = bf ? 0x4000 : 0x4000;
        const uint16_t a[4] = {one, (uint16_t)(one + 1), one, one};
        const uint16_t b[4] = {(uint16_t)(one + 1), (uint16_t)(one + 2), (uint16_t)(one + 3), two};
        const float la[2] = {1.25f, 1.25f}, lb[2] = {1.25f, 1.25f};
        uint16_t out[4] = {0, 0, 0, 0};
        float ol[2];
        pa_merge_args m = {2, 1, 2, bf ? PA_DTYPE_BF16 : PA_DTYPE_F16, a, la, b, lb, out, ol, 0, 0};
        CHECK_OK(pa_merge_states(NULL, &m));
        CHECK_INT(out[0], one);
        CHECK_INT(out[1], one + 2);
        CHECK_INT(out[2], one + 2);
        CHECK_INT(out[3], bf ? 0x3FC0 : 0x3E00);
        CHECK_NEAR(ol[0], 1.25 + 0.69314718, 1e-6);
    }
}

/* LSE strides [H, T] (FlashAttention's layout), with padding: 3 tokens x 2 heads x 1 dim,
 * lse_token_stride 1, lse_head_stride 4: lse of (t, h) at h*4 + t; index 3 and 7 are padding
 * and must stay untouched in out_lse. */
static void test_merge_lse_strides(void)
{
    /* token-major out [t][h]; per (t, h): la = ln w, lb = 0 so coefficient of a = w/(w+1) */
    const float a[6] = {1, 10, 2, 20, 3, 30}, b[6] = {0, 0, 0, 0, 0, 0};
    float la[8], lb[8], ol[8];
    for (int i = 0; i < 8; i++) la[i] = lb[i] = NAN, ol[i] = 42.0f;
    /* (t, h) -> weight of a relative to b: (0,0) 1, (1,0) 3, (2,0) 0 (la -inf); (0,1) 0,
     * (1,1) 1, (2,1) 3 */
    la[0] = 0.0f, la[1] = logf(3.0f), la[2] = -INFINITY;
    la[4] = -INFINITY, la[5] = 0.0f, la[6] = logf(3.0f);
    lb[0] = lb[1] = lb[2] = 0.0f;
    lb[4] = lb[5] = lb[6] = 0.0f;
    float out[6];
    pa_merge_args m = {3, 2, 1, PA_DTYPE_F32, a, la, b, lb, out, ol, 1, 4};
    CHECK_OK(pa_merge_states(NULL, &m));
    CHECK_NEAR(out[0], 0.5, 1e-6);  /* t0 h0: 1 * 1/2 */
    CHECK_NEAR(out[1], 0.0, 1e-6);  /* t0 h1: weight of a is 0 */
    CHECK_NEAR(out[2], 1.5, 1e-6);  /* t1 h0: 2 * 3/4 */
    CHECK_NEAR(out[3], 10.0, 1e-6); /* t1 h1: 20 * 1/2 */
    CHECK_NEAR(out[4], 0.0, 1e-6);  /* t2 h0 */
    CHECK_NEAR(out[5], 22.5, 1e-5); /* t2 h1: 30 * 3/4 */
    CHECK_NEAR(ol[0], 0.69314718, 1e-6);
    CHECK_NEAR(ol[1], 1.38629436, 1e-6);
    CHECK_NEAR(ol[2], 0.0, 1e-6);
    CHECK_NEAR(ol[4], 0.0, 1e-6);
    CHECK_NEAR(ol[5], 0.69314718, 1e-6);
    CHECK_NEAR(ol[6], 1.38629436, 1e-6);
    CHECK(ol[3] == 42.0f && ol[7] == 42.0f);
}

int main(void)
{
    test_init_strides();
    test_write_f32_layouts();
    test_write_fp8();
    test_write_16bit();
    test_write_fused_qkv();
    test_write_interleaved();
    test_write_block_size_1();
    test_overlapping_pools();
    test_alloc();
    test_alloc_large();
    test_copy_blocks();
    test_swap_blocks();
    test_merge_f32();
    test_merge_16bit();
    test_merge_lse_strides();
    return test_exit();
}
