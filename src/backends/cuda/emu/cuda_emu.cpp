/* cuda_emu.cpp: see cuda_emu.h. Fibers (ucontext) for CUDA threads; host memory for device
 * memory; streams are synchronous (every launch and copy completes before the call returns). */
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <map>
#include <mutex>
#include <vector>

namespace pa_emu {
state g;

namespace {
struct fiber {
    ucontext_t ctx;
    bool done;
};
struct barrier {
    int count = 0;
    unsigned gen = 0;
};
ucontext_t sched_ctx;
std::vector<fiber> fibers;
std::vector<char> stacks;
const size_t kStack = 256 * 1024;
int cur = -1, nthreads = 0;
unsigned long long progress = 0;
barrier block_bar;
std::vector<barrier> warp_bars;
std::vector<uint32_t> xch; /* [warps][32] */
const std::function<void()> *body_fn;

void yield() { swapcontext(&fibers[cur].ctx, &sched_ctx); }

void wait(barrier &b, int size)
{
    const unsigned gen = b.gen;
    progress++;
    if (++b.count == size) {
        b.count = 0;
        b.gen++;
        return;
    }
    while (b.gen == gen) yield();
}

void entry()
{
    (*body_fn)();
    fibers[cur].done = true;
    progress++;
}

void set_thread(int t)
{
    cur = t;
    g.thread.x = (unsigned)(t % (int)g.block_dim.x);
    g.thread.y = (unsigned)(t / (int)g.block_dim.x % (int)g.block_dim.y);
    g.thread.z = (unsigned)(t / ((int)g.block_dim.x * (int)g.block_dim.y));
}
} // namespace

void syncthreads() { wait(block_bar, nthreads); }

uint32_t shfl_bits(uint32_t v, int arg, bool is_xor)
{
    if (nthreads % 32) {
        fprintf(stderr, "emu: warp shuffle in a block of %d threads (not whole warps)\n", nthreads);
        abort();
    }
    const int w = cur / 32, lane = cur % 32;
    xch[(size_t)w * 32 + (size_t)lane] = v;
    wait(warp_bars[(size_t)w], 32);
    const int src = is_xor ? (lane ^ arg) : (arg & 31);
    const uint32_t r = xch[(size_t)w * 32 + (size_t)src];
    wait(warp_bars[(size_t)w], 32);
    return r;
}

void warp_gather(const uint32_t *mine, int n, uint32_t *all)
{
    static std::vector<uint32_t> slots;
    const int w = cur / 32, lane = cur % 32, warps = (nthreads + 31) / 32;
    if (slots.size() < (size_t)warps * 32 * 16) slots.resize((size_t)warps * 32 * 16);
    if (n > 16) abort();
    for (int i = 0; i < n; i++) slots[((size_t)w * 32 + (size_t)lane) * 16 + (size_t)i] = mine[i];
    wait(warp_bars[(size_t)w], 32);
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < n; i++) all[l * n + i] = slots[((size_t)w * 32 + (size_t)l) * 16 + (size_t)i];
    wait(warp_bars[(size_t)w], 32);
}

void launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body)
{
    nthreads = (int)(block.x * block.y * block.z);
    if (nthreads <= 0 || nthreads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        fprintf(stderr, "emu: bad launch grid (%u,%u,%u) block %d\n", grid.x, grid.y, grid.z, nthreads);
        abort();
    }
    g.grid_dim = grid;
    g.block_dim = block;
    fibers.assign((size_t)nthreads, fiber());
    if (stacks.size() < (size_t)nthreads * kStack) stacks.resize((size_t)nthreads * kStack);
    warp_bars.assign((size_t)(nthreads + 31) / 32, barrier());
    xch.assign((size_t)(nthreads + 31) / 32 * 32, 0u);
    body_fn = &body;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                g.block.x = bx, g.block.y = by, g.block.z = bz;
                void *sm = smem ? malloc(smem) : NULL;
                if (sm) memset(sm, 0xff, smem); /* garbage: NaN floats */
                g.dyn_smem = sm;
                block_bar = barrier();
                for (int t = 0; t < nthreads; t++) {
                    fiber &f = fibers[(size_t)t];
                    f.done = false;
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = &stacks[(size_t)t * kStack];
                    f.ctx.uc_stack.ss_size = kStack;
                    f.ctx.uc_link = &sched_ctx;
                    makecontext(&f.ctx, entry, 0);
                }
                int alive = nthreads;
                while (alive > 0) {
                    const unsigned long long before = progress;
                    alive = 0;
                    for (int t = 0; t < nthreads; t++) {
                        if (fibers[(size_t)t].done) continue;
                        set_thread(t);
                        swapcontext(&sched_ctx, &fibers[(size_t)t].ctx);
                        if (!fibers[(size_t)t].done) alive++;
                    }
                    if (alive > 0 && progress == before) {
                        fprintf(stderr,
                                "emu: deadlock in block (%u,%u,%u): %d threads wait at a barrier "
                                "that others never reach (divergent __syncthreads or shuffle)\n",
                                bx, by, bz, alive);
                        abort();
                    }
                }
                free(sm);
            }
}
} // namespace pa_emu

