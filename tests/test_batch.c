/* test_batch.c: the batch builder (vLLM's AttentionMetadataBuilder) on hand-worked batches,
 * with every expected array written out: query/seq start locations, lengths, padded block
 * tables, derived and explicit slot mappings, the prefill/decode counts and maxima, chunked
 * prefill, speculative decode, encoder-decoder fields, shared physical blocks, and FlashInfer's
 * CSR page table through pa_seqs_from_csr. */
#include "test.h"

#include <stdint.h>

#define CHECK_I32_ARRAY(got, n, ...)                                                         \
    do {                                                                                     \
        const int32_t want__[] = {__VA_ARGS__};                                              \
        CHECK_INT((int)(sizeof want__ / sizeof want__[0]), (n));                             \
        CHECK((got) != NULL);                                                                \
        for (int i__ = 0; (got) && i__ < (n); i__++)                                         \
            if ((got)[i__] != want__[i__]) {                                                 \
                TEST_FAIL("%s[%d] = %lld, want %lld", #got, i__, (long long)(got)[i__],      \
                          (long long)want__[i__]);                                           \
                break;                                                                       \
            }                                                                                \
    } while (0)
#define CHECK_I64_ARRAY(got, n, ...)                                                         \
    do {                                                                                     \
        const int64_t want__[] = {__VA_ARGS__};                                              \
        CHECK_INT((int)(sizeof want__ / sizeof want__[0]), (n));                             \
        CHECK((got) != NULL);                                                                \
        for (int i__ = 0; (got) && i__ < (n); i__++)                                         \
            if ((got)[i__] != want__[i__]) {                                                 \
                TEST_FAIL("%s[%d] = %lld, want %lld", #got, i__, (long long)(got)[i__],      \
                          (long long)want__[i__]);                                           \
                break;                                                                       \
            }                                                                                \
    } while (0)

static pa_seq seq(int32_t context, int32_t query, int prefill, const int32_t *table, int32_t nb)
{
    pa_seq s;
    memset(&s, 0, sizeof s);
    s.context_len = context;
    s.query_len = query;
    s.is_prefill = prefill;
    s.block_table = table;
    s.num_blocks = nb;
    return s;
}

/* block_size 4, 16 blocks. Four sequences:
 *   0 prefill            c=0 q=5  table [3,7]     positions 0..4 -> slots 12 13 14 15 28
 *   1 chunked prefill    c=6 q=3  table [2,9,11]  positions 6 7 8 -> 38 39 44
 *   2 decode             c=4 q=1  table [5,0]     position 4      -> 0
 *   3 speculative decode c=7 q=3  table [1,6,10]  positions 7 8 9 -> 27 40 41 */
