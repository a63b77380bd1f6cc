"""vLLM's attention-backend layer (AttentionBackend / AttentionMetadata / AttentionImpl) over
pagedattn.

    backend = get_attn_backend()            # or get_attn_backend("reference")
    shape = backend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
    kv_cache = np.zeros(shape, np.float16)  # [2, num_blocks, block_size, num_kv_heads, head_size]
    md = backend.make_metadata_builder(block_size).build(
        seq_lens=[7, 5], query_lens=[7, 1], block_tables=[[0], [1]])
    impl = backend.get_impl_cls()(num_heads, head_size, scale, num_kv_heads)
    out = impl.forward(query, key, value, kv_cache, md)   # [num_tokens, num_heads * head_size]
"""

import ctypes
import os
import threading
from collections import OrderedDict

import numpy as np

from . import _arrays as A
from . import _attn
from . import _core as C
from . import _lib as L
from . import ops

__all__ = ["available_backends", "get_attn_backend", "set_num_threads", "get_num_threads",
           "AttentionType", "PagedAttnBackend", "PagedAttnMetadata", "PagedAttnMetadataBuilder",
           "PagedAttnImpl"]


def available_backends():
    """Names of the library backends that can run on this machine, fastest first
    (e.g. ``["cpu", "reference"]``)."""
    return [n for n in L.backend_names() if L.backend_available(n)[0]]


def _threads_context():
    names = available_backends()
    name = "cpu" if "cpu" in names else (names[0] if names else "reference")
    return L.get_context(name)


def set_num_threads(n):
    """Sets the number of worker threads of the ``cpu`` backend's context (0 = one per core
    this process may use: online, in its affinity mask, within its cgroup's CPU quota). Other
    backends have no pool and ignore it."""
    n = int(n)
    if n < 0 or n > 1024:  # PA_MAX_THREADS; checked here too so that ctypes never truncates n
        raise ValueError("num_threads must be in [0, 1024], got %d" % n)
    ctx = _threads_context()
    with ctx.lock:
        L.check(L.lib.pa_context_set_num_threads(ctx.handle, n), "set_num_threads")


def get_num_threads():
    """The number of worker threads of the ``cpu`` backend's context."""
    ctx = _threads_context()
    with ctx.lock:
        return int(L.lib.pa_context_num_threads(ctx.handle))


class AttentionType:
    """vLLM's attention types (string values, as in vLLM >= 0.7)."""
    DECODER = "decoder"
    ENCODER = "encoder"
    ENCODER_ONLY = "encoder_only"
    ENCODER_DECODER = "encoder_decoder"


def _attn_type_code(t):
    if isinstance(t, str):
        key = t.lower()
    else:
        key = getattr(t, "name", str(t)).lower()
        key = key.split(".")[-1]
    if key not in L.ATTN_TYPES:
        raise ValueError("attn_type %r is not one of %s" % (t, ", ".join(L.ATTN_TYPES)))
    return L.ATTN_TYPES[key]


# ---- metadata -----------------------------------------------------------------------------------

class PagedAttnMetadata:
    """vLLM-style attention metadata for one engine step, backed by a validated pa_batch.

    Fields (vLLM's names): ``num_prefills``, ``num_prefill_tokens``, ``num_decode_tokens``,
    ``slot_mapping``, ``seq_lens``, ``seq_lens_tensor``, ``context_lens_tensor``, ``query_lens``,
    ``query_start_loc``, ``seq_start_loc``, ``block_tables``, ``max_query_len``,
    ``max_prefill_seq_len``, ``max_decode_seq_len``, ``max_decode_query_len``, ``block_size``;
    encoder-decoder: ``encoder_seq_lens``, ``encoder_seq_lens_tensor``, ``max_encoder_seq_len``,
    ``num_encoder_tokens``, ``cross_slot_mapping``, ``cross_block_tables``; vLLM v1's
    ``causal`` (False is for encoder-only and cross layers; a decoder layer refuses it).
    The library batch is created on first use, when the pool size (from the kv_cache) is known.
    """

    def __init__(self, block_size, seqs, slot_mapping=None, cross_slot_mapping=None,
                 num_blocks=None, causal=True):
        self.block_size = int(block_size)
        # vLLM v1's flag: False for attention that is not causal over the step (encoder-only
        # and cross layers); a decoder layer given causal=False metadata raises
        self.causal = bool(causal)
        # the slots as they are now: the library batches are made later, one per pool size, and
        # must all write where the metadata says (the block tables are copied too)
        if slot_mapping is not None:
            slot_mapping = np.array(slot_mapping, dtype=np.int64)
        if cross_slot_mapping is not None:
            cross_slot_mapping = np.array(cross_slot_mapping, dtype=np.int64)
        self._seqs = seqs
        self._slot_mapping = slot_mapping
        self._cross_slot_mapping = cross_slot_mapping
        self._num_blocks = num_blocks
        self._batches = {}
        self._lock = C.ForkSafeLock()
        ctx = np.array([s["context_len"] for s in seqs], dtype=np.int32)
        ql = np.array([s["query_len"] for s in seqs], dtype=np.int32)
        sl = ctx + ql
        enc = np.array([s.get("encoder_len", 0) for s in seqs], dtype=np.int32)
        pre = np.array([bool(s["is_prefill"]) for s in seqs])
        self.num_seqs = len(seqs)
        self.num_prefills = int(pre.sum())
        self.num_prefill_tokens = int(ql[pre].sum())
        self.num_decode_tokens = int(ql[~pre].sum())
        self.num_tokens = int(ql.sum())
        self.seq_lens = sl.tolist()
        self.seq_lens_tensor = sl
        self.context_lens_tensor = ctx
        self.query_lens = ql.tolist()
        self.query_start_loc = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
        self.seq_start_loc = np.concatenate([[0], np.cumsum(sl)]).astype(np.int32)
        self.max_query_len = int(ql.max()) if len(ql) else 0
        self.max_prefill_seq_len = int(sl[pre].max()) if pre.any() else 0
        self.max_decode_seq_len = int(sl[~pre].max()) if (~pre).any() else 0
        self.max_decode_query_len = int(ql[~pre].max()) if (~pre).any() else 0
        width = max([len(s["block_table"]) if s.get("block_table") is not None else 0
                     for s in seqs] + [0])
        bt = np.zeros((len(seqs), width), dtype=np.int32)
        for i, s in enumerate(seqs):
            t = s.get("block_table")
            if t is not None and len(t):
                bt[i, :len(t)] = t
        self.block_tables = bt
        if slot_mapping is not None:
            self.slot_mapping = slot_mapping
        else:
            self.slot_mapping = _derive_slots(seqs, self.block_size, "block_table", "context_len",
                                              "query_len")
        self.encoder_seq_lens = enc.tolist() if enc.any() else None
        self.encoder_seq_lens_tensor = enc if enc.any() else None
        self.max_encoder_seq_len = int(enc.max()) if enc.any() else 0
        self.num_encoder_tokens = int(enc.sum())
        cw = max([len(s["cross_block_table"]) if s.get("cross_block_table") is not None else 0
                  for s in seqs] + [0])
        if cw:
            cbt = np.zeros((len(seqs), cw), dtype=np.int32)
            for i, s in enumerate(seqs):
                t = s.get("cross_block_table")
                if t is not None and len(t):
                    cbt[i, :len(t)] = t
            self.cross_block_tables = cbt
        else:
            self.cross_block_tables = None
        if cross_slot_mapping is not None:
            self.cross_slot_mapping = np.asarray(cross_slot_mapping, dtype=np.int64)
        elif self.num_encoder_tokens and cw:
            self.cross_slot_mapping = _derive_slots(seqs, self.block_size, "cross_block_table",
                                                    None, "encoder_len")
        else:
            self.cross_slot_mapping = None

    @property
    def prefill_metadata(self):
        """A metadata of the prefill sequences only (None if there are none)."""
        if self.num_prefills == 0:
            return None
        if self.num_prefills == self.num_seqs:
            return self
        return self._subset(0, self.num_prefills)

    @property
    def decode_metadata(self):
        """A metadata of the decode sequences only (None if there are none)."""
        if self.num_prefills == self.num_seqs:
            return None
        if self.num_prefills == 0:
            return self
        return self._subset(self.num_prefills, self.num_seqs)

    def _subset(self, a, b):
        t0, t1 = int(self.query_start_loc[a]), int(self.query_start_loc[b])
        sm = self.slot_mapping[t0:t1] if self._slot_mapping is not None else None
        csm = None
        if self._cross_slot_mapping is not None:
            e = np.concatenate([[0], np.cumsum([s.get("encoder_len", 0) for s in self._seqs])])
            csm = self._cross_slot_mapping[e[a]:e[b]]
        return PagedAttnMetadata(self.block_size, self._seqs[a:b], sm, csm, self._num_blocks,
                                 self.causal)

    def batch(self, num_blocks, num_cross_blocks=0, encoder_self=False, encoder_only=False):
        """The library batch for a pool of num_blocks blocks (created once, then reused).
        encoder_self: the batch of an encoder self-attention layer (queries = encoder tokens);
        encoder_only: of an encoder-only layer (queries = the sequences' tokens, no cache)."""
        key = (int(num_blocks), int(num_cross_blocks), bool(encoder_self), bool(encoder_only))
        with self._lock:
            b = self._batches.get(key)
            if b is None:
                if encoder_only:
                    if any(s["context_len"] for s in self._seqs):
                        raise ValueError("encoder_only attention has no cache: every sequence "
                                         "needs context_len 0 (query_len == seq_len)")
                    seqs = [{"context_len": 0, "query_len": s["query_len"], "is_prefill": True}
                            for s in self._seqs]
                    b = C.Batch(self.block_size, 1, seqs,
                                slot_mapping=np.full(self.num_tokens, -1, np.int64))
                elif encoder_self:
                    seqs = [{"context_len": 0, "query_len": s.get("encoder_len", 0),
                             "is_prefill": True} for s in self._seqs]
                    if any(s["query_len"] < 1 for s in seqs):
                        raise ValueError("encoder attention needs encoder_seq_lens >= 1 for every "
                                         "sequence")
                    b = C.Batch(self.block_size, max(1, num_blocks), seqs,
                                slot_mapping=np.full(sum(s["query_len"] for s in seqs), -1,
                                                     np.int64))
                else:
                    if not num_cross_blocks and self.cross_block_tables is not None:
                        # vLLM's cross caches have the same number of blocks as the self caches
                        num_cross_blocks = num_blocks
                    b = C.Batch(self.block_size, num_blocks, self._seqs,
                                num_cross_blocks=num_cross_blocks,
                                slot_mapping=self._slot_mapping,
                                cross_slot_mapping=self._cross_slot_mapping)
                self._batches[key] = b
            return b

    def asdict_zerocopy(self, skip_fields=()):
        """The public fields as a dict (no copies), as vLLM's metadata offers."""
        return {k: v for k, v in self.__dict__.items()
                if not k.startswith("_") and k not in skip_fields}


