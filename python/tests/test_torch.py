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


def test_torch_kvcache_merge_and_block_ops(backend):
    g = torch.Generator().manual_seed(1)
    B, Sq, H, Hkv, D, bs, nb = 2, 3, 4, 2, 16, 4, 8
    kc = torch.zeros(nb, bs, Hkv, D, dtype=torch.bfloat16)
    vc = torch.zeros(nb, bs, Hkv, D, dtype=torch.bfloat16)
    q = torch.randn(B, Sq, H, D, generator=g).bfloat16()
    kn = torch.randn(B, Sq, Hkv, D, generator=g).bfloat16()
    vn = torch.randn(B, Sq, Hkv, D, generator=g).bfloat16()
    bt = torch.tensor([[0, 1], [5, 6]], dtype=torch.int32)
    seqlens = torch.tensor([0, 2], dtype=torch.int32)
    out, lse = pa.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens,
                                          block_table=bt, causal=True, return_softmax_lse=True,
                                          backend=backend)
    assert out.dtype == torch.bfloat16 and lse.shape == (B, H, Sq)
    f = lambda t: t.float().numpy().astype(np.float64)  # noqa: E731
    for b in range(B):
        n = int(seqlens[b]) + Sq
        pos = np.arange(n)
        tb = bt[b].numpy()
        K = f(kc[torch.from_numpy(tb[pos // bs].astype(np.int64)), torch.from_numpy(pos % bs)])
        V = f(vc[torch.from_numpy(tb[pos // bs].astype(np.int64)), torch.from_numpy(pos % bs)])
        ro, rl = O.attention(f(q[b]), K, V, n - Sq + np.arange(Sq), scale=D ** -0.5)
        O.assert_close(f(out[b]), ro, O.BF16)
        O.lse_close(lse[b].numpy(), rl.T, atol=1e-3)
    # merge
    T = 5
    a, c = torch.randn(T, H, D, generator=g), torch.randn(T, H, D, generator=g)
    la, lc = torch.randn(H, T, generator=g), torch.randn(H, T, generator=g)
    o = torch.empty(T, H, D)
    ol = torch.empty(H, T)
    pa.merge_attn_states(o, a, la, c, lc, ol)
    eo, el = O.merge(a.numpy(), la.numpy().T, c.numpy(), lc.numpy().T)
    np.testing.assert_allclose(o.numpy(), eo, atol=1e-5)
    np.testing.assert_allclose(ol.numpy(), el.T, atol=1e-5)
    # block ops on a [2, num_blocks, ...] cache
    be = pa.get_attn_backend(backend)
    cache = torch.randn(be.get_kv_cache_shape(nb, bs, Hkv, D), generator=g)
    ref = cache.clone()
    be.copy_blocks([cache], torch.tensor([[0, 7]]))
    ref[:, 7] = ref[:, 0]
    assert torch.equal(cache, ref)
    dst = torch.zeros_like(cache)
    be.swap_blocks(cache, dst, torch.tensor([[3, 1]]))
    assert torch.equal(dst[:, 1], cache[:, 3]) and (dst[:, 0] == 0).all()


def test_torch_fp8_cache_uint8(backend):
    g = torch.Generator().manual_seed(2)
    T, H, D, bs, nb = 6, 2, 16, 4, 2
    key = torch.randn(T, H, D, generator=g)
    kc = torch.zeros(nb, bs, H, D, dtype=torch.uint8)
    vc = torch.zeros(nb, bs, H, D, dtype=torch.uint8)
    slots = torch.arange(T, dtype=torch.int64)
    pa.reshape_and_cache_flash(key, key, kc, vc, slots, "fp8", torch.tensor(0.5), 0.5)
    want = O.fp8_encode(key.numpy(), "fp8", 0.5)
    got = kc.reshape(-1, H, D)[:T].numpy()
    np.testing.assert_array_equal(got, want)


def test_torch_fa3_descales_expanded(backend):
    """vLLM's call: layer._k_scale (one element) .expand((num_seqs, num_kv_heads)) as k_descale."""
    g = torch.Generator().manual_seed(3)
    H, Hkv, D, bs, nb = 4, 2, 32, 4, 6
    kc = torch.zeros(nb, bs, Hkv, D, dtype=torch.uint8)
    vc = torch.zeros(nb, bs, Hkv, D, dtype=torch.uint8)
    klens = [7, 10]
    keys = torch.randn(sum(klens), Hkv, D, generator=g)
    vals = torch.randn(sum(klens), Hkv, D, generator=g)
    slots = torch.tensor(list(range(7)) + list(range(8, 18)), dtype=torch.int64)
    pa.reshape_and_cache_flash(keys, vals, kc, vc, slots, "fp8", 0.25, 0.5)
    bt = torch.tensor([[0, 1, 5, 5], [2, 3, 4, 5]], dtype=torch.int32)
    q = torch.randn(2, H, D, generator=g, dtype=torch.float32).to(torch.bfloat16)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    seqused = torch.tensor(klens, dtype=torch.int32)
    shape = (2, Hkv)
    common = dict(max_seqlen_q=1, cu_seqlens_q=cu_q, max_seqlen_k=10, seqused_k=seqused,
                  causal=True, block_table=bt, kv_cache_dtype="fp8", backend=backend)
    got = pa.flash_attn_varlen_func(q, kc, vc, q_descale=torch.ones(1).expand(shape),
                                    k_descale=torch.tensor([0.25]).expand(shape),
                                    v_descale=torch.tensor([0.5]).expand(shape), **common)
    want = pa.flash_attn_varlen_func(q, kc, vc, k_scale=0.25, v_scale=0.5, **common)
    assert torch.equal(got, want)
    with pytest.raises(NotImplementedError):
        pa.flash_attn_varlen_func(q, kc, vc, k_descale=torch.tensor([[0.25, 0.5], [0.25, 0.25]]),
                                  **common)


def test_torch_cache_in_stride_order(backend):
    """A torch cache allocated as vLLM does from get_kv_cache_stride_order (the permuted shape,
    permuted back) gives the same bits as a contiguous one, written and read."""
    be = pa.get_attn_backend(backend)
    H, Hkv, D, bs, nb = 4, 2, 32, 8, 6
    shape = be.get_kv_cache_shape(nb, bs, Hkv, D)
    order = be.get_kv_cache_stride_order()
    inv = tuple(int(i) for i in np.argsort(order))
    flat = torch.full(shape, float("nan"), dtype=torch.bfloat16)
    perm = torch.full([shape[i] for i in order], float("nan"), dtype=torch.bfloat16).permute(*inv)
    assert perm.shape == flat.shape and (backend != "cpu" or not perm.is_contiguous())
    g = torch.Generator().manual_seed(1)
    T = 13
    key = torch.randn(T, Hkv, D, generator=g).to(torch.bfloat16)
    value = torch.randn(T, Hkv, D, generator=g).to(torch.bfloat16)
    slots = torch.tensor([(5 - i // bs) * bs + i % bs for i in range(T)], dtype=torch.int64)
    for c in (flat, perm):
        pa.reshape_and_cache_flash(key, value, c[0], c[1], slots)
    assert torch.equal(perm.contiguous().view(torch.int16), flat.view(torch.int16))
    q = torch.randn(1, 2, H, D, generator=g).to(torch.bfloat16)
    table = torch.tensor([[5, 4]], dtype=torch.int32)
    sl = torch.tensor([T - 2], dtype=torch.int32)
    outs = [pa.flash_attn_with_kvcache(q, c[0], c[1], cache_seqlens=sl, block_table=table,
                                       causal=True, backend=backend) for c in (flat, perm)]
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    assert not torch.isnan(outs[0].float()).any()


def _same_as_numpy(impl, md, q, k, v, out, kv, kv_np, T):
    """The step of a v1 torch call (bf16 tensors, fp8 cache with scales 0.5 / 0.25, metadata
    md, whose output was `out` and cache `kv`) repeated over numpy arrays, starting from the
    cache kv_np held before it: the same output rows and cache bits."""
    import types
    nmd = {name: getattr(md, name) for name in ("num_actual_tokens", "causal")}
    for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping"):
        nmd[name] = getattr(md, name).numpy()
    f = lambda t: t.view(torch.int16).numpy().view(O.BF16)  # noqa: E731
    out_np = np.empty((T,) + tuple(out.shape[1:]), O.BF16)
    impl.forward(types.SimpleNamespace(_k_scale_float=0.5, _v_scale_float=0.25), f(q), f(k),
                 f(v), kv_np, nmd, output=out_np)
    np.testing.assert_array_equal(f(out[:T]), out_np)
    np.testing.assert_array_equal(kv.numpy(), kv_np)


def test_torch_v1_layer_form(backend):
    """vLLM v1's call: forward(layer, ...) with torch metadata, a tensor scale on the layer and
    padded rows; the same bits as the numpy arrays of the same step."""
    import types
    be = pa.get_attn_backend(backend)
    g = torch.Generator().manual_seed(1)
    H, Hkv, D, bs, nb = 4, 2, 32, 8, 12
    kv = torch.full(tuple(be.get_kv_cache_shape(nb, bs, Hkv, D)), 0x7F, dtype=torch.uint8)
    impl = be.get_impl_cls()(H, D, 0.25, Hkv, None, None, "fp8", None, "decoder", None)
    seq_lens = [9, 5]  # a decode of 1 token (its context written first), a prefill of 5
    table = torch.tensor([[3, 7, 0], [10, 0, 0], [0, 0, 0]], dtype=torch.int32)  # + a padding row
    pos0 = torch.arange(8)
    layer = types.SimpleNamespace(_k_scale=torch.tensor(0.5), _v_scale=torch.tensor(0.25))
    ctx_k, ctx_v = torch.randn(8, Hkv, D, generator=g), torch.randn(8, Hkv, D, generator=g)
    pa.reshape_and_cache_flash(ctx_k, ctx_v, kv[0], kv[1],
                               (table[0, pos0 // bs] * bs + pos0 % bs).long(),
                               kv_cache_dtype="fp8", k_scale=0.5, v_scale=0.25)
    # the decode's token 8 goes to block table[0][1] = 7, offset 0; the prefill's to block 10
    slots = torch.tensor([7 * bs] + [10 * bs + i for i in range(5)] + [-1, -1],
                         dtype=torch.int64)
    md = types.SimpleNamespace(num_actual_tokens=6, query_start_loc=torch.tensor([0, 1, 6, 6],
                               dtype=torch.int32), seq_lens=torch.tensor(seq_lens + [0],
                               dtype=torch.int32), block_table=table, slot_mapping=slots,
                               causal=True)
    q = torch.randn(8, H, D, generator=g).to(torch.bfloat16)
    k = torch.randn(8, Hkv, D, generator=g).to(torch.bfloat16)
    v = torch.randn(8, Hkv, D, generator=g).to(torch.bfloat16)
    out = torch.full((8, H, D), 5.0, dtype=torch.bfloat16)
    kv_np = kv.numpy().copy()
    assert impl.forward(layer, q, k, v, kv, md, output=out) is out
    assert bool((out[6:] == 5.0).all())
    _same_as_numpy(impl, md, q, k, v, out, kv, kv_np, 6)
    assert be.supports_dtype(torch.bfloat16) and not be.supports_dtype(torch.float64)


def test_torch_v1_cross_layer(backend):
    """A cross-attention layer under vLLM v1 with torch tensors (fp8 cross cache, bf16
    activations): the encoder K/V of the second request written through the v1 slots, the
    first request's already cached; the same output and cache bits as the numpy arrays of the
    same step."""
    import types
    be = pa.get_attn_backend(backend)
    g = torch.Generator().manual_seed(2)
    H, Hkv, D, bs, nb = 4, 2, 32, 8, 12
    kv = torch.full(tuple(be.get_kv_cache_shape(nb, bs, Hkv, D)), 0x7F, dtype=torch.uint8)
    impl = be.get_impl_cls()(H, D, 0.25, Hkv, None, None, "fp8", None, "encoder_decoder")
    enc = [11, 9]
    table = torch.tensor([[4, 1, 0], [9, 6, 0], [0, 0, 0]], dtype=torch.int32)  # + padding row
    p0, p1 = torch.arange(enc[0]), torch.arange(enc[1])
    pa.reshape_and_cache_flash(torch.randn(enc[0], Hkv, D, generator=g),
                               torch.randn(enc[0], Hkv, D, generator=g), kv[0], kv[1],
                               (table[0, p0 // bs] * bs + p0 % bs).long(), kv_cache_dtype="fp8",
                               k_scale=0.5, v_scale=0.25)
    slots = (table[1, p1 // bs] * bs + p1 % bs).long()
    md = types.SimpleNamespace(num_actual_tokens=4, query_start_loc=torch.tensor(
        [0, 3, 4, 4], dtype=torch.int32), seq_lens=torch.tensor(enc + [0], dtype=torch.int32),
        block_table=table, slot_mapping=slots, causal=False)
    layer = types.SimpleNamespace(_k_scale=torch.tensor(0.5), _v_scale=torch.tensor(0.25))
    q = torch.randn(6, H, D, generator=g).to(torch.bfloat16)
    k = torch.randn(enc[1], Hkv * D, generator=g).to(torch.bfloat16)
    v = torch.randn(enc[1], Hkv * D, generator=g).to(torch.bfloat16)
    out = torch.full((6, H, D), 5.0, dtype=torch.bfloat16)
    kv_np = kv.numpy().copy()
    assert impl.forward(layer, q, k, v, kv, md, output=out) is out
    assert bool((out[4:] == 5.0).all())
    assert not np.array_equal(kv.numpy(), kv_np)  # the second request's K/V went in
    _same_as_numpy(impl, md, q, k, v, out, kv, kv_np, 4)


def test_torch_impl_forward_strided_inputs(backend):
    """torch rows as vLLM hands them over (a split of the fused QKV projection), expanded
    (stride 0) and every other row: the same bits as contiguous copies."""
    be = pa.get_attn_backend(backend)
    g = torch.Generator().manual_seed(3)
    H, Hkv, D, bs, nb = 4, 2, 16, 8, 8
    impl = be.get_impl_cls()(H, D, 0.25, Hkv)
    md = be.make_metadata_builder(bs).build(seq_lens=[5, 6], query_lens=[5, 1],
                                            block_tables=[[2], [6]])
    T = 6
    qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=g).to(torch.bfloat16)
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    wide = torch.randn(2 * T, H, D, generator=g).to(torch.bfloat16)
    cases = {"fused qkv split": (q, k, v),
             "expanded q, 3-D": (wide[:1].expand(T, H, D), k.reshape(T, Hkv, D),
                                 v.reshape(T, Hkv, D)),
             "every other row, 3-D": (wide[::2], k.reshape(T, Hkv, D), v.reshape(T, Hkv, D))}
    for name, (qq, kk, vv) in cases.items():
        res = []
        for a, b, c in ((qq, kk, vv), (qq.contiguous(), kk.contiguous(), vv.contiguous())):
            cache = torch.zeros(tuple(be.get_kv_cache_shape(nb, bs, Hkv, D)), dtype=torch.bfloat16)
            res.append((impl.forward(a, b, c, cache, md), cache))
        assert torch.equal(res[0][0].reshape(T, -1), res[1][0].reshape(T, -1)), name
        assert torch.equal(res[0][1], res[1][1]), name


def test_torch_vllm_current_call_forms(backend):
    """vLLM's current calls on torch tensors: kv_cache_dtype "bfloat16" over a bf16 cache,
    merge_attn_states with prefill_tokens_with_context (its 7th positional argument), and
    swap_blocks(src, dst, block_size_in_bytes, mapping) over int8 byte views of GPU pages and
    CPU blocks of two pages (vLLM's CPU offload worker)."""
    g = torch.Generator().manual_seed(5)
    T, H, Hkv, D, bs, nb = 6, 4, 2, 16, 4, 4
    phys = torch.zeros(2, nb, Hkv, bs, D, dtype=torch.bfloat16)  # vLLM's allocation
    kc = phys.permute(0, 1, 3, 2, 4)
    key = torch.randn(T, Hkv, D, generator=g).to(torch.bfloat16)
    slots = torch.tensor([0, 5, -1, 9, 10, 15])
    pa.reshape_and_cache_flash(key, key, kc[0], kc[1], slots, "bfloat16", torch.tensor(1.0),
                               torch.tensor(1.0))
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(kc[0, s // bs, s % bs], key[t])
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        pa.reshape_and_cache_flash(key.half(), key.half(), kc[0].half(), kc[1].half(), slots,
                                   "bfloat16")
    # merge: the last 2 tokens have no context
    po, so = (torch.randn(T, H, D, generator=g).to(torch.bfloat16) for _ in range(2))
    pl, sl = torch.randn(H, T, generator=g), torch.randn(H, T, generator=g)
    out, lse = torch.empty(T, H, D, dtype=torch.bfloat16), torch.empty(H, T)
    pa.merge_attn_states(out, po, pl, so, sl, lse, T - 2, None, backend=backend)
    full, full_lse = torch.empty_like(out), torch.empty_like(lse)
    pa.merge_attn_states(full, po, pl, so, sl, full_lse)
    assert torch.equal(out[:T - 2], full[:T - 2])
    assert torch.equal(lse[:, :T - 2], full_lse[:, :T - 2])
    assert torch.equal(out[T - 2:], so[T - 2:]) and torch.equal(lse[:, T - 2:], sl[:, T - 2:])
    # swap_blocks over byte views, CPU block ids counting pages
    page = kc[0, 0].numel() * kc.element_size()
    gpu = phys.view(torch.int8).view(2 * nb, page)  # (the 2 halves' blocks, as one pool)
    cpu = torch.zeros(3, 2 * page, dtype=torch.int8)
    pa.swap_blocks(gpu, cpu, page, torch.tensor([[1, 1], [2, 5]]), backend=backend)
    assert torch.equal(cpu[0, page:], gpu[1]) and torch.equal(cpu[2, page:], gpu[2])
    assert not cpu[0, :page].any() and not cpu[1].any()
