"""vLLM's older custom ops on its "paged" cache layout (key ``[num_blocks, num_kv_heads,
head_size / x, block_size, x]`` with ``x = 16 / element size``, value ``[num_blocks,
num_kv_heads, head_size, block_size]``): ``paged_attention_v1``/``v2``, ``reshape_and_cache`` and
``convert_fp8``.

The library reads caches whose head_size dims are contiguous, which this layout's are not; the
attention calls therefore copy the blocks a batch uses into a compact flash-layout cache first
(the cache ops write the layout directly). Prefer the flash layout and the FlashAttention-style
calls for speed.
"""

import math

import numpy as np

from . import _arrays as A
from . import _attn
from . import _core as C
from . import _lib as L

__all__ = ["paged_attention_v1", "paged_attention_v2", "reshape_and_cache", "convert_fp8",
           "context_attention_fwd"]


def _np(x, name, write=False):
    v = A.view(x, name, write)
    return _attn.as_numpy(v), v


def _cache_kind(v, kv_cache_dtype, name):
    return C.cache_dtype_of(v, kv_cache_dtype, name)


def _to_flash(key_cache, value_cache, blocks):
    """Compact copies of the given blocks, shaped [len(blocks), block_size, H, D] (the flash
    layout's shape) over HND memory, which the cpu backend reads fastest (bench/NOTES.md,
    fifteenth pass); the copy itself costs the same either way."""
    kn, _ = _np(key_cache, "key_cache")
    vn, _ = _np(value_cache, "value_cache")
    if kn.ndim != 5 or vn.ndim != 4:
        raise ValueError("key_cache must be [num_blocks, num_kv_heads, head_size / x, block_size, "
                         "x] and value_cache [num_blocks, num_kv_heads, head_size, block_size]; "
                         "got %s and %s" % (kn.shape, vn.shape))
    nb, h, dx, bs, x = kn.shape
    if vn.shape != (nb, h, dx * x, bs):
        raise ValueError("value_cache shape %s does not match key_cache %s" % (vn.shape, kn.shape))
    k = np.ascontiguousarray(kn[blocks].transpose(0, 1, 3, 2, 4))
    k = k.reshape(len(blocks), h, bs, dx * x)
    v = np.ascontiguousarray(vn[blocks].transpose(0, 1, 3, 2))
    return k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                       seq_lens, block_size, max_seq_len, alibi_slopes=None, kv_cache_dtype="auto",
                       k_scale=1.0, v_scale=1.0, tp_rank=0, blocksparse_local_blocks=0,
                       blocksparse_vert_stride=0, blocksparse_block_size=64,
                       blocksparse_head_sliding_step=0, backend=None):
    """vLLM's ``paged_attention_v1``: one query per sequence over its ``seq_lens[i]`` cached
    tokens (the query is the last of them), written into ``out`` ``[num_seqs, num_heads,
    head_size]``. Caches in vLLM's paged layout (uint8 for fp8). Block sparsity is on when
    ``blocksparse_vert_stride > 1``. Copies the used blocks to a flash-layout cache first."""
    ov = A.float_view(out, "out", write=True)
    qv = A.float_view(query, "query")
    A.check_ndim(qv, "query", 3, "[num_seqs, num_heads, head_size]")
    qv = A.input_rows(qv, "query")
    if ov.shape != qv.shape or ov.kind != qv.kind:
        raise ValueError("out must be %s %s like query" % (qv.shape, qv.dtype_name()))
    S, H, D = qv.shape
    kcv = A.view(key_cache, "key_cache")
    cdt = _cache_kind(kcv, kv_cache_dtype, "key_cache")
    bt = A.to_np(block_tables, np.int32, "block_tables", 2)
    sl = A.to_np(seq_lens, np.int64, "seq_lens", 1)
    if bt.shape[0] != S or sl.size != S:
        raise ValueError("block_tables %s and seq_lens %s must have one row per sequence (%d)"
                         % (bt.shape, sl.shape, S))
    bs = int(block_size)
    if bs < 1:
        raise ValueError("block_size must be >= 1, got %d" % bs)
    nbt = [int(-(-int(n) // bs)) for n in sl]
    if any(n < 1 for n in sl) or any(n > bt.shape[1] for n in nbt):
        raise ValueError("seq_lens must be >= 1 and fit the block tables")
    nb = kcv.shape[0]
    used = np.unique(np.concatenate([bt[i, :nbt[i]] for i in range(S)]))
    if used.size and (used.min() < 0 or used.max() >= nb):
        raise ValueError("block_tables hold block ids outside [0, %d)" % nb)
    remap = np.zeros(nb, np.int32)
    remap[used] = np.arange(used.size, dtype=np.int32)
    kc, vc = _to_flash(key_cache, value_cache, used)
    if kc.shape[1] != bs or kc.shape[2] != int(num_kv_heads) or kc.shape[3] != D:
        raise ValueError("caches hold blocks of %s; expected block_size %d, %d KV heads, "
                         "head_size %d" % (kc.shape[1:], bs, num_kv_heads, D))
    ks, vs = A.scalar(k_scale, "k_scale"), A.scalar(v_scale, "v_scale")
    fp8 = cdt in (L.PA_DTYPE_FP8_E4M3, L.PA_DTYPE_FP8_E5M2)
    sparse = None
    if int(blocksparse_vert_stride) > 1:
        sparse = (int(blocksparse_block_size), int(blocksparse_local_blocks),
                  int(blocksparse_vert_stride), 0, int(blocksparse_head_sliding_step), int(tp_rank))
    alibi = A.floats(alibi_slopes, "alibi_slopes", H)
    layer = C.get_layer(num_heads=H, num_kv_heads=int(num_kv_heads), head_size=D, scale=scale,
                        alibi_slopes=alibi, blocksparse=sparse, q_dtype=qv.kind, kv_dtype=qv.kind,
                        out_dtype=ov.kind, cache_dtype=cdt, k_scale=ks if fp8 else 1.0,
                        v_scale=vs if fp8 else 1.0)
    ctx = layer.context(backend)
    seqs = [{"context_len": int(sl[i]) - 1, "query_len": 1, "is_prefill": False,
             "block_table": remap[bt[i, :nbt[i]]]} for i in range(S)]
    batch = C.Batch(bs, max(1, used.size), seqs, slot_mapping=np.full(S, -1, np.int64))
    cache = C.paged_cache(A.view(kc, "key_cache"), A.view(vc, "value_cache"), cdt)
    qrs = A.check_rows(qv, "query")
    ors = A.check_rows(ov, "out")
    C.forward(ctx, layer, batch, qv.ptr, qrs, None, 0, None, 0, cache, ov.ptr, ors)
    return out


def paged_attention_v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
                       num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
                       alibi_slopes=None, kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0,
                       tp_rank=0, blocksparse_local_blocks=0, blocksparse_vert_stride=0,
                       blocksparse_block_size=64, blocksparse_head_sliding_step=0, backend=None):
    """vLLM's ``paged_attention_v2``: the same result as :func:`paged_attention_v1` (the
    partition buffers ``exp_sums``, ``max_logits``, ``tmp_out`` are accepted and not used: the
    library splits long sequences itself)."""
    return paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale,
                              block_tables, seq_lens, block_size, max_seq_len, alibi_slopes,
                              kv_cache_dtype, k_scale, v_scale, tp_rank, blocksparse_local_blocks,
                              blocksparse_vert_stride, blocksparse_block_size,
                              blocksparse_head_sliding_step, backend)


def _convert(dst_kind, src, src_kind, scale):
    """src (numpy, contiguous) converted by the library (fp8: quant(x / scale), saturating)."""
    src = np.ascontiguousarray(src)
    item = 1 if dst_kind in (L.PA_DTYPE_FP8_E4M3, L.PA_DTYPE_FP8_E5M2) else (
        4 if dst_kind == L.PA_DTYPE_F32 else 2)
    dst = np.empty(src.shape, dtype={1: np.uint8, 2: np.uint16, 4: np.float32}[item])
    L.check(L.lib.pa_convert(dst_kind, dst.ctypes.data, src_kind, src.ctypes.data, src.size,
                             float(scale)), "pa_convert")
    return dst


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto",
                      k_scale=1.0, v_scale=1.0):
    """vLLM's ``reshape_and_cache``: writes ``key``/``value`` ``[num_tokens, num_kv_heads,
    head_size]`` into caches of vLLM's paged layout by ``slot_mapping`` (negative = skip);
    fp8 caches (uint8) store ``fp8(x / scale)``. Everything is checked before anything is
    written."""
    kv, vv = A.float_view(key, "key"), A.float_view(value, "value")
    A.check_ndim(kv, "key", 3, "[num_tokens, num_kv_heads, head_size]")
    if vv.shape != kv.shape or vv.kind != kv.kind:
        raise ValueError("key and value must have the same shape and dtype")
    kcn, kcv = _np(key_cache, "key_cache", write=True)
    vcn, vcv = _np(value_cache, "value_cache", write=True)
    cdt = _cache_kind(kcv, kv_cache_dtype, "key_cache")
    _cache_kind(vcv, kv_cache_dtype, "value_cache")
    if kcn.ndim != 5 or vcn.ndim != 4:
        raise ValueError("key_cache must be 5-D and value_cache 4-D (vLLM's paged layout)")
    nb, h, dx, bs, x = kcn.shape
    T, H, D = kv.shape
    if (h, dx * x) != (H, D) or vcn.shape != (nb, h, D, bs):
        raise ValueError("cache shapes %s / %s do not hold [%d heads, head_size %d]"
                         % (kcn.shape, vcn.shape, H, D))
    slots = A.to_np(slot_mapping, np.int64, "slot_mapping", 1)
    if slots.size != T:
        raise ValueError("slot_mapping has %d entries for %d tokens" % (slots.size, T))
    keep = slots >= 0
    s = slots[keep]
    if s.size and s.max() >= nb * bs:
        raise ValueError("slot %d is beyond the pool's %d slots" % (int(s.max()), nb * bs))
    if np.unique(s).size != s.size:
        raise ValueError("slot_mapping writes a slot twice")
    kn = np.asarray(_attn.as_numpy(kv))[keep]
    vn = np.asarray(_attn.as_numpy(vv))[keep]
    if cdt != kv.kind:
        kn = _convert(cdt, kn, kv.kind, A.scalar(k_scale, "k_scale"))
        vn = _convert(cdt, vn, vv.kind, A.scalar(v_scale, "v_scale"))
        kn = kn.view(kcn.dtype)
        vn = vn.view(vcn.dtype)
    b, t = s // bs, s % bs
    kcn[b[:, None, None], np.arange(h)[None, :, None], np.arange(dx)[None, None, :], t[:, None, None]] = \
        kn.reshape(-1, h, dx, x)
    vcn[b[:, None, None], np.arange(h)[None, :, None], np.arange(D)[None, None, :], t[:, None, None]] = vn


