"""vLLM's paged-layout ops (test_attention.py / test_cache.py shapes): reshape_and_cache,
paged_attention_v1/v2 and convert_fp8, against the oracle."""

import numpy as np
import pytest

import oracle as O
import pagedattn as pa
from util import DTYPES, randn


def _layout(kc_nhd, vc_nhd, x):
    """flash [nb, bs, H, D] -> vLLM paged key [nb, H, D/x, bs, x], value [nb, H, D, bs]."""
    nb, bs, h, d = kc_nhd.shape
    k = np.ascontiguousarray(kc_nhd.reshape(nb, bs, h, d // x, x).transpose(0, 2, 3, 1, 4))
    v = np.ascontiguousarray(vc_nhd.transpose(0, 2, 3, 1))
    return k, v


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_reshape_and_cache_paged_layout(rng, kv_cache_dtype, dtype):
    dt = DTYPES[dtype]
    T, H, D, nb, bs = 30, 2, 64, 5, 16
    fp8 = kv_cache_dtype != "auto"
    x = 16 // (1 if fp8 else dt.itemsize)
    key, value = randn(rng, (T, H, D), dt), randn(rng, (T, H, D), dt)
    slots = rng.permutation(nb * bs)[:T].astype(np.int64)
    slots[5] = -1
    cdt = np.uint8 if fp8 else dt
    kc = np.zeros((nb, H, D // x, bs, x), cdt)
    vc = np.zeros((nb, H, D, bs), cdt)
    pa.reshape_and_cache(key, value, kc, vc, slots, kv_cache_dtype, 0.5, 2.0)
    flash_k = np.zeros((nb, bs, H, D), cdt)
    flash_v = np.zeros((nb, bs, H, D), cdt)
    for i, s in enumerate(slots):
        if s < 0:
            continue
        flash_k[s // bs, s % bs] = O.fp8_encode(key[i].astype(np.float32), "fp8", 0.5) if fp8 else key[i]
        flash_v[s // bs, s % bs] = O.fp8_encode(value[i].astype(np.float32), "fp8", 2.0) if fp8 else value[i]
    ek, ev = _layout(flash_k, flash_v, x)
    np.testing.assert_array_equal(kc.view(np.uint8), ek.view(np.uint8))
    np.testing.assert_array_equal(vc.view(np.uint8), ev.view(np.uint8))
    with pytest.raises(ValueError):
        pa.reshape_and_cache(key, value, kc, vc, np.full(T, nb * bs, np.int64))


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("feature", ["plain", "alibi", "fp8", "blocksparse"])
def test_paged_attention(backend, rng, version, feature):
    """vLLM's test_paged_attention: one query per sequence, random block tables (repeats)."""
    S, H, Hkv, D, bs, nb = 5, 8, 2, 64, 16, 40
    dt = np.dtype(np.float16)
    fp8 = feature == "fp8"
    seq_lens = rng.integers(1, 300, S)
    seq_lens[0] = 1
    max_blocks = int(-(-seq_lens.max() // bs))
    bt = rng.integers(0, nb, (S, max_blocks)).astype(np.int32)
    if fp8:
        kflash = O.fp8_encode(rng.standard_normal((nb, bs, Hkv, D)), "fp8", 0.3)
        vflash = O.fp8_encode(rng.standard_normal((nb, bs, Hkv, D)), "fp8", 0.6)
        x = 16
    else:
        kflash = randn(rng, (nb, bs, Hkv, D), dt)
        vflash = randn(rng, (nb, bs, Hkv, D), dt)
        x = 8
    kc, vc = _layout(kflash, vflash, x)
    q = randn(rng, (S, H, D), dt)
    out = np.full((S, H, D), np.nan, np.float32).astype(dt)
    scale = D ** -0.5
    slopes = O.alibi_slopes(H) if feature == "alibi" else None
    sparse = dict(blocksparse_local_blocks=2, blocksparse_vert_stride=4,
                  blocksparse_block_size=32, blocksparse_head_sliding_step=1) \
        if feature == "blocksparse" else {}
    kcd, ks, vs = ("fp8", 0.3, 0.6) if fp8 else ("auto", 1.0, 1.0)
    args = (Hkv, scale, bt, seq_lens.astype(np.int32), bs, int(seq_lens.max()), slopes, kcd, ks,
            vs)
    if version == 1:
        pa.paged_attention_v1(out, q, kc, vc, *args, backend=backend, **sparse)
    else:
        pa.paged_attention_v2(out, None, None, None, q, kc, vc, *args, backend=backend, **sparse)
    offs = [h * 1 + 1 for h in range(H)]
    for i in range(S):
        n = int(seq_lens[i])
        K = O.gather(kflash, bt[i], n, kcd if fp8 else None, ks)
        V = O.gather(vflash, bt[i], n, kcd if fp8 else None, vs)
        ro, _ = O.attention(q[i:i + 1], K, V, [n - 1], scale=scale, alibi=slopes,
                            blocksparse=(32, 2, 4, offs) if sparse else None)
        O.assert_close(out[i:i + 1], ro, dt)


def test_convert_fp8_round_trip(rng):
    x = randn(rng, (4, 64), np.float16, scale=10.0)
    b = np.empty(x.shape, np.uint8)
    pa.convert_fp8(b, x, 0.5, "fp8")
    np.testing.assert_array_equal(b, O.fp8_encode(x.astype(np.float32), "fp8", 0.5))
    y = np.empty(x.shape, np.float32)
    pa.convert_fp8(y, b, 0.5, "fp8")
    np.testing.assert_array_equal(y, O.fp8_decode(b, "fp8", 0.5).astype(np.float32))


@pytest.mark.parametrize("feature", ["plain", "sliding_window", "alibi", "fp8"])
def test_context_attention_fwd(backend, rng, feature):
    """vLLM's test_prefix_prefill: new tokens over a cached prefix (paged layout) + themselves."""
    H, Hkv, D, bs, nb = 4, 2, 64, 16, 40
    dt = np.dtype(np.float16)
    fp8 = feature == "fp8"
    ctx = np.array([0, 17, 40], np.int64)
    new = np.array([9, 5, 1], np.int64)
    sl = ctx + new
    perm = rng.permutation(nb).astype(np.int32)
    bt = perm[:3 * 4].reshape(3, 4)
    if fp8:
        kflash = O.fp8_encode(rng.standard_normal((nb, bs, Hkv, D)), "fp8", 0.5)
        vflash = O.fp8_encode(rng.standard_normal((nb, bs, Hkv, D)), "fp8", 0.5)
    else:
        kflash = randn(rng, (nb, bs, Hkv, D), dt)
        vflash = randn(rng, (nb, bs, Hkv, D), dt)
    kc, vc = _layout(kflash, vflash, 16 if fp8 else 8)
    kc0 = kc.copy()
    T = int(new.sum())
    q, k, v = randn(rng, (T, H, D), dt), randn(rng, (T, Hkv, D), dt), randn(rng, (T, Hkv, D), dt)
    o = np.empty_like(q)
    starts = np.concatenate([[0], np.cumsum(new)[:-1]])
    kw = {}
    rkw = {"scale": D ** -0.5}
    if feature == "sliding_window":
        kw["sliding_window"] = 8
        rkw["window"] = (7, 0)
    if feature == "alibi":
        kw["alibi_slopes"] = rkw["alibi"] = O.alibi_slopes(H)
    kcd = "fp8" if fp8 else "auto"
    pa.context_attention_fwd(q, k, v, o, kcd, kc, vc, bt, starts, sl, ctx, int(new.max()),
                             0.5 if fp8 else 1.0, 0.5 if fp8 else 1.0, backend=backend, **kw)
    np.testing.assert_array_equal(kc, kc0)  # the caches are not modified
    s = 0
    for i in range(3):
        c, n = int(ctx[i]), int(new[i])
        Kc = O.gather(kflash, bt[i], c, kcd if fp8 else None, 0.5)
        Vc = O.gather(vflash, bt[i], c, kcd if fp8 else None, 0.5)
        K = np.concatenate([Kc, O.to_f64(k[s:s + n])])
        V = np.concatenate([Vc, O.to_f64(v[s:s + n])])
        ro, _ = O.attention(q[s:s + n], K, V, c + np.arange(n), **rkw)
        O.assert_close(o[s:s + n], ro, dt)  # fp8: the context dequantized, new K/V exact
        s += n
