/* test_dtype.c: dtype names/sizes/parsing, and the scalar and buffer conversions checked
 * exhaustively (every 16-bit and 8-bit pattern) and against an independent oracle that finds
 * the nearest representable value by search over a table decoded with ldexp from the field
 * formulas. */
#include "test.h"

#include <float.h>
#include <stdbool.h>
#include <stdint.h>

/* ---- independent model of the formats ------------------------------------------------------ */

typedef struct fmt {
    const char *name;
    int exp_bits, man_bits, bias;
    uint32_t max_code;      /* magnitude code of the largest finite value */
    uint32_t overflow_code; /* magnitude code a too-large value becomes (inf or max: saturation) */
    bool has_inf;           /* exponent field all ones + mantissa 0 = inf (IEEE-like) */
    float (*decode)(uint32_t code);
    uint32_t (*encode)(float f);
    double *tab; /* tab[c] = value of magnitude code c for c <= max_code + 1, where max_code + 1
                    is the "virtual" next value the exponent range would give if unbounded */
} fmt;

static float dec_f16(uint32_t c) { return pa_f16_to_f32((uint16_t)c); }
static float dec_bf16(uint32_t c) { return pa_bf16_to_f32((uint16_t)c); }
static float dec_e4m3(uint32_t c) { return pa_fp8e4m3_to_f32((uint8_t)c); }
static float dec_e5m2(uint32_t c) { return pa_fp8e5m2_to_f32((uint8_t)c); }
static uint32_t enc_f16(float f) { return pa_f32_to_f16(f); }
static uint32_t enc_bf16(float f) { return pa_f32_to_bf16(f); }
static uint32_t enc_e4m3(float f) { return pa_f32_to_fp8e4m3(f); }
static uint32_t enc_e5m2(float f) { return pa_f32_to_fp8e5m2(f); }

static fmt F16 = {"f16", 5, 10, 15, 0x7bff, 0x7c00, true, dec_f16, enc_f16, NULL};
static fmt BF16 = {"bf16", 8, 7, 127, 0x7f7f, 0x7f80, true, dec_bf16, enc_bf16, NULL};
static fmt E4M3 = {"e4m3", 4, 3, 7, 0x7e, 0x7e, false, dec_e4m3, enc_e4m3, NULL};
static fmt E5M2 = {"e5m2", 5, 2, 15, 0x7b, 0x7b, true, dec_e5m2, enc_e5m2, NULL};
static fmt *const FORMATS[] = {&F16, &BF16, &E4M3, &E5M2};

static int bits(const fmt *f) { return 1 + f->exp_bits + f->man_bits; }
static uint32_t sign_bit(const fmt *f) { return 1u << (f->exp_bits + f->man_bits); }

/* The value of a magnitude code by the field formulas, ignoring special encodings. */
static double field_value(const fmt *f, uint32_t mag)
{
    uint32_t ef = mag >> f->man_bits, m = mag & ((1u << f->man_bits) - 1);
    if (ef == 0) return ldexp((double)m, 1 - f->bias - f->man_bits);
    return ldexp((double)((1u << f->man_bits) + m), (int)ef - f->bias - f->man_bits);
}

static bool code_is_nan(const fmt *f, uint32_t code)
{
    uint32_t mag = code & (sign_bit(f) - 1);
    uint32_t ef_all = (1u << f->exp_bits) - 1;
    if (!f->has_inf) return mag == (sign_bit(f) - 1); /* e4m3: S.1111.111 only */
    return (mag >> f->man_bits) == ef_all && (mag & ((1u << f->man_bits) - 1)) != 0;
}

static bool code_is_inf(const fmt *f, uint32_t code)
{
    uint32_t mag = code & (sign_bit(f) - 1);
    return f->has_inf && mag == ((1u << f->exp_bits) - 1) << f->man_bits;
}

/* The expected decoded value (NaN for NaN codes). */
static double expect_decode(const fmt *f, uint32_t code)
{
    double s = (code & sign_bit(f)) ? -1.0 : 1.0;
    if (code_is_nan(f, code)) return NAN;
    if (code_is_inf(f, code)) return s * INFINITY;
    return s * field_value(f, code & (sign_bit(f) - 1));
}

