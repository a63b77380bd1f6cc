"""FlashAttention- and vLLM-compatible calls over the pagedattn C library.

Arrays are numpy arrays (float32, float16, ml_dtypes.bfloat16; fp8 caches as uint8) or torch CPU
tensors; they are passed to the library by pointer and strides, without copies.
"""

import ctypes
import inspect
import math

import numpy as np

from . import _arrays as A
from . import _attn
from . import _core as C
from . import _lib as L

__all__ = ["flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_func",
           "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
           "reshape_and_cache_flash",
           "copy_blocks", "swap_blocks", "merge_attn_states"]


def _window(window_size):
    if window_size is None:
        return (-1, -1)
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError("window_size must be a pair (left, right), got %r" % (window_size,))
    # (a negative side is unbounded, -1 or not, as FlashAttention's kernels take it)
    left, right = int(left), int(right)
    return (max(left, -1), max(right, -1))


def _softcap(softcap):
    # (FlashAttention: "anything > 0 activates softcapping"; 0 and below are off)
    sc = float(softcap or 0.0)
    if not math.isfinite(sc):
        raise ValueError("softcap must be finite (<= 0 = off), got %r" % (softcap,))
    return sc if sc > 0 else 0.0


def _scale(softmax_scale, head_size):
    if softmax_scale is None:
        if head_size < 1:
            raise ValueError("head_size must be >= 1, got %d" % head_size)
        return 1.0 / math.sqrt(head_size)
    s = float(softmax_scale)
    if not (s > 0 and math.isfinite(s)):
        raise ValueError("softmax_scale must be finite and > 0, got %r" % (softmax_scale,))
    return s


def _alibi(alibi_slopes, num_heads, batch):
    if alibi_slopes is None:
        return None
    a = alibi_slopes
    if A.is_torch(a):
        a = a.detach().float().cpu().numpy()
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 1 and a.shape[0] == num_heads:
        return np.ascontiguousarray(a)
    if a.ndim == 2 and a.shape == (batch, num_heads):
        if batch == 1 or np.all(a == a[0:1]):
            return np.ascontiguousarray(a[0])
        return np.ascontiguousarray(a)
    raise ValueError("alibi_slopes must have shape [num_heads] = [%d] or [batch, num_heads] = "
                     "[%d, %d], got %s" % (num_heads, batch, num_heads, a.shape))


def _new_out(out, q, shape, name="out"):
    if out is None:
        obj = A.empty_like_rows(q, shape, q.kind)
        return obj, A.view(obj, name)
    ov = None
    if len(shape) == 3 and tuple(getattr(out, "shape", ())) == tuple(shape):
        ov = A.rows_fast(out, shape[1], shape[2], output=True)  # (ordinary rows: the same View)
    if ov is None:
        ov = A.float_view(out, name, write=True)
    if ov.shape != tuple(shape):
        raise ValueError("%s must have shape %s, got %s" % (name, tuple(shape), ov.shape))
    if ov.kind != q.kind:
        raise ValueError("%s dtype %s differs from q dtype %s" % (name, ov.dtype_name(),
                                                                   q.dtype_name()))
    return out, ov


def _check_heads(H, Hkv, D, Dk):
    if Dk != D:
        raise ValueError("head_size of q (%d) and of k/v (%d) differ" % (D, Dk))
    if H < 1 or Hkv < 1 or H % Hkv:
        raise ValueError("num_heads (%d) must be a multiple of num_kv_heads (%d)" % (H, Hkv))


def _sinks(s_aux, num_heads):
    if s_aux is None:
        return None
    return A.floats(s_aux, "s_aux", num_heads)


def _layer_options(window_size, softcap, softmax_scale, D, alibi_slopes, H, B, s_aux, k_scale, v_scale):
    """The per-call options both entry points take, checked: window, soft-cap, scale, ALiBi
    slopes, sinks and the fp8 scales."""
    return (_window(window_size), _softcap(softcap), _scale(softmax_scale, D), _alibi(alibi_slopes, H, B),
            _sinks(s_aux, H), A.scalar(k_scale, "k_scale"), A.scalar(v_scale, "v_scale"))


def _lse_varlen(lse_obj, lv, total_q):
    """lse [num_heads, total_q]: token stride 1, head stride = its row stride."""
    hs = lv.strides[0] if lv.shape[0] > 1 else total_q
    ts = lv.strides[1] if total_q > 1 else 1

    def fill(start, n):
        lse_obj[:, start:start + n] = -math.inf

    def put(start, n, vals):  # vals [n, H]
        _attn.as_numpy(lv)[:, start:start + n] = vals.T

    return (lse_obj, lv.ptr, ts, hs, fill, put)


def _compat(dropout_p, return_attn_probs, q_descale, k_descale, v_descale, k_scale, v_scale):
    """FlashAttention keywords without an effect here, checked: dropout must be 0; fp8
    descales of FA3 ([batch, num_kv_heads], or one element) are the cache scales: one value
    repeated (as vLLM expands its per-tensor scales); different values are refused."""
    if dropout_p not in (None, 0, 0.0):
        raise NotImplementedError("dropout_p = %r: pagedattn is an inference library; only 0 is "
                                  "supported" % (dropout_p,))
    if q_descale is not None and A.uniform_scalar(q_descale, "q_descale") != 1.0:
        raise NotImplementedError("fp8 queries (q_descale) are not supported")
    if k_descale is not None:
        k_scale = A.uniform_scalar(k_descale, "k_descale")
    if v_descale is not None:
        v_scale = A.uniform_scalar(v_descale, "v_descale")
    return k_scale, v_scale


def _is_index_array(x):
    if x is None or isinstance(x, (int, float, np.integer, np.floating)):
        return False
    if A.is_torch(x):
        return x.dim() == 1
    return np.ndim(x) == 1


# upstream FlashAttention 2's positional order of flash_attn_varlen_func
_UPSTREAM_VARLEN_ORDER = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                          "max_seqlen_k", "dropout_p", "softmax_scale", "causal", "window_size",
                          "softcap", "alibi_slopes", "deterministic", "return_attn_probs",
                          "block_table")


def flash_attn_varlen_func(*args, **kwargs):
    # An index array in the 4th position (the fork's max_seqlen_q) is upstream FlashAttention's
    # order, (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
    # softmax_scale, causal, ...): its positional arguments are bound by upstream's names.
    if len(args) > 3 and _is_index_array(args[3]):
        if len(args) > len(_UPSTREAM_VARLEN_ORDER):
            raise TypeError("flash_attn_varlen_func (upstream FlashAttention's order) takes at "
                            "most %d positional arguments, got %d"
                            % (len(_UPSTREAM_VARLEN_ORDER), len(args)))
        bound = dict(zip(_UPSTREAM_VARLEN_ORDER, args))
        for key in kwargs:
            if key in bound:
                raise TypeError("flash_attn_varlen_func() got multiple values for argument %r "
                                "(positional arguments in upstream FlashAttention's order)" % key)
        bound.update(kwargs)
        return _flash_attn_varlen(**bound)
    return _flash_attn_varlen(*args, **kwargs)


