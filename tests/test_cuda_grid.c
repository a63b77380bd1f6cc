/* test_cuda_grid.c: the shared case grid on the cuda backend against the reference, buffers
 * staged through device memory. Skips (exit 77) with the reason when the backend is not built
 * (PAGEDATTN_CUDA=OFF or no nvcc) or no CUDA device can be used here. Optional argv[1]: a
 * case-name filter.
 *
 * The device helpers come from the backend itself (pa__cuda_testing, internal), reached through
 * a weak reference so that this file links whether or not the backend is built. */
#include "grid.h"
#include "test.h"

#include "backends/cuda/cuda_backend.h"

#if defined(__GNUC__)
extern const pa__cuda_test_hooks *pa__cuda_testing(void) __attribute__((weak));
#  define HAVE_HOOKS_SYMBOL (pa__cuda_testing != NULL)
#else
#  define HAVE_HOOKS_SYMBOL 0
#endif

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
    const pa_backend *cuda = pa_backend_find("cuda");
    if (!cuda || !HAVE_HOOKS_SYMBOL) {
        printf("SKIP: the cuda backend is not built into this library (PAGEDATTN_CUDA=OFF, or "
               "AUTO found no nvcc)\n");
        return 77;
    }
    char reason[256] = "";
    if (!pa_backend_available(cuda, reason, sizeof reason)) {
        printf("SKIP: the cuda backend is built but cannot run here: %s\n", reason);
        return 77;
    }
    printf("%s", pa_backend_info(cuda));
    H = pa__cuda_testing();
    const grid_device_hooks hooks = {d_alloc, d_free, d_to_device, d_to_host};
    grid_set_device_hooks(&hooks);
    const char *filter = argc > 1 ? argv[1] : NULL;
    int fails = grid_run_all(cuda, filter, 0, stdout);
    printf("== cuda: %d failures\n", fails);
    CHECK_INT(fails, 0);
    grid_set_device_hooks(NULL);
    return test_exit();
}
