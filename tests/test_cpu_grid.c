/* test_cpu_grid.c: the shared case grid on the cpu backend, once per ISA path this machine can
 * execute (PAGEDATTN_CPU_ISA is read when a context is created), each against the reference.
 * A path the machine cannot run is reported and skipped; any failing case fails the test.
 * Optional argv[1]: a case-name filter. */
#define _POSIX_C_SOURCE 200809L
#include "grid.h"
#include "test.h"

#include <stdlib.h>

int main(int argc, char **argv)
{
    const pa_backend *cpu = pa_backend_find("cpu");
    if (!cpu) {
        printf("SKIP: this build has no cpu backend (configured with -DPAGEDATTN_CPU=OFF)\n");
        return 77;
    }
    const char *filter = argc > 1 ? argv[1] : NULL;
    static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "neon"};
    int ran = 0;
    for (int i = 0; i < (int)(sizeof isas / sizeof *isas); i++) {
        setenv("PAGEDATTN_CPU_ISA", isas[i], 1);
        pa_context *ctx = NULL;
        pa_status st = pa_context_create(cpu, NULL, &ctx);
        if (st == PA_STATUS_UNAVAILABLE) {
            printf("== isa %s: not runnable here (%s), skipped\n", isas[i], pa_last_error());
            continue;
        }
        CHECK_OK(st);
        pa_context_destroy(ctx);
        printf("== isa %s\n", isas[i]);
        /* every path with 1 thread and with 3 (more than the cores: uneven splits) */
        int fails = grid_run_all(cpu, filter, i == 0 ? 3 : 0, stdout);
        printf("== isa %s: %d failures\n", isas[i], fails);
        CHECK_INT(fails, 0);
        ran++;
    }
    unsetenv("PAGEDATTN_CPU_ISA");
    CHECK(ran >= 1);
    return test_exit();
}