def _flash_attn_varlen(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None,
                       seqused_k=None, q_v=None, dropout_p=0.0, softmax_scale=None, causal=False,
                       window_size=None, softcap=0.0, alibi_slopes=None, deterministic=False,
                       return_attn_probs=False, block_table=None, return_softmax_lse=False,
                       out=None, scheduler_metadata=None, q_descale=None, k_descale=None,
                       v_descale=None, num_splits=0, output_scale=None, fa_version=2, s_aux=None,
                       cp_world_size=1, cp_rank=0, cp_tot_seqused_k=None, mask_mod=None,
                       block_sparse_tensors=None, aux_tensors=None,
                       aux_tensor_leading_dims=None, dynamic_causal=None, *,
                       kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0, backend=None, **ignored):
    """Variable-length attention, as vLLM's flash-attention fork's ``flash_attn_varlen_func``.

    The positional order is the fork's (``vllm_flash_attn/flash_attn_interface.py``): ``q, k,
    v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k, seqused_k, q_v, dropout_p,
    softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
    return_attn_probs, block_table, return_softmax_lse, out, scheduler_metadata, q_descale,
    k_descale, v_descale, num_splits, output_scale, fa_version, s_aux, cp_world_size, cp_rank,
    cp_tot_seqused_k, mask_mod, block_sparse_tensors, aux_tensors, aux_tensor_leading_dims,
    dynamic_causal``; pagedattn's own arguments (``kv_cache_dtype``, ``k_scale``, ``v_scale``,
    ``backend``) are keyword-only.

    Args:
        q: ``[total_q, num_heads, head_size]`` float32/float16/bfloat16; sequence i owns rows
            ``cu_seqlens_q[i]:cu_seqlens_q[i+1]``.
        k, v: without ``block_table``, packed keys/values ``[total_k, num_kv_heads, head_size]``
            indexed by ``cu_seqlens_k``; with ``block_table``, the paged caches
            ``[num_blocks, block_size, num_kv_heads, head_size]`` (uint8 for fp8 caches).
        max_seqlen_q, max_seqlen_k: upper bounds of the lengths (hints; unused).
        cu_seqlens_q: int32 ``[batch + 1]`` query offsets.
        cu_seqlens_k: int32 ``[batch + 1]`` key offsets (packed) or cumulative key lengths.
        seqused_k: int32 ``[batch]`` key length of each sequence (paged: required unless
            ``cu_seqlens_k`` gives the lengths).
        softmax_scale: logit scale, default ``1/sqrt(head_size)``.
        causal: bottom-right aligned causal mask (query row t of a sequence with q_len queries
            and k_len keys sits at key position ``k_len - q_len + t``).
        window_size: ``(left, right)`` local window; a negative side (-1) is unbounded.
        softcap: logits soft-cap; 0 or below is off (FlashAttention: "anything > 0 activates").
        alibi_slopes: float32 ``[num_heads]`` or ``[batch, num_heads]``.
        block_table: int32 ``[batch, max_blocks_per_seq]`` (paged mode).
        return_softmax_lse: also return the natural-log LSE ``[num_heads, total_q]`` float32.
        out: optional output ``[total_q, num_heads, head_size]`` of q's dtype.
        s_aux: optional per-head attention-sink logits ``[num_heads]``.
        kv_cache_dtype: ``"auto"``, ``"bfloat16"``/``"float16"`` (an unquantized cache of
            exactly that dtype, as vLLM names it) or, for uint8 caches, ``"fp8"``/``"fp8_e4m3"``/
            ``"fp8_e5m2"``.
        k_scale, v_scale: fp8 dequantization scales.
        backend: library backend name (``"reference"``, ``"cpu"``, ...); default: the best
            available one that supports the configuration (or ``$PAGEDATTN_BACKEND``).

    Returns:
        ``out``, or ``(out, lse)`` with ``return_softmax_lse``. Rows that see no key get 0 and
        an LSE of -inf (the sink's logit with ``s_aux``).

    Compatibility: upstream FlashAttention 2's positional order ``(q, k, v, cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
    softcap, alibi_slopes, deterministic, return_attn_probs, block_table)`` is recognized (an
    index array in the ``max_seqlen_q`` slot); ``dropout_p`` must be 0; ``deterministic`` is
    accepted (every backend is deterministic); ``return_attn_probs=True`` returns ``(out, lse,
    None)``; ``k_descale``/``v_descale`` are the fp8 cache scales (FlashAttention 3's ``[batch,
    num_kv_heads]`` shape is accepted when every element is the same value, as vLLM's expanded
    per-tensor scales are; ``q_descale`` must be 1); the tuning keywords (``fa_version``,
    ``num_splits``, ``scheduler_metadata``) are ignored. The fork's other keywords are taken
    at their neutral values only, anything else being NotImplementedError: ``q_v`` (FA3's
    separate value-side query of MLA) None, ``output_scale`` (FA4's fp8 output quantization)
    None, context parallelism ``cp_world_size=1``, ``cp_rank=0``, ``cp_tot_seqused_k=None``,
    and FA4's mask modifiers ``mask_mod``, ``block_sparse_tensors``, ``aux_tensors``,
    ``aux_tensor_leading_dims``, ``dynamic_causal`` None.

    Raises:
        ValueError for bad shapes/dtypes/arguments, NotImplementedError for a configuration the
        chosen backend lacks, MemoryError when the library runs out of memory, RuntimeError
        for a device failure or an internal error of the library (DEVICE_ERROR, INTERNAL).
    """
    _check_ignored(ignored)
    _fork_neutral(q_v, output_scale, cp_world_size, cp_rank, cp_tot_seqused_k, mask_mod,
                  block_sparse_tensors, aux_tensors, aux_tensor_leading_dims, dynamic_causal)
    k_scale, v_scale = _compat(dropout_p, return_attn_probs, q_descale, k_descale, v_descale,
                               k_scale, v_scale)
    if return_attn_probs:
        return_softmax_lse = True
    qv = A.rows_fast(q, q.shape[1], q.shape[2]) if len(getattr(q, "shape", ())) == 3 else None
    if qv is None:
        qv = A.float_view(q, "q")
        A.check_ndim(qv, "q", 3, "[total_q, num_heads, head_size]")
        qv = A.input_rows(qv, "q")
    total_q, H, D = qv.shape
    cu_q = A.to_np(cu_seqlens_q, np.int64, "cu_seqlens_q", 1)
    if cu_q.size < 2:
        raise ValueError("cu_seqlens_q must have batch + 1 >= 2 entries, got %d" % cu_q.size)
    B = cu_q.size - 1
    qlens = np.diff(cu_q)
    if cu_q[0] != 0 or np.any(qlens < 0) or cu_q[-1] > total_q:
        raise ValueError("cu_seqlens_q must start at 0, be non-decreasing and end at most at "
                         "total_q = %d; got %s" % (total_q, cu_q.tolist()))
    kv_ = A.view(k, "k")
    vv_ = A.view(v, "v")
    win, sc, scale, alibi, sinks, ks, vs = _layer_options(window_size, softcap, softmax_scale, D, alibi_slopes,
                                                          H, B, s_aux, k_scale, v_scale)
    same_rows = None
    if block_table is not None:
        cdt = C.cache_dtype_of(kv_, kv_cache_dtype, "k")
        C.cache_dtype_of(vv_, kv_cache_dtype, "v")
        cache = C.paged_cache(kv_, vv_, cdt, "k", "v")
        _check_heads(H, cache.num_kv_heads, D, cache.head_size)
        src = _attn.Source(cache, kv_, vv_, cache.block_size, cache.num_blocks)
        bt = A.to_np(block_table, np.int32, "block_table", 2)
        if bt.shape[0] != B:
            raise ValueError("block_table has %d rows for %d sequences" % (bt.shape[0], B))
        if seqused_k is not None:
            klens = A.to_np(seqused_k, np.int64, "seqused_k", 1)
            if klens.size != B:
                raise ValueError("seqused_k has %d entries for %d sequences" % (klens.size, B))
        elif cu_seqlens_k is not None:
            cu_k = A.to_np(cu_seqlens_k, np.int64, "cu_seqlens_k", 1)
            if cu_k.size != B + 1:
                raise ValueError("cu_seqlens_k has %d entries for %d sequences" % (cu_k.size, B))
            klens = np.diff(cu_k)
        else:
            raise ValueError("with block_table, give seqused_k (or cu_seqlens_k)")
        if np.any(klens < 0):
            raise ValueError("key lengths must be >= 0, got %s" % klens.tolist())
        cap = bt.shape[1] * cache.block_size
        if B and int(klens.max()) > cap:
            raise ValueError("a key length (%d) exceeds the block table's capacity (%d blocks "
                             "of %d)" % (int(klens.max()), bt.shape[1], cache.block_size))
        seqs = _attn.paged_seqs(cu_q[:-1], qlens, klens, bt, contiguous=True)
    else:
        if kv_.ndim != 3 or vv_.ndim != 3:
            raise ValueError("without block_table, k and v must be packed [total_k, num_kv_heads, "
                             "head_size]; got shapes %s, %s" % (kv_.shape, vv_.shape))
        kv_, vv_ = A.input_rows(kv_, "k"), A.input_rows(vv_, "v")
        cdt = C.cache_dtype_of(kv_, kv_cache_dtype, "k")
        C.cache_dtype_of(vv_, kv_cache_dtype, "v")
        _check_heads(H, kv_.shape[1], D, kv_.shape[2])
        if cu_seqlens_k is None:
            raise ValueError("without block_table, cu_seqlens_k is required")
        cu_k = A.to_np(cu_seqlens_k, np.int64, "cu_seqlens_k", 1)
        if cu_k.size != B + 1:
            raise ValueError("cu_seqlens_k has %d entries for %d sequences" % (cu_k.size, B))
        klens_full = np.diff(cu_k)
        if cu_k[0] < 0 or np.any(klens_full < 0) or cu_k[-1] > kv_.shape[0]:
            raise ValueError("cu_seqlens_k must be non-negative, non-decreasing and end at most at "
                             "total_k = %d; got %s" % (kv_.shape[0], cu_k.tolist()))
        klens = klens_full
        if seqused_k is not None:
            su = A.to_np(seqused_k, np.int64, "seqused_k", 1)
            if su.size != B or np.any(su < 0) or np.any(su > klens_full):
                raise ValueError("seqused_k must hold %d lengths within cu_seqlens_k's" % B)
            klens = su
        src = _attn.packed_source(kv_, vv_, cu_k, cdt)
        seqs = _attn.packed_seqs(cu_q[:-1], qlens, klens, cu_k[:-1], kv_.shape[0], contiguous=True)
        if (not causal and (win != (-1, -1) or alibi is not None) and
                np.array_equal(cu_q, cu_k) and np.array_equal(klens, qlens) and
                cdt in (L.PA_DTYPE_F32, L.PA_DTYPE_F16, L.PA_DTYPE_BF16) and kv_.shape[0] > 0):
            same_rows = (kv_, vv_)

    out_obj, ov = _new_out(out, qv, (total_q, H, D))
    lse_obj = lse = None
    if return_softmax_lse:
        lse_obj = A.empty_f32(qv, (H, total_q))
        lv = A.view(lse_obj, "lse")
        lse = _lse_varlen(lse_obj, lv, total_q)
    def pad_rows():  # rows past the last sequence belong to none: 0 and -inf
        if cu_q[-1] < total_q:
            A.fill_rows(ov, int(cu_q[-1]), total_q - int(cu_q[-1]), 0)
            if lse is not None:
                lse[4](int(cu_q[-1]), total_q - int(cu_q[-1]))

    _attn.run(qv, ov, lse, src, seqs, causal=bool(causal), window=win, scale=scale, softcap=sc,
              alibi=alibi, sinks=sinks, cache_dtype=cdt, k_scale=ks, v_scale=vs, backend=backend,
              same_rows_kv=same_rows, before_write=pad_rows)
    if return_attn_probs:
        return out_obj, lse_obj, None
    if return_softmax_lse:
        return out_obj, lse_obj
    return out_obj