static uint32_t f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static float u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Oracle: the code of the representable value nearest x, ties to the even code (mantissa LSB 0),
 * by binary search over the decoded table; values rounding to the virtual code past max_code
 * (or beyond) become overflow_code. Not for NaN. */
static uint32_t oracle_encode(const fmt *f, float x)
{
    uint32_t sign = signbit(x) ? sign_bit(f) : 0;
    double ax = fabs((double)x);
    uint32_t virt = f->max_code + 1;
    if (isinf(x) || ax >= f->tab[virt]) return sign | f->overflow_code;
    uint32_t lo = 0, hi = virt; /* invariant: tab[lo] <= ax < tab[hi] */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (f->tab[mid] <= ax) lo = mid;
        else hi = mid;
    }
    uint32_t c;
    double twice = 2.0 * ax, sum = f->tab[lo] + f->tab[hi]; /* both exact in double */
    if (f->tab[lo] == ax || twice < sum) c = lo;
    else if (twice > sum) c = hi;
    else c = (lo & 1) ? hi : lo;
    if (c == virt) c = f->overflow_code;
    return sign | c;
}

/* Reports only the first few mismatches of each kind, counts them all. */
static int mismatches;
#define MISMATCH(...)                                                                        \
    do {                                                                                     \
        if (mismatches++ < 25) TEST_FAIL(__VA_ARGS__);                                       \
        else test__failures++;                                                               \
    } while (0)

/* The expected NaN code for an f32 NaN of the given sign. */
static void check_nan_encoding(const fmt *f, float x)
{
    uint32_t got = f->encode(x);
    test__checks++;
    bool sign_ok = !!(got & sign_bit(f)) == !!signbit(x);
    bool ok = code_is_nan(f, got) && sign_ok;
    if (f == &F16) ok = ok && (got & 0x7fff) == 0x7e00;
    if (f == &E4M3) ok = ok && (got & 0x7f) == 0x7f;
    if (f == &E5M2) ok = ok && (got & 0x7f) == 0x7e;
    if (f == &BF16) ok = ok && (got & 0x40); /* quiet */
    if (!ok) MISMATCH("%s: encode(NaN 0x%08x) = 0x%x, want a (quiet) NaN of the same sign",
                      f->name, (unsigned)f2u(x), (unsigned)got);
}

/* Checks encode(x) against the oracle (NaN: a NaN of the same sign). */
static void check_encode(const fmt *f, float x)
{
    if (isnan(x)) {
        check_nan_encoding(f, x);
        return;
    }
    uint32_t got = f->encode(x), want = oracle_encode(f, x);
    test__checks++;
    if (got != want)
        MISMATCH("%s: encode(%a = 0x%08x) = 0x%x, want 0x%x", f->name, (double)x,
                 (unsigned)f2u(x), (unsigned)got, (unsigned)want);
}

/* Checks encode(x) against an explicitly stated expectation. */
static void check_encode_is(const fmt *f, float x, uint32_t want)
{
    uint32_t got = f->encode(x);
    test__checks++;
    if (got != want)
        MISMATCH("%s: encode(%a) = 0x%x, want 0x%x", f->name, (double)x, (unsigned)got,
                 (unsigned)want);
}

static void build_tables(void)
{
    for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++) {
        fmt *f = FORMATS[i];
        f->tab = malloc(sizeof(double) * (f->max_code + 2));
        for (uint32_t c = 0; c <= f->max_code + 1; c++) f->tab[c] = field_value(f, c);
    }
    /* The table is strictly increasing, and the virtual code has the value named in the spec. */
    for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++) {
        const fmt *f = FORMATS[i];
        bool increasing = true;
        for (uint32_t c = 0; c <= f->max_code; c++) increasing &= f->tab[c] < f->tab[c + 1];
        CHECK(increasing);
    }
    CHECK(F16.tab[F16.max_code] == 65504.0 && F16.tab[F16.max_code + 1] == 65536.0);
    CHECK(E4M3.tab[E4M3.max_code] == 448.0 && E4M3.tab[E4M3.max_code + 1] == 480.0);
    CHECK(E5M2.tab[E5M2.max_code] == 57344.0 && E5M2.tab[E5M2.max_code + 1] == 65536.0);
    CHECK(BF16.tab[BF16.max_code] == ldexp(255.0, 120));
    CHECK(E4M3.tab[1] == ldexp(1.0, -9) && E5M2.tab[1] == ldexp(1.0, -16));
    CHECK(F16.tab[1] == ldexp(1.0, -24) && BF16.tab[1] == ldexp(1.0, -133));
}

