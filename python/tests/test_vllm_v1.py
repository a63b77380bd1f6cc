"""vLLM >= 0.7 / v1 calling conventions of the backend layer: ``impl.forward(layer, ...)`` with
the scales on the layer, vLLM v1's metadata fields (requests in any order, padding requests and
padded token rows), and the v1 constructor's positional order. Checked against the oracle and
against the first call form, bit for bit."""

import dataclasses
import math
import types

import numpy as np
import pytest

import oracle as O
import pagedattn as pa
from util import randn, tables

H, HKV, D, BS, NB = 8, 2, 32, 8, 40


@dataclasses.dataclass
class V1Metadata:
    """The fields of vLLM v1's FlashAttentionMetadata that attention reads."""
    num_actual_tokens: int
    max_query_len: int
    query_start_loc: np.ndarray
    max_seq_len: int
    seq_lens: np.ndarray
    block_table: np.ndarray
    slot_mapping: np.ndarray
    use_cascade: bool = False
    common_prefix_len: int = 0
    causal: bool = True


def _layer(k_scale=1.0, v_scale=1.0, floats=True):
    if floats:
        return types.SimpleNamespace(_k_scale_float=k_scale, _v_scale_float=v_scale,
                                     _k_scale=np.float32(k_scale), _v_scale=np.float32(v_scale))
    return types.SimpleNamespace(_k_scale=np.array([k_scale], np.float32),
                                 _v_scale=np.array([v_scale], np.float32))


