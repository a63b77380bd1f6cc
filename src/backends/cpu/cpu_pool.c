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

#include <sched.h>
#include <unistd.h>

struct pa__cpu_pool {
    int nthreads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t gen; /* bumped for every job (and for shutdown) */
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
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < 20000) {
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
        run_tasks(p, wa.id);
        atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
    }
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
    return n > 0 ? (int)n : 1;
}

pa_status pa__cpu_pool_create(int nthreads, pa__cpu_pool **out)
{
    pa__cpu_pool *p = pa__calloc(1, sizeof *p);
    if (!p) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "cpu: thread pool");
    p->nthreads = nthreads;
    p->pid = getpid();
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next, 0);
    atomic_init(&p->busy, 0);
    if (nthreads > 1) {
        p->threads = pa__calloc((size_t)nthreads, sizeof *p->threads);
        if (!p->threads) {
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

void pa__cpu_pool_destroy(pa__cpu_pool *p)
{
    if (!p) return;
    if (getpid() == p->pid) {
        if (p->nthreads > 1) {
            atomic_store(&p->stop, 1);
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->gen, 1);
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
    if (p->nthreads <= 1 || n == 1 || getpid() != p->pid) { /* alone, or a forked child */
        for (int64_t i = 0; i < n; i++) fn(arg, i, 0);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, p->nthreads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
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
