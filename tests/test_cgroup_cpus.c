/* test_cgroup_cpus.c: the cpu backend's default thread count stays within the process's cgroup
 * CPU quota. pa__cpu_cgroup_cpus reads proc/self/cgroup and the cgroup files under a root
 * directory; here the root is a temporary tree built to look like a container's (cgroup v2 with
 * and without a namespace, v1 with a combined cpu,cpuacct hierarchy, nested limits, no limit,
 * unreadable or malformed files). Then, on this machine, the default thread count is at least 1
 * and no more than the online cores or a quota that applies. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* internal (src/backends/cpu/cpu.h); weak so that a build without the cpu backend links (the
 * backend's objects come in through pa_backend_find's reference to it) */
extern int pa__cpu_cgroup_cpus(const char *root) __attribute__((weak));
extern int pa__cpu_online_cores(void) __attribute__((weak));

static char root[256];

/* writes text to root/rel, making its directories */
static void put(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(path, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    if (!f) {
        TEST_FAIL("cannot write %s", path);
        return;
    }
    fputs(text, f);
    fclose(f);
}

static void fresh(const char *name)
{
    char cmd[600];
    if (root[0]) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd) != 0) TEST_FAIL("cannot remove %s", root);
    }
    snprintf(root, sizeof root, "%s/pa_cgroup_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root)) TEST_FAIL("mkdtemp %s", root);
    printf("-- %s\n", name);
}

#define EXPECT(want)                                                                         \
    do {                                                                                     \
        int got_ = pa__cpu_cgroup_cpus(root);                                                \
        CHECK_INT(got_, (want));                                                             \
    } while (0)

int main(void)
{
    if (!pa_backend_find("cpu") || !pa__cpu_cgroup_cpus || !pa__cpu_online_cores) {
        printf("SKIP: this build has no cpu backend\n");
        return 77;
    }

    fresh("v2, nested: the smallest quota on the way up wins, rounded up");
    put("proc/self/cgroup", "0::/kubepods/pod1/c1\n");
    put("sys/fs/cgroup/cpu.max", "max 100000\n");
    put("sys/fs/cgroup/kubepods/cpu.max", "800000 100000\n");
    put("sys/fs/cgroup/kubepods/pod1/cpu.max", "250000 100000\n");
    put("sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "max 100000\n");
    EXPECT(3);
    put("sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "100000 100000\n");
    EXPECT(1);
    put("sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "1000 100000\n"); /* 0.01 CPU still gets one */
    EXPECT(1);

    fresh("v2 in a cgroup namespace: the path is not under the mount, its root is the container's");
    put("proc/self/cgroup", "0::/system.slice/docker-0123.scope\n");
    put("sys/fs/cgroup/cpu.max", "150000 100000\n");
    EXPECT(2);
    /* a group of the container's own named like a level of the host's path is not ours */
    put("sys/fs/cgroup/system.slice/cpu.max", "100000 100000\n");
    EXPECT(2);

    fresh("v2, no limit anywhere");
    put("proc/self/cgroup", "0::/user.slice\n");
    put("sys/fs/cgroup/cpu.max", "max 100000\n");
    put("sys/fs/cgroup/user.slice/cpu.max", "max 100000\n");
    EXPECT(0);

    fresh("v2, malformed and empty files count as no limit");
    put("proc/self/cgroup", "0::/a\n");
    put("sys/fs/cgroup/a/cpu.max", "banana\n");
    put("sys/fs/cgroup/cpu.max", "");
    EXPECT(0);
    put("sys/fs/cgroup/a/cpu.max", "-5 100000\n");
    EXPECT(0);
    put("sys/fs/cgroup/a/cpu.max", "400000 0\n");
    EXPECT(0);

    fresh("v1, cpu,cpuacct hierarchy, a quota on the process's group");
    put("proc/self/cgroup", "12:memory:/x\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    put("sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us", "-1\n");
    put("sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_period_us", "100000\n");
    put("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "350000\n");
    put("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
    EXPECT(4);
    put("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
    EXPECT(0);

    fresh("v1, cpu mounted alone; the memory and systemd lines are not read");
    put("proc/self/cgroup", "5:cpuacct:/a\n4:cpu:/a\n3:memory:/b\n");
    put("sys/fs/cgroup/cpu/a/cpu.cfs_quota_us", "50000\n");
    put("sys/fs/cgroup/cpu/a/cpu.cfs_period_us", "100000\n");
    put("sys/fs/cgroup/memory/b/cpu.cfs_quota_us", "10000\n"); /* never read: not the cpu line */
    put("sys/fs/cgroup/memory/b/cpu.cfs_period_us", "100000\n");
    EXPECT(1);

    fresh("hybrid: v1 with a quota beside an unlimited v2 line");
    put("proc/self/cgroup", "0::/\n2:cpu,cpuacct:/\n");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "600000\n");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "200000\n");
    EXPECT(3);

    fresh("no proc/self/cgroup (not Linux, or /proc not mounted)");
    EXPECT(0);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) TEST_FAIL("cannot remove %s", root);

    /* this machine */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int q = pa__cpu_cgroup_cpus("");
    int n = pa__cpu_online_cores();
    printf("this machine: %ld online, cgroup quota %d CPUs (0: none), default threads %d\n", online, q, n);
    CHECK(n >= 1);
    if (online > 0) CHECK(n <= online);
    if (q > 0) CHECK(n <= q);
    return test_exit();
}
