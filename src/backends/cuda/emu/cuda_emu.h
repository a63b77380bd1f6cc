/* cuda_emu.h: a CPU emulator for the cuda backend's kernels (PA_CU_EMULATE builds only; never
 * part of the library). Each CUDA thread of a block runs as a fiber on one OS thread; the
 * fibers switch at __syncthreads and at warp shuffles, which become real barriers over the
 * block or the warp. The CUDA runtime calls the backend makes are implemented over host memory
 * in cuda_emu.cpp. A divergent barrier (some threads never arrive) is reported and aborts.
 *
 * What this checks: indexing, masking, online-softmax and split/combine logic, barrier
 * placement, warp-uniformity of shuffles, shared-memory bounds (under AddressSanitizer, shared
 * memory is a malloc'd block of exactly the launch's size). What it cannot: the hardware's
 * memory model, timing, real occupancy limits, nvcc's code generation. */
#ifndef PA_CUDA_EMU_H
#define PA_CUDA_EMU_H

#include <cuda_runtime.h>

#include <functional>
#include <stdint.h>
#include <string.h>

namespace pa_emu {
struct state {
    uint3 thread, block;
    dim3 block_dim, grid_dim;
    void *dyn_smem;
};
extern state g;
void syncthreads();
/* Warp shuffles move 32-bit patterns: float, int and unsigned values arrive bit for bit (as on
 * the GPU, whose __shfl_sync has overloads for each). */
uint32_t shfl_bits(uint32_t v, int src_lane_or_xor, bool is_xor);
inline float shfl(float v, int a, bool x)
{
    uint32_t b;
    memcpy(&b, &v, 4);
    b = shfl_bits(b, a, x);
    memcpy(&v, &b, 4);
    return v;
}
inline int shfl(int v, int a, bool x) { return (int)shfl_bits((uint32_t)v, a, x); }
inline unsigned shfl(unsigned v, int a, bool x) { return shfl_bits(v, a, x); }
void warp_gather(const uint32_t *mine, int n, uint32_t *all);
/* Votes: any lane of the warp, any thread of the block (barriers, as on the GPU). */
inline int any_sync(int pred)
{
    uint32_t mine = pred != 0, all[32];
    warp_gather(&mine, 1, all);
    for (int i = 0; i < 32; i++)
        if (all[i]) return 1;
    return 0;
}
inline void syncwarp()
{
    uint32_t none = 0;
    warp_gather(&none, 0, &none);
}
inline int syncthreads_or(int pred)
{
    static int acc;
    syncthreads(); /* every thread has read the previous vote */
    if (g.thread.x == 0 && g.thread.y == 0 && g.thread.z == 0) acc = 0;
    syncthreads();
    if (pred) acc = 1;
    syncthreads();
    int r = acc;
    syncthreads();
    return r;
}
void launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
} // namespace pa_emu

#ifndef __launch_bounds__
#  define __launch_bounds__(...)
#endif
#ifndef __noinline__
#  define __noinline__ __attribute__((noinline))
#endif
#define threadIdx (pa_emu::g.thread)
#define blockIdx (pa_emu::g.block)
#define blockDim (pa_emu::g.block_dim)
#define gridDim (pa_emu::g.grid_dim)
#define __syncthreads() pa_emu::syncthreads()
#define __shfl_xor_sync(mask, v, o) pa_emu::shfl((v), (o), true)
#define __shfl_sync(mask, v, l) pa_emu::shfl((v), (l), false)
#define __any_sync(mask, p) pa_emu::any_sync(p)
#define __syncwarp(...) pa_emu::syncwarp()
#define __syncthreads_or(p) pa_emu::syncthreads_or(p)

static inline float __int_as_float(int x)
{
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static inline unsigned __float_as_uint(float f)
{
    unsigned x;
    memcpy(&x, &f, 4);
    return x;
}
static inline float __uint_as_float(unsigned x)
{
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }

#define PA_CU_LAUNCH(kernel, grid, block, smem, stream, ...) \
    pa_emu::launch(dim3(grid), dim3(block), (smem), [=]() { kernel(__VA_ARGS__); })
/* kernels run one after another: a programmatic dependent launch is a plain one */
#define PA_CU_LAUNCH_PDL(pdl, kernel, grid, block, smem, stream, ...) \
    do {                                                              \
        (void)(pdl);                                                  \
        PA_CU_LAUNCH(kernel, grid, block, smem, stream, __VA_ARGS__); \
    } while (0)
/* blocks run one after another: static storage is one block's shared memory */
#define PA_CU_STATIC_SMEM static
#define PA_CU_DYN_SMEM(type, name) type *name = (type *)pa_emu::g.dyn_smem

#endif
