/* engine_step.c: one engine step with pagedattn, start to finish. Two sequences: one prompt of
 * 5 tokens being prefilled, one sequence decoding its 11th token. One GQA layer (8 query heads,
 * 2 KV heads, head size 64), bf16 KV cache in 16-token blocks. */
#include <pagedattn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        pa_status s_ = (call);                                                             \
        if (s_ != PA_STATUS_OK) {                                                          \
            fprintf(stderr, "%s failed: %s: %s\n", #call, pa_status_name(s_), pa_last_error()); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

int main(void)
{
    enum { H = 8, HKV = 2, D = 64, BLOCK = 16, NUM_BLOCKS = 8 };

    /* 1. The layer: geometry, scale 1/sqrt(D), dtypes. */
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, H, HKV, D);
    cfg.cache_dtype = PA_DTYPE_BF16;
    pa_layer *layer;
    CHECK(pa_layer_create(&cfg, &layer));

    /* 2. Its KV cache, in the layout the chosen backend reads fastest. */
    const pa_backend *backend;
    CHECK(pa_backend_select(NULL, layer, &backend)); /* or "cpu", or $PAGEDATTN_BACKEND */
    pa_cache cache;
    CHECK(pa_cache_init(&cache, pa_backend_preferred_layout(backend), PA_DTYPE_BF16, NUM_BLOCKS,
                        BLOCK, HKV, D));
    CHECK(pa_cache_alloc(&cache));

    /* 3. The step's batch: prefills first, then decodes; each with its block table. */
    int32_t table_a[] = {3};    /* prompt: 5 tokens fit in block 3 */
    int32_t table_b[] = {6, 1}; /* decode: 10 cached tokens + 1 new in block 6 */
    pa_seq seqs[2] = {
        {.context_len = 0, .query_len = 5, .is_prefill = 1, .block_table = table_a, .num_blocks = 1},
        {.context_len = 10, .query_len = 1, .is_prefill = 0, .block_table = table_b, .num_blocks = 2},
    };
    pa_batch_config bc = {.block_size = BLOCK, .num_blocks = NUM_BLOCKS};
    pa_batch *batch;
    CHECK(pa_batch_create(&bc, seqs, 2, &batch));
    int64_t T = pa_batch_get_metadata(batch)->num_tokens; /* 6 */

    /* 4. A context (threads / device) and a plan for this step, shared by all layers. */
    pa_context *ctx;
    CHECK(pa_context_create(backend, NULL, &ctx));
    pa_plan *plan;
    CHECK(pa_plan_create(ctx, layer, batch, &plan));

    /* 5. Per layer: new q, k, v for every token -> K/V written to the cache, attention out. */
    float *q = malloc(sizeof(float) * T * H * D), *k = malloc(sizeof(float) * T * HKV * D);
    float *v = malloc(sizeof(float) * T * HKV * D), *out = malloc(sizeof(float) * T * H * D);
    float *lse = malloc(sizeof(float) * T * H);
    for (int64_t i = 0; i < T * H * D; i++) q[i] = (float)sin(0.1 * (double)i);
    for (int64_t i = 0; i < T * HKV * D; i++) k[i] = (float)cos(0.3 * (double)i), v[i] = (float)(i % 7) - 3.0f;
    pa_forward_args args = {.q = q, .k = k, .v = v, .cache = &cache, .out = out, .lse = lse};
    CHECK(pa_attn_forward(ctx, layer, batch, plan, &args));
    /* (the 10 context tokens of sequence 2 were never written in this toy: they hold zeros) */

    printf("backend %s: out[0][0][0..3] = %.4f %.4f %.4f %.4f, lse[5][0] = %.4f\n",
           pa_backend_name(backend), out[0], out[1], out[2], out[3], lse[5 * H]);

    free(q), free(k), free(v), free(out), free(lse);
    pa_plan_destroy(plan);
    pa_context_destroy(ctx);
    pa_batch_destroy(batch);
    pa_cache_free(&cache);
    pa_layer_destroy(layer);
    return 0;
}
