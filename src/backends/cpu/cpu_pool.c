/* cpu_pool.c: a persistent pthread pool. The caller of pa__cpu_pool_run works as thread 0;
 * workers wait for a new generation (spinning briefly, then on a condition variable), take
 * task indices from a shared atomic counter and report completion through another. Which thread
 * runs which task never changes a result: every task writes its own outputs.
 *
 * fork(): the child has only the forking thread, so a pool made before the fork has no workers
 * there (waiting for them hung the child). A pool remembers the process that made it; in any
 * other process it runs every task on the calling thread and, when destroyed, joins nothing and
 * leaves its mutex and condition variable alone (another thread of the parent may have held the
 * mutex at the fork). */
#define _GNU_SOURCE
#include "cpu.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

struct pa__cpu_pool {
    int nthreads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* bumped for every job (and for shutdown): GEN_ONE per job, the low bits the number of
     * workers the job takes (ids 1..that; the others stay asleep: a job of 3 tasks on 1024
     * threads woke all of them and waited for every one, 1.9 s per forward on one core until an
     * audit: bench/NOTES.md, fortieth pass) */
    atomic_uint_fast64_t gen;
    int spin; /* pause loops before a worker sleeps: 0 where the pool has more threads than CPUs */
    atomic_int stop;
    /* the current job */
    pa__cpu_task_fn fn;
    void *arg;
    int64_t n;
    atomic_int_fast64_t next;
    atomic_int busy; /* workers still inside the current job */
    pid_t pid;       /* the process whose threads the workers are */
};

typedef struct {
    pa__cpu_pool *pool;
    int id;
} worker_arg;

enum { GEN_BITS = 16 };
#define GEN_ONE ((uint_fast64_t)1 << GEN_BITS)

static void run_tasks(pa__cpu_pool *p, int thread)
{
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n) break;
        p->fn(p->arg, i, thread);
    }
}

static void *worker_main(void *varg)
{
    worker_arg wa = *(worker_arg *)varg;
    pa__cpu_pool *p = wa.pool;
    pa__free(varg);
    /* a new thread starts in its creator's floating-point environment, which may be a caller's
     * flush-to-zero mode; the workers run only library code, so the default is set once */
    pa__fpenv creator;
    pa__fpenv_enter(&creator);
    uint64_t seen = 0;
    bool idle = false; /* (not in the last job: straight to sleep, no spinning) */
    for (;;) {
        uint64_t g;
        int spins = idle ? p->spin : 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < p->spin) {
#if defined(__x86_64__) || defined(__i386__)
                __asm__ __volatile__("pause");
#endif
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen)
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        /* (the job's fields were written before its gen: read only by the workers it takes,
         * which the caller waits for before it writes the next job's) */
        idle = wa.id > (int)(g & (GEN_ONE - 1));
        if (idle) continue;
        run_tasks(p, wa.id);
        atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
    }
}

/* ---- the CPUs this process may use -------------------------------------------------------
 * The default thread count is the online cores, fewer where the affinity mask allows fewer, and
 * fewer again where the process's cgroup has a CPU quota (a container started with --cpus=2, a
 * Kubernetes CPU limit): quota / period CPUs, rounded up. Without the last, a 64-core host
 * running a 2-CPU container would start 64 workers, which spend the quota within a fraction of
 * each period and then wait, throttled, for the next one (100 ms by default) in every forward.
 * cgroup v2 (cpu.max: "max 100000" or "200000 100000") and v1 (cpu.cfs_quota_us, -1 = none, over
 * cpu.cfs_period_us); each level from the process's cgroup up to the hierarchy's mount point is
 * read and the smallest quota wins. */

static int read_text(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return 0;
}

/* the CPUs that q microseconds per period of p allow, rounded up; 0: no limit */
static int quota_cpus(long long q, long long p)
{
    if (q <= 0 || p <= 0) return 0;
    long long n = q / p + (q % p != 0);
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* the limit set in one cgroup directory; 0: none (or unreadable) */
static int level_cpus(const char *dir, bool v2)
{
    char path[4096 + 32], txt[128];
    long long q = 0, p = 0;
    if (v2) {
        snprintf(path, sizeof path, "%s/cpu.max", dir); /* "max P" (no limit) fails the scan */
        if (read_text(path, txt, sizeof txt) || sscanf(txt, "%lld %lld", &q, &p) != 2) return 0;
    } else {
        snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
        if (read_text(path, txt, sizeof txt) || sscanf(txt, "%lld", &q) != 1) return 0;
        snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
        if (read_text(path, txt, sizeof txt) || sscanf(txt, "%lld", &p) != 1) return 0;
    }
    return quota_cpus(q, p);
}

/* the smallest limit from mount + rel up to mount; 0: none */
static int walk_cpus(const char *mount, const char *rel, bool v2)
{
    char dir[4096];
    size_t base = strlen(mount);
    int n = snprintf(dir, sizeof dir, "%s%s", mount, rel);
    if (n < 0 || (size_t)n >= sizeof dir) return 0;
    /* a cgroup path from another cgroup namespace is not under this mount: start at its root,
     * which is then the process's own cgroup */
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) dir[base] = 0;
    int best = 0;
    for (;;) {
        size_t len = strlen(dir);
        while (len > base && dir[len - 1] == '/') dir[--len] = 0;
        int c = level_cpus(dir, v2);
        if (c > 0 && (best == 0 || c < best)) best = c;
        char *slash = len > base ? strrchr(dir + base, '/') : NULL;
        if (!slash) break;
        *slash = 0;
    }
    return best;
}

