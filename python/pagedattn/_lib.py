"""ctypes binding of the public C API in include/pagedattn.h.

Only functions and types of the public header are used. The structures below mirror the C
declarations field by field (same order, same types); ctypes applies the platform's C layout
rules, so the padding matches what the C compiler does.
"""

import ctypes
import os
import threading
from ctypes import (POINTER, Structure, c_char, c_char_p, c_float, c_int, c_int32, c_int64,
                    c_size_t, c_uint8, c_uint16, c_void_p)

# ---- enums (values from pagedattn.h) ------------------------------------------------------------

STATUS_NAMES = {
    0: "OK", 1: "INVALID_ARGUMENT", 2: "NULL_POINTER", 3: "OUT_OF_RANGE", 4: "SHAPE_MISMATCH",
    5: "UNSUPPORTED", 6: "NOT_FOUND", 7: "UNAVAILABLE", 8: "OUT_OF_MEMORY", 9: "OVERFLOW",
    10: "DEVICE_ERROR", 11: "INTERNAL",
}
PA_STATUS_OK = 0

PA_DTYPE_F32 = 0
PA_DTYPE_F16 = 1
PA_DTYPE_BF16 = 2
PA_DTYPE_FP8_E4M3 = 3
PA_DTYPE_FP8_E5M2 = 4

PA_ATTN_DECODER = 0
PA_ATTN_ENCODER = 1
PA_ATTN_ENCODER_ONLY = 2
PA_ATTN_ENCODER_DECODER = 3
ATTN_TYPES = {"decoder": PA_ATTN_DECODER, "encoder": PA_ATTN_ENCODER,
              "encoder_only": PA_ATTN_ENCODER_ONLY, "encoder_decoder": PA_ATTN_ENCODER_DECODER}

PA_MEMORY_HOST = 0
PA_MEMORY_CUDA = 1

PA_LAYOUT_NHD = 0
PA_LAYOUT_HND = 1

pa_status = c_int
pa_dtype = c_int
pa_attn_type = c_int
pa_memory = c_int
pa_cache_layout = c_int


# ---- structures (field order and types exactly as in pagedattn.h) -------------------------------

class pa_blocksparse(Structure):
    _fields_ = [
        ("block_size", c_int32),
        ("local_blocks", c_int32),
        ("vert_stride", c_int32),
        ("homo_head", c_int32),
        ("head_sliding_step", c_int32),
        ("tp_rank", c_int32),
    ]


class pa_layer_config(Structure):
    _fields_ = [
        ("num_heads", c_int32),
        ("num_kv_heads", c_int32),
        ("head_size", c_int32),
        ("scale", c_float),
        ("attn_type", pa_attn_type),
        ("window_left", c_int32),
        ("window_right", c_int32),
        ("sliding_window", c_int32),
        ("alibi_slopes", POINTER(c_float)),
        ("logits_soft_cap", c_float),
        ("sinks", POINTER(c_float)),
        ("blocksparse", pa_blocksparse),
        ("q_dtype", pa_dtype),
        ("kv_dtype", pa_dtype),
        ("out_dtype", pa_dtype),
        ("cache_dtype", pa_dtype),
        ("k_scale", c_float),
        ("v_scale", c_float),
    ]


class pa_cache(Structure):
    _fields_ = [
        ("key", c_void_p),
        ("value", c_void_p),
        ("dtype", pa_dtype),
        ("memory", pa_memory),
        ("num_blocks", c_int64),
        ("block_size", c_int32),
        ("num_kv_heads", c_int32),
        ("head_size", c_int32),
        ("block_stride", c_int64),
        ("token_stride", c_int64),
        ("head_stride", c_int64),
    ]


class pa_seq(Structure):
    _fields_ = [
        ("context_len", c_int32),
        ("query_len", c_int32),
        ("is_prefill", c_int32),
        ("block_table", POINTER(c_int32)),
        ("num_blocks", c_int32),
        ("encoder_len", c_int32),
        ("cross_block_table", POINTER(c_int32)),
        ("num_cross_blocks", c_int32),
    ]


class pa_batch_config(Structure):
    _fields_ = [
        ("block_size", c_int32),
        ("num_blocks", c_int64),
        ("num_cross_blocks", c_int64),
        ("slot_mapping", c_void_p),        # int64 array address (set from Python ints)
        ("cross_slot_mapping", c_void_p),
    ]


