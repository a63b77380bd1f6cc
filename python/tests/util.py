"""Helpers to build random paged-attention cases (caches filled with NaN where unused)."""

import numpy as np

import oracle as O

DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": O.BF16}


def randn(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


def nan_cache(num_blocks, block_size, hkv, d, dtype, fp8=False):
    if fp8:
        return np.full((num_blocks, block_size, hkv, d), 0x7F, dtype=np.uint8)  # NaN in e4m3
    return np.full((num_blocks, block_size, hkv, d), np.nan, dtype=np.float32).astype(dtype)


def tables(rng, klens, block_size, num_blocks, distinct=True):
    """Block tables (list of int32 arrays) for sequences of klens tokens."""
    need = [-(-k // block_size) for k in klens]
    total = sum(need)
    if distinct:
        assert total <= num_blocks, "not enough blocks"
        perm = rng.permutation(num_blocks)[:total]
    else:
        perm = rng.integers(0, num_blocks, size=total)
    out, i = [], 0
    for n in need:
        out.append(perm[i:i + n].astype(np.int32))
        i += n
    return out


def pad_tables(tabs, width=None):
    width = width or max([len(t) for t in tabs] + [1])
    bt = np.zeros((len(tabs), width), dtype=np.int32)
    for i, t in enumerate(tabs):
        bt[i, :len(t)] = t
    return bt


def fill_cache(rng, kc, vc, tabs, klens, dtype, kv_cache_dtype="auto", k_scale=1.0,
               v_scale=1.0, scale=1.0):
    """Writes random keys/values for every sequence's first klens tokens. With repeated blocks
    (distinct=False) later writes win, which is what gather() then reads."""
    bs = kc.shape[1]
    hkv, d = kc.shape[2], kc.shape[3]
    for t, n in zip(tabs, klens):
        j = np.arange(n)
        if n == 0:
            continue
        blocks, offs = t[j // bs], j % bs
        kx = rng.standard_normal((n, hkv, d)).astype(np.float32) * scale
        vx = rng.standard_normal((n, hkv, d)).astype(np.float32) * scale
        if kv_cache_dtype != "auto":
            kc[blocks, offs] = O.fp8_encode(kx, kv_cache_dtype, k_scale)
            vc[blocks, offs] = O.fp8_encode(vx, kv_cache_dtype, v_scale)
        else:
            kc[blocks, offs] = kx.astype(dtype)
            vc[blocks, offs] = vx.astype(dtype)


def ref_paged(q, kc, vc, cu_q, klens, tabs, *, scale, causal=True, window=(-1, -1), alibi=None,
              softcap=0.0, sinks=None, kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0):
    """Oracle of flash_attn_varlen_func over a paged cache: out [total_q, H, D], lse [H, total_q]."""
    total_q, H, D = q.shape
    out = np.zeros((total_q, H, D))
    lse = np.full((H, total_q), -np.inf)
    for i in range(len(klens)):
        a, b = int(cu_q[i]), int(cu_q[i + 1])
        kl = int(klens[i])
        K = O.gather(kc, tabs[i], kl, kv_cache_dtype, k_scale)
        V = O.gather(vc, tabs[i], kl, kv_cache_dtype, v_scale)
        pos = kl - (b - a) + np.arange(b - a)
        sl = None if alibi is None else (alibi[i] if np.ndim(alibi) == 2 else alibi)
        o, l = O.attention(q[a:b], K, V, pos, scale=scale, causal=causal, window=window,
                           alibi=sl, softcap=softcap, sinks=sinks)
        out[a:b] = o
        lse[:, a:b] = l.T
    return out, lse
