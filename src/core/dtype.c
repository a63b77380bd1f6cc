/*
 * dtype.c: element sizes, names and the scalar conversions between f32 and the storage dtypes
 * (f16, bf16, fp8 E4M3, fp8 E5M2), in portable C11 integer bit manipulation.
 *
 * Every narrowing conversion rounds the exact f32 value once, to nearest with ties to even.
 * f16 and the two fp8 formats share one rounding routine (narrow_minifloat) described by the
 * format's field widths; bf16 is the upper half of an f32 and rounds with the usual carry trick.
 */
#include "internal.h"

#include <stdint.h>
#include <string.h>

/* ---- names and sizes ---------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} dtype_info[PA_DTYPE_COUNT_] = {
    [PA_DTYPE_F32] = {"f32", 4},
    [PA_DTYPE_F16] = {"f16", 2},
    [PA_DTYPE_BF16] = {"bf16", 2},
    [PA_DTYPE_FP8_E4M3] = {"fp8_e4m3", 1},
    [PA_DTYPE_FP8_E5M2] = {"fp8_e5m2", 1},
};

static const struct {
    const char *alias;
    pa_dtype dtype;
} dtype_aliases[] = {
    {"float32", PA_DTYPE_F32}, {"float16", PA_DTYPE_F16},      {"half", PA_DTYPE_F16},
    {"bfloat16", PA_DTYPE_BF16}, {"fp8", PA_DTYPE_FP8_E4M3}, {"e4m3", PA_DTYPE_FP8_E4M3},
    {"e5m2", PA_DTYPE_FP8_E5M2},
};

size_t pa_dtype_size(pa_dtype dtype)
{
    return pa__dtype_valid(dtype) ? dtype_info[dtype].size : 0;
}

const char *pa_dtype_name(pa_dtype dtype)
{
    return pa__dtype_valid(dtype) ? dtype_info[dtype].name : NULL;
}

pa_status pa_dtype_parse(const char *name, pa_dtype *out)
{
    if (!name) return pa__fail(PA_STATUS_NULL_POINTER, "pa_dtype_parse: name is NULL");
    if (!out) return pa__fail(PA_STATUS_NULL_POINTER, "pa_dtype_parse: out is NULL");
    for (int d = 0; d < PA_DTYPE_COUNT_; d++) {
        if (strcmp(name, dtype_info[d].name) == 0) {
            *out = (pa_dtype)d;
            return PA_STATUS_OK;
        }
    }
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++) {
        if (strcmp(name, dtype_aliases[i].alias) == 0) {
            *out = dtype_aliases[i].dtype;
            return PA_STATUS_OK;
        }
    }
    return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                    "pa_dtype_parse: unknown dtype \"%.64s\" (expected f32, f16, bf16, fp8_e4m3, "
                    "fp8_e5m2 or an alias: float32, float16, half, bfloat16, fp8, e4m3, e5m2)",
                    name);
}

/* ---- f32 bits ----------------------------------------------------------------------------- */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- small binary formats ------------------------------------------------------------------ */

/* A sign-magnitude binary format narrower than f32: 1 sign bit, exp_bits exponent bits with
 * `bias`, man_bits mantissa bits, IEEE-style subnormals at exponent field 0. */
typedef struct minifloat {
    int exp_bits, man_bits, bias;
    uint32_t max_code;      /* magnitude code of the largest finite value */
    uint32_t overflow_code; /* magnitude code for values beyond it: inf, or max_code (saturate) */
    uint32_t nan_code;      /* magnitude code of the NaN produced from an f32 NaN */
} minifloat;

static const minifloat fmt_f16 = {5, 10, 15, 0x7bff, 0x7c00, 0x7e00};
static const minifloat fmt_e4m3 = {4, 3, 7, 0x7e, 0x7e, 0x7f};
static const minifloat fmt_e5m2 = {5, 2, 15, 0x7b, 0x7b, 0x7e};

