"""Argument errors: the right exception type, the library's reason text, and nothing written."""

import os

import numpy as np
import pytest

import pagedattn as pa
from util import nan_cache, randn


def _paged(rng, H=4, Hkv=2, D=16, bs=4, nb=6):
    kc = randn(rng, (nb, bs, Hkv, D), np.float32)
    vc = randn(rng, (nb, bs, Hkv, D), np.float32)
    q = randn(rng, (3, H, D), np.float32)
    return q, kc, vc


def test_block_id_out_of_range_leaves_out_untouched(backend, rng):
    q, kc, vc = _paged(rng)
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(ValueError) as e:
        pa.flash_attn_varlen_func(q, kc, vc, 3, np.array([0, 3], np.int32), 8,
                                  seqused_k=np.array([8], np.int32), causal=True,
                                  block_table=np.array([[0, 6]], np.int32), out=out,
                                  backend=backend)
    assert "block" in str(e.value) and e.value.reason
    assert e.value.status_name == "OUT_OF_RANGE"
    assert (out == 7.0).all()


@pytest.mark.parametrize("bad", ["q_ndim", "heads", "gqa", "dtype", "cu", "seqused", "window",
                                 "scale", "kvdtype", "uint8_auto", "alibi", "s_aux", "out"])
def test_varlen_argument_checks(rng, bad):
    q, kc, vc = _paged(rng)
    kw = dict(max_seqlen_q=3, cu_seqlens_q=np.array([0, 3], np.int32), max_seqlen_k=8,
              seqused_k=np.array([8], np.int32), causal=True,
              block_table=np.array([[0, 1]], np.int32))
    if bad == "q_ndim":
        q = q.reshape(3, -1)
    elif bad == "heads":
        q = randn(rng, (3, 4, 8), np.float32)
    elif bad == "gqa":
        q = randn(rng, (3, 3, 16), np.float32)
    elif bad == "dtype":
        q = q.astype(np.float64)
    elif bad == "cu":
        kw["cu_seqlens_q"] = np.array([0, 5], np.int32)
    elif bad == "seqused":
        kw["seqused_k"] = np.array([9], np.int32)
    elif bad == "window":
        kw["window_size"] = (1, 2, 3)  # (not a pair; a negative side is unbounded, as in FlashAttention)
    elif bad == "scale":
        kw["softmax_scale"] = -1.0
    elif bad == "kvdtype":
        kw["kv_cache_dtype"] = "int4"
    elif bad == "uint8_auto":
        kc = kc.view(np.uint8)
        vc = vc.view(np.uint8)
    elif bad == "alibi":
        kw["alibi_slopes"] = np.ones(3, np.float32)
    elif bad == "s_aux":
        kw["s_aux"] = np.ones(5, np.float32)
    elif bad == "out":
        kw["out"] = np.empty((3, 4, 15), np.float32)
    with pytest.raises(ValueError):
        pa.flash_attn_varlen_func(q, kc, vc, **kw)


def test_with_kvcache_append_beyond_capacity_writes_nothing(backend, rng):
    H, Hkv, D, bs, nb = 2, 2, 8, 4, 3
    kc = nan_cache(nb, bs, Hkv, D, np.float32)
    vc = nan_cache(nb, bs, Hkv, D, np.float32)
    q = randn(rng, (1, 2, H, D), np.float32)
    k = randn(rng, (1, 2, Hkv, D), np.float32)
    with pytest.raises(ValueError):
        pa.flash_attn_with_kvcache(q, kc, vc, k, k, cache_seqlens=np.array([7], np.int32),
                                   block_table=np.array([[0, 1]], np.int32), causal=True,
                                   backend=backend)
    assert np.isnan(kc).all() and np.isnan(vc).all()