def _step(rng, be, dt, fp8, ctx_lens, q_lens, pad_reqs=1, pad_tokens=5):
    """A cache holding each request's context, and a v1 metadata + inputs for the step."""
    shape = be.get_kv_cache_shape(NB, BS, HKV, D)
    cache = np.full(shape, 0x7F, np.uint8) if fp8 else np.full(shape, np.nan, np.float32).astype(dt)
    seq = [c + q for c, q in zip(ctx_lens, q_lens)]
    tabs = tables(rng, seq, BS, NB)
    ks, vs = (0.5, 0.25) if fp8 else (1.0, 1.0)
    for t, c in zip(tabs, ctx_lens):
        pos = np.arange(c)
        for half, sc in ((0, ks), (1, vs)):
            x = rng.standard_normal((c, HKV, D)).astype(np.float32)
            cache[half][t[pos // BS], pos % BS] = O.fp8_encode(x, "fp8", sc) if fp8 else x.astype(dt)
    T = sum(q_lens)
    n_req = len(q_lens)
    qsl = np.zeros(n_req + pad_reqs + 1, np.int32)
    qsl[1:n_req + 1] = np.cumsum(q_lens)
    qsl[n_req + 1:] = T  # padding requests: no tokens
    width = max(len(t) for t in tabs) + 2
    bt = np.zeros((n_req + pad_reqs, width), np.int32)
    for i, t in enumerate(tabs):
        bt[i, :len(t)] = t
    slots = []
    for t, c, q in zip(tabs, ctx_lens, q_lens):
        pos = c + np.arange(q)
        slots.extend((t[pos // BS].astype(np.int64) * BS + pos % BS).tolist())
    slot_mapping = np.array(slots + [-1] * pad_tokens, np.int64)
    md = V1Metadata(num_actual_tokens=T, max_query_len=max(q_lens), query_start_loc=qsl,
                    max_seq_len=max(seq), seq_lens=np.array(seq + [0] * pad_reqs, np.int32),
                    block_table=bt, slot_mapping=slot_mapping)
    q = randn(rng, (T + pad_tokens, H, D), dt)
    q[T:] = np.nan  # padding rows: never read
    k = randn(rng, (T + pad_tokens, HKV, D), dt)
    v = randn(rng, (T + pad_tokens, HKV, D), dt)
    return cache, tabs, md, q, k, v, (ks, vs)


def _oracle(q, cache, tabs, ctx_lens, q_lens, fp8, ks, vs, scale, **kw):
    out, s = [], 0
    kind = "fp8" if fp8 else "auto"
    for t, c, n in zip(tabs, ctx_lens, q_lens):
        K = O.gather(cache[0], t, c + n, kind, ks)
        V = O.gather(cache[1], t, c + n, kind, vs)
        o, _ = O.attention(q[s:s + n], K, V, c + np.arange(n), scale=scale, **kw)
        out.append(o)
        s += n
    return np.concatenate(out)


@pytest.mark.parametrize("dtype,fp8", [("float16", False), ("bfloat16", False),
                                       ("float32", True)])
def test_v1_metadata_mixed_order_padded(backend, rng, dtype, fp8):
    """A decode first, then a prefill chunk, a speculative decode and a plain prefill, a padding
    request and padded token rows, as vLLM v1 lays a step out: output rows of real tokens match
    the oracle, padded rows stay as they were, the new K/V are in the cache."""
    be = pa.get_attn_backend(backend)
    dt = np.dtype(dtype) if dtype != "bfloat16" else O.BF16
    ctx_lens, q_lens = [37, 0, 20, 0], [1, 13, 3, 6]
    cache, tabs, md, q, k, v, (ks, vs) = _step(rng, be, dt, fp8, ctx_lens, q_lens)
    scale = 1 / math.sqrt(D)
    impl = be.get_impl_cls()(H, D, scale, HKV, None, None, "fp8" if fp8 else "auto", None,
                             "decoder", None)
    T = sum(q_lens)
    out = np.full((q.shape[0], H, D), 7.0, np.float32).astype(dt)
    got = impl.forward(_layer(ks, vs), q, k, v, cache, md, output=out)
    assert got is out
    assert np.all(np.asarray(out[T:], np.float32) == 7.0), "a padded output row was written"
    s = 0
    for t, c, n in zip(tabs, ctx_lens, q_lens):  # the new K/V went where the slots say
        pos = c + np.arange(n)
        for half, x, sc in ((0, k, ks), (1, v, vs)):
            cached = cache[half][t[pos // BS], pos % BS]
            want = (O.fp8_encode(np.asarray(x[s:s + n], np.float32), "fp8", sc) if fp8
                    else x[s:s + n])
            np.testing.assert_array_equal(np.asarray(cached, np.float32) if not fp8 else cached,
                                          np.asarray(want, np.float32) if not fp8 else want)
        s += n
    ref = _oracle(q[:T], cache, tabs, ctx_lens, q_lens, fp8, ks, vs, scale)
    tol = dict(atol=3e-2, rtol=3e-2) if fp8 else {}
    O.assert_close(out[:T], ref, dt, **tol)


def test_layer_form_same_bits_as_first_form(backend, rng):
    """The same step through forward(query, ...) with our metadata and through
    forward(layer, ...) with vLLM v1's: the same output and cache bits."""
    be = pa.get_attn_backend(backend)
    dt = np.dtype(np.float16)
    ctx_lens, q_lens = [0, 25, 9], [11, 1, 4]
    cache, tabs, md, q, k, v, _ = _step(rng, be, dt, True, ctx_lens, q_lens, pad_reqs=0,
                                        pad_tokens=0)
    impl = be.get_impl_cls()(H, D, 0.3, HKV, kv_cache_dtype="fp8")
    ours = be.make_metadata_builder(BS).build(
        seq_lens=[c + n for c, n in zip(ctx_lens, q_lens)], query_lens=q_lens,
        block_tables=tabs, num_prefills=3)
    c1, c2 = cache.copy(), cache.copy()
    o1 = impl.forward(q.reshape(len(q), H * D), k.reshape(len(k), -1), v.reshape(len(v), -1),
                      c1, ours, k_scale=0.5, v_scale=0.25)
    for floats in (True, False):
        c2[...] = cache
        o2 = np.empty((len(q), H, D), dt)
        impl.forward(_layer(0.5, 0.25, floats), q, k, v, c2, md, output=o2)
        np.testing.assert_array_equal(o1.reshape(o2.shape), o2)
        np.testing.assert_array_equal(c1, c2)
    # the layer form also takes our metadata, and a dict of v1 fields
    c2[...] = cache
    o3 = impl.forward(layer=_layer(0.5, 0.25), query=q, key=k, value=v, kv_cache=c2,
                      attn_metadata=ours)
    np.testing.assert_array_equal(o1.reshape(o3.shape), o3)
    c2[...] = cache
    o4 = impl.forward(_layer(0.5, 0.25), q, k, v, c2, dataclasses.asdict(md))
    np.testing.assert_array_equal(o1.reshape(o4.shape), o4)


def test_v1_metadata_rewritten_in_place(backend, rng):
    """The conversion of v1 metadata is kept by content: the same object with other lengths and
    tables gives the new step's answer."""
    be = pa.get_attn_backend(backend)
    dt = np.dtype(np.float32)
    ctx_lens, q_lens = [30, 12], [1, 1]
    cache, tabs, md, q, k, v, _ = _step(rng, be, dt, False, ctx_lens, q_lens, pad_reqs=0,
                                        pad_tokens=0)
    impl = be.get_impl_cls()(H, D, 0.2, HKV)
    out = np.empty((2, H, D), dt)
    impl.forward(_layer(), q, k, v, cache, md, output=out)
    O.assert_close(out, _oracle(q, cache, tabs, ctx_lens, q_lens, False, 1, 1, 0.2), dt)
    # next step: the requests swap places, each one token longer
    md.seq_lens[:] = md.seq_lens[::-1] + 1
    md.block_table[:] = md.block_table[::-1].copy()
    md.slot_mapping[:] = [int(tabs[1][13 // BS]) * BS + 13 % BS,
                          int(tabs[0][31 // BS]) * BS + 31 % BS]
    impl.forward(_layer(), q, k, v, cache, md, output=out)
    ref = _oracle(q, cache, tabs[::-1], [13, 31], [1, 1], False, 1, 1, 0.2)
    O.assert_close(out, ref, dt)


def test_v1_constructor_orders():
    be = pa.get_attn_backend("reference")
    Impl = be.get_impl_cls()
    a = Impl(8, 32, 0.1, 2, None, None, "auto", 30.0, "decoder", None)  # v1
    assert a.logits_soft_cap == 30.0 and a.blocksparse is None and a.kv_sharing_target_layer_name is None
    b = Impl(8, 32, 0.1, 2, None, None, "auto", None, "encoder_only", "layers.0")  # v1
    assert b.attn_type == pa.backend.L.PA_ATTN_ENCODER_ONLY
    assert b.kv_sharing_target_layer_name == "layers.0" and b.logits_soft_cap == 0.0
    c = Impl(8, 32, 0.1, 2, None, None, "auto", None, 30.0, "decoder")  # vLLM <= 0.9
    assert c.logits_soft_cap == 30.0 and c.blocksparse is None
    d = Impl(8, 32, 0.1, 2, None, None, "auto",
             dict(max_seqlen=256, local_blocks=2, vert_stride=2, block_size=16), 5.0)
    assert d.blocksparse is not None and d.logits_soft_cap == 5.0
    e = Impl(8, 32, 0.1, 2, None, None, "auto", None)  # either order: nothing set
    assert e.logits_soft_cap == 0.0 and e.blocksparse is None
    with pytest.raises(TypeError):
        Impl(8, 32, 0.1, 2, None, None, "auto", None, None, "decoder", None)
    with pytest.raises(ValueError):
        Impl(8, 32, 0.1, 2, None, None, "auto", 3.0, "sideways")


def test_v1_refusals_and_profiling_run(backend, rng):
    be = pa.get_attn_backend(backend)
    dt = np.dtype(np.float16)
    cache, tabs, md, q, k, v, _ = _step(rng, be, dt, False, [5, 0], [1, 4])
    before = cache.copy()
    impl = be.get_impl_cls()(H, D, 0.2, HKV)
    out = np.full((q.shape[0], H, D), 3.0, dt)
    assert impl.forward(_layer(), q, k, v, cache, None, output=out) is out  # profiling run
    with pytest.raises(NotImplementedError, match="output quantization"):
        impl.forward(_layer(), q, k, v, cache, md, output=out, output_scale=np.ones(1))
    md.causal = False
    with pytest.raises(NotImplementedError, match="causal"):
        impl.forward(_layer(), q, k, v, cache, md, output=out)
    with pytest.raises(TypeError, match="query_start_loc"):
        impl.forward(_layer(), q, k, v, cache, types.SimpleNamespace(seq_lens=[5]), output=out)
    md.causal = True
    md.num_actual_tokens = 4  # disagrees with query_start_loc
    with pytest.raises(ValueError, match="num_actual_tokens"):
        impl.forward(_layer(), q, k, v, cache, md, output=out)
    np.testing.assert_array_equal(cache, before)
    assert np.all(np.asarray(out, np.float32) == 3.0)


def test_kv_sharing_layer_writes_nothing(backend, rng):
    """A layer that shares another layer's cache reads it and leaves it as it is."""
    be = pa.get_attn_backend(backend)
    dt = np.dtype(np.float32)
    ctx_lens, q_lens = [17, 6], [1, 2]
    cache, tabs, md, q, k, v, _ = _step(rng, be, dt, False, ctx_lens, q_lens, pad_reqs=0,
                                        pad_tokens=0)
    owner = be.get_impl_cls()(H, D, 0.2, HKV)
    sharer = be.get_impl_cls()(H, D, 0.2, HKV, None, None, "auto", None, "decoder", "layers.0")
    out = np.empty((3, H, D), dt)
    owner.forward(_layer(), q, k, v, cache, md, output=out)
    written = cache.copy()
    out2 = np.empty_like(out)
    sharer.forward(_layer(), q, 2 * k, 2 * v, cache, md, output=out2)  # other K/V: not written
    np.testing.assert_array_equal(cache, written)
    np.testing.assert_array_equal(out, out2)


def test_v1_builder_protocol(backend, rng):
    """vLLM v1 makes the builder as (kv_cache_spec, layer_names, vllm_config, device) and calls
    build(common_prefix_len, common_attn_metadata): the metadata it returns runs the step as
    the v1 metadata itself does."""
    be = pa.get_attn_backend(backend)
    assert be.accept_output_buffer
    dt = np.dtype(np.float16)
    ctx_lens, q_lens = [19, 0], [1, 7]
    cache, tabs, md, q, k, v, _ = _step(rng, be, dt, False, ctx_lens, q_lens)
    spec = types.SimpleNamespace(block_size=BS, num_kv_heads=HKV, head_size=D)
    builder = be.get_builder_cls()(spec, ["layers.0"], None, "cpu")
    assert builder.block_size == BS
    built = [builder.build(0, md), builder.build(common_prefix_len=0, common_attn_metadata=md)]
    impl = be.get_impl_cls()(H, D, 0.2, HKV)
    T = sum(q_lens)
    c0 = cache.copy()
    want = np.empty((len(q), H, D), dt)
    impl.forward(_layer(), q, k, v, c0, md, output=want)
    for b in built:
        assert isinstance(b, pa.PagedAttnMetadata) and b.num_tokens == T
        c = cache.copy()
        got = np.empty((len(q), H, D), dt)
        impl.forward(_layer(), q, k, v, c, b, output=got)
        np.testing.assert_array_equal(got[:T], want[:T])
        np.testing.assert_array_equal(c, c0)
    with pytest.raises(TypeError, match="seq_lens"):
        builder.build()


def test_layer_form_encoder_decoder(backend, rng):
    """Encoder self-attention, decoder self-attention and cross-attention (more encoder tokens
    than decoder tokens) through forward(layer, ...) with our metadata: the same bits as the
    first form, padded rows untouched."""
    be = pa.get_attn_backend(backend)
    dt = np.dtype(np.float32)
    Impl = be.get_impl_cls()
    enc_lens, dec_lens = [11, 5], [3, 1]
    self_tabs = tables(rng, dec_lens, BS, NB)
    cross_tabs = tables(rng, enc_lens, BS, NB)
    md = be.make_metadata(seq_lens=dec_lens, query_lens=dec_lens, block_tables=self_tabs,
                          encoder_seq_lens=enc_lens, cross_block_tables=cross_tabs,
                          block_size=BS, num_prefills=2)
    Te, Td = sum(enc_lens), sum(dec_lens)
    shape = be.get_kv_cache_shape(NB, BS, HKV, D)
    for attn_type, T, Tk, cached in (("encoder", Te, Te, False), ("decoder", Td, Td, True),
                                     ("encoder_decoder", Td, Te, True)):
        impl = Impl(H, D, 0.2, HKV, attn_type=attn_type)
        q = randn(rng, (T + 2, H, D), dt)
        k, v = randn(rng, (Tk + 2, HKV, D), dt), randn(rng, (Tk + 2, HKV, D), dt)
        cache = np.full(shape, np.nan, dt) if cached else None
        c1 = None if cache is None else cache.copy()
        want = impl.forward(q[:T].reshape(T, H * D), k[:Tk].reshape(Tk, -1),
                            v[:Tk].reshape(Tk, -1), c1, md)
        c2 = None if cache is None else cache.copy()
        got = np.full((T + 2, H, D), 9.0, dt)
        impl.forward(_layer(), q, k, v, c2, md, output=got)
        np.testing.assert_array_equal(got[:T], want.reshape(T, H, D), err_msg=attn_type)
        assert np.all(got[T:] == 9.0), attn_type
        if cache is not None:
            np.testing.assert_array_equal(c1, c2)


@pytest.mark.parametrize("attn_type,causal", [("encoder_only", False), ("encoder", False),
                                               ("encoder_only", True), ("encoder", True)])
def test_v1_metadata_encoder_only(backend, rng, attn_type, causal):
    """An encoder-only layer (BERT-like) or an encoder-decoder model's encoder with vLLM v1's
    metadata, which runs both alike: no cache, a block table of zeros and slots that mean
    nothing to them; attention among each request's tokens, bidirectional for causal=False (what
    v1's encoder-only builder says), causal for causal=True (as v1's FlashAttention backend
    computes it then)."""
    be = pa.get_attn_backend(backend)
    dt = np.dtype(np.float32)
    lens = [9, 4, 1]
    T = sum(lens)
    md = V1Metadata(num_actual_tokens=T, max_query_len=9,
                    query_start_loc=np.concatenate([[0], np.cumsum(lens), [T]]).astype(np.int32),
                    max_seq_len=9, seq_lens=np.array(lens + [0], np.int32),
                    block_table=np.zeros((4, 1), np.int32),
                    slot_mapping=np.full(T + 3, -1, np.int64), causal=causal)
    impl = be.get_impl_cls()(H, D, 0.2, HKV, None, None, "auto", None, attn_type, None)
    q = randn(rng, (T + 3, H, D), dt)
    k, v = randn(rng, (T + 3, HKV, D), dt), randn(rng, (T + 3, HKV, D), dt)
    out = np.full((T + 3, H, D), 4.0, dt)
    impl.forward(_layer(), q, k, v, np.empty(0, dt), md, output=out)
    s = 0
    for n in lens:
        ro, _ = O.attention(q[s:s + n], k[s:s + n], v[s:s + n], np.arange(n), scale=0.2,
                            causal=causal)
        O.assert_close(out[s:s + n], ro, dt)
        s += n
    assert np.all(out[T:] == 4.0)


def test_v1_common_metadata_padding(backend, rng):
    """vLLM v1's CommonAttentionMetadata: num_reqs real requests, arrays padded past them (a
    padded request may carry a stale length), num_actual_tokens counting padding tokens; the
    builder's build(common_prefix_len, common_attn_metadata) and forward take it as it is."""
    be = pa.get_attn_backend(backend)
    dt = np.dtype(np.float32)
    ctx_lens, q_lens = [12, 0], [1, 5]
    cache, tabs, md, q, k, v, _ = _step(rng, be, dt, False, ctx_lens, q_lens)
    T = sum(q_lens)
    common = types.SimpleNamespace(
        query_start_loc=md.query_start_loc, seq_lens=np.append(md.seq_lens[:2], [7]),
        num_reqs=2, num_actual_tokens=T + 3, max_query_len=5, max_seq_len=13,
        block_table_tensor=np.vstack([md.block_table, np.full((1, md.block_table.shape[1]), 39,
                                                              np.int32)]),
        slot_mapping=md.slot_mapping, causal=True)
    impl = be.get_impl_cls()(H, D, 0.2, HKV)
    built = be.get_builder_cls()(types.SimpleNamespace(block_size=BS), [], None, None).build(
        0, common)
    assert built.num_tokens == T and built.num_seqs == 2
    c1, c2 = cache.copy(), cache.copy()
    o1 = np.full((len(q), H, D), 6.0, dt)
    o2 = np.full((len(q), H, D), 6.0, dt)
    impl.forward(_layer(), q, k, v, c1, common, output=o1)
    impl.forward(_layer(), q, k, v, c2, built, output=o2)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(c1, c2)
    assert np.all(o1[T:] == 6.0)
    O.assert_close(o1[:T], _oracle(q[:T], c1, tabs, ctx_lens, q_lens, False, 1, 1, 0.2), dt)


def test_v1_backend_selection_queries(backend):
    be = pa.get_attn_backend(backend)
    assert be.supports_dtype("bfloat16") and be.supports_dtype(np.float16)
    assert be.supports_dtype(O.BF16) and not be.supports_dtype(np.float64)
    assert be.supports_kv_cache_dtype("fp8_e5m2") and not be.supports_kv_cache_dtype("int8")
    assert be.supports_block_size(5) and not be.supports_block_size(0)
    assert not be.is_mla() and be.supports_sink() and not be.supports_non_causal()
    assert all(be.supports_attn_type(t) for t in ("decoder", "encoder", "encoder_only",
                                                   "encoder_decoder"))
    assert not be.supports_attn_type("sideways")
    assert be.supports_batch_invariance()
    assert be.validate_configuration(128, "bfloat16", "fp8", 16, has_sink=True) == []
    why = be.validate_configuration(513, "float64", "int8", 0, use_mla=True,
                                    attn_type="sideways", use_non_causal=True)
    assert why == ["head_size not supported", "dtype not supported",
                   "kv_cache_dtype not supported", "block_size not supported",
                   "MLA not supported", "attention type sideways not supported",
                   "non-causal attention not supported"], why


def _cross_step(rng, be, dt, enc_lens, q_lens, new, pad_tokens=3):
    """vLLM v1's metadata of a cross-attention layer (its CrossAttentionBuilder's): causal
    False, seq_lens = encoder lengths, block_table = the cross cache's tables (rows padded past
    the blocks needed, and a padding request), slot_mapping = the encoder slots of the requests
    in `new` (whose encoder ran this step), in request order. Returns the NaN-filled cross cache
    holding the other requests' encoder K/V, the tables, the metadata, and the key/value rows
    of the new requests (plus padded rows)."""
    shape = be.get_kv_cache_shape(NB, BS, HKV, D)
    cache = np.full(shape, np.nan, np.float32).astype(dt)
    tabs = tables(rng, enc_lens, BS, NB)
    rows, slots = [], []
    for i, (t, e) in enumerate(zip(tabs, enc_lens)):
        pos = np.arange(e)
        kv = [rng.standard_normal((e, HKV, D)).astype(np.float32).astype(dt) for _ in range(2)]
        if i in new:
            rows.append(kv)
            slots.extend((t[pos // BS].astype(np.int64) * BS + pos % BS).tolist())
        else:
            for half in (0, 1):
                cache[half][t[pos // BS], pos % BS] = kv[half]
    n_req = len(q_lens)
    T = sum(q_lens)
    qsl = np.zeros(n_req + 2, np.int32)
    qsl[1:n_req + 1] = np.cumsum(q_lens)
    qsl[n_req + 1] = T
    bt = np.zeros((n_req + 1, max(len(t) for t in tabs) + 2), np.int32)
    for i, t in enumerate(tabs):
        bt[i, :len(t)] = t
    md = V1Metadata(num_actual_tokens=T, max_query_len=max(q_lens), query_start_loc=qsl,
                    max_seq_len=max(enc_lens), seq_lens=np.array(enc_lens + [0], np.int32),
                    block_table=bt, slot_mapping=np.array(slots, np.int64), causal=False)
    key = value = None
    if rows:
        ne = sum(len(r[0]) for r in rows)
        key = np.full((ne + pad_tokens, HKV, D), np.nan, np.float32).astype(dt)
        value = key.copy()
        key[:ne] = np.concatenate([r[0] for r in rows])
        value[:ne] = np.concatenate([r[1] for r in rows])
    return cache, tabs, md, key, value


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_v1_cross_attention(backend, rng, dtype):
    """An encoder-decoder model's cross-attention layer under vLLM v1: a step where two of three
    requests bring their encoder output (written through the v1 slots, the third's already
    cached), then a decode step (key = value = None) over the cache: outputs against the
    oracle over the cross cache, padded rows untouched, nothing else of the cache changed."""
    be = pa.get_attn_backend(backend)
    dt = np.dtype(dtype) if dtype != "bfloat16" else O.BF16
    enc_lens, q_lens = [13, 21, 7], [3, 1, 2]
    cache, tabs, md, key, value = _cross_step(rng, be, dt, enc_lens, q_lens, new=(0, 2))
    scale = 1 / math.sqrt(D)
    impl = be.get_impl_cls()(H, D, scale, HKV, None, None, "auto", None, "encoder_decoder")
    before = cache.copy()

    def check(q, out, T):
        s = 0
        for i, n in enumerate(q_lens):
            K = O.gather(cache[0], tabs[i], enc_lens[i])
            V = O.gather(cache[1], tabs[i], enc_lens[i])
            ref, _ = O.attention(q[s:s + n], K, V, np.arange(n), scale=scale, causal=False)
            O.assert_close(out[s:s + n], ref, dt)
            s += n
        assert np.all(np.asarray(out[T:], np.float32) == 5.0), "a padded output row was written"

    T = sum(q_lens)
    q = randn(rng, (T + 4, H, D), dt)
    q[T:] = np.nan
    out = np.full((T + 4, H, D), 5.0, np.float32).astype(dt)
    assert impl.forward(_layer(), q, key, value, cache, md, output=out) is out
    # the new requests' encoder K/V went where the slots say; nothing else changed
    s = 0
    for i in (0, 2):
        pos = np.arange(enc_lens[i])
        for half, x in ((0, key), (1, value)):
            np.testing.assert_array_equal(
                np.asarray(cache[half][tabs[i][pos // BS], pos % BS], np.float32),
                np.asarray(x[s:s + enc_lens[i]], np.float32))
        s += enc_lens[i]
    written = np.zeros(cache.shape[1:3], bool)
    for i in (0, 2):
        pos = np.arange(enc_lens[i])
        written[tabs[i][pos // BS], pos % BS] = True
    u = lambda c: np.asarray(c).view(np.uint16 if dt.itemsize == 2 else np.uint32)  # noqa: E731
    np.testing.assert_array_equal(u(cache[:, ~written]), u(before[:, ~written]))
    check(q, out, T)
    # decode: one token per request, the encoder K/V only read
    md2 = dataclasses.replace(md, num_actual_tokens=3, max_query_len=1,
                              query_start_loc=np.array([0, 1, 2, 3, 3], np.int32),
                              slot_mapping=np.zeros(0, np.int64))
    q_lens[:] = [1, 1, 1]
    q2 = randn(rng, (5, H, D), dt)
    out2 = np.full((5, H, D), 5.0, np.float32).astype(dt)
    snap = cache.copy()
    impl.forward(_layer(), q2, None, None, cache, md2, output=out2)
    np.testing.assert_array_equal(u(cache), u(snap))
    check(q2, out2, 3)


def test_v1_cross_attention_bad_input(rng):
    """Malformed v1 cross-attention calls raise and leave the cache and output as they were."""
    be = pa.get_attn_backend("cpu")
    dt = np.dtype(np.float32)
    enc_lens, q_lens = [9, 12], [2, 1]
    cache, tabs, md, key, value = _cross_step(rng, be, dt, enc_lens, q_lens, new=(0, 1))
    impl = be.get_impl_cls()(H, D, 0.2, HKV, attn_type="encoder_decoder")
    q = randn(rng, (3, H, D), dt)
    ne = sum(enc_lens)
    bad_tab = md.block_table.copy()
    bad_tab[1, 0] = NB  # outside the pool
    bad_slots = md.slot_mapping.copy()
    bad_slots[3] = NB * BS  # outside the pool
    cases = [
        (dict(causal=True), key, value, NotImplementedError),
        (dict(block_table=bad_tab), key, value, ValueError),
        (dict(slot_mapping=bad_slots), key, value, ValueError),
        ({}, key[:ne - 1], value[:ne - 1], ValueError),  # fewer rows than slots
        ({}, key, None, ValueError),
        (dict(query_start_loc=np.array([0, 2, 4, 4], np.int32), num_actual_tokens=4), key, value,
         ValueError),  # more query tokens than given
    ]
    for change, k, v, exc in cases:
        c = cache.copy()
        out = np.full((3, H, D), 5.0, np.float32)
        with pytest.raises(exc):
            impl.forward(_layer(), q, k, v, c, dataclasses.replace(md, **change), output=out)
        np.testing.assert_array_equal(c.view(np.uint32), cache.view(np.uint32), err_msg=str(change))
        assert np.all(out == 5.0), str(change)


def test_do_kv_cache_update(backend, rng):
    """vLLM's split store step (impl.do_kv_cache_update(layer, key, value, kv_cache,
    slot_mapping)) writes what forward writes, bit for bit (fp8 with the layer's scales; padded
    key rows past the slots ignored); nothing for encoder-only and kv-sharing layers; a bad slot
    raises and writes nothing."""
    be = pa.get_attn_backend(backend)
    assert be.forward_includes_kv_cache_update is True
    dt = np.dtype(np.float16)
    cache, tabs, md, q, k, v, (ks, vs) = _step(rng, be, dt, True, [9, 0], [1, 7])
    Impl = be.get_impl_cls()
    impl = Impl(H, D, 0.3, HKV, None, None, "fp8", None, "decoder", None)
    c1, c2 = cache.copy(), cache.copy()
    impl.forward(_layer(ks, vs), q, k, v, c1, md, output=np.empty((len(q), H, D), dt))
    assert not np.array_equal(c1, cache)
    impl.do_kv_cache_update(_layer(ks, vs), k, v, c2, md.slot_mapping)
    np.testing.assert_array_equal(c2, c1)
    for other in (Impl(H, D, 0.3, HKV, None, None, "fp8", None, "encoder_only", None),
                  Impl(H, D, 0.3, HKV, None, None, "fp8", None, "decoder", "layers.0.attn")):
        c3 = cache.copy()
        other.do_kv_cache_update(_layer(ks, vs), k, v, c3, md.slot_mapping)
        np.testing.assert_array_equal(c3, cache)
    bad = md.slot_mapping.copy()
    bad[2] = NB * BS
    c4 = cache.copy()
    with pytest.raises(ValueError):
        impl.do_kv_cache_update(_layer(ks, vs), k, v, c4, bad)
    np.testing.assert_array_equal(c4, cache)
