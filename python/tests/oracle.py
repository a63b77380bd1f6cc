"""An independent numpy oracle of pagedattn's numerics contract (DESIGN.md), in float64.

Written from the contract, not from the C code:
  s_j = scale * q.k_j; soft-cap s = cap * tanh(s / cap); ALiBi s -= slope_h * |j - p|;
  visibility: causal j <= p, window p - left <= j <= p + right (-1 = unbounded), block-sparse
  rule; sinks join the denominator only; out = sum softmax * v; lse = m + ln(denominator);
  a row with no visible key and no sink: out = 0, lse = -inf.
Query head h reads KV head h // (num_heads // num_kv_heads).
"""

import math

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
FP8_MAX = {"fp8": 448.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
FP8_DT = {"fp8": E4M3, "fp8_e4m3": E4M3, "fp8_e5m2": E5M2}


# ---- fp8 ----------------------------------------------------------------------------------------

def fp8_decode(b, kind, scale=1.0):
    """uint8 bytes -> float64 value * scale (exact)."""
    return np.asarray(b, dtype=np.uint8).view(FP8_DT[kind]).astype(np.float64) * scale


def fp8_encode(x, kind, scale=1.0):
    """float -> uint8: round-to-nearest-even of float32(x) / float32(scale), saturating at the
    largest finite value (vLLM's SATFINITE); NaN stays NaN."""
    y = np.asarray(x, dtype=np.float32) / np.float32(scale)
    m = np.float32(FP8_MAX[kind])
    y = np.where(np.isnan(y), y, np.clip(y, -m, m)).astype(np.float32)
    return y.astype(FP8_DT[kind]).view(np.uint8)


def to_f64(a):
    return np.asarray(a).astype(np.float64)


# ---- caches -------------------------------------------------------------------------------------

def gather(cache, table, n, kind=None, scale=1.0):
    """The first n tokens of a sequence from a paged pool [num_blocks, block_size, H, D]."""
    bs = cache.shape[1]
    j = np.arange(n)
    blocks = np.asarray(table, dtype=np.int64)[j // bs] if n else np.zeros(0, np.int64)
    x = cache[blocks, j % bs]
    if kind is not None and kind != "auto":
        return fp8_decode(x, kind, scale)
    return to_f64(x)


# ---- attention ----------------------------------------------------------------------------------

def blocksparse_offsets(num_heads, num_kv_heads, vert_stride, homo_head=False,
                        homo_head_group=False, tp_rank=0, total_heads=None, total_kv_heads=None,
                        head_sliding_step=None):
    """Per query head o_h of vLLM's block-sparse pattern."""
    total_heads = total_heads or num_heads
    total_kv_heads = total_kv_heads or num_kv_heads
    group = num_heads // num_kv_heads
    if head_sliding_step is None:
        if homo_head:
            step = 0
        elif homo_head_group:
            step = -max(1, int(vert_stride / total_kv_heads))
        else:
            step = max(1, int(vert_stride / total_heads))
    else:
        step = head_sliding_step
    if homo_head:
        step = 0
    out = []
    for h in range(num_heads):
        if step >= 0:
            out.append((tp_rank * num_heads + h) * step + 1)
        else:
            out.append((tp_rank * num_kv_heads + h // group) * (-step) + 1)
    return out


def attention(q, k, v, positions, *, scale, causal=True, window=(-1, -1), alibi=None,
              softcap=0.0, sinks=None, blocksparse=None):
    """Reference attention of one sequence.

    q: [nq, H, D]; k, v: [nk, Hkv, D] (float64, already dequantized); positions: [nq] absolute
    positions p of the queries. blocksparse: None or (block_size, local_blocks, vert_stride,
    offsets[H]). Returns (out [nq, H, D] float64, lse [nq, H] float64).
    """
    q, k, v = to_f64(q), to_f64(k), to_f64(v)
    nq, H, D = q.shape
    nk, Hkv = k.shape[0], k.shape[1]
    g = H // Hkv
    p = np.asarray(positions, dtype=np.int64)[:, None]
    j = np.arange(nk, dtype=np.int64)[None, :]
    vis = np.ones((nq, nk), dtype=bool)
    if causal:
        vis &= j <= p
    left, right = window
    if left >= 0:
        vis &= j >= p - left
    if right >= 0:
        vis &= j <= p + right
    out = np.zeros((nq, H, D))
    lse = np.full((nq, H), -np.inf)
    for h in range(H):
        kh = h // g
        with np.errstate(invalid="ignore", over="ignore"):
            s = scale * (q[:, h, :] @ k[:, kh, :].T) if nk else np.zeros((nq, 0))
        if softcap:
            s = softcap * np.tanh(s / softcap)
        if alibi is not None:
            s = s - alibi[h] * np.abs(j - p)
        vh = vis
        if blocksparse is not None:
            bsz, local, vert, offs = blocksparse
            qb, kb = p // bsz, j // bsz
            vh = vis & (kb <= qb) & (((qb - kb) < local) | (((kb + offs[h]) % vert) == 0))
        s = np.where(vh, s, -np.inf)
        m = s.max(axis=1) if nk else np.full(nq, -np.inf)
        if sinks is not None:
            m = np.maximum(m, sinks[h])
        ok = np.isfinite(m)
        msafe = np.where(ok, m, 0.0)
        w = np.where(vh, np.exp(s - msafe[:, None]), 0.0)
        den = w.sum(axis=1)
        if sinks is not None:
            den = den + np.where(ok, np.exp(sinks[h] - msafe), 0.0)
        vv = np.where(vh[:, :, None], 1.0, 0.0)  # masked values never touch the result
        vals = np.nan_to_num(v[:, kh, :], nan=0.0, posinf=0.0, neginf=0.0) if nk else v[:, kh, :]
        num = w @ vals if nk else np.zeros((nq, D))
        del vv
        good = den > 0
        out[good, h, :] = num[good] / den[good, None]
        lse[good, h] = msafe[good] + np.log(den[good])
    return out, lse


def merge(out_a, lse_a, out_b, lse_b):
    """merge_states: per (token, head); LSEs [T, H]; +inf means -inf."""
    a = np.where(np.isposinf(lse_a), -np.inf, to_f64(lse_a))
    b = np.where(np.isposinf(lse_b), -np.inf, to_f64(lse_b))
    M = np.maximum(a, b)  # NaN where either is NaN: the row and its lse NaN, as IEEE has it
    empty = M == -np.inf
    Ms = np.where(empty, 0.0, M)
    with np.errstate(invalid="ignore"):
        wa = np.where(empty, 0.0, np.exp(a - Ms))
        wb = np.where(empty, 0.0, np.exp(b - Ms))
        den = wa + wb
        dsafe = np.where(empty, 1.0, den)
        # an empty part (lse -inf) adds nothing, whatever its out holds
        ta = np.where((a == -np.inf)[..., None], 0.0, to_f64(out_a) * (wa / dsafe)[..., None])
        tb = np.where((b == -np.inf)[..., None], 0.0, to_f64(out_b) * (wb / dsafe)[..., None])
        out = ta + tb
    out = np.where(empty[..., None], 0.0, out)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(empty, -np.inf, Ms + np.log(dsafe))
    return out, lse


# ---- tolerances ---------------------------------------------------------------------------------

def tol(dtype):
    dt = np.dtype(dtype)
    if dt == np.float32:
        return dict(atol=3e-5, rtol=3e-5)
    if dt == np.float16:
        return dict(atol=3e-3, rtol=3e-3)
    return dict(atol=2e-2, rtol=2e-2)  # bfloat16


def assert_close(actual, expected, dtype, what="out", atol=None, rtol=None):
    t = tol(dtype)
    if atol is not None:
        t["atol"] = atol
    if rtol is not None:
        t["rtol"] = rtol
    a = to_f64(actual)
    e = to_f64(expected)
    assert a.shape == e.shape, "%s: shape %s vs %s" % (what, a.shape, e.shape)
    assert not np.isnan(a).any(), "%s: NaN in the result" % what
    bad = ~np.isclose(a, e, **t)
    # equal infinities are fine
    bad &= ~((a == e) & np.isinf(e))
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        raise AssertionError("%s: %d of %d elements differ (first at %s: got %r, want %r; %s)"
                             % (what, int(bad.sum()), bad.size, idx, a[idx], e[idx], t))


def lse_close(actual, expected, what="lse", atol=1e-4, rtol=1e-5):
    a = to_f64(actual)
    e = to_f64(expected)
    assert a.shape == e.shape, "%s: shape %s vs %s" % (what, a.shape, e.shape)
    inf = np.isinf(e)
    assert np.array_equal(np.isneginf(a), np.isneginf(e)), "%s: -inf rows differ" % what
    np.testing.assert_allclose(a[~inf], e[~inf], atol=atol, rtol=rtol, err_msg=what)


def alibi_slopes(num_heads):
    """vLLM's / the ALiBi paper's slopes."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != num_heads:
        extra = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** (2 * i + 1) for i in range(num_heads - closest)]
    return np.array(slopes, dtype=np.float32)