/* whether a v1 line's controller list ("cpu,cpuacct") has cpu */
static bool has_cpu_controller(const char *list)
{
    for (const char *c = list; *c;) {
        size_t n = strcspn(c, ",");
        if (n == 3 && !strncmp(c, "cpu", 3)) return true;
        c += n + (c[n] == ',');
    }
    return false;
}

int pa__cpu_cgroup_cpus(const char *root)
{
    char path[4096 + 64], buf[8192];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    if (read_text(path, buf, sizeof buf)) return 0;
    int best = 0;
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        /* "id:controllers:path"; v2's line is "0::path" */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = 0;
        const char *ctrl = c1 + 1, *rel = c2 + 1;
        bool v2 = !strncmp(line, "0:", 2) && !*ctrl;
        if (!v2 && !has_cpu_controller(ctrl)) continue;
        char mount[4096];
        int c = 0;
        if (v2) {
            snprintf(mount, sizeof mount, "%s/sys/fs/cgroup", root);
            c = walk_cpus(mount, rel, true);
        } else {
            /* mounted under its controller list ("cpu,cpuacct"), often with "cpu" beside it */
            snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/%s", root, ctrl);
            struct stat st;
            if (stat(mount, &st) != 0) snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/cpu", root);
            c = walk_cpus(mount, rel, false);
        }
        if (c > 0 && (best == 0 || c < best)) best = c;
    }
    return best;
}

int pa__cpu_online_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int a = CPU_COUNT(&set);
        if (a > 0 && (n <= 0 || a < n)) n = a;
    }
#endif
    int q = pa__cpu_cgroup_cpus("");
    if (q > 0 && (n <= 0 || q < n)) n = q;
    return n > 0 ? (int)n : 1;
}

pa_status pa__cpu_pool_create(int nthreads, pa__cpu_pool **out)
{
    pa__cpu_pool *p = pa__calloc(1, sizeof *p);
    if (!p) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cpu: thread pool");
    p->nthreads = nthreads;
    p->pid = getpid();
    p->spin = nthreads <= pa__cpu_online_cores() ? 20000 : 0;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next, 0);
    atomic_init(&p->busy, 0);
    if (nthreads > 1) {
        p->threads = pa__calloc((size_t)nthreads, sizeof *p->threads);
        if (!p->threads) {
            p->nthreads = 1; /* no worker to stop (destroy joined through the NULL array until an
                                audit: bench/NOTES.md, thirty-ninth pass) */
            pa__cpu_pool_destroy(p);
            return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cpu: thread pool");
        }
    }
    for (int i = 1; i < nthreads; i++) {
        worker_arg *wa = pa__alloc(sizeof *wa);
        if (!wa || (wa->pool = p, wa->id = i, pthread_create(&p->threads[i], NULL, worker_main, wa))) {
            pa__free(wa);
            p->nthreads = i;
            pa__cpu_pool_destroy(p);
            return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cpu: cannot start worker thread %d", i);
        }
    }
    *out = p;
    return PA_STATUS_OK;
}

bool pa__cpu_pool_here(const pa__cpu_pool *p) { return p && getpid() == p->pid; }

void pa__cpu_pool_destroy(pa__cpu_pool *p)
{
    if (!p) return;
    if (getpid() == p->pid) {
        if (p->nthreads > 1) {
            atomic_store(&p->stop, 1);
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->gen, GEN_ONE);
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            for (int i = 1; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
        }
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
    }
    pa__free(p->threads);
    pa__free(p);
}

void pa__cpu_pool_run(pa__cpu_pool *p, int64_t n, pa__cpu_task_fn fn, void *arg)
{
    if (n <= 0) return;
    if (p->nthreads <= 1 || n == 1 || !pa__cpu_pool_here(p)) { /* alone, or a forked child */
        for (int64_t i = 0; i < n; i++) fn(arg, i, 0);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    const int take = n < p->nthreads ? (int)n - 1 : p->nthreads - 1; /* workers beside the caller */
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, take, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    const uint_fast64_t g = atomic_load_explicit(&p->gen, memory_order_relaxed);
    atomic_store_explicit(&p->gen, ((g >> GEN_BITS) + 1) * GEN_ONE + (uint_fast64_t)take, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, 0);
    /* the last tasks are running on other threads: spin briefly, then give the core away on
     * every check, so that a worker preempted on this core (more threads than free cores, a
     * busy host) is not kept waiting by this loop */
    for (int spins = 0; atomic_load_explicit(&p->busy, memory_order_acquire) > 0;) {
        if (++spins < 4000) {
#if defined(__x86_64__) || defined(__i386__)
            __asm__ __volatile__("pause");
#endif
        } else {
            sched_yield();
        }
    }
}
