/* cpu_backend.c: the `cpu` backend's registry entry: ISA choice, contexts (thread pool and
 * per-thread scratch), plans and forward. See cpu.h for the algorithm. */
#include "cpu.h"

#include <stdio.h>
#include <stdlib.h>

bool pa__cpu_isa_usable(pa__cpu_isa isa, const pa__cpu_features *f)
{
    switch (isa) {
    case PA__ISA_GENERIC: return true;
#ifdef PA__CPU_X86
    case PA__ISA_AVX2: return f->avx2 && f->fma && f->f16c && f->os_ymm;
#  ifdef PAGEDATTN_HAVE_AVX512
    case PA__ISA_AVX512:
        return f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw && f->avx512vl &&
               f->os_zmm;
    case PA__ISA_AVX512BF16:
        return pa__cpu_isa_usable(PA__ISA_AVX512, f) && f->avx512bf16;
#  endif
#endif
#ifdef PA__CPU_ARM64
    case PA__ISA_NEON: return f->neon;
#endif
    default: return false;
    }
}

const char *pa__cpu_isa_name(pa__cpu_isa isa)
{
    static const char *const names[PA__ISA_COUNT_] = {"generic", "avx2", "avx512", "avx512bf16", "neon"};
    return (unsigned)isa < PA__ISA_COUNT_ ? names[isa] : "?";
}

static pa__cpu_isa widest_isa(const pa__cpu_features *f)
{
    for (int i = PA__ISA_COUNT_ - 1; i > PA__ISA_GENERIC; i--) /* at most one family usable */
        if (pa__cpu_isa_usable((pa__cpu_isa)i, f)) return (pa__cpu_isa)i;
    return PA__ISA_GENERIC;
}

/* The default path: the widest this machine runs, except that the avx512bf16 kernels are the
 * default on AMD only. On the one Intel CPU measured (a Xeon with AVX512-BF16 and AMX, the host
 * of a lent GPU machine, twice: bench/NOTES.md nineteenth and twenty-fourth passes) vdpbf16ps
 * runs at half the FMA rate and the avx512bf16 path was the slower one (one thread: decode
 * 16 x 4096 bf16 up to 33%, prefill 2048 bf16 18-71%); DESIGN.md expects Zen 4 to issue it at
 * the FMA's rate, unmeasured; on a Zen 5 it issues at twice the FMA's flops and the avx512bf16
 * path is the faster (bf16 prefill 2048 125 against 183 ms, one thread; twenty-eighth pass). */
pa__cpu_isa pa__cpu_default_isa(const pa__cpu_features *f)
{
    const pa__cpu_isa w = widest_isa(f);
    return w == PA__ISA_AVX512BF16 && !f->amd ? PA__ISA_AVX512 : w;
}

/* The 12 x 16 blocking of the AVX-512 prefill kernels was chosen for Zen 4 on llvm-mca's model,
 * in which a zmm broadcast occupies an FP pipe beside the FMAs unless it is folded into one FMA
 * (bench/NOTES.md, eighth pass), and measured there in the forty-eighth: f32 prefill 2048, one
 * thread, 413-429 ms against 442-451 with 8 x 32 (bf16: 230-239 against 228-229, the avx512bf16
 * kernels' own blocks). Elsewhere 8 x 32 (fewer loads per FMA) was the faster: an Intel Xeon
 * (twenty-sixth pass) and a Zen 5 EPYC, whose 512-bit pipes are full width (f32 prefill 2048,
 * one thread: 212 -> 190 ms; twenty-eighth pass). */
bool pa__cpu_avx512_rows12(const pa__cpu_features *f)
{
    return f->amd && f->family == 0x19;
}

/* Where a decode prefetches the rows of its next kernel calls (pa__cpu_kernels.decode_pf and
 * decode_pf_l2), by CPU whatever the ISA path. On the one Zen 4 measured (an EPYC, 2 vCPUs;
 * bench/NOTES.md, forty-eighth pass) prefetches into L1 (PREFETCHT0) of the next call's rows,
 * each a 4 KiB run at block 16, left a one-thread decode 16 x 4096 bf16 at ~30% of the read
 * bandwidth; PREFETCHT1 two calls ahead took it from 34 to 18-19 ms (1 x 32768: 14.9 -> 7.8 ms),
 * results unchanged. Reading 4 KiB chunks in a shuffled order, that core reached 7-9 GB/s with
 * PREFETCHT0 and 13-15 with PREFETCHT1 (sequential 30). Three or four calls ahead
 * (CPU_DECODE_PF_ZEN4): equal on one thread, 2-8% slower medians on two (forty-ninth pass).
 * Elsewhere the L1 prefetch one call
 * ahead was the faster or the only one measured (a Zen 5: PREFETCHT1 8% slower, thirty-fourth
 * pass). */
