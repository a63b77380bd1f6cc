/* pagedattn verify: the shared case grid on chosen backends, each case against the reference. */
#define _POSIX_C_SOURCE 200809L
#include "tool.h"

#include "grid.h"
#include "pagedattn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pa_tool_verify(int argc, char **argv)
{
    const char *backends = NULL, *filter = NULL;
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) backends = argv[++i];
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--list")) {
            for (int c = 0; c < grid_count(); c++) printf("%d %s\n", c, grid_case_name(c));
            return 0;
        } else {
            fprintf(stderr, "pagedattn verify: unknown option %s\n", argv[i]);
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
    int failures = 0;
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
        printf("== backend %s vs reference ==\n", name);
        failures += grid_run_all(b, filter, threads, stdout);
    }
    printf("%s\n", failures ? "verify: FAILED" : "verify: all cases passed");
    return failures ? 1 : 0;
}
