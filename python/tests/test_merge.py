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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_merge_vllm_signature_tokens_without_context(backend, rng, dtype):
    """vLLM's merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
    output_lse=None, prefill_tokens_with_context=None, output_scale=None), positional or by
    keyword: tokens from prefill_tokens_with_context on take suffix_output verbatim and
    output_lse = suffix_lse as given (vLLM's CUDA kernel and Triton fallback), the others are
    merged; output_scale (fp8 output) is NotImplementedError; backend stays keyword-only."""
    dt = DTYPES[dtype]
    T, H, D, P = 12, 3, 16, 9
    po, so = randn(rng, (T, H, D), dt), randn(rng, (T, H, D), dt)
    pl = rng.standard_normal((H, T)).astype(np.float32)
    sl = rng.standard_normal((H, T)).astype(np.float32)
    pl[:, P:] = np.nan  # garbage where there is no prefix: never read
    sl[0, T - 1] = np.inf  # an FA2-style +inf on the suffix side is passed through there
    full, full_lse = np.empty((T, H, D), dt), np.empty((H, T), np.float32)
    pa.merge_attn_states(full, po, np.nan_to_num(pl, nan=-np.inf), so, sl, full_lse,
                         backend=backend)
    for call in ("positional", "keyword"):
        out = np.full((T, H, D), np.nan, np.float32).astype(dt)
        lse = np.full((H, T), np.nan, np.float32)
        if call == "positional":
            r = pa.merge_attn_states(out, po, pl, so, sl, lse, P, None, backend=backend)
        else:
            r = pa.merge_attn_states(output=out, prefix_output=po, prefix_lse=pl,
                                     suffix_output=so, suffix_lse=sl, output_lse=lse,
                                     prefill_tokens_with_context=P, output_scale=None,
                                     backend=backend)
        assert r is out
        np.testing.assert_array_equal(out[:P].view(np.uint8), full[:P].view(np.uint8))
        np.testing.assert_array_equal(lse[:, :P], full_lse[:, :P])
        np.testing.assert_array_equal(out[P:].view(np.uint8), so[P:].view(np.uint8))
        np.testing.assert_array_equal(lse[:, P:], sl[:, P:])
        assert lse[0, T - 1] == np.inf
    # None and num_tokens merge every token; 0 copies every token
    for p in (None, T):
        out = np.empty((T, H, D), dt)
        pa.merge_attn_states(out, po, np.nan_to_num(pl, nan=-np.inf), so, sl, None, p, None)
        np.testing.assert_array_equal(out.view(np.uint8), full.view(np.uint8))
    out = np.empty((T, H, D), dt)
    pa.merge_attn_states(out, po, pl, so, sl, None, np.int32(0))
    np.testing.assert_array_equal(out.view(np.uint8), so.view(np.uint8))
    # errors, nothing written
    out = np.zeros((T, H, D), dt)
    for bad, exc in ((T + 1, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(exc, match="prefill_tokens_with_context"):
            pa.merge_attn_states(out, po, pl, so, sl, None, bad)
    with pytest.raises(TypeError, match="keyword-only"):
        pa.merge_attn_states(out, po, pl, so, sl, None, backend)
    with pytest.raises(NotImplementedError, match="output_scale"):
        pa.merge_attn_states(out, po, pl, so, sl, None, None, np.ones(1, np.float32))
    assert not out.view(np.uint8).any()