/* ---- 1. every pattern decodes to the field value and re-encodes to itself -------------------- */

static void test_exhaustive_patterns(const fmt *f)
{
    uint32_t n = 1u << bits(f);
    for (uint32_t code = 0; code < n; code++) {
        float got = f->decode(code);
        double want = expect_decode(f, code);
        bool neg = (code & sign_bit(f)) != 0;
        test__checks++;
        if (isnan(want)) {
            if (!isnan(got) || !!signbit(got) != neg)
                MISMATCH("%s: decode(0x%x) = %a, want NaN of sign %d", f->name, (unsigned)code,
                         (double)got, neg);
            check_nan_encoding(f, got); /* NaN stays NaN, sign kept */
            continue;
        }
        if ((double)got != want || !!signbit(got) != neg) {
            MISMATCH("%s: decode(0x%x) = %a, want %a", f->name, (unsigned)code, (double)got, want);
            continue;
        }
        uint32_t back = f->encode(got);
        uint32_t want_back = code;
        if (code_is_inf(f, code) && f->overflow_code != (code & (sign_bit(f) - 1)))
            want_back = (code & sign_bit(f)) | f->overflow_code; /* e5m2 inf saturates */
        test__checks++;
        if (back != want_back)
            MISMATCH("%s: encode(decode(0x%x) = %a) = 0x%x, want 0x%x", f->name, (unsigned)code,
                     (double)got, (unsigned)back, (unsigned)want_back);
    }
}

/* ---- 2. rounding at every midpoint of adjacent codes ---------------------------------------- */

static void test_midpoints(const fmt *f)
{
    for (uint32_t c = 0; c <= f->max_code; c++) {
        uint32_t up = c + 1 == f->max_code + 1 ? f->overflow_code : c + 1;
        uint32_t even = (c & 1) ? up : c;
        double midd = 0.5 * (f->tab[c] + f->tab[c + 1]);
        float mid = (float)midd;
        test__checks++;
        if ((double)mid != midd) {
            MISMATCH("%s: midpoint after 0x%x not exact in f32", f->name, (unsigned)c);
            continue;
        }
        float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
        float at = (float)f->tab[c];
        for (int s = 0; s < 2; s++) {
            float sg = s ? -1.0f : 1.0f;
            uint32_t sb = s ? sign_bit(f) : 0;
            check_encode_is(f, sg * mid, sb | even);
            check_encode_is(f, sg * below, sb | c);
            check_encode_is(f, sg * above, sb | up);
            if (c <= f->max_code && (double)at == f->tab[c]) {
                check_encode_is(f, sg * at, sb | c);
                if (c > 0) check_encode_is(f, sg * nextafterf(at, 0.0f), sb | c);
                check_encode_is(f, sg * nextafterf(at, INFINITY), sb | c);
            }
            /* The same points through the oracle, to keep oracle and expectations honest. */
            check_encode(f, sg * mid);
            check_encode(f, sg * below);
            check_encode(f, sg * above);
        }
    }
}

/* ---- 3. edge values stated by hand ---------------------------------------------------------- */