flash_attn_varlen_func.__doc__ = _flash_attn_varlen.__doc__
flash_attn_varlen_func.__signature__ = inspect.signature(_flash_attn_varlen)


def _fork_neutral(q_v, output_scale, cp_world_size, cp_rank, cp_tot_seqused_k, mask_mod,
                  block_sparse_tensors, aux_tensors, aux_tensor_leading_dims, dynamic_causal):
    """The fork's keywords pagedattn takes at their neutral values only."""
    if q_v is not None:
        raise NotImplementedError("q_v (FlashAttention 3's separate value-side query, used by "
                                  "MLA) is not supported by pagedattn; pass q_v=None")
    if output_scale is not None:
        raise NotImplementedError("output_scale (FlashAttention 4's fp8 quantization of the "
                                  "output) is not supported: pagedattn writes the output in q's "
                                  "dtype; pass output_scale=None")
    try:
        cp = (int(cp_world_size), int(cp_rank))
    except (TypeError, ValueError):
        raise ValueError("cp_world_size and cp_rank must be integers, got %r and %r"
                         % (cp_world_size, cp_rank))
    if cp != (1, 0) or cp_tot_seqused_k is not None:
        raise NotImplementedError("context parallelism (cp_world_size=%r, cp_rank=%r, "
                                  "cp_tot_seqused_k %s) is not supported by pagedattn: each call "
                                  "attends over the keys it is given; pass cp_world_size=1, "
                                  "cp_rank=0, cp_tot_seqused_k=None"
                                  % (cp_world_size, cp_rank,
                                     "None" if cp_tot_seqused_k is None else "given"))
    for name, val in (("mask_mod", mask_mod), ("block_sparse_tensors", block_sparse_tensors),
                      ("aux_tensors", aux_tensors),
                      ("aux_tensor_leading_dims", aux_tensor_leading_dims),
                      ("dynamic_causal", dynamic_causal)):
        if val is not None:
            raise NotImplementedError("%s (FlashAttention 4's custom masking) is not supported by "
                                      "pagedattn; pass %s=None" % (name, name))


_IGNORED = {"fa_version", "num_splits", "scheduler_metadata", "pack_gqa", "sm_margin",
            "q_v", "cache_leftpad"}


def _check_ignored(ignored):
    for key, val in ignored.items():
        if key in ("rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad", "q_v"):
            if val is not None:
                raise NotImplementedError("%s is not supported by pagedattn" % key)
            continue
        if key not in _IGNORED:
            raise TypeError("unexpected keyword argument %r" % key)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=None,
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                    return_softmax_lse=False, out=None, s_aux=None, backend=None, **ignored):
    """Dense batched attention, as FlashAttention's ``flash_attn_func``.

    Args:
        q: ``[batch, seqlen_q, num_heads, head_size]``; k, v: ``[batch, seqlen_k, num_kv_heads,
            head_size]``. Other arguments as in :func:`flash_attn_varlen_func` (causal is
            bottom-right aligned).

    Returns:
        ``out [batch, seqlen_q, num_heads, head_size]``, or with ``return_softmax_lse`` /
        ``return_attn_probs`` also the LSE ``[batch, num_heads, seqlen_q]`` (and None).
    """
    _check_ignored(ignored)
    _compat(dropout_p, return_attn_probs, None, None, None, 1.0, 1.0)
    qv = A.float_view(q, "q")
    kv_, vv_ = A.view(k, "k"), A.view(v, "v")
    A.check_ndim(qv, "q", 4, "[batch, seqlen_q, num_heads, head_size]")
    A.check_ndim(kv_, "k", 4, "[batch, seqlen_k, num_kv_heads, head_size]")
    B, Sq, H, D = qv.shape
    Sk = kv_.shape[1]
    if kv_.shape[0] != B or vv_.shape != kv_.shape:
        raise ValueError("k %s and v %s must be [batch=%d, seqlen_k, num_kv_heads, head_size]"
                         % (kv_.shape, vv_.shape, B))
    q3 = _rows_view(q, "q", None)
    k3 = _rows_view(k, "k", None)
    v3 = _rows_view(v, "v", None)
    cu_q = np.arange(B + 1, dtype=np.int32) * Sq
    cu_k = np.arange(B + 1, dtype=np.int32) * Sk
    o3 = None
    if out is not None:
        ov = A.float_view(out, "out")
        if ov.shape != (B, Sq, H, D):
            raise ValueError("out must be [%d, %d, %d, %d], got %s" % (B, Sq, H, D, ov.shape))
        o3 = _rows_view(out, "out", None)
        if o3.ptr != ov.ptr or not ov.is_contiguous():
            raise ValueError("out must be contiguous")
    res = _flash_attn_varlen(_flat(q3), _flat(k3), _flat(v3), Sq, cu_q, Sk, cu_k,
                             softmax_scale=softmax_scale, causal=causal,
                             window_size=window_size, softcap=softcap,
                             alibi_slopes=alibi_slopes, return_softmax_lse=True,
                             out=None if out is None else _flat(o3), s_aux=s_aux,
                             backend=backend)
    o, lse = res
    o = o.reshape(B, Sq, H, D) if out is None else out
    if return_attn_probs or return_softmax_lse:
        lse_b = lse.reshape(H, B, Sq).transpose(1, 0, 2)
        lse_b = lse_b.contiguous() if A.is_torch(lse_b) else np.ascontiguousarray(lse_b)
        return (o, lse_b, None) if return_attn_probs else (o, lse_b)
    return o


def _flat(v3):
    """The [B*S, H, D] array object of a row View made by _rows_view (shares memory)."""
    return v3.obj


