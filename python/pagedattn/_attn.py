"""The attention engine behind the FlashAttention-style calls.

Every call is reduced to sequences, each with a run of query rows (q_start, q_len) and a key
source of k_len keys (a block table into a paged cache view; packed K/V are a cache view with
block_size 1 whose block table is the token indices, so nothing is copied). How the FlashAttention
semantics map onto the library's attention types:

* causal=True -> decoder layer. FlashAttention aligns the causal mask bottom-right: query row t of
  a sequence with q_len queries and k_len keys sits at position p = k_len - q_len + t, which is
  the decoder's p = context_len + t with context_len = k_len - q_len. Rows with p < 0 (q_len >
  k_len) see no key: out = 0, lse = -inf, and the library runs only the rows after them. The
  cache is only read (k = v = NULL, explicit slot mapping of -1), so block tables may repeat
  blocks. A window (left, right) is the decoder's window (right is moot under causality).
* causal=False, no window, no ALiBi -> encoder_decoder (cross) layer: every query row sees all
  k_len keys of its sequence, read from the cache view through the cross block table.
* causal=False with a window or ALiBi -> encoder_only layer, whose window and symmetric ALiBi use
  p = t over the step's own rows. When q and k are the same packed rows (cu_seqlens_q ==
  cu_seqlens_k) this is direct. Otherwise (q_len != k_len, or a paged cache) each sequence's keys
  are gathered into packed rows and its queries are placed at rows k_len - q_len + t of a padded
  query block (so p matches the bottom-right alignment exactly); this copies. q_len > k_len is
  not supported in this mode (NotImplementedError).

Sequences are grouped into as few library calls as possible; a group breaks where rows are
skipped or where a per-sequence parameter (ALiBi slopes of shape [batch, num_heads]) changes.
"""


import os
import threading
from collections import OrderedDict

import numpy as np

from . import _arrays as A
from . import _core as C
from . import _lib as L


class Source:
    """Where keys come from: a pa_cache view plus, per sequence, a block table and k_len."""

    def __init__(self, cache, kview, vview, block_size, num_blocks, packed=False, cu_k=None):
        self.cache = cache
        self.kview = kview
        self.vview = vview
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.packed = packed
        self.cu_k = cu_k
        self.stand_in = None  # keeps a stand-in pool alive (packed_source of no keys)


