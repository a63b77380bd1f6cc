/* util.c: small shared helpers. */
#include "internal.h"

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
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
