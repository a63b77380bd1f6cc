/* cpu_plan.c: the cpu backend's schedule for one batch and one head geometry.
 *
 * Items are cut from each sequence alone: query rows in tiles of at most CPU_ROWS (all the
 * query heads of one KV head, times as many tokens as fit), keys in chunks of a size fixed by
 * that sequence's own query length, at absolute multiples of it. Nothing here depends on the
 * other sequences of the batch or on the thread count, which is what makes results bitwise
 * reproducible. Items are ordered by estimated cost (largest first) for load balance only, the
 * reading (short queries) and the computing ones (prompts) interleaved (order_items). */
#include "cpu.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Key chunk size of a sequence, from its own query and key lengths only. Prefill tiles already
 * give parallelism: 4096 (a 2048-token causal f32 prefill, one thread: 292.9 -> 283.0 ms median
 * against 1024, whose split rows' partial rows, merges and second query loads took 3%; never
 * splitting, 283.1; bench/NOTES.md, thirty-eighth pass). Short queries (decode, speculative
 * steps): 256 keys up to 1024 keys, 512 beyond (doubled past 64k keys: at most 128 chunks), so
 * that even a lone sequence of more than 256 keys makes several chunks and keeps two threads
 * busy (a lone 512-key decode was one chunk, on one thread). A chunk has fixed costs (its query
 * rows, its partial rows and their merge): chunks of 128 keys made a lone 512-key decode 5.6%
 * slower on one thread, and 8 of 128 instead of 2 of 512 a 1024-key one 4%. */
static bool short_query(int32_t query_len) { return query_len <= 16; }

static int64_t chunk_keys(int32_t query_len, int64_t kv_len)
{
    if (!short_query(query_len)) {
        /* a prompt of 1024 tokens or more has its tiles for parallelism and is not split at all:
         * each split row costs a partial row in the plan, which for a 4096-token chunk of a prompt
         * over 100k cached keys came to 1.7 GB (an audit, forty-second pass). Shorter ones take
         * 4096-key chunks, doubled while a sequence would have more than 1024 split rows (query
         * tokens times chunks): a 500-token chunk over 100k keys made 25 chunks, 208 MB of partial
         * rows at 32 heads x 128, now 2 (17 MB); a chunk of 64 tokens makes at most 16, one of 17
         * tokens 60 */
        if (query_len >= 1024) return kv_len > 0 ? kv_len : 1;
        const int64_t most = 1024 / query_len;
        int64_t ch = 4096;
        while (kv_len > most * ch) ch *= 2;
        return ch;
    }
    if (kv_len <= 1024) return 256;
    /* 512, doubled while a sequence would have more than 128 chunks: enough items for any pool,
     * and the partial rows of a 16-token speculative step over 2M keys 34 MB instead of 1.1 GB
     * (sequences up to 64k keys keep 512) */
    int64_t ch = 512;
    while (kv_len > 128 * ch) ch *= 2;
    return ch;
}

typedef struct {
    int32_t nh, nhc, nt;
} row_shape;

static row_shape shape_of(int32_t group)
{
    row_shape r;
    r.nh = group < CPU_ROWS ? group : CPU_ROWS;
    r.nhc = (group + r.nh - 1) / r.nh;
    r.nt = CPU_ROWS / r.nh;
    if (r.nt < 1) r.nt = 1;
    return r;
}

/* The keys [0, *hi) some row of a query tile may see by the causal limit of its last position
 * (none for encoder types: every key). A plan serves every layer of its geometry (the header),
 * whatever that layer's local window, so the window is not planned for: a plan that followed it
 * (forty-second pass) dropped the keys of a full-attention layer that reused a sliding-window
 * layer's plan (an audit, forty-third pass: Gemma-2's and Mistral's interleaved layers). The
 * window and block sparsity hide keys row by row at forward; chunks they hide wholly make empty
 * items, and the chunk caps above bound their count. */
static int64_t tile_reach(const struct pa_layer *L, const struct pa_batch *b, int32_t s, int32_t t0, int32_t nt)
{
    const int64_t kv = pa__kv_len(b, L->cfg.attn_type, s);
    const int64_t last = (int64_t)b->md.context_lens[s] + t0 + nt - 1; /* (the positions of item_pass) */
    return L->cfg.attn_type == PA_ATTN_DECODER && last + 1 < kv ? last + 1 : kv;
}

