/* test_cpu_sweep.c: a fixed-seed random sweep (grid_random_sweep) on the cpu backend's best path
 * here: cases from a wider space than the grid (long decodes that split keys, 512-dim heads, up to
 * eight sequences, shared blocks, NaN/inf), each against the reference, the reference against the
 * independent oracle, a second run with one thread that must match the two-thread run bit for
 * bit, and a third with each sequence in a batch of its own, bit for bit again.
 * PAGEDATTN_SWEEP="SEED COUNT" runs another sweep (the tool's `verify --random` does the same
 * with more options). PAGEDATTN_SWEEP_ORACLE=0 leaves the reference-against-oracle part out (CI's
 * sanitized run, where it checked test code only: the README suite runs it in full). */
#define _POSIX_C_SOURCE 200809L
#include "grid.h"
#include "test.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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
    const char *oe = getenv("PAGEDATTN_SWEEP_ORACLE");
    const bool oracle_too = !(oe && !strcmp(oe, "0"));
    int fails = grid_random_sweep(cpu, seed, count, 2, 1, oracle_too, stdout);
    CHECK_INT(fails, 0);
    return test_exit();
}
