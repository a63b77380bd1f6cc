"""flash_attn_varlen_func and flash_attn_with_kvcache against the numpy oracle."""

import math

import numpy as np
import pytest

import oracle as O
import pagedattn as pa
from util import DTYPES, fill_cache, nan_cache, pad_tables, randn, ref_paged, tables


def _case(rng, qlens, klens, H, Hkv, D, bs, dtype, kv_cache_dtype="auto", k_scale=1.0,
          v_scale=1.0, distinct=True, extra_blocks=3):
    need = sum(-(-k // bs) for k in klens)
    nb = need + extra_blocks
    fp8 = kv_cache_dtype != "auto"
    kc = nan_cache(nb, bs, Hkv, D, dtype, fp8)
    vc = nan_cache(nb, bs, Hkv, D, dtype, fp8)
    tabs = tables(rng, klens, bs, nb, distinct=distinct)
    fill_cache(rng, kc, vc, tabs, klens, dtype, kv_cache_dtype, k_scale, v_scale)
    cu_q = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    q = randn(rng, (int(cu_q[-1]), H, D), dtype)
    return q, kc, vc, tabs, cu_q


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("geom", [(4, 4, 64, 16), (8, 2, 80, 8), (6, 1, 32, 5), (32, 1, 64, 16), (71, 1, 128, 16),
                                  (8, 4, 128, 16), (14, 2, 128, 16), (32, 2, 128, 16)])
def test_varlen_paged_prefill_chunked_decode(backend, rng, dtype, geom):
    """Mixed batch: full prefill, chunked/prefix prefill, decodes (vLLM test_varlen_with_paged_kv).
    Groups of 1, 2, 4, 7, 8, 16 and more query heads per KV head (the cpu decode kernels take 1-3
    rows, groups of 4 and up to 16 rows in different paths)."""
    H, Hkv, D, bs = geom
    dt = DTYPES[dtype]
    qlens = [13, 7, 1, 1, 5]
    klens = [13, 40, 33, 1, 5 + 2 * bs]
    q, kc, vc, tabs, cu_q = _case(rng, qlens, klens, H, Hkv, D, bs, dt)
    scale = 1.0 / math.sqrt(D)
    out, lse = pa.flash_attn_varlen_func(
        q, kc, vc, max(qlens), cu_q, max(klens), seqused_k=np.array(klens, np.int32),
        causal=True, block_table=pad_tables(tabs), return_softmax_lse=True, backend=backend)
    ro, rl = ref_paged(q, kc, vc, cu_q, klens, tabs, scale=scale)
    assert out.dtype == dt and out.shape == q.shape
    O.assert_close(out, ro, dt)
    O.lse_close(lse, rl)


@pytest.mark.parametrize("feature", ["window", "softcap", "alibi", "sinks", "all"])
def test_varlen_paged_features(backend, rng, feature):
    H, Hkv, D, bs = 4, 2, 64, 16
    dt = np.dtype(np.float16)
    qlens = [20, 1, 9]
    klens = [20, 70, 50]
    q, kc, vc, tabs, cu_q = _case(rng, qlens, klens, H, Hkv, D, bs, dt, distinct=False)
    kw = {}
    ref_kw = {}
    if feature in ("window", "all"):
        kw["window_size"] = (10, 0)
        ref_kw["window"] = (10, 0)
    if feature in ("softcap", "all"):
        kw["softcap"] = 5.0
        ref_kw["softcap"] = 5.0
    if feature in ("alibi", "all"):
        kw["alibi_slopes"] = ref_kw["alibi"] = O.alibi_slopes(H)
    if feature in ("sinks", "all"):
        kw["s_aux"] = ref_kw["sinks"] = rng.standard_normal(H).astype(np.float32)
    scale = 0.11
    out, lse = pa.flash_attn_varlen_func(
        q, kc, vc, max(qlens), cu_q, max(klens), seqused_k=np.array(klens, np.int32),
        softmax_scale=scale, causal=True, block_table=pad_tables(tabs), return_softmax_lse=True,
        backend=backend, **kw)
    ro, rl = ref_paged(q, kc, vc, cu_q, klens, tabs, scale=scale, **ref_kw)
    O.assert_close(out, ro, dt)
    O.lse_close(lse, rl, atol=2e-3)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [True, False])
def test_varlen_paged_fp8_scales(backend, rng, kv_cache_dtype, dtype, causal):
    H, Hkv, D, bs = 4, 4, 64, 16
    dt = DTYPES[dtype]
    k_scale, v_scale = 0.05, 0.2
    qlens = [9, 1, 1]
    klens = [9, 37, 16]
    window = (-1, -1) if causal else (6, 3)  # non-causal local: gathers and dequantizes
    q, kc, vc, tabs, cu_q = _case(rng, qlens, klens, H, Hkv, D, bs, dt, kv_cache_dtype,
                                  k_scale, v_scale)
    out = pa.flash_attn_varlen_func(
        q, kc, vc, max(qlens), cu_q, max(klens), seqused_k=np.array(klens, np.int32),
        causal=causal, window_size=window, block_table=pad_tables(tabs),
        kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale, backend=backend)
    ro, _ = ref_paged(q, kc, vc, cu_q, klens, tabs, scale=D ** -0.5, causal=causal,
                      window=window, kv_cache_dtype=kv_cache_dtype, k_scale=k_scale,
                      v_scale=v_scale)
    O.assert_close(out, ro, dt)


def test_varlen_fa3_descales_per_seq_and_head(backend, rng):
    """vLLM's FlashAttention backend passes its per-tensor scales expanded to FlashAttention 3's
    descale shape [batch, num_kv_heads] (stride-0 views): they act as k_scale / v_scale. A q_descale
    of ones is accepted; scales that differ between sequences or heads are refused."""
    H, Hkv, D, bs = 4, 2, 64, 16
    dt = np.dtype(np.float16)
    k_scale, v_scale = 0.05, 0.2
    qlens = [5, 1, 1]
    klens = [21, 37, 16]
    q, kc, vc, tabs, cu_q = _case(rng, qlens, klens, H, Hkv, D, bs, dt, "fp8", k_scale, v_scale)
    shape = (len(qlens), Hkv)
    one = np.float32

    def run(qd, kd, vd):
        return pa.flash_attn_varlen_func(
            q, kc, vc, max(qlens), cu_q, max(klens), seqused_k=np.array(klens, np.int32),
            causal=True, block_table=pad_tables(tabs), kv_cache_dtype="fp8", backend=backend,
            q_descale=qd, k_descale=kd, v_descale=vd)

    out = run(np.broadcast_to(one(1.0), shape), np.broadcast_to(one(k_scale), shape),
              np.broadcast_to(one(v_scale), shape))
    ro, _ = ref_paged(q, kc, vc, cu_q, klens, tabs, scale=D ** -0.5, kv_cache_dtype="fp8",
                      k_scale=k_scale, v_scale=v_scale)
    O.assert_close(out, ro, dt)
    differ = np.full(shape, k_scale, np.float32)
    differ[1, 1] = 2 * k_scale
    with pytest.raises(NotImplementedError, match="k_descale holds different values"):
        run(None, differ, np.full(shape, v_scale, np.float32))
    with pytest.raises(NotImplementedError, match="q_descale"):
        run(np.full(shape, 2.0, np.float32), None, None)
    with pytest.raises(ValueError):
        run(None, np.full(shape, np.nan, np.float32), None)
    kout = pa.flash_attn_with_kvcache(
        q[cu_q[1]:cu_q[2]].reshape(1, 1, H, D), kc, vc,
        cache_seqlens=np.array(klens[1:2], np.int32), block_table=pad_tables(tabs[1:2]),
        causal=True, kv_cache_dtype="fp8", k_descale=np.broadcast_to(one(k_scale), (1, Hkv)),
        v_descale=np.broadcast_to(one(v_scale), (1, Hkv)), backend=backend)
    O.assert_close(kout.reshape(1, H, D), ro[cu_q[1]:cu_q[2]], dt)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("feature", ["plain", "window", "alibi", "softcap"])
def test_varlen_packed(backend, rng, causal, feature):
    """No block table: packed k/v indexed by cu_seqlens_k (FlashAttention's varlen test)."""
    H, Hkv, D = 4, 2, 32
    dt = np.dtype(np.float32)
    qlens = [7, 12, 3, 1]
    klens = [7, 20, 3, 9]
    cu_q = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(klens)]).astype(np.int32)
    q = randn(rng, (cu_q[-1], H, D), dt)
    k = randn(rng, (cu_k[-1], Hkv, D), dt)
    v = randn(rng, (cu_k[-1], Hkv, D), dt)
    kw, rkw = {}, {}
    if feature == "window":
        kw["window_size"] = rkw["window"] = (4, 2)
    if feature == "alibi":
        slopes = (rng.random((len(qlens), H)) * 0.3).astype(np.float32)  # per-batch slopes
        kw["alibi_slopes"] = slopes
    if feature == "softcap":
        kw["softcap"] = rkw["softcap"] = 3.0
    out, lse = pa.flash_attn_varlen_func(q, k, v, max(qlens), cu_q, max(klens), cu_k,
                                         causal=causal, return_softmax_lse=True,
                                         backend=backend, **kw)
    for i in range(len(qlens)):
        a, b = cu_q[i], cu_q[i + 1]
        ka, kb = cu_k[i], cu_k[i + 1]
        pos = klens[i] - qlens[i] + np.arange(qlens[i])
        if feature == "alibi":
            rkw["alibi"] = slopes[i]
        ro, rl = O.attention(q[a:b], k[ka:kb], v[ka:kb], pos, scale=D ** -0.5, causal=causal,
                             **rkw)
        O.assert_close(out[a:b], ro, dt, "seq %d" % i)
        O.lse_close(lse[:, a:b], rl.T)


