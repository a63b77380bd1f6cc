/* test_cuda_grid.c: the shared case grid on the cuda backend against the reference, buffers
 * staged through device memory. Skips (exit 77) with the reason when the backend is not built
 * (PAGEDATTN_CUDA=OFF or no nvcc) or no CUDA device can be used here. Optional argv[1]: a
 * case-name filter.
 *
 * The device helpers come from the backend itself (pa__cuda_testing, internal), reached through
 * a weak reference so that this file links whether or not the backend is built.
 *
 * PAGEDATTN_CUDA_SWEEP="SEED COUNT" adds a random sweep (grid_random_sweep): each case against the
 * reference, run twice (bits must match), and each sequence alone (the batch's bits again). */
#define _POSIX_C_SOURCE 200809L
#include "grid.h"
#include "test.h"

#include "cuda_test.h"

#include <stdlib.h>

static const pa__cuda_test_hooks *H;

static void *d_alloc(size_t bytes)
{
    void *p = NULL;
    return H->malloc_dev(&p, bytes ? bytes : 1) == 0 ? p : NULL;
}
static void d_free(void *p) { (void)H->free_dev(p); }
static int d_to_device(void *dst, const void *src, size_t bytes) { return H->memcpy_sync(dst, src, bytes, 0); }
static int d_to_host(void *dst, const void *src, size_t bytes) { return H->memcpy_sync(dst, src, bytes, 1); }

int main(int argc, char **argv)
{
    const pa_backend *cuda = cuda_test_open(&H);
    if (!cuda) return 77;
    printf("%s", pa_backend_info(cuda));
    const grid_device_hooks hooks = {d_alloc, d_free, d_to_device, d_to_host};
    grid_set_device_hooks(&hooks);
    const char *filter = argc > 1 ? argv[1] : NULL;
    int fails = grid_run_all(cuda, filter, 0, stdout);
    const char *sweep = getenv("PAGEDATTN_CUDA_SWEEP");
    if (sweep) {
        char *end = NULL;
        unsigned long long seed = strtoull(sweep, &end, 0);
        int count = (int)strtol(end, NULL, 0);
        CHECK(count > 0);
        fails += grid_random_sweep(cuda, seed, count, 0, 1, false, stdout);
    }
    printf("== cuda: %d failures\n", fails);
    CHECK_INT(fails, 0);
    grid_set_device_hooks(NULL);
    return test_exit();
}
