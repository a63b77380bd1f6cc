/* pagedattn verify: the shared case grid on chosen backends, each case against the reference. */
#define _POSIX_C_SOURCE 200809L
#include "tool.h"

#include "grid.h"
#include "pagedattn.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PA_TOOL_HAVE_CUDA
#  include <cuda_runtime_api.h>

/* A device backend runs the grid with its buffers staged through device memory (the same staging
 * as tests/test_cuda_grid.c); every copy waits for the device on both sides. */
static void *dev_alloc(size_t n)
{
    void *p = NULL;
    return cudaMalloc(&p, n ? n : 1) == cudaSuccess ? p : NULL;
}
static void dev_free(void *p) { (void)cudaFree(p); }
static int dev_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    return cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(dst, src, n, kind) != cudaSuccess ||
           cudaDeviceSynchronize() != cudaSuccess;
}
static int dev_to_device(void *dst, const void *src, size_t n) { return dev_copy(dst, src, n, cudaMemcpyHostToDevice); }
static int dev_to_host(void *dst, const void *src, size_t n) { return dev_copy(dst, src, n, cudaMemcpyDeviceToHost); }
static const grid_device_hooks cuda_hooks = {dev_alloc, dev_free, dev_to_device, dev_to_host};
#endif

/* A whole decimal (or 0x) number in [lo, hi] for option opt, or a message and -1. */
static int parse_count(const char *opt, const char *text, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 0);
    if (end == text || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "pagedattn verify: %s needs a whole number in %ld..%ld, not '%s'\n", opt, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

int pa_tool_verify(int argc, char **argv)
{
    const char *backends = NULL, *filter = NULL;
    long threads = 0, random = 0, det = 0;
    int oracle = 0;
    bool sharp = false;
    double margin = 1.0;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) backends = argv[++i];
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            if (parse_count(argv[i], argv[i + 1], 0, 1024, &threads)) return 2;
            i++;
        } else if (!strcmp(argv[i], "--random") && i + 1 < argc) {
            if (parse_count(argv[i], argv[i + 1], 1, 10000000, &random)) return 2;
            i++;
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *end = NULL;
            errno = 0;
            seed = strtoull(argv[i + 1], &end, 0);
            if (end == argv[i + 1] || *end || errno || argv[i + 1][0] == '-') {
                fprintf(stderr, "pagedattn verify: --seed needs an unsigned 64-bit number, not '%s'\n", argv[i + 1]);
                return 2;
            }
            i++;
        } else if (!strcmp(argv[i], "--oracle")) oracle = 1;
        else if (!strcmp(argv[i], "--sharp")) sharp = true;
        else if (!strcmp(argv[i], "--margin") && i + 1 < argc) {
            char *end = NULL;
            errno = 0;
            margin = strtod(argv[i + 1], &end);
            if (end == argv[i + 1] || *end || errno || !(margin > 0 && margin <= 1)) {
                fprintf(stderr, "pagedattn verify: --margin needs a number in (0, 1], not '%s'\n", argv[i + 1]);
                return 2;
            }
            i++;
        }
        else if (!strcmp(argv[i], "--det-threads") && i + 1 < argc) {
            if (parse_count(argv[i], argv[i + 1], 1, 1024, &det)) return 2;
            i++;
        }
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return pa_tool_usage(stdout);
        else if (!strcmp(argv[i], "--list")) {
            for (int c = 0; c < grid_count(); c++) printf("%d %s\n", c, grid_case_name(c));
            return 0;
        } else {
            fprintf(stderr, "pagedattn verify: unknown option %s\n", argv[i]);
            return pa_tool_usage(stderr);
        }
    }
    if (sharp && !random) {
        fprintf(stderr, "pagedattn verify: --sharp shapes the cases of a random sweep; give --random N\n");
        return 2;
    }
    grid_set_sweep_options(sharp, margin);
    if (filter && random) { /* a sweep's cases are drawn, not named: the filter would be ignored */
        fprintf(stderr, "pagedattn verify: --filter selects grid cases; a --random sweep has none to select\n");
        return 2;
    }
    if (filter && !random) { /* a filter that names no case would otherwise read as a pass */
        int n = 0;
        for (int c = 0; c < grid_count(); c++) n += strstr(grid_case_name(c), filter) != NULL;
        if (!n) {
            fprintf(stderr, "pagedattn verify: no grid case matches --filter \"%s\" (see --list)\n", filter);
            return 2;
        }
    }
    char list[256] = "";
    if (backends) {
        snprintf(list, sizeof list, "%s", backends);
    } else { /* every available backend except the reference itself */
        for (int i = 0; i < pa_backend_count(); i++) {
            const pa_backend *b = pa_backend_at(i);
            if (strcmp(pa_backend_name(b), "reference") && pa_backend_available(b, NULL, 0))
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? "," : "", pa_backend_name(b));
        }
        if (!*list) snprintf(list, sizeof list, "reference");
    }
    int failures = 0, checked = 0;
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        const pa_backend *b = pa_backend_find(name);
        char why[256];
        if (!b) {
            fprintf(stderr, "pagedattn verify: no backend \"%s\"\n", name);
            return 2;
        }
        if (!pa_backend_available(b, why, sizeof why)) {
            printf("backend %s: unavailable here (%s); skipped\n", name, why);
            continue;
        }
        const int device = pa_backend_memory(b) != PA_MEMORY_HOST;
        if (device) {
#ifdef PA_TOOL_HAVE_CUDA
            grid_set_device_hooks(&cuda_hooks);
#else
            printf("backend %s: needs device buffers and this tool was built without the CUDA runtime; "
                   "skipped\n", name);
            continue;
#endif
        }
        checked++;
        if (random > 0) {
            printf("== backend %s vs reference: %ld random cases from seed %#llx%s ==\n", name, random, seed,
                   oracle ? ", and the reference vs the oracle" : "");
            failures += grid_random_sweep(b, seed, (int)random, (int)threads, (int)det, oracle, stdout);
        } else {
            printf("== backend %s vs reference ==\n", name);
            failures += grid_run_all(b, filter, (int)threads, stdout);
        }
        if (device) grid_set_device_hooks(NULL);
    }
    printf("%s\n", failures  ? "verify: FAILED"
                   : checked ? "verify: all cases passed"
                             : "verify: nothing checked (every backend named was skipped)");
    return failures ? 1 : 0;
}
