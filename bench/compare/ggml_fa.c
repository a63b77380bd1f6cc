/* Times ggml's CPU flash attention (ggml_flash_attn_ext) on one of pagedattn's bench shapes, for
 * bench/compare/compare.py. Not part of the library and not built by its CMake project: it is
 * compiled by bench/compare/build_ggml.sh against a ggml source tree the user supplies.
 *
 *   ggml_fa decode|prefill BATCH CTX KTYPE THREADS REPEATS      KTYPE: f32 f16 bf16 q8_0
 *
 * decode: BATCH sequences of CTX keys, one query token each; prefill: one causal prompt of CTX
 * tokens (mask -inf above the diagonal; ggml computes the masked tiles too). 32 query / 8 KV
 * heads x 128, queries f32 (ggml's FA takes f32 queries only). Prints one JSON line: the times in
 * ms of REPEATS runs after one warm-up run. */
#include "ggml-cpu.h"
#include "ggml.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* uniform values in [-0.5, 0.5) from a fixed LCG, stored in t's type */
static void fill(struct ggml_tensor *t, unsigned seed)
{
    int64_t n = ggml_nelements(t);
    float *tmp = malloc((size_t)n * sizeof *tmp);
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        tmp[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    switch (t->type) {
    case GGML_TYPE_F32: memcpy(t->data, tmp, (size_t)n * sizeof *tmp); break;
    case GGML_TYPE_F16: ggml_fp32_to_fp16_row(tmp, t->data, n); break;
    case GGML_TYPE_BF16: ggml_fp32_to_bf16_row(tmp, t->data, n); break;
    default: ggml_quantize_chunk(t->type, tmp, t->data, 0, n / t->ne[0], t->ne[0], NULL); break;
    }
    free(tmp);
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: ggml_fa decode|prefill BATCH CTX f32|f16|bf16|q8_0 THREADS REPEATS\n");
        return 2;
    }
    const int prefill = !strcmp(argv[1], "prefill");
    const int batch = atoi(argv[2]), ctx = atoi(argv[3]), threads = atoi(argv[5]), reps = atoi(argv[6]);
    const char *kt = argv[4];
    enum ggml_type ktype = !strcmp(kt, "f16")    ? GGML_TYPE_F16
                           : !strcmp(kt, "bf16") ? GGML_TYPE_BF16
                           : !strcmp(kt, "q8_0") ? GGML_TYPE_Q8_0
                                                 : GGML_TYPE_F32;
    if (batch < 1 || ctx < 1 || threads < 1 || reps < 1 || reps > 100) return 2;
    const int nq = prefill ? ctx : 1, d = 128, h = 32, hk = 8, npad = (nq + 63) / 64 * 64;
    size_t mem = (size_t)batch * ctx * hk * d * 4 * 2 + (size_t)batch * nq * h * d * 4 * 2 +
                 (size_t)ctx * npad * 2 + ((size_t)64 << 20);
    struct ggml_init_params ip = {mem, NULL, false};
    struct ggml_context *c = ggml_init(ip);
    struct ggml_tensor *q = ggml_new_tensor_4d(c, GGML_TYPE_F32, d, nq, h, batch);
    struct ggml_tensor *k = ggml_new_tensor_4d(c, ktype, d, ctx, hk, batch);
    struct ggml_tensor *v = ggml_new_tensor_4d(c, ktype, d, ctx, hk, batch);
    struct ggml_tensor *mask = NULL;
    fill(q, 1), fill(k, 2), fill(v, 3);
    if (prefill) {
        mask = ggml_new_tensor_2d(c, GGML_TYPE_F16, ctx, npad);
        ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
        ggml_fp16_t *m = mask->data;
        for (int i = 0; i < npad; i++)
            for (int j = 0; j < ctx; j++) m[(size_t)i * ctx + j] = j <= i ? zero : ninf;
    }
    struct ggml_tensor *o = ggml_flash_attn_ext(c, q, k, v, mask, 1.0f / sqrtf((float)d), 0.0f, 0.0f);
    struct ggml_cgraph *g = ggml_new_graph(c);
    ggml_build_forward_expand(g, o);
    ggml_graph_compute_with_ctx(c, g, threads);
    printf("{\"impl\": \"ggml\", \"times_ms\": [");
    for (int r = 0; r < reps; r++) {
        double t0 = now_ms();
        ggml_graph_compute_with_ctx(c, g, threads);
        printf("%s%.4f", r ? ", " : "", now_ms() - t0);
    }
    printf("]}\n");
    ggml_free(c);
    return 0;
}
