/* test_cpu_sweep.c: a fixed-seed random sweep (grid_random_sweep) on the cpu backend's best path
 * here: cases from a wider space than the grid (long decodes that split keys, 512-dim heads, up to
 * eight sequences, shared blocks, NaN/inf), each against the reference, the reference against the
 * independent oracle, a second run with one thread that must match the two-thread run bit for
 * bit, and a third with each sequence in a batch of its own, bit for bit again.
 * PAGEDATTN_SWEEP="SEED COUNT" runs another sweep (the tool's `verify --random` does the same
 * with more options). */
#define _POSIX_C_SOURCE 200809L
#include "grid.h"
#include "test.h"

#include <stdlib.h>

int main(void)
{
    const pa_backend *cpu = pa_backend_find("cpu");
    if (!cpu) {
        printf("SKIP: this build has no cpu backend (configured with -DPAGEDATTN_CPU=OFF)\n");
        return 77;
    }
    unsigned long long seed = 0x5EED2026ull;
    int count = 60;
    const char *env = getenv("PAGEDATTN_SWEEP");
    if (env) {
        char *end = NULL;
        seed = strtoull(env, &end, 0);
        count = (int)strtol(end, NULL, 0);
    }
    CHECK(count > 0);
    int fails = grid_random_sweep(cpu, seed, count, 2, 1, true, stdout);
    CHECK_INT(fails, 0);
    return test_exit();
}
