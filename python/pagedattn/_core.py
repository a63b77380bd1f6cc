"""Thin object wrappers over the C handles: layers, batches, cache views, forward."""

import ctypes
import os
import threading
from collections import OrderedDict
from ctypes import byref, c_float, c_int32

import numpy as np

from . import _arrays as A
from . import _lib as L

lib = L.lib


# ---- layers -------------------------------------------------------------------------------------

class Layer:
    """An immutable pa_layer (validated by the library at creation)."""

    def __init__(self, num_heads, num_kv_heads, head_size, scale=None, attn_type=L.PA_ATTN_DECODER,
                 window=(-1, -1), sliding_window=0, alibi_slopes=None, logits_soft_cap=0.0,
                 sinks=None, blocksparse=None, q_dtype=L.PA_DTYPE_F32, kv_dtype=L.PA_DTYPE_F32,
                 out_dtype=L.PA_DTYPE_F32, cache_dtype=L.PA_DTYPE_F32, k_scale=1.0, v_scale=1.0):
        cfg = L.pa_layer_config()
        lib.pa_layer_config_init(byref(cfg), int(num_heads), int(num_kv_heads), int(head_size))
        if scale is not None:
            cfg.scale = float(scale)
        cfg.attn_type = int(attn_type)
        cfg.window_left, cfg.window_right = int(window[0]), int(window[1])
        cfg.sliding_window = int(sliding_window or 0)
        self._alibi = alibi_slopes
        self._sinks = sinks
        if alibi_slopes is not None:
            cfg.alibi_slopes = A.ptr(alibi_slopes, c_float)
        cfg.logits_soft_cap = float(logits_soft_cap or 0.0)
        if sinks is not None:
            cfg.sinks = A.ptr(sinks, c_float)
        if blocksparse is not None:
            bs = cfg.blocksparse
            (bs.block_size, bs.local_blocks, bs.vert_stride, bs.homo_head, bs.head_sliding_step,
             bs.tp_rank) = [int(x) for x in blocksparse]
        cfg.q_dtype, cfg.kv_dtype, cfg.out_dtype, cfg.cache_dtype = (
            int(q_dtype), int(kv_dtype), int(out_dtype), int(cache_dtype))
        cfg.k_scale, cfg.v_scale = float(k_scale), float(v_scale)
        self.cfg = cfg
        h = L.pa_layer_p()
        L.check(lib.pa_layer_create(byref(cfg), byref(h)), "pa_layer_create")
        self.handle = h
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self._backend_cache = {}

    def __del__(self):
        h = getattr(self, "handle", None)
        if h and lib is not None:
            try:
                lib.pa_layer_destroy(h)
            except Exception:  # interpreter shutdown
                pass
            self.handle = None

    def context(self, backend=None):
        """The context of the backend chosen for this layer (`backend` name or automatic)."""
        key = backend or ""
        name = self._backend_cache.get(key)
        if name is None:
            if not backend and not os.environ.get("PAGEDATTN_BACKEND"):
                # Automatic choice among the host-memory backends: this package hands the
                # library host arrays (numpy, CPU tensors), which a device backend cannot read.
                name = self._first_host_backend()
            else:
                out = L.pa_backend_p()
                L.check(lib.pa_backend_select(backend.encode() if backend else None,
                                              self.handle, byref(out)),
                        "backend selection" + (" (%r)" % backend if backend else ""))
                name = lib.pa_backend_name(out).decode()
            self._backend_cache[key] = name
        return L.get_context(name)

    def _first_host_backend(self):
        reasons = []
        for n in L.backend_names():
            ok, why = L.backend_available(n)
            if not ok or L.backend_memory(n) != L.PA_MEMORY_HOST:
                continue
            out = L.pa_backend_p()
            if lib.pa_backend_select(n.encode(), self.handle, byref(out)) == 0:
                return n
            reasons.append("%s: %s" % (n, lib.pa_last_error().decode("utf-8", "replace")))
        raise NotImplementedError("no host-memory backend supports this layer (%s)"
                                  % "; ".join(reasons))


_layer_cache = OrderedDict()
_layer_lock = threading.Lock()


_fork_generation = 0  # how many forks lie between this process and the one that imported us
_renew_lock = threading.Lock()