@pytest.mark.parametrize("case", ["beyond_pool", "twice", "length", "shape", "dtype"])
def test_reshape_and_cache_errors_leave_cache_untouched(rng, case):
    T, H, D, nb, bs = 4, 2, 8, 2, 4
    key = randn(rng, (T, H, D), np.float32)
    kc = np.zeros((nb, bs, H, D), np.float32)
    vc = np.zeros((nb, bs, H, D), np.float32)
    slots = np.array([0, 1, 2, 3], np.int64)
    if case == "beyond_pool":
        slots[3] = nb * bs
    elif case == "twice":
        slots[3] = 0
    elif case == "length":  # (more slots than key rows; fewer is vLLM V1's padding, allowed)
        slots = np.array([0, 1, 2, 3, 4], np.int64)
    elif case == "shape":
        key = randn(rng, (T, H, D + 1), np.float32)
    elif case == "dtype":
        key = key.astype(np.float64)
    with pytest.raises(ValueError) as e:
        pa.reshape_and_cache_flash(key, key, kc, vc, slots)
    assert str(e.value)
    assert (kc == 0).all() and (vc == 0).all()


@pytest.mark.parametrize("case", ["dst_range", "src_range", "dst_is_src", "dst_twice", "shape"])
def test_copy_blocks_errors(rng, case):
    nb = 4
    kcs = [randn(rng, (nb, 2, 2, 8), np.float32) for _ in range(2)]
    vcs = [randn(rng, (nb, 2, 2, 8), np.float32) for _ in range(2)]
    snap = [c.copy() for c in kcs + vcs]
    m = {"dst_range": [[0, 1], [0, nb]], "src_range": [[0, 1], [-1, 2]],
         "dst_is_src": [[0, 1], [1, 2]], "dst_twice": [[0, 1], [2, 1]],
         "shape": [[0, 1, 2]]}[case]
    with pytest.raises(ValueError):
        pa.copy_blocks(kcs, vcs, np.array(m, np.int64))
    for a, b in zip(kcs + vcs, snap):
        np.testing.assert_array_equal(a, b)


def test_swap_blocks_errors(rng):
    src = randn(rng, (3, 2, 2, 8), np.float32)
    dst = np.zeros((2, 2, 2, 8), np.float32)
    with pytest.raises(ValueError):
        pa.swap_blocks(src, dst, np.array([[0, 0], [1, 2]]))
    assert (dst == 0).all()
    with pytest.raises(ValueError):
        pa.swap_blocks(src, np.zeros((2, 2, 2, 4), np.float32), np.array([[0, 0]]))


def test_merge_errors(rng):
    a = randn(rng, (5, 2, 8), np.float32)
    lse = np.zeros((2, 5), np.float32)
    with pytest.raises(ValueError):
        pa.merge_attn_states(np.empty((5, 2, 8), np.float32), a, lse, a, np.zeros((5, 2), np.float32))
    with pytest.raises(ValueError):
        pa.merge_attn_states(np.empty((5, 2, 8), np.float16), a, lse, a, lse)


def test_impl_construction_errors():
    Impl = pa.get_attn_backend("reference").get_impl_cls()
    with pytest.raises(ValueError):
        Impl(6, 64, 0.125, num_kv_heads=4)
    with pytest.raises(ValueError):
        Impl(4, 64, 0.125, attn_type="sideways")
    with pytest.raises(ValueError):
        Impl(4, 64, float("nan"))
    with pytest.raises(ValueError):
        Impl(4, 1024, 0.125)
    with pytest.raises(ValueError):  # block-sparse only for the decoder type
        Impl(4, 64, 0.125, attn_type="encoder_only",
             blocksparse_params=dict(max_seqlen=256, num_heads=4, num_kv_heads=4, block_size=16,
                                     local_blocks=2, vert_stride=4))
    with pytest.raises(ValueError):  # cross-attention has no relative positions
        Impl(4, 64, 0.125, attn_type="encoder_decoder", alibi_slopes=[0.1] * 4)
    with pytest.raises(ValueError):
        Impl(4, 64, 0.125, kv_cache_dtype="int8")


