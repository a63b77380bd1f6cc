/* batch.c: the batch builder (vLLM's AttentionMetadataBuilder): validates the sequences of one
 * step and flattens them into pa_batch_metadata. */
#include "internal.h"

#include <stdatomic.h>

static atomic_uint_least64_t pa__next_batch_id = 1;

/* Blocks needed for n tokens. */
static int64_t blocks_for(int64_t n, int32_t block_size) { return (n + block_size - 1) / block_size; }

static pa_status check_table(const int32_t *table, int32_t len, int64_t tokens, int64_t pool,
                             int32_t block_size, int32_t seq, const char *what)
{
    int64_t need = blocks_for(tokens, block_size);
    if (len < 0 || (len > 0 && !table))
        return pa__fail(len < 0 ? PA_STATUS_INVALID_ARGUMENT : PA_STATUS_NULL_POINTER,
                        "seqs[%d].%s: length %d with %s table", seq, what, len,
                        table ? "a" : "a NULL");
    if (len < need)
        return pa__fail(PA_STATUS_OUT_OF_RANGE,
                        "seqs[%d].%s has %d blocks; %lld tokens need %lld blocks of %d", seq, what,
                        len, (long long)tokens, (long long)need, block_size);
    for (int64_t i = 0; i < need; i++)
        if (table[i] < 0 || table[i] >= pool)
            return pa__fail(PA_STATUS_OUT_OF_RANGE,
                            "seqs[%d].%s[%lld] = %d is not a block id in [0, %lld)", seq, what,
                            (long long)i, table[i], (long long)pool);
    return PA_STATUS_OK;
}

static pa_status check_seq(const pa_batch_config *cfg, const pa_seq *q, int32_t i, bool *decode_seen)
{
    if (q->context_len < 0 || q->query_len < 1 || q->encoder_len < 0)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "seqs[%d]: context_len %d (>= 0), query_len %d (>= 1), encoder_len %d "
                        "(>= 0)",
                        i, q->context_len, q->query_len, q->encoder_len);
    if ((int64_t)q->context_len + q->query_len > INT32_MAX)
        return pa__fail(PA_STATUS_OVERFLOW, "seqs[%d]: context_len + query_len exceeds int32", i);
    if (q->is_prefill && *decode_seen)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "seqs[%d] is a prefill after a decode: prefills must come first", i);
    if (!q->is_prefill) *decode_seen = true;
    pa_status s = PA_STATUS_OK;
    if (q->num_blocks != 0 || q->block_table)
        s = check_table(q->block_table, q->num_blocks, (int64_t)q->context_len + q->query_len,
                        cfg->num_blocks, cfg->block_size, i, "block_table");
    if (!s && (q->encoder_len > 0 || q->num_cross_blocks != 0 || q->cross_block_table))
        s = check_table(q->cross_block_table, q->num_cross_blocks, q->encoder_len,
                        cfg->num_cross_blocks, cfg->block_size, i, "cross_block_table");
    return s;
}

static pa_status check_slots(const int64_t *slots, int64_t n, int64_t pool_slots, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        if (slots[i] >= pool_slots)
            return pa__fail(PA_STATUS_OUT_OF_RANGE, "%s[%lld] = %lld is beyond the pool's %lld slots",
                            what, (long long)i, (long long)slots[i], (long long)pool_slots);
        if (slots[i] < -1)
            return pa__fail(PA_STATUS_OUT_OF_RANGE,
                            "%s[%lld] = %lld: a slot is -1 (not written) or in [0, %lld)", what,
                            (long long)i, (long long)slots[i], (long long)pool_slots);
    }
    bool dup;
    int64_t v;
    pa_status s = pa__find_duplicate(slots, n, 1, true, &dup, &v);
    if (!s && dup)
        s = pa__fail(PA_STATUS_INVALID_ARGUMENT,
                     "%s writes slot %lld twice in one step", what, (long long)v);
    return s;
}

/* Layout of the single allocation behind the metadata arrays. */
typedef struct layout {
    int64_t n_i32, n_i64;
} layout;