static bool zen4(const pa__cpu_features *f)
{
    return f->amd && f->family == 0x19 && f->avx512f; /* (Zen 3, the same family, has no AVX-512) */
}

static void decode_prefetch(const pa__cpu_features *f, pa__cpu_kernels *k)
{
    k->decode_pf = zen4(f) ? CPU_DECODE_PF_ZEN4 : CPU_DECODE_PF;
    k->decode_pf_l2 = zen4(f);
}

/* The ISA for a new context: PAGEDATTN_CPU_ISA if set (an unusable choice is an error, never a
 * silent fallback), else pa__cpu_default_isa. */
static pa_status choose_isa(pa__cpu_isa *out)
{
    pa__cpu_features f;
    pa__cpu_detect(&f);
    const char *env = getenv("PAGEDATTN_CPU_ISA");
    if (!env || !*env || !strcmp(env, "auto")) {
        *out = pa__cpu_default_isa(&f);
        return PA_STATUS_OK;
    }
    for (int i = 0; i < PA__ISA_COUNT_; i++) {
        if (strcmp(env, pa__cpu_isa_name((pa__cpu_isa)i))) continue;
        if (!pa__cpu_isa_usable((pa__cpu_isa)i, &f))
            return pa__fail(PA_STATUS_UNAVAILABLE,
                            "PAGEDATTN_CPU_ISA=%s: this machine (or this build) cannot run it", env);
        *out = (pa__cpu_isa)i;
        return PA_STATUS_OK;
    }
    return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                    "PAGEDATTN_CPU_ISA=%s: expected generic, avx2, avx512, avx512bf16, neon or auto", env);
}

/* How the x86 decode kernels take fp8 rows: PAGEDATTN_CPU_FP8 = bf16 (E4M3 as bf16 or f32 words
 * 2^-120 times the value, pa__cpu_kernels.e4m3_bf16), f16 (E4M3 through f16 forms, E5M2 through
 * f16), lut (both formats by AVX512-VBMI byte tables in the AVX-512 kernels,
 * pa__cpu_kernels_init_avx512's lut; the f16 forms where the path or the CPU lacks them), mixed
 * (keys as bf16's, values as lut's: pa__cpu_kernels.pv_fp8_lut; bf16 where the path or the CPU
 * lacks the tables); unset or auto: on AMD bf16 (its FP units take the words' subnormal operands
 * at full speed), on Zen 4 mixed, elsewhere lut. All are exact; they differ in speed (and in the
 * order of a sum, so in the last bits). On the one Zen 4 measured (bench/NOTES.md, forty-eighth
 * pass; one process alternating builds, medians), E4M3 decode 16 x 4096 with bf16 queries (whose
 * QK is the same in all three: bf16 dot products over keys converted by the tables) took 18.9 ms
 * with the words' PV and 16.8 with the tables' (two threads 9.3 -> 8.2, 1 x 32768 9.1 -> 7.9),
 * while with f32 queries lut's QK made the step 14% slower than bf16's: mixed takes the faster
 * half of each. */
typedef enum { FP8_F16, FP8_BF16, FP8_LUT, FP8_MIXED } fp8_form;

static pa_status choose_fp8(fp8_form *form)
{
    pa__cpu_features f;
    pa__cpu_detect(&f);
    const char *env = getenv("PAGEDATTN_CPU_FP8");
    if (!env || !*env || !strcmp(env, "auto")) *form = zen4(&f) ? FP8_MIXED : f.amd ? FP8_BF16 : FP8_LUT;
    else if (!strcmp(env, "bf16")) *form = FP8_BF16;
    else if (!strcmp(env, "f16")) *form = FP8_F16;
    else if (!strcmp(env, "lut")) *form = FP8_LUT;
    else if (!strcmp(env, "mixed")) *form = FP8_MIXED;
    else
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "PAGEDATTN_CPU_FP8=%s: expected bf16, f16, lut, mixed or auto",
                        env);
    return PA_STATUS_OK;
}