static void test_mixed_batch(void)
{
    int32_t t0[2] = {3, 7}, t1[3] = {2, 9, 11}, t2[2] = {5, 0}, t3[3] = {1, 6, 10};
    pa_seq s[4] = {seq(0, 5, 1, t0, 2), seq(6, 3, 1, t1, 3), seq(4, 1, 0, t2, 2), seq(7, 3, 0, t3, 3)};
    pa_batch_config cfg = {4, 16, 0, NULL, NULL};
    pa_batch *b = NULL;
    CHECK_OK(pa_batch_create(&cfg, s, 4, &b));
    const pa_batch_metadata *m = pa_batch_get_metadata(b);
    CHECK(m != NULL);
    if (!m) return;
    CHECK_INT(m->num_seqs, 4);
    CHECK_INT(m->num_prefills, 2);
    CHECK_INT(m->num_prefill_tokens, 8);
    CHECK_INT(m->num_decode_tokens, 4);
    CHECK_INT(m->num_tokens, 12);
    CHECK_INT(m->max_query_len, 5);
    CHECK_INT(m->max_seq_len, 10);
    CHECK_INT(m->max_prefill_seq_len, 9);
    CHECK_INT(m->max_decode_seq_len, 10);
    CHECK_INT(m->max_decode_query_len, 3);
    CHECK_INT(m->block_size, 4);
    CHECK_I32_ARRAY(m->query_start_loc, 5, 0, 5, 8, 9, 12);
    CHECK_I32_ARRAY(m->seq_start_loc, 5, 0, 5, 14, 19, 29);
    CHECK_I32_ARRAY(m->seq_lens, 4, 5, 9, 5, 10);
    CHECK_I32_ARRAY(m->context_lens, 4, 0, 6, 4, 7);
    CHECK_I32_ARRAY(m->query_lens, 4, 5, 3, 1, 3);
    CHECK_INT(m->max_blocks_per_seq, 3);
    CHECK_I32_ARRAY(m->block_tables, 12, 3, 7, 0, 2, 9, 11, 5, 0, 0, 1, 6, 10);
    CHECK_I64_ARRAY(m->slot_mapping, 12, 12, 13, 14, 15, 28, 38, 39, 44, 0, 27, 40, 41);
    /* no encoder: all encoder fields zero / NULL */
    CHECK_INT(m->num_encoder_tokens, 0);
    CHECK_INT(m->max_encoder_seq_len, 0);
    CHECK_INT(m->max_cross_blocks_per_seq, 0);
    CHECK(m->encoder_seq_lens == NULL && m->encoder_start_loc == NULL);
    CHECK(m->cross_block_tables == NULL && m->cross_slot_mapping == NULL);
    /* the batch copied everything: changing the caller's tables changes nothing */
    t0[0] = 15;
    t1[2] = 14;
    CHECK_INT(m->block_tables[0], 3);
    CHECK_INT(m->block_tables[5], 11);
    CHECK_INT(m->slot_mapping[0], 12);
    pa_batch_destroy(b);
}

/* A decode-only batch, block_size 3 (odd), and a table longer than needed: only the blocks
 * the sequence uses enter the padded table. seq 0: c=6 q=1 -> 7 tokens need 3 blocks of [4,2,8,1]
 * (slot 8*3+0 = 24); seq 1: c=0 q=1 table [0] -> slot 0. Width 3. */
static void test_decode_only(void)
{
    const int32_t t0[4] = {4, 2, 8, 1}, t1[1] = {0};
    pa_seq s[2] = {seq(6, 1, 0, t0, 4), seq(0, 1, 0, t1, 1)};
    pa_batch_config cfg = {3, 9, 0, NULL, NULL};
    pa_batch *b = NULL;
    CHECK_OK(pa_batch_create(&cfg, s, 2, &b));
    const pa_batch_metadata *m = pa_batch_get_metadata(b);
    CHECK_INT(m->num_prefills, 0);
    CHECK_INT(m->num_prefill_tokens, 0);
    CHECK_INT(m->num_decode_tokens, 2);
    CHECK_INT(m->max_prefill_seq_len, 0);
    CHECK_INT(m->max_decode_seq_len, 7);
    CHECK_INT(m->max_decode_query_len, 1);
    CHECK_INT(m->max_query_len, 1);
    CHECK_INT(m->max_blocks_per_seq, 3);
    CHECK_I32_ARRAY(m->block_tables, 6, 4, 2, 8, 0, 0, 0);
    CHECK_I64_ARRAY(m->slot_mapping, 2, 24, 0);
    CHECK_I32_ARRAY(m->seq_start_loc, 3, 0, 7, 8);
    pa_batch_destroy(b);
}

/* Encoder-decoder: block_size 2, 8 self blocks, 6 cross blocks.
 *   0 prefill c=0 q=2 table [4]    -> slots 8 9;   encoder_len 3, cross [5,1] -> 10 11 2
 *   1 decode  c=3 q=1 table [0,7]  -> slot 15;     encoder_len 1, cross [3]   -> 6 */