def convert_fp8(dst, src, scale=1.0, kv_dtype="fp8"):
    """vLLM's ``convert_fp8``: float32/float16/bfloat16 -> uint8 fp8 (``fp8(x / scale)``,
    saturating) or uint8 fp8 -> float (``x * scale``), elementwise, by the library."""
    kind = A.FP8_NAMES.get(kv_dtype)
    if kind is None:
        raise ValueError("kv_dtype must be 'fp8', 'fp8_e4m3' or 'fp8_e5m2', got %r" % (kv_dtype,))
    dn, dv = _np(dst, "dst", write=True)
    sn, sv = _np(src, "src")
    if dn.size != sn.size:
        raise ValueError("dst and src sizes differ (%d, %d)" % (dn.size, sn.size))
    if sv.kind == "uint8":
        if not isinstance(dv.kind, int):
            raise ValueError("dst must be float32/float16/bfloat16 when src is uint8")
        res = _convert(dv.kind, sn, kind, scale)
        dn[...] = res.view(dn.dtype).reshape(dn.shape)
    else:
        if dv.kind != "uint8":
            raise ValueError("dst must be uint8 when src is a float array")
        dn[...] = _convert(kind, sn, sv.kind, scale).reshape(dn.shape)
    return dst


def context_attention_fwd(q, k, v, o, kv_cache_dtype, k_cache, v_cache, b_loc, b_start_loc,
                          b_seq_len, b_ctx_len, max_input_len, k_scale=1.0, v_scale=1.0,
                          alibi_slopes=None, sliding_window=None, sm_scale=None, backend=None):
    """vLLM's prefix-prefill ``context_attention_fwd``: the new tokens of each sequence (rows
    ``b_start_loc[i] ..`` of ``q``, ``k``, ``v``, ``[num_new, heads, head_size]``) attend to the
    sequence's ``b_ctx_len[i]`` cached tokens (read through ``b_loc``, the block tables, from
    caches in vLLM's paged layout, or in the flash layout when 4-D) and causally to the new
    tokens; the result goes to ``o``. The caches are not modified (their used blocks are copied
    and the new K/V written into the copy; an fp8 context is dequantized in the copy, and the
    new K/V are used unquantized, as the kernel does). ``sm_scale`` defaults to ``1/sqrt(head_size)`` (the
    kernel's fixed scale); ``sliding_window`` W attends W keys."""
    qv, ov = A.float_view(q, "q"), A.float_view(o, "o", write=True)
    kv, vv = A.float_view(k, "k"), A.float_view(v, "v")
    A.check_ndim(qv, "q", 3, "[num_tokens, num_heads, head_size]")
    A.check_ndim(kv, "k", 3, "[num_tokens, num_kv_heads, head_size]")
    A.check_ndim(vv, "v", 3, "[num_tokens, num_kv_heads, head_size]")
    qv, kv, vv = A.input_rows(qv, "q"), A.input_rows(kv, "k"), A.input_rows(vv, "v")
    if ov.shape != qv.shape or ov.kind != qv.kind:
        raise ValueError("o must be %s %s like q" % (qv.shape, qv.dtype_name()))
    A.check_rows(ov, "o")  # before anything is written
    T, H, D = qv.shape
    bt = A.to_np(b_loc, np.int32, "b_loc", 2)
    starts = A.to_np(b_start_loc, np.int64, "b_start_loc", 1)
    sl = A.to_np(b_seq_len, np.int64, "b_seq_len", 1)
    cl = A.to_np(b_ctx_len, np.int64, "b_ctx_len", 1)
    B = sl.size
    if bt.shape[0] != B or cl.size != B or starts.size < B:
        raise ValueError("b_loc, b_start_loc, b_seq_len and b_ctx_len must describe %d sequences"
                         % B)
    kcn, kcv = _np(k_cache, "k_cache")
    vcn, _ = _np(v_cache, "v_cache")
    cdt = _cache_kind(kcv, kv_cache_dtype, "k_cache")
    if kcn.ndim == 5:
        bs = kcn.shape[3]
    elif kcn.ndim == 4:
        bs = kcn.shape[1]
    else:
        raise ValueError("k_cache must be vLLM's paged layout (5-D) or the flash layout (4-D)")
    if bs < 1 or D < 1 or H < 1:
        raise ValueError("block_size (%d), head_size (%d) and num_heads (%d) must be >= 1"
                         % (bs, D, H))
    need = [int(-(-int(n) // bs)) for n in sl]
    if any(n > bt.shape[1] for n in need) or np.any(cl < 0) or np.any(cl > sl):
        raise ValueError("lengths exceed the block tables or contexts exceed lengths")
    used = np.unique(np.concatenate([bt[i, :need[i]] for i in range(B)] + [np.zeros(0, np.int32)]))
    nb = kcn.shape[0]
    if used.size and (used.min() < 0 or used.max() >= nb):
        raise ValueError("b_loc holds block ids outside [0, %d)" % nb)
    remap = np.zeros(nb, np.int32)
    remap[used] = np.arange(used.size, dtype=np.int32)
    if kcn.ndim == 5:
        kc, vc = _to_flash(k_cache, v_cache, used)
    else:
        kc, vc = np.ascontiguousarray(kcn[used]), np.ascontiguousarray(vcn[used])
    Hkv = kc.shape[2]
    fp8 = cdt in (L.PA_DTYPE_FP8_E4M3, L.PA_DTYPE_FP8_E5M2)
    ks, vs = A.scalar(k_scale, "k_scale"), A.scalar(v_scale, "v_scale")
    if fp8:
        # the kernel reads the context from the fp8 cache and the new tokens unquantized from
        # k/v: dequantize the copy to float32, which holds both exactly
        kc = _attn._dequant(kc, cdt, ks).astype(np.float32)
        vc = _attn._dequant(vc, cdt, vs).astype(np.float32)
        cdt, fp8 = L.PA_DTYPE_F32, False
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(D)
    alibi = A.floats(alibi_slopes, "alibi_slopes", H)
    window = (int(sliding_window) - 1, 0) if sliding_window and int(sliding_window) > 0 \
        else (-1, -1)
    layer = C.get_layer(num_heads=H, num_kv_heads=Hkv, head_size=D, scale=scale, window=window,
                        alibi_slopes=alibi, q_dtype=qv.kind, kv_dtype=kv.kind, out_dtype=ov.kind,
                        cache_dtype=cdt, k_scale=ks if fp8 else 1.0, v_scale=vs if fp8 else 1.0)
    ctx = layer.context(backend)
    seqs = []
    slots = []
    for i in range(B):
        n, c = int(sl[i]), int(cl[i])
        table = remap[bt[i, :need[i]]]
        seqs.append({"context_len": c, "query_len": n - c, "is_prefill": True,
                     "block_table": table})
        pos = np.arange(c, n)
        slots.append(table[pos // bs].astype(np.int64) * bs + pos % bs)
    if any(int(starts[i]) != sum(int(sl[j] - cl[j]) for j in range(i)) for i in range(B)):
        raise ValueError("b_start_loc must be the exclusive cumulative sum of the new lengths")
    if sum(int(n - c) for n, c in zip(sl, cl)) != T:
        raise ValueError("q has %d rows; the sequences have %d new tokens"
                         % (T, int((sl - cl).sum())))
    for x, n in ((kv, "k"), (vv, "v")):
        if x.shape != (T, Hkv, D):
            raise ValueError("%s must be [%d tokens, %d KV heads, %d] like the cache; got %s"
                             % (n, T, Hkv, D, x.shape))
    batch = C.Batch(bs, max(1, used.size), seqs, slot_mapping=np.concatenate(slots))
    cache = C.paged_cache(A.view(kc, "k_cache"), A.view(vc, "v_cache"), cdt)
    C.forward(ctx, layer, batch, qv.ptr, A.check_rows(qv, "q"), kv.ptr, A.check_rows(kv, "k"),
              vv.ptr, A.check_rows(vv, "v"), cache, ov.ptr, A.check_rows(ov, "o"))
    return o