/* The table with weights exp(s - m): its unscaled softmax steps (or the generic exp_row). */
static void unscaled_weights(pa__cpu_kernels *k)
{
    k->exp_row = k->exp_row_unscaled ? k->exp_row_unscaled : pa__cpu_exp_row_generic;
    k->softmax_rows = k->softmax_rows_unscaled;
    k->p_exp = 0;
}

static void fill_kernels(pa__cpu_isa isa, fp8_form form, pa__cpu_kernels *k)
{
    pa__cpu_features f;
    pa__cpu_detect(&f);
    pa__cpu_kernels_init_generic(k);
#ifdef PA__CPU_X86
    if (isa >= PA__ISA_AVX2 && isa <= PA__ISA_AVX512BF16) pa__cpu_kernels_init_avx2(k);
#  ifdef PAGEDATTN_HAVE_AVX512
    if (isa >= PA__ISA_AVX512 && isa <= PA__ISA_AVX512BF16) {
        pa__cpu_kernels_init_avx512(k, pa__cpu_avx512_rows12(&f),
                                    !f.avx512vbmi          ? 0
                                    : form == FP8_LUT   ? PA__CPU_LUT_ALL
                                    : form == FP8_MIXED ? PA__CPU_LUT_PV
                                                        : 0);
        if (isa == PA__ISA_AVX512BF16) pa__cpu_kernels_init_avx512bf16(k, f.avx512vbmi);
    }
#  endif
#endif
#ifdef PA__CPU_ARM64
    if (isa == PA__ISA_NEON) pa__cpu_kernels_init_neon(k);
#endif
    k->e4m3_bf16 = k->e4m3_bf16 && (form == FP8_BF16 || form == FP8_MIXED);
    if (k->p_exp && k->e4m3_bf16) unscaled_weights(k); /* (cpu.h, p_exp) */
    decode_prefetch(&f, k);
}

/* (per thread: the text depends on PAGEDATTN_CPU_ISA at the time of the call, so it is rebuilt
 * on every call, and two threads asking at once must not write into each other's answer) */