/*
 * Rounds an f32 to the format, to nearest with ties to even, in one step from the f32 bits.
 *
 * With e the unbiased f32 exponent and sig the 24-bit significand (value = sig * 2^(e - 23)),
 * the result's quantum is 2^(max(e, emin) - man_bits) where emin = 1 - bias is the smallest
 * normal exponent; dropping d = (max(e, emin) - man_bits) - (e - 23) low bits of sig with
 * round-to-nearest-even gives r, the value in quanta. The code is then
 * ((max(e, emin) - emin) << man_bits) + r: r carries the implicit bit, so a normal value adds
 * its exponent field, a subnormal one (e < emin) sits at field 0, and a rounding carry into the
 * next binade (or from the largest subnormal into the smallest normal) lands on the right code
 * by plain addition. A code past max_code has overflowed: inf or saturation by the format.
 */
static uint32_t narrow_minifloat(float f, const minifloat *fmt)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 31) << (fmt->exp_bits + fmt->man_bits);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | fmt->nan_code;
    if (a == 0x7f800000u) return sign | fmt->overflow_code;

    int emin = 1 - fmt->bias;
    int emax_field = (1 << fmt->exp_bits) - 1;
    int32_t fexp = (int32_t)(a >> 23);
    int e = fexp ? fexp - 127 : -126;
    uint64_t sig = fexp ? ((a & 0x7fffffu) | 0x800000u) : (a & 0x7fffffu);
    /* Far beyond the format's range: overflow without computing huge shifts. */
    if (e + fmt->bias > emax_field) return sign | fmt->overflow_code;

    int eq = e > emin ? e : emin;
    int d = eq - fmt->man_bits - (e - 23); /* >= 23 - man_bits >= 13 */
    if (d > 40) d = 40;                    /* sig < 2^24 rounds to 0 long before this */
    uint64_t r = sig >> d;
    uint64_t rem = sig & ((UINT64_C(1) << d) - 1);
    uint64_t half = UINT64_C(1) << (d - 1);
    if (rem > half || (rem == half && (r & 1))) r++;

    uint64_t code = ((uint64_t)(eq - emin) << fmt->man_bits) + r;
    if (code > fmt->max_code) code = fmt->overflow_code;
    return sign | (uint32_t)code;
}

/* Exact widening of a format whose exponent field all-ones means inf (mantissa 0) or NaN
 * (f16, E5M2). Subnormals are normalized into the f32 exponent range. */
static float widen_ieee_like(uint32_t x, const minifloat *fmt)
{
    int mb = fmt->man_bits;
    uint32_t sign = (x >> (fmt->exp_bits + mb)) << 31;
    uint32_t ef = (x >> mb) & ((1u << fmt->exp_bits) - 1);
    uint32_t m = x & ((1u << mb) - 1);
    uint32_t emax_field = (1u << fmt->exp_bits) - 1;
    if (ef == emax_field) /* inf, or NaN with its payload moved to the top of the f32 mantissa */
        return f32_from_bits(sign | 0x7f800000u | (m << (23 - mb)));
    if (ef == 0) {
        if (m == 0) return f32_from_bits(sign);
        /* m * 2^(1 - bias - mb): shift m up until its leading bit is the implicit bit. */
        int e = 1 - fmt->bias;
        while (!(m & (1u << mb))) {
            m <<= 1;
            e--;
        }
        m &= (1u << mb) - 1;
        return f32_from_bits(sign | ((uint32_t)(e + 127) << 23) | (m << (23 - mb)));
    }
    return f32_from_bits(sign | ((ef - (uint32_t)fmt->bias + 127u) << 23) | (m << (23 - mb)));
}

/* ---- public scalar conversions ------------------------------------------------------------ */

float pa_f16_to_f32(uint16_t h) { return widen_ieee_like(h, &fmt_f16); }

uint16_t pa_f32_to_f16(float f) { return (uint16_t)narrow_minifloat(f, &fmt_f16); }

float pa_bf16_to_f32(uint16_t b) { return f32_from_bits((uint32_t)b << 16); }

uint16_t pa_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Add just under half an ulp of bf16, plus one when the kept LSB is odd (ties to even); the
     * carry propagates through the exponent, so overflow becomes inf as in IEEE. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float pa_fp8e4m3_to_f32(uint8_t x)
{
    uint32_t sign = (uint32_t)(x >> 7) << 31;
    uint32_t ef = (x >> 3) & 0xfu, m = x & 0x7u;
    if (ef == 0xf && m == 0x7) return f32_from_bits(sign | 0x7fc00000u); /* the only NaN */
    if (ef == 0) {
        if (m == 0) return f32_from_bits(sign);
        int e = -6; /* m * 2^-9 = (m / 8) * 2^-6 */
        while (!(m & 0x8u)) {
            m <<= 1;
            e--;
        }
        return f32_from_bits(sign | ((uint32_t)(e + 127) << 23) | ((m & 0x7u) << 20));
    }
    return f32_from_bits(sign | ((ef - 7u + 127u) << 23) | (m << 20));
}