static int cmp_items(const void *pa, const void *pb)
{
    const pa__cpu_item *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    if (a->seq != b->seq) return a->seq < b->seq ? -1 : 1;
    if (a->kvh != b->kvh) return a->kvh < b->kvh ? -1 : 1;
    if (a->h0 != b->h0) return a->h0 < b->h0 ? -1 : 1;
    if (a->t0 != b->t0) return a->t0 < b->t0 ? -1 : 1;
    return a->k0 < b->k0 ? -1 : (a->k0 > b->k0);
}

/* Walks every (sequence, tile, KV head, head chunk, key chunk); fills items and merges when
 * given, and always counts. */
static void enumerate(const struct pa_layer *L, const struct pa_batch *b, pa__cpu_item *items,
                      pa__cpu_merge *merges, int64_t *nitems, int64_t *nmerges, int64_t *nparts)
{
    const pa_layer_config *cfg = &L->cfg;
    row_shape rs = shape_of(L->group);
    int64_t ni = 0, nm = 0, np = 0;
    for (int32_t s = 0; s < b->md.num_seqs; s++) {
        int32_t qlen = b->md.query_lens[s];
        int64_t ch = chunk_keys(qlen, pa__kv_len(b, cfg->attn_type, s));
        /* t0 + rs.nt may pass INT32_MAX on the last tile of a huge query: step in int64 */
        for (int64_t t0_64 = 0; t0_64 < qlen; t0_64 += rs.nt) {
            int32_t t0 = (int32_t)t0_64;
            int32_t nt = qlen - t0 < rs.nt ? qlen - t0 : rs.nt;
            /* chunks 0 .. nch - 1 (at absolute multiples of ch); one empty item where no key is
             * visible (its rows are written as empty rows) */
            int64_t reach = tile_reach(L, b, s, t0, nt), nch = 1;
            if (reach > 0) nch = (reach + ch - 1) / ch;
            else reach = 0;
            /* short tiles (decode) take several KV heads per item, so that a cache block is
             * read front to back across its heads instead of as scattered per-head runs */
            int32_t nkv = 1;
            if (rs.nhc == 1) {
                nkv = CPU_ROWS / (rs.nh * nt);
                if (nkv > cfg->num_kv_heads) nkv = cfg->num_kv_heads;
                if (nkv > CPU_KROWS / 16) nkv = CPU_KROWS / 16;
                /* more rows per KV head than any decode kernel takes (16, cpu.h): tiles of
                 * CPU_KT keys for the transposed kernels, whose K scratch holds CPU_KROWS rows
                 * (a 5-token speculative step at GQA 4 went through the untransposed copies at
                 * 42-key tiles: 1.7-1.9x the time of a 4-token one; an audit, forty-third pass) */
                if (rs.nh * nt > 16 && nkv > CPU_KROWS / CPU_KT) nkv = CPU_KROWS / CPU_KT;
                if (nkv < 1) nkv = 1;
            }
            for (int32_t kvh = 0; kvh < cfg->num_kv_heads; kvh += nkv) {
                int32_t nk = cfg->num_kv_heads - kvh < nkv ? cfg->num_kv_heads - kvh : nkv;
                for (int32_t hc = 0; hc < rs.nhc; hc++) {
                    int32_t h0 = kvh * L->group + hc * rs.nh;
                    int32_t nh = L->group - hc * rs.nh < rs.nh ? L->group - hc * rs.nh : rs.nh;
                    int64_t rows = (int64_t)nh * nt * nk;
                    if (nch > 1 && merges) {
                        pa__cpu_merge *m = &merges[nm];
                        m->seq = s, m->h0 = h0, m->nh = nh, m->t0 = t0, m->nt = nt, m->nkv = nk;
                        m->nchunks = (int32_t)nch;
                        m->chunk = ch;
                        m->part = np;
                    }
                    for (int64_t c = 0; c < nch; c++) {
                        if (items) {
                            pa__cpu_item *it = &items[ni];
                            it->seq = s, it->kvh = kvh, it->nkv = nk, it->h0 = h0, it->nh = nh;
                            it->t0 = t0, it->nt = nt;
                            it->k0 = c * ch;
                            it->k1 = reach - it->k0 > ch ? it->k0 + ch : reach;
                            it->part = nch > 1 ? np + c * rows : -1;
                            it->cost = rows * (it->k1 - it->k0 + 16);
                        }
                        ni++;
                    }
                    if (nch > 1) {
                        nm++;
                        np += nch * rows;
                    }
                }
            }
        }
    }
    *nitems = ni;
    *nmerges = nm;
    *nparts = np;
}