def _rows_view_np(x, v):
    """_rows_view of a numpy [B, S, H, D] array of a float dtype whose rows are uniformly
    strided, do not overlap and hold contiguous heads (else None: the general path decides);
    v: x's View or None."""
    kind = A.NP_FLOAT.get(x.dtype)
    b, s, h, d = x.shape
    if kind is None or b * s * h * d == 0:
        return None
    item = x.itemsize
    st = x.strides
    if (d > 1 and st[3] != item) or (h > 1 and st[2] != d * item):
        return None
    row = st[1] if s > 1 else (st[0] if b > 1 else h * d * item)
    if row % item or (b > 1 and s > 1 and st[0] != s * st[1]) or (b * s > 1 and row < h * d * item):
        return None
    return A.View(x.reshape(b * s, h, d), v.ptr if v is not None else A.np_ptr(x),
                  (b * s, h, d), (row // item, d, 1), kind, item, False)


def _rows_view(x, name, shape4, v=None, copy=True):
    """[B, S, H, D] -> a [B*S, H, D] View, copying (inputs) when the rows are not uniformly
    strided, overlap, run backwards or are broadcast; with copy=False (outputs) that is a
    ValueError. v: x's View when the caller has it already."""
    if type(x) is np.ndarray and x.ndim == 4:  # the usual case, in fewer steps
        r = _rows_view_np(x, v)
        if r is not None:
            return r
    if v is None:
        v = A.float_view(x, name)
    A.check_ndim(v, name, 4, "[batch, seqlen, heads, head_size]")
    b, s, h, d = v.shape
    st = v.strides
    if b * s * h * d == 0:  # no element: strides mean nothing (numpy may give zeros)
        st = (s * h * d, h * d, d, 1)
    uniform = (b == 1 or s == 1 or st[0] == s * st[1])
    inner = (d == 1 or st[3] == 1) and (h == 1 or st[2] == d)
    row = st[1] if s > 1 else (st[0] if b > 1 else h * d)
    if not (uniform and inner and (b * s <= 1 or row >= h * d)):
        if not copy:
            raise ValueError("%s must have uniformly strided, non-overlapping rows with "
                             "contiguous heads; got strides %s for shape %s"
                             % (name, tuple(v.strides), v.shape))
        if v.torch:
            x = x.contiguous()
        else:
            x = np.ascontiguousarray(x)
        v = A.view(x, name)
        st = v.strides
        row = st[1] if s > 1 else (st[0] if b > 1 else h * d)
    # reshape makes a view (never a copy) of uniformly strided rows, in numpy and torch alike
    rows = v.obj.reshape(b * s, h, d)
    return A.View(rows, v.ptr, (b * s, h, d), (row, d, 1), v.kind, v.itemsize, v.torch)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False, window_size=None,
                            softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, out=None, s_aux=None,
                            kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0, backend=None,
                            dropout_p=0.0, q_descale=None, k_descale=None, v_descale=None,
                            **ignored):
    """Attention of a batch of queries over a KV cache, as FlashAttention's
    ``flash_attn_with_kvcache`` (decode, speculative decode, chunked prefill). The positional
    arguments are FlashAttention 2's, in its order (``q, k_cache, v_cache, k, v, rotary_cos,
    rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, softmax_scale,
    causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
    return_softmax_lse``); pagedattn's own arguments after them are keyword-only.

    Args:
        q: ``[batch, seqlen_q, num_heads, head_size]``.
        k_cache, v_cache: with ``block_table``, paged ``[num_blocks, block_size, num_kv_heads,
            head_size]``; without, dense ``[batch, seqlen_cache, num_kv_heads, head_size]``.
            uint8 for fp8 caches (see ``kv_cache_dtype``).
        k, v: optional new keys/values ``[batch, seqlen_new, num_kv_heads, head_size]``, written
            into the cache at positions ``cache_seqlens[b] ..`` before attending (in place).
        cache_seqlens: int or int32 ``[batch]``: tokens already in the cache per sequence
            (default: the whole cache capacity).
        block_table: int32 ``[batch, max_blocks_per_seq]``.
        softmax_scale, causal, window_size, softcap, alibi_slopes, s_aux, kv_cache_dtype,
        k_scale, v_scale, backend: as in :func:`flash_attn_varlen_func`. Causal is bottom-right
            aligned: query t of sequence b sits at ``cache_seqlens[b] + seqlen_new - seqlen_q + t``.
        return_softmax_lse: also return the LSE ``[batch, num_heads, seqlen_q]`` float32.
        out: optional output ``[batch, seqlen_q, num_heads, head_size]``.
        cache_batch_idx: dense caches only: int32 ``[batch]``, the cache row of each sequence
            (with ``block_table``: ValueError, as FlashAttention refuses it).
        cache_leftpad: not supported (NotImplementedError unless None).
        num_splits: a tuning knob of FlashAttention's kernels; ignored.

    Returns:
        ``out`` or ``(out, lse)``.

        rotary_cos, rotary_sin: ``[seqlen_ro, rotary_dim / 2]``: rotary embedding applied to the
            new ``k`` (at positions ``cache_seqlens[b] + i``) and to ``q`` (at
            ``cache_seqlens[b] + t`` when causal or local, else at ``cache_seqlens[b]``), as
            FlashAttention does; needs ``k``/``v``. This copies q and k (computed in float32).
        rotary_interleaved: pairs (0, 1), (2, 3)... when True; (i, i + rotary_dim / 2) (GPT-NeoX)
            when False.

    Tuning keywords (``num_splits``, ``fa_version``, ...) are ignored.
    """
    _check_ignored(ignored)
    if cache_leftpad is not None:
        raise NotImplementedError("cache_leftpad is not supported by pagedattn")
    if cache_batch_idx is not None and block_table is not None:
        raise ValueError("cache_batch_idx is for dense caches: a paged cache (block_table) "
                         "does not take it, as in FlashAttention")
    k_scale, v_scale = _compat(dropout_p, False, q_descale, k_descale, v_descale, k_scale,
                               v_scale)
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("give both rotary_cos and rotary_sin, or neither")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos/rotary_sin need the new k and v to append")
        q, k = _apply_rotary(q, k, rotary_cos, rotary_sin, cache_seqlens, rotary_interleaved,
                             causal or (window_size is not None and
                                        tuple(window_size) != (-1, -1)))
    qv = _rows_view_np(q, None) if type(q) is np.ndarray and q.ndim == 4 else None
    if qv is not None:
        B, Sq, H, D = q.shape
    else:
        qv4 = A.float_view(q, "q")
        A.check_ndim(qv4, "q", 4, "[batch, seqlen_q, num_heads, head_size]")
        B, Sq, H, D = qv4.shape
        qv = _rows_view(q, "q", qv4.shape, qv4)
    kcv = A.view(k_cache, "k_cache")
    vcv = A.view(v_cache, "v_cache")
    cdt = C.cache_dtype_of(kcv, kv_cache_dtype, "k_cache")
    C.cache_dtype_of(vcv, kv_cache_dtype, "v_cache")
    cache = C.paged_cache(kcv, vcv, cdt, "k_cache", "v_cache")
    _check_heads(H, cache.num_kv_heads, D, cache.head_size)
    BS = cache.block_size
    if block_table is not None:
        bt = A.to_np(block_table, np.int32, "block_table", 2)
        if bt.shape[0] != B:
            raise ValueError("block_table has %d rows for batch %d" % (bt.shape[0], B))
    elif cache_batch_idx is not None:
        bt = A.to_np(cache_batch_idx, np.int32, "cache_batch_idx", 1).reshape(-1, 1)
        if bt.shape[0] != B:
            raise ValueError("cache_batch_idx has %d entries for batch %d" % (bt.shape[0], B))
    else:
        if kcv.shape[0] < B:
            raise ValueError("k_cache holds %d sequences for batch %d" % (kcv.shape[0], B))
        bt = np.arange(B, dtype=np.int32).reshape(B, 1)
    cap = bt.shape[1] * BS
    if cache_seqlens is None:
        seqlens = np.full(B, cap, dtype=np.int64)
    elif isinstance(cache_seqlens, (int, np.integer)):
        seqlens = np.full(B, int(cache_seqlens), dtype=np.int64)
    else:
        seqlens = A.to_np(cache_seqlens, np.int64, "cache_seqlens").reshape(-1)
        if seqlens.size == 1 and B != 1:
            seqlens = np.repeat(seqlens, B)
        elif seqlens.size != B:
            raise ValueError("cache_seqlens must be an int or hold %d lengths" % B)
    if B and int(seqlens.min()) < 0:
        raise ValueError("cache_seqlens must be >= 0, got %s" % seqlens.tolist())
    new_kv = None
    Snew = 0
    if (k is None) != (v is None):
        raise ValueError("give both k and v, or neither")
    if k is not None:
        kv4, vv4 = A.float_view(k, "k"), A.float_view(v, "v")
        kn = _rows_view(k, "k", None, kv4)
        vn = _rows_view(v, "v", None, vv4)
        Snew = kv4.shape[1]
        if kv4.shape[0] != B or vv4.shape[:2] != (B, Snew):
            raise ValueError("k and v must be [batch=%d, seqlen_new, num_kv_heads, head_size]; got "
                             "%s and %s" % (B, kv4.shape, vv4.shape))
        if kn.shape[1:] != (cache.num_kv_heads, D) or vn.shape != kn.shape:
            raise ValueError("k/v heads and head_size must match the cache (%d, %d); got %s, %s"
                             % (cache.num_kv_heads, D, kn.shape, vn.shape))
        if kn.kind != vn.kind:
            raise ValueError("k and v dtypes differ")
        pos = seqlens[:, None] + np.arange(Snew)[None, :]
        if B and int(pos.max(initial=-1)) >= cap:
            raise ValueError("cache_seqlens + seqlen_new exceeds the cache capacity (%d tokens)"
                             % cap)
        slots = (bt[np.arange(B)[:, None], pos // BS].astype(np.int64) * BS + pos % BS).reshape(-1)
        new_kv = (kn, vn, slots)
        A.require_writable(kcv, "k_cache")  # the new keys and values go into the cache
        A.require_writable(vcv, "v_cache")
    klens = seqlens + Snew
    if B and int(klens.max()) > cap:
        raise ValueError("cache_seqlens (max %d) exceed the cache capacity (%d tokens)"
                         % (int(klens.max()), cap))
    win, sc, scale, alibi, sinks, ks, vs = _layer_options(window_size, softcap, softmax_scale, D, alibi_slopes,
                                                          H, B, s_aux, k_scale, v_scale)
    src = _attn.Source(cache, kcv, vcv, BS, cache.num_blocks)
    seqs = _attn.paged_seqs(np.arange(B, dtype=np.int64) * Sq, Sq, klens, bt, contiguous=True)
    # output [B, Sq, H, D]
    ov4 = ov = None
    if out is None:
        out_obj = A.empty_like_rows(qv, (B, Sq, H, D), qv.kind)
    else:
        out_obj = out
        if type(out) is np.ndarray and out.shape == (B, Sq, H, D) and out.flags.writeable and \
                A.NP_FLOAT.get(out.dtype) == qv.kind:
            ov = _rows_view_np(out, None)
        if ov is None:
            ov4 = A.float_view(out, "out", write=True)
            if ov4.shape != (B, Sq, H, D) or ov4.kind != qv.kind:
                raise ValueError("out must be [%d, %d, %d, %d] of q's dtype; got %s %s"
                                 % (B, Sq, H, D, ov4.shape, ov4.dtype_name()))
    if ov is None:
        ov = _rows_view(out_obj, "out", None, ov4, copy=False)
    lse = None
    lse_tmp = None
    if return_softmax_lse:
        lse_tmp = np.empty((B * Sq, H), dtype=np.float32)

        def fill(start, n):
            lse_tmp[start:start + n] = -math.inf

        def put(start, n, vals):
            lse_tmp[start:start + n] = vals

        lse = (lse_tmp, lse_tmp.ctypes.data, H, 1, fill, put)
    # the forward call writes the new K/V itself when it can (one validation, then writes);
    # otherwise the cache write goes first, after everything else was validated
    direct = (new_kv is not None and causal and Snew == Sq and B * Sq > 0 and
              bool(np.all(klens >= Sq)) and
              (alibi is None or alibi.ndim == 1) and
              new_kv[0].kind in (L.PA_DTYPE_F32, L.PA_DTYPE_F16, L.PA_DTYPE_BF16))
    def write():
        _cache_write(cache, new_kv[0], new_kv[1], new_kv[2], ks, vs, cdt, backend)

    _attn.run(qv, ov, lse, src, seqs, causal=bool(causal), window=win, scale=scale, softcap=sc,
              alibi=alibi, sinks=sinks, cache_dtype=cdt, k_scale=ks, v_scale=vs, backend=backend,
              new_kv=new_kv if direct else None,
              before_write=write if new_kv is not None and not direct else None)
    if return_softmax_lse:
        lse_arr = lse_tmp.reshape(B, Sq, H).transpose(0, 2, 1)
        if qv.torch:
            torch = A.torch_module()
            return out_obj, torch.from_numpy(np.ascontiguousarray(lse_arr))
        return out_obj, np.ascontiguousarray(lse_arr)
    return out_obj


def _from_numpy_like(a, like_torch):
    if not like_torch:
        return a
    torch = A.torch_module()
    if a.dtype == A.np_dtype(L.PA_DTYPE_BF16):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def _rotate(x, cos, sin, pos, interleaved):
    """FlashAttention's rotary embedding of x [S, H, D] at positions pos [S] (float32 math)."""
    rd = cos.shape[1] * 2
    if rd > x.shape[-1]:
        raise ValueError("rotary_dim %d exceeds head_size %d" % (rd, x.shape[-1]))
    if len(pos) and (pos.max() >= cos.shape[0] or pos.min() < 0):
        raise ValueError("rotary_cos/rotary_sin have %d positions; position %d needed"
                         % (cos.shape[0], int(pos.max())))
    xf = x.astype(np.float32)
    c = cos[pos][:, None, :]
    s_ = sin[pos][:, None, :]
    out = xf.copy()
    if interleaved:
        x1, x2 = xf[..., 0:rd:2], xf[..., 1:rd:2]
        out[..., 0:rd:2] = x1 * c - x2 * s_
        out[..., 1:rd:2] = x1 * s_ + x2 * c
    else:
        h = rd // 2
        x1, x2 = xf[..., :h], xf[..., h:rd]
        out[..., :h] = x1 * c - x2 * s_
        out[..., h:rd] = x1 * s_ + x2 * c
    return out.astype(x.dtype)


def _apply_rotary(q, k, cos, sin, cache_seqlens, interleaved, positional_q):
    qv, kv_ = A.float_view(q, "q"), A.float_view(k, "k")
    A.check_ndim(qv, "q", 4, "[batch, seqlen_q, num_heads, head_size]")
    A.check_ndim(kv_, "k", 4, "[batch, seqlen_new, num_kv_heads, head_size]")
    B, Sq = qv.shape[:2]
    Snew = kv_.shape[1]
    cosn = A.to_np_float(cos, "rotary_cos")
    sinn = A.to_np_float(sin, "rotary_sin")
    if cosn.ndim != 2 or cosn.shape != sinn.shape:
        raise ValueError("rotary_cos and rotary_sin must be [seqlen_ro, rotary_dim / 2] alike; "
                         "got %s and %s" % (cosn.shape, sinn.shape))
    if cache_seqlens is None:
        off = np.zeros(B, np.int64)
    elif isinstance(cache_seqlens, (int, np.integer)):
        off = np.full(B, int(cache_seqlens), np.int64)
    else:
        off = np.broadcast_to(A.to_np(cache_seqlens, np.int64, "cache_seqlens").reshape(-1),
                              (B,)).copy()
    Qn = np.ascontiguousarray(_attn.as_numpy(qv))
    Kn = np.ascontiguousarray(_attn.as_numpy(kv_))
    qr = np.empty_like(Qn)
    kr = np.empty_like(Kn)
    for b in range(B):
        qpos = off[b] + (np.arange(Sq) if positional_q else np.zeros(Sq, np.int64))
        qr[b] = _rotate(Qn[b], cosn, sinn, qpos, interleaved)
        kr[b] = _rotate(Kn[b], cosn, sinn, off[b] + np.arange(Snew), interleaved)
    return _from_numpy_like(qr, qv.torch), _from_numpy_like(kr, kv_.torch)


def _ctx_for(backend):
    return L.get_context(backend) if backend else None


def _cache_write(cache, kn, vn, slots, ks, vs, cdt, backend):
    fp8 = cdt in (L.PA_DTYPE_FP8_E4M3, L.PA_DTYPE_FP8_E5M2)
    if not fp8:
        ks = vs = 1.0
    slots = np.ascontiguousarray(slots, dtype=np.int64)
    ctx = _ctx_for(backend)
    krs, vrs = A.check_rows(kn, "key"), A.check_rows(vn, "value")

    def call():
        return L.lib.pa_cache_write(ctx.handle if ctx else None, ctypes.byref(cache), kn.kind,
                                    kn.ptr, krs, vn.ptr, vrs,
                                    A.ptr(slots, ctypes.c_int64), slots.size, ks, vs)

    if ctx:
        with ctx.lock:
            L.check(call(), "reshape_and_cache_flash")
    else:
        L.check(call(), "reshape_and_cache_flash")


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto",
                            k_scale=1.0, v_scale=1.0, backend=None):
    """Writes new keys/values into a paged cache, as vLLM's ``reshape_and_cache_flash``.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_size]`` float32/float16/bfloat16 (rows may
            be strided, e.g. views of a fused QKV buffer).
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_size]`` of the
            cache dtype (uint8 for fp8), any strides with a contiguous head_size dim.
        slot_mapping: int64 ``[num_tokens]``; token i goes to block ``slot // block_size``, offset
            ``slot % block_size``; negative slots are skipped. It may hold fewer entries than
            ``key`` has rows (vLLM V1 pads key and value for CUDA graphs, not slot_mapping): its
            length is the number of tokens written, as in vLLM.
        kv_cache_dtype: ``"auto"`` (cache dtype = its array dtype), ``"bfloat16"``/``"float16"``
            (vLLM's names for an unquantized cache of that dtype: the cache must have it, else
            ValueError) or ``"fp8"``/``"fp8_e4m3"``/``"fp8_e5m2"`` (uint8 cache; stored value =
            fp8(x / scale), saturating).
        k_scale, v_scale: fp8 quantization scales (ignored for non-fp8 caches).
        backend: optional backend name whose context runs the copy (default: calling thread).

    Raises ValueError for a bad slot (out of the pool, or twice) and bad shapes; on error the
    cache is left untouched.
    """
    kn = A.float_view(key, "key")
    vn = A.float_view(value, "value")
    A.check_ndim(kn, "key", 3, "[num_tokens, num_kv_heads, head_size]")
    A.check_ndim(vn, "value", 3, "[num_tokens, num_kv_heads, head_size]")
    kn, vn = A.input_rows(kn, "key"), A.input_rows(vn, "value")
    if kn.shape != vn.shape or kn.kind != vn.kind:
        raise ValueError("key %s %s and value %s %s must have the same shape and dtype"
                         % (kn.shape, kn.dtype_name(), vn.shape, vn.dtype_name()))
    kcv = A.view(key_cache, "key_cache", write=True)
    vcv = A.view(value_cache, "value_cache", write=True)
    cdt = C.cache_dtype_of(kcv, kv_cache_dtype, "key_cache")
    C.cache_dtype_of(vcv, kv_cache_dtype, "value_cache")
    cache = C.paged_cache(kcv, vcv, cdt)
    if kn.shape[1:] != (cache.num_kv_heads, cache.head_size):
        raise ValueError("key has %s heads x head_size; the cache has (%d, %d)"
                         % (kn.shape[1:], cache.num_kv_heads, cache.head_size))
    slots = A.to_np(slot_mapping, np.int64, "slot_mapping", 1)
    if slots.size > kn.shape[0]:
        raise ValueError("slot_mapping has %d entries for %d tokens" % (slots.size, kn.shape[0]))
    _cache_write(cache, kn, vn, slots, A.scalar(k_scale, "k_scale"), A.scalar(v_scale, "v_scale"),
                 cdt, backend)


# ---- block copies -------------------------------------------------------------------------------

_ITEM_DTYPE = {1: L.PA_DTYPE_FP8_E4M3, 2: L.PA_DTYPE_F16, 4: L.PA_DTYPE_F32}


def _block_geometry(v, name):
    """(num_blocks, block_stride, block_elems) of a pool whose blocks are contiguous."""
    if v.ndim < 2:
        raise ValueError("%s must be at least 2-D [num_blocks, ...], got shape %s" % (name, v.shape))
    inner = A.View(None, v.ptr, v.shape[1:], v.strides[1:], v.kind, v.itemsize, v.torch)
    if not _dense(inner.shape, inner.strides):
        raise ValueError("%s: each block must fill one contiguous span of memory (shape %s, "
                         "strides %s)" % (name, v.shape, v.strides))
    elems = inner.size()
    stride = v.strides[0] if v.shape[0] > 1 else elems
    return v.shape[0], stride, elems


def _dense(shape, strides):
    """Whether the elements occupy one contiguous span exactly, in any dim order (e.g. an HND
    block viewed as NHD): blocks are then copied as whole byte ranges."""
    dims = sorted((st, n) for n, st in zip(shape, strides) if n != 1)
    expect = 1
    for st, n in dims:
        if st != expect:
            return False
        expect *= n
    return True


def _pool_dtype(v, name):
    if isinstance(v.kind, int):
        return v.kind
    if v.itemsize in _ITEM_DTYPE:
        return _ITEM_DTYPE[v.itemsize]  # bytes are copied as they are
    raise ValueError("%s: dtype %s (itemsize %d) is not supported" % (name, v.kind, v.itemsize))


def _head_split(elems):
    """A (num_kv_heads, head_size) factorization of a contiguous block, head_size <= 512."""
    for d in range(min(512, elems), 0, -1):
        if elems % d == 0:
            return elems // d, d
    return elems, 1


def _opaque_cache(kptr, vptr, dtype, nb, stride, elems):
    h, d = _head_split(elems)
    c = L.pa_cache()
    c.key, c.value = kptr, vptr
    c.dtype = dtype
    c.memory = L.PA_MEMORY_HOST
    c.num_blocks, c.block_size, c.num_kv_heads, c.head_size = nb, 1, h, d
    c.block_stride, c.token_stride, c.head_stride = stride, h * d, d
    return c


def _pool_cache(kv, vv, kname, vname):
    """pa_cache treating each block of the two pools as opaque contiguous bytes."""
    nb, ks, ke = _block_geometry(kv, kname)
    nbv, vs, ve = _block_geometry(vv, vname)
    kd = _pool_dtype(kv, kname)
    _pool_dtype(vv, vname)  # validates the value dtype too (bytes are copied as they are)
    if kv.itemsize != vv.itemsize or nb != nbv or ke != ve or (nb > 1 and ks != vs):
        raise ValueError("%s (shape %s, strides %s) and %s (shape %s, strides %s) must have the "
                         "same geometry" % (kname, kv.shape, kv.strides, vname, vv.shape,
                                            vv.strides))
    return _opaque_cache(kv.ptr, vv.ptr, kd, nb, ks, ke)


def _single_pool_cache(pv, name):
    """pa_cache over one pool: key = first half of each block, value = second half (of its
    elements, or of its bytes where the count of 2- or 4-byte elements is odd); None where a
    block holds an odd number of bytes."""
    nb, st, e = _block_geometry(pv, name)
    dt = _pool_dtype(pv, name)
    if e % 2 == 0:
        return _opaque_cache(pv.ptr, pv.ptr + (e // 2) * pv.itemsize, dt, nb, st, e // 2)
    if e * pv.itemsize % 2 == 0:  # (the copy moves bytes: a 1-byte dtype over half the bytes)
        hb = e * pv.itemsize // 2
        return _opaque_cache(pv.ptr, pv.ptr + hb, _ITEM_DTYPE[1], nb, st * pv.itemsize, hb)
    return None


def _same_block_order(a, b, aname, bname):
    """Refuses pools whose blocks hold the same logical shape in different element orders (an HND
    block viewed as NHD beside a plain NHD one): blocks are copied as bytes, which would move
    every element to another place (found by an audit, bench/NOTES.md fortieth pass)."""
    da = [(n, st) for n, st in zip(a.shape[1:], a.strides[1:]) if n != 1]
    db = [(n, st) for n, st in zip(b.shape[1:], b.strides[1:]) if n != 1]
    if da != db:
        raise ValueError("%s (shape %s, element strides %s) and %s (shape %s, element strides %s) "
                         "lay out their blocks in different orders; blocks are copied as bytes, so "
                         "both pools need the same layout (e.g. both from the same allocation call)"
                         % (aname, a.shape, a.strides, bname, b.shape, b.strides))


def _pairs(block_mapping, name="block_mapping"):
    bm = A.to_np(block_mapping, np.int64, name)
    if bm.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if bm.ndim != 2 or bm.shape[1] != 2:
        raise ValueError("%s must be [num_pairs, 2] (src, dst), got shape %s" % (name, bm.shape))
    return np.ascontiguousarray(bm)


def copy_blocks(key_caches, value_caches, block_mapping, backend=None):
    """Copies blocks inside every layer's caches, as vLLM's ``copy_blocks`` (copy-on-write).

    Args:
        key_caches, value_caches: lists (one entry per layer) of pools ``[num_blocks, ...]``
            whose blocks are contiguous (flash layout ``[num_blocks, block_size, num_kv_heads,
            head_size]``, vLLM's paged layouts, uint8 fp8 caches: blocks are copied as bytes).
        block_mapping: int64 ``[num_pairs, 2]`` of (src, dst) block ids. A source may feed
            several destinations; a destination appears once and is never a source.
        backend: optional backend name whose context runs the copy.

    Every id is validated against every layer before anything is copied.
    """
    if len(key_caches) != len(value_caches):
        raise ValueError("key_caches has %d layers, value_caches %d"
                         % (len(key_caches), len(value_caches)))
    pairs = _pairs(block_mapping)
    n = len(key_caches)
    if n == 0:
        return
    arr = (L.pa_cache * n)()
    for i, (kc, vc) in enumerate(zip(key_caches, value_caches)):
        arr[i] = _pool_cache(A.view(kc, "key_caches[%d]" % i, write=True),
                             A.view(vc, "value_caches[%d]" % i, write=True),
                             "key_caches[%d]" % i, "value_caches[%d]" % i)
    ctx = _ctx_for(backend)
    p = A.ptr(pairs, ctypes.c_int64)
    if ctx:
        with ctx.lock:
            L.check(L.lib.pa_cache_copy_blocks(ctx.handle, arr, n, p, pairs.shape[0]), "copy_blocks")
    else:
        L.check(L.lib.pa_cache_copy_blocks(None, arr, n, p, pairs.shape[0]), "copy_blocks")


def _is_byte_count(x):
    """Whether swap_blocks' third argument is vLLM's block_size_in_bytes (an integer) rather than
    the older form's block_mapping (an array)."""
    if isinstance(x, (bool, np.bool_)):
        return False
    if isinstance(x, (int, np.integer)):
        return True
    if A.is_torch(x):
        return (x.dim() == 0 and not x.dtype.is_floating_point and not x.dtype.is_complex and
                x.dtype is not A.torch_module().bool)
    if isinstance(x, np.ndarray):
        return x.ndim == 0 and x.dtype.kind in "iu"
    return False


def _byte_chunk_cache(v, name, nbytes):
    """pa_cache over pool v cut into chunks of nbytes bytes, as vLLM's
    ``swap_blocks(src, dst, block_size_in_bytes, mapping)`` addresses it (chunk i at byte
    ``i * nbytes``): a whole block (nbytes = the block's size; the pool's own block stride is
    used) or, for a pool whose blocks follow each other without gaps, an exact fraction of one
    (vLLM's CPU offload copies GPU pages to and from CPU blocks of several pages that way).
    Key = first half of each chunk's bytes, value = the second half."""
    nb, stride, elems = _block_geometry(v, name)
    block_bytes = elems * v.itemsize
    if nbytes == block_bytes:
        count, stride_bytes = nb, stride * v.itemsize
    elif nbytes < block_bytes and block_bytes % nbytes == 0 and (nb <= 1 or stride == elems):
        count, stride_bytes = nb * (block_bytes // nbytes), nbytes
    else:
        why = ("a whole block or an exact fraction of one" if nbytes > block_bytes or
               block_bytes % nbytes else
               "a whole block here (its blocks are %d bytes apart, not adjacent, so smaller "
               "chunks would not follow each other)" % (stride * v.itemsize))
        raise ValueError("swap_blocks: block_size_in_bytes = %d does not fit %s: its blocks (shape "
                         "%s, dtype %s) hold %d bytes and block_size_in_bytes must be %s; blocks "
                         "are never copied in part" % (nbytes, name, v.shape[1:], v.dtype_name(),
                                                       block_bytes, why))
    if nbytes % 2:
        raise ValueError("swap_blocks: chunks of an odd number of bytes (%d) are not supported"
                         % nbytes)
    half = nbytes // 2
    return _opaque_cache(v.ptr, v.ptr + half, _ITEM_DTYPE[1], count, stride_bytes, half)


def swap_blocks(src, dst, block_size_in_bytes=None, block_mapping=None, *, backend=None):
    """Copies whole blocks from one pool to another, as vLLM's ``swap_blocks``
    (``dst[mapping[i, 1]] = src[mapping[i, 0]]``); call it once for keys and once for values.

    Both of vLLM's forms are taken, told apart by the third argument's type:

    - ``swap_blocks(src, dst, block_mapping)`` (vLLM before its v1 CPU offload): src and dst
      hold blocks of the same shape, dtype and element order (their block counts may differ);
      a block is ``src[i]`` (contiguous; any block stride).
    - ``swap_blocks(src, dst, block_size_in_bytes, block_mapping)`` (current vLLM; an integer
      third argument is the byte count): as vLLM's kernel does, block id i of a pool names the
      ``block_size_in_bytes`` bytes at byte ``i * block_size_in_bytes``, copied as they are (the
      pools' dtypes and shapes may differ, e.g. int8 byte views). The count must be the size of
      one block of each pool (the pool's own block stride is then used), or an exact fraction
      of a block in a pool whose blocks follow each other without gaps (vLLM's CPU offload
      copies GPU pages into CPU blocks of several pages, the CPU ids counting pages). Any other
      count is a ValueError: vLLM uses it as the block pitch too, so a smaller count is never
      read as "copy a prefix of each block", which would address other memory than vLLM does.

    Args:
        src, dst: pools ``[num_blocks, ...]`` with contiguous blocks; blocks (chunks) of an odd
            number of bytes are refused.
        block_mapping: int64 ``[num_pairs, 2]`` of (src block, dst block); destinations distinct.
        backend: keyword-only: optional backend name whose context runs the copy.
    """
    if _is_byte_count(block_size_in_bytes):
        if block_mapping is None:
            raise TypeError("swap_blocks(src, dst, block_size_in_bytes, block_mapping): "
                            "block_mapping is missing")
        if isinstance(block_mapping, str):
            raise TypeError("swap_blocks: block_mapping must be an array, got %r (backend is "
                            "keyword-only: backend=%r)" % (block_mapping, block_mapping))
        nbytes = int(block_size_in_bytes)
        if nbytes < 1:
            raise ValueError("swap_blocks: block_size_in_bytes must be >= 1, got %d" % nbytes)
        sv, dv = A.view(src, "src"), A.view(dst, "dst", write=True)
        if sv.shape[1:] == dv.shape[1:] and sv.itemsize == dv.itemsize:
            _same_block_order(sv, dv, "src", "dst")
        pairs = _pairs(block_mapping)
        sc = _byte_chunk_cache(sv, "src", nbytes)
        dc = _byte_chunk_cache(dv, "dst", nbytes)
        _swap(sc, dc, pairs, backend)
        return
    if block_size_in_bytes is None:
        if block_mapping is None:
            raise TypeError("swap_blocks() needs block_mapping: swap_blocks(src, dst, "
                            "block_mapping) or swap_blocks(src, dst, block_size_in_bytes, "
                            "block_mapping)")
    else:
        if block_mapping is not None:
            hint = (" (backend is keyword-only: backend=%r)" % (block_mapping,)
                    if isinstance(block_mapping, str) else "")
            raise TypeError("swap_blocks: the third argument is not an integer byte count, so it "
                            "is the block mapping, and a fourth (%r) cannot follow it%s"
                            % (block_mapping, hint))
        block_mapping = block_size_in_bytes
    sv, dv = A.view(src, "src"), A.view(dst, "dst", write=True)
    if sv.shape[1:] != dv.shape[1:] or sv.itemsize != dv.itemsize or sv.kind != dv.kind:
        raise ValueError("src (shape %s, %s) and dst (shape %s, %s) must have the same block shape "
                         "and dtype" % (sv.shape, sv.dtype_name(), dv.shape, dv.dtype_name()))
    _same_block_order(sv, dv, "src", "dst")
    pairs = _pairs(block_mapping)
    sc = _single_pool_cache(sv, "src")
    dc = _single_pool_cache(dv, "dst")
    if sc is None or dc is None:
        raise ValueError("swap_blocks: blocks of an odd number of bytes are not supported")
    _swap(sc, dc, pairs, backend)


def _swap(sc, dc, pairs, backend):
    ctx = _ctx_for(backend)
    p = A.ptr(pairs, ctypes.c_int64)
    if ctx:
        with ctx.lock:
            L.check(L.lib.pa_cache_swap_blocks(ctx.handle, ctypes.byref(sc), ctypes.byref(dc), p,
                                               pairs.shape[0]), "swap_blocks")
    else:
        L.check(L.lib.pa_cache_swap_blocks(None, ctypes.byref(sc), ctypes.byref(dc), p,
                                           pairs.shape[0]), "swap_blocks")


# ---- merge --------------------------------------------------------------------------------------

def _token_count(prefill_tokens_with_context, T):
    """vLLM's prefill_tokens_with_context, checked: None means every token (T)."""
    p = prefill_tokens_with_context
    if p is None:
        return T
    if A.is_torch(p) or isinstance(p, np.ndarray):
        if getattr(p, "ndim", None) == 0 or tuple(getattr(p, "shape", ())) == ():
            p = p.item()
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer)):
        hint = (" (pagedattn's backend is keyword-only: backend=%r)" % (p,)
                if isinstance(p, str) else "")
        raise TypeError("prefill_tokens_with_context must be an int or None, got %r%s"
                        % (p, hint))
    p = int(p)
    if not 0 <= p <= T:
        raise ValueError("prefill_tokens_with_context must be in [0, num_tokens = %d], got %d"
                         % (T, p))
    return p


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
                      prefill_tokens_with_context=None, output_scale=None, *, backend=None):
    """Merges two partial attentions over disjoint key sets by their LSEs, as vLLM's
    ``merge_attn_states`` (in place into ``output``), with vLLM's argument order.

    Args:
        output: ``[num_tokens, num_heads, head_size]`` float32/float16/bfloat16 (written).
        prefix_output, suffix_output: the partial outputs, same shape and dtype.
        prefix_lse, suffix_lse: float32 ``[num_heads, num_tokens]`` natural-log LSEs; +inf is
            treated as -inf (an empty part).
        output_lse: optional float32 ``[num_heads, num_tokens]`` receiving the merged LSE.
        prefill_tokens_with_context: None (every token is merged) or an int p in
            ``[0, num_tokens]``: tokens ``0 .. p-1`` are merged; tokens ``p ..`` have no prefix
            (vLLM's MLA prefill puts the requests without context last) and take
            ``suffix_output`` verbatim, with ``output_lse = suffix_lse`` as given (an FA2-style
            +inf included), whatever ``prefix_output``/``prefix_lse`` hold there, as vLLM's CUDA
            kernel and Triton fallback do.
        output_scale: vLLM's fp8 output quantization; only None is supported
            (NotImplementedError otherwise).
        backend: keyword-only: optional backend name whose context runs the merge.

    Per merged (token, head): ``M = max(a, b)``, ``wa = exp(a - M)``, ``wb = exp(b - M)``,
    ``out = (out_a * wa + out_b * wb) / (wa + wb)``, ``lse = M + log(wa + wb)`` in IEEE
    arithmetic (a NaN LSE gives NaN out and lse; a part whose weight underflows to 0 still
    multiplies in, so a NaN in its output shows); a part whose lse is -inf is empty and adds
    nothing, whatever its output holds; both parts empty gives out = 0 and lse = -inf (vLLM's
    CUDA kernel copies prefix_output there, which its callers leave at 0).

    Returns ``output``. Raises ValueError for bad shapes/dtypes or a
    ``prefill_tokens_with_context`` outside ``[0, num_tokens]``, TypeError for a non-integer one.
    """
    if output_scale is not None:
        raise NotImplementedError("merge_attn_states: output_scale (vLLM's fused fp8 "
                                  "quantization of the merged output) is not supported: pagedattn "
                                  "writes the output in the inputs' dtype; pass output_scale=None "
                                  "and quantize afterwards")
    ov = A.float_view(output, "output", write=True)
    A.check_ndim(ov, "output", 3, "[num_tokens, num_heads, head_size]")
    T, H, D = ov.shape
    P = _token_count(prefill_tokens_with_context, T)
    ins = []
    for x, n in ((prefix_output, "prefix_output"), (suffix_output, "suffix_output")):
        xv = A.float_view(x, n)
        if xv.shape != ov.shape or xv.kind != ov.kind:
            raise ValueError("%s must be %s %s like output; got %s %s"
                             % (n, ov.shape, ov.dtype_name(), xv.shape, xv.dtype_name()))
        if not xv.is_contiguous():
            x = x.contiguous() if xv.torch else np.ascontiguousarray(x)
            xv = A.view(x, n)
        ins.append(xv)
    lses = []
    for x, n in ((prefix_lse, "prefix_lse"), (suffix_lse, "suffix_lse")):
        xv = A.float_view(x, n, allowed=(L.PA_DTYPE_F32,))
        if xv.shape != (H, T):
            raise ValueError("%s must be [num_heads, num_tokens] = [%d, %d], got %s"
                             % (n, H, T, xv.shape))
        if not xv.is_contiguous():
            x = x.contiguous() if xv.torch else np.ascontiguousarray(x)
            xv = A.view(x, n)
        lses.append(xv)
    # output must be contiguous and must not alias an input: otherwise use a temporary
    tmp_out = None
    target = ov
    aliased = any(_overlaps(ov, xv) for xv in ins)
    if not ov.is_contiguous() or aliased:
        tmp_out = np.empty((T, H, D), dtype=A.np_dtype(ov.kind))
        target = A.view(tmp_out, "output")
    tmp_lse = None
    lse_target = None
    if output_lse is not None:
        lv = A.float_view(output_lse, "output_lse", allowed=(L.PA_DTYPE_F32,), write=True)
        if lv.shape != (H, T):
            raise ValueError("output_lse must be [num_heads, num_tokens] = [%d, %d], got %s"
                             % (H, T, lv.shape))
        if lv.is_contiguous() and not any(_overlaps(lv, x) for x in lses):
            lse_target = lv
        else:
            tmp_lse = np.empty((H, T), dtype=np.float32)
            lse_target = A.view(tmp_lse, "output_lse")
    if T == 0:
        return output
    ctx = _ctx_for(backend)
    if P > 0:  # the tokens with context: merged by the library (lse rows keep their stride T)
        args = L.pa_merge_args()
        args.num_tokens, args.num_heads, args.head_size, args.dtype = P, H, D, ov.kind
        args.out_a, args.out_b, args.out = ins[0].ptr, ins[1].ptr, target.ptr
        fp = ctypes.POINTER(ctypes.c_float)
        args.lse_a = ctypes.cast(ctypes.c_void_p(lses[0].ptr), fp)
        args.lse_b = ctypes.cast(ctypes.c_void_p(lses[1].ptr), fp)
        if lse_target is not None:
            args.out_lse = ctypes.cast(ctypes.c_void_p(lse_target.ptr), fp)
        args.lse_token_stride, args.lse_head_stride = 1, T
        if ctx:
            with ctx.lock:
                L.check(L.lib.pa_merge_states(ctx.handle, ctypes.byref(args)), "merge_attn_states")
        else:
            L.check(L.lib.pa_merge_states(None, ctypes.byref(args)), "merge_attn_states")
    if P < T:  # the tokens without context: the suffix as it is
        _attn.as_numpy(target)[P:] = _attn.as_numpy(ins[1])[P:]
        if lse_target is not None:
            _attn.as_numpy(lse_target)[:, P:] = _attn.as_numpy(lses[1])[:, P:]
    if tmp_out is not None:
        _attn.as_numpy(ov)[...] = tmp_out
    if tmp_lse is not None:
        _attn.as_numpy(A.view(output_lse, "output_lse"))[...] = tmp_lse
    return output


def _overlaps(a, b):
    """Whether two Views' memory ranges overlap (conservative)."""
    def extent(v):
        lo = hi = 0
        for dim, st in zip(v.shape, v.strides):
            if dim == 0:
                return (v.ptr, v.ptr)
            span = (dim - 1) * st
            if span < 0:
                lo += span
            else:
                hi += span
        return (v.ptr + lo * v.itemsize, v.ptr + (hi + 1) * v.itemsize)
    a0, a1 = extent(a)
    b0, b1 = extent(b)
    return a0 < b1 and b0 < a1


# ---- FlashAttention's packed-input variants ------------------------------------------------------

def _split(x, axis, n, name):
    v = A.view(x, name)
    if v.ndim <= axis or v.shape[axis] != n:
        raise ValueError("%s must have %d at dim %d, got shape %s" % (name, n, axis, v.shape))
    idx = [slice(None)] * v.ndim
    out = []
    for i in range(n):
        idx[axis] = i
        out.append(x[tuple(idx)])
    return out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=None, softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, backend=None,
                              **ignored):
    """FlashAttention's ``flash_attn_qkvpacked_func``: ``qkv [batch, seqlen, 3, heads, dim]``
    (views, no copies); otherwise as :func:`flash_attn_func`."""
    q, k, v = _split(qkv, 2, 3, "qkv")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, backend=backend,
                           **ignored)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=None, softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, backend=None,
                             **ignored):
    """FlashAttention's ``flash_attn_kvpacked_func``: ``kv [batch, seqlen_k, 2, kv_heads, dim]``;
    otherwise as :func:`flash_attn_func`."""
    k, v = _split(kv, 2, 2, "kv")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, backend=backend,
                           **ignored)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=None,
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, backend=None, **ignored):
    """FlashAttention's ``flash_attn_varlen_qkvpacked_func``: ``qkv [total, 3, heads, dim]``
    with ``cu_seqlens`` shared by queries and keys."""
    q, k, v = _split(qkv, 1, 3, "qkv")
    return flash_attn_varlen_func(q, k, v, max_seqlen, cu_seqlens, max_seqlen, cu_seqlens,
                                  softmax_scale=softmax_scale, causal=causal,
                                  window_size=window_size, softcap=softcap,
                                  alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                                  return_attn_probs=return_attn_probs, backend=backend,
                                  **ignored)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=None, softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, backend=None, **ignored):
    """FlashAttention's ``flash_attn_varlen_kvpacked_func`` (upstream argument order):
    ``kv [total_k, 2, kv_heads, dim]``."""
    k, v = _split(kv, 1, 2, "kv")
    return flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k,
                                  softmax_scale=softmax_scale, causal=causal,
                                  window_size=window_size, softcap=softcap,
                                  alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                                  return_attn_probs=return_attn_probs, backend=backend,
                                  **ignored)