static void test_edges(void)
{
    const fmt *all[] = {&F16, &BF16, &E4M3, &E5M2};
    for (int i = 0; i < 4; i++) {
        const fmt *f = all[i];
        uint32_t sb = sign_bit(f);
        check_encode_is(f, 0.0f, 0);
        check_encode_is(f, -0.0f, sb);
        check_encode_is(f, INFINITY, f->overflow_code);
        check_encode_is(f, -INFINITY, sb | f->overflow_code);
        check_encode_is(f, FLT_MAX, f->overflow_code);
        check_encode_is(f, -FLT_MAX, sb | f->overflow_code);
        check_nan_encoding(f, NAN);
        check_nan_encoding(f, -NAN);
        check_nan_encoding(f, u2f(0x7f800001u)); /* signaling NaN, smallest payload */
        check_nan_encoding(f, u2f(0xff800001u));
        check_nan_encoding(f, u2f(0x7fffffffu));
        /* Decoded zeros keep their sign. */
        CHECK(f->decode(0) == 0.0f && !signbit(f->decode(0)));
        CHECK(f->decode(sb) == 0.0f && signbit(f->decode(sb)));
    }
    /* Float subnormals: zero for f16 and fp8, correctly rounded for bf16. */
    float fsub[] = {FLT_TRUE_MIN, 1e-40f, FLT_MIN * 0.5f, nextafterf(FLT_MIN, 0.0f)};
    for (int i = 0; i < 4; i++) {
        check_encode_is(&F16, fsub[i], 0);
        check_encode_is(&E4M3, fsub[i], 0);
        check_encode_is(&E5M2, -fsub[i], 0x80);
        check_encode(&BF16, fsub[i]);
        check_encode(&BF16, -fsub[i]);
    }
    check_encode_is(&BF16, FLT_MIN, 0x0080);
    check_encode_is(&BF16, ldexpf(1.0f, -133), 0x0001);
    check_encode_is(&BF16, ldexpf(1.0f, -134), 0x0000); /* tie to even: 0 */
    check_encode_is(&BF16, ldexpf(3.0f, -134), 0x0002); /* tie between 1 and 2: even 2 */
    check_encode_is(&BF16, nextafterf(ldexpf(1.0f, -134), 1.0f), 0x0001);
    check_encode_is(&BF16, 1.0f, 0x3f80);
    check_encode_is(&BF16, u2f(0x3f808000u), 0x3f80); /* tie, even down */
    check_encode_is(&BF16, u2f(0x3f818000u), 0x3f82); /* tie, even up */
    check_encode_is(&BF16, u2f(0x3fff8000u), 0x4000); /* carry into the next binade */
    check_encode_is(&BF16, u2f(0x7f7f8000u), 0x7f80); /* tie at max: inf */
    check_encode_is(&BF16, u2f(0x7f7f7fffu), 0x7f7f);

    /* f16 */
    check_encode_is(&F16, 1.0f, 0x3c00);
    check_encode_is(&F16, -2.0f, 0xc000);
    check_encode_is(&F16, 65504.0f, 0x7bff);
    check_encode_is(&F16, 65519.99f, 0x7bff);
    check_encode_is(&F16, 65520.0f, 0x7c00); /* tie: rounds to even = inf */
    check_encode_is(&F16, 70000.0f, 0x7c00);
    check_encode_is(&F16, ldexpf(1.0f, -24), 0x0001);
    check_encode_is(&F16, ldexpf(1.0f, -25), 0x0000); /* tie with 0: even */
    check_encode_is(&F16, nextafterf(ldexpf(1.0f, -25), 1.0f), 0x0001);
    check_encode_is(&F16, ldexpf(3.0f, -25), 0x0002);
    check_encode_is(&F16, ldexpf(1.0f, -14), 0x0400);                      /* min normal */
    check_encode_is(&F16, ldexpf(1.0f, -14) - ldexpf(1.0f, -25), 0x0400);  /* carry sub->normal */
    check_encode_is(&F16, 2047.0f / 1024.0f + 1.0f / 2048.0f, 0x4000);     /* carry exponent */
    check_encode_is(&F16, 1.0f + 1.0f / 2048.0f, 0x3c00);                  /* tie down */
    check_encode_is(&F16, 1.0f + 3.0f / 2048.0f, 0x3c02);                  /* tie up */
    CHECK(pa_f16_to_f32(0x7c00) == INFINITY && pa_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(pa_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(pa_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));

    /* e4m3 (saturating) */
    check_encode_is(&E4M3, 448.0f, 0x7e);
    check_encode_is(&E4M3, 449.0f, 0x7e);
    check_encode_is(&E4M3, 463.99f, 0x7e);
    check_encode_is(&E4M3, 464.0f, 0x7e); /* would round to 480, which does not exist */
    check_encode_is(&E4M3, 465.0f, 0x7e);
    check_encode_is(&E4M3, 480.0f, 0x7e);
    check_encode_is(&E4M3, 1e9f, 0x7e);
    check_encode_is(&E4M3, -1e9f, 0xfe);
    check_encode_is(&E4M3, 416.0f, 0x7d);
    check_encode_is(&E4M3, 432.0f, 0x7e); /* tie between 416 (0x7d) and 448 (0x7e): even */
    check_encode_is(&E4M3, ldexpf(1.0f, -9), 0x01);
    check_encode_is(&E4M3, ldexpf(1.0f, -10), 0x00);
    check_encode_is(&E4M3, nextafterf(ldexpf(1.0f, -10), 1.0f), 0x01);
    check_encode_is(&E4M3, -ldexpf(1.0f, -11), 0x80);
    check_encode_is(&E4M3, ldexpf(15.0f, -10), 0x08); /* 7.5 * 2^-9: tie 7 -> 8 (min normal) */
    check_encode_is(&E4M3, 1.0f, 0x38);
    check_encode_is(&E4M3, 1.0625f, 0x38); /* tie down */
    check_encode_is(&E4M3, 1.1875f, 0x3a); /* tie up */
    check_encode_is(&E4M3, 1.9375f, 0x40); /* tie carries to 2.0 */
    CHECK(isnan(pa_fp8e4m3_to_f32(0x7f)) && isnan(pa_fp8e4m3_to_f32(0xff)));
    CHECK(pa_fp8e4m3_to_f32(0x7e) == 448.0f && pa_fp8e4m3_to_f32(0xfe) == -448.0f);
    CHECK(pa_fp8e4m3_to_f32(0x78) == 256.0f); /* exponent field 15 is finite in e4m3 */
    CHECK(pa_fp8e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    CHECK(pa_fp8e4m3_to_f32(0x07) == ldexpf(7.0f, -9));
    CHECK(pa_fp8e4m3_to_f32(0x08) == ldexpf(1.0f, -6));

    /* e5m2 (saturating) */
    check_encode_is(&E5M2, 57344.0f, 0x7b);
    check_encode_is(&E5M2, 61439.0f, 0x7b);
    check_encode_is(&E5M2, 61440.0f, 0x7b); /* tie to 65536, which is inf: saturate */
    check_encode_is(&E5M2, 65536.0f, 0x7b);
    check_encode_is(&E5M2, 1e20f, 0x7b);
    check_encode_is(&E5M2, -INFINITY, 0xfb);
    check_encode_is(&E5M2, ldexpf(1.0f, -16), 0x01);
    check_encode_is(&E5M2, ldexpf(1.0f, -17), 0x00);
    check_encode_is(&E5M2, ldexpf(3.0f, -17), 0x02);
    check_encode_is(&E5M2, 1.0f, 0x3c);
    check_encode_is(&E5M2, 1.125f, 0x3c);
    check_encode_is(&E5M2, 1.375f, 0x3e);
    CHECK(pa_fp8e5m2_to_f32(0x7c) == INFINITY && pa_fp8e5m2_to_f32(0xfc) == -INFINITY);
    CHECK(isnan(pa_fp8e5m2_to_f32(0x7d)) && isnan(pa_fp8e5m2_to_f32(0xff)));
    CHECK(pa_fp8e5m2_to_f32(0x7b) == 57344.0f);
    CHECK(pa_fp8e5m2_to_f32(0x03) == ldexpf(3.0f, -16));
}

/* ---- 4. randomized sweeps against the oracle ----------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static void test_random(void)
{
    /* Uniform random f32 bit patterns: every exponent, NaNs and infinities included. */
    for (int i = 0; i < 3000000; i++) {
        float x = u2f((uint32_t)(rng() >> 32));
        for (int k = 0; k < 4; k++) check_encode(FORMATS[k], x);
    }
    /* Random f32 within (and a little around) each format's range, where rounding matters. */
    for (int k = 0; k < 4; k++) {
        const fmt *f = FORMATS[k];
        int emin = 1 - f->bias - f->man_bits - 3;    /* below the smallest subnormal */
        int emax = (1 << f->exp_bits) - f->bias + 1; /* beyond the largest finite */
        if (emin < -149) emin = -149;
        if (emax > 127) emax = 127;
        for (int i = 0; i < 1000000; i++) {
            uint64_t r = rng();
            int e = emin + (int)((r >> 40) % (uint64_t)(emax - emin + 1));
            uint32_t mant = (uint32_t)r & 0x7fffffu;
            uint32_t u = e >= -126 ? ((uint32_t)(e + 127) << 23) | mant
                                   : (mant | 0x800000u) >> (-126 - e); /* f32 subnormal */
            if (r & (1ull << 63)) u |= 0x80000000u;
            check_encode(f, u2f(u));
        }
    }
}

/* ---- 5. names, sizes, parsing ---------------------------------------------------------------- */

static void test_names(void)
{
    CHECK_INT(pa_dtype_size(PA_DTYPE_F32), 4);
    CHECK_INT(pa_dtype_size(PA_DTYPE_F16), 2);
    CHECK_INT(pa_dtype_size(PA_DTYPE_BF16), 2);
    CHECK_INT(pa_dtype_size(PA_DTYPE_FP8_E4M3), 1);
    CHECK_INT(pa_dtype_size(PA_DTYPE_FP8_E5M2), 1);
    CHECK_INT(pa_dtype_size(PA_DTYPE_COUNT_), 0);
    CHECK_INT(pa_dtype_size((pa_dtype)-1), 0);
    CHECK_INT(pa_dtype_size((pa_dtype)1000), 0);
    const char *names[] = {"f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"};
    for (int d = 0; d < PA_DTYPE_COUNT_; d++) {
        const char *n = pa_dtype_name((pa_dtype)d);
        CHECK(n && strcmp(n, names[d]) == 0);
        pa_dtype out = (pa_dtype)99;
        CHECK_OK(pa_dtype_parse(names[d], &out));
        CHECK_INT(out, d);
    }
    CHECK(pa_dtype_name(PA_DTYPE_COUNT_) == NULL);
    CHECK(pa_dtype_name((pa_dtype)-1) == NULL);
    struct {
        const char *s;
        pa_dtype d;
    } aliases[] = {{"float32", PA_DTYPE_F32},   {"float16", PA_DTYPE_F16},
                   {"half", PA_DTYPE_F16},      {"bfloat16", PA_DTYPE_BF16},
                   {"fp8", PA_DTYPE_FP8_E4M3}, {"e4m3", PA_DTYPE_FP8_E4M3},
                   {"e5m2", PA_DTYPE_FP8_E5M2}};
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        pa_dtype out = (pa_dtype)99;
        CHECK_OK(pa_dtype_parse(aliases[i].s, &out));
        CHECK_INT(out, aliases[i].d);
    }
    const char *bad[] = {"", "F32", "f64", "fp8_e4m3 ", "int8", "fp8e4m3", "float", "bf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pa_dtype out = PA_DTYPE_BF16;
        CHECK_STATUS(pa_dtype_parse(bad[i], &out), PA_STATUS_INVALID_ARGUMENT);
        CHECK_INT(out, PA_DTYPE_BF16); /* untouched */
    }
    pa_dtype out = PA_DTYPE_BF16;
    CHECK_FAILS_WITH(pa_dtype_parse("f64", &out), PA_STATUS_INVALID_ARGUMENT, "f64");
    CHECK_STATUS(pa_dtype_parse(NULL, &out), PA_STATUS_NULL_POINTER);
    CHECK_STATUS(pa_dtype_parse("f32", NULL), PA_STATUS_NULL_POINTER);
    CHECK_INT(out, PA_DTYPE_BF16);
}