class pa_batch_metadata(Structure):
    _fields_ = [
        ("num_seqs", c_int32),
        ("num_prefills", c_int32),
        ("num_prefill_tokens", c_int64),
        ("num_decode_tokens", c_int64),
        ("num_tokens", c_int64),
        ("max_query_len", c_int32),
        ("max_seq_len", c_int32),
        ("max_prefill_seq_len", c_int32),
        ("max_decode_seq_len", c_int32),
        ("max_decode_query_len", c_int32),
        ("query_start_loc", POINTER(c_int32)),
        ("seq_start_loc", POINTER(c_int32)),
        ("seq_lens", POINTER(c_int32)),
        ("context_lens", POINTER(c_int32)),
        ("query_lens", POINTER(c_int32)),
        ("block_tables", POINTER(c_int32)),
        ("max_blocks_per_seq", c_int32),
        ("slot_mapping", POINTER(c_int64)),
        ("num_encoder_tokens", c_int64),
        ("max_encoder_seq_len", c_int32),
        ("encoder_seq_lens", POINTER(c_int32)),
        ("encoder_start_loc", POINTER(c_int32)),
        ("cross_block_tables", POINTER(c_int32)),
        ("max_cross_blocks_per_seq", c_int32),
        ("cross_slot_mapping", POINTER(c_int64)),
        ("block_size", c_int32),
    ]


class pa_context_options(Structure):
    _fields_ = [
        ("num_threads", c_int32),
        ("device", c_int32),
        ("stream", c_void_p),
    ]


class pa_forward_args(Structure):
    _fields_ = [
        ("q", c_void_p),
        ("q_row_stride", c_int64),
        ("k", c_void_p),
        ("k_row_stride", c_int64),
        ("v", c_void_p),
        ("v_row_stride", c_int64),
        ("cache", POINTER(pa_cache)),
        ("out", c_void_p),
        ("out_row_stride", c_int64),
        ("lse", c_void_p),  # float array address
        ("lse_token_stride", c_int64),
        ("lse_head_stride", c_int64),
    ]


class pa_merge_args(Structure):
    _fields_ = [
        ("num_tokens", c_int64),
        ("num_heads", c_int32),
        ("head_size", c_int32),
        ("dtype", pa_dtype),
        ("out_a", c_void_p),
        ("lse_a", POINTER(c_float)),
        ("out_b", c_void_p),
        ("lse_b", POINTER(c_float)),
        ("out", c_void_p),
        ("out_lse", POINTER(c_float)),
        ("lse_token_stride", c_int64),
        ("lse_head_stride", c_int64),
    ]


# opaque handles
pa_layer_p = c_void_p
pa_batch_p = c_void_p
pa_backend_p = c_void_p
pa_context_p = c_void_p
pa_plan_p = c_void_p


# ---- loading ------------------------------------------------------------------------------------

def _library_path():
    env = os.environ.get("PAGEDATTN_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libpagedattn.so", "libpagedattn.dylib", "pagedattn.dll"):
        path = os.path.join(here, name)
        if os.path.exists(path):
            return path
    # running from the source tree after a build: python/build/lib/pagedattn/libpagedattn.so
    path = os.path.join(os.path.dirname(here), "build", "lib", "pagedattn", "libpagedattn.so")
    if os.path.exists(path):
        return path
    raise ImportError(
        "pagedattn: the shared library libpagedattn.so is not inside the package directory %r; "
        "install the package with `pip install ./python` (which builds it with CMake) or point "
        "PAGEDATTN_LIBRARY at a built libpagedattn.so" % here)


