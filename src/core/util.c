/* util.c: small shared helpers. */
#include "internal.h"

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

bool pa__rows_equal(const void *a, int64_t as, const void *b, int64_t bs, int64_t rows, int64_t row, size_t es,
                    bool host)
{
    if (a == b && as == bs) return true;
    if (!host) return false; /* (device memory: not read here) */
    for (int64_t r = 0; r < rows; r++)
        if (memcmp((const char *)a + (size_t)(r * as) * es, (const char *)b + (size_t)(r * bs) * es, (size_t)row * es))
            return false;
    return true;
}

bool pa__ranges_overlap(const void *a, size_t an, const void *b, size_t bn)
{
    const uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return an > 0 && bn > 0 && (pa < pb ? pb - pa < an : pa - pb < bn); /* (no end computed: none wraps) */
}

/* (id, pair index) of a destination, sorted by id */
typedef struct {
    int64_t id, pair;
} id_pair;

static int cmp_id_pair(const void *x, const void *y)
{
    const int64_t a = ((const id_pair *)x)->id, b = ((const id_pair *)y)->id;
    return (a > b) - (a < b);
}

pa_status pa__find_chained_pair(const int64_t *v, int64_t n, bool *found, int64_t *dst_pair, int64_t *src_pair)
{
    *found = false;
    if (n <= 0) return PA_STATUS_OK;
    id_pair *d = pa__alloc((size_t)n * sizeof *d);
    if (!d) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "out of memory checking block pairs");
    for (int64_t i = 0; i < n; i++) d[i] = (id_pair){v[2 * i + 1], i};
    qsort(d, (size_t)n, sizeof *d, cmp_id_pair);
    for (int64_t q = 0; q < n && !*found; q++) {
        const id_pair key = {v[2 * q], 0};
        const id_pair *hit = bsearch(&key, d, (size_t)n, sizeof *d, cmp_id_pair);
        if (hit) {
            *found = true;
            *dst_pair = hit->pair;
            *src_pair = q;
        }
    }
    pa__free(d);
    return PA_STATUS_OK;
}

pa_status pa__find_duplicate(const int64_t *v, int64_t n, int64_t stride, bool skip_negative,
                             bool *found, int64_t *dup)
{
    *found = false;
    if (n <= 1) return PA_STATUS_OK;
    int64_t *s = pa__alloc((size_t)n * sizeof *s);
    if (!s) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "out of memory checking for duplicates");
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (!skip_negative || v[i * stride] >= 0) s[m++] = v[i * stride];
    qsort(s, (size_t)m, sizeof *s, cmp_i64);
    for (int64_t i = 1; i < m && !*found; i++)
        if (s[i] == s[i - 1]) {
            *found = true;
            *dup = s[i];
        }
    pa__free(s);
    return PA_STATUS_OK;
}
