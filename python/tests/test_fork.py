"""A process that forks after using the library (multiprocessing's fork start method, a
pre-forking server) gets the same answers in the child, with its own worker threads, and does not
hang waiting for the parent's."""

import os
import signal

import numpy as np
import pytest

import pagedattn as pa
from util import randn, tables

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")


def _decode(backend, rng_seed=5):
    rng = np.random.default_rng(rng_seed)
    H, Hkv, D, bs, nb = 8, 2, 64, 16, 80
    be = pa.get_attn_backend(backend)
    cache = be.new_kv_cache(nb, bs, Hkv, D, np.float32)
    cache[...] = randn(rng, cache.shape, np.float32)
    lens = [700, 90, 1]
    tabs = tables(rng, lens, bs, nb)
    md = be.make_metadata_builder(bs).build(seq_lens=lens, query_lens=[1, 1, 1],
                                            block_tables=tabs)
    q, k, v = (randn(rng, (3, n * D), np.float32) for n in (H, Hkv, Hkv))
    return be.get_impl_cls()(H, D, D ** -0.5, Hkv).forward(q, k, v, cache, md)


def test_fork_child_same_bits_own_threads(backend):
    threads = pa.get_num_threads()
    pa.set_num_threads(2)
    try:
        want = _decode(backend)  # the contexts (and the cpu pool's worker) exist before the fork
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report through the pipe, never return into pytest
            code = 1
            try:
                signal.alarm(60)  # a hang becomes SIGALRM, seen by the parent
                got = _decode(backend)
                ok = got.tobytes() == want.tobytes() and pa.get_num_threads() == 2
                if backend == "cpu" and os.path.isdir("/proc/self/task"):
                    # a context of the child's own: its worker is a thread of this process
                    ok = ok and len(os.listdir("/proc/self/task")) >= 2
                pa.set_num_threads(1)
                ok = ok and _decode(backend).tobytes() == want.tobytes()
                code = 0 if ok else 3
            finally:
                os.write(w, b"%d" % code)
                os._exit(code)
        os.close(w)
        _, status = os.waitpid(pid, 0)
        report = os.read(r, 16)
        os.close(r)
        assert not os.WIFSIGNALED(status), "child killed by signal %d" % os.WTERMSIG(status)
        assert os.WEXITSTATUS(status) == 0 and report == b"0", (status, report)
        assert _decode(backend).tobytes() == want.tobytes()  # the parent's threads still work
        assert pa.get_num_threads() == 2
    finally:
        pa.set_num_threads(threads)


def test_fork_while_another_thread_waits_to_plan():
    """A thread waiting for a context to make a plan holds its batch's lock at the fork; the
    child (which has none of the parent's threads) must not wait on that lock for ever."""
    import threading
    import time

    from pagedattn import _lib

    H, Hkv, D, bs = 4, 2, 32, 16
    be = pa.get_attn_backend("cpu")
    cache = be.new_kv_cache(16, bs, Hkv, D, np.float32)
    rng = np.random.default_rng(11)
    cache[...] = randn(rng, cache.shape, np.float32)
    impl = be.get_impl_cls()(H, D, D ** -0.5, Hkv)
    md = be.make_metadata_builder(bs).build(seq_lens=[20, 9], query_lens=[1, 1],
                                            block_tables=[[3, 5], [1]])
    q = randn(rng, (2, H * D), np.float32)
    k = randn(rng, (2, Hkv * D), np.float32)
    ctx = _lib.get_context("cpu")
    release = threading.Event()
    holding = threading.Event()

    def long_call():  # stands for a long forward on another thread: it holds the context
        with ctx.lock:
            holding.set()
            release.wait()

    t1 = threading.Thread(target=long_call)
    t1.start()
    assert holding.wait(10)
    t2 = threading.Thread(target=lambda: impl.forward(q, k, k, cache.copy(), md))
    t2.start()  # makes the batch, then waits for the context to plan, holding the batch's lock
    for _ in range(1000):
        if md.batch(16)._lock.locked():
            break
        time.sleep(0.005)
    try:
        assert md.batch(16)._lock.locked()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(30)  # a hang becomes SIGALRM, seen by the parent
                out = impl.forward(q, k, k, cache.copy(), md)
                os.write(w, out.tobytes())  # (1 KiB: within a pipe's buffer)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        _, status = os.waitpid(pid, 0)
        got = b""
        while True:
            part = os.read(r, 1 << 16)
            if not part:
                break
            got += part
        os.close(r)
        assert not os.WIFSIGNALED(status), "child killed by signal %d" % os.WTERMSIG(status)
        assert os.WEXITSTATUS(status) == 0, status
    finally:
        release.set()
        t1.join()
        t2.join()
    want = impl.forward(q, k, k, cache.copy(), md)  # the parent's, once its threads are done
    assert got == want.tobytes()