class Seqs:
    """The sequences of one call, as columns: int64 arrays q_start, q_len, k_len of n entries,
    and their key tables in one contiguous int32 array `tab`: sequence i's table starts at
    tab[tab_off[i]] and it uses the first ceil(k_len[i] / block_size) entries. For packed keys
    (block_size 1) the table is the token indices k_start = tab_off[i] .. + k_len[i]."""

    __slots__ = ("q_start", "q_len", "k_len", "tab", "tab_off", "packed", "contiguous")

    def __init__(self, q_start, q_len, k_len, tab=None, tab_off=None, packed=False,
                 contiguous=False):
        self.k_len = k_len = np.asarray(k_len, dtype=np.int64)
        n = k_len.shape[0]
        self.q_start = np.asarray(q_start, dtype=np.int64).reshape(n)
        self.q_len = (np.full(n, q_len, dtype=np.int64) if isinstance(q_len, (int, np.integer))
                      else np.asarray(q_len, dtype=np.int64).reshape(n))
        self.tab = tab
        self.tab_off = tab_off
        self.packed = packed
        # rows follow each other: q_start[i + 1] == q_start[i] + q_len[i] (the caller knows)
        self.contiguous = contiguous

    def __len__(self):
        return self.k_len.shape[0]

    def table_len(self, block_size):
        return -(-self.k_len // block_size)

    def table(self, i, block_size):
        o = int(self.tab_off[i])
        return self.tab[o:o + -(-int(self.k_len[i]) // block_size)]

    def table_addr(self, block_size):
        """Addresses of the tables and their int32 lengths (k_len < 2**31: the caller checks).
        A sequence with no keys has length 0 at a valid address (it runs in no batch)."""
        n = self.table_len(block_size).astype(np.int32)
        return (self.tab.ctypes.data + 4 * self.tab_off).astype(np.uintp), n


def paged_seqs(q_start, q_len, k_len, bt, contiguous=False):
    """Seqs over the rows of a contiguous int32 block table bt [n, max_blocks]."""
    bt = np.ascontiguousarray(bt, dtype=np.int32)
    n, m = bt.shape
    return Seqs(q_start, q_len, k_len, bt.reshape(-1), np.arange(n, dtype=np.int64) * m,
                contiguous=contiguous)


def packed_seqs(q_start, q_len, k_len, k_start, total_k, contiguous=False):
    """Seqs over packed keys: sequence i's keys are rows k_start[i] .. + k_len[i] of total_k
    (checked here: the library reads each sequence's table, the row indices, for k_len
    entries)."""
    k_start = np.asarray(k_start, dtype=np.int64)
    k_len = np.asarray(k_len, dtype=np.int64)
    if k_len.size and (int(k_start.min()) < 0 or int((k_start + k_len).max()) > total_k):
        raise ValueError("the sequences' keys run past the %d packed key rows" % total_k)
    return Seqs(q_start, q_len, k_len, np.arange(total_k, dtype=np.int32), k_start, packed=True,
                contiguous=contiguous)


def packed_source(k, v, cu_k, cache_dtype):
    """A cache view with block_size 1 over packed [total_k, num_kv_heads, head_size] k and v."""
    total, hk, d = k.shape
    if v.shape != k.shape:
        raise ValueError("k shape %s and v shape %s differ" % (k.shape, v.shape))
    krs = A.check_rows(k, "k")
    vrs = A.check_rows(v, "v")
    if total > 1 and krs != vrs:
        raise ValueError("k and v must have the same row stride (got %d and %d elements)"
                         % (krs, vrs))
    c = L.pa_cache()
    c.key, c.value = k.ptr, v.ptr
    stand_in = None
    if total < 1:
        # no keys at all: every sequence has k_len 0 and its rows see nothing, but the library
        # describes a pool of at least one row; a zero row stands in (never read)
        stand_in = np.zeros(max(hk * d * k.itemsize, 1), dtype=np.uint8)
        c.key = c.value = stand_in.ctypes.data
        total = 1
    c.dtype = cache_dtype
    c.memory = L.PA_MEMORY_HOST
    c.num_blocks, c.block_size, c.num_kv_heads, c.head_size = total, 1, hk, d
    c.block_stride = krs if total > 1 else hk * d
    c.token_stride = hk * d
    c.head_stride = d
    src = Source(c, k, v, 1, total, packed=True, cu_k=cu_k)
    src.stand_in = stand_in
    return src


def _dequant(a, kind, scale):
    """float32 numpy copy of cache rows `a` (uint8 bytes for fp8)."""
    if kind == L.PA_DTYPE_FP8_E4M3:
        return a.view(A._mld.float8_e4m3fn).astype(np.float32) * np.float32(scale)
    if kind == L.PA_DTYPE_FP8_E5M2:
        return a.view(A._mld.float8_e5m2).astype(np.float32) * np.float32(scale)
    return a


def as_numpy(v):
    """numpy array sharing memory with View v (torch bf16 / fp8 tensors reinterpreted)."""
    obj = v.obj
    if not v.torch:
        return obj
    torch = A.torch_module()
    if obj.dtype == torch.bfloat16:
        return obj.view(torch.int16).numpy().view(A._mld.bfloat16)
    if obj.dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
        return obj.view(torch.uint8).numpy()
    return obj.numpy()


def _gather_keys(src, seqs, i, k_len):
    """numpy copies [k_len, Hkv, D] of sequence i's keys and values."""
    K = as_numpy(src.kview)
    V = as_numpy(src.vview)
    if src.packed:
        kstart = int(seqs.tab_off[i])
        return K[kstart:kstart + k_len], V[kstart:kstart + k_len]
    j = np.arange(k_len)
    blocks = np.asarray(seqs.table(i, src.block_size), dtype=np.int64)[j // src.block_size]
    return K[blocks, j % src.block_size], V[blocks, j % src.block_size]


def run(q, out, lse, src, seqs, *, causal, window, scale, softcap, alibi, sinks, cache_dtype,
        k_scale, v_scale, backend, new_kv=None, same_rows_kv=None, before_write=None):
    """Runs attention.

    q, out: Views [rows, H, D]. lse: None or (View-or-array obj, base_ptr, token_stride,
    head_stride, fill(row_start, nrows)). seqs: a Seqs. alibi: None, float32 [H] or [B, H].
    new_kv: None or (k View, v View, slot_mapping int64 [rows]) to be written by the forward
    call itself (decoder, one group).
    same_rows_kv: (k View, v View) when keys are exactly the query rows (packed self-attention).
    before_write: called once everything is validated (layers, backends, batches), before the
    first write to out, lse or a cache (e.g. the caller's own cache write), so that a rejected
    call changes nothing.
    """
    rows, H, D = q.shape
    Hkv = src.cache.num_kv_heads if src is not None else same_rows_kv[0].shape[1]
    q_rs = A.check_rows(q, "q")
    out_rs = A.check_rows(out, "out")
    per_seq_alibi = alibi is not None and alibi.ndim == 2
    wl, wr = window
    if causal:
        wr = -1 if wr < 0 else wr
    kv_dtype = q.kind
    if new_kv is not None:
        kv_dtype = new_kv[0].kind
    elif isinstance(cache_dtype, int) and cache_dtype in (L.PA_DTYPE_F32, L.PA_DTYPE_F16,
                                                          L.PA_DTYPE_BF16):
        kv_dtype = cache_dtype
    fp8 = cache_dtype in (L.PA_DTYPE_FP8_E4M3, L.PA_DTYPE_FP8_E5M2)
    ks, vs = (k_scale, v_scale) if fp8 else (1.0, 1.0)
    if not fp8 and (k_scale != 1.0 or v_scale != 1.0):
        # vLLM ignores the scales of a non-fp8 cache; so do we.
        ks = vs = 1.0

    def layer_for(attn_type, seq_index, w=(wl, wr), kvd=kv_dtype, cd=cache_dtype):
        a = None
        if alibi is not None:
            a = alibi[seq_index] if per_seq_alibi else alibi
            a = np.ascontiguousarray(a, dtype=np.float32)
        cd_fp8 = cd in (L.PA_DTYPE_FP8_E4M3, L.PA_DTYPE_FP8_E5M2)
        return C.get_layer(num_heads=H, num_kv_heads=Hkv, head_size=D, scale=scale,
                           attn_type=attn_type, window=w, alibi_slopes=a,
                           logits_soft_cap=softcap, sinks=sinks, q_dtype=q.kind, kv_dtype=kvd,
                           out_dtype=out.kind, cache_dtype=cd, k_scale=ks if cd_fp8 else 1.0,
                           v_scale=vs if cd_fp8 else 1.0)

    def empty_rows(start, n):
        # no visible key: out = 0; lse = -inf, or the sink's logit when there are sinks
        if n > 0:
            A.fill_rows(out, start, n, 0)
            if lse is not None:
                if sinks is None:
                    lse[4](start, n)
                else:
                    lse[5](start, n, np.repeat(sinks[None, :].astype(np.float32), n, axis=0))

    noncausal_rel = (not causal) and (wl >= 0 or wr >= 0 or alibi is not None)
    if noncausal_rel and same_rows_kv is None:
        return _run_padded(q, out, lse, src, seqs, layer_for, empty_rows, backend, ks, vs,
                           alibi, sinks, (wl, wr), before_write)

    if causal:
        attn_type = L.PA_ATTN_DECODER
    elif noncausal_rel:
        attn_type = L.PA_ATTN_ENCODER_ONLY
    else:
        attn_type = L.PA_ATTN_ENCODER_DECODER

    # ---- the groups and their batches (cached by content: an engine calls every layer of a
    # step with the same sequences, so later layers reuse the batches and their plans) ----
    key = _groups_key(seqs, attn_type, per_seq_alibi, src, new_kv)
    with _groups_lock:
        planned = _groups_cache.get(key)
        if planned is not None:
            _groups_cache.move_to_end(key)
    if planned is None:
        planned = _plan_groups(seqs, attn_type, per_seq_alibi, src, new_kv)
        with _groups_lock:
            _groups_cache[key] = planned
            while len(_groups_cache) > _GROUPS_CACHED:
                _groups_cache.popitem(last=False)
    groups, empties = planned
    # every group's layer and context before anything is written (validation first)
    prepared = []
    for g0, r0, batch in groups:
        layer = layer_for(attn_type, g0)
        ctx = layer.context(backend)
        prepared.append((r0, layer, ctx, batch, batch.plan(ctx, layer)))

    if before_write is not None:
        before_write()
    for row, n in empties:
        empty_rows(row, n)
    for r0, layer, ctx, batch, plan in prepared:
        kp = vp = None
        krs = vrs = 0
        cache = src.cache if src is not None else None
        if new_kv is not None:
            kp, vp = new_kv[0].ptr, new_kv[1].ptr
            krs, vrs = A.check_rows(new_kv[0], "k"), A.check_rows(new_kv[1], "v")
        if attn_type == L.PA_ATTN_ENCODER_ONLY:
            kv, vv = same_rows_kv
            krs, vrs = A.check_rows(kv, "k"), A.check_rows(vv, "v")
            kp, vp = kv.offset(r0 * krs), vv.offset(r0 * vrs)
            cache = None
        lp, lts, lhs = 0, 0, 0
        if lse is not None:
            lp = lse[1] + 4 * r0 * lse[2]
            lts, lhs = lse[2], lse[3]
        C.forward(ctx, layer, batch, q.offset(r0 * q_rs), q_rs, kp, krs, vp, vrs, cache,
                  out.offset(r0 * out_rs), out_rs, lp, lts, lhs, plan=plan)


_groups_cache = OrderedDict()
_groups_lock = threading.Lock()

# Entries kept: an engine's step alternates between at most a few sequence sets (e.g. its
# prefills and its decodes called apart). Each holds its batches and their plans, whose
# split-KV partial rows are under 1% of the KV bytes the call reads (32 heads x 130 floats per
# 512-key chunk), so this bounds what stays allocated between calls.
_GROUPS_CACHED = 4


def _after_fork_in_child():
    """A forked child: the lock may have been held by a parent thread, and the cached batches'
    plans belong to the parent's contexts (the child makes its own)."""
    global _groups_lock
    _groups_lock = threading.Lock()
    _groups_cache.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _groups_key(seqs, attn_type, per_seq_alibi, src, new_kv):
    """Everything _plan_groups depends on, by value."""
    return (attn_type, per_seq_alibi, seqs.contiguous, seqs.packed,
            None if src is None else (src.block_size, src.num_blocks),
            seqs.q_start.tobytes(), seqs.q_len.tobytes(), seqs.k_len.tobytes(),
            None if seqs.tab is None else seqs.tab.tobytes(),
            None if seqs.tab_off is None else np.asarray(seqs.tab_off).tobytes(),
            None if new_kv is None else np.asarray(new_kv[2], dtype=np.int64).tobytes())


def _plan_groups(seqs, attn_type, per_seq_alibi, src, new_kv):
    """Splits the sequences into groups of consecutive ones whose rows are contiguous and see a
    key (one library call each) and makes their batches. Returns ([(first sequence, first row,
    batch)], [(row, n) of rows that see no key])."""
    n_seqs = len(seqs)
    ql, kl = seqs.q_len, seqs.k_len
    if n_seqs and (int(kl.max()) >= 2**31 or int(ql.max()) >= 2**31):
        raise ValueError("a sequence has %d query rows and %d keys: more than the library's "
                         "int32 lengths hold" % (int(ql.max()), int(kl.max())))
    one_group = False
    if n_seqs and seqs.contiguous and not per_seq_alibi and int(ql.min()) > 0:
        # the usual case, in a few operations: every row sees a key, so one group of all
        one_group = (int((ql - kl).max()) <= 0 if attn_type == L.PA_ATTN_DECODER
                     else int(kl.min()) > 0)
    if one_group:
        skip = None
        eff = ql
        start = seqs.q_start
        heads, ends, empties = [0], [n_seqs], []
    else:
        if attn_type == L.PA_ATTN_DECODER:
            skip = np.maximum(ql - kl, 0)
        else:
            skip = np.where(kl == 0, ql, 0)
        eff = ql - skip
        start = seqs.q_start + skip
        valid = eff > 0
        first = valid.copy()  # sequences that open a group
        if not per_seq_alibi and n_seqs > 1:
            first[1:] &= ~(valid[:-1] & (start[1:] == start[:-1] + eff[:-1]))
        heads = np.flatnonzero(first)
        stops = np.flatnonzero(first | ~valid)  # a group runs up to the next of these
        ends = np.append(stops, n_seqs)[np.searchsorted(stops, heads, side="right")].tolist()
        heads = heads.tolist()
        empties = np.flatnonzero(skip > 0).tolist()

    if new_kv is not None and len(heads) != 1:
        raise AssertionError("internal: writing forward with several groups")

    bsz = src.block_size if src is not None else 1
    if src is not None and attn_type != L.PA_ATTN_ENCODER_ONLY:
        addr_all, tlen_all = seqs.table_addr(bsz)
    groups = []
    for g0, g1 in zip(heads, ends):
        e = eff[g0:g1]
        n = g1 - g0
        # decodes (one query row, with a context) may only follow prefills: mark the tail
        if int(e.max()) > 1:
            prefills = np.flatnonzero(e > 1)
            is_prefill = np.arange(n) <= prefills[-1]
        else:
            is_prefill = 0
        # int32 columns (lengths < 2**31, checked above)
        e32 = e.astype(np.int32)
        k32 = kl[g0:g1].astype(np.int32)
        n_rows = int(e.sum())
        slots = new_kv[2] if new_kv is not None else np.full(n_rows, -1, dtype=np.int64)
        if attn_type == L.PA_ATTN_DECODER:
            batch = C.Batch.columns(bsz, src.num_blocks, n, k32 - e32, e32, is_prefill,
                                    addr_all[g0:g1], tlen_all[g0:g1], slot_mapping=slots)
        elif attn_type == L.PA_ATTN_ENCODER_DECODER:
            n_enc = int(k32.sum(dtype=np.int64))
            batch = C.Batch.columns(bsz, src.num_blocks, n, 0, e32, is_prefill, 0, 0,
                                    encoder_len=k32, cross_addr=addr_all[g0:g1],
                                    cross_len=tlen_all[g0:g1], num_cross_blocks=src.num_blocks,
                                    slot_mapping=slots,
                                    cross_slot_mapping=np.full(n_enc, -1, dtype=np.int64))
        else:
            batch = C.Batch.columns(bsz if src is not None else 1,
                                    src.num_blocks if src is not None else 1, n, 0, e32, 1, 0, 0,
                                    slot_mapping=slots)
        groups.append((g0, int(start[g0]), batch))
    return groups, [(int(seqs.q_start[i]), int(skip[i])) for i in empties]


def _run_padded(q, out, lse, src, seqs, layer_for, empty_rows, backend, ks, vs, alibi, sinks,
                window, before_write=None):
    """Non-causal attention with a window or ALiBi over keys that are not the query rows.

    Per sequence, its keys are gathered into packed rows (fp8 dequantized to float32). Rows with
    p = k_len - q_len + t >= 0 run as encoder_only over a padded block of k_len query rows (row p
    holds query t), so the window and ALiBi see the exact positions. Rows with p < 0 (q_len >
    k_len) see the key prefix [0, min(k_len, p + right + 1)); they run as decoder sequences of
    one query over that prefix in reverse order (so causality admits all of it and the decoder's
    ALiBi -slope * (p' - j') equals -slope * j); the true logits are those plus slope * p, a
    constant per row, which leaves the output exact and shifts the LSE, corrected here."""
    rows, H, D = q.shape
    Qn = as_numpy(q)
    On = as_numpy(out)
    wl, wr = window
    kvd0 = src.cache.dtype
    if kvd0 in (L.PA_DTYPE_FP8_E4M3, L.PA_DTYPE_FP8_E5M2):
        kvd0 = L.PA_DTYPE_F32
    for i in range(len(seqs)):
        ql, kl = int(seqs.q_len[i]), int(seqs.k_len[i])
        if ql and kl and not src.packed:
            # the keys are gathered here, by numpy (where -1 would silently mean the last block)
            t = seqs.table(i, src.block_size)
            bad = np.flatnonzero((t < 0) | (t >= src.num_blocks))
            if bad.size:
                raise ValueError("block_table[%d][%d] = %d is outside the cache's blocks [0, %d)"
                                 % (i, bad[0], t[bad[0]], src.num_blocks))
        if ql > kl and kl > 0 and alibi is not None and sinks is not None:
            raise NotImplementedError(
                "non-causal attention with ALiBi and sinks where seqlen_q (%d) > seqlen_k (%d) is "
                "not supported" % (ql, kl))
        if ql and kl:  # validate the layers and their backend before anything is written
            layer_for(L.PA_ATTN_ENCODER_ONLY, i, kvd=kvd0, cd=kvd0).context(backend)
            if ql > kl:
                layer_for(L.PA_ATTN_DECODER, i, w=(-1, -1), kvd=kvd0, cd=kvd0).context(backend)
    if before_write is not None:
        before_write()
    for i in range(len(seqs)):
        ql, kl = int(seqs.q_len[i]), int(seqs.k_len[i])
        q0 = int(seqs.q_start[i])
        if ql == 0:
            continue
        if kl == 0:
            empty_rows(q0, ql)
            continue
        Kc, Vc = _gather_keys(src, seqs, i, kl)
        kind = src.cache.dtype
        if kind in (L.PA_DTYPE_FP8_E4M3, L.PA_DTYPE_FP8_E5M2):
            Kc = _dequant(np.ascontiguousarray(Kc), kind, ks)
            Vc = _dequant(np.ascontiguousarray(Vc), kind, vs)
            kvd = L.PA_DTYPE_F32
        else:
            kvd = kind
        Kc = np.ascontiguousarray(Kc)
        Vc = np.ascontiguousarray(Vc)
        m = min(ql, kl)
        # (1) rows with p >= 0: padded encoder_only
        Qp = np.zeros((kl, H, D), dtype=Qn.dtype)
        Qp[kl - m:] = Qn[q0 + ql - m:q0 + ql]
        Op = np.empty((kl, H, D), dtype=On.dtype)
        Lp = np.empty((kl, H), dtype=np.float32) if lse is not None else None
        layer = layer_for(L.PA_ATTN_ENCODER_ONLY, i, kvd=kvd, cd=kvd)
        ctx = layer.context(backend)
        batch = C.Batch(1, 1, [{"context_len": 0, "query_len": kl, "is_prefill": True}],
                        slot_mapping=np.full(kl, -1, dtype=np.int64))
        qv, kv, vv, ov = (A.view(x, n) for x, n in ((Qp, "q"), (Kc, "k"), (Vc, "v"), (Op, "out")))
        C.forward(ctx, layer, batch, qv.ptr, H * D, kv.ptr, kv.shape[1] * D, vv.ptr,
                  vv.shape[1] * D, None, ov.ptr, H * D,
                  Lp.ctypes.data if Lp is not None else 0, H, 1)
        On[q0 + ql - m:q0 + ql] = Op[kl - m:]
        if lse is not None:
            lse[5](q0 + ql - m, m, Lp[kl - m:])
        # (2) rows with p < 0
        n_neg = ql - m
        if n_neg <= 0:
            continue
        p = np.arange(n_neg) - n_neg  # positions of rows t < n_neg
        hi = np.full(n_neg, kl) if wr < 0 else np.minimum(kl, p + wr + 1)
        live = np.nonzero(hi > 0)[0]
        dead = np.nonzero(hi <= 0)[0]
        for t in dead:
            empty_rows(q0 + int(t), 1)
        if live.size == 0:
            continue
        t0 = int(live[0])  # live rows are the last ones (hi grows with t)
        seq_list = []
        for t in range(t0, n_neg):
            h = int(hi[t])
            seq_list.append({"context_len": h - 1, "query_len": 1, "is_prefill": False,
                             "block_table": np.arange(h - 1, -1, -1, dtype=np.int32)})
        cache = L.pa_cache()
        cache.key, cache.value = Kc.ctypes.data, Vc.ctypes.data
        cache.dtype = kvd
        cache.memory = L.PA_MEMORY_HOST
        Hkv = Kc.shape[1]
        cache.num_blocks, cache.block_size, cache.num_kv_heads, cache.head_size = kl, 1, Hkv, D
        cache.block_stride, cache.token_stride, cache.head_stride = Hkv * D, Hkv * D, D
        layer = layer_for(L.PA_ATTN_DECODER, i, w=(-1, -1), kvd=kvd, cd=kvd)
        ctx = layer.context(backend)
        nrow = n_neg - t0
        batch = C.Batch(1, kl, seq_list, slot_mapping=np.full(nrow, -1, dtype=np.int64))
        Qr = np.ascontiguousarray(Qn[q0 + t0:q0 + n_neg])
        Or = np.empty((nrow, H, D), dtype=On.dtype)
        Lr = np.empty((nrow, H), dtype=np.float32)
        C.forward(ctx, layer, batch, Qr.ctypes.data, H * D, None, 0, None, 0, cache,
                  Or.ctypes.data, H * D, Lr.ctypes.data, H, 1)
        On[q0 + t0:q0 + n_neg] = Or
        if lse is not None:
            if alibi is not None:
                slopes = alibi[i] if alibi.ndim == 2 else alibi
                Lr = (Lr.astype(np.float64) + p[t0:, None] * slopes[None, :].astype(np.float64)
                      ).astype(np.float32)
            lse[5](q0 + t0, nrow, Lr)