def test_varlen_packed_self_attention_noncausal_window_alibi(backend, rng):
    """cu_seqlens_q == cu_seqlens_k: bidirectional window + symmetric ALiBi (encoder style)."""
    H, D = 4, 16
    lens = [5, 11, 1]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q = randn(rng, (cu[-1], H, D), np.float32)
    k = randn(rng, (cu[-1], H, D), np.float32)
    v = randn(rng, (cu[-1], H, D), np.float32)
    sl = O.alibi_slopes(H)
    out = pa.flash_attn_varlen_func(q, k, v, 11, cu, 11, cu, causal=False, window_size=(3, 2),
                                    alibi_slopes=sl, backend=backend)
    for i in range(len(lens)):
        a, b = cu[i], cu[i + 1]
        ro, _ = O.attention(q[a:b], k[a:b], v[a:b], np.arange(lens[i]), scale=D ** -0.5,
                            causal=False, window=(3, 2), alibi=sl)
        O.assert_close(out[a:b], ro, np.float32)


def test_varlen_causal_more_queries_than_keys(backend, rng):
    """Bottom-right causal with seqlen_q > seqlen_k: the first rows see nothing (0, lse -inf)."""
    H, D = 2, 16
    qlens, klens = [6, 3], [4, 3]
    cu_q = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(klens)]).astype(np.int32)
    q = randn(rng, (cu_q[-1], H, D), np.float32)
    k = randn(rng, (cu_k[-1], H, D), np.float32)
    v = randn(rng, (cu_k[-1], H, D), np.float32)
    out, lse = pa.flash_attn_varlen_func(q, k, v, 6, cu_q, 4, cu_k, causal=True,
                                         return_softmax_lse=True, backend=backend)
    assert (out[:2] == 0).all() and np.isneginf(lse[:, :2]).all()
    for i in range(2):
        a, b = cu_q[i], cu_q[i + 1]
        ro, rl = O.attention(q[a:b], k[cu_k[i]:cu_k[i + 1]], v[cu_k[i]:cu_k[i + 1]],
                             klens[i] - qlens[i] + np.arange(qlens[i]), scale=D ** -0.5)
        O.assert_close(out[a:b], ro, np.float32)
        O.lse_close(lse[:, a:b], rl.T)