def test_impl_forward_bad_block_writes_nothing(backend, rng):
    be = pa.get_attn_backend(backend)
    H, D, bs, nb = 2, 16, 4, 3
    impl = be.get_impl_cls()(H, D, 0.25)
    cache = np.zeros(be.get_kv_cache_shape(nb, bs, H, D), np.float32)
    # the table points beyond the pool (block 5 of 3)
    md = be.make_metadata(seq_lens=[6], query_lens=[6], block_tables=[[0, 5]], block_size=bs)
    q = randn(rng, (6, H * D), np.float32)
    with pytest.raises(ValueError) as e:
        impl.forward(q, q, q, cache, md)
    assert e.value.reason
    assert (cache == 0).all()
    # a key/value with the wrong number of rows
    md = be.make_metadata(seq_lens=[6], query_lens=[6], block_tables=[[0, 1]], block_size=bs)
    with pytest.raises(ValueError):
        impl.forward(q, q[:5], q[:5], cache, md)
    assert (cache == 0).all()


def test_unknown_and_unavailable_backends(rng):
    with pytest.raises(ValueError):
        pa.get_attn_backend("no-such-backend")
    q, kc, vc = _paged(rng)
    with pytest.raises(ValueError):
        pa.flash_attn_varlen_func(q, kc, vc, 3, np.array([0, 3], np.int32), 8,
                                  seqused_k=np.array([8], np.int32), causal=True,
                                  block_table=np.array([[0, 1]], np.int32), backend="nope")
    built = pa.built_backends()
    unavailable = [b for b in built if b not in pa.available_backends()]
    if not unavailable:
        pytest.skip("every built backend is available here")
    with pytest.raises(NotImplementedError):
        pa.get_attn_backend(unavailable[0])
    with pytest.raises(NotImplementedError):
        pa.flash_attn_varlen_func(q, kc, vc, 3, np.array([0, 3], np.int32), 8,
                                  seqused_k=np.array([8], np.int32), causal=True,
                                  block_table=np.array([[0, 1]], np.int32),
                                  backend=unavailable[0])


@pytest.mark.parametrize("causal", [True, False])
def test_with_kvcache_rejected_backend_writes_nothing(rng, causal):
    """An append that would go through a separate cache write (seqlen_new != seqlen_q) with a
    backend that cannot be used: neither the cache nor out is touched."""
    H, D, bs, nb = 2, 8, 4, 4
    kc = nan_cache(nb, bs, H, D, np.float32)
    vc = nan_cache(nb, bs, H, D, np.float32)
    q = randn(rng, (1, 3, H, D), np.float32)
    k = randn(rng, (1, 1, H, D), np.float32)
    out = np.full((1, 3, H, D), 5.0, np.float32)
    with pytest.raises(ValueError):
        pa.flash_attn_with_kvcache(q, kc, vc, k, k, cache_seqlens=np.array([2], np.int32),
                                   block_table=np.array([[0, 1]], np.int32), causal=causal,
                                   window_size=(1, 1), out=out, backend="no-such-backend")
    assert np.isnan(kc).all() and np.isnan(vc).all() and (out == 5.0).all()


def test_device_backend_refuses_host_arrays(rng):
    """A device backend (cuda, where it can run) given numpy arrays: ValueError with the reason,
    the output untouched; the automatic choice never picks it for host arrays."""
    from pagedattn import _lib
    devs = [b for b in pa.available_backends() if _lib.backend_memory(b) != _lib.PA_MEMORY_HOST]
    q, kc, vc = _paged(rng)
    args = (q, kc, vc, 3, np.array([0, 3], np.int32), 8)
    kw = dict(seqused_k=np.array([8], np.int32), causal=True,
              block_table=np.array([[0, 1]], np.int32))
    auto = pa.flash_attn_varlen_func(*args, **kw)  # automatic choice: a host backend
    assert np.isfinite(auto).all()
    if not devs:
        pytest.skip("no device backend can run here")
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(ValueError) as e:
        pa.flash_attn_varlen_func(*args, out=out, backend=devs[0], **kw)
    assert "memory" in str(e.value)
    assert (out == 7.0).all()