static void test_encoder_decoder(void)
{
    const int32_t t0[1] = {4}, t1[2] = {0, 7}, c0[2] = {5, 1}, c1[1] = {3};
    pa_seq s[2] = {seq(0, 2, 1, t0, 1), seq(3, 1, 0, t1, 2)};
    s[0].encoder_len = 3, s[0].cross_block_table = c0, s[0].num_cross_blocks = 2;
    s[1].encoder_len = 1, s[1].cross_block_table = c1, s[1].num_cross_blocks = 1;
    pa_batch_config cfg = {2, 8, 6, NULL, NULL};
    pa_batch *b = NULL;
    CHECK_OK(pa_batch_create(&cfg, s, 2, &b));
    const pa_batch_metadata *m = pa_batch_get_metadata(b);
    CHECK_INT(m->num_tokens, 3);
    CHECK_I64_ARRAY(m->slot_mapping, 3, 8, 9, 15);
    CHECK_INT(m->num_encoder_tokens, 4);
    CHECK_INT(m->max_encoder_seq_len, 3);
    CHECK_I32_ARRAY(m->encoder_seq_lens, 2, 3, 1);
    CHECK_I32_ARRAY(m->encoder_start_loc, 3, 0, 3, 4);
    CHECK_INT(m->max_cross_blocks_per_seq, 2);
    CHECK_I32_ARRAY(m->cross_block_tables, 4, 5, 1, 3, 0);
    CHECK_I64_ARRAY(m->cross_slot_mapping, 4, 10, 11, 2, 6);
    CHECK_I32_ARRAY(m->block_tables, 4, 4, 0, 0, 7);
    CHECK_INT(m->max_blocks_per_seq, 2);
    pa_batch_destroy(b);

    /* explicit slot mappings (with -1) override the derived ones */
    const int64_t sm[3] = {-1, 9, 15}, csm[4] = {-1, 11, 2, -1};
    cfg.slot_mapping = sm;
    cfg.cross_slot_mapping = csm;
    CHECK_OK(pa_batch_create(&cfg, s, 2, &b));
    m = pa_batch_get_metadata(b);
    CHECK_I64_ARRAY(m->slot_mapping, 3, -1, 9, 15);
    CHECK_I64_ARRAY(m->cross_slot_mapping, 4, -1, 11, 2, -1);
    /* the tables are still the caller's */
    CHECK_I32_ARRAY(m->cross_block_tables, 4, 5, 1, 3, 0);
    pa_batch_destroy(b);
}

/* Explicit slot mapping for a decoder batch: the caller's slots (-1 = do not write), even ones
 * that differ from the derived slots, are taken as given. block_size 4, 4 blocks. */
static void test_explicit_slots(void)
{
    const int32_t t0[1] = {2}, t1[1] = {1};
    pa_seq s[2] = {seq(0, 3, 1, t0, 1), seq(1, 1, 0, t1, 1)};
    const int64_t sm[4] = {8, -1, 10, 5};
    pa_batch_config cfg = {4, 4, 0, sm, NULL};
    pa_batch *b = NULL;
    CHECK_OK(pa_batch_create(&cfg, s, 2, &b));
    const pa_batch_metadata *m = pa_batch_get_metadata(b);
    CHECK_I64_ARRAY(m->slot_mapping, 4, 8, -1, 10, 5);
    pa_batch_destroy(b);
    /* all padding */
    const int64_t pad[4] = {-1, -1, -1, -1};
    cfg.slot_mapping = pad;
    CHECK_OK(pa_batch_create(&cfg, s, 2, &b));
    CHECK_I64_ARRAY(pa_batch_get_metadata(b)->slot_mapping, 4, -1, -1, -1, -1);
    pa_batch_destroy(b);
}

/* Shared physical blocks: a forked prefix (both sequences read block 2) is fine as long as no
 * slot is written twice. block_size 4, 6 blocks:
 *   0 prefill c=0 q=4 table [2]    -> slots 8 9 10 11
 *   1 prefill c=4 q=2 table [2,5]  -> slots 20 21   (reads block 2, writes block 5)
 *   2 decode  c=5 q=1 table [2,3]  -> slot 13
 * Writing the same slot twice is rejected: seq 1 with c=2 q=2 table [2] would write 10, 11. */
