/* pagedattn: the command-line tool. info, verify, run, bench. */
#include "tool.h"

#include <stdio.h>
#include <string.h>

int pa_tool_usage(FILE *f)
{
    fprintf(f,
            "usage: pagedattn <command> [options]\n"
            "  info                 version, backends, their capabilities, CPU features\n"
            "  verify [options]     the shared case grid on backends against the reference\n"
            "      --backend a,b    backends to check (default: every available one but reference)\n"
            "      --filter TEXT    only cases whose name contains TEXT\n"
            "      --threads N      worker threads (cpu backend; 0 = all cores)\n"
            "      --list           list the cases and exit\n"
            "      --random N       instead of the grid: N random cases from a wider space (long\n"
            "                       decodes, shared blocks, NaN/inf, every shape and feature mix)\n"
            "      --seed S         the sweep's seed (default 1); a failure prints the seed that\n"
            "                       replays it alone with --random 1\n"
            "      --oracle         the sweep also checks the reference against the independent oracle\n"
            "      --det-threads M  the sweep runs each case again with M threads, and each of its\n"
            "                       sequences alone: bits must match\n"
            "      --sharp          the sweep's cases made as sharp as they come (heads 128-512,\n"
            "                       the largest query scale, fp8 keys x 2, f32 outputs)\n"
            "      --margin F       hold outputs to F (0 < F <= 1) of the fp32 part of their\n"
            "                       tolerance: how close a path comes to failing\n"
            "  run [options]        simulate a serving workload (see pagedattn run --help)\n"
            "  bench [options]      measure speed against this machine's limits (pagedattn bench --help)\n");
    return f == stderr ? 2 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) return pa_tool_usage(stderr);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info")) return pa_tool_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "verify")) return pa_tool_verify(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return pa_tool_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return pa_tool_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) return pa_tool_usage(stdout);
    fprintf(stderr, "pagedattn: unknown command \"%s\"\n", cmd);
    return pa_tool_usage(stderr);
}
