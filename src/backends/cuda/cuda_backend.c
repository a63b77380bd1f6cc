/* cuda_backend.c: the registry entry of the cuda backend (kernels and host logic live in the
 * .cu files beside this one). Unverified on hardware: see cuda_backend.h. */
#include "cuda_backend.h"

const struct pa_backend pa__backend_cuda = {
    .name = "cuda",
    .description = "NVIDIA GPUs through the CUDA runtime (sm_80/sm_90 builds; checked on an H200 and an H100)",
    .preferred_layout = PA_LAYOUT_NHD,
    .memory = PA_MEMORY_CUDA,
    .available = pa__cuda_available,
    .info = pa__cuda_info,
    .supports = pa__cuda_supports,
    .context_create = pa__cuda_context_create,
    .context_destroy = pa__cuda_context_destroy,
    .set_num_threads = NULL,
    .num_threads = NULL,
    .synchronize = pa__cuda_synchronize,
    .plan_create = pa__cuda_plan_create,
    .plan_destroy = pa__cuda_plan_destroy,
    .forward = pa__cuda_forward,
    .cache_write = pa__cuda_cache_write,
    .copy_blocks = pa__cuda_copy_blocks,
    .swap_blocks = pa__cuda_swap_blocks,
    .merge_states = pa__cuda_merge_states,
};