/* ---- the CUDA runtime subset the backend uses ---------------------------------------------- */

extern "C" {
static cudaError_t last_error = cudaSuccess;

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = getenv("PA_EMU_NO_DEVICE") ? 0 : 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "pagedattn CPU emulator (fibers)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->totalGlobalMem = (size_t)1 << 34;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *v) { *v = 0; return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int)
{
    static int dummy;
    *s = (cudaStream_t)&dummy;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
/* "Device" allocations, so that cudaPointerGetAttributes can tell them from host memory. */
static std::map<uintptr_t, size_t> g_dev_allocs;
static std::mutex g_dev_mu;
/* Allocations of 1 GiB or more are address space only (MAP_NORESERVE, zero until touched), so
 * that a test can hold pools larger than this machine's memory and use a few of their blocks
 * (test_large_cache); smaller ones are filled with garbage, as fresh device memory is. */
static const size_t k_emu_big_alloc = (size_t)1 << 30;
static std::map<uintptr_t, size_t> g_big_allocs; /* (under g_dev_mu) */

cudaError_t cudaMalloc(void **p, size_t n)
{
    if (n >= k_emu_big_alloc) {
        void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        *p = m == MAP_FAILED ? NULL : m;
    } else {
        *p = malloc(n ? n : 1);
        if (*p) memset(*p, 0xa5, n);
    }
    if (*p) {
        std::lock_guard<std::mutex> lk(g_dev_mu);
        g_dev_allocs[(uintptr_t)*p] = n ? n : 1;
        if (n >= k_emu_big_alloc) g_big_allocs[(uintptr_t)*p] = n;
    }
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p)
{
    size_t big = 0;
    if (p) {
        std::lock_guard<std::mutex> lk(g_dev_mu);
        g_dev_allocs.erase((uintptr_t)p);
        auto it = g_big_allocs.find((uintptr_t)p);
        if (it != g_big_allocs.end()) big = it->second, g_big_allocs.erase(it);
    }
    if (big) munmap(p, big);
    else free(p);
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr)
{
    memset(a, 0, sizeof *a);
    a->type = cudaMemoryTypeUnregistered;
    std::lock_guard<std::mutex> lk(g_dev_mu);
    auto it = g_dev_allocs.upper_bound((uintptr_t)ptr);
    if (it != g_dev_allocs.begin()) {
        --it;
        if ((uintptr_t)ptr < it->first + it->second) {
            a->type = cudaMemoryTypeDevice;
            a->device = 0;
            a->devicePointer = (void *)ptr;
        }
    }
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind)
{
    memcpy(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind, cudaStream_t)
{
    memcpy(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                              enum cudaMemcpyKind, cudaStream_t)
{
    if (w > dp || w > sp) return cudaErrorInvalidPitchValue;
    for (size_t r = 0; r < h; r++) memcpy((char *)d + r * dp, (const char *)s + r * sp, w);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaFuncSetAttribute(const void *, enum cudaFuncAttribute, int v)
{
    return v > 227 * 1024 ? cudaErrorInvalidValue : cudaSuccess;
}
struct CUevent_st {
    double t;
};
#include <time.h>
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = new CUevent_st{0};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t)
{
    e->t = now_ms();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaError(emu)"; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }
}
