/* cuda_test.h: what the cuda tests share: the backend's device helpers (pa__cuda_testing,
 * internal), reached through a weak reference so that a test links whether or not the backend
 * is built, and the decision to skip (exit 77, with the reason) when it cannot run here. */
#ifndef PAGEDATTN_CUDA_TEST_H
#define PAGEDATTN_CUDA_TEST_H

#include "pagedattn.h"

#include "backends/cuda/cuda_backend.h"

#include <stdio.h>

#if defined(__GNUC__)
extern const pa__cuda_test_hooks *pa__cuda_testing(void) __attribute__((weak));
#  define CUDA_TEST_HAVE_HOOKS (pa__cuda_testing != NULL)
#else
#  define CUDA_TEST_HAVE_HOOKS 0
#endif

/* The cuda backend and its device helpers (*hooks), or NULL after printing why the test skips. */
static inline const pa_backend *cuda_test_open(const pa__cuda_test_hooks **hooks)
{
    const pa_backend *cuda = pa_backend_find("cuda");
    char reason[256] = "";
    if (!cuda || !CUDA_TEST_HAVE_HOOKS) {
        printf("SKIP: the cuda backend is not built into this library (PAGEDATTN_CUDA=OFF, or "
               "AUTO found no nvcc)\n");
        return NULL;
    }
    if (!pa_backend_available(cuda, reason, sizeof reason)) {
        printf("SKIP: the cuda backend is built but cannot run here: %s\n", reason);
        return NULL;
    }
#if defined(__GNUC__)
    *hooks = pa__cuda_testing();
#endif
    return cuda;
}

#endif
