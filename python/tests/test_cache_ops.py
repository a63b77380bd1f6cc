"""reshape_and_cache_flash, copy_blocks, swap_blocks: exact results (vLLM test_cache.py)."""

import numpy as np
import pytest

import oracle as O
import pagedattn as pa
from util import DTYPES, randn


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_reshape_and_cache_flash(rng, dtype, layout):
    dt = DTYPES[dtype]
    T, H, D, nb, bs = 42, 4, 80, 10, 16
    key = randn(rng, (T, H, D), dt)
    value = randn(rng, (T, H, D), dt)
    slots = rng.permutation(nb * bs)[:T].astype(np.int64)
    slots[3] = -1  # padding token: skipped
    if layout == "NHD":
        kc = np.full((nb, bs, H, D), np.nan, np.float32).astype(dt)
        vc = kc.copy()
        kview, vview = kc, vc
    else:  # HND storage viewed as [nb, bs, H, D]
        kc = np.full((nb, H, bs, D), np.nan, np.float32).astype(dt)
        vc = kc.copy()
        kview, vview = kc.transpose(0, 2, 1, 3), vc.transpose(0, 2, 1, 3)
    before_k = kview.copy()
    pa.reshape_and_cache_flash(key, value, kview, vview, slots)
    expect_k = before_k.copy()
    expect_v = before_k.copy()
    for i, s in enumerate(slots):
        if s < 0:
            continue
        expect_k[s // bs, s % bs] = key[i]
        expect_v[s // bs, s % bs] = value[i]
    np.testing.assert_array_equal(kview.view(np.uint8) if dt == np.float32 else kview.astype(np.float32),
                                  expect_k.view(np.uint8) if dt == np.float32 else expect_k.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(vview, np.float32), np.asarray(expect_v, np.float32))


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_reshape_and_cache_flash_fp8(rng, kv_cache_dtype, dtype):
    dt = DTYPES[dtype]
    T, H, D, nb, bs = 20, 2, 64, 4, 8
    key = randn(rng, (T, H, D), dt, scale=3.0)
    value = randn(rng, (T, H, D), dt, scale=3.0)
    with np.errstate(over="ignore"):  # saturation (inf for float16)
        key[0, 0, :4] = np.array([1e6, -1e6, 0.0, -0.0], np.float32).astype(dt)
    k_scale, v_scale = 0.03, 2.5
    slots = rng.permutation(nb * bs)[:T].astype(np.int64)
    kc = np.zeros((nb, bs, H, D), np.uint8)
    vc = np.zeros((nb, bs, H, D), np.uint8)
    pa.reshape_and_cache_flash(key, value, kc, vc, slots, kv_cache_dtype, k_scale, v_scale)
    ek = O.fp8_encode(key.astype(np.float32), kv_cache_dtype, k_scale)
    ev = O.fp8_encode(value.astype(np.float32), kv_cache_dtype, v_scale)
    np.testing.assert_array_equal(kc[slots // bs, slots % bs], ek)
    np.testing.assert_array_equal(vc[slots // bs, slots % bs], ev)


def test_reshape_and_cache_flash_strided_rows(rng):
    """key/value as views of a fused QKV buffer (row stride > heads * head_size)."""
    T, H, D, nb, bs = 6, 2, 8, 3, 4
    qkv = randn(rng, (T, 3 * H * D), np.float32)
    key = qkv[:, H * D:2 * H * D].reshape(T, H, D)
    value = qkv[:, 2 * H * D:].reshape(T, H, D)
    kc = np.zeros((nb, bs, H, D), np.float32)
    vc = np.zeros((nb, bs, H, D), np.float32)
    slots = np.arange(T, dtype=np.int64) * 2
    pa.reshape_and_cache_flash(key, value, kc, vc, slots)
    np.testing.assert_array_equal(kc[slots // bs, slots % bs], key)
    np.testing.assert_array_equal(vc[slots // bs, slots % bs], value)


def test_reshape_and_cache_flash_padded_key(rng):
    """vLLM V1 pads key and value for CUDA graphs but not slot_mapping: its length is the
    number of tokens written (csrc/cache_kernels.cu); the padding rows are never read."""
    T, n, H, D, nb, bs = 8, 5, 2, 16, 3, 4
    key = randn(rng, (T, H, D), np.float32)
    value = randn(rng, (T, H, D), np.float32)
    key[n:] = np.nan  # padding: must not reach the cache
    value[n:] = np.nan
    kc = np.zeros((nb, bs, H, D), np.float32)
    vc = np.zeros((nb, bs, H, D), np.float32)
    slots = np.array([3, 0, -1, 9, 6], np.int64)
    pa.reshape_and_cache_flash(key, value, kc, vc, slots)
    ek, ev = np.zeros_like(kc), np.zeros_like(vc)
    for i, s in enumerate(slots):
        if s >= 0:
            ek[s // bs, s % bs], ev[s // bs, s % bs] = key[i], value[i]
    np.testing.assert_array_equal(kc, ek)
    np.testing.assert_array_equal(vc, ev)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "uint8"])
@pytest.mark.parametrize("layout", ["flash", "paged", "hnd_view"])
def test_copy_blocks(rng, dtype, layout):
    nb, bs, H, D, layers = 12, 16, 2, 32, 3
    if layout in ("flash", "hnd_view"):
        shp_k = shp_v = (nb, bs, H, D)
    else:  # vLLM's paged layout: key [nb, H, D/x, bs, x], value [nb, H, D, bs]
        x = 8
        shp_k, shp_v = (nb, H, D // x, bs, x), (nb, H, D, bs)
    if dtype == "uint8":
        mk = lambda s: rng.integers(0, 256, s).astype(np.uint8)  # noqa: E731
    else:
        mk = lambda s: randn(rng, s, DTYPES[dtype])  # noqa: E731
    kcs = [mk(shp_k) for _ in range(layers)]
    vcs = [mk(shp_v) for _ in range(layers)]
    if layout == "hnd_view":  # HND storage passed as [nb, bs, H, D] views
        kcs = [np.ascontiguousarray(c.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for c in kcs]
        vcs = [np.ascontiguousarray(c.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for c in vcs]
    src = rng.permutation(nb)
    mapping = np.array([[src[0], src[1]], [src[0], src[2]], [src[3], src[4]]], np.int64)
    ek = [c.copy() for c in kcs]
    ev = [c.copy() for c in vcs]
    for s, d in mapping:
        for e in ek + ev:
            e[d] = e[s]
    pa.copy_blocks(kcs, vcs, mapping)
    for a, b in zip(kcs + vcs, ek + ev):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint8"])
def test_swap_blocks(rng, dtype):
    nb_src, nb_dst, bs, H, D = 6, 9, 8, 2, 16
    if dtype == "uint8":
        src = rng.integers(0, 256, (nb_src, bs, H, D)).astype(np.uint8)
        dst = np.zeros((nb_dst, bs, H, D), np.uint8)
    else:
        src = randn(rng, (nb_src, bs, H, D), DTYPES[dtype])
        dst = np.zeros((nb_dst, bs, H, D), DTYPES[dtype])
    mapping = np.array([[0, 8], [5, 1], [2, 2]], np.int64)
    expect = dst.copy()
    for s, d in mapping:
        expect[d] = src[s]
    pa.swap_blocks(src, dst, mapping)
    np.testing.assert_array_equal(dst.view(np.uint8), expect.view(np.uint8))


def test_backend_swap_and_copy_blocks(backend, rng):
    be = pa.get_attn_backend(backend)
    shape = be.get_kv_cache_shape(5, 4, 2, 8)
    assert shape == (2, 5, 4, 2, 8)
    a = randn(rng, shape, np.float16)
    b = np.zeros((2, 7, 4, 2, 8), np.float16)
    be.swap_blocks(a, b, np.array([[1, 6], [4, 0]]))
    np.testing.assert_array_equal(b[:, 6], a[:, 1])
    np.testing.assert_array_equal(b[:, 0], a[:, 4])
    assert (b[:, 1:6] == 0).all()
    caches = [randn(rng, shape, np.float32) for _ in range(2)]
    expect = [c.copy() for c in caches]
    for e in expect:
        e[:, 3] = e[:, 0]
    be.copy_blocks(caches, np.array([[0, 3]]))
    for c, e in zip(caches, expect):
        np.testing.assert_array_equal(c, e)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_swap_blocks_odd_element_count(rng, dtype):
    """A block of an odd number of 2- or 4-byte elements (block 1, one KV head, head size 3) is a
    valid pool: it is swapped as two halves of its bytes (it was refused)."""
    src = randn(rng, (8, 1, 1, 3), DTYPES[dtype])
    dst = np.zeros((5, 1, 1, 3), DTYPES[dtype])
    mapping = np.array([[7, 0], [2, 4]], np.int64)
    expect = dst.copy()
    for s, d in mapping:
        expect[d] = src[s]
    pa.swap_blocks(src, dst, mapping)
    np.testing.assert_array_equal(dst.view(np.uint8), expect.view(np.uint8))
    # an odd number of bytes has no halves: refused, nothing written
    b8 = np.zeros((4, 1, 1, 3), np.uint8)
    with pytest.raises(ValueError, match="odd number of bytes"):
        pa.swap_blocks(np.ones((4, 1, 1, 3), np.uint8), b8, np.array([[0, 1]]))
    assert not b8.any()


def test_swap_blocks_refuses_different_element_orders(backend, rng):
    """Two pools of the same logical shape whose blocks order their elements differently (the
    backend's HND-in-memory cache beside a plain NHD array): a byte copy would scramble every
    block (an audit found it returned OK): refused, dst untouched. Same orders still swap."""
    be = pa.get_attn_backend(backend)
    nb, bs, H, D = 4, 4, 2, 8
    src = be.new_kv_cache(nb, bs, H, D)
    src[...] = randn(rng, src.shape, src.dtype)
    dst = np.zeros(be.get_kv_cache_shape(nb, bs, H, D), src.dtype)
    same_order = dst.strides[2:] == src.strides[2:]
    if not same_order:
        with pytest.raises(ValueError, match="different orders"):
            be.swap_blocks(src, dst, np.array([[1, 2]]))
        with pytest.raises(ValueError, match="different orders"):
            pa.swap_blocks(src[0], dst[0], np.array([[1, 2]]))
        assert not dst.any()
    # an HND view on both sides (a transposed copy of the same kind of array): swapped exactly
    hnd = np.zeros((2, nb, H, bs, D), src.dtype).transpose(0, 1, 3, 2, 4)
    src2 = np.ascontiguousarray(src.transpose(0, 1, 3, 2, 4)).transpose(0, 1, 3, 2, 4)
    be.swap_blocks(src2, hnd, np.array([[1, 2], [3, 0]]))
    np.testing.assert_array_equal(hnd[:, 2], src2[:, 1])
    np.testing.assert_array_equal(hnd[:, 0], src2[:, 3])
    pa.swap_blocks(src2[0], hnd[0], np.array([[0, 1]]))
    np.testing.assert_array_equal(hnd[0, 1], src2[0, 0])


@pytest.mark.parametrize("name,dtype", [("bfloat16", "bfloat16"), ("float16", "float16"),
                                        ("BFloat16", "bfloat16")])
def test_unquantized_kv_cache_dtype_names(backend, rng, name, dtype):
    """vLLM's kv_cache_dtype "bfloat16"/"float16" (CacheDType; its kernels read them as an
    unquantized cache, like "auto") are taken where the cache has that dtype: the same bits as
    "auto", in reshape_and_cache_flash, the paged flash_attn_varlen_func and the impl. Another
    cache dtype (float16 under "bfloat16", uint8 fp8 codes) is a ValueError; nothing written."""
    dt = DTYPES[dtype]
    T, H, Hkv, D, nb, bs = 9, 4, 2, 32, 6, 4
    key, value = randn(rng, (T, Hkv, D), dt), randn(rng, (T, Hkv, D), dt)
    slots = rng.permutation(nb * bs)[:T].astype(np.int64)
    kc, vc = np.zeros((nb, bs, Hkv, D), dt), np.zeros((nb, bs, Hkv, D), dt)
    ka, va = kc.copy(), vc.copy()
    pa.reshape_and_cache_flash(key, value, kc, vc, slots, name, 1.0, 1.0)
    pa.reshape_and_cache_flash(key, value, ka, va, slots, "auto")
    np.testing.assert_array_equal(kc.view(np.uint8), ka.view(np.uint8))
    np.testing.assert_array_equal(vc.view(np.uint8), va.view(np.uint8))
    other = np.dtype(np.float16) if dtype == "bfloat16" else DTYPES["bfloat16"]
    for bad in (np.zeros((nb, bs, Hkv, D), other), np.zeros((nb, bs, Hkv, D), np.uint8)):
        with pytest.raises(ValueError, match="kv_cache_dtype"):
            pa.reshape_and_cache_flash(key.astype(other) if bad.dtype == other else key,
                                       value.astype(other) if bad.dtype == other else value,
                                       bad, bad.copy(), slots, name)
        assert not bad.view(np.uint8).any()
    # attention over that cache
    q = randn(rng, (3, H, D), dt)
    bt = np.arange(nb, dtype=np.int32).reshape(1, nb)
    kw = dict(max_seqlen_q=3, cu_seqlens_q=np.array([0, 3], np.int32), max_seqlen_k=T,
              seqused_k=np.array([T], np.int32), block_table=bt, causal=True, backend=backend)
    got = pa.flash_attn_varlen_func(q, kc, vc, kv_cache_dtype=name, **kw)
    want = pa.flash_attn_varlen_func(q, kc, vc, **kw)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    # vLLM's impl and backend queries
    be = pa.get_attn_backend(backend)
    assert be.supports_kv_cache_dtype(name.lower())
    assert not be.validate_configuration(D, dt, name.lower(), bs)
    impl = be.get_impl_cls()(H, D, D ** -0.5, Hkv, kv_cache_dtype=name)
    ref_impl = be.get_impl_cls()(H, D, D ** -0.5, Hkv)
    md = be.make_metadata_builder(bs).build(seq_lens=[T], query_lens=[T], block_tables=[[4, 1, 0]])
    x = randn(rng, (T, H * D), dt)
    kn, vn = randn(rng, (T, Hkv * D), dt), randn(rng, (T, Hkv * D), dt)
    c1, c2 = np.zeros((2, nb, bs, Hkv, D), dt), np.zeros((2, nb, bs, Hkv, D), dt)
    o1 = impl.forward(x, kn, vn, c1, md)
    o2 = ref_impl.forward(x, kn, vn, c2, md)
    np.testing.assert_array_equal(o1.view(np.uint8), o2.view(np.uint8))
    np.testing.assert_array_equal(c1.view(np.uint8), c2.view(np.uint8))
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        impl.forward(x.astype(other), kn.astype(other), vn.astype(other),
                     np.zeros((2, nb, bs, Hkv, D), other), md)


def test_swap_blocks_vllm_byte_count_form(rng):
    """Current vLLM's swap_blocks(src, dst, block_size_in_bytes, block_mapping) (its v1 CPU
    offload worker) beside the older (src, dst, block_mapping): the same copy when the count
    is a block's size; other counts follow vLLM's addressing (chunk i at byte i * count) or are
    refused, never a partial copy."""
    nb, bs, H, D = 6, 4, 2, 8
    dt = DTYPES["bfloat16"]
    # an HND cache viewed as [nb, bs, H, D] (vLLM's allocation), keys of a [2, ...] cache
    src = randn(rng, (2, nb, H, bs, D), dt).transpose(0, 1, 3, 2, 4)
    dst = np.zeros((2, nb, H, bs, D), dt).transpose(0, 1, 3, 2, 4)
    old = np.zeros_like(dst)
    m = np.array([[1, 5], [3, 0]], np.int64)
    nbytes = bs * H * D * dt.itemsize
    pa.swap_blocks(src[0], dst[0], nbytes, m)
    pa.swap_blocks(src[0], old[0], m)
    np.testing.assert_array_equal(dst.view(np.uint16), old.view(np.uint16))
    np.testing.assert_array_equal(dst[0, 5].view(np.uint16), src[0, 1].view(np.uint16))
    # keywords, a numpy integer count, the old form by keyword
    d2 = np.zeros_like(dst)
    pa.swap_blocks(src[1], d2[1], block_size_in_bytes=np.int64(nbytes), block_mapping=m)
    pa.swap_blocks(src[0], d2[0], block_mapping=m)
    np.testing.assert_array_equal(d2[:, 5].view(np.uint16), src[:, 1].view(np.uint16))
    # vLLM's offload layout: int8 byte views, CPU blocks of 2 GPU pages, CPU ids count pages
    gpu = rng.integers(-128, 128, (nb, nbytes), dtype=np.int8)
    cpu = np.zeros((3, 2 * nbytes), np.int8)
    pa.swap_blocks(gpu, cpu, nbytes, np.array([[4, 3], [0, 0]], np.int64))
    np.testing.assert_array_equal(cpu[1, nbytes:], gpu[4])
    np.testing.assert_array_equal(cpu[0, :nbytes], gpu[0])
    assert not cpu[0, nbytes:].any() and not cpu[1, :nbytes].any() and not cpu[2].any()
    back = np.zeros_like(gpu)
    pa.swap_blocks(cpu, back, nbytes, np.array([[3, 2]], np.int64))
    np.testing.assert_array_equal(back[2], gpu[4])
    # a count that is not a block's size (nor, over adjacent blocks, an exact fraction) is
    # refused before anything is written
    d3 = np.zeros_like(dst)
    for bad in (nbytes - 2, nbytes + 2, 2 * nbytes, 0):
        with pytest.raises(ValueError, match="block_size_in_bytes"):
            pa.swap_blocks(src[0], d3[0], bad, m)
    strided = np.zeros((nb, 2, H, bs, D), dt)[:, 0].transpose(0, 2, 1, 3)  # blocks apart
    with pytest.raises(ValueError, match="block_size_in_bytes"):
        pa.swap_blocks(src[0], strided, nbytes // 2, m)
    pa.swap_blocks(src[0], strided, nbytes, m)  # whole blocks at their own stride
    np.testing.assert_array_equal(strided[5].view(np.uint16), src[0, 1].view(np.uint16))
    assert not d3.view(np.uint16).any()
    # ambiguous or incomplete calls are TypeErrors; backend is keyword-only
    with pytest.raises(TypeError):
        pa.swap_blocks(src[0], d3[0], nbytes)
    with pytest.raises(TypeError, match="keyword-only"):
        pa.swap_blocks(src[0], d3[0], m, "cpu")
    with pytest.raises(TypeError):
        pa.swap_blocks(src[0], d3[0])
    pa.swap_blocks(src[0], d3[0], nbytes, m, backend=pa.available_backends()[0])
    np.testing.assert_array_equal(d3[0, 0].view(np.uint16), src[0, 3].view(np.uint16))