/* ---- 6. pa_convert --------------------------------------------------------------------------- */

/* Test-side element access through the scalar functions. */
static float load_el(pa_dtype d, const void *p, size_t i)
{
    switch (d) {
    case PA_DTYPE_F32: return ((const float *)p)[i];
    case PA_DTYPE_F16: return pa_f16_to_f32(((const uint16_t *)p)[i]);
    case PA_DTYPE_BF16: return pa_bf16_to_f32(((const uint16_t *)p)[i]);
    case PA_DTYPE_FP8_E4M3: return pa_fp8e4m3_to_f32(((const uint8_t *)p)[i]);
    default: return pa_fp8e5m2_to_f32(((const uint8_t *)p)[i]);
    }
}
static void store_el(pa_dtype d, void *p, size_t i, float x)
{
    switch (d) {
    case PA_DTYPE_F32: ((float *)p)[i] = x; break;
    case PA_DTYPE_F16: ((uint16_t *)p)[i] = pa_f32_to_f16(x); break;
    case PA_DTYPE_BF16: ((uint16_t *)p)[i] = pa_f32_to_bf16(x); break;
    case PA_DTYPE_FP8_E4M3: ((uint8_t *)p)[i] = pa_f32_to_fp8e4m3(x); break;
    default: ((uint8_t *)p)[i] = pa_f32_to_fp8e5m2(x); break;
    }
}
static bool is_fp8(pa_dtype d) { return d == PA_DTYPE_FP8_E4M3 || d == PA_DTYPE_FP8_E5M2; }