static void fill_seq_arrays(struct pa_batch *b, const pa_seq *seqs, int32_t n)
{
    pa_batch_metadata *m = &b->md;
    int32_t *qsl = (int32_t *)m->query_start_loc, *ssl = (int32_t *)m->seq_start_loc;
    int32_t *esl = (int32_t *)m->encoder_start_loc;
    qsl[0] = ssl[0] = esl[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        const pa_seq *q = &seqs[i];
        int32_t seq_len = q->context_len + q->query_len;
        ((int32_t *)m->seq_lens)[i] = seq_len;
        ((int32_t *)m->context_lens)[i] = q->context_len;
        ((int32_t *)m->query_lens)[i] = q->query_len;
        ((int32_t *)m->encoder_seq_lens)[i] = q->encoder_len;
        qsl[i + 1] = qsl[i] + q->query_len;
        ssl[i + 1] = ssl[i] + seq_len;
        esl[i + 1] = esl[i] + q->encoder_len;
        if (m->max_query_len < q->query_len) m->max_query_len = q->query_len;
        if (m->max_seq_len < seq_len) m->max_seq_len = seq_len;
        if (m->max_encoder_seq_len < q->encoder_len) m->max_encoder_seq_len = q->encoder_len;
        if (q->is_prefill) {
            m->num_prefills++;
            m->num_prefill_tokens += q->query_len;
            if (m->max_prefill_seq_len < seq_len) m->max_prefill_seq_len = seq_len;
        } else {
            m->num_decode_tokens += q->query_len;
            if (m->max_decode_seq_len < seq_len) m->max_decode_seq_len = seq_len;
            if (m->max_decode_query_len < q->query_len) m->max_decode_query_len = q->query_len;
        }
        int64_t need = blocks_for(seq_len, m->block_size);
        if (q->num_blocks > 0)
            memcpy((int32_t *)m->block_tables + (int64_t)i * m->max_blocks_per_seq, q->block_table,
                   (size_t)need * sizeof(int32_t));
        need = blocks_for(q->encoder_len, m->block_size);
        if (q->num_cross_blocks > 0 && need > 0)
            memcpy((int32_t *)m->cross_block_tables + (int64_t)i * m->max_cross_blocks_per_seq,
                   q->cross_block_table, (size_t)need * sizeof(int32_t));
    }
}

/* Slot of each new token (derived from the tables unless given), -1 for a sequence without a
 * block table. */
static void fill_slots(struct pa_batch *b, const pa_batch_config *cfg, const pa_seq *seqs, int32_t n)
{
    pa_batch_metadata *m = &b->md;
    int64_t *slot = (int64_t *)m->slot_mapping, *cross = (int64_t *)m->cross_slot_mapping;
    int32_t B = m->block_size;
    for (int32_t i = 0; i < n; i++) {
        const pa_seq *q = &seqs[i];
        for (int32_t t = 0; t < q->query_len; t++) {
            int64_t pos = (int64_t)q->context_len + t, k = m->query_start_loc[i] + t;
            slot[k] = cfg->slot_mapping ? cfg->slot_mapping[k]
                      : q->num_blocks > 0 ? (int64_t)q->block_table[pos / B] * B + pos % B
                                          : -1;
        }
        for (int32_t t = 0; t < q->encoder_len; t++) {
            int64_t k = m->encoder_start_loc[i] + t;
            cross[k] = cfg->cross_slot_mapping ? cfg->cross_slot_mapping[k]
                                               : (int64_t)q->cross_block_table[t / B] * B + t % B;
        }
    }
}

static pa_status check_config(const pa_batch_config *cfg, const pa_seq *seqs, int32_t n, pa_batch **out)
{
    if (!cfg || !seqs || !out)
        return pa__fail(PA_STATUS_NULL_POINTER, "pa_batch_create: cfg, seqs and out must not be NULL");
    if (n < 1) return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_batch_create: num_seqs %d < 1", n);
    if (cfg->block_size < 1 || cfg->num_blocks < 0 || cfg->num_cross_blocks < 0)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "pa_batch_create: block_size %d (>= 1), num_blocks %lld and "
                        "num_cross_blocks %lld (>= 0)",
                        cfg->block_size, (long long)cfg->num_blocks, (long long)cfg->num_cross_blocks);
    int64_t pool;
    if (!pa__mul_i64(cfg->num_blocks, cfg->block_size, &pool) ||
        !pa__mul_i64(cfg->num_cross_blocks, cfg->block_size, &pool))
        return pa__fail(PA_STATUS_OVERFLOW, "pa_batch_create: num_blocks * block_size overflows");
    return PA_STATUS_OK;
}