@pytest.mark.parametrize("paged", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_with_kvcache_decode(backend, rng, paged, dtype):
    """vLLM test_flash_attn_with_paged_kv: one query per sequence over a paged cache."""
    H, Hkv, D, bs = 8, 2, 128, 16
    dt = DTYPES[dtype]
    klens = [1, 17, 64, 100]
    B = len(klens)
    if paged:
        nb = sum(-(-k // bs) for k in klens) + 2
        kc = nan_cache(nb, bs, Hkv, D, dt)
        vc = nan_cache(nb, bs, Hkv, D, dt)
        tabs = tables(rng, klens, bs, nb)
        bt = pad_tables(tabs)
    else:
        cap = 128
        kc = nan_cache(B, cap, Hkv, D, dt)
        vc = nan_cache(B, cap, Hkv, D, dt)
        tabs = [np.array([b], np.int32) for b in range(B)]
        bt = None
    fill_cache(rng, kc, vc, tabs, klens, dt)
    q = randn(rng, (B, 1, H, D), dt)
    out, lse = pa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array(klens, np.int32),
                                          block_table=bt, causal=True, softcap=0.0,
                                          return_softmax_lse=True, backend=backend)
    assert out.shape == q.shape and lse.shape == (B, H, 1)
    for b in range(B):
        K = O.gather(kc, tabs[b], klens[b])
        V = O.gather(vc, tabs[b], klens[b])
        ro, rl = O.attention(q[b], K, V, [klens[b] - 1], scale=D ** -0.5)
        O.assert_close(out[b], ro, dt)
        O.lse_close(lse[b], rl.T, atol=1e-3)


@pytest.mark.parametrize("causal", [True, False])
def test_with_kvcache_append(backend, rng, causal):
    """New k/v appended at cache_seqlens, then attended (speculative decode / chunk)."""
    H, Hkv, D, bs = 4, 2, 64, 8
    dt = np.dtype(np.float32)
    old = [5, 0, 19]
    snew = 3
    B = len(old)
    nb = 12
    kc = nan_cache(nb, bs, Hkv, D, dt)
    vc = nan_cache(nb, bs, Hkv, D, dt)
    tabs = tables(rng, [o + snew for o in old], bs, nb)
    fill_cache(rng, kc, vc, tabs, old, dt)
    bt = pad_tables(tabs)
    q = randn(rng, (B, snew, H, D), dt)
    kn = randn(rng, (B, snew, Hkv, D), dt)
    vn = randn(rng, (B, snew, Hkv, D), dt)
    out = pa.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=np.array(old, np.int32),
                                     block_table=bt, causal=causal, backend=backend)
    for b in range(B):
        n = old[b] + snew
        K = O.gather(kc, tabs[b], n)
        V = O.gather(vc, tabs[b], n)
        np.testing.assert_array_equal(K[old[b]:], kn[b])   # written exactly
        np.testing.assert_array_equal(V[old[b]:], vn[b])
        ro, _ = O.attention(q[b], K, V, n - snew + np.arange(snew), scale=D ** -0.5,
                            causal=causal)
        O.assert_close(out[b], ro, dt)


def test_with_kvcache_window_alibi_sinks_fp8(backend, rng):
    H, Hkv, D, bs = 4, 4, 32, 16
    dt = np.dtype(np.float16)
    klens = [40, 3]
    nb = 8
    kc = nan_cache(nb, bs, Hkv, D, dt, fp8=True)
    vc = nan_cache(nb, bs, Hkv, D, dt, fp8=True)
    tabs = tables(rng, klens, bs, nb)
    fill_cache(rng, kc, vc, tabs, klens, dt, "fp8_e4m3", 0.5, 0.25)
    q = randn(rng, (2, 1, H, D), dt)
    sl = O.alibi_slopes(H)
    sinks = rng.standard_normal(H).astype(np.float32)
    out = pa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array(klens, np.int32),
                                     block_table=pad_tables(tabs), causal=True,
                                     window_size=(7, 0), alibi_slopes=sl, s_aux=sinks,
                                     kv_cache_dtype="fp8_e4m3", k_scale=0.5, v_scale=0.25,
                                     backend=backend)
    for b in range(2):
        K = O.gather(kc, tabs[b], klens[b], "fp8_e4m3", 0.5)
        V = O.gather(vc, tabs[b], klens[b], "fp8_e4m3", 0.25)
        ro, _ = O.attention(q[b], K, V, [klens[b] - 1], scale=D ** -0.5, window=(7, 0),
                            alibi=sl, sinks=sinks)
        O.assert_close(out[b], ro, dt)


def test_out_argument_and_strided_q(backend, rng):
    """out= is written in place; q may be a strided view of a fused QKV buffer."""
    H, Hkv, D = 4, 2, 16
    T = 9
    qkv = randn(rng, (T, (H + 2 * Hkv) * D), np.float32)
    q = qkv[:, :H * D].reshape(T, H, D)
    k = qkv[:, H * D:(H + Hkv) * D].reshape(T, Hkv, D)
    v = qkv[:, (H + Hkv) * D:].reshape(T, Hkv, D)
    cu = np.array([0, 4, 9], np.int32)
    out = np.full((T, H, D), np.nan, np.float32)
    r = pa.flash_attn_varlen_func(q, k, v, 5, cu, 5, cu, causal=True, out=out, backend=backend)
    assert r is out
    for i in range(2):
        a, b = cu[i], cu[i + 1]
        ro, _ = O.attention(q[a:b], k[a:b], v[a:b], np.arange(b - a), scale=D ** -0.5)
        O.assert_close(out[a:b], ro, np.float32)