#define NCONV 300

static void test_convert(void)
{
    static float vals[NCONV];
    for (int i = 0; i < NCONV; i++) {
        /* A spread of magnitudes from 2^-20 to 2^17, both signs, plus a few specials. */
        double m = ldexp(1.0 + (double)(rng() % 1000) / 1000.0, (int)(rng() % 38) - 20);
        vals[i] = (float)((rng() & 1) ? -m : m);
    }
    vals[0] = 0.0f, vals[1] = -0.0f, vals[2] = INFINITY, vals[3] = -INFINITY, vals[4] = NAN;
    vals[5] = 448.0f, vals[6] = 464.0f, vals[7] = 65520.0f, vals[8] = 1e30f;

    const float scales[] = {1.0f, 2.0f, 0.37f, 1e-3f};
    static unsigned char src[NCONV * 4], dst[NCONV * 4 + 16], want[NCONV * 4];
    for (int sd = 0; sd < PA_DTYPE_COUNT_; sd++) {
        for (int dd = 0; dd < PA_DTYPE_COUNT_; dd++) {
            for (int k = 0; k < 4; k++) {
                pa_dtype s = (pa_dtype)sd, d = (pa_dtype)dd;
                float scale = scales[k];
                for (size_t i = 0; i < NCONV; i++) store_el(s, src, i, vals[i]);
                for (size_t i = 0; i < NCONV; i++) {
                    float x = load_el(s, src, i);
                    if (is_fp8(s) && !is_fp8(d)) x *= scale;
                    if (is_fp8(d) && !is_fp8(s)) x /= scale;
                    store_el(d, want, i, x);
                }
                if (s == d) memcpy(want, src, NCONV * pa_dtype_size(d));
                memset(dst, 0xa5, sizeof dst);
                CHECK_OK(pa_convert(d, dst, s, src, NCONV, scale));
                size_t nb = NCONV * pa_dtype_size(d);
                test__checks++;
                if (memcmp(dst, want, nb) != 0)
                    MISMATCH("pa_convert %s <- %s scale %g differs from the scalar conversions",
                             pa_dtype_name(d), pa_dtype_name(s), (double)scale);
                test__checks++;
                if (dst[nb] != 0xa5) /* nothing written past n elements */
                    MISMATCH("pa_convert %s <- %s wrote past the end", pa_dtype_name(d),
                             pa_dtype_name(s));
            }
        }
    }

    /* fp8 scale semantics, by value. */
    float in[4] = {896.0f, 1.0f, 1000.0f, -1e6f};
    uint8_t q[4];
    CHECK_OK(pa_convert(PA_DTYPE_FP8_E4M3, q, PA_DTYPE_F32, in, 4, 2.0f));
    CHECK_INT(q[0], 0x7e);                       /* 896 / 2 = 448 */
    CHECK_INT(q[1], pa_f32_to_fp8e4m3(0.5f));    /* 1 / 2 */
    CHECK_INT(q[2], 0x7e);                       /* 500 saturates */
    CHECK_INT(q[3], 0xfe);                       /* -5e5 saturates */
    float deq[4];
    CHECK_OK(pa_convert(PA_DTYPE_F32, deq, PA_DTYPE_FP8_E4M3, q, 4, 2.0f));
    CHECK(deq[0] == 896.0f && deq[1] == 1.0f && deq[2] == 896.0f && deq[3] == -896.0f);
    CHECK_OK(pa_convert(PA_DTYPE_F32, deq, PA_DTYPE_FP8_E5M2, (const uint8_t[]){0x3c}, 1, 0.25f));
    CHECK(deq[0] == 0.25f);
    uint16_t h;
    CHECK_OK(pa_convert(PA_DTYPE_F16, &h, PA_DTYPE_F32, (const float[]){1.0f}, 1, 3.0f));
    CHECK_INT(h, 0x3c00); /* scale ignored without fp8 */
    uint8_t e5;
    CHECK_OK(
        pa_convert(PA_DTYPE_FP8_E5M2, &e5, PA_DTYPE_FP8_E4M3, (const uint8_t[]){0x40}, 1, 4.0f));
    CHECK_INT(e5, 0x40); /* fp8 -> fp8: 2.0 stays 2.0 */

    /* Errors: status, reason, and the destination untouched. */
    float fsrc[4] = {1, 2, 3, 4}, fdst[4] = {9, 9, 9, 9};
    const float bad_scales[] = {0.0f, -0.0f, -1.0f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_scales / sizeof bad_scales[0]; i++)
        CHECK_FAILS_WITH(pa_convert(PA_DTYPE_F32, fdst, PA_DTYPE_F32, fsrc, 4, bad_scales[i]),
                         PA_STATUS_INVALID_ARGUMENT, "scale");
    CHECK_FAILS_WITH(pa_convert(PA_DTYPE_COUNT_, fdst, PA_DTYPE_F32, fsrc, 4, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "dst_dtype");
    CHECK_FAILS_WITH(pa_convert(PA_DTYPE_F32, fdst, (pa_dtype)-1, fsrc, 4, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "src_dtype");
    CHECK_FAILS_WITH(pa_convert(PA_DTYPE_F32, NULL, PA_DTYPE_F32, fsrc, 4, 1.0f),
                     PA_STATUS_NULL_POINTER, "dst");
    CHECK_FAILS_WITH(pa_convert(PA_DTYPE_F32, fdst, PA_DTYPE_F32, NULL, 4, 1.0f),
                     PA_STATUS_NULL_POINTER, "src");
    CHECK_OK(pa_convert(PA_DTYPE_F32, NULL, PA_DTYPE_F16, NULL, 0, 1.0f)); /* nothing to do */
    CHECK_FAILS_WITH(pa_convert(PA_DTYPE_F16, fdst, PA_DTYPE_F32, fdst, 4, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "overlap");
    CHECK_FAILS_WITH(pa_convert(PA_DTYPE_F32, fdst + 1, PA_DTYPE_F16, fdst, 4, 1.0f),
                     PA_STATUS_INVALID_ARGUMENT, "overlap");
    CHECK_STATUS(pa_convert(PA_DTYPE_F32, fdst, PA_DTYPE_F32, fsrc, SIZE_MAX / 2, 1.0f),
                 PA_STATUS_OVERFLOW);
    /* spans whose byte counts fit a size_t but run past the address space (or past PTRDIFF_MAX,
     * the largest object): the overlap test must not wrap into "disjoint" */
    CHECK_STATUS(pa_convert(PA_DTYPE_F32, fdst, PA_DTYPE_F32, fsrc, SIZE_MAX / 4, 1.0f),
                 PA_STATUS_OVERFLOW);
    CHECK_STATUS(pa_convert(PA_DTYPE_F16, fdst, PA_DTYPE_F32, fsrc, SIZE_MAX / 4, 1.0f),
                 PA_STATUS_OVERFLOW);
    CHECK_STATUS(pa_convert(PA_DTYPE_FP8_E4M3, fdst, PA_DTYPE_F32, fsrc, (size_t)PTRDIFF_MAX / 4 + 1, 1.0f),
                 PA_STATUS_OVERFLOW);
    CHECK_STATUS(pa_convert(PA_DTYPE_F32, fdst, PA_DTYPE_FP8_E4M3, (const void *)(UINTPTR_MAX - 2), 4, 1.0f),
                 PA_STATUS_OVERFLOW);
    CHECK(fdst[0] == 9 && fdst[1] == 9 && fdst[2] == 9 && fdst[3] == 9);
    /* Adjacent but disjoint buffers are fine. */
    union {
        float f[4];
        uint16_t h[8];
    } buf = {{1.5f, -2.0f, 0.0f, 0.0f}};
    CHECK_OK(pa_convert(PA_DTYPE_F16, &buf.h[4], PA_DTYPE_F32, &buf.f[0], 2, 1.0f));
    CHECK_INT(buf.h[4], 0x3e00);
    CHECK_INT(buf.h[5], 0xc000);
}

int main(void)
{
    build_tables();
    for (int k = 0; k < 4; k++) {
        test_exhaustive_patterns(FORMATS[k]);
        test_midpoints(FORMATS[k]);
    }
    test_edges();
    test_random();
    test_names();
    test_convert();
    for (int k = 0; k < 4; k++) free(FORMATS[k]->tab);
    return test_exit();
}