def _derive_slots(seqs, bs, table_key, ctx_key, len_key):
    out = []
    for s in seqs:
        t = s.get(table_key)
        c = s.get(ctx_key, 0) if ctx_key else 0
        n = s.get(len_key, 0)
        if t is None or len(t) == 0:
            out.extend([-1] * n)
            continue
        t = np.asarray(t, dtype=np.int64)
        pos = np.arange(c, c + n)
        if len(pos) and pos[-1] // bs >= len(t):
            raise ValueError("a block table of %d blocks cannot hold %d tokens (block_size %d)"
                             % (len(t), c + n, bs))
        out.extend((t[pos // bs] * bs + pos % bs).tolist())
    return np.asarray(out, dtype=np.int64)


class PagedAttnMetadataBuilder:
    """Builds :class:`PagedAttnMetadata` from per-sequence lengths and block tables.

    ``PagedAttnMetadataBuilder(block_size=16)``; vLLM v1 constructs its builders as
    ``(kv_cache_spec, layer_names, vllm_config, device)``, which is taken too (the block size
    from ``kv_cache_spec.block_size``; the rest is not needed), and calls
    ``build(common_prefix_len=..., common_attn_metadata=...)`` (see :meth:`build`)."""

    def __init__(self, block_size=16, *v1_args, **v1_kwargs):
        if not isinstance(block_size, (int, np.integer)) and hasattr(block_size, "block_size"):
            block_size = block_size.block_size  # vLLM v1: the layer group's kv_cache_spec
        if int(block_size) < 1:
            raise ValueError("block_size must be >= 1, got %r" % (block_size,))
        self.block_size = int(block_size)

    def build(self, seq_lens=None, query_lens=None, block_tables=None, context_lens=None,
              num_prefills=None, encoder_seq_lens=None, cross_block_tables=None,
              slot_mapping=None, cross_slot_mapping=None, causal=True, *,
              common_prefix_len=None, common_attn_metadata=None, fast_build=False):
        """Build the metadata of one step.

        vLLM v1's form: ``build(common_prefix_len, common_attn_metadata, fast_build=False)``
        (positional or keywords), where ``common_attn_metadata`` carries v1's fields (see
        :meth:`PagedAttnImpl.forward`); the prefix length needs nothing (the tables are
        complete).

        Args:
            seq_lens: per sequence, context + new tokens.
            query_lens: per sequence, new tokens this step (or give ``context_lens``; default:
                every token is new, a plain prefill).
            block_tables: per sequence, the physical block ids (lists or a 2-D int array padded
                on the right; an empty row: no table); ``None`` for encoder-only models.
            context_lens: per sequence, tokens already cached (alternative to query_lens).
            num_prefills: how many leading sequences are prefills; default: the sequences up to
                the last one that has more than one new token or no context (decodes follow).
            encoder_seq_lens, cross_block_tables: encoder-decoder models: encoder tokens per
                sequence and the blocks of the cross cache holding them.
            slot_mapping, cross_slot_mapping: explicit int64 slots (-1 = skip); default derived
                from the block tables (``table[pos // block_size] * block_size + pos %
                block_size``).
            causal: vLLM v1's flag (see :class:`PagedAttnMetadata`).
        """
        if common_attn_metadata is None and query_lens is not None and not isinstance(
                query_lens, (list, tuple, np.ndarray)) and not A.is_torch(query_lens) and \
                hasattr(query_lens, "query_start_loc"):
            common_attn_metadata = query_lens  # build(common_prefix_len, common_attn_metadata)
        if common_attn_metadata is not None:
            return _v1_metadata(common_attn_metadata, self.block_size)
        if seq_lens is None:
            raise TypeError("build() needs seq_lens (or vLLM v1's common_attn_metadata)")
        sl = [int(x) for x in _list(seq_lens)]
        n = len(sl)
        if n == 0:
            raise ValueError("seq_lens is empty")
        if query_lens is not None:
            ql = [int(x) for x in _list(query_lens)]
        elif context_lens is not None:
            cl = [int(x) for x in _list(context_lens)]
            if len(cl) != n:
                raise ValueError("context_lens has %d entries for %d sequences" % (len(cl), n))
            ql = [s - c for s, c in zip(sl, cl)]
        else:
            ql = list(sl)
        if len(ql) != n:
            raise ValueError("query_lens has %d entries for %d sequences" % (len(ql), n))
        for i, (s, q) in enumerate(zip(sl, ql)):
            if q < 1 or s < q:
                raise ValueError("sequence %d: query_len %d must be in [1, seq_len = %d]"
                                 % (i, q, s))
        tables = _rows(block_tables, n, "block_tables")
        enc = [int(x) for x in _list(encoder_seq_lens)] if encoder_seq_lens is not None else None
        if enc is not None and len(enc) != n:
            raise ValueError("encoder_seq_lens has %d entries for %d sequences" % (len(enc), n))
        ctabs = _rows(cross_block_tables, n, "cross_block_tables")
        if num_prefills is None:
            num_prefills = 0
            for i in range(n):
                if ql[i] > 1 or sl[i] == ql[i]:
                    num_prefills = i + 1
        num_prefills = int(num_prefills)
        if not 0 <= num_prefills <= n:
            raise ValueError("num_prefills %d not in [0, %d]" % (num_prefills, n))
        seqs = []
        for i in range(n):
            s = {"context_len": sl[i] - ql[i], "query_len": ql[i],
                 "is_prefill": i < num_prefills}
            if tables is not None and len(tables[i]):
                t = tables[i]
                need = -(-sl[i] // self.block_size)
                if len(t) < need:
                    raise ValueError("block_tables[%d] has %d blocks; %d tokens need %d blocks of "
                                     "%d" % (i, len(t), sl[i], need, self.block_size))
                s["block_table"] = np.asarray(t[:need], dtype=np.int32)
            if enc is not None:
                s["encoder_len"] = enc[i]
                if ctabs is not None:
                    need = -(-enc[i] // self.block_size)
                    ct = ctabs[i]
                    if len(ct) < need:
                        raise ValueError("cross_block_tables[%d] has %d blocks; %d encoder tokens "
                                         "need %d" % (i, len(ct), enc[i], need))
                    s["cross_block_table"] = np.asarray(ct[:need], dtype=np.int32)
            seqs.append(s)
        sm = A.to_np(slot_mapping, np.int64, "slot_mapping", 1) if slot_mapping is not None else None
        if sm is not None and sm.size != sum(ql):
            raise ValueError("slot_mapping has %d entries for %d tokens" % (sm.size, sum(ql)))
        csm = (A.to_np(cross_slot_mapping, np.int64, "cross_slot_mapping", 1)
               if cross_slot_mapping is not None else None)
        return PagedAttnMetadata(self.block_size, seqs, sm, csm, causal=causal)


def _list(x):
    if A.is_torch(x):
        x = x.detach().cpu().numpy()
    return list(np.asarray(x).reshape(-1))


def _rows(x, n, name, at_least=False):
    if x is None:
        return None
    if A.is_torch(x):
        x = x.detach().cpu().numpy()
    rows = [list(np.asarray(r).reshape(-1)) for r in x]
    if len(rows) != n and (not at_least or len(rows) < n):
        raise ValueError("%s has %d rows for %d sequences" % (name, len(rows), n))
    return rows


# ---- impl ---------------------------------------------------------------------------------------

def _blocksparse(params, num_heads, num_kv_heads):
    """vLLM's blocksparse_params dict -> pa_blocksparse fields."""
    if params is None:
        return None
    p = dict(params)
    bs = int(p.get("block_size", 64))
    local = int(p["local_blocks"])
    vert = int(p["vert_stride"])
    homo = bool(p.get("homo_head", False))
    homo_group = bool(p.get("homo_head_group", False))
    tp_rank = int(p.get("tp_rank", 0))
    tp_size = int(p.get("tp_size", 1))
    # as vLLM's BlocksparseParams: num_heads / num_kv_heads are this rank's heads, the pattern
    # slides over all tp_size * num_heads heads (tp_rank, tp_size: extra keys, default 0 and 1)
    total_heads = tp_size * int(p.get("num_heads") or num_heads)
    total_kv = tp_size * int(p.get("num_kv_heads") or num_kv_heads)
    if homo:
        step = 0
    elif homo_group:
        step = -max(1, int(vert / total_kv))
    else:
        step = max(1, int(vert / total_heads))
    if "head_sliding_step" in p:
        step = int(p["head_sliding_step"])
    return (bs, local, vert, 1 if homo else 0, step, tp_rank)


class PagedAttnImpl:
    """vLLM's AttentionImpl over pagedattn.

    ``impl_cls(num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None,
    sliding_window=None, kv_cache_dtype="auto", blocksparse_params=None, logits_soft_cap=None,
    attn_type="decoder")``; extra keywords ``sinks`` (per-head sink logits), ``backend`` and
    ``kv_sharing_target_layer_name`` (not None: the layer reads another layer's cache and
    writes nothing into it). The positional arguments after ``kv_cache_dtype`` may also come in
    vLLM v1's order, ``logits_soft_cap, attn_type, kv_sharing_target_layer_name``: told apart
    by type (blocksparse parameters are a dict or None, a soft cap is a number or None, an
    attention type is a string).
    ``blocksparse_params`` takes vLLM's keys (max_seqlen, num_heads, num_kv_heads, block_size,
    local_blocks, vert_stride, homo_head, homo_head_group) plus optional ``tp_rank`` and
    ``tp_size`` (tensor parallelism: num_heads are this rank's heads) and ``head_sliding_step``
    (overrides vLLM's derivation). ``sliding_window`` W attends W keys (window (W - 1, 0)).
    ``kv_cache_dtype`` is one of vLLM's strings: ``"auto"``, ``"bfloat16"`` or ``"float16"``
    (an unquantized cache; the named ones need a cache of that dtype, checked at forward) or
    ``"fp8"``/``"fp8_e4m3"``/``"fp8_e5m2"`` (uint8 codes).
    The configuration is validated by the library at construction (ValueError otherwise).
    """

    backend_name = None

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None,
                 sliding_window=None, kv_cache_dtype="auto", *positional, blocksparse_params=None,
                 logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
                 sinks=None, backend=None, **unused):
        if positional:
            blocksparse_params, logits_soft_cap, attn_type, kv_sharing_target_layer_name = \
                _impl_positional(positional, blocksparse_params, logits_soft_cap, attn_type,
                                 kv_sharing_target_layer_name)
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.num_heads = int(num_heads)
        self.head_size = int(head_size)
        self.scale = float(scale)
        self.num_kv_heads = int(num_kv_heads) if num_kv_heads else self.num_heads
        if self.num_heads < 1 or self.num_kv_heads < 1 or self.head_size < 1:
            raise ValueError("num_heads (%d), num_kv_heads (%d) and head_size (%d) must be >= 1"
                             % (self.num_heads, self.num_kv_heads, self.head_size))
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads (%d) must be a multiple of num_kv_heads (%d)"
                             % (self.num_heads, self.num_kv_heads))
        self.alibi_slopes = A.floats(alibi_slopes, "alibi_slopes", self.num_heads)
        self.sliding_window = int(sliding_window) if sliding_window else 0
        # "auto", "bfloat16", "float16" (unquantized: forward checks the cache's dtype agrees)
        # or an fp8 name
        self.kv_cache_dtype = C.kv_cache_dtype_name(kv_cache_dtype)
        self.blocksparse = _blocksparse(blocksparse_params, self.num_heads, self.num_kv_heads)
        self.logits_soft_cap = float(logits_soft_cap) if logits_soft_cap else 0.0
        self.sinks = A.floats(sinks, "sinks", self.num_heads)
        self.attn_type = _attn_type_code(attn_type)
        self.backend = backend or self.backend_name
        # validate the configuration now (f32 dtypes; forward uses the real ones)
        self._layer(L.PA_DTYPE_F32, L.PA_DTYPE_F32, L.PA_DTYPE_F32,
                    A.FP8_NAMES.get(self.kv_cache_dtype, L.PA_DTYPE_F32), 1.0, 1.0)

    def _layer(self, q_dtype, kv_dtype, out_dtype, cache_dtype, k_scale, v_scale, attn_type=None):
        key = (q_dtype, kv_dtype, out_dtype, cache_dtype, k_scale, v_scale,
               self.attn_type if attn_type is None else attn_type)
        layers = self.__dict__.setdefault("_layers", {})
        layer = layers.get(key)
        if layer is None:
            layer = self._make_layer(*key)
            if len(layers) < 64:
                layers[key] = layer
        return layer

    def _make_layer(self, q_dtype, kv_dtype, out_dtype, cache_dtype, k_scale, v_scale, attn_type):
        return C.get_layer(num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                           head_size=self.head_size, scale=self.scale, attn_type=attn_type,
                           sliding_window=self.sliding_window, alibi_slopes=self.alibi_slopes,
                           logits_soft_cap=self.logits_soft_cap, sinks=self.sinks,
                           blocksparse=self.blocksparse, q_dtype=q_dtype, kv_dtype=kv_dtype,
                           out_dtype=out_dtype, cache_dtype=cache_dtype, k_scale=k_scale,
                           v_scale=v_scale)

    def forward(self, *args, **kwargs):
        """One layer of one step: writes the new K/V into ``kv_cache`` (by the metadata's slot
        mapping, or its cross slot mapping for cross-attention) and attends.

        Two call forms, as vLLM's own changed:

        * ``forward(query, key, value, kv_cache, attn_metadata, k_scale=1.0, v_scale=1.0,
          output=None, attn_type=None)`` (vLLM <= 0.6);
        * ``forward(layer, query, key, value, kv_cache, attn_metadata, output=None,
          output_scale=None, output_block_scale=None)`` (vLLM >= 0.7 and v1): told apart by the
          first argument, which is not an array. The fp8 scales come from the layer
          (``layer._k_scale_float``, else ``layer._k_scale``; likewise v). ``attn_metadata``
          may be a :class:`PagedAttnMetadata` or vLLM v1's (``FlashAttentionMetadata`` or any
          object with its fields ``query_start_loc``, ``seq_lens``, ``block_table``,
          ``slot_mapping``, ``num_actual_tokens``, ``causal``): requests in any order, padding
          requests of no tokens and query/output rows past ``num_actual_tokens`` (left
          untouched) allowed; converted once per distinct content (``use_cascade`` needs no
          special case: the tables and lengths are complete). A cross-attention layer takes
          v1's cross metadata (its ``CrossAttentionBuilder``'s: ``causal`` False, ``seq_lens``
          the encoder lengths, ``block_table`` the cross cache's, ``slot_mapping`` the slots of
          the encoder tokens in ``key``/``value``, which are written first); encoder and
          encoder-only layers take it as v1 runs both, attention among each request's own
          tokens (causal only if it says ``causal=True``). ``None`` is vLLM's profiling run:
          the output is returned untouched. ``output_scale`` (fused output quantization) is
          not supported (NotImplementedError).

        Args (first form):
            query: ``[num_tokens, num_heads * head_size]`` (or ``[num_tokens, num_heads,
                head_size]``).
            key, value: ``[num_tokens, num_kv_heads * head_size]`` (encoder tokens for
                cross-attention; ``None`` at cross-attention decode steps).
            kv_cache: ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (see
                ``get_kv_cache_shape``); uint8 for fp8. ``None`` or empty for encoder /
                encoder_only layers.
            attn_metadata: a :class:`PagedAttnMetadata`.
            k_scale, v_scale: fp8 scales.
            output: optional output array ``[num_tokens, num_heads * head_size]``.
            attn_type: overrides the impl's attention type for this call (vLLM <= 0.6 passed
                it to forward).

        Returns:
            the output ``[num_tokens, num_heads * head_size]`` in query's dtype (the second
            form: ``output`` when given).
        """
        if "layer" in kwargs or (args and args[0] is not None and not _is_array(args[0])):
            return self._forward_layer(*args, **kwargs)
        return self._forward(*args, **kwargs)

    def _forward_layer(self, layer, query, key, value, kv_cache, attn_metadata, output=None,
                       output_scale=None, output_block_scale=None):
        """The second form of :meth:`forward`."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization (output_scale, "
                                      "output_block_scale) is not supported")
        ks, vs = _layer_scale(layer, "k"), _layer_scale(layer, "v")
        md = attn_metadata
        if md is None:  # vLLM's profiling run: nothing to attend, nothing written
            return output
        if not isinstance(md, PagedAttnMetadata):
            bs = 1
            if kv_cache is not None and len(getattr(kv_cache, "shape", ())) == 5:
                bs = int(kv_cache.shape[2])
            if self.attn_type == L.PA_ATTN_ENCODER_DECODER:
                return self._forward_v1_cross(query, key, value, kv_cache, md, bs, ks, vs, output)
            if self.attn_type in (L.PA_ATTN_ENCODER, L.PA_ATTN_ENCODER_ONLY):
                return self._forward_v1_encoder(query, key, value, md, ks, vs, output)
            md = _v1_metadata(md, bs)
        at = self.attn_type
        # query rows: the decoder's tokens, or the encoder's for encoder self-attention; key
        # rows: the encoder's for encoder and cross layers
        n = md.num_encoder_tokens if at == L.PA_ATTN_ENCODER else md.num_tokens
        nk = md.num_encoder_tokens if at in (L.PA_ATTN_ENCODER, L.PA_ATTN_ENCODER_DECODER) else n
        if self.kv_sharing_target_layer_name is not None and at == L.PA_ATTN_DECODER:
            key = value = None  # the cache belongs to another layer, which wrote these
        out = self._forward(_leading(query, n), _leading(key, nk), _leading(value, nk), kv_cache,
                            md, k_scale=ks, v_scale=vs, output=_leading(output, n))
        return out if output is None else output

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        """vLLM's store step alone (its split-store protocol): the first ``len(slot_mapping)``
        rows of key/value (``[tokens, num_kv_heads * head_size]`` or ``[tokens, num_kv_heads,
        head_size]``; padded rows past them ignored) into ``kv_cache`` at those slots (negative:
        skipped), quantized with the layer's fp8 scales for an fp8 cache, as forward writes
        them. Nothing for encoder and encoder-only layers (no cache) and for a layer sharing
        another's cache. Raises ValueError for a bad slot or shape; on error the cache is left
        untouched."""
        if self.attn_type in (L.PA_ATTN_ENCODER, L.PA_ATTN_ENCODER_ONLY) or \
                self.kv_sharing_target_layer_name is not None:
            return
        if kv_cache is None or len(getattr(kv_cache, "shape", ())) != 5 or kv_cache.shape[0] != 2:
            raise ValueError("kv_cache must be [2, num_blocks, block_size, num_kv_heads, "
                             "head_size]")
        self._store(key, value, kv_cache, slot_mapping, _layer_scale(layer, "k"),
                    _layer_scale(layer, "v"))

    def _store(self, key, value, kv_cache, slot_mapping, ks, vs):
        """The first len(slot_mapping) rows of key/value into kv_cache ([2, ...]) at the slots."""
        slots = A.to_np(slot_mapping, np.int64, "slot_mapping", 1)
        n, Hkv, D = slots.size, self.num_kv_heads, self.head_size
        if key is None or value is None or key.shape[0] < n or value.shape[0] < n:
            raise ValueError("key and value need %d rows (one per slot)" % n)
        kr, vr = _heads_of(_leading(key, n), Hkv, D, "key"), _heads_of(_leading(value, n), Hkv,
                                                                         D, "value")
        if kr.kind != vr.kind:
            raise ValueError("key and value must have the same dtype")
        ops.reshape_and_cache_flash(_leading(key, n).reshape(n, Hkv, D),
                                    _leading(value, n).reshape(n, Hkv, D), kv_cache[0],
                                    kv_cache[1], slots, kv_cache_dtype=self.kv_cache_dtype,
                                    k_scale=ks, v_scale=vs)

    def _forward_v1_encoder(self, query, key, value, m, ks, vs, output):
        """Encoder and encoder-only layers with vLLM v1's metadata, which runs both alike (its
        FlashAttention backend's encoder path): each request's tokens (query_start_loc) attend
        to each other, no cache (v1's block table and slots mean nothing to them), causally
        when the metadata says causal=True (v1's encoder-only builder says False)."""
        causal = m.get("causal") if isinstance(m, dict) else getattr(m, "causal", None)
        md = _v1_metadata(m, 1, cached=False)
        if key is None or value is None:
            raise ValueError("encoder attention needs key and value")
        n = md.num_tokens
        out = self._forward(_leading(query, n), _leading(key, n), _leading(value, n), None, md,
                            k_scale=ks, v_scale=vs, output=_leading(output, n),
                            attn_type="decoder" if causal else "encoder_only")
        return out if output is None else output

    def _forward_v1_cross(self, query, key, value, kv_cache, m, bs, ks, vs, output):
        """Cross-attention with vLLM v1's metadata (its CrossAttentionBuilder's): causal False,
        seq_lens the encoder lengths, block_table the cross cache's tables, slot_mapping the
        slots of the encoder tokens given this step (only requests whose encoder ran; none at
        later steps). Those keys and values are written first (checked before anything is
        written), then the decoder tokens attend to the whole cross cache."""
        md = _v1_metadata(m, bs, cross=True)
        n = md.num_tokens
        H, D = self.num_heads, self.head_size
        qv = _heads_of(_leading(query, n), H, D, "query")
        if qv.shape[0] != n:
            raise ValueError("query has %d tokens; the metadata describes %d" % (qv.shape[0], n))
        if output is not None:
            ov = _heads_of(_leading(output, n), H, D, "output", output=True)
            if ov.kind != qv.kind or ov.shape != qv.shape:
                raise ValueError("output %s %s must match the query's %s %s"
                                 % (ov.shape, ov.dtype_name(), qv.shape, qv.dtype_name()))
        if kv_cache is None or len(getattr(kv_cache, "shape", ())) != 5 or kv_cache.shape[0] != 2:
            raise ValueError("cross attention needs a kv_cache [2, num_blocks, block_size, "
                             "num_kv_heads, head_size]")
        nb = int(kv_cache.shape[1])
        md.batch(nb, num_cross_blocks=nb)  # the tables checked against the pool, before a write
        if (key is None) != (value is None):
            raise ValueError("give both key and value, or neither")
        slots = m.get("slot_mapping") if isinstance(m, dict) else getattr(m, "slot_mapping", None)
        if key is not None and self.kv_sharing_target_layer_name is None and slots is not None:
            self._store(key, value, kv_cache, slots, ks, vs)
        out = self._forward(_leading(query, n), None, None, kv_cache, md, k_scale=ks,
                            v_scale=vs, output=_leading(output, n))
        return out if output is None else output

    def _forward(self, query, key, value, kv_cache, attn_metadata, k_scale=1.0, v_scale=1.0,
                 output=None, attn_type=None):
        """The first form of :meth:`forward`."""
        # vLLM <= 0.6 passes the type to forward; later versions give it to the constructor
        at = self.attn_type if attn_type is None else _attn_type_code(attn_type)
        md = attn_metadata
        if not isinstance(md, PagedAttnMetadata):
            raise TypeError("attn_metadata must be a PagedAttnMetadata (from the backend's "
                            "metadata builder), got %s" % type(md).__name__)
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_size
        qv = _heads_of(query, H, D, "query")
        T = qv.shape[0]
        kv = vv = None
        if key is not None or value is not None:
            if key is None or value is None:
                raise ValueError("give both key and value, or neither")
            kv = _heads_of(key, Hkv, D, "key")
            vv = _heads_of(value, Hkv, D, "value")
            if kv.kind != vv.kind or kv.shape != vv.shape:
                raise ValueError("key and value must have the same shape and dtype")
        if at == L.PA_ATTN_DECODER and not md.causal:
            raise NotImplementedError("a decoder layer attends causally; this metadata says "
                                      "causal=False")
        if at == L.PA_ATTN_ENCODER:
            expect = md.num_encoder_tokens
        else:
            expect = md.num_tokens
        if T != expect:
            raise ValueError("query has %d tokens; the metadata describes %d" % (T, expect))
        # output
        if output is None:
            out_obj = A.empty_like_rows(qv, (T, H * D), qv.kind)
        else:
            out_obj = output
        ov = _heads_of(out_obj, H, D, "output", output=True)
        if ov.kind != qv.kind:
            raise ValueError("output dtype %s differs from query dtype %s"
                             % (ov.dtype_name(), qv.dtype_name()))
        if ov.shape != qv.shape:
            raise ValueError("output has shape %s (as [tokens, heads, head_size]); the query %s"
                             % (ov.shape, qv.shape))
        ks, vs = A.scalar(k_scale, "k_scale"), A.scalar(v_scale, "v_scale")
        cv = A.view(kv_cache, "kv_cache") if kv_cache is not None else None
        has_cache = cv is not None and cv.size() > 0
        cache = None
        cdt = L.PA_DTYPE_F32
        num_blocks = 1
        if at in (L.PA_ATTN_DECODER, L.PA_ATTN_ENCODER_DECODER):
            if not has_cache:
                if at == L.PA_ATTN_DECODER and kv is not None and all(
                        c == 0 for c in md.context_lens_tensor.tolist()):
                    return self._no_cache_prefill(qv, kv, vv, ov, out_obj, md)
                raise ValueError("kv_cache is required for %s attention"
                                 % ("decoder" if at == L.PA_ATTN_DECODER else "cross"))
            if cv.ndim != 5 or cv.shape[0] != 2 or cv.shape[3] != Hkv or cv.shape[4] != D:
                raise ValueError("kv_cache must be [2, num_blocks, block_size, num_kv_heads=%d, "
                                 "head_size=%d], got shape %s" % (Hkv, D, cv.shape))
            if cv.shape[2] != md.block_size:
                raise ValueError("kv_cache block_size %d differs from the metadata's %d"
                                 % (cv.shape[2], md.block_size))
            kc = A.View(None, cv.ptr, cv.shape[1:], cv.strides[1:], cv.kind, cv.itemsize,
                        cv.torch)
            vc = A.View(None, cv.ptr + cv.strides[0] * cv.itemsize, cv.shape[1:], cv.strides[1:],
                        cv.kind, cv.itemsize, cv.torch)
            cdt = C.cache_dtype_of(cv, self.kv_cache_dtype, "kv_cache")
            cache = C.paged_cache(kc, vc, cdt, "kv_cache[0]", "kv_cache[1]")
            num_blocks = cache.num_blocks
            if kv is not None:  # the new keys and values go into the cache
                A.require_writable(cv, "kv_cache")
        elif kv is None:
            raise ValueError("encoder attention needs key and value")
        fp8 = cdt in (L.PA_DTYPE_FP8_E4M3, L.PA_DTYPE_FP8_E5M2)
        if not fp8:
            ks = vs = 1.0
        kvd = kv.kind if kv is not None else qv.kind
        layer = self._layer(qv.kind, kvd, ov.kind, cdt, ks, vs, at)
        ctx = layer.context(self.backend)
        if at == L.PA_ATTN_ENCODER:
            if kv.shape[0] != T or vv.shape[0] != T:
                raise ValueError("key and value have %d and %d rows for %d encoder tokens"
                                 % (kv.shape[0], vv.shape[0], T))
            batch = md.batch(num_blocks, encoder_self=True)
        elif at == L.PA_ATTN_ENCODER_DECODER:
            if md.num_encoder_tokens == 0:
                raise ValueError("cross-attention needs encoder_seq_lens in the metadata")
            if md.cross_block_tables is None:
                raise ValueError("cross-attention needs cross_block_tables in the metadata")
            if kv is not None and (kv.shape[0] != md.num_encoder_tokens or
                                   vv.shape[0] != md.num_encoder_tokens):
                raise ValueError("key and value have %d and %d rows; the metadata has %d encoder "
                                 "tokens" % (kv.shape[0], vv.shape[0], md.num_encoder_tokens))
            batch = md.batch(num_blocks, num_cross_blocks=num_blocks)
        else:
            if kv is not None and (kv.shape[0] != T or vv.shape[0] != T):
                raise ValueError("key and value have %d and %d rows for %d query tokens"
                                 % (kv.shape[0], vv.shape[0], T))
            batch = md.batch(num_blocks, encoder_only=at == L.PA_ATTN_ENCODER_ONLY)
        plan = batch.plan(ctx, layer)
        C.forward(ctx, layer, batch, qv.ptr, qv.strides[0],
                  kv.ptr if kv is not None else None, kv.strides[0] if kv is not None else 0,
                  vv.ptr if vv is not None else None, vv.strides[0] if vv is not None else 0,
                  cache, ov.ptr, ov.strides[0], plan=plan)
        return out_obj

    def _no_cache_prefill(self, qv, kv, vv, ov, out_obj, md):
        """Profiling run (empty kv_cache): causal attention over the step's own tokens."""
        if kv.shape[0] != md.num_tokens or vv.shape[0] != md.num_tokens:
            raise ValueError("key and value have %d and %d rows for %d query tokens"
                             % (kv.shape[0], vv.shape[0], md.num_tokens))
        cu = md.query_start_loc
        src = _attn.packed_source(kv, vv, cu.astype(np.int64), kv.kind)
        n = md.num_seqs
        qlens = np.asarray(md.query_lens[:n], dtype=np.int64)
        seqs = _attn.packed_seqs(cu[:n], qlens, qlens, cu[:n], kv.shape[0])
        win = (self.sliding_window - 1, 0) if self.sliding_window else (-1, -1)
        if self.blocksparse is not None:
            raise NotImplementedError("block-sparse attention needs a kv_cache")
        _attn.run(qv, ov, None, src, seqs, causal=True, window=win, scale=self.scale,
                  softcap=self.logits_soft_cap, alibi=self.alibi_slopes, sinks=self.sinks,
                  cache_dtype=kv.kind, k_scale=1.0, v_scale=1.0, backend=self.backend)
        return out_obj


def _impl_positional(args, blocksparse_params, logits_soft_cap, attn_type, kv_sharing):
    """The impl's positional arguments after kv_cache_dtype, in vLLM <= 0.9's order
    (blocksparse_params, logits_soft_cap, attn_type) or vLLM v1's (logits_soft_cap, attn_type,
    kv_sharing_target_layer_name)."""
    if len(args) > 3:
        raise TypeError("PagedAttnImpl takes at most 10 positional arguments (%d given)"
                        % (7 + len(args)))

    def number(x):
        return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)

    v1 = number(args[0]) or (args[0] is None and len(args) > 1 and args[1] is not None and
                             not number(args[1]))
    names = (("logits_soft_cap", "attn_type", "kv_sharing_target_layer_name") if v1 else
             ("blocksparse_params", "logits_soft_cap", "attn_type"))
    vals = {"blocksparse_params": blocksparse_params, "logits_soft_cap": logits_soft_cap,
            "attn_type": attn_type, "kv_sharing_target_layer_name": kv_sharing}
    for name, x in zip(names, args):
        vals[name] = x
    return (vals["blocksparse_params"], vals["logits_soft_cap"], vals["attn_type"],
            vals["kv_sharing_target_layer_name"])


def _is_array(x):
    return isinstance(x, np.ndarray) or A.is_torch(x)


def _layer_scale(layer, which):
    """vLLM's layer scale: ``_k_scale_float`` (vLLM >= 0.8), else ``_k_scale`` (a number or a
    one-element tensor), else 1."""
    x = getattr(layer, "_%s_scale_float" % which, None)
    if x is None:
        x = getattr(layer, "_%s_scale" % which, 1.0)
    return A.scalar(x, "layer._%s_scale" % which)


def _leading(x, n):
    """The first n rows of x (vLLM v1 pads its token arrays past the real tokens)."""
    if x is None or len(x.shape) == 0 or x.shape[0] <= n:
        return x
    return x[:n]


_V1_FIELDS = ("query_start_loc", "seq_lens", "block_table", "block_table_tensor",
              "slot_mapping", "num_actual_tokens", "causal", "num_reqs")
_V1_CACHE_FIELDS = ("block_table", "block_table_tensor", "slot_mapping")
_v1_cache = OrderedDict()
_v1_lock = threading.Lock()


def _after_fork_in_child():
    """A forked child: the lock may have been held by a parent thread."""
    global _v1_lock
    _v1_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _v1_metadata(m, block_size, cached=True, cross=False):
    """PagedAttnMetadata of vLLM v1-style metadata (an object or a dict with its fields), made
    once per content: every layer of a step passes the same metadata, and the conversion walks
    every request, while the key is a copy of its arrays. cached False: the block tables and
    slots are left out (a layer without a cache). cross: the metadata of a cross-attention
    layer (seq_lens are encoder lengths, block tables the cross cache's; its slots are the
    encoder tokens', written by the caller)."""
    if isinstance(m, dict):
        fields = {k: m.get(k) for k in _V1_FIELDS}
    else:
        fields = {k: getattr(m, k, None) for k in _V1_FIELDS}
    if not cached:
        for k in _V1_CACHE_FIELDS:
            fields[k] = None
    if fields["query_start_loc"] is None or fields["seq_lens"] is None:
        raise TypeError("attn_metadata must be a PagedAttnMetadata or carry vLLM v1's fields "
                        "query_start_loc and seq_lens, got %s" % type(m).__name__)
    if fields["causal"] is None:
        fields["causal"] = not cross
    key = [block_size, bool(cross)]
    if cross:
        fields["slot_mapping"] = None
    for x in fields.values():
        if type(x) is not np.ndarray:
            if x is None or isinstance(x, (bool, int, np.integer)):
                key.append(x if x is None else int(x))
                continue
            if A.is_torch(x):
                x = x.numpy() if x.is_cpu and not x.requires_grad else x.detach().cpu().numpy()
            x = np.asarray(x)
        key.append((x.dtype, x.shape, x.tobytes()))
    key = tuple(key)
    with _v1_lock:
        md = _v1_cache.get(key)
        if md is not None:
            _v1_cache.move_to_end(key)
            return md
    md = (_v1_cross_metadata(block_size, **fields) if cross else
          _metadata_from_vllm_fields(block_size=block_size, **fields))
    with _v1_lock:
        _v1_cache[key] = md
        while len(_v1_cache) > 4:
            _v1_cache.popitem(last=False)
    return md


def _heads_of(x, heads, D, name, output=False):
    """_heads_view of array x: [T, heads*D] or [T, heads, D] -> a [T, heads, D] View. Ordinary
    rows take a short path (A.rows_fast: what an engine passes every layer); anything else the
    general one, with its checks, copies and errors."""
    v = A.rows_fast(x, heads, D, output)
    if v is not None:
        return v
    return _heads_view(x, A.float_view(x, name, write=output), heads, D, name, output=output)


def _heads_view(x, v, heads, D, name, output=False):
    """[T, heads*D] or [T, heads, D] -> [T, heads, D] View with contiguous heads and rows that
    follow each other. An input whose rows do not (broadcast, reversed, overlapping, strided
    inside) is copied to a contiguous array; an output is a ValueError."""
    if v.ndim == 2:
        if v.shape[1] != heads * D:
            raise ValueError("%s must be [num_tokens, %d * %d], got shape %s"
                             % (name, heads, D, v.shape))
        ok = v.size() == 0 or ((heads * D <= 1 or v.strides[1] == 1) and
                               (v.shape[0] <= 1 or v.strides[0] >= heads * D))
        if not ok:
            if output:
                raise ValueError("%s: the feature dim must be contiguous and rows must not "
                                 "overlap (strides %s)" % (name, v.strides))
            x = x.contiguous() if v.torch else np.ascontiguousarray(x)
            v = A.view(x, name)
        rs = v.strides[0] if v.shape[0] > 1 else heads * D
        return A.View(v.obj, v.ptr, (v.shape[0], heads, D), (rs, D, 1), v.kind, v.itemsize,
                      v.torch)
    if v.ndim == 3:
        if v.shape[1:] != (heads, D):
            raise ValueError("%s must be [num_tokens, %d, %d], got shape %s"
                             % (name, heads, D, v.shape))
        if not output:
            v = A.input_rows(v, name)
        rs = A.check_rows(v, name)
        return A.View(v.obj, v.ptr, v.shape, (rs, D, 1), v.kind, v.itemsize, v.torch)
    raise ValueError("%s must be 2-D [num_tokens, heads * head_size], got shape %s"
                     % (name, v.shape))


# ---- backend ------------------------------------------------------------------------------------

class PagedAttnBackend:
    """vLLM's AttentionBackend for one pagedattn library backend."""

    # vLLM's flag: forward writes into a caller-allocated output when one is given
    accept_output_buffer = True
    # vLLM's flag (>= 0.16): forward writes the step's new K/V into the cache itself (the impl's
    # do_kv_cache_update does the same alone, for engines that store before attending)
    forward_includes_kv_cache_update = True

    def __init__(self, name):
        self._name = name
        self._head_sizes = None
        self._impl_cls = type("PagedAttnImpl_" + name, (PagedAttnImpl,), {"backend_name": name})

    def get_name(self):
        """The library backend's name (``"cpu"``, ``"reference"``, ...)."""
        return self._name

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size,
                           cache_dtype_str="auto"):
        """``(2, num_blocks, block_size, num_kv_heads, head_size)``: FlashAttention's layout,
        keys in ``[0]`` and values in ``[1]``. cache_dtype_str (vLLM's ``kv_cache_dtype``:
        ``"auto"``, ``"bfloat16"``, ``"float16"``, ``"fp8"``, ``"fp8_e4m3"``, ``"fp8_e5m2"``, ...)
        does not change the shape: an fp8 cache is that shape of uint8."""
        for n, x in (("num_blocks", num_blocks), ("block_size", block_size),
                     ("num_kv_heads", num_kv_heads), ("head_size", head_size)):
            if int(x) < 1:
                raise ValueError("%s must be >= 1, got %r" % (n, x))
        if not isinstance(cache_dtype_str, str):
            raise ValueError("cache_dtype_str must be a string such as 'auto' or 'fp8', got %r"
                             % (cache_dtype_str,))
        return (2, int(num_blocks), int(block_size), int(num_kv_heads), int(head_size))

    def supports_head_size(self, head_size):
        """Whether the backend computes attention with this head size (as vLLM's
        ``AttentionBackend.supports_head_size``; the library takes 1..512, a backend may take
        fewer)."""
        try:
            h = int(head_size)
        except (TypeError, ValueError):
            return False
        if h < 1 or h > 512 or h != head_size:
            return False
        layer = C.Layer(1, 1, h)  # not get_layer: 512 probes would evict the cached layers
        return L.lib.pa_backend_supports(L.backend_handle(self._name), layer.handle, None, 0) == 0

    def get_supported_head_sizes(self):
        """Every head size the backend supports, ascending (vLLM's
        ``get_supported_head_sizes``; here every size from 1 to 512 on the host backends)."""
        if self._head_sizes is None:
            self._head_sizes = [h for h in range(1, 513) if self.supports_head_size(h)]
        return list(self._head_sizes)

    def get_kv_cache_stride_order(self, include_num_layers_dimension=False):
        """How this backend wants the cache laid out in memory, as vLLM's
        ``AttentionBackend.get_kv_cache_stride_order``: the permutation of
        :meth:`get_kv_cache_shape`'s dimensions in memory order, outermost first. Allocate the
        permuted shape contiguously and view it back in the logical order (or use
        :meth:`new_kv_cache`)::

            order = backend.get_kv_cache_stride_order()
            phys = np.zeros([shape[i] for i in order], dtype)
            kv_cache = phys.transpose(np.argsort(order))   # the logical shape, permuted strides

        Every call takes any of these layouts (any strides); this one is the fastest for the
        backend: the cpu backend's is ``(0, 1, 3, 2, 4)``, each KV head's tokens of a block
        contiguous (HND); FlashAttention's ``[num_blocks, block_size, num_kv_heads, head_size]``
        made decode 10-15% slower from memory at block size 16 (bench/NOTES.md, fifteenth pass).
        include_num_layers_dimension: for a logical ``[num_layers] + shape``, the order with the
        blocks outermost (each block of every layer contiguous, as vLLM asks for KV transfer).
        """
        hnd = int(L.lib.pa_backend_preferred_layout(L.backend_handle(self._name))) == L.PA_LAYOUT_HND
        if include_num_layers_dimension:  # [num_layers, 2, num_blocks, block_size, kv_heads, D]
            return (2, 0, 1, 4, 3, 5) if hnd else (2, 0, 1, 3, 4, 5)
        return (0, 1, 3, 2, 4) if hnd else (0, 1, 2, 3, 4)

    def new_kv_cache(self, num_blocks, block_size, num_kv_heads, head_size, dtype=np.float32):
        """A zeroed numpy KV cache of :meth:`get_kv_cache_shape` in the order of
        :meth:`get_kv_cache_stride_order` (a strided view; keys in ``[0]``, values in ``[1]``).
        dtype: a numpy dtype (``ml_dtypes.bfloat16``; ``np.uint8`` for fp8 caches)."""
        shape = self.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
        order = self.get_kv_cache_stride_order()
        phys = np.zeros([shape[i] for i in order], dtype)
        return phys.transpose(np.argsort(order))

    def get_impl_cls(self):
        """The AttentionImpl class bound to this backend."""
        return self._impl_cls

    # ---- vLLM v1's backend-selection queries ----

    # every cache dtype vLLM names for these layouts; forward writes the new K/V itself
    supported_kv_cache_dtypes = ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
    forward_includes_kv_cache_update = True

    def supports_dtype(self, dtype):
        """Whether queries/outputs of ``dtype`` are taken (float32, float16, bfloat16; a torch or
        numpy dtype or its name)."""
        if A.is_torch_dtype(dtype):
            name = str(dtype).replace("torch.", "")
        else:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = str(dtype)
        return name in ("float32", "float16", "bfloat16")

    def supports_kv_cache_dtype(self, kv_cache_dtype):
        return kv_cache_dtype is None or kv_cache_dtype in self.supported_kv_cache_dtypes

    @staticmethod
    def get_supported_kernel_block_sizes():
        """Every block size works: ``[1]``, read as "any multiple of 1" by vLLM."""
        return [1]

    def supports_block_size(self, block_size):
        return block_size is None or (int(block_size) == block_size and block_size >= 1)

    @staticmethod
    def is_mla():
        return False

    @staticmethod
    def is_sparse():
        """vLLM's sparse (MLA indexer) attention; block-sparse attention is an impl parameter."""
        return False

    @staticmethod
    def supports_sink():
        return True

    @staticmethod
    def supports_attn_type(attn_type):
        try:
            _attn_type_code(attn_type)
        except ValueError:
            return False
        return True

    @staticmethod
    def supports_non_causal():
        """Non-causal attention over the paged cache in a decoder layer: no."""
        return False

    def supports_batch_invariance(self):
        """The host backends give every sequence the same bits whatever else is in the batch and
        whatever the thread count (tested); other backends are not promised here."""
        return self._name in ("cpu", "reference")

    def validate_configuration(self, head_size, dtype, kv_cache_dtype, block_size, use_mla=False,
                               has_sink=False, use_sparse=False, use_mm_prefix=False,
                               use_per_head_quant_scales=False, device_capability=None,
                               attn_type="decoder", use_non_causal=False,
                               use_batch_invariant=False, **unused):
        """vLLM v1's check: the reasons this backend cannot take the configuration (empty: it
        can)."""
        why = []
        for ok, reason in ((self.supports_head_size(head_size), "head_size not supported"),
                           (self.supports_dtype(dtype), "dtype not supported"),
                           (self.supports_kv_cache_dtype(kv_cache_dtype),
                            "kv_cache_dtype not supported"),
                           (self.supports_block_size(block_size), "block_size not supported"),
                           (not use_mla, "MLA not supported"),
                           (not use_sparse, "sparse not supported"),
                           (not use_mm_prefix,
                            "partial multimodal token full attention not supported"),
                           (not use_per_head_quant_scales, "per-head quant scales not supported"),
                           (self.supports_attn_type(attn_type),
                            "attention type %s not supported" % (attn_type,)),
                           (not use_non_causal, "non-causal attention not supported"),
                           (not use_batch_invariant or self.supports_batch_invariance(),
                            "batch invariance not supported")):
            if not ok:
                why.append(reason)
        return why

    @staticmethod
    def get_metadata_cls():
        """The metadata class (:class:`PagedAttnMetadata`)."""
        return PagedAttnMetadata

    @staticmethod
    def get_builder_cls():
        """The metadata builder class (:class:`PagedAttnMetadataBuilder`)."""
        return PagedAttnMetadataBuilder

    @staticmethod
    def make_metadata(*args, **kwargs):
        """Metadata in one call.

        Either ``PagedAttnMetadataBuilder(block_size).build(...)``'s arguments plus keyword
        ``block_size`` (default 16), or vLLM's metadata fields as keywords (``num_prefills``,
        ``num_prefill_tokens``, ``num_decode_tokens``, ``slot_mapping``, ``seq_lens`` /
        ``seq_lens_tensor``, ``context_lens_tensor``, ``block_tables``, ``encoder_seq_lens``,
        ``cross_slot_mapping``, ``cross_block_tables``, ...; the max_* fields and other extras
        are derived or ignored). In the latter form, a sequence's block table may be empty when
        the slot mapping gives its blocks (vLLM's plain prefill)."""
        if not args and any(k in kwargs for k in _VLLM_FIELDS):
            return _metadata_from_vllm_fields(**kwargs)
        bs = kwargs.pop("block_size", 16)
        return PagedAttnMetadataBuilder(bs).build(*args, **kwargs)

    @staticmethod
    def make_metadata_builder(block_size=16):
        """A :class:`PagedAttnMetadataBuilder` for caches of ``block_size`` tokens per block."""
        return PagedAttnMetadataBuilder(block_size)

    def swap_blocks(self, src_kv_cache, dst_kv_cache, src_to_dst):
        """Copies blocks ``src_to_dst[i, 0]`` of ``src_kv_cache`` to blocks ``src_to_dst[i, 1]``
        of ``dst_kv_cache`` (both ``[2, num_blocks, ...]``, keys and values)."""
        sv = A.view(src_kv_cache, "src_kv_cache")
        dv = A.view(dst_kv_cache, "dst_kv_cache", write=True)
        for v, n in ((sv, "src_kv_cache"), (dv, "dst_kv_cache")):
            if v.ndim < 3 or v.shape[0] != 2:
                raise ValueError("%s must be [2, num_blocks, ...], got shape %s" % (n, v.shape))
        if sv.shape[2:] != dv.shape[2:] or sv.kind != dv.kind:
            raise ValueError("src_kv_cache %s and dst_kv_cache %s must have the same block shape "
                             "and dtype" % (sv.shape, dv.shape))
        sh, dh = _kv_halves(sv), _kv_halves(dv)
        ops._same_block_order(sh[0], dh[0], "src_kv_cache", "dst_kv_cache")
        sc = ops._pool_cache(*sh, "src_kv_cache[0]", "src_kv_cache[1]")
        dc = ops._pool_cache(*dh, "dst_kv_cache[0]", "dst_kv_cache[1]")
        ops._swap(sc, dc, ops._pairs(src_to_dst, "src_to_dst"), self._name)

    def copy_blocks(self, kv_caches, src_to_dists):
        """Copy-on-write: for every layer's ``[2, num_blocks, ...]`` cache, copies block
        ``src_to_dists[i, 0]`` to ``src_to_dists[i, 1]`` in keys and values."""
        ks, vs = [], []
        for i, c in enumerate(kv_caches):
            v = A.view(c, "kv_caches[%d]" % i)
            if v.ndim < 3 or v.shape[0] != 2:
                raise ValueError("kv_caches[%d] must be [2, num_blocks, ...], got shape %s"
                                 % (i, v.shape))
            ks.append(c[0])
            vs.append(c[1])
        ops.copy_blocks(ks, vs, src_to_dists, backend=self._name)

    def __repr__(self):
        return "PagedAttnBackend(%r)" % self._name


_VLLM_FIELDS = ("seq_lens_tensor", "num_prefill_tokens", "num_decode_tokens",
                "context_lens_tensor", "max_prefill_seq_len", "max_decode_seq_len",
                "encoder_seq_lens_tensor", "num_encoder_tokens", "max_encoder_seq_len",
                "multi_modal_placeholder_index_maps", "enable_kv_scales_calculation",
                "use_cuda_graph", "max_query_len", "query_start_loc", "seq_start_loc",
                # vLLM v1 (FlashAttentionMetadata, CommonAttentionMetadata)
                "num_actual_tokens", "block_table", "block_table_tensor", "max_seq_len",
                "use_cascade", "common_prefix_len", "num_reqs")


def _opt_list(x):
    if x is None:
        return None
    return [int(v) for v in _list(x)]


def _table_rows(x, n, name, at_least=False):
    """_rows of vLLM-style block tables, None when absent or empty (no table at all)."""
    if x is None or not np.asarray(_list(x)).size:
        return None
    return _rows(x, n, name, at_least=at_least)


def _v1_requests(sl, qsl, num_reqs, num_actual_tokens):
    """vLLM v1's requests: (n, query lengths) of seq_lens and query_start_loc, whose arrays may
    be padded past num_reqs (CommonAttentionMetadata), as num_actual_tokens may count padding
    tokens past the requests' (never fewer)."""
    n = min(len(sl), len(qsl) - 1)
    if num_reqs is not None:
        n = min(n, int(num_reqs))
    if n < 1 or qsl[0] != 0:
        raise ValueError("query_start_loc must hold num_reqs + 1 offsets from 0")
    ql = [qsl[i + 1] - qsl[i] for i in range(n)]
    if num_actual_tokens is not None and int(num_actual_tokens) < qsl[n] - qsl[0]:
        raise ValueError("num_actual_tokens %d is less than the %d tokens of query_start_loc"
                         % (int(num_actual_tokens), qsl[n] - qsl[0]))
    return n, ql


def _v1_cross_metadata(block_size, query_start_loc=None, seq_lens=None, block_table=None,
                       block_table_tensor=None, num_actual_tokens=None, causal=False,
                       num_reqs=None, **ignored):
    """The metadata of a cross-attention layer from vLLM v1's (CrossAttentionBuilder): per
    request, the decoder tokens of query_start_loc attend (not causally) to seq_lens[i] encoder
    tokens held by the cross cache blocks of its block_table row. Nothing is written through
    it (the slots of both caches are -1; the caller writes the encoder K/V)."""
    if causal:
        raise NotImplementedError("cross-attention is not causal; this metadata says "
                                  "causal=True")
    if query_start_loc is None or seq_lens is None:
        raise TypeError("cross-attention metadata needs query_start_loc and seq_lens")
    sl, qsl = _opt_list(seq_lens), _opt_list(query_start_loc)
    n, ql = _v1_requests(sl, qsl, num_reqs, num_actual_tokens)
    keep = [i for i in range(n) if ql[i] != 0]
    if not keep:
        raise ValueError("the metadata holds no tokens")
    if any(sl[i] < 0 for i in keep):
        raise ValueError("seq_lens (encoder lengths) must be >= 0")
    tables = block_table if block_table is not None else block_table_tensor
    rows = _table_rows(tables, n, "block_table", at_least=True)
    if rows is None:
        raise ValueError("cross-attention needs block_table (the cross cache's tables)")
    bs = int(block_size)
    if bs < 1:
        raise ValueError("block_size must be >= 1, got %d" % bs)
    enc = [int(sl[i]) for i in keep]
    ctabs = [[int(b) for b in rows[i][:-(-int(sl[i]) // bs)]] for i in keep]
    qk = [int(ql[i]) for i in keep]
    return PagedAttnMetadataBuilder(bs).build(
        seq_lens=qk, query_lens=qk, num_prefills=len(keep), encoder_seq_lens=enc,
        cross_block_tables=ctabs, slot_mapping=np.full(sum(qk), -1, np.int64),
        cross_slot_mapping=np.full(sum(enc), -1, np.int64), causal=False)


def _metadata_from_vllm_fields(block_size=16, num_prefills=None, seq_lens=None,
                               seq_lens_tensor=None, context_lens_tensor=None, block_tables=None,
                               slot_mapping=None, encoder_seq_lens=None,
                               encoder_seq_lens_tensor=None, cross_block_tables=None,
                               cross_slot_mapping=None, num_decode_tokens=None,
                               query_start_loc=None, block_table=None, block_table_tensor=None,
                               num_actual_tokens=None, causal=True, num_reqs=None, **ignored):
    sl = _opt_list(seq_lens) if seq_lens is not None else _opt_list(seq_lens_tensor)
    if sl is None:
        raise ValueError("vLLM-style metadata needs seq_lens or seq_lens_tensor")
    if block_tables is None:  # vLLM v1's names
        block_tables = block_table if block_table is not None else block_table_tensor
    qsl = _opt_list(query_start_loc)
    n = len(sl)
    ctx = _opt_list(context_lens_tensor)
    if (ctx is None or len(ctx) != n) and qsl is not None and num_prefills is None:
        # vLLM v1: no prefill/decode split; every request's new tokens are given by the query
        # start locations (sequences in any order; a request may be a padding entry of no
        # tokens, which is left out)
        n, ql = _v1_requests(sl, qsl, num_reqs, num_actual_tokens)
        keep = [i for i in range(n) if ql[i] != 0 or sl[i] != 0]
        if not keep:
            raise ValueError("the metadata holds no tokens")
        slots = (A.to_np(slot_mapping, np.int64, "slot_mapping", 1)[:qsl[n] - qsl[0]]
                 if slot_mapping is not None else None)
        # (v1's tables may have padding rows past the requests, as its other arrays)
        rows = _table_rows(block_tables, n, "block_tables", at_least=True)
        bs = int(block_size)
        b = PagedAttnMetadataBuilder(bs)
        return b.build(seq_lens=[sl[i] for i in keep], query_lens=[ql[i] for i in keep],
                       block_tables=None if rows is None else [rows[i] for i in keep],
                       slot_mapping=slots, causal=causal)
    if num_prefills is None:
        num_prefills = 0 if num_decode_tokens else n
    num_prefills = int(num_prefills)
    if ctx is None or len(ctx) != n:
        ctx = [0 if i < num_prefills else sl[i] - 1 for i in range(n)]
    ql = [s - c for s, c in zip(sl, ctx)]
    bs = int(block_size)
    slots = (A.to_np(slot_mapping, np.int64, "slot_mapping", 1)
             if slot_mapping is not None else None)
    tables = []
    rows = _table_rows(block_tables, n, "block_tables")
    start = 0
    for i in range(n):
        need = -(-sl[i] // bs)
        t = [int(b) for b in rows[i][:need]] if rows is not None else []
        if len(t) < need and slots is not None and ctx[i] == 0:
            # derive the table from the slots of a plain prefill
            sm = slots[start:start + ql[i]]
            pos = np.arange(0, sl[i], bs)
            if np.all(sm[pos] >= 0):
                t = (sm[pos] // bs).astype(int).tolist()
        tables.append(t if t else None)
        start += ql[i]
    enc = _opt_list(encoder_seq_lens) if encoder_seq_lens is not None else \
        _opt_list(encoder_seq_lens_tensor)
    ctabs = _table_rows(cross_block_tables, n, "cross_block_tables")
    b = PagedAttnMetadataBuilder(bs)
    return b.build(seq_lens=sl, query_lens=ql,
                   block_tables=None if all(t is None for t in tables) else
                   [t if t is not None else [] for t in tables],
                   num_prefills=num_prefills, encoder_seq_lens=enc, cross_block_tables=ctabs,
                   slot_mapping=slots, cross_slot_mapping=cross_slot_mapping, causal=causal)


def _kv_halves(v):
    k = A.View(None, v.ptr, v.shape[1:], v.strides[1:], v.kind, v.itemsize, v.torch)
    val = A.View(None, v.ptr + v.strides[0] * v.itemsize, v.shape[1:], v.strides[1:], v.kind,
                 v.itemsize, v.torch)
    return k, val


_backends = {}


def get_attn_backend(name=None):
    """The attention backend object for library backend ``name`` (default: ``$PAGEDATTN_BACKEND``
    or the best available backend that reads host memory: this package passes numpy arrays and
    CPU tensors). Raises ValueError for an unknown name and NotImplementedError for one that
    cannot run on this machine."""
    if name is None and os.environ.get("PAGEDATTN_BACKEND"):
        out = L.pa_backend_p()
        L.check(L.lib.pa_backend_select(None, None, ctypes.byref(out)), "get_attn_backend")
        name = L.lib.pa_backend_name(out).decode()
    elif name is None:
        host = [n for n in available_backends() if L.backend_memory(n) == L.PA_MEMORY_HOST]
        name = host[0] if host else "reference"
    name = str(name)
    b = _backends.get(name)
    if b is None:
        L.backend_handle(name)
        ok, reason = L.backend_available(name)
        if not ok:
            raise L.PagedAttnNotImplementedError(
                "backend %r cannot run on this machine: %s" % (name, reason), 7, "UNAVAILABLE",
                reason)
        b = PagedAttnBackend(name)
        _backends[name] = b
    return b