def _renew_layer_lock():  # a forked child: the locks may have been held by a parent thread
    global _layer_lock, _caches_lock, _fork_generation, _renew_lock
    _layer_lock = threading.Lock()
    _caches_lock = threading.Lock()
    _renew_lock = threading.Lock()
    _fork_generation += 1


class ForkSafeLock:
    """A lock for an object that may outlive a fork: the module locks are renewed in a forked
    child, but a batch's or a metadata's own lock may have been held by another parent thread
    at the fork (one waiting for a context's lock to make a plan, say), and the child, which
    has none of those threads, would wait on it for ever. This one is replaced by a new lock
    the first time it is taken in a process forked after it was made."""

    __slots__ = ("_generation", "_lock")

    def __init__(self):
        self._generation = _fork_generation
        self._lock = threading.Lock()

    def __enter__(self):
        if self._generation != _fork_generation:
            with _renew_lock:
                if self._generation != _fork_generation:
                    self._lock = threading.Lock()
                    self._generation = _fork_generation
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()

    def locked(self):
        return self._lock.locked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_layer_lock)


def get_layer(**kw):
    """A cached Layer for these parameters (layers are immutable, so they can be shared). The
    key keeps the keywords in the caller's order (each call site passes one order; one more
    order is one more entry for the same layer, never a wrong one)."""
    key = tuple(kw.items())
    try:
        hash(key)
    except TypeError:  # arrays (ALiBi slopes, sinks) and lists: by value
        key = tuple((k, (v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray)
                     else tuple(v) if isinstance(v, list) else v) for k, v in key)
    with _layer_lock:
        layer = _layer_cache.get(key)
        if layer is not None:
            _layer_cache.move_to_end(key)
            return layer
    layer = Layer(**kw)
    with _layer_lock:
        _layer_cache[key] = layer
        while len(_layer_cache) > 256:
            _layer_cache.popitem(last=False)
    return layer


# ---- batches ------------------------------------------------------------------------------------

def _struct_words(ct):
    """Where the fields of ctypes Structure `ct` sit: {name: index} in 32-bit words for the
    int32 fields and in 64-bit words for the pointers, and its size in 32-bit words."""
    ints, ptrs = {}, {}
    for name, t in ct._fields_:
        off = getattr(ct, name).offset
        if issubclass(t, ctypes._Pointer):
            assert off % 8 == 0 and ctypes.sizeof(t) == 8
            ptrs[name] = off // 8
        else:
            assert t is c_int32 and off % 4 == 0
            ints[name] = off // 4
    assert ctypes.sizeof(ct) % 8 == 0
    return ints, ptrs, ctypes.sizeof(ct) // 4


_SEQ_WORD, _SEQ_ADDR, _SEQ_WORDS = _struct_words(L.pa_seq)


def table_columns(tables):
    """(addresses, lengths, keep) of a list of int32 block tables (None or empty: NULL, 0)."""
    n = len(tables)
    addr = np.zeros(n, dtype=np.uintp)
    num = np.zeros(n, dtype=np.int64)
    keep = []
    for i, t in enumerate(tables):
        if t is not None and len(t):
            t = np.ascontiguousarray(t, dtype=np.int32)
            keep.append(t)
            addr[i] = t.ctypes.data
            num[i] = t.size
    return addr, num, keep


