/* test_cpu_plan_size.c: the cpu backend's plan for a batch stays bounded however far its
 * sequences reach: an audit (bench/NOTES.md, forty-second pass) found a
 * decode at position 2^31 - 2 under a sliding window of 64 taking an 833 MB plan (an item and a
 * partial row for every 512-key chunk from key 0), and a 4096-token chunk of a prompt over 100k
 * cached keys a 1.7 GB one (its rows split into 4096-key chunks). The bytes the library
 * allocates while making each plan are counted through pa_set_allocator; the results of such
 * plans are checked against the reference by the case grid's window-chunks rows, and with plans
 * made from other layers of their geometry on every grid row. */
#define _POSIX_C_SOURCE 200112L
#include "test.h"

#include <stdint.h>

static int64_t allocated; /* bytes handed out since the last reset (every thread's) */

static void *count_alloc(void *user, size_t size, size_t alignment)
{
    (void)user;
    void *p = NULL;
    if (posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, size ? size : 1)) return NULL;
    __atomic_add_fetch(&allocated, (int64_t)size, __ATOMIC_RELAXED);
    return p;
}

static void count_free(void *user, void *p)
{
    (void)user;
    free(p);
}

/* Bytes allocated by pa_plan_create for one sequence of context ctx and query_len q over a
 * layer of 8 query / 2 KV heads x 64 with the given sliding window (0: none), block size bs. */
static int64_t plan_bytes(pa_context *ctx, int32_t context, int32_t q, int32_t window, int32_t bs)
{
    pa_layer_config cfg;
    pa_layer_config_init(&cfg, 8, 2, 64);
    cfg.sliding_window = window;
    pa_layer *layer = NULL;
    pa_batch *batch = NULL;
    pa_plan *plan = NULL;
    const int64_t keys = (int64_t)context + q;
    const int32_t nblocks = (int32_t)((keys + bs - 1) / bs);
    int32_t *table = malloc((size_t)nblocks * sizeof *table);
    if (!table) return -1;
    for (int32_t i = 0; i < nblocks; i++) table[i] = nblocks - 1 - i;
    pa_seq seq = {.context_len = context, .query_len = q, .is_prefill = q > 1, .block_table = table,
                  .num_blocks = nblocks};
    pa_batch_config bc = {.block_size = bs, .num_blocks = nblocks};
    int64_t bytes = -1;
    CHECK_OK(pa_layer_create(&cfg, &layer));
    CHECK_OK(pa_batch_create(&bc, &seq, 1, &batch));
    if (layer && batch) {
        __atomic_store_n(&allocated, 0, __ATOMIC_RELAXED);
        CHECK_OK(pa_plan_create(ctx, layer, batch, &plan));
        bytes = __atomic_load_n(&allocated, __ATOMIC_RELAXED);
    }
    pa_plan_destroy(plan);
    pa_batch_destroy(batch);
    pa_layer_destroy(layer);
    free(table);
    return bytes;
}

int main(void)
{
    const pa_allocator counting = {count_alloc, count_free, NULL};
    pa_set_allocator(&counting); /* (before any handle) */
    pa_context *ctx = NULL;
    pa_context_options opt = {.num_threads = 2};
    CHECK_OK(pa_context_create(pa_backend_find("cpu"), &opt, &ctx));
    if (!ctx) return test_exit();
    /* the scale of a plan's fixed part: a decode at 4096 keys */
    const int64_t small = plan_bytes(ctx, 4095, 1, 0, 16);
    printf("decode at 4096 keys: %lld bytes\n", (long long)small);
    CHECK(small > 0 && small < (1 << 20));

    /* a decode at position 2^31 - 2 (blocks of 2^20 tokens: a table of 2048 entries): at most
     * 128 key chunks (~4M before the cap), whatever the layer's window: a plan serves every
     * layer of its geometry, so one made from a sliding-window layer must cover a full-attention
     * layer's keys too (an audit, forty-third pass: it did not), and is the same plan */
    const int64_t none = plan_bytes(ctx, INT32_MAX - 1, 1, 0, 1 << 20);
    printf("decode at 2^31 - 1 keys: %lld bytes\n", (long long)none);
    CHECK(none > 0 && none <= 20 * small);
    int64_t b = plan_bytes(ctx, INT32_MAX - 1, 1, 64, 1 << 20);
    printf("decode at 2^31 - 1 keys, window 64: %lld bytes\n", (long long)b);
    CHECK(b == none);
    /* a speculative step of 4 tokens there */
    b = plan_bytes(ctx, INT32_MAX - 4, 4, 64, 1 << 20);
    CHECK(b > 0 && b <= 4 * none);

    /* a 4096-token chunk of a prompt over 60k cached keys: its 512 tiles are not split by keys,
     * so no partial rows (it was 16 chunks of 4096 keys: ~135 MB of partial rows here) */
    b = plan_bytes(ctx, 60000, 4096, 0, 16);
    printf("prompt chunk of 4096 over 60000 keys: %lld bytes\n", (long long)b);
    CHECK(b > 0 && b < (4 << 20));
    /* a short chunk (17 tokens) over the same context is still split (its partial rows: 15
     * chunks x 17 tokens x 8 heads x (64 + 2) floats, ~0.5 MB): the split stays where it gives
     * the threads work */
    b = plan_bytes(ctx, 60000, 17, 0, 16);
    printf("prompt chunk of 17 over 60000 keys: %lld bytes\n", (long long)b);
    CHECK(b > (256 << 10) && b < (4 << 20));

    /* a 500-token chunk over 100k keys: 2 chunks of 65536 keys (was 25 of 4096: ~26 MB of
     * partial rows at these heads, 208 MB at 32 x 128) */
    b = plan_bytes(ctx, 100000, 500, 0, 16);
    printf("prompt chunk of 500 over 100000 keys: %lld bytes\n", (long long)b);
    CHECK(b > 0 && b < (4 << 20));

    /* a speculative step of 16 tokens over 2M keys: at most 128 key chunks (was 4096 of 512
     * keys: ~138 MB of partial rows at these heads; now ~4.3 MB) */
    b = plan_bytes(ctx, (1 << 21) - 16, 16, 0, 16);
    printf("speculative step of 16 over 2M keys: %lld bytes\n", (long long)b);
    CHECK(b > 0 && b < (8 << 20));

    pa_context_destroy(ctx);
    pa_set_allocator(NULL);
    return test_exit();
}