@pytest.mark.parametrize("seqlens", [(1, 47), (13, 23), (40, 17), (33, 33)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("alibi", [False, True])
def test_flash_attn_varlen_output_style(backend, rng, seqlens, causal, local, alibi):
    """FlashAttention's test_flash_attn_varlen_output, small: random padded lengths, MQA/GQA,
    random local windows, per-batch ALiBi slopes, soft-cap, LSE."""
    sq, sk = seqlens
    B, H = 3, 6
    Hkv = int(rng.choice([6, 2, 1]))
    D = int(rng.choice([32, 59, 64]))
    dt = np.dtype(np.float16)
    qlens = rng.integers(max(1, sq - 5), sq + 1, B)
    klens = rng.integers(max(1, sk - 5), sk + 1, B)
    cu_q = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(klens)]).astype(np.int32)
    q = randn(rng, (cu_q[-1], H, D), dt)
    k = randn(rng, (cu_k[-1], Hkv, D), dt)
    v = randn(rng, (cu_k[-1], Hkv, D), dt)
    window = tuple(int(x) for x in rng.integers(0, sk, 2)) if local else (-1, -1)
    slopes = (rng.random((B, H)) * 0.3).astype(np.float32) if alibi else None
    softcap = float(rng.choice([0.0, 50.0]))
    out, lse = pa.flash_attn_varlen_func(q, k, v, sq, cu_q, sk, cu_k, causal=causal,
                                         window_size=window, alibi_slopes=slopes,
                                         softcap=softcap, return_softmax_lse=True,
                                         backend=backend)
    for i in range(B):
        a, b = cu_q[i], cu_q[i + 1]
        ka, kb = cu_k[i], cu_k[i + 1]
        pos = klens[i] - qlens[i] + np.arange(qlens[i])
        ro, rl = O.attention(q[a:b], k[ka:kb], v[ka:kb], pos, scale=D ** -0.5, causal=causal,
                             window=window, alibi=None if slopes is None else slopes[i],
                             softcap=softcap)
        O.assert_close(out[a:b], ro, dt, "seq %d" % i)
        O.lse_close(lse[:, a:b], rl.T, atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (3, 2), (0, 5)])
def test_varlen_paged_more_queries_than_keys(backend, rng, causal, window):
    """seqlen_q > seqlen_k over a paged cache, ALiBi and sinks; bottom-right alignment."""
    H, Hkv, D, bs = 4, 2, 16, 4
    dt = np.dtype(np.float32)
    qlens, klens = [9, 2], [4, 6]
    q, kc, vc, tabs, cu_q = _case(rng, qlens, klens, H, Hkv, D, bs, dt)
    sl = O.alibi_slopes(H)
    for kw in (dict(alibi_slopes=sl), dict(s_aux=rng.standard_normal(H).astype(np.float32))):
        out, lse = pa.flash_attn_varlen_func(
            q, kc, vc, 9, cu_q, 6, seqused_k=np.array(klens, np.int32), causal=causal,
            window_size=window, block_table=pad_tables(tabs), return_softmax_lse=True,
            backend=backend, **kw)
        ro, rl = ref_paged(q, kc, vc, cu_q, klens, tabs, scale=D ** -0.5, causal=causal,
                           window=window, alibi=kw.get("alibi_slopes"), sinks=kw.get("s_aux"))
        O.assert_close(out, ro, dt)
        O.lse_close(lse, rl, atol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_func_and_upstream_order(backend, rng, causal):
    """flash_attn_func ([batch, seqlen, heads, dim]) and upstream FlashAttention's positional
    order of flash_attn_varlen_func (cu_seqlens before max_seqlen, dropout_p positional)."""
    B, Sq, Sk, H, Hkv, D = 2, 5, 8, 4, 2, 16
    dt = np.dtype(np.float32)
    q = randn(rng, (B, Sq, H, D), dt)
    k = randn(rng, (B, Sk, Hkv, D), dt)
    v = randn(rng, (B, Sk, Hkv, D), dt)
    sl = (rng.random((B, H)) * 0.3).astype(np.float32)
    out, lse, _ = pa.flash_attn_func(q, k, v, 0.0, causal=causal, window_size=(2, 1),
                                     alibi_slopes=sl, return_attn_probs=True, backend=backend)
    assert out.shape == q.shape and lse.shape == (B, H, Sq)
    for b in range(B):
        ro, rl = O.attention(q[b], k[b], v[b], Sk - Sq + np.arange(Sq), scale=D ** -0.5,
                             causal=causal, window=(2, 1), alibi=sl[b])
        O.assert_close(out[b], ro, dt)
        O.lse_close(lse[b], rl.T)
    cu_q = np.arange(B + 1, dtype=np.int32) * Sq
    cu_k = np.arange(B + 1, dtype=np.int32) * Sk
    o2 = pa.flash_attn_varlen_func(q.reshape(-1, H, D), k.reshape(-1, Hkv, D),
                                   v.reshape(-1, Hkv, D), cu_q, cu_k, Sq, Sk, 0.0,
                                   causal=causal, window_size=(2, 1), alibi_slopes=sl,
                                   backend=backend)
    np.testing.assert_array_equal(o2.reshape(out.shape), out)
    with pytest.raises(NotImplementedError):
        pa.flash_attn_func(q, k, v, 0.1)


def test_with_kvcache_dense_batch_idx_and_new_kv_shorter(backend, rng):
    """Dense cache rows chosen by cache_batch_idx; seqlen_new < seqlen_q (FlashAttention's
    test_flash_attn_kvcache shapes)."""
    B, Sq, Snew, cap, H, Hkv, D = 2, 4, 2, 12, 4, 1, 32
    dt = np.dtype(np.float16)
    kc = nan_cache(3, cap, Hkv, D, dt)
    vc = nan_cache(3, cap, Hkv, D, dt)
    idx = np.array([2, 0], np.int32)
    seqlens = np.array([1, 6], np.int32)
    for b in range(B):
        kc[idx[b], :seqlens[b]] = randn(rng, (seqlens[b], Hkv, D), dt)
        vc[idx[b], :seqlens[b]] = randn(rng, (seqlens[b], Hkv, D), dt)
    q = randn(rng, (B, Sq, H, D), dt)
    kn = randn(rng, (B, Snew, Hkv, D), dt)
    vn = randn(rng, (B, Snew, Hkv, D), dt)
    out, lse = pa.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens,
                                          cache_batch_idx=idx, causal=True,
                                          return_softmax_lse=True, backend=backend)
    for b in range(B):
        n = seqlens[b] + Snew
        K, V = O.to_f64(kc[idx[b], :n]), O.to_f64(vc[idx[b], :n])
        np.testing.assert_array_equal(kc[idx[b], seqlens[b]:n], kn[b])
        ro, rl = O.attention(q[b], K, V, n - Sq + np.arange(Sq), scale=D ** -0.5)
        O.assert_close(out[b], ro, dt)
        O.lse_close(lse[b], rl.T, atol=2e-3)
    assert np.isnan(kc[1]).all()