static void test_shared_blocks(void)
{
    const int32_t a[1] = {2}, b5[2] = {2, 5}, c3[2] = {2, 3};
    pa_seq s[3] = {seq(0, 4, 1, a, 1), seq(4, 2, 1, b5, 2), seq(5, 1, 0, c3, 2)};
    pa_batch_config cfg = {4, 6, 0, NULL, NULL};
    pa_batch *b = NULL;
    CHECK_OK(pa_batch_create(&cfg, s, 3, &b));
    const pa_batch_metadata *m = pa_batch_get_metadata(b);
    CHECK_I64_ARRAY(m->slot_mapping, 7, 8, 9, 10, 11, 20, 21, 13);
    CHECK_I32_ARRAY(m->block_tables, 6, 2, 0, 2, 5, 2, 3);
    pa_batch_destroy(b);
    s[1] = seq(2, 2, 1, a, 1);
    b = (pa_batch *)&cfg; /* must be reset to NULL on failure */
    CHECK_FAILS_WITH(pa_batch_create(&cfg, s, 3, &b), PA_STATUS_INVALID_ARGUMENT, "slot 10 twice");
    CHECK(b == NULL);
}

/* Encoder / encoder_only batches carry no block tables: every slot is -1, width 0. */
static void test_tableless(void)
{
    pa_seq s[2] = {seq(0, 3, 1, NULL, 0), seq(0, 2, 1, NULL, 0)};
    pa_batch_config cfg = {16, 0, 0, NULL, NULL};
    pa_batch *b = NULL;
    CHECK_OK(pa_batch_create(&cfg, s, 2, &b));
    const pa_batch_metadata *m = pa_batch_get_metadata(b);
    CHECK_INT(m->max_blocks_per_seq, 0);
    CHECK_INT(m->num_prefills, 2);
    CHECK_INT(m->num_prefill_tokens, 5);
    CHECK_I64_ARRAY(m->slot_mapping, 5, -1, -1, -1, -1, -1);
    CHECK_I32_ARRAY(m->query_start_loc, 3, 0, 3, 5);
    CHECK_I32_ARRAY(m->seq_lens, 2, 3, 2);
    pa_batch_destroy(b);
    pa_batch_destroy(NULL);
    CHECK(pa_batch_get_metadata(NULL) == NULL);
}

/* Each batch gets its own identity: two builds of the same batch differ (a plan made for one
 * is rejected for the other; see test_validation). Metadata of each is independent. */
static void test_two_batches(void)
{
    const int32_t t[1] = {0};
    pa_seq s = seq(0, 1, 0, t, 1);
    pa_batch_config cfg = {1, 1, 0, NULL, NULL};
    pa_batch *a = NULL, *b = NULL;
    CHECK_OK(pa_batch_create(&cfg, &s, 1, &a));
    CHECK_OK(pa_batch_create(&cfg, &s, 1, &b));
    CHECK(a != b && pa_batch_get_metadata(a) != pa_batch_get_metadata(b));
    CHECK_INT(pa_batch_get_metadata(a)->slot_mapping[0], 0);
    CHECK_INT(pa_batch_get_metadata(b)->seq_lens[0], 1);
    pa_batch_destroy(a);
    pa_batch_destroy(b);
}

/* FlashInfer's CSR example: pages [0,5,8], [1,6,7], [3,4] -> indices [0,5,8,1,6,7,3,4], indptr
 * [0,3,6,8], last_page_len [2,4,1], block_size 4: kv_len 2*4+2 = 10, 2*4+4 = 12, 1*4+1 = 5.
 * qo_indptr [0,4,5,6]: query 4 (prefill, context 6), 1 (decode, context 11), 1 (context 4).
 * Slots: seq 0 positions 6..9 -> 5*4+2 = 22, 23, 8*4+0 = 32, 33; seq 1 position 11 -> 7*4+3 = 31;
 * seq 2 position 4 -> 4*4+0 = 16. */