/* Short-query items (decode, speculative steps: short_query) are bound by their KV reads,
 * prompt items by their arithmetic. Sorted by cost alone, a mixed batch's threads would read
 * side by side and then compute side by side; taken in turns, weighted by each kind's total
 * cost so that both run through the step, one thread computes while another reads. Each kind
 * keeps its largest-first order. (One 256-token prompt beside 32 decodes at 2048 keys, two
 * threads: bench/NOTES.md, thirty-fifth pass.) The order changes no result: items write
 * disjoint rows or partial slots, merged afterwards in chunk order. */
static pa_status order_items(pa__cpu_plan *p, const struct pa_batch *b)
{
    int64_t cr = 0, cc = 0; /* each kind's total cost (every item's cost is positive) */
    for (int64_t i = 0; i < p->nitems; i++)
        *(short_query(b->md.query_lens[p->items[i].seq]) ? &cr : &cc) += p->items[i].cost;
    if (cr == 0 || cc == 0) return PA_STATUS_OK; /* one kind only: the cost order as it is */
    pa__cpu_item *tmp = pa__calloc((size_t)p->nitems, sizeof *tmp);
    if (!tmp) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cpu: plan of %lld items", (long long)p->nitems);
    memcpy(tmp, p->items, (size_t)p->nitems * sizeof *tmp);
    /* two cursors over the sorted copy, one per kind; take from the one whose kind has had the
     * smaller share of its total cost so far (ties: the reading kind) */
    int64_t ir = 0, ic = 0, sr = 0, sc = 0;
    for (int64_t n = 0; n < p->nitems; n++) {
        while (ir < p->nitems && !short_query(b->md.query_lens[tmp[ir].seq])) ir++;
        while (ic < p->nitems && short_query(b->md.query_lens[tmp[ic].seq])) ic++;
        /* sr / cr <= sc / cc (in doubles: a product of two costs may pass int64) */
        bool take_r = ic >= p->nitems || (ir < p->nitems && (double)sr * (double)cc <= (double)sc * (double)cr);
        pa__cpu_item *it = take_r ? &tmp[ir++] : &tmp[ic++];
        *(take_r ? &sr : &sc) += it->cost;
        p->items[n] = *it;
    }
    pa__free(tmp);
    return PA_STATUS_OK;
}

pa_status pa__cpu_plan_build(pa__cpu_ctx *c, const struct pa_layer *layer,
                             const struct pa_batch *batch, pa__cpu_plan **out)
{
    int32_t dp = pa__cpu_dpad(layer->cfg.head_size);
    pa_status st = pa__cpu_ctx_reserve(c, dp);
    if (st != PA_STATUS_OK) return st;
    pa__cpu_plan *p = pa__calloc(1, sizeof *p);
    if (!p) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cpu: plan");
    p->dp = dp;
    enumerate(layer, batch, NULL, NULL, &p->nitems, &p->nmerges, &p->npart_rows);
    p->items = pa__calloc((size_t)p->nitems, sizeof *p->items);
    p->merges = pa__calloc((size_t)(p->nmerges ? p->nmerges : 1), sizeof *p->merges);
    p->part = pa__calloc((size_t)(p->npart_rows ? p->npart_rows : 1), (size_t)(dp + 2) * sizeof(float));
    if (!p->items || !p->merges || !p->part) {
        const long long nitems = (long long)p->nitems; /* (read after the free until an audit: thirty-ninth pass) */
        pa__cpu_plan_free(p);
        return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cpu: plan of %lld items", nitems);
    }
    int64_t ni, nm, np;
    enumerate(layer, batch, p->items, p->merges, &ni, &nm, &np);
    qsort(p->items, (size_t)p->nitems, sizeof *p->items, cmp_items);
    st = order_items(p, batch);
    if (st != PA_STATUS_OK) {
        pa__cpu_plan_free(p);
        return st;
    }
    *out = p;
    return PA_STATUS_OK;
}

void pa__cpu_plan_free(pa__cpu_plan *p)
{
    if (!p) return;
    pa__free(p->items);
    pa__free(p->merges);
    pa__free(p->part);
    pa__free(p);
}