def test_default_backend_reads_host_memory():
    """get_attn_backend() with no name (and no $PAGEDATTN_BACKEND) gives a backend that can take
    this package's host arrays, even where a device backend can run."""
    import os
    from pagedattn import _lib
    if os.environ.get("PAGEDATTN_BACKEND"):
        pytest.skip("PAGEDATTN_BACKEND is set")
    b = pa.get_attn_backend()
    assert _lib.backend_memory(b.get_name()) == _lib.PA_MEMORY_HOST


def test_batch_lengths_beyond_int32():
    """The library's lengths are int32: larger ones are a ValueError, never a silent wrap (the
    package fills the C sequence array a column at a time)."""
    from pagedattn import _core as C
    table = np.zeros(4, np.int32)
    ok = {"context_len": 3, "query_len": 1, "is_prefill": False, "block_table": table}
    C.Batch(16, 4, [ok])  # the same with in-range values passes
    for key, val in (("context_len", 2 ** 31), ("query_len", 2 ** 32 + 1),
                     ("context_len", -2 ** 31 - 1)):
        with pytest.raises(ValueError, match="int32"):
            C.Batch(16, 4, [dict(ok, **{key: val})])
    with pytest.raises(ValueError, match="int32"):
        C.Batch.columns(16, 4, 2, np.array([3, 2 ** 31]), 1, 0,
                        np.array([table.ctypes.data] * 2, np.uintp), 1)


def _ro(a):
    a = a.copy()
    a.setflags(write=False)
    return a