static void test_csr(void)
{
    const int32_t indices[8] = {0, 5, 8, 1, 6, 7, 3, 4}, indptr[4] = {0, 3, 6, 8};
    const int32_t last[3] = {2, 4, 1}, qo[4] = {0, 4, 5, 6};
    pa_seq s[3];
    memset(s, 0x5A, sizeof s);
    CHECK_OK(pa_seqs_from_csr(3, qo, indptr, indices, last, 4, s));
    CHECK(s[0].block_table == indices && s[1].block_table == indices + 3 && s[2].block_table == indices + 6);
    CHECK_INT(s[0].num_blocks, 3);
    CHECK_INT(s[1].num_blocks, 3);
    CHECK_INT(s[2].num_blocks, 2);
    CHECK_INT(s[0].query_len, 4);
    CHECK_INT(s[0].context_len, 6);
    CHECK_INT(s[0].is_prefill != 0, 1);
    CHECK_INT(s[1].query_len, 1);
    CHECK_INT(s[1].context_len, 11);
    CHECK_INT(s[1].is_prefill, 0);
    CHECK_INT(s[2].query_len, 1);
    CHECK_INT(s[2].context_len, 4);
    CHECK_INT(s[2].is_prefill, 0);
    for (int i = 0; i < 3; i++) {
        CHECK_INT(s[i].encoder_len, 0);
        CHECK_INT(s[i].num_cross_blocks, 0);
        CHECK(s[i].cross_block_table == NULL);
    }
    pa_batch_config cfg = {4, 9, 0, NULL, NULL};
    pa_batch *b = NULL;
    CHECK_OK(pa_batch_create(&cfg, s, 3, &b));
    const pa_batch_metadata *m = pa_batch_get_metadata(b);
    CHECK_I32_ARRAY(m->seq_lens, 3, 10, 12, 5);
    CHECK_I32_ARRAY(m->context_lens, 3, 6, 11, 4);
    CHECK_I32_ARRAY(m->query_start_loc, 4, 0, 4, 5, 6);
    CHECK_I32_ARRAY(m->seq_start_loc, 4, 0, 10, 22, 27);
    CHECK_I32_ARRAY(m->block_tables, 9, 0, 5, 8, 1, 6, 7, 3, 4, 0);
    CHECK_I64_ARRAY(m->slot_mapping, 6, 22, 23, 32, 33, 31, 16);
    CHECK_INT(m->num_prefills, 1);
    CHECK_INT(m->num_prefill_tokens, 4);
    CHECK_INT(m->num_decode_tokens, 2);
    CHECK_INT(m->max_decode_seq_len, 12);
    CHECK_INT(m->max_prefill_seq_len, 10);
    pa_batch_destroy(b);

    /* qo_indptr NULL: one query token each, all decodes: contexts 9, 11, 4; slots of the last
     * positions: 9 -> 8*4+1 = 33, 11 -> 31, 4 -> 16 */
    CHECK_OK(pa_seqs_from_csr(3, NULL, indptr, indices, last, 4, s));
    CHECK_INT(s[0].context_len, 9);
    CHECK_INT(s[0].query_len, 1);
    CHECK_INT(s[0].is_prefill, 0);
    CHECK_OK(pa_batch_create(&cfg, s, 3, &b));
    CHECK_I64_ARRAY(pa_batch_get_metadata(b)->slot_mapping, 3, 33, 31, 16);
    CHECK_INT(pa_batch_get_metadata(b)->num_prefills, 0);
    pa_batch_destroy(b);

    /* a non-zero indptr start (a slice of a larger table) works too: pages [6,7],[3,4] */
    const int32_t indptr2[3] = {4, 6, 8}, last2[2] = {3, 4};
    CHECK_OK(pa_seqs_from_csr(2, NULL, indptr2, indices, last2, 4, s));
    CHECK(s[0].block_table == indices + 4);
    CHECK_INT(s[0].context_len, 6); /* kv_len 4 + 3 = 7 */
    CHECK_INT(s[1].context_len, 7); /* kv_len 8 */
}

int main(void)
{
    test_mixed_batch();
    test_decode_only();
    test_encoder_decoder();
    test_explicit_slots();
    test_shared_blocks();
    test_tableless();
    test_two_batches();
    test_csr();
    return test_exit();
}