static const char *cpu_info(void)
{
    static _Thread_local char buf[2048];
    pa__cpu_features f;
    pa__cpu_detect(&f);
    const char *env = getenv("PAGEDATTN_CPU_ISA"), *env8 = getenv("PAGEDATTN_CPU_FP8");
    pa__cpu_isa best = pa__cpu_default_isa(&f), chosen;
    pa_status st = choose_isa(&chosen);
    fp8_form form = FP8_F16;
    pa_status st8 = choose_fp8(&form);
    pa__clear_error();
    pa__cpu_kernels kt;
    fill_kernels(st == PA_STATUS_OK ? chosen : best, form, &kt);
    const bool forced8 = env8 && *env8 && strcmp(env8, "auto");
    const char *fp8 = st8 != PA_STATUS_OK ? "PAGEDATTN_CPU_FP8 is not bf16, f16, lut, mixed or auto: contexts fail"
                      : kt.pv_fp8_lut ? (forced8 ? "E4M3 keys as words 2^-120 times the value (E5M2 through f16), fp8 "
                                                   "values exactly to f32 by byte tables (AVX512-VBMI) (forced by "
                                                   "PAGEDATTN_CPU_FP8)"
                                                 : "E4M3 keys as words 2^-120 times the value (E5M2 through f16), fp8 "
                                                   "values exactly to f32 by byte tables (AVX512-VBMI) (Zen 4: the "
                                                   "faster of each)")
                      : kt.fp8_lut ? (forced8 ? "E4M3 and E5M2 exactly to f32 by byte tables (AVX512-VBMI) (forced by "
                                         "PAGEDATTN_CPU_FP8)"
                                       : "E4M3 and E5M2 exactly to f32 by byte tables (AVX512-VBMI), no subnormal "
                                         "operand (not AMD: those may take microcode assists)")
                      : kt.e4m3_bf16     ? (forced8 ? "words 2^-120 times the value: bf16 (AVX2; AVX-512 QK) or f32 "
                                                      "(AVX-512 PV and QK over unsplit queries) (forced by PAGEDATTN_CPU_FP8)"
                                                    : "words 2^-120 times the value: bf16 (AVX2; AVX-512 QK) or f32 "
                                                      "(AVX-512 PV and QK over unsplit queries) (AMD: subnormal FMA "
                                                      "operands at full speed)")
                      : form == FP8_BF16 || form == FP8_MIXED ? "f16 forms (this ISA path has no bf16-word kernels)"
                      : form == FP8_LUT  ? "f16 forms (byte tables need the AVX-512 path and AVX512-VBMI)"
                      : forced8          ? "f16 forms (forced by PAGEDATTN_CPU_FP8)"
                                         : "f16 forms";
    snprintf(buf, sizeof buf,
             "isa: %s (%s)\n"
             "cpu features: avx2=%d fma=%d f16c=%d os-ymm=%d avx512f=%d avx512bw=%d avx512vl=%d "
             "avx512bf16=%d avx512vbmi=%d os-zmm=%d neon=%d\n"
             "avx512 path: %s\n"
             "avx512bf16 path: %s\n"
             "neon path: %s\n"
             "fp8 decode rows: %s\n"
             "fp8 decode QK with bf16 queries: %s\n"
             "bf16 caches: %s\n"
             "softmax weights: %s\n"
             "decode prefetch: %s, %d kernel call(s) ahead%s\n"
             "threads: %d by default (online cores, within the affinity mask and the cgroup CPU quota)\n",
             env && *env ? env : pa__cpu_isa_name(best),
             !(env && *env) ? (best != widest_isa(&f) ? "the default here: avx512bf16 runs too, but is the default on "
                                                        "AMD only (on Intel vdpbf16ps runs at half the FMA rate); "
                                                        "PAGEDATTN_CPU_ISA=avx512bf16 forces it"
                                                      : "best this machine runs")
             : st == PA_STATUS_OK ? "forced by PAGEDATTN_CPU_ISA"
                                  : "PAGEDATTN_CPU_ISA asks for it, but it cannot run here: contexts fail",
             f.avx2, f.fma, f.f16c, f.os_ymm, f.avx512f, f.avx512bw, f.avx512vl, f.avx512bf16,
             f.avx512vbmi, f.os_zmm, f.neon,
#ifdef PAGEDATTN_HAVE_AVX512
             pa__cpu_isa_usable(PA__ISA_AVX512, &f)
                 ? (pa__cpu_avx512_rows12(&f) ? "built, runs here (its tests passed natively on an Intel Xeon, a Zen 4 "
                                                "and a Zen 5 EPYC and under SIMDe); prefill blocks 12 rows x 16 (Zen 4)"
                                              : "built, runs here (its tests passed natively on an Intel Xeon, a Zen 4 "
                                                "and a Zen 5 EPYC and under SIMDe); prefill blocks 8 rows x 32")
                 : "built, cannot run on this CPU",
             pa__cpu_isa_usable(PA__ISA_AVX512BF16, &f)
                 ? (f.avx512vbmi ? "built, runs here (its QK and PV passed the tests natively on an Intel Xeon, a Zen 4 "
                                   "and a Zen 5 EPYC and under SIMDe); fp8 keys to bf16 by byte tables (AVX512-VBMI)"
                                 : "built, runs here (its QK and PV passed the tests natively on an Intel Xeon, a Zen 4 "
                                   "and a Zen 5 EPYC and under SIMDe); E4M3 keys to bf16 through f16 at GQA 7-8 (no AVX512-VBMI)")
                 : "built, cannot run on this CPU",
#elif defined(PAGEDATTN_NO_AVX512)
             "not built (configured with PAGEDATTN_CPU_AVX512=OFF)",
             "not built (configured with PAGEDATTN_CPU_AVX512=OFF)",
#else
             "not built (compiler lacks the flags)",
             "not built (compiler lacks the flags)",
#endif
#ifdef PA__CPU_ARM64
             "built, runs here (Advanced SIMD is part of every AArch64 CPU)",
#else
             "not built (not AArch64)",
#endif
             fp8,
             !kt.qk_src_e4m3_bf16         ? "as above (this ISA path has no bf16 dot products over fp8 keys)"
             : kt.qk_e4m3_bf16_rows <= 1 ? "vdpbf16ps over the keys converted exactly to bf16 by byte tables "
                                           "(AVX512-VBMI), at every GQA (E5M2 keys too)"
                                         : "vdpbf16ps over the keys converted exactly to bf16 through f16 at GQA 7-8 "
                                           "(no AVX512-VBMI); as above elsewhere",
             kt.pv_bf16 ? "QK (bf16 queries) and PV by vdpbf16ps, the probabilities rounded to bf16; "
                          "PV over values below 2^-90, inf or NaN by fp32 FMAs"
                        : "fp32 FMAs, the probabilities kept in fp32",
             kt.p_exp ? "2^64 exp(s - m), never an fp32 subnormal (keys up to 131 below their row's maximum at full "
                        "speed on Intel cores); a work item whose scaled sums overflow runs again unscaled"
                      : "exp(s - m) (keys 87 to 104 below their row's maximum weigh fp32 subnormals)",
             kt.decode_pf_l2 ? "into L2 (PREFETCHT1)" : "into L1 (PREFETCHT0)", kt.decode_pf,
             kt.decode_pf_l2 ? " (Zen 4: its L1 prefetches of a paged cache's scattered rows ran at half the speed)" : "",
             pa__cpu_online_cores());
    return buf;
}

