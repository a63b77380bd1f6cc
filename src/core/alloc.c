/* alloc.c: the one allocator every library allocation goes through, replaceable by the caller. */
/* _DEFAULT_SOURCE: POSIX 2008 (posix_memalign) and, on Linux, MADV_HUGEPAGE; under
 * _POSIX_C_SOURCE alone glibc hides MADV_HUGEPAGE and the advice below compiled to nothing */
#define _DEFAULT_SOURCE
#include "internal.h"

#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define PA__ALIGN 64

static void *default_alloc(void *user, size_t size, size_t alignment)
{
    (void)user;
    void *p = NULL;
    if (size == 0) size = alignment;
    if (posix_memalign(&p, alignment, size) != 0) return NULL;
    return p;
}

static void default_free(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

static pa_allocator pa__allocator = {default_alloc, default_free, NULL};

void pa_set_allocator(const pa_allocator *allocator)
{
    if (allocator && allocator->alloc && allocator->free)
        pa__allocator = *allocator;
    else
        pa__allocator = (pa_allocator){default_alloc, default_free, NULL};
}

void *pa__alloc(size_t size) { return pa__allocator.alloc(pa__allocator.user, size, PA__ALIGN); }

void *pa__calloc(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size) return NULL;
    void *p = pa__alloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

void *pa__alloc_pool(size_t size)
{
    const size_t huge = (size_t)2 << 20;
    if (size < 2 * huge) return pa__calloc(1, size);
    size_t rounded = (size + huge - 1) / huge * huge;
    void *p = pa__allocator.alloc(pa__allocator.user, rounded, huge);
    if (!p) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, rounded, MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
    memset(p, 0, size);
    return p;
}

void pa__free(void *ptr)
{
    if (ptr) pa__allocator.free(pa__allocator.user, ptr);
}

bool pa__mul_i64(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0) return false;
    if (a != 0 && b > INT64_MAX / a) return false;
    *out = a * b;
    return true;
}

bool pa__add_i64(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0 || a > INT64_MAX - b) return false;
    *out = a + b;
    return true;
}
