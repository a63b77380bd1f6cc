"""The oracle itself, checked against hand-computed cases and a naive scalar loop."""

import math

import numpy as np
import pytest

import oracle as O


def naive(q, k, v, positions, scale, causal, window, alibi, softcap, sinks, bs=None):
    nq, H, D = q.shape
    nk, Hkv, _ = k.shape
    out = np.zeros((nq, H, D))
    lse = np.full((nq, H), -math.inf)
    for t in range(nq):
        p = positions[t]
        for h in range(H):
            kh = h // (H // Hkv)
            logits = []
            for j in range(nk):
                if causal and j > p:
                    continue
                if window[0] >= 0 and j < p - window[0]:
                    continue
                if window[1] >= 0 and j > p + window[1]:
                    continue
                if bs is not None:
                    bsz, local, vert, offs = bs
                    qb, kb = p // bsz, j // bsz
                    if kb > qb or not (qb - kb < local or (kb + offs[h]) % vert == 0):
                        continue
                s = scale * sum(q[t, h, d] * k[j, kh, d] for d in range(D))
                if softcap:
                    s = softcap * math.tanh(s / softcap)
                if alibi is not None:
                    s -= alibi[h] * abs(j - p)
                logits.append((j, s))
            allv = [s for _, s in logits] + ([sinks[h]] if sinks is not None else [])
            if not allv:
                continue
            m = max(allv)
            den = sum(math.exp(s - m) for s in allv)
            for j, s in logits:
                out[t, h] += math.exp(s - m) * v[j, kh]
            out[t, h] /= den
            lse[t, h] = m + math.log(den)
    return out, lse


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("feature", ["plain", "window", "alibi", "softcap", "sinks", "sparse",
                                     "all"])
def test_oracle_matches_naive_loop(causal, feature):
    rng = np.random.default_rng(hash((causal, feature)) % 1000)
    H, Hkv, D, nq, nk = 4, 2, 8, 5, 11
    q = rng.standard_normal((nq, H, D))
    k = rng.standard_normal((nk, Hkv, D))
    v = rng.standard_normal((nk, Hkv, D))
    pos = np.arange(nk - nq, nk)
    kw = dict(window=(-1, -1), alibi=None, softcap=0.0, sinks=None)
    bs = None
    if feature in ("window", "all"):
        kw["window"] = (3, 1)
    if feature in ("alibi", "all"):
        kw["alibi"] = O.alibi_slopes(H)
    if feature in ("softcap", "all"):
        kw["softcap"] = 2.5
    if feature in ("sinks", "all"):
        kw["sinks"] = rng.standard_normal(H)
    if feature == "sparse":
        bs = (2, 1, 3, O.blocksparse_offsets(H, Hkv, 3))
    o, l = O.attention(q, k, v, pos, scale=0.3, causal=causal, blocksparse=bs, **kw)
    o2, l2 = naive(q, k, v, pos, 0.3, causal, kw["window"], kw["alibi"], kw["softcap"],
                   kw["sinks"], bs)
    np.testing.assert_allclose(o, o2, atol=1e-12)
    np.testing.assert_allclose(l, l2, atol=1e-12)


def test_single_key_and_uniform_keys():
    v = np.arange(6, dtype=np.float64).reshape(3, 1, 2)
    k = np.zeros((3, 1, 2))
    q = np.ones((1, 1, 2))
    o, l = O.attention(q, k[:1], v[:1], [0], scale=1.0)
    np.testing.assert_allclose(o[0, 0], v[0, 0])
    assert l[0, 0] == 0.0
    o, l = O.attention(q, k, v, [2], scale=1.0)
    np.testing.assert_allclose(o[0, 0], v[:, 0].mean(axis=0))
    np.testing.assert_allclose(l[0, 0], math.log(3))


def test_empty_rows():
    q = np.ones((2, 1, 2))
    k = v = np.ones((2, 1, 2))
    o, l = O.attention(q, k, v, [-1, -2], scale=1.0)  # causal, positions before every key
    assert (o == 0).all() and np.isneginf(l).all()
    o, l = O.attention(q, k, v, [-1, -2], scale=1.0, sinks=np.array([0.5]))
    assert (o == 0).all() and (l == 0.5).all()


def test_nan_beyond_length_is_ignored():
    q = np.ones((1, 1, 2))
    k = np.ones((3, 1, 2))
    v = np.ones((3, 1, 2))
    v[2] = np.nan
    k[2] = np.nan
    o, l = O.attention(q, k, v, [1], scale=1.0)
    assert np.isfinite(o).all() and np.isfinite(l).all()


def test_fp8_codec():
    assert O.fp8_encode(1.0, "fp8").item() == 0x38
    assert O.fp8_encode(448.0, "fp8").item() == 0x7E
    assert O.fp8_encode(1e6, "fp8").item() == 0x7E          # saturates
    assert O.fp8_encode(-1e6, "fp8").item() == 0xFE
    assert O.fp8_encode(np.inf, "fp8").item() == 0x7E
    assert O.fp8_decode(0x7E, "fp8") == 448.0
    assert O.fp8_decode(0x7B, "fp8_e5m2") == 57344.0
    assert O.fp8_encode(1e9, "fp8_e5m2").item() == 0x7B
    assert O.fp8_decode(O.fp8_encode(3.0, "fp8", 2.0), "fp8", 2.0) == 3.0
    allb = np.arange(256, dtype=np.uint8)
    vals = O.fp8_decode(allb, "fp8")
    fin = np.isfinite(vals)
    np.testing.assert_array_equal(O.fp8_encode(vals[fin], "fp8"), allb[fin])


def test_merge_of_halves_is_whole():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 2, 8))
    k = rng.standard_normal((10, 2, 8))
    v = rng.standard_normal((10, 2, 8))
    pos = np.full(4, 100)
    o, l = O.attention(q, k, v, pos, scale=0.5)
    oa, la = O.attention(q, k[:3], v[:3], pos, scale=0.5)
    ob, lb = O.attention(q, k[3:], v[3:], pos, scale=0.5)
    om, lm = O.merge(oa, la, ob, lb)
    np.testing.assert_allclose(om, o, atol=1e-12)
    np.testing.assert_allclose(lm, l, atol=1e-12)
    om, lm = O.merge(oa, np.full_like(la, np.inf), ob, lb)
    np.testing.assert_allclose(om, ob, atol=1e-12)
    om, lm = O.merge(oa, np.full_like(la, -np.inf), ob, np.full_like(lb, np.inf))
    assert (om == 0).all() and np.isneginf(lm).all()


def test_blocksparse_offsets():
    # vLLM: head_sliding_step = max(1, vert_stride // num_heads); o_h = h * step + 1
    assert O.blocksparse_offsets(4, 4, 8) == [1, 3, 5, 7]
    assert O.blocksparse_offsets(4, 4, 8, homo_head=True) == [1, 1, 1, 1]
    assert O.blocksparse_offsets(4, 2, 8, homo_head_group=True) == [1, 1, 5, 5]
    assert O.blocksparse_offsets(2, 2, 8, tp_rank=1, total_heads=4) == [5, 7]