_PROTOTYPES = {
    # name: (restype, argtypes)
    "pa_version_number": (c_int, []),
    "pa_version_string": (c_char_p, []),
    "pa_status_name": (c_char_p, [pa_status]),
    "pa_strerror": (c_char_p, [pa_status]),
    "pa_last_error": (c_char_p, []),
    "pa_dtype_size": (c_size_t, [pa_dtype]),
    "pa_dtype_name": (c_char_p, [pa_dtype]),
    "pa_dtype_parse": (pa_status, [c_char_p, POINTER(pa_dtype)]),
    "pa_f16_to_f32": (c_float, [c_uint16]),
    "pa_f32_to_f16": (c_uint16, [c_float]),
    "pa_bf16_to_f32": (c_float, [c_uint16]),
    "pa_f32_to_bf16": (c_uint16, [c_float]),
    "pa_fp8e4m3_to_f32": (c_float, [c_uint8]),
    "pa_f32_to_fp8e4m3": (c_uint8, [c_float]),
    "pa_fp8e5m2_to_f32": (c_float, [c_uint8]),
    "pa_f32_to_fp8e5m2": (c_uint8, [c_float]),
    "pa_convert": (pa_status, [pa_dtype, c_void_p, pa_dtype, c_void_p, c_size_t, c_float]),
    "pa_attn_type_name": (c_char_p, [pa_attn_type]),
    "pa_layer_config_init": (None, [POINTER(pa_layer_config), c_int32, c_int32, c_int32]),
    "pa_layer_create": (pa_status, [POINTER(pa_layer_config), POINTER(pa_layer_p)]),
    "pa_layer_destroy": (None, [pa_layer_p]),
    "pa_layer_get_config": (POINTER(pa_layer_config), [pa_layer_p]),
    "pa_cache_init": (pa_status, [POINTER(pa_cache), pa_cache_layout, pa_dtype, c_int64, c_int32,
                                  c_int32, c_int32]),
    "pa_cache_pool_elems": (c_int64, [POINTER(pa_cache)]),
    "pa_cache_validate": (pa_status, [POINTER(pa_cache)]),
    "pa_cache_read_token": (pa_status, [POINTER(pa_cache), c_int64, c_float, c_float,
                                        POINTER(c_float), POINTER(c_float)]),
    "pa_batch_create": (pa_status, [POINTER(pa_batch_config), c_void_p, c_int32,
                                    POINTER(pa_batch_p)]),
    "pa_batch_destroy": (None, [pa_batch_p]),
    "pa_batch_get_metadata": (POINTER(pa_batch_metadata), [pa_batch_p]),
    "pa_backend_count": (c_int, []),
    "pa_backend_at": (pa_backend_p, [c_int]),
    "pa_backend_find": (pa_backend_p, [c_char_p]),
    "pa_backend_name": (c_char_p, [pa_backend_p]),
    "pa_backend_description": (c_char_p, [pa_backend_p]),
    "pa_backend_available": (c_int, [pa_backend_p, POINTER(c_char), c_size_t]),
    "pa_backend_preferred_layout": (pa_cache_layout, [pa_backend_p]),
    "pa_backend_memory": (pa_memory, [pa_backend_p]),
    "pa_backend_info": (c_char_p, [pa_backend_p]),
    "pa_backend_select": (pa_status, [c_char_p, pa_layer_p, POINTER(pa_backend_p)]),
    "pa_backend_supports": (pa_status, [pa_backend_p, pa_layer_p, POINTER(c_char), c_size_t]),
    "pa_context_create": (pa_status, [pa_backend_p, POINTER(pa_context_options),
                                      POINTER(pa_context_p)]),
    "pa_context_destroy": (None, [pa_context_p]),
    "pa_context_backend": (pa_backend_p, [pa_context_p]),
    "pa_context_set_num_threads": (pa_status, [pa_context_p, c_int32]),
    "pa_context_num_threads": (c_int32, [pa_context_p]),
    "pa_context_synchronize": (pa_status, [pa_context_p]),
    "pa_plan_create": (pa_status, [pa_context_p, pa_layer_p, pa_batch_p, POINTER(pa_plan_p)]),
    "pa_plan_destroy": (None, [pa_plan_p]),
    "pa_attn_forward": (pa_status, [pa_context_p, pa_layer_p, pa_batch_p, pa_plan_p,
                                    POINTER(pa_forward_args)]),
    "pa_cache_write": (pa_status, [pa_context_p, POINTER(pa_cache), pa_dtype, c_void_p, c_int64,
                                   c_void_p, c_int64, POINTER(c_int64), c_int64, c_float,
                                   c_float]),
    "pa_cache_copy_blocks": (pa_status, [pa_context_p, POINTER(pa_cache), c_int32,
                                         POINTER(c_int64), c_int64]),
    "pa_cache_swap_blocks": (pa_status, [pa_context_p, POINTER(pa_cache), POINTER(pa_cache),
                                         POINTER(c_int64), c_int64]),
    "pa_merge_states": (pa_status, [pa_context_p, POINTER(pa_merge_args)]),
}


def _load():
    path = _library_path()
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()
LIBRARY_PATH = _library_path()


# ---- errors -------------------------------------------------------------------------------------