def test_read_only_arrays_are_refused_and_nothing_is_written(rng):
    """Every call that writes into an array refuses a read-only numpy array (numpy's writeable
    flag, as numpy's own out= does) with a ValueError naming it, before writing anything: the
    library writes through raw pointers, which would modify immutable memory or fault on a
    read-only mapping. Where a call writes two arrays and only one is read-only, the other
    stays untouched."""
    H, Hkv, D, bs, nb = 4, 2, 32, 16, 6
    f32 = np.float32
    kc = randn(rng, (nb, bs, Hkv, D), f32)
    vc = randn(rng, (nb, bs, Hkv, D), f32)
    kc0, vc0 = kc.copy(), vc.copy()
    q = randn(rng, (1, 1, H, D), f32)
    bt = np.array([[2, 4]], np.int32)
    k_new = randn(rng, (1, 1, Hkv, D), f32)

    def refused(name, fn):
        with pytest.raises(ValueError, match="%s is read-only" % name.replace("[", r"\[")):
            fn()
        assert np.array_equal(kc, kc0) and np.array_equal(vc, vc0)

    refused("out", lambda: pa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20, block_table=bt,
                                                      out=_ro(np.zeros_like(q))))
    refused("k_cache", lambda: pa.flash_attn_with_kvcache(q, _ro(kc), vc, k_new, k_new,
                                                          cache_seqlens=20, block_table=bt))
    refused("v_cache", lambda: pa.flash_attn_with_kvcache(q, kc, _ro(vc), k_new, k_new,
                                                          cache_seqlens=20, block_table=bt))
    refused("out", lambda: pa.flash_attn_varlen_func(
        q[0], kc, vc, 1, np.array([0, 1], np.int32), 20, seqused_k=np.array([20], np.int32),
        block_table=bt, causal=True, out=_ro(np.zeros_like(q[0]))))
    refused("out", lambda: pa.flash_attn_func(q, k_new, k_new, out=_ro(np.zeros_like(q))))
    key = randn(rng, (3, Hkv, D), f32)
    slots = np.array([1, 40, 77], np.int64)
    refused("key_cache", lambda: pa.reshape_and_cache_flash(key, key, _ro(kc), vc, slots))
    refused("value_cache", lambda: pa.reshape_and_cache_flash(key, key, kc, _ro(vc), slots))
    pairs = np.array([[0, 1]], np.int64)
    refused("key_caches[0]", lambda: pa.copy_blocks([_ro(kc)], [vc], pairs))
    refused("value_caches[0]", lambda: pa.copy_blocks([kc], [_ro(vc)], pairs))
    refused("dst", lambda: pa.swap_blocks(kc, _ro(vc), pairs))
    o = randn(rng, (5, H, D), f32)
    lse = randn(rng, (H, 5), f32)
    refused("output", lambda: pa.merge_attn_states(_ro(o), o, lse, o, lse))
    out = np.zeros_like(o)
    refused("output_lse", lambda: pa.merge_attn_states(out, o, lse, o, lse, _ro(lse)))
    assert np.all(out == 0)  # the output was not written either

    backend = pa.get_attn_backend()
    kv_cache = np.zeros(backend.get_kv_cache_shape(nb, bs, Hkv, D), f32)
    impl = backend.get_impl_cls()(H, D, D ** -0.5, Hkv)
    md = backend.make_metadata_builder(bs).build(seq_lens=[3], query_lens=[3], block_tables=[[1]])
    x = randn(rng, (3, H * D), f32)
    kvx = randn(rng, (3, Hkv * D), f32)
    with pytest.raises(ValueError, match="kv_cache is read-only"):
        impl.forward(x, kvx, kvx, _ro(kv_cache), md)
    out = np.zeros_like(x)
    with pytest.raises(ValueError, match="output is read-only"):
        impl.forward(x, kvx, kvx, kv_cache, md, output=_ro(out))
    assert np.all(kv_cache == 0)  # the new K/V were not written
    with pytest.raises(ValueError, match="dst_kv_cache is read-only"):
        backend.swap_blocks(kv_cache, _ro(kv_cache), pairs)

    # vLLM's older paged layout
    x8 = 8
    kp = np.zeros((nb, Hkv, D // x8, bs, x8), np.float16)
    vp = np.zeros((nb, Hkv, D, bs), np.float16)
    key16 = randn(rng, (3, Hkv, D), np.float16)
    with pytest.raises(ValueError, match="value_cache is read-only"):
        pa.reshape_and_cache(key16, key16, kp, _ro(vp), slots)
    assert np.all(kp == 0)  # keys not written before the values were refused
    with pytest.raises(ValueError, match="dst is read-only"):
        pa.convert_fp8(_ro(np.zeros(8, np.uint8)), np.ones(8, np.float32))
    q16 = randn(rng, (1, H, D), np.float16)
    with pytest.raises(ValueError, match="out is read-only"):
        pa.paged_attention_v1(_ro(np.zeros_like(q16)), q16, kp, vp, Hkv, 0.1, bt,
                              np.array([20], np.int32), bs, 20)
    qc = randn(rng, (3, H, D), np.float16)
    kn = randn(rng, (3, Hkv, D), np.float16)
    with pytest.raises(ValueError, match="o is read-only"):
        pa.context_attention_fwd(qc, kn, kn, _ro(np.zeros_like(qc)), "auto", kp, vp, bt,
                                 np.array([0]), np.array([3]), np.array([0]), 3)


@pytest.mark.parametrize("shape", [(1, 1, 0, 16), (1, 0, 0, 1), (1, 1, 4, 0), (2, 3, 4, 0)])
def test_degenerate_query_shapes_are_value_errors(shape):
    """Zero heads or a zero head_size (numpy gives such arrays zero strides) are a ValueError,
    not an internal error or a ZeroDivisionError (found by random calls)."""
    kc = np.zeros((2, 16, 2, shape[3]), np.float32)
    q = np.zeros(shape, np.float32)
    with pytest.raises(ValueError):
        pa.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3,
                                   block_table=np.array([[0]] * shape[0], np.int32))
    with pytest.raises(ValueError):
        pa.flash_attn_varlen_func(q.reshape(-1, shape[2], shape[3]), kc, kc, 1,
                                  np.array([0, shape[0] * shape[1]], np.int32), 3,
                                  seqused_k=np.array([3], np.int32),
                                  block_table=np.array([[0]], np.int32))


@pytest.mark.parametrize("bad_id", [-1, 3, 99])
@pytest.mark.parametrize("mode", ["causal", "window", "alibi", "cross"])
def test_block_ids_outside_the_cache_are_refused_on_every_path(rng, bad_id, mode):
    """Non-causal calls with a window or ALiBi gather a paged cache's keys in numpy, where -1
    silently meant the last block (a wrong answer, found by random calls): every path now
    refuses block ids outside [0, num_blocks) with a ValueError."""
    kc = randn(rng, (3, 4, 2, 16), np.float32)
    q = randn(rng, (2, 4, 16), np.float32)
    kw = {"causal": mode == "causal"}
    if mode == "window":
        kw["window_size"] = (2, 2)
    if mode == "alibi":
        kw["alibi_slopes"] = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="block"):
        pa.flash_attn_varlen_func(q, kc, kc, 2, np.array([0, 2], np.int32), 7,
                                  seqused_k=np.array([7], np.int32),
                                  block_table=np.array([[0, bad_id]], np.int32), **kw)


