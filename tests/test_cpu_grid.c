/* test_cpu_grid.c: the shared case grid on the cpu backend, once per ISA path this machine can
 * execute (PAGEDATTN_CPU_ISA is read when a context is created), each against the reference.
 * A path the machine cannot run is reported and skipped; any failing case fails the test. The
 * E4M3 cache rows run once more under each E4M3 decode conversion (PAGEDATTN_CPU_FP8).
 * Optional argv[1]: a case-name filter. */
#define _POSIX_C_SOURCE 200809L
#include "grid.h"
#include "test.h"
#include "test_cpu_isa.h"

#include <string.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    const pa_backend *cpu = test_cpu_backend_or_skip();
    const char *filter = argc > 1 ? argv[1] : NULL;
    const char *const *isas = test_cpu_isas;
    int ran = 0;
    for (int i = 0; i < TEST_CPU_NISA; i++) {
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
        /* the E4M3 rows again under each forced conversion (one of them is this machine's
         * default, run above) */
        for (int f = 0; f < TEST_CPU_NFP8 && !strncmp(isas[i], "avx", 3); f++) {
            if (!test_cpu_fp8_form_distinct(isas[i], test_cpu_fp8_forms[f])) continue;
            setenv("PAGEDATTN_CPU_FP8", test_cpu_fp8_forms[f], 1);
            printf("== isa %s, PAGEDATTN_CPU_FP8=%s, %s cases\n", isas[i], test_cpu_fp8_forms[f], filter ? filter : "E4M3");
            fails = grid_run_all(cpu, filter ? filter : "cfp8_e4m3", 0, stdout);
            printf("== isa %s, PAGEDATTN_CPU_FP8=%s: %d failures\n", isas[i], test_cpu_fp8_forms[f], fails);
            CHECK_INT(fails, 0);
        }
        unsetenv("PAGEDATTN_CPU_FP8");
        ran++;
    }
    unsetenv("PAGEDATTN_CPU_ISA");
    CHECK(ran >= 1);
    return test_exit();
}
