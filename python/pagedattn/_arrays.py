"""Array plumbing: numpy arrays and (when torch is importable) torch CPU tensors, zero copy.

A `View` holds what the C library needs of an array: the data pointer, the shape, the strides
in elements and the library dtype, plus the original object (kept alive by the caller).
"""

import ctypes

import numpy as np

from . import _lib as L

try:  # bfloat16 / fp8 numpy dtypes
    import ml_dtypes as _mld
except ImportError:  # pragma: no cover - ml_dtypes is a dependency, but stay importable
    _mld = None

_torch = None
_torch_checked = False


def torch_module():
    """torch if it is already imported or importable, else None (torch stays optional)."""
    global _torch, _torch_checked
    if not _torch_checked:
        _torch_checked = True
        try:
            import torch  # noqa: F401
            _torch = torch
        except Exception:
            _torch = None
    return _torch


_TORCH_TYPES = set()  # the tensor types seen (torch.Tensor, nn.Parameter)


def is_torch(x):
    t = type(x)
    if t in _TORCH_TYPES:
        return True
    if t is np.ndarray:
        return False
    if t.__module__.startswith("torch") and t.__name__ in ("Tensor", "Parameter"):
        _TORCH_TYPES.add(t)
        return True
    return False


# numpy dtype -> library dtype (uint8 means "fp8, interpretation given by kv_cache_dtype")
_NP_FLOAT = {np.dtype(np.float32): L.PA_DTYPE_F32, np.dtype(np.float16): L.PA_DTYPE_F16}
if _mld is not None:
    _NP_FLOAT[np.dtype(_mld.bfloat16)] = L.PA_DTYPE_BF16
    _NP_FP8 = {np.dtype(_mld.float8_e4m3fn): L.PA_DTYPE_FP8_E4M3,
               np.dtype(_mld.float8_e5m2): L.PA_DTYPE_FP8_E5M2}
else:  # pragma: no cover
    _NP_FP8 = {}

NP_FLOAT = _NP_FLOAT  # (the backend layer's short path for query/key/value/output rows)
_FLOAT_KINDS = (L.PA_DTYPE_F32, L.PA_DTYPE_F16, L.PA_DTYPE_BF16)
_KIND = dict(_NP_FLOAT)
_KIND.update(_NP_FP8)

DTYPE_NAMES = {L.PA_DTYPE_F32: "float32", L.PA_DTYPE_F16: "float16", L.PA_DTYPE_BF16: "bfloat16",
               L.PA_DTYPE_FP8_E4M3: "fp8_e4m3", L.PA_DTYPE_FP8_E5M2: "fp8_e5m2"}

FP8_NAMES = {"fp8": L.PA_DTYPE_FP8_E4M3, "fp8_e4m3": L.PA_DTYPE_FP8_E4M3,
             "fp8_e5m2": L.PA_DTYPE_FP8_E5M2}