def test_outputs_with_overlapping_or_reversed_rows_and_bad_cache_views_write_nothing(rng):
    """An output whose rows run backwards or are broadcast, or a cache view the library
    refuses (a pool reversed along its blocks), is a ValueError before anything is written:
    rows that see no key used to be zeroed first (found by random calls)."""
    H, Hkv, D = 4, 2, 32
    kc = randn(rng, (4, 16, Hkv, D), np.float32)
    q = randn(rng, (3, 1, H, D), np.float32)
    seqlens = np.array([0, 5, 9], np.int32)  # sequence 0 sees no key: its row would be zeroed
    bt = np.array([[0], [1], [2]], np.int32)
    base = np.full((3, 1, H, D), 7.0, np.float32)
    for out in (base[::-1], np.broadcast_to(base[:1], base.shape)):
        before = out.copy()
        with pytest.raises(ValueError, match="out"):
            pa.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=seqlens, block_table=bt,
                                       causal=True, out=out)
        assert np.array_equal(out, before)
    out = base.copy()
    with pytest.raises(ValueError, match="negative or overflow"):
        pa.flash_attn_with_kvcache(q, kc[::-1], kc[::-1], cache_seqlens=seqlens, block_table=bt,
                                   causal=True, out=out)
    assert np.all(out == 7.0)


def test_profiling_run_with_too_few_key_rows(rng):
    """vLLM's profiling run (an empty kv_cache) attends over the step's own keys: key rows
    fewer than the metadata's tokens are a ValueError (the library was handed a table of row
    indices longer than the rows: a heap over-read under ASan, found by random calls)."""
    backend = pa.get_attn_backend()
    impl = backend.get_impl_cls()(4, 16, 0.25, 2)
    md = backend.make_metadata_builder(16).build(seq_lens=[6], query_lens=[6], block_tables=[[0]])
    x = randn(rng, (6, 4 * 16), np.float32)
    kv = randn(rng, (3, 2 * 16), np.float32)
    with pytest.raises(ValueError, match="rows for 6 query tokens"):
        impl.forward(x, kv, kv, np.zeros((0,), np.float32), md)