static pa_status cpu_supports(const struct pa_layer *layer)
{
    const pa_layer_config *c = &layer->cfg;
    if (c->head_size < 1 || c->head_size > 512)
        return pa__fail(PA_STATUS_UNSUPPORTED, "cpu: head_size %d outside 1..512", c->head_size);
    return PA_STATUS_OK;
}

static int32_t resolve_threads(int32_t n)
{
    if (n > 0) return n;
    n = pa__cpu_online_cores();
    return n < PA_MAX_THREADS ? n : PA_MAX_THREADS;
}

static void free_scratch(pa__cpu_scratch *s, int n)
{
    if (!s) return;
    for (int i = 0; i < n; i++) {
        pa__free(s[i].q);
        pa__free(s[i].q16);
        pa__free(s[i].o);
        pa__free(s[i].k);
        pa__free(s[i].v);
        pa__free(s[i].s);
    }
    pa__free(s);
}

static pa_status alloc_scratch(int n, int32_t dp, pa__cpu_scratch **out)
{
    pa__cpu_scratch *s = pa__calloc((size_t)n, sizeof *s);
    if (!s) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cpu: scratch");
    size_t rows = (size_t)CPU_ROWS * dp * sizeof(float), keys = (size_t)CPU_KROWS * dp * sizeof(float);
    for (int i = 0; i < n; i++) {
        s[i].q = pa__calloc(1, rows);
        s[i].q16 = pa__calloc(1, rows / 2);
        s[i].o = pa__calloc(1, rows);
        s[i].k = pa__calloc(1, keys);
        s[i].v = pa__calloc(1, keys);
        s[i].s = pa__calloc(1, (size_t)CPU_ROWS * CPU_KT * sizeof(float));
        if (!s[i].q || !s[i].q16 || !s[i].o || !s[i].k || !s[i].v || !s[i].s) {
            free_scratch(s, i + 1);
            return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cpu: scratch for head size %d", dp);
        }
    }
    *out = s;
    return PA_STATUS_OK;
}

pa_status pa__cpu_ctx_reserve(pa__cpu_ctx *c, int32_t dp)
{
    if (dp <= c->dp_cap && c->scratch) return PA_STATUS_OK;
    int32_t cap = dp > c->dp_cap ? dp : c->dp_cap;
    pa__cpu_scratch *s;
    pa_status st = alloc_scratch(c->nthreads, cap, &s);
    if (st != PA_STATUS_OK) return st;
    free_scratch(c->scratch, c->nthreads);
    c->scratch = s;
    c->dp_cap = cap;
    return PA_STATUS_OK;
}