class View:
    __slots__ = ("obj", "ptr", "shape", "strides", "kind", "itemsize", "torch")

    def __init__(self, obj, ptr, shape, strides, kind, itemsize, is_t):
        self.obj = obj
        self.ptr = ptr            # int address of element (0, ..., 0)
        self.shape = shape if type(shape) is tuple else tuple(shape)  # ints
        self.strides = strides if type(strides) is tuple else tuple(strides)  # ints, in elements
        self.kind = kind          # library dtype, "uint8", or a string naming another dtype
        self.itemsize = itemsize
        self.torch = is_t

    @property
    def ndim(self):
        return len(self.shape)

    def offset(self, elems):
        return self.ptr + elems * self.itemsize

    def size(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def is_contiguous(self):
        expect = 1
        for dim, st in zip(reversed(self.shape), reversed(self.strides)):
            if dim != 1 and st != expect:
                return False
            expect *= dim
        return True

    def dtype_name(self):
        if isinstance(self.kind, int):
            return DTYPE_NAMES[self.kind]
        return str(self.kind)


_char_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


_U8 = np.dtype(np.uint8)


def np_ptr(x):
    """The address of numpy array x's first element. A writable C-contiguous array takes the
    buffer protocol (~0.8 us here; ~1.5 us through a byte view for dtypes that export no
    buffer, ml_dtypes' bfloat16 and fp8), anything else numpy's ctypes attribute (~3 us)."""
    if x.ndim and x.flags.c_contiguous and x.flags.writeable and x.size:
        return _addressof(_char_from_buffer(x if x.dtype.isbuiltin == 1 else x.view(_U8)))
    return x.ctypes.data or 0


_TORCH_KINDS = None  # torch dtype -> library dtype, made on first use


def is_torch_dtype(x):
    t = type(x)
    return t.__module__.startswith("torch") and t.__name__ == "dtype"


def _torch_kind(t):
    global _TORCH_KINDS
    m = _TORCH_KINDS
    if m is None:
        torch = torch_module()
        m = {torch.float32: L.PA_DTYPE_F32, torch.float16: L.PA_DTYPE_F16,
             torch.bfloat16: L.PA_DTYPE_BF16, torch.uint8: "uint8"}
        for name, code in (("float8_e4m3fn", L.PA_DTYPE_FP8_E4M3),
                           ("float8_e5m2", L.PA_DTYPE_FP8_E5M2)):
            dt = getattr(torch, name, None)
            if dt is not None:
                m[dt] = code
        _TORCH_KINDS = m
    k = m.get(t.dtype)
    return k if k is not None else str(t.dtype).replace("torch.", "")


def torch_float_kind(t):
    """The library dtype of torch tensor t when it is f32, f16 or bf16, else None."""
    k = _torch_kind(t)
    return k if k in _FLOAT_KINDS else None


def view(x, name, write=False):
    """A View of array `x` (numpy array or torch CPU tensor); `name` is used in error messages.
    write: the library will write into x, so a read-only numpy array is a ValueError."""
    if write:
        _refuse_read_only(x, name)
    if x is None:
        raise ValueError("%s must be an array, got None" % name)
    if type(x) is not np.ndarray:
        if is_torch(x):
            if not x.is_cpu:
                raise ValueError("%s: only CPU tensors are supported, got device %s"
                                 % (name, x.device))
            kind = _torch_kind(x)
            return View(x, x.data_ptr(), tuple(x.shape), x.stride(), kind, x.element_size(), True)
        if not isinstance(x, np.ndarray):
            raise TypeError("%s must be a numpy array or a torch CPU tensor, got %s"
                            % (name, type(x).__name__))
    dt = x.dtype
    kind = _KIND.get(dt)
    if kind is None:
        kind = "uint8" if dt == np.uint8 else str(dt)
    item = dt.itemsize
    st = x.strides
    if item == 1:
        strides = st
    else:
        # an engine passes the same few shapes call after call: their element strides are
        # looked up (None: not a multiple of the element size)
        strides = _ELEM_STRIDES.get((st, item), False)
        if strides is False:
            strides = tuple([s // item for s in st])
            if any([s % item for s in st]):
                strides = None
            if len(_ELEM_STRIDES) < 4096:
                _ELEM_STRIDES[(st, item)] = strides
        if strides is None:
            raise ValueError("%s: strides %s are not multiples of the element size %d"
                             % (name, st, item))
    return View(x, np_ptr(x), x.shape, strides, kind, item, False)


_ELEM_STRIDES = {}


def rows_fast(x, heads, D, output=False):
    """A [T, heads, D] View of x, a numpy array or torch CPU tensor of f32/f16/bf16 shaped
    [T, heads * D] or [T, heads, D] (T >= 1, heads and D > 1) whose heads and dims are contiguous
    and whose rows follow each other without overlapping (numpy outputs: writable); else None,
    for the general path (float_view and its row checks) to decide, copy or refuse."""
    if heads < 2 or D < 2:
        return None
    hd = heads * D
    if type(x) is np.ndarray:
        kind = _NP_FLOAT.get(x.dtype)
        shp = x.shape
        if kind is None or not shp or shp[0] < 1 or (output and not x.flags.writeable):
            return None
        st, item = x.strides, x.itemsize
        if len(shp) == 2:
            fits = shp[1] == hd and st[1] == item
        else:
            fits = len(shp) == 3 and shp[1] == heads and shp[2] == D and st[2] == item and \
                st[1] == D * item
        rs = hd
        if fits and shp[0] > 1:
            rs = st[0] // item
            fits = st[0] % item == 0 and rs >= hd
        return View(x, np_ptr(x), (shp[0], heads, D), (rs, D, 1), kind, item, False) if fits \
            else None
    if is_torch(x) and x.is_cpu:
        kind = torch_float_kind(x)
        shp = x.shape
        if kind is None or len(shp) not in (2, 3) or shp[0] < 1:
            return None
        st = x.stride()  # in elements
        if len(shp) == 2:
            fits = shp[1] == hd and st[1] == 1
        else:
            fits = shp[1] == heads and shp[2] == D and st[2] == 1 and st[1] == D
        rs = hd if shp[0] == 1 else st[0]
        if fits and rs >= hd:
            return View(x, x.data_ptr(), (shp[0], heads, D), (rs, D, 1), kind, x.element_size(),
                        True)
    return None


def float_view(x, name, allowed=(L.PA_DTYPE_F32, L.PA_DTYPE_F16, L.PA_DTYPE_BF16), write=False):
    v = view(x, name, write)
    if v.kind not in allowed:
        raise ValueError("%s: dtype %s is not supported; expected one of %s"
                         % (name, v.dtype_name() if isinstance(v.kind, int) else v.kind,
                            ", ".join(DTYPE_NAMES[a] for a in allowed)))
    return v


def _refuse_read_only(x, name):
    if type(x) is np.ndarray and not x.flags.writeable:
        raise ValueError("%s is read-only (its writeable flag is off), but it is written to"
                         % name)


def require_writable(v, name):
    """ValueError unless the library may write into View v (numpy's writeable flag; torch
    tensors have none)."""
    _refuse_read_only(v.obj, name)


def check_ndim(v, name, ndim, what):
    if v.ndim != ndim:
        raise ValueError("%s must be %d-D %s, got shape %s" % (name, ndim, what, v.shape))


def _rows_problem(v, name):
    """Why the library cannot read View v [rows, heads, dim] with one row stride, or None: heads
    and dims must be contiguous and rows must follow each other at a stride of at least a row
    (the library reads a row stride of 0 as "contiguous")."""
    rows, h, d = v.shape
    if rows == 0 or h == 0 or d == 0:  # no element: any strides will do
        return None
    if d > 1 and v.strides[2] != 1 or (h > 1 and v.strides[1] != d):
        return ("%s: the head and head_size dims must be contiguous (strides %s for shape %s); "
                "pass a contiguous array" % (name, v.strides, v.shape))
    if rows > 1 and v.strides[0] < h * d:
        return ("%s: rows must follow each other without overlapping (row stride %d elements "
                "for rows of %d: broadcast, reversed or overlapping rows); pass a contiguous "
                "array" % (name, v.strides[0], h * d))
    return None


def check_rows(v, name):
    """The row stride in elements of View v [rows, heads, dim] (a row's size when there is at
    most one row: its stride is never used); ValueError when the library cannot read v."""
    why = _rows_problem(v, name)
    if why:
        raise ValueError(why)
    rows, h, d = v.shape
    return v.strides[0] if rows > 1 and h * d else h * d


def input_rows(v, name):
    """An input View [rows, heads, dim] the library can read: v itself, or a contiguous copy
    when its rows are broadcast, reversed, overlapping or not contiguous inside (as
    FlashAttention's own wrappers make inputs contiguous)."""
    if _rows_problem(v, name) is None:
        return v
    x = v.obj.contiguous() if v.torch else np.ascontiguousarray(v.obj)
    return view(x, name)


def to_np(x, dtype, name, ndim=None):
    """Small metadata arrays (lengths, tables, slots): a contiguous numpy copy of dtype."""
    if x is None:
        return None
    if type(x) is np.ndarray and x.dtype == dtype and (ndim is None or x.ndim == ndim) and \
            x.flags.c_contiguous:
        return x  # (what the checks below would return: nothing to convert or check)
    if type(x) is np.ndarray and x.dtype.kind in "iu" and (ndim is None or x.ndim == ndim) and \
            np.can_cast(x.dtype, dtype, "safe"):
        return np.ascontiguousarray(x, dtype=dtype)  # (likewise: every value fits)
    if is_torch(x):
        x = x.numpy() if x.is_cpu and not x.requires_grad else x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind == "f":
        if a.size and not np.all(np.isfinite(a) & (np.mod(a, 1) == 0)):
            raise ValueError("%s must hold integers, got dtype %s" % (name, a.dtype))
    elif a.dtype.kind not in "iub":
        raise ValueError("%s must hold integers, got dtype %s" % (name, a.dtype))
    if ndim is not None and a.ndim != ndim:
        raise ValueError("%s must be %d-D, got shape %s" % (name, ndim, a.shape))
    if a.size and not np.can_cast(a.dtype, dtype, "safe"):
        info = np.iinfo(dtype)
        if a.min() < info.min or a.max() > info.max:
            raise ValueError("%s: values out of range for %s" % (name, np.dtype(dtype).name))
    return np.ascontiguousarray(a, dtype=dtype)


def to_np_float(x, name):
    """A float32 numpy copy of a float array (numpy or torch)."""
    if is_torch(x):
        x = x.detach().float().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def floats(x, name, n=None):
    """Per-head float parameters (ALiBi slopes, sinks) as a contiguous float32 numpy array."""
    if x is None:
        return None
    if is_torch(x):
        x = x.detach().float().cpu().numpy()
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32).reshape(-1))
    if n is not None and a.size != n:
        raise ValueError("%s must hold %d values (one per query head), got %d" % (name, n, a.size))
    return a


def scalar(x, name):
    """A float from a Python number, 0-d/1-element numpy array or torch tensor."""
    if type(x) in (float, int):
        return float(x)
    if is_torch(x):
        if x.numel() != 1:
            raise ValueError("%s must be a scalar, got shape %s" % (name, tuple(x.shape)))
        return float(x.reshape(-1)[0].item())
    a = np.asarray(x)
    if a.size != 1:
        raise ValueError("%s must be a scalar, got shape %s" % (name, a.shape))
    return float(a.reshape(-1)[0])


def uniform_scalar(x, name):
    """The one value of a scale given per sequence and KV head, as FlashAttention 3's descales
    ``[batch, num_kv_heads]`` (vLLM passes its per-tensor scale expanded to that shape): every
    element must be the same (NaN counts as itself, for the later finiteness check to refuse);
    different values per sequence or head raise NotImplementedError."""
    if type(x) in (float, int):
        return float(x)
    if is_torch(x):
        a = np.asarray(x.detach().to("cpu").double().reshape(-1))
    else:
        a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise ValueError("%s is empty" % name)
    first = a[0]
    same = (a == first) | (np.isnan(a) & np.isnan(first))
    if not np.all(same):
        raise NotImplementedError("%s holds different values per sequence or head (%g .. %g): "
                                  "pagedattn takes one scale per cache" %
                                  (name, float(np.nanmin(a)), float(np.nanmax(a))))
    return float(first)


def ptr(a, ctype):
    """ctypes pointer to a contiguous numpy array (or NULL for None)."""
    if a is None:
        return None
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def empty_like_rows(ref, shape, kind):
    """A new array of `shape` and library dtype `kind` in the same framework as `ref`."""
    if ref.torch:
        torch = torch_module()
        tdt = {L.PA_DTYPE_F32: torch.float32, L.PA_DTYPE_F16: torch.float16,
               L.PA_DTYPE_BF16: torch.bfloat16}[kind]
        return torch.empty(shape, dtype=tdt)
    return np.empty(shape, dtype=np_dtype(kind))


def empty_f32(ref, shape, fill=None):
    if ref.torch:
        torch = torch_module()
        t = torch.empty(shape, dtype=torch.float32)
        if fill is not None:
            t.fill_(fill)
        return t
    a = np.empty(shape, dtype=np.float32)
    if fill is not None:
        a.fill(fill)
    return a


def np_dtype(kind):
    if kind == L.PA_DTYPE_F32:
        return np.dtype(np.float32)
    if kind == L.PA_DTYPE_F16:
        return np.dtype(np.float16)
    if kind == L.PA_DTYPE_BF16:
        return np.dtype(_mld.bfloat16)
    raise ValueError("no numpy dtype for %r" % (kind,))


def fill_rows(v, row_start, nrows, value):
    """Sets rows [row_start, row_start + nrows) of a [rows, ...] View to value."""
    obj = v.obj
    if nrows <= 0:
        return
    obj[row_start:row_start + nrows] = value
