"""pagedattn: paged-attention backends (vLLM's attention layer as a C library), from Python.

FlashAttention-style calls (numpy arrays or torch CPU tensors, zero copy):
    flash_attn_varlen_func, flash_attn_with_kvcache, flash_attn_func
vLLM ops:
    reshape_and_cache_flash, copy_blocks, swap_blocks, merge_attn_states; on vLLM's older paged
    layout: paged_attention_v1, paged_attention_v2, reshape_and_cache, convert_fp8
vLLM's backend layer:
    get_attn_backend(name=None) -> backend with get_name, get_kv_cache_shape, get_impl_cls,
    swap_blocks, copy_blocks, make_metadata_builder
Library:
    available_backends, set_num_threads, get_num_threads, version
"""

from ._lib import (LIBRARY_PATH, PagedAttnError, PagedAttnMemoryError,
                   PagedAttnNotImplementedError, PagedAttnRuntimeError, PagedAttnValueError)
from ._lib import lib as _clib
from .backend import (AttentionType, PagedAttnBackend, PagedAttnImpl, PagedAttnMetadata,
                      PagedAttnMetadataBuilder, available_backends, get_attn_backend,
                      get_num_threads, set_num_threads)
from .ops import (copy_blocks, flash_attn_func, flash_attn_kvpacked_func,
                  flash_attn_qkvpacked_func, flash_attn_varlen_func,
                  flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
                  flash_attn_with_kvcache,
                  merge_attn_states, reshape_and_cache_flash, swap_blocks)

from .vllm_ops import (context_attention_fwd, convert_fp8, paged_attention_v1,
                       paged_attention_v2, reshape_and_cache)

__version__ = "0.1.0"


def version():
    """The version string of the loaded C library (e.g. ``"0.1.0"``)."""
    return _clib.pa_version_string().decode()


def built_backends():
    """Names of every backend built into the library (available here or not)."""
    from ._lib import backend_names
    return backend_names()


def backend_info(name):
    """Free-form lines on what backend ``name`` runs here (ISA chosen, device)."""
    from ._lib import backend_handle
    s = _clib.pa_backend_info(backend_handle(name))
    return s.decode() if s else ""


__all__ = [
    "flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_func",
    "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func", "reshape_and_cache_flash", "copy_blocks",
    "swap_blocks", "merge_attn_states", "get_attn_backend", "available_backends",
    "set_num_threads", "get_num_threads", "AttentionType", "PagedAttnBackend", "PagedAttnImpl",
    "PagedAttnMetadata", "PagedAttnMetadataBuilder", "PagedAttnError", "PagedAttnValueError",
    "PagedAttnNotImplementedError", "PagedAttnMemoryError", "PagedAttnRuntimeError", "version",
    "built_backends", "backend_info", "LIBRARY_PATH", "paged_attention_v1", "paged_attention_v2",
    "reshape_and_cache", "convert_fp8", "context_attention_fwd",
]