pa_status pa_batch_create(const pa_batch_config *cfg, const pa_seq *seqs, int32_t n, pa_batch **out)
{
    if (out) *out = NULL;
    pa_status s = check_config(cfg, seqs, n, out);
    if (s) return s;
    bool decode_seen = false;
    int64_t tokens = 0, enc_tokens = 0, width = 0, cross_width = 0, kv_total = 0;
    for (int32_t i = 0; i < n; i++) {
        if ((s = check_seq(cfg, &seqs[i], i, &decode_seen))) return s;
        tokens += seqs[i].query_len;
        kv_total += (int64_t)seqs[i].context_len + seqs[i].query_len;
        if (kv_total > INT32_MAX) /* seq_start_loc is an int32 cumsum */
            return pa__fail(PA_STATUS_OVERFLOW,
                            "pa_batch_create: the sequence lengths up to seqs[%d] sum beyond int32", i);
        enc_tokens += seqs[i].encoder_len;
        int64_t need = seqs[i].num_blocks > 0
                           ? blocks_for((int64_t)seqs[i].context_len + seqs[i].query_len, cfg->block_size)
                           : 0;
        if (need > width) width = need;
        need = blocks_for(seqs[i].encoder_len, cfg->block_size);
        if (need > cross_width) cross_width = need;
        if (tokens > INT32_MAX || enc_tokens > INT32_MAX)
            return pa__fail(PA_STATUS_OVERFLOW, "pa_batch_create: more than INT32_MAX tokens");
    }
    /* int32 arrays: 3 x (n + 1) start locs, 5 x n per-seq, 2 tables; int64: 2 slot maps. */
    int64_t n32 = 3 * ((int64_t)n + 1) + 5 * (int64_t)n + (int64_t)n * width + (int64_t)n * cross_width;
    int64_t n64 = tokens + enc_tokens;
    if (n32 > INT64_MAX / 8 - n64)
        return pa__fail(PA_STATUS_OVERFLOW, "pa_batch_create: metadata size overflows");
    struct pa_batch *b = pa__calloc(1, sizeof *b);
    void *store = pa__calloc((size_t)(n64 * 8 + n32 * 4 + 8), 1);
    if (!b || !store) {
        pa__free(b);
        pa__free(store);
        return pa__fail(PA_STATUS_OUT_OF_MEMORY,
                        "pa_batch_create: out of memory for its %lld bytes of metadata (block tables "
                        "padded to the longest sequence: %d sequences x %lld blocks, %lld cross)",
                        (long long)(n64 * 8 + n32 * 4 + 8), n, (long long)width, (long long)cross_width);
    }
    b->storage = store;
    b->num_blocks = cfg->num_blocks;
    b->num_cross_blocks = cfg->num_cross_blocks;
    pa_batch_metadata *m = &b->md;
    int64_t *p64 = store;
    m->slot_mapping = p64;
    m->cross_slot_mapping = p64 + tokens;
    int32_t *p32 = (int32_t *)(p64 + n64);
    m->query_start_loc = p32, p32 += n + 1;
    m->seq_start_loc = p32, p32 += n + 1;
    m->encoder_start_loc = p32, p32 += n + 1;
    m->seq_lens = p32, p32 += n;
    m->context_lens = p32, p32 += n;
    m->query_lens = p32, p32 += n;
    m->encoder_seq_lens = p32, p32 += n;
    p32 += n; /* spare */
    m->block_tables = p32, p32 += n * width;
    m->cross_block_tables = p32;
    m->num_seqs = n;
    m->num_tokens = tokens;
    m->num_encoder_tokens = enc_tokens;
    m->block_size = cfg->block_size;
    m->max_blocks_per_seq = (int32_t)width;
    m->max_cross_blocks_per_seq = (int32_t)cross_width;
    b->tableless_seq = -1;
    for (int32_t i = n - 1; i >= 0; i--)
        if (seqs[i].num_blocks == 0) b->tableless_seq = i;
    fill_seq_arrays(b, seqs, n);
    fill_slots(b, cfg, seqs, n);
    if ((s = check_slots(m->slot_mapping, tokens, cfg->num_blocks * cfg->block_size, "slot_mapping")) ||
        (s = check_slots(m->cross_slot_mapping, enc_tokens, cfg->num_cross_blocks * cfg->block_size,
                         "cross_slot_mapping"))) {
        pa_batch_destroy(b);
        return s;
    }
    if (enc_tokens == 0) {
        m->encoder_seq_lens = m->encoder_start_loc = m->cross_block_tables = NULL;
        m->cross_slot_mapping = NULL;
    }
    b->id = atomic_fetch_add(&pa__next_batch_id, 1);
    *out = b;
    return PA_STATUS_OK;
}