uint8_t pa_f32_to_fp8e4m3(float f) { return (uint8_t)narrow_minifloat(f, &fmt_e4m3); }

float pa_fp8e5m2_to_f32(uint8_t x) { return widen_ieee_like(x, &fmt_e5m2); }

uint8_t pa_f32_to_fp8e5m2(float f) { return (uint8_t)narrow_minifloat(f, &fmt_e5m2); }

/* ---- buffer conversion ---------------------------------------------------------------------- */


/*
 * Scale rule: quantizing into fp8 divides by scale, dequantizing from fp8 multiplies by it.
 * For fp8 -> fp8 both would apply and cancel, so the value is requantized unscaled; pairs
 * without fp8 ignore the scale.
 */
pa_status pa_convert(pa_dtype dst_dtype, void *dst, pa_dtype src_dtype, const void *src,
                     size_t n, float scale)
{
    if (!pa__dtype_valid(dst_dtype))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_convert: dst_dtype %d is not a pa_dtype",
                        (int)dst_dtype);
    if (!pa__dtype_valid(src_dtype))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_convert: src_dtype %d is not a pa_dtype",
                        (int)src_dtype);
    if (!(scale > 0.0f) || !isfinite(scale))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "pa_convert: scale is %g, expected finite and > 0", (double)scale);
    if (n == 0) return PA_STATUS_OK;
    if (!dst) return pa__fail(PA_STATUS_NULL_POINTER, "pa_convert: dst is NULL (n = %zu)", n);
    if (!src) return pa__fail(PA_STATUS_NULL_POINTER, "pa_convert: src is NULL (n = %zu)", n);
    size_t dsize = pa_dtype_size(dst_dtype), ssize = pa_dtype_size(src_dtype);
    /* no object spans more than PTRDIFF_MAX bytes, nor runs past the end of the address space
     * (a span that did made the overlap test below wrap: an audit's n = SIZE_MAX / 4 reached
     * memcpy, bench/NOTES.md, thirty-ninth pass) */
    if (n > (size_t)PTRDIFF_MAX / 4 || (uintptr_t)dst > UINTPTR_MAX - n * dsize ||
        (uintptr_t)src > UINTPTR_MAX - n * ssize)
        return pa__fail(PA_STATUS_OVERFLOW, "pa_convert: n = %zu elements overflow the address space", n);
    if (pa__ranges_overlap(dst, n * dsize, src, n * ssize))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "pa_convert: dst and src overlap (%zu elements)", n);

    bool dst_fp8 = pa__dtype_is_fp8(dst_dtype), src_fp8 = pa__dtype_is_fp8(src_dtype);
    if (dst_dtype == src_dtype) { /* bit-exact copy, NaN payloads included */
        memcpy(dst, src, n * dsize);
        return PA_STATUS_OK;
    }
    /* the scale's division or product in the default environment, whatever the caller's
     * (pagedattn.h; this call ran in the caller's until 2026-11-30: bench/NOTES.md, thirty-sixth
     * pass) */
    pa__fpenv fe;
    pa__fpenv_enter(&fe);
    if (dst_fp8 && !src_fp8) {
        for (size_t i = 0; i < n; i++)
            pa__store_f32(dst_dtype, dst, (int64_t)i,
                          pa__load_f32(src_dtype, src, (int64_t)i) / scale);
    } else if (src_fp8 && !dst_fp8) {
        for (size_t i = 0; i < n; i++)
            pa__store_f32(dst_dtype, dst, (int64_t)i,
                          pa__load_f32(src_dtype, src, (int64_t)i) * scale);
    } else {
        for (size_t i = 0; i < n; i++)
            pa__store_f32(dst_dtype, dst, (int64_t)i, pa__load_f32(src_dtype, src, (int64_t)i));
    }
    pa__fpenv_leave(&fe);
    return PA_STATUS_OK;
}
