"""torch CPU tensors go through the same calls without copies (skipped when torch is absent)."""

import numpy as np
import pytest

import oracle as O
import pagedattn as pa

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_varlen_paged_and_cache_write(backend, dtype):
    tdt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    H, Hkv, D, bs, nb = 4, 2, 32, 8, 6
    kc = torch.full((nb, bs, Hkv, D), float("nan"), dtype=tdt)
    vc = torch.full((nb, bs, Hkv, D), float("nan"), dtype=tdt)
    T = 11
    key = torch.randn(T, Hkv, D, generator=g).to(tdt)
    value = torch.randn(T, Hkv, D, generator=g).to(tdt)
    table = torch.tensor([[4, 1]], dtype=torch.int32)
    slots = torch.tensor([int(table[0, i // bs]) * bs + i % bs for i in range(T)],
                         dtype=torch.int64)
    pa.reshape_and_cache_flash(key, value, kc, vc, slots)
    q = torch.randn(T, H, D, generator=g).to(tdt)
    out = torch.empty_like(q)
    r, lse = pa.flash_attn_varlen_func(q, kc, vc, T, torch.tensor([0, T], dtype=torch.int32), T,
                                       seqused_k=torch.tensor([T], dtype=torch.int32),
                                       causal=True, block_table=table, out=out,
                                       return_softmax_lse=True, backend=backend)
    assert r is out and isinstance(lse, torch.Tensor) and lse.shape == (H, T)
    f = lambda t: t.float().numpy().astype(np.float64)  # noqa: E731
    ro, rl = O.attention(f(q), f(key), f(value), np.arange(T), scale=D ** -0.5)
    O.assert_close(f(out), ro, O.BF16 if dtype == "bfloat16" else np.float32)
    O.lse_close(lse.numpy(), rl.T, atol=1e-3)


def test_torch_impl_forward(backend):
    be = pa.get_attn_backend(backend)
    H, D, bs = 2, 16, 4
    impl = be.get_impl_cls()(H, D, 0.25)
    cache = torch.zeros(be.get_kv_cache_shape(4, bs, H, D), dtype=torch.float16)
    md = be.make_metadata(seq_lens=torch.tensor([6]), query_lens=torch.tensor([6]),
                          block_tables=torch.tensor([[2, 0]]), block_size=bs)
    x = torch.randn(6, H * D).half()
    out = impl.forward(x, x, x, cache, md)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16
    assert torch.equal(cache[0, 2].reshape(bs, H * D), x[:4])
