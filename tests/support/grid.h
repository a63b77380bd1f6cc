/* grid.h: the shared, seeded case grid of DESIGN.md. Every backend is checked against the
 * reference backend on it (tests/test_grid_*.c, `pagedattn verify`). A case describes a layer,
 * a cache and a batch; running it builds everything with NaN-filled unused cache, poisons and
 * guards the outputs, runs forward on the backend under test and on the reference, and compares
 * outputs, LSEs and the written cache. */
#ifndef PAGEDATTN_GRID_H
#define PAGEDATTN_GRID_H

#include "pagedattn.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct grid_result {
    int skipped;           /* the backend reported UNSUPPORTED; reason below */
    int failed;            /* a mismatch, a poisoned/unwritten element, a canary hit, a bad status */
    double max_abs_err;    /* over all output elements, vs the reference */
    double max_rel_err;    /* |a - r| / max(|r|, 1e-3) */
    double max_lse_err;
    char reason[256];      /* why skipped or failed */
    uint64_t digest;       /* FNV-1a of the backend's output and LSE bytes (0: no run) */
} grid_result;

/* Number of cases and the name of case i ("decoder/gqa4/d128/bs16/bf16 ..."). */
int grid_count(void);
const char *grid_case_name(int index);
/* The dtypes of case i: its queries, its new keys and values, its cache. Returns 0, or -1 (and
 * sets nothing) for an index outside the grid. */
int grid_case_dtypes(int index, pa_dtype *q, pa_dtype *kv, pa_dtype *cache);

/* Runs case `index` on `backend` (a context is created with `num_threads`, 0 = default) and
 * compares with the reference. Returns 0 if passed or skipped, 1 if failed. */
int grid_run_case(const pa_backend *backend, int index, int num_threads, grid_result *res);

/* Runs every case whose name contains `filter` (NULL = all); prints one table row per case to
 * `out` (NULL = quiet) and returns the number of failures. */
int grid_run_all(const pa_backend *backend, const char *filter, int num_threads, FILE *out);

/* Device-memory backends (cuda): the harness stages every buffer through these hooks, which
 * the backend's own test installs (the harness itself links no accelerator runtime). Each
 * returns 0 on success. */
typedef struct grid_device_hooks {
    void *(*alloc)(size_t bytes);
    void (*free)(void *ptr);
    int (*to_device)(void *dst, const void *src, size_t bytes);
    int (*to_host)(void *dst, const void *src, size_t bytes);
} grid_device_hooks;
void grid_set_device_hooks(const grid_device_hooks *hooks);

/* Runs case `index` on the reference backend and on the independent oracle of oracle.c
 * (gather each sequence's keys into contiguous arrays, build the visibility mask explicitly,
 * softmax in long double) and compares. Returns 0 if they agree. */
int grid_check_reference(int index, grid_result *res);

/* A random sweep: `count` cases drawn from `seed` over a wider space than the grid's own random
 * rows (more shapes, long decodes, shared blocks, non-finite values); each runs on `backend`
 * against the reference (backend NULL: skipped) and, with `oracle_too`, the reference against
 * the oracle. det_threads > 0: each case runs on `backend` a second time with that many threads
 * and both runs' bits must match. Prints failures, skips and a running count to `out`; returns the failures. A
 * failing case is printed with the seed that replays it alone (count 1). */
int grid_random_sweep(const pa_backend *backend, uint64_t seed, int count, int num_threads, int det_threads,
                      bool oracle_too, FILE *out);

/* Options for the runs that follow (`pagedattn verify --sharp --margin F`). sharp: a random
 * sweep draws each case as usual and then makes it as sharp as its space allows (head 128, 136,
 * 200, 256 or 512, queries at the largest scale the sweep draws, fp8 keys scaled by 2, f32
 * outputs): the rows on which a kernel's order of fp32 summation shows. margin in (0, 1]: every
 * comparison holds the outputs to that fraction of the fp32 part of their tolerance (1: the
 * grid's own; the allowances for 16-bit outputs and probabilities stay whole), so a sweep shows
 * how close a path comes to failing. Defaults: not sharp, margin 1. */
void grid_set_sweep_options(bool sharp, double margin);

#endif