void pa_batch_destroy(pa_batch *b)
{
    if (!b) return;
    pa__free(b->storage);
    pa__free(b);
}

const pa_batch_metadata *pa_batch_get_metadata(const pa_batch *b) { return b ? &b->md : NULL; }

pa_status pa_seqs_from_csr(int32_t n, const int32_t *qo_indptr, const int32_t *kv_indptr,
                           const int32_t *kv_indices, const int32_t *last_page_len,
                           int32_t block_size, pa_seq *seqs)
{
    if (!kv_indptr || !kv_indices || !last_page_len || !seqs)
        return pa__fail(PA_STATUS_NULL_POINTER, "pa_seqs_from_csr: kv_indptr, kv_indices, "
                                                "kv_last_page_len and seqs must not be NULL");
    if (n < 1 || block_size < 1)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_seqs_from_csr: num_seqs %d, block_size %d must be >= 1",
                        n, block_size);
    if (qo_indptr && qo_indptr[0] != 0) /* (the batch packs the queries from row 0) */
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "pa_seqs_from_csr: qo_indptr[0] = %d; it must be 0 (offset q instead)", qo_indptr[0]);
    for (int32_t i = 0; i < n; i++) {
        int64_t pages = (int64_t)kv_indptr[i + 1] - kv_indptr[i];
        int32_t last = last_page_len[i];
        if (kv_indptr[i] < 0 || pages < 0)
            return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                            "pa_seqs_from_csr: kv_indptr[%d..%d] = %d, %d is not non-decreasing from 0",
                            i, i + 1, kv_indptr[i], kv_indptr[i + 1]);
        if (pages > 0 ? (last < 1 || last > block_size) : last != 0)
            return pa__fail(PA_STATUS_OUT_OF_RANGE,
                            "pa_seqs_from_csr: kv_last_page_len[%d] = %d not in %s", i, last,
                            pages > 0 ? "[1, block_size]" : "{0} for a sequence with no pages");
        int64_t kv_len = pages > 0 ? (pages - 1) * block_size + last : 0;
        int64_t q = qo_indptr ? (int64_t)qo_indptr[i + 1] - qo_indptr[i] : 1;
        if (q < 1 || q > kv_len || kv_len > INT32_MAX)
            return pa__fail(PA_STATUS_OUT_OF_RANGE,
                            "pa_seqs_from_csr: sequence %d has query_len %lld and kv_len %lld "
                            "(need 1 <= query_len <= kv_len)", i, (long long)q, (long long)kv_len);
    }
    for (int32_t i = 0; i < n; i++) {
        int64_t pages = (int64_t)kv_indptr[i + 1] - kv_indptr[i];
        int32_t kv_len = pages > 0 ? (int32_t)((pages - 1) * block_size + last_page_len[i]) : 0;
        int32_t q = qo_indptr ? qo_indptr[i + 1] - qo_indptr[i] : 1;
        memset(&seqs[i], 0, sizeof seqs[i]);
        seqs[i].block_table = kv_indices + kv_indptr[i];
        seqs[i].num_blocks = (int32_t)pages;
        seqs[i].query_len = q;
        seqs[i].context_len = kv_len - q;
        seqs[i].is_prefill = q > 1;
    }
    return PA_STATUS_OK;
}