def test_hnd_cache_and_long_decode(backend, rng):
    """A cache stored HND ([num_blocks, heads, block_size, dim]) passed as a strided
    [num_blocks, block_size, heads, dim] view; decodes over thousands of keys."""
    H, Hkv, D, bs = 8, 2, 64, 32
    dt = np.dtype(np.float16)
    klens = [3000, 1, 777]
    nb = sum(-(-k // bs) for k in klens) + 4
    kst = np.full((nb, Hkv, bs, D), np.nan, np.float32).astype(dt)
    vst = kst.copy()
    kc, vc = kst.transpose(0, 2, 1, 3), vst.transpose(0, 2, 1, 3)
    tabs = tables(rng, klens, bs, nb)
    fill_cache(rng, kc, vc, tabs, klens, dt)
    q = randn(rng, (3, 1, H, D), dt)
    out = pa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array(klens, np.int32),
                                     block_table=pad_tables(tabs), causal=True, backend=backend)
    for b in range(3):
        K = O.gather(kc, tabs[b], klens[b])
        V = O.gather(vc, tabs[b], klens[b])
        ro, _ = O.attention(q[b], K, V, [klens[b] - 1], scale=D ** -0.5)
        O.assert_close(out[b], ro, dt)


def test_varlen_noncausal_sinks_and_padding_rows(backend, rng):
    """Non-causal attention with sinks; rows past cu_seqlens_q[-1] are zero with lse -inf."""
    H, Hkv, D = 4, 4, 16
    qlens, klens = [3, 5], [6, 2]
    cu_q = np.array([0, 3, 8], np.int32)
    cu_k = np.array([0, 6, 8], np.int32)
    q = randn(rng, (10, H, D), np.float32)
    k = randn(rng, (8, Hkv, D), np.float32)
    v = randn(rng, (8, Hkv, D), np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    out, lse = pa.flash_attn_varlen_func(q, k, v, 5, cu_q, 6, cu_k, causal=False, s_aux=sinks,
                                         return_softmax_lse=True, backend=backend)
    for i in range(2):
        a, b = cu_q[i], cu_q[i + 1]
        ro, rl = O.attention(q[a:b], k[cu_k[i]:cu_k[i + 1]], v[cu_k[i]:cu_k[i + 1]],
                             klens[i] - qlens[i] + np.arange(qlens[i]), scale=D ** -0.5,
                             causal=False, sinks=sinks)
        O.assert_close(out[a:b], ro, np.float32)
        O.lse_close(lse[:, a:b], rl.T)
    assert (out[8:] == 0).all() and np.isneginf(lse[:, 8:]).all()


@pytest.mark.parametrize("case", ["causal_q_gt_k", "per_batch_alibi_append", "noncausal_local"])
def test_with_kvcache_row_mapping(backend, rng, case):
    """Rows of [batch, seqlen_q] queries: empty rows (seqlen_q > keys), per-batch ALiBi with an
    append (one call per sequence), non-causal local windows (gathered path)."""
    H, Hkv, D, bs, B, Sq = 4, 2, 16, 4, 3, 6
    dt = np.dtype(np.float32)
    seqlens = np.array({"causal_q_gt_k": [6, 2, 9], "per_batch_alibi_append": [3, 0, 8],
                        "noncausal_local": [10, 4, 7]}[case], np.int32)
    snew = 2 if case == "per_batch_alibi_append" else 0
    causal = case != "noncausal_local"
    window = (2, 3) if case == "noncausal_local" else (-1, -1)
    sl = (rng.random((B, H)) * 0.3).astype(np.float32) if case != "causal_q_gt_k" else None
    sinks = rng.standard_normal(H).astype(np.float32) if case == "causal_q_gt_k" else None
    nb = 12
    kc = nan_cache(nb, bs, Hkv, D, dt)
    vc = nan_cache(nb, bs, Hkv, D, dt)
    tabs = tables(rng, [12] * B, bs, nb)
    fill_cache(rng, kc, vc, tabs, seqlens.tolist(), dt)
    q = randn(rng, (B, Sq, H, D), dt)
    kn = vn = None
    if snew:
        kn, vn = randn(rng, (B, snew, Hkv, D), dt), randn(rng, (B, snew, Hkv, D), dt)
    out, lse = pa.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens,
                                          block_table=pad_tables(tabs), causal=causal,
                                          window_size=window, alibi_slopes=sl, s_aux=sinks,
                                          return_softmax_lse=True, backend=backend)
    for b in range(B):
        n = int(seqlens[b]) + snew
        K, V = O.gather(kc, tabs[b], n), O.gather(vc, tabs[b], n)
        ro, rl = O.attention(q[b], K, V, n - Sq + np.arange(Sq), scale=D ** -0.5, causal=causal,
                             window=window, alibi=None if sl is None else sl[b], sinks=sinks)
        O.assert_close(out[b], ro, dt, "batch %d" % b)
        O.lse_close(lse[b], rl.T)


def _rotary_ref(x, theta, interleaved):
    """Rotary embedding as a complex rotation (x [S, H, D], theta [S, rd/2])."""
    x = x.astype(np.float64).copy()
    rd = theta.shape[1] * 2
    if interleaved:
        z = x[..., 0:rd:2] + 1j * x[..., 1:rd:2]
    else:
        z = x[..., :rd // 2] + 1j * x[..., rd // 2:rd]
    z = z * np.exp(1j * theta)[:, None, :]
    if interleaved:
        x[..., 0:rd:2], x[..., 1:rd:2] = z.real, z.imag
    else:
        x[..., :rd // 2], x[..., rd // 2:rd] = z.real, z.imag
    return x


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_with_kvcache_rotary(backend, rng, interleaved, causal):
    """FlashAttention's test_flash_attn_kvcache with rotary_cos/rotary_sin: new k rotated at
    cache_seqlens + i before the append, q at cache_seqlens + t (causal) or cache_seqlens."""
    B, Sq, H, Hkv, D, cap, rd = 2, 3, 4, 2, 32, 16, 16
    dt = np.dtype(np.float32)
    kc = randn(rng, (B, cap, Hkv, D), dt)
    vc = randn(rng, (B, cap, Hkv, D), dt)
    seqlens = np.array([4, 9], np.int32)
    q = randn(rng, (B, Sq, H, D), dt)
    kn = randn(rng, (B, Sq, Hkv, D), dt)
    vn = randn(rng, (B, Sq, Hkv, D), dt)
    angle = rng.random((cap, rd // 2)) * 2 * np.pi
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    k0 = kc.copy()
    out = pa.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, causal=causal,
                                     rotary_cos=cos, rotary_sin=sin,
                                     rotary_interleaved=interleaved, backend=backend)
    for b in range(B):
        n = seqlens[b] + Sq
        kpos = seqlens[b] + np.arange(Sq)
        kr = _rotary_ref(kn[b], angle[kpos], interleaved)
        np.testing.assert_allclose(kc[b, seqlens[b]:n], kr, atol=1e-5)
        np.testing.assert_array_equal(kc[b, :seqlens[b]], k0[b, :seqlens[b]])
        qpos = seqlens[b] + (np.arange(Sq) if causal else np.zeros(Sq, int))
        qr = _rotary_ref(q[b], angle[qpos], interleaved)
        ro, _ = O.attention(qr, O.to_f64(kc[b, :n]), O.to_f64(vc[b, :n]), n - Sq + np.arange(Sq),
                            scale=D ** -0.5, causal=causal)
        O.assert_close(out[b], ro, dt, atol=1e-4, rtol=1e-4)


def test_packed_variants(backend, rng):
    """qkv / kv packed inputs are strided views; results equal the unpacked calls."""
    B, S, H, D = 2, 7, 4, 16
    dt = np.dtype(np.float16)
    qkv = randn(rng, (B, S, 3, H, D), dt)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    ref = pa.flash_attn_func(np.ascontiguousarray(q), np.ascontiguousarray(k),
                             np.ascontiguousarray(v), causal=True, backend=backend)
    np.testing.assert_array_equal(pa.flash_attn_qkvpacked_func(qkv, causal=True, backend=backend),
                                  ref)
    kv = np.ascontiguousarray(qkv[:, :, 1:])
    np.testing.assert_array_equal(
        pa.flash_attn_kvpacked_func(np.ascontiguousarray(q), kv, causal=True, backend=backend),
        ref)
    cu = np.array([0, S, 2 * S], np.int32)
    flat = qkv.reshape(B * S, 3, H, D)
    o = pa.flash_attn_varlen_qkvpacked_func(flat, cu, S, causal=True, backend=backend)
    np.testing.assert_array_equal(o.reshape(B, S, H, D), ref)
    o = pa.flash_attn_varlen_kvpacked_func(np.ascontiguousarray(q).reshape(B * S, H, D),
                                           kv.reshape(B * S, 2, H, D), cu, cu, S, S,
                                           causal=True, backend=backend)
    np.testing.assert_array_equal(o.reshape(B, S, H, D), ref)
    for b in range(B):
        ro, _ = O.attention(q[b], k[b], v[b], np.arange(S), scale=D ** -0.5)
        O.assert_close(ref[b], ro, dt)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("extra", [{}, {"window_size": (2, 2)}, {"s_aux": [0.5, -1.0, 2.0, 0.0]}])
def test_varlen_empty_batches(backend, causal, extra):
    """No query rows at all, and query rows with no keys at all (total_k = 0): FlashAttention
    returns empty outputs, and rows that see no key get 0 (lse -inf, or the sink's logit)."""
    H, Hkv, D = 4, 2, 32
    if not causal and "window_size" not in extra:
        extra = dict(extra, alibi_slopes=np.ones(H, np.float32))
    kc = np.full((3, 16, Hkv, D), np.nan, np.float32)
    q0 = np.zeros((0, H, D), np.float32)
    out, lse = pa.flash_attn_varlen_func(
        q0, kc, kc, 1, np.array([0, 0], np.int32), 5, seqused_k=np.array([5], np.int32),
        block_table=np.array([[1]], np.int32), causal=causal, return_softmax_lse=True,
        backend=backend, **extra)
    assert out.shape == (0, H, D) and lse.shape == (H, 0)
    no_k = np.zeros((0, Hkv, D), np.float32)
    for total_q in (0, 3):
        q = np.ones((total_q, H, D), np.float32)
        out, lse = pa.flash_attn_varlen_func(
            q, no_k, no_k, 3, np.array([0, total_q], np.int32), 0, np.array([0, 0], np.int32),
            causal=causal, return_softmax_lse=True, backend=backend, **extra)
        assert out.shape == (total_q, H, D) and lse.shape == (H, total_q)
        assert np.all(out == 0)
        want = np.asarray(extra["s_aux"], np.float32) if "s_aux" in extra else np.full(H, -np.inf)
        assert np.array_equal(lse, np.repeat(want[:, None], total_q, axis=1))


def test_with_kvcache_reused_metadata_and_buffers_changed_in_place(backend, rng):
    """An engine calls every layer of a step with the same lengths and block table (often the
    same preallocated arrays, rewritten in place between steps). Calls that repeat the
    metadata reuse its batch; each must still read its own cache and query, and a table or a
    length changed in place (same array objects) must be honoured, never a stale batch."""
    H, Hkv, D, bs, nb = 8, 2, 64, 16, 24
    dt = np.dtype(np.float32)
    klens = np.array([5, 40, 33], np.int32)
    bt = np.zeros((3, 4), np.int32)
    perm = rng.permutation(nb).astype(np.int32)

    def check(kc, vc, q, out):
        for b in range(3):
            tab = bt[b, :-(-int(klens[b]) // bs)]
            K, V = O.gather(kc, tab, int(klens[b])), O.gather(vc, tab, int(klens[b]))
            ro, _ = O.attention(q[b], K, V, [int(klens[b]) - 1], scale=D ** -0.5)
            O.assert_close(out[b], ro, dt)

    for step in range(4):
        if step % 2:
            klens += 1  # in place, the table unchanged
        else:
            bt[:] = perm[step:step + 12].reshape(3, 4)  # in place, the lengths unchanged
        for layer in range(3):
            kc = randn(rng, (nb, bs, Hkv, D), dt)
            vc = randn(rng, (nb, bs, Hkv, D), dt)
            q = randn(rng, (3, 1, H, D), dt)
            out = pa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=klens, block_table=bt,
                                             causal=True, backend=backend)
            check(kc, vc, q, out)


@pytest.mark.parametrize("shape", [(0, 2), (2, 0), (0, 0)])
def test_with_kvcache_empty_batch_with_new_kv(backend, shape):
    """No sequences or no new tokens, with (empty) new keys and values to append: an empty
    output and an unchanged cache (it failed an internal assertion: found by random calls)."""
    B, S = shape
    kc = np.zeros((4, 16, 2, 32), np.float32)
    q = np.ones((B, S, 4, 32), np.float32)
    k = np.ones((B, S, 2, 32), np.float32)
    out = pa.flash_attn_with_kvcache(q, kc, kc, k, k, cache_seqlens=np.zeros(B, np.int32),
                                     block_table=np.zeros((B, 1), np.int32), causal=True,
                                     backend=backend)
    assert out.shape == q.shape and not kc.any()


def test_broadcast_and_reversed_input_rows(backend, rng):
    """Inputs whose rows are broadcast (stride 0), reversed (negative stride) or strided give
    the same result as their contiguous copies (the library reads a row stride of 0 as
    "contiguous": a broadcast q was read past its one row, a wrong answer). Outputs with such
    rows are a ValueError (tested in test_errors)."""
    H, Hkv, D = 4, 2, 32
    cu = np.array([0, 3, 5], np.int32)
    q1 = randn(rng, (1, H, D), np.float32)
    k = randn(rng, (10, Hkv, D), np.float32)
    v = randn(rng, (10, Hkv, D), np.float32)
    cases = {"q broadcast": (np.broadcast_to(q1, (5, H, D)), k[:5], v[:5]),
             "q reversed": (randn(rng, (5, H, D), np.float32)[::-1], k[:5], v[:5]),
             "k, v reversed": (randn(rng, (5, H, D), np.float32), k[:5][::-1], v[5:][::-1]),
             "k, v every other": (randn(rng, (5, H, D), np.float32), k[::2], v[::2]),
             "k broadcast": (randn(rng, (5, H, D), np.float32),
                             np.broadcast_to(k[:1], (5, Hkv, D)), v[:5])}
    for name, (q, kk, vv) in cases.items():
        got = pa.flash_attn_varlen_func(q, kk, vv, 3, cu, 3, cu, causal=True, backend=backend)
        want = pa.flash_attn_varlen_func(np.ascontiguousarray(q), np.ascontiguousarray(kk),
                                         np.ascontiguousarray(vv), 3, cu, 3, cu, causal=True,
                                         backend=backend)
        assert np.array_equal(got, want), name
    # flash_attn_with_kvcache: q broadcast over the batch, new k/v reversed
    kc = randn(rng, (4, 16, Hkv, D), np.float32)
    bt = np.array([[0, 1], [2, 3]], np.int32)
    qb = np.broadcast_to(q1[None], (2, 1, H, D))
    kn = randn(rng, (2, 1, Hkv, D), np.float32)[::-1]
    outs = []
    for qq, kk in ((qb, kn), (np.ascontiguousarray(qb), np.ascontiguousarray(kn))):
        c = kc.copy()
        outs.append((pa.flash_attn_with_kvcache(qq, c, c, kk, kk, cache_seqlens=np.array([5, 9]),
                                                block_table=bt, causal=True, backend=backend), c))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])


def test_with_kvcache_flash_attn_positional_order(backend, rng):
    """FlashAttention 2's positional order: q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
    cache_seqlens, cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
    window_size, softcap, rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse
    (flash_attn/flash_attn_interface.py). A call by position means what it means there."""
    H, Hkv, D, bs = 4, 2, 32, 8
    klens = [3, 20]
    nb = sum(-(-k // bs) for k in klens) + 2
    kc = nan_cache(nb, bs, Hkv, D, np.float32)
    vc = nan_cache(nb, bs, Hkv, D, np.float32)
    tabs = tables(rng, klens, bs, nb)
    bt = pad_tables(tabs)
    fill_cache(rng, kc, vc, tabs, klens, np.float32)
    q = randn(rng, (2, 1, H, D), np.float32)
    seqlens = np.array(klens, np.int32)
    want = pa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=bt,
                                      softmax_scale=0.3, causal=True, window_size=(5, 0),
                                      softcap=4.0, return_softmax_lse=True, backend=backend)
    got = pa.flash_attn_with_kvcache(q, kc, vc, None, None, None, None, seqlens, None, None, bt,
                                     0.3, True, (5, 0), 4.0, True, None, 0, True, backend=backend)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)
    for b in range(2):  # and against the oracle: scale 0.3, window (5, 0), soft-cap 4
        K = O.gather(kc, tabs[b], klens[b])
        V = O.gather(vc, tabs[b], klens[b])
        ro, _ = O.attention(q[b], K, V, [klens[b] - 1], scale=0.3, window=(5, 0), softcap=4.0)
        O.assert_close(got[0][b], ro, np.dtype(np.float32))


def test_with_kvcache_flash_attn_refusals(rng):
    """As FlashAttention: a paged cache takes no cache_batch_idx; cache_leftpad is not
    supported (loudly)."""
    kc = np.zeros((4, 8, 1, 16), np.float32)
    q = np.zeros((1, 1, 2, 16), np.float32)
    bt = np.array([[0, 1]], np.int32)
    with pytest.raises(ValueError, match="cache_batch_idx"):
        pa.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3, block_table=bt,
                                   cache_batch_idx=np.array([0], np.int32))
    with pytest.raises(NotImplementedError, match="cache_leftpad"):
        pa.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3, block_table=bt,
                                   cache_leftpad=np.array([0], np.int32))


def test_flash_attn_negative_softcap_and_window_sides(backend, rng):
    """FlashAttention: "anything > 0 activates softcapping" (a negative softcap is off), and any
    negative window side is unbounded, -1 or not."""
    q = randn(rng, (1, 7, 4, 16), np.float32)
    k = randn(rng, (1, 9, 2, 16), np.float32)
    v = randn(rng, (1, 9, 2, 16), np.float32)
    plain = pa.flash_attn_func(q, k, v, causal=True, backend=backend)
    odd = pa.flash_attn_func(q, k, v, causal=True, softcap=-3.0, window_size=(-7, -2),
                             backend=backend)
    np.testing.assert_array_equal(plain, odd)
    half = pa.flash_attn_func(q, k, v, causal=True, window_size=(2, -5), backend=backend)
    want = pa.flash_attn_func(q, k, v, causal=True, window_size=(2, -1), backend=backend)
    np.testing.assert_array_equal(half, want)


def test_varlen_fork_keywords_and_positional_order(backend, rng):
    """vllm_flash_attn's flash_attn_varlen_func keywords at their neutral values (q_v,
    output_scale, context parallelism, FA4's masks, tuning knobs) are accepted and change
    nothing; other values are NotImplementedError. Positional arguments follow the fork's order
    (..., seqused_k, q_v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
    deterministic, return_attn_probs, block_table, return_softmax_lse, out, ...), while
    upstream FlashAttention 2's order (cu_seqlens first) is still recognized."""
    H, Hkv, D, n = 4, 2, 16, 7
    dt = np.dtype(np.float32)
    q, k, v = randn(rng, (n, H, D), dt), randn(rng, (n, Hkv, D), dt), randn(rng, (n, Hkv, D), dt)
    cu = np.array([0, 3, n], np.int32)
    sl = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    base = dict(causal=True, backend=backend)
    want, want_lse = pa.flash_attn_varlen_func(q, k, v, 4, cu, 4, cu, softmax_scale=0.3,
                                               window_size=(2, 0), alibi_slopes=sl,
                                               return_softmax_lse=True, **base)
    neutral = dict(q_v=None, output_scale=None, cp_world_size=1, cp_rank=0,
                   cp_tot_seqused_k=None, mask_mod=None, block_sparse_tensors=None,
                   aux_tensors=None, aux_tensor_leading_dims=None, dynamic_causal=None,
                   scheduler_metadata=None, num_splits=0, fa_version=3, deterministic=False)
    got = pa.flash_attn_varlen_func(q, k, v, 4, cu, 4, cu, softmax_scale=0.3, window_size=(2, 0),
                                    alibi_slopes=sl, **neutral, **base)
    np.testing.assert_array_equal(got, want)
    for key, val in (("q_v", q), ("output_scale", np.ones(1, np.float32)), ("cp_world_size", 2),
                     ("cp_rank", 1), ("cp_tot_seqused_k", np.array([3, 4], np.int32)),
                     ("mask_mod", object()), ("aux_tensors", [q]), ("dynamic_causal", cu)):
        with pytest.raises(NotImplementedError, match=key):
            pa.flash_attn_varlen_func(q, k, v, 4, cu, 4, cu, **{key: val}, **base)
    # the fork's positional order, up to out
    out = np.empty_like(q)
    r = pa.flash_attn_varlen_func(q, k, v, 4, cu, 4, cu, None, None, 0.0, 0.3, True, (2, 0),
                                  0.0, sl, False, False, None, True, out, backend=backend)
    assert r[0] is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(r[1], want_lse)
    with pytest.raises(TypeError):  # pagedattn's own arguments are keyword-only
        pa.flash_attn_varlen_func(q, k, v, 4, cu, 4, cu, *([None] * 29), "auto")
    # upstream FlashAttention 2's positional order (dropout_p, softmax_scale, causal,
    # window_size, softcap, alibi_slopes after max_seqlen_k) gives the same result
    got = pa.flash_attn_varlen_func(q, k, v, cu, cu, 4, 4, 0.0, 0.3, True, (2, 0), 0.0, sl,
                                    backend=backend)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(TypeError):
        pa.flash_attn_varlen_func(q, k, v, cu, cu, 4, 4, 0.0, softmax_scale=0.3, dropout_p=0.0)
    import inspect
    params = list(inspect.signature(pa.flash_attn_varlen_func).parameters)
    assert params[:20] == ["q", "k", "v", "max_seqlen_q", "cu_seqlens_q", "max_seqlen_k",
                           "cu_seqlens_k", "seqused_k", "q_v", "dropout_p", "softmax_scale",
                           "causal", "window_size", "softcap", "alibi_slopes", "deterministic",
                           "return_attn_probs", "block_table", "return_softmax_lse", "out"]
