"""merge_attn_states (vLLM test_merge_attn_states) against the oracle."""

import numpy as np
import pytest

import oracle as O
import pagedattn as pa
from util import DTYPES, randn


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(256, 4, 32), (613, 8, 48), (17, 3, 128)])
def test_merge_attn_states(backend, rng, dtype, shape):
    dt = DTYPES[dtype]
    T, H, D = shape
    pa_out = randn(rng, (T, H, D), dt)
    sa_out = randn(rng, (T, H, D), dt)
    p_lse = rng.standard_normal((H, T)).astype(np.float32)
    s_lse = rng.standard_normal((H, T)).astype(np.float32)
    # ~10% +inf on either side (never both), and some rows empty on both sides (-inf)
    m = rng.random((H, T))
    p_lse[m < 0.1] = np.inf
    s_lse[(m >= 0.1) & (m < 0.2)] = np.inf
    p_lse[(m >= 0.2) & (m < 0.22)] = -np.inf
    s_lse[(m >= 0.2) & (m < 0.22)] = -np.inf
    out = np.full((T, H, D), np.nan, np.float32).astype(dt)
    out_lse = np.full((H, T), np.nan, np.float32)
    r = pa.merge_attn_states(out, pa_out, p_lse, sa_out, s_lse, out_lse, backend=backend)
    assert r is out
    eo, el = O.merge(pa_out, p_lse.T, sa_out, s_lse.T)
    tol = dict(atol=1e-3, rtol=1e-3) if dt != O.BF16 else dict(atol=1e-2, rtol=1e-2)
    O.assert_close(out, eo, dt, **tol)
    O.lse_close(out_lse, el.T, atol=1e-5)


def test_merge_splits_of_attention(rng):
    """Attention over [0, a) merged with attention over [a, n) equals attention over [0, n)."""
    H, D, n = 4, 32, 50
    q = randn(rng, (3, H, D), np.float32)
    k = randn(rng, (n, H, D), np.float32)
    v = randn(rng, (n, H, D), np.float32)
    cu = np.array([0, 3], np.int32)
    whole, wl = pa.flash_attn_varlen_func(q, k, v, 3, cu, n, np.array([0, n], np.int32),
                                          causal=False, return_softmax_lse=True)
    oa, la = pa.flash_attn_varlen_func(q, k[:20], v[:20], 3, cu, 20, np.array([0, 20], np.int32),
                                       causal=False, return_softmax_lse=True)
    ob, lb = pa.flash_attn_varlen_func(q, k[20:], v[20:], 3, cu, 30, np.array([0, 30], np.int32),
                                       causal=False, return_softmax_lse=True)
    out = np.empty_like(whole)
    lse = np.empty_like(wl)
    pa.merge_attn_states(out, oa, la, ob, lb, lse)
    np.testing.assert_allclose(out, whole, atol=2e-5)
    np.testing.assert_allclose(lse, wl, atol=2e-5)
