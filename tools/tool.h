/* tool.h: the subcommands of the pagedattn CLI, one file each. Each takes argv starting at its
 * own name and returns the process exit status. */
#ifndef PAGEDATTN_TOOL_H
#define PAGEDATTN_TOOL_H

#include <stdio.h>

/* the tool's usage (every command; verify's options in full) on f: 0 for stdout, 2 otherwise */
int pa_tool_usage(FILE *f);
int pa_tool_info(int argc, char **argv);
int pa_tool_verify(int argc, char **argv);
int pa_tool_run(int argc, char **argv);
int pa_tool_bench(int argc, char **argv); /* tools/bench.c */
/* --backend cuda (tools/bench_cuda.c): device copy bandwidth, decode, prefill, PyTorch SDPA */
int pa_tool_bench_cuda(int quick, int repeats, int json, const char *filter, int layout);

#endif