class Batch:
    """A validated pa_batch. `seqs` is a list of dicts with context_len, query_len, is_prefill,
    block_table (int32 array or None), encoder_len, cross_block_table; `Batch.columns` makes one
    from per-sequence arrays instead."""

    def __init__(self, block_size, num_blocks, seqs, num_cross_blocks=0, slot_mapping=None,
                 cross_slot_mapping=None):
        g = [s.get for s in seqs]
        # (keep, ckeep: the int32 copies behind the addresses, alive until the library copies them)
        addr, num, keep = table_columns([s("block_table") for s in g])
        caddr, cnum, ckeep = table_columns([s("cross_block_table") for s in g])
        self._init(block_size, num_blocks, len(seqs),
                   [s("context_len", 0) for s in g], [s("query_len") for s in g],
                   [1 if s("is_prefill", True) else 0 for s in g], addr, num,
                   [s("encoder_len", 0) for s in g], caddr, cnum, num_cross_blocks,
                   slot_mapping, cross_slot_mapping)

    @classmethod
    def columns(cls, block_size, num_blocks, n, context_len, query_len, is_prefill, table_addr,
                table_len, encoder_len=0, cross_addr=0, cross_len=0, num_cross_blocks=0,
                slot_mapping=None, cross_slot_mapping=None):
        """A batch of n sequences from per-sequence arrays (or scalars for all): table_addr are
        the addresses of int32 block tables of table_len entries (0 for none); the tables must
        stay alive only during this call (the library copies them)."""
        b = cls.__new__(cls)
        b._init(block_size, num_blocks, n, context_len, query_len, is_prefill, table_addr,
                table_len, encoder_len, cross_addr, cross_len, num_cross_blocks, slot_mapping,
                cross_slot_mapping)
        return b

    def _init(self, block_size, num_blocks, n, context_len, query_len, is_prefill, table_addr,
              table_len, encoder_len, cross_addr, cross_len, num_cross_blocks, slot_mapping,
              cross_slot_mapping):
        # the pa_seq array as rows of 32-bit words (int fields) and 64-bit words (pointers)
        rows = max(n, 1)
        raw = np.zeros(rows * _SEQ_WORDS, dtype=np.int32)
        words = raw.reshape(rows, _SEQ_WORDS)
        addrs = raw.view(np.uintp).reshape(rows, _SEQ_WORDS // 2)
        for name, x in (("context_len", context_len), ("query_len", query_len),
                        ("is_prefill", is_prefill), ("num_blocks", table_len),
                        ("encoder_len", encoder_len), ("num_cross_blocks", cross_len)):
            col = _SEQ_WORD[name]
            if isinstance(x, (int, np.integer, bool)):
                if not -2**31 <= int(x) < 2**31:
                    raise ValueError("%s = %d is out of the int32 range" % (name, int(x)))
                words[:n, col] = int(x)
                continue
            x = np.asarray(x)
            if x.shape != (n,):
                raise AssertionError("internal: %s has shape %s for %d sequences"
                                     % (name, x.shape, n))
            words[:n, col] = x
            if x.dtype != np.int32 and x.dtype != np.bool_ and not np.array_equal(
                    words[:n, col], x):
                raise ValueError("%s holds values out of the int32 range" % name)
        for name, x in (("block_table", table_addr), ("cross_block_table", cross_addr)):
            if isinstance(x, (int, np.integer)) and int(x) == 0:
                continue
            addrs[:n, _SEQ_ADDR[name]] = x
        if isinstance(query_len, (int, np.integer)):
            self.num_tokens = n * int(query_len)
        else:
            self.num_tokens = int(words[:n, _SEQ_WORD["query_len"]].sum(dtype=np.int64))
        cfg = L.pa_batch_config()
        cfg.block_size = int(block_size)
        cfg.num_blocks = int(num_blocks)
        cfg.num_cross_blocks = int(num_cross_blocks)
        if slot_mapping is not None:
            slot_mapping = np.ascontiguousarray(slot_mapping, dtype=np.int64)
            cfg.slot_mapping = slot_mapping.ctypes.data
        if cross_slot_mapping is not None:
            cross_slot_mapping = np.ascontiguousarray(cross_slot_mapping, dtype=np.int64)
            cfg.cross_slot_mapping = cross_slot_mapping.ctypes.data
        h = L.pa_batch_p()
        L.check(lib.pa_batch_create(byref(cfg), raw.ctypes.data, n, byref(h)), "pa_batch_create")
        self.handle = h
        self._plans = {}
        self._lock = ForkSafeLock()

    def metadata(self):
        return lib.pa_batch_get_metadata(self.handle).contents

    def plan(self, ctx, layer):
        """A plan for (context, layer geometry), made once and reused: a plan depends on the
        batch and the layer's heads, head size and attention type only (the library checks
        those), so every layer of that geometry shares it, and a batch holds a few at most."""
        c = layer.cfg
        key = (ctx.name, id(ctx), c.num_heads, c.num_kv_heads, c.head_size, c.attn_type)
        p = self._plans.get(key)
        if p is None:
            with self._lock:  # batches are shared (between layers, and threads)
                p = self._plans.get(key)
                if p is None:
                    h = L.pa_plan_p()
                    with ctx.lock:
                        L.check(lib.pa_plan_create(ctx.handle, layer.handle, self.handle,
                                                   byref(h)), "pa_plan_create")
                    p = _Plan(h)
                    self._plans[key] = p
        return p

    def __del__(self):
        try:
            plans = getattr(self, "_plans", None)
            if plans:
                for p in plans.values():
                    p.close()
                plans.clear()
            h = getattr(self, "handle", None)
            if h:
                lib.pa_batch_destroy(h)
                self.handle = None
        except Exception:  # interpreter shutdown
            pass


class _Plan:
    def __init__(self, handle):
        self.handle = handle  # the library's plan keeps no pointer to the layer or the batch

    def close(self):
        if self.handle:
            lib.pa_plan_destroy(self.handle)
            self.handle = None


# ---- caches -------------------------------------------------------------------------------------

# vLLM's kv_cache_dtype strings (vllm.config.cache.CacheDType) this package takes: "auto",
# "bfloat16" and "float16" name an unquantized cache (vLLM's kernels read all three as
# Fp8KVCacheDataType::kAuto: the cache holds the keys and values as they are), the others an fp8
# cache of uint8 codes.
UNQUANTIZED_CACHE_NAMES = {"bfloat16": L.PA_DTYPE_BF16, "float16": L.PA_DTYPE_F16}
KV_CACHE_DTYPE_NAMES = ("auto",) + tuple(UNQUANTIZED_CACHE_NAMES) + tuple(A.FP8_NAMES)


def kv_cache_dtype_name(kv_cache_dtype):
    """vLLM's kv_cache_dtype string, lower-cased and checked (None means "auto")."""
    if kv_cache_dtype is None:
        return "auto"
    if not isinstance(kv_cache_dtype, str):
        raise ValueError("kv_cache_dtype must be a string (one of %s), got %r"
                         % (", ".join(repr(n) for n in KV_CACHE_DTYPE_NAMES), kv_cache_dtype))
    kcd = (kv_cache_dtype or "auto").lower()
    if kcd not in KV_CACHE_DTYPE_NAMES:
        raise ValueError("kv_cache_dtype %r is not one of %s"
                         % (kv_cache_dtype, ", ".join(repr(n) for n in KV_CACHE_DTYPE_NAMES)))
    return kcd


def cache_dtype_of(v, kv_cache_dtype, name):
    """Library dtype of a cache View given vLLM's kv_cache_dtype string: "auto" takes the
    array's own float dtype; "bfloat16"/"float16" (vLLM's unquantized caches named by their
    dtype) need a cache of exactly that dtype; "fp8"/"fp8_e4m3"/"fp8_e5m2" need uint8 codes (or
    the matching fp8 dtype)."""
    kcd = kv_cache_dtype_name(kv_cache_dtype)
    if kcd == "auto":
        if v.kind == "uint8":
            raise ValueError("%s is uint8 but kv_cache_dtype is 'auto': pass kv_cache_dtype='fp8', "
                             "'fp8_e4m3' or 'fp8_e5m2' for an fp8 cache" % name)
        if not isinstance(v.kind, int):
            raise ValueError("%s: dtype %s is not a supported cache dtype (float32, float16, "
                             "bfloat16, or uint8 with an fp8 kv_cache_dtype)" % (name, v.kind))
        return v.kind
    if kcd in UNQUANTIZED_CACHE_NAMES:
        want = UNQUANTIZED_CACHE_NAMES[kcd]
        if v.kind == want:
            return want
        if v.kind == "uint8":
            raise ValueError("%s is uint8 but kv_cache_dtype %r names an unquantized %s cache: "
                             "pass kv_cache_dtype='fp8', 'fp8_e4m3' or 'fp8_e5m2' for an fp8 "
                             "cache" % (name, kv_cache_dtype, kcd))
        raise ValueError("%s has dtype %s but kv_cache_dtype %r needs a %s cache (vLLM stores "
                         "keys and values unconverted in it); pass kv_cache_dtype='auto' to take "
                         "the cache's own dtype" % (name, v.dtype_name(), kv_cache_dtype, kcd))
    want = A.FP8_NAMES[kcd]
    if v.kind == "uint8" or v.kind == want:
        return want
    raise ValueError("%s: kv_cache_dtype %r needs a uint8 cache, got dtype %s"
                     % (name, kv_cache_dtype, v.dtype_name()))


def paged_cache(kv, vv, dtype, kname="key_cache", vname="value_cache"):
    """pa_cache for [num_blocks, block_size, num_kv_heads, head_size] pools (any strides with the
    head_size dim contiguous; key and value must share their strides). The struct is shared by
    every call over the same pools (every layer of every step passes its cache again): callers
    never modify it."""
    key = (kv.ptr, vv.ptr, kv.shape, kv.strides, vv.shape, vv.strides, kv.kind, vv.kind, dtype)
    c = _caches.get(key)
    if c is None:
        c = _paged_cache(kv, vv, dtype, kname, vname)
        with _caches_lock:
            if len(_caches) >= 256:  # more pools than a model has layers: start again
                _caches.clear()
            _caches[key] = c
    return c


# validated pa_cache structs by pool address and geometry (a struct holds nothing else, so one
# made for other arrays at the same address and of the same geometry is the same struct)
_caches = {}
_caches_lock = threading.Lock()


def _paged_cache(kv, vv, dtype, kname, vname):
    for v, n in ((kv, kname), (vv, vname)):
        if v.ndim != 4:
            raise ValueError("%s must be 4-D [num_blocks, block_size, num_kv_heads, head_size], "
                             "got shape %s" % (n, v.shape))
    if kv.shape != vv.shape:
        raise ValueError("%s shape %s and %s shape %s differ" % (kname, kv.shape, vname, vv.shape))
    if kv.kind != vv.kind:
        raise ValueError("%s dtype %s and %s dtype %s differ"
                         % (kname, kv.dtype_name(), vname, vv.dtype_name()))
    nb, bs, h, d = kv.shape
    ks, vs = list(kv.strides), list(vv.strides)
    for i, dim in enumerate(kv.shape):  # strides of size-1 dims are arbitrary: normalize
        if dim == 1:
            ks[i] = vs[i] = 0 if i < 3 else 1
    if d > 1 and (ks[3] != 1 or vs[3] != 1):
        raise ValueError("%s/%s: the head_size dim must be contiguous (strides %s, %s)"
                         % (kname, vname, kv.strides, vv.strides))
    if ks[:3] != vs[:3]:
        raise ValueError("%s strides %s and %s strides %s differ; the library describes both "
                         "pools with one set of strides" % (kname, kv.strides, vname, vv.strides))
    if nb < 1 or bs < 1:
        raise ValueError("%s: empty cache of shape %s" % (kname, kv.shape))
    c = L.pa_cache()
    c.key, c.value = kv.ptr, vv.ptr
    c.dtype = dtype
    c.memory = L.PA_MEMORY_HOST
    c.num_blocks, c.block_size, c.num_kv_heads, c.head_size = nb, bs, h, d
    c.block_stride = ks[0] if nb > 1 else bs * h * d
    c.token_stride = ks[1] if bs > 1 else h * d
    c.head_stride = ks[2] if h > 1 else d
    # every check the library makes of a view (strides that run backwards or overlap), now:
    # before the caller writes anything (rows that see no key, a cache write of its own)
    L.check(lib.pa_cache_validate(byref(c)), "%s/%s" % (kname, vname))
    return c


def forward(ctx, layer, batch, q_ptr, q_rs, k_ptr, k_rs, v_ptr, v_rs, cache, out_ptr, out_rs,
            lse_ptr=None, lse_ts=0, lse_hs=0, plan=None):
    args = L.pa_forward_args()
    args.q, args.q_row_stride = q_ptr, q_rs
    args.k, args.k_row_stride = k_ptr, k_rs
    args.v, args.v_row_stride = v_ptr, v_rs
    if cache is not None:
        args.cache = ctypes.pointer(cache)
    args.out, args.out_row_stride = out_ptr, out_rs
    if lse_ptr:
        args.lse = lse_ptr
        args.lse_token_stride, args.lse_head_stride = lse_ts, lse_hs
    with ctx.lock:
        L.check(lib.pa_attn_forward(ctx.handle, layer.handle, batch.handle,
                                    plan.handle if plan is not None else None, byref(args)),
                "pa_attn_forward")