class PagedAttnError(Exception):
    """Mixin carried by every exception raised for a failing library status: a bad argument
    is a ValueError (PagedAttnValueError), a feature the backend lacks or a backend that cannot
    run here a NotImplementedError, OUT_OF_MEMORY a MemoryError, and DEVICE_ERROR (the
    accelerator runtime failed), INTERNAL (a bug in the library) or an unknown status a
    RuntimeError (PagedAttnRuntimeError).

    Attributes: ``status`` (int), ``status_name`` (e.g. ``"OUT_OF_RANGE"``) and ``reason`` (the
    library's reason text from ``pa_last_error()``)."""

    def __init__(self, message, status=None, status_name=None, reason=None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name
        self.reason = reason


class PagedAttnValueError(PagedAttnError, ValueError):
    """A bad argument (INVALID_ARGUMENT, NULL_POINTER, OUT_OF_RANGE, SHAPE_MISMATCH, OVERFLOW,
    NOT_FOUND)."""


class PagedAttnNotImplementedError(PagedAttnError, NotImplementedError):
    """The chosen backend lacks a feature (UNSUPPORTED) or cannot run here (UNAVAILABLE)."""


class PagedAttnMemoryError(PagedAttnError, MemoryError):
    """OUT_OF_MEMORY."""


class PagedAttnRuntimeError(PagedAttnError, RuntimeError):
    """DEVICE_ERROR, INTERNAL or an unknown status."""


_STATUS_EXC = {
    1: PagedAttnValueError, 2: PagedAttnValueError, 3: PagedAttnValueError,
    4: PagedAttnValueError, 9: PagedAttnValueError, 6: PagedAttnValueError,
    5: PagedAttnNotImplementedError, 7: PagedAttnNotImplementedError,
    8: PagedAttnMemoryError,
}


def last_error():
    msg = lib.pa_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def make_error(status, where):
    name = STATUS_NAMES.get(status, "UNKNOWN(%d)" % status)
    reason = last_error()
    if not reason:
        s = lib.pa_strerror(status)
        reason = s.decode() if s else ""
    exc = _STATUS_EXC.get(status, PagedAttnRuntimeError)
    return exc("%s: %s (PA_STATUS_%s)" % (where, reason, name), status, name, reason)


def check(status, where):
    if status != PA_STATUS_OK:
        raise make_error(status, where)


# ---- backends and contexts ----------------------------------------------------------------------

def backend_names():
    """Names of the backends built into the library, in order of preference."""
    out = []
    for i in range(lib.pa_backend_count()):
        b = lib.pa_backend_at(i)
        if b:
            out.append(lib.pa_backend_name(b).decode())
    return out


def backend_handle(name):
    b = lib.pa_backend_find(name.encode())
    if not b:
        raise PagedAttnValueError(
            "unknown backend %r; built: %s" % (name, ", ".join(backend_names())), 6, "NOT_FOUND",
            "unknown backend")
    return b


def backend_available(name):
    """(available, reason) for the backend `name`."""
    b = backend_handle(name)
    buf = ctypes.create_string_buffer(512)
    ok = lib.pa_backend_available(b, buf, len(buf))
    return bool(ok), buf.value.decode("utf-8", "replace")


def backend_memory(name):
    """PA_MEMORY_HOST or PA_MEMORY_CUDA: where the backend `name` wants caches and tensors."""
    return int(lib.pa_backend_memory(backend_handle(name)))


class Context:
    """One opened backend (pa_context), with a lock: a context is used from one thread at a time."""

    def __init__(self, name):
        self.name = name
        self.backend = backend_handle(name)
        avail, reason = backend_available(name)
        if not avail:
            raise PagedAttnNotImplementedError(
                "backend %r cannot run on this machine: %s" % (name, reason), 7, "UNAVAILABLE",
                reason)
        h = pa_context_p()
        check(lib.pa_context_create(self.backend, None, ctypes.byref(h)),
              "pa_context_create(%s)" % name)
        self.handle = h
        self.lock = threading.RLock()

    def close(self):
        if self.handle:
            lib.pa_context_destroy(self.handle)
            self.handle = None


_contexts = {}
_contexts_lock = threading.Lock()


_forked_threads = {}  # in a forked child: the thread counts of the parent's contexts
_forked_contexts = []  # the parent's contexts, kept (plans made on them may still be referenced)


def get_context(name):
    """The one lazily created context of backend `name`."""
    with _contexts_lock:
        ctx = _contexts.get(name)
        if ctx is None:
            ctx = Context(name)
            n = _forked_threads.pop(name, None)
            if n is not None:
                check(lib.pa_context_set_num_threads(ctx.handle, n), "pa_context_set_num_threads")
            _contexts[name] = ctx
        return ctx


_threads_at_fork = {}


def _before_fork():
    """The parent's thread counts, read where its contexts have their workers (in the child the
    library says 1 for an inherited context: it runs there on the calling thread alone)."""
    _threads_at_fork.clear()
    for name, ctx in list(_contexts.items()):
        if ctx.handle:
            _threads_at_fork[name] = int(lib.pa_context_num_threads(ctx.handle))


def _after_fork_in_child():
    """A forked child has none of the parent's other threads: the contexts' pool workers and
    any thread that held one of this package's locks. The library runs an inherited context on
    the calling thread alone; the child gets fresh contexts instead (with the parent's thread
    counts) and fresh locks."""
    global _contexts_lock
    _contexts_lock = threading.Lock()
    for name, ctx in _contexts.items():
        if ctx.handle and name in _threads_at_fork:
            _forked_threads[name] = _threads_at_fork[name]
        _forked_contexts.append(ctx)
    _contexts.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


# Contexts live until the process exits: plans made on a context may be destroyed by the
# garbage collector at any point of interpreter shutdown, so the contexts are never closed
# before them (the operating system reclaims their threads and memory at exit).