@pytest.mark.parametrize("rows", [3, 5, 0])
def test_impl_forward_output_of_the_wrong_size(rng, rows):
    """impl.forward's output must hold as many rows as the query (it wrote all the query's rows
    into a shorter one: a heap overflow under ASan, found by random calls)."""
    backend = pa.get_attn_backend()
    impl = backend.get_impl_cls()(4, 16, 0.25, 2)
    kv_cache = np.zeros(backend.get_kv_cache_shape(4, 16, 2, 16), np.float32)
    md = backend.make_metadata_builder(16).build(seq_lens=[4], query_lens=[4], block_tables=[[1]])
    x = randn(rng, (4, 4 * 16), np.float32)
    kv = randn(rng, (4, 2 * 16), np.float32)
    out = np.zeros((rows, 4 * 16), np.float32)
    with pytest.raises(ValueError, match="output has shape"):
        impl.forward(x, kv, kv, kv_cache, md, output=out)
    assert not kv_cache.any()


def test_new_key_rows_must_match_the_tokens(rng):
    """context_attention_fwd and an encoder impl.forward with fewer key/value rows than tokens
    are a ValueError (context_attention_fwd read past k: a heap over-read under ASan, found by
    random calls)."""
    H, Hkv, D, bs, nb = 4, 2, 16, 16, 4
    kp = np.zeros((nb, Hkv, D // 8, bs, 8), np.float16)
    vp = np.zeros((nb, Hkv, D, bs), np.float16)
    q = randn(rng, (4, H, D), np.float16)
    k = randn(rng, (2, Hkv, D), np.float16)
    o = np.zeros_like(q)
    with pytest.raises(ValueError, match="k must be"):
        pa.context_attention_fwd(q, k, k, o, "auto", kp, vp, np.array([[1]], np.int32),
                                 np.array([0]), np.array([4]), np.array([0]), 4)
    assert not o.any() and not kp.any() and not vp.any()
    backend = pa.get_attn_backend()
    impl = backend.get_impl_cls()(H, D, 0.25, Hkv, attn_type="encoder")
    md = backend.make_metadata_builder(16).build(seq_lens=[1], query_lens=[1], block_tables=[[0]],
                                                 encoder_seq_lens=[4])
    with pytest.raises(ValueError, match="rows for 4 encoder tokens"):
        impl.forward(randn(rng, (4, H * D), np.float16), randn(rng, (2, Hkv * D), np.float16),
                     randn(rng, (2, Hkv * D), np.float16), None, md)


def test_device_and_internal_statuses_are_runtime_errors_and_documented():
    """DEVICE_ERROR and INTERNAL (and an unknown status) become RuntimeError; the README's
    Python section and the docstrings say so beside ValueError, NotImplementedError and
    MemoryError."""
    from pagedattn import _lib
    want = {"INVALID_ARGUMENT": ValueError, "UNSUPPORTED": NotImplementedError,
            "UNAVAILABLE": NotImplementedError, "OUT_OF_MEMORY": MemoryError,
            "DEVICE_ERROR": RuntimeError, "INTERNAL": RuntimeError}
    codes = {name: code for code, name in _lib.STATUS_NAMES.items()}
    for name, exc in want.items():
        e = _lib.make_error(codes[name], "here")
        assert isinstance(e, exc) and isinstance(e, pa.PagedAttnError), name
        assert e.status_name == name
    assert isinstance(_lib.make_error(99, "here"), RuntimeError)
    for doc in (pa.flash_attn_varlen_func.__doc__, pa.PagedAttnError.__doc__):
        assert "RuntimeError" in doc and "DEVICE_ERROR" in doc and "INTERNAL" in doc
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for path in (os.path.join(root, "README.md"), os.path.join(root, "python", "README.md")):
        if not os.path.exists(path):
            continue
        text = open(path, encoding="utf-8").read()
        python = text[text.index("## Python"):] if "## Python" in text else text
        errors = [p for p in python.split("\n\n") if "MemoryError" in p]
        assert errors, path
        assert all("RuntimeError" in p and "DEVICE_ERROR" in p and "INTERNAL" in p
                   for p in errors), path
