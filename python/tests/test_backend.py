"""vLLM's backend layer: metadata builder + AttentionImpl.forward flows (decoder, encoder,
encoder_only, encoder/decoder cross-attention), against the oracle."""

import math

import numpy as np
import pytest

import oracle as O
import pagedattn as pa
from util import DTYPES, randn, tables


def _kv_cache(be, nb, bs, hkv, d, dtype, fp8=False):
    shape = be.get_kv_cache_shape(nb, bs, hkv, d)
    if fp8:
        return np.full(shape, 0x7F, np.uint8)
    return np.full(shape, np.nan, np.float32).astype(dtype)


def _ref_decoder_step(q, cache, tabs, ctx_lens, q_lens, kind, ks, vs, **kw):
    out = []
    s = 0
    for i, (c, n) in enumerate(zip(ctx_lens, q_lens)):
        K = O.gather(cache[0], tabs[i], c + n, kind, ks)
        V = O.gather(cache[1], tabs[i], c + n, kind, vs)
        o, _ = O.attention(q[s:s + n], K, V, c + np.arange(n), **kw)
        out.append(o)
        s += n
    return np.concatenate(out)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_decoder_prefill_then_decode(backend, rng, dtype, kv_cache_dtype):
    """Step 1: prefill (one full, one chunk of a longer prompt); step 2: chunk + decodes."""
    be = pa.get_attn_backend(backend)
    assert be.get_name() == backend
    dt = DTYPES[dtype]
    H, Hkv, D, bs, nb = 8, 2, 64, 16, 24
    scale = 1 / math.sqrt(D)
    ks, vs = (0.1, 0.3) if kv_cache_dtype == "fp8" else (1.0, 1.0)
    Impl = be.get_impl_cls()
    impl = Impl(H, D, scale, num_kv_heads=Hkv, kv_cache_dtype=kv_cache_dtype)
    cache = _kv_cache(be, nb, bs, Hkv, D, dt, kv_cache_dtype != "auto")
    final = [30, 50, 3]
    tabs = tables(rng, final, bs, nb)
    builder = be.make_metadata_builder(bs)
    for ctx_lens, q_lens in (([0, 0, 0], [30, 20, 2]), ([30, 20, 2], [0, 30, 1])):
        live = [i for i in range(3) if q_lens[i] > 0]
        cl = [ctx_lens[i] for i in live]
        ql = [q_lens[i] for i in live]
        md = builder.build(seq_lens=[c + n for c, n in zip(cl, ql)], query_lens=ql,
                           block_tables=[tabs[i] for i in live])
        T = sum(ql)
        q = randn(rng, (T, H * D), dt)
        k = randn(rng, (T, Hkv * D), dt)
        v = randn(rng, (T, Hkv * D), dt)
        out = impl.forward(q, k, v, cache, md, k_scale=ks, v_scale=vs)
        assert out.shape == (T, H * D) and out.dtype == dt
        ref = _ref_decoder_step(q.reshape(T, H, D), cache, [tabs[i] for i in live], cl, ql,
                                kv_cache_dtype, ks, vs, scale=scale)
        tol = {} if kv_cache_dtype == "auto" else dict(atol=3e-2, rtol=3e-2)
        O.assert_close(out.reshape(T, H, D), ref, dt, **tol)
        # the new K/V are in the cache, exactly (or as fp8 of x / scale)
        s = 0
        for i, c, n in zip(live, cl, ql):
            pos = c + np.arange(n)
            got = cache[0][tabs[i][pos // bs], pos % bs]
            want = k[s:s + n].reshape(n, Hkv, D)
            if kv_cache_dtype == "auto":
                np.testing.assert_array_equal(np.asarray(got, np.float32),
                                              np.asarray(want, np.float32))
            else:
                np.testing.assert_array_equal(got, O.fp8_encode(want.astype(np.float32), "fp8",
                                                                ks))
            s += n
    assert md.num_prefills == 1 and md.num_decode_tokens == 1


@pytest.mark.parametrize("feature", ["sliding_window", "alibi", "softcap", "sinks"])
def test_decoder_features(backend, rng, feature):
    be = pa.get_attn_backend(backend)
    H, Hkv, D, bs, nb = 4, 4, 32, 8, 20
    dt = np.dtype(np.float16)
    kw, rkw = {}, {"scale": 0.2}
    if feature == "sliding_window":
        kw["sliding_window"] = 6
        rkw["window"] = (5, 0)
    if feature == "alibi":
        kw["alibi_slopes"] = rkw["alibi"] = O.alibi_slopes(H)
    if feature == "softcap":
        kw["logits_soft_cap"] = rkw["softcap"] = 4.0
    if feature == "sinks":
        kw["sinks"] = rkw["sinks"] = rng.standard_normal(H).astype(np.float32)
    impl = be.get_impl_cls()(H, D, 0.2, Hkv, **kw)
    cache = _kv_cache(be, nb, bs, Hkv, D, dt)
    cl, ql = [0, 21, 40], [17, 5, 1]
    tabs = tables(rng, [c + n for c, n in zip(cl, ql)], bs, nb)
    # existing context
    for i, c in enumerate(cl):
        pos = np.arange(c)
        cache[0][tabs[i][pos // bs], pos % bs] = randn(rng, (c, Hkv, D), dt)
        cache[1][tabs[i][pos // bs], pos % bs] = randn(rng, (c, Hkv, D), dt)
    md = be.make_metadata(seq_lens=[c + n for c, n in zip(cl, ql)], context_lens=cl,
                          block_tables=tabs, block_size=bs)
    T = sum(ql)
    q, k, v = (randn(rng, (T, h * D), dt) for h in (H, Hkv, Hkv))
    out = impl.forward(q, k, v, cache, md)
    ref = _ref_decoder_step(q.reshape(T, H, D), cache, tabs, cl, ql, "auto", 1, 1, **rkw)
    O.assert_close(out.reshape(T, H, D), ref, dt)


@pytest.mark.parametrize("homo", ["per_head", "homo_head", "homo_head_group", "tp_rank1"])
def test_decoder_blocksparse(backend, rng, homo):
    """vLLM's block-sparse pattern (local + vertical stride), prefill and decode."""
    be = pa.get_attn_backend(backend)
    H, Hkv, D, bs, nb = 4, 2, 32, 16, 30
    dt = np.dtype(np.float32)
    sparse_bs, local, vert = 16, 2, 3
    params = dict(max_seqlen=512, num_heads=H, num_kv_heads=Hkv, block_size=sparse_bs,
                  local_blocks=local, vert_stride=vert, homo_head=homo == "homo_head",
                  homo_head_group=homo == "homo_head_group")
    if homo == "tp_rank1":  # rank 1 of 2: heads 4..7 of 8 globally
        params.update(tp_rank=1, tp_size=2, vert_stride=16)
        vert = 16
    impl = be.get_impl_cls()(H, D, D ** -0.5, Hkv, blocksparse_params=params)
    if homo == "tp_rank1":
        offs = O.blocksparse_offsets(2 * H, 2 * Hkv, vert)[H:]
    else:
        offs = O.blocksparse_offsets(H, Hkv, vert, homo_head=homo == "homo_head",
                                     homo_head_group=homo == "homo_head_group")
    cache = _kv_cache(be, nb, bs, Hkv, D, dt)
    cl, ql = [0, 100], [120, 1]
    tabs = tables(rng, [c + n for c, n in zip(cl, ql)], bs, nb)
    pos = np.arange(100)
    cache[0][tabs[1][pos // bs], pos % bs] = randn(rng, (100, Hkv, D), dt)
    cache[1][tabs[1][pos // bs], pos % bs] = randn(rng, (100, Hkv, D), dt)
    md = be.make_metadata(seq_lens=[120, 101], query_lens=ql, block_tables=tabs, block_size=bs)
    T = sum(ql)
    q, k, v = (randn(rng, (T, h * D), dt) for h in (H, Hkv, Hkv))
    out = impl.forward(q, k, v, cache, md)
    ref = _ref_decoder_step(q.reshape(T, H, D), cache, tabs, cl, ql, "auto", 1, 1,
                            scale=D ** -0.5, blocksparse=(sparse_bs, local, vert, offs))
    O.assert_close(out.reshape(T, H, D), ref, dt)


def test_encoder_only(backend, rng):
    """BERT-style bidirectional attention over the step's own tokens (no cache)."""
    be = pa.get_attn_backend(backend)
    H, D = 4, 32
    impl = be.get_impl_cls()(H, D, D ** -0.5, attn_type="encoder_only")
    lens = [9, 1, 14]
    md = be.make_metadata(seq_lens=lens, block_size=16)
    T = sum(lens)
    q, k, v = (randn(rng, (T, H * D), np.float32) for _ in range(3))
    out = impl.forward(q, k, v, None, md)
    s = 0
    for n in lens:
        ro, _ = O.attention(q[s:s + n].reshape(n, H, D), k[s:s + n].reshape(n, H, D),
                            v[s:s + n].reshape(n, H, D), np.arange(n), scale=D ** -0.5,
                            causal=False)
        O.assert_close(out[s:s + n].reshape(n, H, D), ro, np.float32)
        s += n


def test_encoder_decoder_model_flow(backend, rng):
    """An encoder-decoder model: encoder self-attention over encoder tokens; decoder
    self-attention; cross-attention writing the encoder K/V at prefill and reading them (key =
    value = None) at decode."""
    be = pa.get_attn_backend(backend)
    H, Hkv, D, bs, nb = 4, 2, 32, 8, 16
    dt = np.dtype(np.float16)
    Impl = be.get_impl_cls()
    enc = Impl(H, D, D ** -0.5, Hkv, attn_type="encoder")
    dec = Impl(H, D, D ** -0.5, Hkv, attn_type="decoder")
    cross = Impl(H, D, D ** -0.5, Hkv, attn_type="encoder_decoder")
    enc_lens = [11, 5]
    dec_lens = [1, 1]  # decoder starts with one token
    self_tabs = tables(rng, [4, 4], bs, nb)
    cross_tabs = [t + 0 for t in tables(rng, enc_lens, bs, nb)]
    self_cache = _kv_cache(be, nb, bs, Hkv, D, dt)
    cross_cache = _kv_cache(be, nb, bs, Hkv, D, dt)
    md = be.make_metadata(seq_lens=dec_lens, query_lens=dec_lens, block_tables=self_tabs,
                          encoder_seq_lens=enc_lens, cross_block_tables=cross_tabs,
                          block_size=bs, num_prefills=2)
    # encoder self-attention over the encoder tokens
    Te = sum(enc_lens)
    qe, ke, ve = (randn(rng, (Te, h * D), dt) for h in (H, Hkv, Hkv))
    oe = enc.forward(qe, ke, ve, None, md)
    s = 0
    for n in enc_lens:
        ro, _ = O.attention(qe[s:s + n].reshape(n, H, D), ke[s:s + n].reshape(n, Hkv, D),
                            ve[s:s + n].reshape(n, Hkv, D), np.arange(n), scale=D ** -0.5,
                            causal=False)
        O.assert_close(oe[s:s + n].reshape(n, H, D), ro, dt)
        s += n
    # decoder self-attention (prefill of one token each)
    Td = sum(dec_lens)
    qd, kd, vd = (randn(rng, (Td, h * D), dt) for h in (H, Hkv, Hkv))
    od = dec.forward(qd, kd, vd, self_cache, md)
    O.assert_close(od.reshape(Td, H, D), vd.reshape(Td, Hkv, D).repeat(H // Hkv, axis=1), dt)
    # cross-attention, prefill: encoder K/V written into the cross cache
    kx, vx = randn(rng, (Te, Hkv * D), dt), randn(rng, (Te, Hkv * D), dt)
    oc = cross.forward(qd, kx, vx, cross_cache, md)

    def ref_cross(q):
        outs, s = [], 0
        for i, n in enumerate(enc_lens):
            K = O.gather(cross_cache[0], cross_tabs[i], n)
            V = O.gather(cross_cache[1], cross_tabs[i], n)
            ro, _ = O.attention(q[i:i + 1].reshape(1, H, D), K, V, [0], scale=D ** -0.5,
                                causal=False)
            outs.append(ro)
            s += n
        return np.concatenate(outs)

    s = 0
    for i, n in enumerate(enc_lens):
        K = O.gather(cross_cache[0], cross_tabs[i], n)
        np.testing.assert_array_equal(np.asarray(K, np.float32),
                                      kx[s:s + n].reshape(n, Hkv, D).astype(np.float32))
        s += n
    O.assert_close(oc.reshape(Td, H, D), ref_cross(qd), dt)
    # decode step: one more decoder token, cross K/V read from the cache (key = value = None)
    md2 = be.make_metadata(seq_lens=[2, 2], query_lens=[1, 1], block_tables=self_tabs,
                           encoder_seq_lens=enc_lens, cross_block_tables=cross_tabs,
                           block_size=bs)
    assert md2.num_prefills == 0
    q2 = randn(rng, (2, H * D), dt)
    snapshot = cross_cache.copy()
    oc2 = cross.forward(q2, None, None, cross_cache, md2)
    np.testing.assert_array_equal(cross_cache.view(np.uint16), snapshot.view(np.uint16))
    O.assert_close(oc2.reshape(2, H, D), ref_cross(q2), dt)


def test_metadata_fields():
    be = pa.get_attn_backend("reference")
    md = be.make_metadata(seq_lens=[5, 9, 4], query_lens=[5, 1, 1],
                          block_tables=[[3, 2], [0, 1, 5], [7]], block_size=4)
    assert md.num_prefills == 1
    assert md.num_prefill_tokens == 5 and md.num_decode_tokens == 2
    assert md.query_start_loc.tolist() == [0, 5, 6, 7]
    assert md.seq_start_loc.tolist() == [0, 5, 14, 18]
    assert md.context_lens_tensor.tolist() == [0, 8, 3]
    assert md.block_tables.tolist() == [[3, 2, 0], [0, 1, 5], [7, 0, 0]]
    assert md.slot_mapping.tolist() == [12, 13, 14, 15, 8, 20, 31]
    assert md.max_decode_seq_len == 9 and md.max_prefill_seq_len == 5
    assert md.decode_metadata.num_seqs == 2 and md.prefill_metadata.num_seqs == 1


def test_threads_and_backends():
    names = pa.available_backends()
    assert "reference" in names
    n0 = pa.get_num_threads()
    assert n0 >= 1
    pa.set_num_threads(1)
    assert pa.get_num_threads() == 1 or "cpu" not in names
    pa.set_num_threads(n0)
    assert pa.get_num_threads() == n0
    for bad in (-1, 1025, 2**32 + 1):  # 2**32 + 1 would reach C as 1 if it were not checked
        with pytest.raises(ValueError):
            pa.set_num_threads(bad)
    assert pa.get_num_threads() == n0
    b = pa.get_attn_backend()
    assert b.get_name() in names


def test_decoder_without_cache_is_causal_over_own_tokens(backend, rng):
    """vLLM's profiling run: an empty kv_cache means attention over the step's own tokens."""
    be = pa.get_attn_backend(backend)
    H, D = 2, 16
    impl = be.get_impl_cls()(H, D, 0.3, sliding_window=4)
    md = be.make_metadata(seq_lens=[7, 3], block_tables=[[0], [1]], block_size=8)
    q, k, v = (randn(rng, (10, H * D), np.float32) for _ in range(3))
    out = impl.forward(q, k, v, np.zeros((0,), np.float32), md)
    s = 0
    for n in (7, 3):
        ro, _ = O.attention(q[s:s + n].reshape(n, H, D), k[s:s + n].reshape(n, H, D),
                            v[s:s + n].reshape(n, H, D), np.arange(n), scale=0.3, window=(3, 0))
        O.assert_close(out[s:s + n].reshape(n, H, D), ro, np.float32)
        s += n


def test_encoder_only_with_block_tables_in_metadata(backend, rng):
    be = pa.get_attn_backend(backend)
    H, D = 2, 8
    impl = be.get_impl_cls()(H, D, 0.5, attn_type="encoder_only", alibi_slopes=[0.1, 0.3])
    md = be.make_metadata(seq_lens=[4, 5], block_tables=[[7], [9, 3]], block_size=4)
    q, k, v = (randn(rng, (9, H * D), np.float32) for _ in range(3))
    out = impl.forward(q, k, v, None, md)
    s = 0
    for n in (4, 5):
        ro, _ = O.attention(q[s:s + n].reshape(n, H, D), k[s:s + n].reshape(n, H, D),
                            v[s:s + n].reshape(n, H, D), np.arange(n), scale=0.5, causal=False,
                            alibi=np.array([0.1, 0.3], np.float32))
        O.assert_close(out[s:s + n].reshape(n, H, D), ro, np.float32)
        s += n


def test_cpu_thread_count_does_not_change_results(rng):
    if "cpu" not in pa.available_backends():
        pytest.skip("no cpu backend here")
    H, Hkv, D, bs = 8, 2, 64, 16
    klens = [700, 33, 9]
    nb = sum(-(-k // bs) for k in klens)
    kc = randn(rng, (nb, bs, Hkv, D), np.float16)
    vc = randn(rng, (nb, bs, Hkv, D), np.float16)
    tabs = tables(rng, klens, bs, nb)
    bt = np.zeros((3, max(len(t) for t in tabs)), np.int32)
    for i, t in enumerate(tabs):
        bt[i, :len(t)] = t
    q = randn(rng, (3, 4, H, D), np.float16)
    n0 = pa.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            pa.set_num_threads(n)
            outs.append(pa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array(klens) - 4,
                                                   block_table=bt, causal=True, backend="cpu"))
    finally:
        pa.set_num_threads(n0)
    for o in outs[1:]:
        np.testing.assert_array_equal(o.view(np.uint16), outs[0].view(np.uint16))


def test_vllm_field_style_metadata_enc_dec(backend, rng):
    """Metadata from vLLM's field names (as vLLM's test_encoder_decoder_attn builds it): padded
    2-D block tables, explicit slot mappings, a plain prefill whose table comes from its slots."""
    be = pa.get_attn_backend(backend)
    H, D, bs, nb = 2, 16, 4, 12
    dt = np.dtype(np.float32)
    Impl = be.get_impl_cls()
    dec = Impl(H, D, 0.25)
    cross = Impl(H, D, 0.25, attn_type="encoder_decoder")
    seq_lens, enc_lens = [6, 3], [5, 7]
    self_tabs = [[3, 7], [5]]
    cross_tabs = [[0, 9], [2, 10]]
    slots = [3 * 4 + i for i in range(4)] + [7 * 4, 7 * 4 + 1] + [5 * 4 + i for i in range(3)]
    cslots = [0, 1, 2, 3, 36] + [8, 9, 10, 11, 40, 41, 42]
    md = be.make_metadata(num_prefills=2, num_prefill_tokens=9, num_decode_tokens=0,
                          slot_mapping=np.array(slots), seq_lens=seq_lens,
                          seq_lens_tensor=np.array(seq_lens), max_prefill_seq_len=6,
                          max_decode_seq_len=0, context_lens_tensor=np.zeros(2, np.int32),
                          block_tables=np.zeros((2, 0), np.int32),  # plain prefill: no table
                          encoder_seq_lens=enc_lens, num_encoder_tokens=12,
                          cross_slot_mapping=np.array(cslots),
                          cross_block_tables=np.array(cross_tabs), block_size=bs)
    self_cache = np.full(be.get_kv_cache_shape(nb, bs, H, D), np.nan, dt)
    cross_cache = np.full(be.get_kv_cache_shape(nb, bs, H, D), np.nan, dt)
    q, k, v = (randn(rng, (9, H * D), dt) for _ in range(3))
    out = dec.forward(q, k, v, self_cache, md)
    s = 0
    for i, n in enumerate(seq_lens):
        ro, _ = O.attention(q[s:s + n].reshape(n, H, D), k[s:s + n].reshape(n, H, D),
                            v[s:s + n].reshape(n, H, D), np.arange(n), scale=0.25)
        O.assert_close(out[s:s + n].reshape(n, H, D), ro, dt)
        got = O.gather(self_cache[0], self_tabs[i], n)
        np.testing.assert_array_equal(got, k[s:s + n].reshape(n, H, D))
        s += n
    kx, vx = randn(rng, (12, H * D), dt), randn(rng, (12, H * D), dt)
    oc = cross.forward(q, kx, vx, cross_cache, md)
    e = 0
    s = 0
    for i, n in enumerate(seq_lens):
        m = enc_lens[i]
        ro, _ = O.attention(q[s:s + n].reshape(n, H, D), kx[e:e + m].reshape(m, H, D),
                            vx[e:e + m].reshape(m, H, D), np.zeros(n, int), scale=0.25,
                            causal=False)
        O.assert_close(oc[s:s + n].reshape(n, H, D), ro, dt)
        s += n
        e += m
    # decode step, vLLM field style: num_prefills 0, one token each, cross K/V from the cache
    md2 = be.make_metadata(num_prefills=0, num_prefill_tokens=0, num_decode_tokens=2,
                           slot_mapping=np.array([7 * 4 + 2, 5 * 4 + 3]),
                           seq_lens_tensor=np.array([7, 4]), max_decode_seq_len=7,
                           context_lens_tensor=np.array([6, 3]),
                           block_tables=np.array(self_tabs[:1] + [[5, 0]]),
                           encoder_seq_lens=enc_lens, cross_slot_mapping=np.array(cslots),
                           cross_block_tables=np.array(cross_tabs), block_size=bs)
    assert md2.num_decode_tokens == 2 and md2.num_prefills == 0
    q2 = randn(rng, (2, H * D), dt)
    oc2 = cross.forward(q2, None, None, cross_cache, md2)
    e = 0
    for i in range(2):
        m = enc_lens[i]
        ro, _ = O.attention(q2[i:i + 1].reshape(1, H, D), kx[e:e + m].reshape(m, H, D),
                            vx[e:e + m].reshape(m, H, D), [0], scale=0.25, causal=False)
        O.assert_close(oc2[i:i + 1].reshape(1, H, D), ro, dt)
        e += m


def test_calls_from_several_threads(backend, rng):
    """One context per backend, used from many Python threads: results equal the serial ones."""
    import threading
    H, Hkv, D, bs = 4, 2, 32, 8
    kc = randn(rng, (20, bs, Hkv, D), np.float32)
    vc = randn(rng, (20, bs, Hkv, D), np.float32)
    bt = rng.permutation(20).astype(np.int32).reshape(4, 5)
    qs = [randn(rng, (4, 2, H, D), np.float32) for _ in range(8)]
    lens = np.array([40, 7, 22, 13], np.int32)
    serial = [pa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt,
                                         causal=True, backend=backend) for q in qs]
    results = [None] * len(qs)

    def work(i):
        for _ in range(3):
            results[i] = pa.flash_attn_with_kvcache(qs[i], kc, vc, cache_seqlens=lens,
                                                    block_table=bt, causal=True, backend=backend)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(qs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(results, serial):
        np.testing.assert_array_equal(a, b)


def test_attn_type_given_to_forward(backend, rng):
    """vLLM <= 0.6 passes attn_type to forward (an enum whose member names are the types)."""
    import enum

    class AttentionType(enum.Enum):
        DECODER = enum.auto()
        ENCODER_ONLY = enum.auto()

    be = pa.get_attn_backend(backend)
    H, D = 2, 8
    impl = be.get_impl_cls()(H, D, 0.5)
    md = be.make_metadata(seq_lens=[3, 4], block_size=4)
    q, k, v = (randn(rng, (7, H * D), np.float32) for _ in range(3))
    out = impl.forward(q, k, v, None, md, attn_type=AttentionType.ENCODER_ONLY)
    s = 0
    for n in (3, 4):
        ro, _ = O.attention(q[s:s + n].reshape(n, H, D), k[s:s + n].reshape(n, H, D),
                            v[s:s + n].reshape(n, H, D), np.arange(n), scale=0.5, causal=False)
        O.assert_close(out[s:s + n].reshape(n, H, D), ro, np.float32)
        s += n


@pytest.mark.parametrize("dtype,kv_cache_dtype", [("bfloat16", "auto"), ("float32", "auto"),
                                                  ("float16", "fp8")])
@pytest.mark.parametrize("layers", [False, True])
def test_kv_cache_stride_order(backend, rng, dtype, kv_cache_dtype, layers):
    """A cache laid out in get_kv_cache_stride_order's order (alone, or one layer of a
    [num_layers, ...] allocation with the blocks outermost) gives the same bits as the contiguous
    FlashAttention layout: outputs of prefill and decode steps, the K/V written, and
    flash_attn_with_kvcache over its halves."""
    be = pa.get_attn_backend(backend)
    dt = DTYPES[dtype]
    fp8 = kv_cache_dtype != "auto"
    H, Hkv, D, bs, nb = 8, 2, 64, 16, 20
    shape = be.get_kv_cache_shape(nb, bs, Hkv, D)
    order = be.get_kv_cache_stride_order(include_num_layers_dimension=layers)
    assert sorted(order) == list(range(len(shape) + layers))
    fill = (lambda s: np.full(s, 0x7F, np.uint8)) if fp8 else \
        (lambda s: np.full(s, np.nan, np.float32).astype(dt))
    flat = fill(shape)
    if layers:
        full = (3,) + shape
        all_layers = fill([full[i] for i in order]).transpose(np.argsort(order))
        # blocks outermost: one block of every layer, K and V, is one contiguous run
        assert all_layers.strides[2] == max(all_layers.strides)
        strided = all_layers[1]
        assert strided.shape == shape
    else:
        strided = be.new_kv_cache(nb, bs, Hkv, D, np.uint8 if fp8 else dt)
        assert strided.shape == shape
        strided[...] = flat
    if backend == "cpu":  # HND: a block's tokens of one KV head are adjacent
        assert strided.strides[2] == D * strided.itemsize
    impl = be.get_impl_cls()(H, D, 1 / math.sqrt(D), num_kv_heads=Hkv,
                             kv_cache_dtype=kv_cache_dtype)
    final = [40, 21, 3]
    tabs = tables(rng, final, bs, nb)
    builder = be.make_metadata_builder(bs)
    for ctx_lens, q_lens in (([0, 0, 0], [37, 20, 3]), ([37, 20, 3], [3, 1, 0])):
        live = [i for i in range(3) if q_lens[i] > 0]
        ql = [q_lens[i] for i in live]
        md = builder.build(seq_lens=[ctx_lens[i] + q_lens[i] for i in live], query_lens=ql,
                           block_tables=[tabs[i] for i in live])
        T = sum(ql)
        q, k, v = (randn(rng, (T, n * D), dt) for n in (H, Hkv, Hkv))
        want = impl.forward(q, k, v, flat, md, k_scale=0.5, v_scale=0.25)
        got = impl.forward(q, k, v, strided, md, k_scale=0.5, v_scale=0.25)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(np.ascontiguousarray(strided).view(np.uint8),
                                  flat.view(np.uint8))
    if not fp8:  # the flash call over the caches' halves (a decode of every sequence)
        q1 = randn(rng, (3, 1, H, D), dt)
        sl = np.array(final, np.int32)
        bt = np.array([list(t) + [0] * (3 - len(t)) for t in tabs], np.int32)
        want = pa.flash_attn_with_kvcache(q1, flat[0], flat[1], cache_seqlens=sl, block_table=bt,
                                          causal=True, backend=backend)
        got = pa.flash_attn_with_kvcache(q1, strided[0], strided[1], cache_seqlens=sl,
                                         block_table=bt, causal=True, backend=backend)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        assert not np.isnan(np.asarray(got, np.float32)).any()


def test_head_sizes_and_cache_dtype_str(backend, rng):
    """supports_head_size / get_supported_head_sizes agree with what forward accepts, and
    get_kv_cache_shape takes vLLM's cache_dtype_str."""
    be = pa.get_attn_backend(backend)
    sizes = be.get_supported_head_sizes()
    assert sizes == sorted(sizes) and sizes[0] >= 1 and sizes[-1] <= 512
    for bad in (0, -1, 513, 64.5, "64", None):
        assert not be.supports_head_size(bad)
    with pytest.raises(ValueError):
        pa.get_attn_backend(backend).get_impl_cls()(2, 513, 1.0, 1).forward(
            np.zeros((1, 2 * 513), np.float32), np.zeros((1, 513), np.float32),
            np.zeros((1, 513), np.float32), np.zeros((2, 1, 16, 1, 513), np.float32),
            be.make_metadata_builder(16).build(seq_lens=[1], query_lens=[1], block_tables=[[0]]))
    for D in (1, 3, 80, 512):
        assert be.supports_head_size(D) == (D in sizes)
        if D not in sizes:
            continue
        cache = np.full(be.get_kv_cache_shape(2, 16, 1, D, cache_dtype_str="auto"), np.nan,
                        np.float32)
        md = be.make_metadata_builder(16).build(seq_lens=[5], query_lens=[5],
                                                block_tables=[[1]])
        q, k, v = (randn(rng, (5, n * D), np.float32) for n in (2, 1, 1))
        out = be.get_impl_cls()(2, D, D ** -0.5, 1).forward(q, k, v, cache, md)
        ref, _ = O.attention(q.reshape(5, 2, D), k.reshape(5, 1, D), v.reshape(5, 1, D),
                             np.arange(5), scale=D ** -0.5)
        O.assert_close(out.reshape(5, 2, D), ref, np.dtype(np.float32))
    assert be.get_kv_cache_shape(3, 16, 2, 64, "fp8") == be.get_kv_cache_shape(3, 16, 2, 64)
    with pytest.raises(ValueError):
        be.get_kv_cache_shape(3, 16, 2, 64, cache_dtype_str=8)


def test_impl_forward_strided_inputs(backend, rng):
    """Query/key/value rows that are broadcast, reversed, every other row of a wider array or a
    split of a fused QKV projection give the same bits as contiguous copies (the short path
    for ordinary rows must hand every other layout to the general one)."""
    be = pa.get_attn_backend(backend)
    H, Hkv, D, bs, nb = 4, 2, 16, 8, 8
    dt = np.dtype(np.float32)
    impl = be.get_impl_cls()(H, D, 0.25, Hkv)
    md = be.make_metadata_builder(bs).build(seq_lens=[5, 6], query_lens=[5, 1],
                                            block_tables=[[2], [6]])
    T = 6
    qkv = randn(rng, (T, (H + 2 * Hkv) * D), dt)
    wide = randn(rng, (2 * T, H, D), dt)
    cases = {"fused qkv split": (qkv[:, :H * D], qkv[:, H * D:(H + Hkv) * D],
                                 qkv[:, (H + Hkv) * D:]),
             "q reversed": (randn(rng, (T, H * D), dt)[::-1], qkv[:, H * D:(H + Hkv) * D],
                            qkv[:, (H + Hkv) * D:]),
             "q broadcast, 3-D": (np.broadcast_to(wide[:1], (T, H, D)),
                                  randn(rng, (T, Hkv, D), dt), randn(rng, (T, Hkv, D), dt)),
             "every other row, 3-D": (wide[::2], randn(rng, (2 * T, Hkv, D), dt)[::2],
                                      randn(rng, (T, Hkv, D), dt)[::-1])}
    for name, (q, k, v) in cases.items():
        res = []
        for qq, kk, vv in ((q, k, v), tuple(np.ascontiguousarray(x) for x in (q, k, v))):
            cache = np.full(be.get_kv_cache_shape(nb, bs, Hkv, D), np.nan, dt)
            res.append((impl.forward(qq, kk, vv, cache, md), cache))
        np.testing.assert_array_equal(res[0][0].reshape(T, -1), res[1][0].reshape(T, -1),
                                      err_msg=name)
        np.testing.assert_array_equal(res[0][1], res[1][1], err_msg=name)
    out = np.empty((T, H * D), dt)[::-1]  # an output with reversed rows: refused, not written
    with pytest.raises(ValueError):
        impl.forward(*cases["fused qkv split"], np.zeros(be.get_kv_cache_shape(nb, bs, Hkv, D),
                                                          dt), md, output=out)


def test_metadata_keeps_the_slots_it_was_built_with(backend):
    """The library batches of one metadata are made later, one per pool size; all of them write
    K/V where the metadata said at build time, even if the caller's slot buffer is rewritten
    afterwards (the block tables are copied alike)."""
    be = pa.get_attn_backend(backend)
    H, Hkv, D, bs = 2, 1, 16, 4
    impl = be.get_impl_cls()(H, D, D ** -0.5, Hkv)
    slots = np.array([8, 9], np.int64)
    md = be.make_metadata_builder(bs).build(seq_lens=[2], query_lens=[2], block_tables=[[2]],
                                            slot_mapping=slots)
    q = np.ones((2, H * D), np.float32)
    kv = np.ones((2, Hkv * D), np.float32)
    written = []
    for i, nb in enumerate((8, 8, 16)):
        cache = be.new_kv_cache(nb, bs, Hkv, D, np.float32)
        impl.forward(q, kv, kv, cache, md)
        written.append(np.flatnonzero(cache[0].reshape(-1, Hkv * D).any(axis=1)).tolist())
        if i == 0:
            slots[:] = [12, 13]  # the caller reuses its buffer after the first layer
    assert md.slot_mapping.tolist() == [8, 9]
    assert written == [[8, 9]] * 3


def test_window_and_full_layers_share_metadata(backend, rng):
    """Gemma-2 and Mistral interleave sliding-window and full-attention layers of one geometry,
    all over one metadata object per step: each layer attends with its own window whichever layer
    came first (an audit found a full layer that followed a window layer dropping the keys that
    layer's window hid: the cpu backend's plan had followed the window it was made for)."""
    be = pa.get_attn_backend(backend)
    H, Hkv, D, bs, W = 4, 2, 64, 16, 13
    dt = np.dtype(np.float32)
    cl, ql = [300, 280, 2000], [1, 7, 1]
    tabs = tables(rng, [c + n for c, n in zip(cl, ql)], bs, 200)
    Impl = be.get_impl_cls()
    layers = [Impl(H, D, 0.125, Hkv, sliding_window=W), Impl(H, D, 0.125, Hkv),
              Impl(H, D, 0.125, Hkv, sliding_window=W)]
    windows = [(W - 1, 0), (-1, -1), (W - 1, 0)]
    caches = []
    for _ in layers:
        cache = _kv_cache(be, 200, bs, Hkv, D, dt)
        for i, c in enumerate(cl):
            pos = np.arange(c)
            cache[0][tabs[i][pos // bs], pos % bs] = randn(rng, (c, Hkv, D), dt)
            cache[1][tabs[i][pos // bs], pos % bs] = randn(rng, (c, Hkv, D), dt)
        caches.append(cache)
    T = sum(ql)
    q, k, v = (randn(rng, (T, h * D), dt) for h in (H, Hkv, Hkv))
    q *= 3  # sharp rows: a dropped key shows

    def metadata():
        return be.make_metadata_builder(bs).build(seq_lens=[c + n for c, n in zip(cl, ql)],
                                                  query_lens=ql, block_tables=tabs)

    md = metadata()
    outs = [impl.forward(q, k, v, cache, md) for impl, cache in zip(layers, caches)]
    for impl, cache, out, win in zip(layers, caches, outs, windows):
        ref = _ref_decoder_step(q.reshape(T, H, D), cache, tabs, cl, ql, "auto", 1, 1,
                                scale=0.125, window=win)
        O.assert_close(out.reshape(T, H, D), ref, dt)
        # and the same bits as with metadata of its own (the K/V rows are written already)
        np.testing.assert_array_equal(impl.forward(q, k, v, cache, metadata()), out)
