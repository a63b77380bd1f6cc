/* cuda_backend.h: the hooks of the cuda backend, shared by its registry entry (cuda_backend.c,
 * plain C) and their CUDA C++ implementations (cuda_host.cu, cuda_attn.cu, cuda_ops.cu).
 *
 * Checked on an NVIDIA H200 by src/backends/cuda/devcheck.sh (NOTES.md beside this file); it
 * builds without a GPU and its tests then skip with the reason.
 */
#ifndef PAGEDATTN_CUDA_BACKEND_H
#define PAGEDATTN_CUDA_BACKEND_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

bool pa__cuda_available(char *reason, size_t reason_size);
const char *pa__cuda_info(void);
pa_status pa__cuda_supports(const struct pa_layer *layer);
pa_status pa__cuda_context_create(const pa_context_options *opt, void **impl);
void pa__cuda_context_destroy(void *impl);
pa_status pa__cuda_synchronize(void *impl);
pa_status pa__cuda_plan_create(void *impl, const struct pa_layer *layer,
                               const struct pa_batch *batch, void **plan);
void pa__cuda_plan_destroy(void *plan);
pa_status pa__cuda_forward(void *impl, const pa__fwd *f, void *plan);
pa_status pa__cuda_cache_write(void *impl, const pa_cache *c, pa_dtype src_dtype, const void *key,
                               int64_t k_row_stride, const void *value, int64_t v_row_stride,
                               const int64_t *slots, int64_t n, float k_scale, float v_scale);
pa_status pa__cuda_copy_blocks(void *impl, const pa_cache *caches, int32_t num_layers,
                               const int64_t *pairs, int64_t num_pairs);
pa_status pa__cuda_swap_blocks(void *impl, const pa_cache *src, const pa_cache *dst,
                               const int64_t *pairs, int64_t num_pairs);
pa_status pa__cuda_merge_states(void *impl, const pa_merge_args *a);

/* For tests only (tests/test_cuda_ops.c reaches it through a weak reference, so the test links
 * whether or not the backend is built): device memory helpers on the current device. Each
 * returns 0 on success. kind: 0 host->device, 1 device->host, 2 device->device. */
typedef struct pa__cuda_test_hooks {
    int (*malloc_dev)(void **ptr, size_t size);
    int (*free_dev)(void *ptr);
    int (*memcpy_sync)(void *dst, const void *src, size_t size, int kind);
    int (*memset_dev)(void *ptr, int value, size_t size);
} pa__cuda_test_hooks;
const pa__cuda_test_hooks *pa__cuda_testing(void);

#ifdef __cplusplus
}
#endif

#endif