static pa_status cpu_set_num_threads(void *impl, int32_t n)
{
    pa__cpu_ctx *c = impl;
    n = resolve_threads(n);
    /* (the same count: nothing to do, but in a forked child, whose pool has no workers: made
     * anew, as a different count would be; an audit found it stayed at one thread) */
    if (n == c->nthreads && c->pool && pa__cpu_pool_here(c->pool)) return PA_STATUS_OK;
    pa__cpu_pool *pool;
    pa__cpu_scratch *s;
    pa_status st = alloc_scratch(n, c->dp_cap, &s);
    if (st != PA_STATUS_OK) return st;
    st = pa__cpu_pool_create(n, &pool);
    if (st != PA_STATUS_OK) {
        free_scratch(s, n);
        return st;
    }
    pa__cpu_pool_destroy(c->pool);
    free_scratch(c->scratch, c->nthreads);
    c->pool = pool;
    c->scratch = s;
    c->nthreads = n;
    return PA_STATUS_OK;
}

/* (in a forked child a pool made before the fork runs on the calling thread alone: 1) */
static int32_t cpu_num_threads(const void *impl)
{
    const pa__cpu_ctx *c = impl;
    return c->pool && !pa__cpu_pool_here(c->pool) ? 1 : c->nthreads;
}

static void cpu_context_destroy(void *impl)
{
    pa__cpu_ctx *c = impl;
    if (!c) return;
    pa__cpu_pool_destroy(c->pool);
    free_scratch(c->scratch, c->nthreads);
    pa__free(c);
}

static pa_status cpu_context_create(const pa_context_options *opt, void **impl)
{
    pa__cpu_isa isa = PA__ISA_GENERIC;
    fp8_form form = FP8_F16;
    pa_status st = choose_isa(&isa);
    if (st == PA_STATUS_OK) st = choose_fp8(&form);
    if (st != PA_STATUS_OK) return st;
    pa__cpu_ctx *c = pa__calloc(1, sizeof *c);
    if (!c) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cpu: context");
    c->isa = isa;
    fill_kernels(isa, form, &c->kern);
    c->kern_exact = c->kern;
    if (c->kern.p_exp) unscaled_weights(&c->kern_exact);
    c->dp_cap = 128;
    st = cpu_set_num_threads(c, opt ? opt->num_threads : 0);
    if (st != PA_STATUS_OK) {
        cpu_context_destroy(c);
        return st;
    }
    *impl = c;
    return PA_STATUS_OK;
}

static pa_status cpu_plan_create(void *impl, const struct pa_layer *layer,
                                 const struct pa_batch *batch, void **plan)
{
    return pa__cpu_plan_build(impl, layer, batch, (pa__cpu_plan **)plan);
}

static void cpu_plan_destroy(void *plan)
{
    pa__cpu_plan_free(plan);
}

static pa_status cpu_forward(void *impl, const pa__fwd *f, void *plan)
{
    const pa_layer_config *cfg = &f->layer->cfg;
    const pa_forward_args *a = f->args;
    const pa_batch_metadata *md = &f->batch->md;
    if (f->write_kv && cfg->attn_type == PA_ATTN_DECODER)
        pa__cache_write_host(a->cache, cfg->kv_dtype, a->k, a->k_row_stride, a->v, a->v_row_stride,
                             md->slot_mapping, md->num_tokens, cfg->k_scale, cfg->v_scale);
    else if (f->write_kv && cfg->attn_type == PA_ATTN_ENCODER_DECODER)
        pa__cache_write_host(a->cache, cfg->kv_dtype, a->k, a->k_row_stride, a->v, a->v_row_stride,
                             md->cross_slot_mapping, md->num_encoder_tokens, cfg->k_scale,
                             cfg->v_scale);
    return pa__cpu_attend(impl, f, plan);
}

const struct pa_backend pa__backend_cpu = {
    .name = "cpu",
    .description = "SIMD (AVX-512, AVX2+FMA+F16C, NEON or generic C) flash attention on a thread pool",
    .preferred_layout = PA_LAYOUT_HND,
    .memory = PA_MEMORY_HOST,
    .available = NULL,
    .info = cpu_info,
    .supports = cpu_supports,
    .context_create = cpu_context_create,
    .context_destroy = cpu_context_destroy,
    .set_num_threads = cpu_set_num_threads,
    .num_threads = cpu_num_threads,
    .synchronize = NULL,
    .plan_create = cpu_plan_create,
    .plan_destroy = cpu_plan_destroy,
    .forward = cpu_forward,
};
