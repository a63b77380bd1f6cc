"""Random, mostly malformed calls: every call either works or raises one of the documented
exceptions (ValueError, TypeError, NotImplementedError, MemoryError), and a call that raises
leaves the caches it was given unchanged. Shapes, dtypes, strides (transposed, reversed,
every-other, read-only broadcast views), lengths, tables, slots and options are drawn with
small perturbations (off by one, zero, negative, beyond int32) so that both accepted and
rejected calls occur. (The first run found a ZeroDivisionError for head_size 0 and an internal
AssertionError for zero-size outputs, both fixed.)"""

import types

import numpy as np
import pytest

import pagedattn as pa
from util import DTYPES

ALLOWED = (ValueError, TypeError, NotImplementedError, MemoryError)
FLOATS = [np.dtype(np.float32), np.dtype(np.float16), DTYPES["bfloat16"]]
OTHERS = [np.dtype(np.uint8), np.dtype(np.float64), np.dtype(np.int32)]


class Draw:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def pick(self, *vals):
        return vals[self.rng.integers(len(vals))]

    def jig(self, x, p=0.1):
        """x, or (with probability p) a nearby or extreme value."""
        if self.rng.random() >= p:
            return x
        return int(self.pick(x - 1, x + 1, 0, -1, 2 ** 31, -2 ** 31, 2 ** 40))

    def array(self, shape, dtype=None):
        """An array of at most 64 per dim; sometimes strided, reversed or read-only."""
        rng = self.rng
        if dtype is None:
            dtype = self.pick(*FLOATS) if rng.random() < 0.9 else self.pick(*OTHERS)
        shape = tuple(min(max(0, int(s)), 64) for s in shape)
        if dtype.kind == "f" or dtype == DTYPES["bfloat16"]:
            a = (rng.standard_normal(shape) * 3).astype(dtype)
        else:
            a = rng.integers(-5, 300, shape).astype(dtype)
        r = rng.random()
        if r < 0.04 and a.ndim >= 2:
            a = np.swapaxes(a, 0, 1)
        elif r < 0.07 and a.ndim >= 1 and a.shape[0] > 1:
            a = a[::2]
        elif r < 0.09 and a.ndim >= 1:
            a = a[::-1]
        elif r < 0.11 and a.ndim >= 2 and a.shape[-1] > 1:
            a = a[..., ::2]
        elif r < 0.13:
            a = np.broadcast_to(a, a.shape)  # read-only
        return a

    def ints(self, n, hi, dtype=np.int32):
        """n values in [0, hi) (n, hi as drawn: clamped to sane sizes), one sometimes -1, hi
        or the int32 maximum."""
        hi = min(max(int(hi), 1), 2 ** 31 - 1)
        a = self.rng.integers(0, hi, max(min(int(n), 64), 0)).astype(dtype)
        if self.rng.random() < 0.1 and a.size:
            a[self.rng.integers(a.size)] = self.pick(-1, hi, 2 ** 31 - 1)
        return a


def one_call(d):
    """Draws and makes one call. d.kept: the (array, copy) pairs the call must leave unchanged
    if it raises."""
    rng = d.rng
    H, Hk, D = d.jig(d.pick(4, 8)), d.jig(d.pick(1, 2, 4)), d.jig(d.pick(16, 32))
    bs, nb = d.jig(d.pick(1, 4, 16)), d.jig(d.pick(1, 3, 8))
    B, Sq = d.jig(d.pick(1, 2, 3)), d.jig(d.pick(1, 2, 5))
    dt = d.pick(*FLOATS)
    kc = d.array((nb, bs, Hk, D), dt if rng.random() < 0.9 else None)
    vc = kc if rng.random() < 0.1 else d.array((nb, bs, Hk, D), dt if rng.random() < 0.9 else None)
    kept = d.kept = [(kc, kc.copy()), (vc, vc.copy())]
    bt = d.ints(B, nb).reshape(-1, 1) if rng.random() < 0.1 else \
        d.ints(max(B, 0) * 4, max(nb, 1)).reshape(-1, 4) if B > 0 else np.zeros((0, 4), np.int32)
    kw = {}
    if rng.random() < 0.2:
        kw["window_size"] = (d.jig(3, 0.3), d.jig(-1, 0.3))
    if rng.random() < 0.1:
        kw["alibi_slopes"] = d.array((d.jig(H),), np.dtype(np.float32))
    if rng.random() < 0.1:
        kw["s_aux"] = d.array((d.jig(H),), np.dtype(np.float32))
    if rng.random() < 0.1:
        kw["softcap"] = d.pick(0.0, -1.0, 5.0, float("nan"))
    if rng.random() < 0.05:
        kw["kv_cache_dtype"] = d.pick("fp8", "fp8_e5m2", "bogus")
    if rng.random() < 0.2:
        kw["return_softmax_lse"] = True
    if rng.random() < 0.05:
        kw["softmax_scale"] = d.pick(0.0, -1.0, float("inf"), 0.1)
    causal = bool(rng.integers(2))
    which = rng.integers(12)
    if which == 0:
        q = d.array((B, Sq, H, D), dt if rng.random() < 0.9 else None)
        cap = max(min(nb, 64), 1) * max(min(bs, 64), 1)
        sl = d.ints(d.jig(B), cap - max(Sq, 0) + 1) if rng.random() < 0.8 else d.jig(3)
        new = d.array((B, d.jig(Sq), Hk, D), dt) if rng.random() < 0.3 else None
        if rng.random() < 0.2:
            kw["out"] = d.array((B, Sq, H, D), dt)
            kept.append((kw["out"], kw["out"].copy()))
        pa.flash_attn_with_kvcache(q, kc, vc, new, new if rng.random() < 0.95 else None,
                                   cache_seqlens=sl, block_table=bt if rng.random() < 0.9 else None,
                                   causal=causal, **kw)
    elif which in (1, 2):
        ql = d.ints(max(min(B, 8), 0), 6, np.int64)
        cu = np.concatenate([[0], np.cumsum(ql)]).astype(d.pick(np.int32, np.int64))
        if rng.random() < 0.05:
            cu = cu[::-1].copy()
        q = d.array((int(cu.max()) + d.jig(0), H, D), dt)
        if rng.random() < 0.3:
            kw["out"] = d.array(q.shape, dt)
            kept.append((kw["out"], kw["out"].copy()))
        if which == 1:
            seqused = d.ints(d.jig(ql.size), max(min(nb, 64), 1) * max(min(bs, 64), 1) + 1)
            pa.flash_attn_varlen_func(q, kc, vc, 8, cu, 64, seqused_k=seqused, block_table=bt,
                                      causal=causal, **kw)
        else:
            kl = d.ints(ql.size, 9, np.int64)
            cuk = np.concatenate([[0], np.cumsum(kl)]).astype(np.int32)
            k = d.array((int(cuk[-1]) + d.jig(0), Hk, D), dt)
            v = k if rng.random() < 0.5 else d.array(k.shape, dt)
            pa.flash_attn_varlen_func(q, k, v, 8, cu, 8, cuk, causal=causal, **kw)
    elif which == 3:
        key = d.array((d.jig(5), Hk, D), dt)
        slots = d.ints(d.jig(5), max(min(nb, 64), 1) * max(min(bs, 64), 1),
                       d.pick(np.int64, np.int32))
        pa.reshape_and_cache_flash(key, key, kc, vc, slots,
                                   kv_cache_dtype=kw.get("kv_cache_dtype", "auto"))
    elif which == 4:
        pairs = d.ints(2 * max(d.jig(2), 0), max(nb, 1), np.int64).reshape(-1, 2)
        if rng.random() < 0.5:
            pa.copy_blocks([kc], [vc], pairs)
        else:
            pa.swap_blocks(kc, vc, pairs)
    elif which in (6, 7):
        # vLLM's layer: metadata built for the step, then forward writes K/V and attends
        n = max(min(B, 6), 0)
        sl = d.ints(n, 60) + 1
        ql = np.minimum(sl, 1 + d.ints(n, 4)) if which == 6 else sl.copy()
        if rng.random() < 0.1 and n:
            ql[0] = d.pick(0, -1, 2 ** 31 - 1)
        nbs = max(min(bs, 64), 1)
        tables = [d.ints(d.jig(-(-int(x) // nbs)), max(min(nb, 64), 1)).tolist() for x in sl]
        backend = pa.get_attn_backend()
        kv_cache = d.array((2, nb, bs, Hk, D), dt if rng.random() < 0.9 else None)
        kept.append((kv_cache, kv_cache.copy()))
        v1 = rng.random() < 0.4  # vLLM v1's call: forward(layer, ...) over its own metadata
        # (a third of them to a cross-attention layer: sl are then encoder lengths)
        cross = v1 and rng.random() < 0.33
        if v1:
            md = _v1_fields(d, sl, ql, tables, nbs, max(nb, 1), cross)
        else:
            md = backend.make_metadata_builder(d.jig(16) if rng.random() < 0.2 else nbs).build(
                seq_lens=sl.tolist(), query_lens=ql.tolist(), block_tables=tables)
        impl = backend.get_impl_cls()(H, D, d.pick(0.1, -1.0, 0.0), d.jig(Hk),
                                      sliding_window=d.pick(None, None, 4, -1),
                                      alibi_slopes=kw.get("alibi_slopes"),
                                      kv_cache_dtype=kw.get("kv_cache_dtype", "auto"),
                                      attn_type="encoder_decoder" if cross else "decoder")
        T = int(ql.sum()) + d.jig(0)
        x = d.array((T, d.jig(H) * D), dt)
        nk = len(md.get("slot_mapping", ())) + d.jig(0) if cross else T
        kv = d.array((nk, Hk * D), dt)
        out = d.array((T, H * D), dt) if rng.random() < 0.3 else None
        if out is not None:
            kept.append((out, out.copy()))
        if v1:
            layer = types.SimpleNamespace(_k_scale_float=d.pick(1.0, 0.5, 0.0, -1.0, np.nan),
                                          _v_scale=np.float32(d.pick(1.0, 2.0, np.inf)))
            impl.forward(layer, x, kv, kv if rng.random() < 0.9 else None, kv_cache, md,
                         output=out)
        else:
            impl.forward(x, kv, kv if rng.random() < 0.9 else None, kv_cache, md, output=out)
    elif which == 8:
        # vLLM's older paged layout: reshape_and_cache, then paged_attention_v1
        x = d.pick(8, 4, 16, 3)
        kp = d.array((nb, Hk, d.jig(D // 8), bs, x), dt)
        vp = d.array((nb, Hk, D, bs), dt)
        kept += [(kp, kp.copy()), (vp, vp.copy())]
        key = d.array((d.jig(3), Hk, D), dt)
        cap = max(min(nb, 64), 1) * max(min(bs, 64), 1)
        if rng.random() < 0.5:
            pa.reshape_and_cache(key, key, kp, vp, d.ints(d.jig(3), cap, np.int64))
        else:
            out = d.array((B, H, D), dt)
            kept.append((out, out.copy()))
            sl = d.ints(d.jig(B), cap + 1) + 1
            pa.paged_attention_v1(out, d.array((B, H, D), dt), kp, vp, d.jig(Hk), 0.1, bt, sl,
                                  d.jig(bs), int(sl.max(initial=1)),
                                  alibi_slopes=kw.get("alibi_slopes"))
    elif which == 9:
        # dense and packed FlashAttention calls
        S = d.jig(5)
        if rng.random() < 0.5:
            qkv = d.array((B, S, 3, H, D), dt)
            pa.flash_attn_qkvpacked_func(qkv, causal=causal,
                                         window_size=kw.get("window_size"))
        else:
            q = d.array((B, S, H, D), dt)
            kk = d.array((B, d.jig(S), Hk, D), dt)
            out = d.array((B, S, H, D), dt) if rng.random() < 0.3 else None
            if out is not None:
                kept.append((out, out.copy()))
            pa.flash_attn_func(q, kk, kk if rng.random() < 0.8 else d.array(kk.shape, dt),
                               causal=causal, out=out, **{k_: kw[k_] for k_ in kw if k_ in (
                                   "window_size", "alibi_slopes", "s_aux", "softcap")})
    elif which == 10:
        # vLLM's prefix-prefill kernel over the older layout, and convert_fp8
        if rng.random() < 0.5:
            x = d.pick(8, 4, 16)
            kp = d.array((nb, Hk, d.jig(D // 8), bs, x), dt)
            vp = d.array((nb, Hk, D, bs), dt)
            kept += [(kp, kp.copy()), (vp, vp.copy())]
            n = max(min(B, 4), 0)
            new = d.ints(n, 4, np.int64) + 1
            ctxl = d.ints(n, 20, np.int64)
            T = int(new.sum()) + d.jig(0)
            q, kn = d.array((T, H, D), dt), d.array((T, Hk, D), dt)
            o = d.array((T, H, D), dt)
            kept.append((o, o.copy()))
            starts = np.concatenate([[0], np.cumsum(new)[:-1]]).astype(np.int64)
            tabs = d.ints(n * 4, max(min(nb, 64), 1)).reshape(n, 4) if n else np.zeros((0, 4),
                                                                                       np.int32)
            pa.context_attention_fwd(q, kn, kn, o, kw.get("kv_cache_dtype", "auto"), kp, vp, tabs,
                                     starts, ctxl + new, ctxl, int(new.max(initial=1)),
                                     sliding_window=d.pick(None, 4, 0, -3))
        else:
            src = d.array((d.jig(6),), d.pick(*FLOATS, np.dtype(np.uint8)))
            dst = d.array((d.jig(6),), d.pick(*FLOATS, np.dtype(np.uint8)))
            kept.append((dst, dst.copy()))
            pa.convert_fp8(dst, src, d.pick(1.0, 0.5, 0.0, -1.0, float("nan")),
                           d.pick("fp8", "fp8_e5m2", "fp8_e4m3", "x"))
    elif which == 11:
        # the backend's block copies over [2, num_blocks, ...] caches
        backend = pa.get_attn_backend()
        c1 = d.array((d.jig(2), nb, bs, Hk, D), dt)
        c2 = d.array((2, d.jig(nb), bs, Hk, D), dt if rng.random() < 0.9 else None)
        kept += [(c1, c1.copy()), (c2, c2.copy())]
        pairs = d.ints(2 * max(d.jig(2), 0), max(nb, 1), np.int64).reshape(-1, 2)
        if rng.random() < 0.5:
            backend.swap_blocks(c1, c2, pairs)
        else:
            backend.copy_blocks([c1, c2], pairs)
    else:
        T = d.jig(4)
        parts = d.array((T, H, D), dt)
        lse = d.array((H, T), np.dtype(np.float32))
        out = d.array((T, H, D), dt)
        kept.append((out, out.copy()))
        pa.merge_attn_states(out, parts, lse, d.array((T, H, D), dt),
                             d.array((d.jig(H), T), np.dtype(np.float32)),
                             d.array((H, T), np.dtype(np.float32)) if rng.random() < 0.3 else None)


def _v1_fields(d, sl, ql, tables, bs, nb, cross=False):
    """vLLM v1-style metadata (a dict) of the drawn step, with a padding request, padded slots
    and (sometimes) a perturbed field. cross: a cross-attention layer's (sl are encoder
    lengths; the slots are the encoder tokens of a drawn subset of the requests)."""
    rng = d.rng
    n = len(sl)
    qsl = np.zeros(n + 2, np.int64)
    qsl[1:n + 1] = np.cumsum(ql)
    qsl[n + 1] = qsl[n]
    width = max([len(t) for t in tables] + [1])
    bt = np.zeros((n + 1, width), np.int32)
    for i, t in enumerate(tables):
        bt[i, :len(t)] = t
    total = int(qsl[n])
    if 0 <= total < 1000 and int(ql.min(initial=0)) >= 0:
        slots = []
        for t, s, q in zip(tables, sl, ql):
            if cross and rng.random() < 0.4:
                continue  # this request's encoder K/V are already cached
            for p in range(0 if cross else int(s) - int(q), int(s)):
                b = t[p // bs] if 0 <= p // bs < len(t) else -1
                slots.append(int(b) * bs + p % bs if b >= 0 else -1)
        slots = np.array(slots + ([] if cross else [-1] * 3), np.int64)
    else:
        slots = d.ints(64, nb * bs, np.int64)
    f = dict(query_start_loc=qsl.astype(np.int32), seq_lens=np.append(sl, 0).astype(np.int32),
             block_table=bt, slot_mapping=slots, num_actual_tokens=total, causal=not cross)
    r = rng.random()
    if r < 0.05:
        f["num_actual_tokens"] = d.jig(total, 1.0)
    elif r < 0.1:
        f["query_start_loc"][rng.integers(n + 2)] = d.pick(-1, 0, 2 ** 31 - 1)
    elif r < 0.13:
        f["causal"] = cross
    elif r < 0.16:
        del f[d.pick("query_start_loc", "seq_lens", "block_table", "slot_mapping")]
    return f


def _same(a, b):
    if a.dtype.kind == "f":
        return np.array_equal(a, b, equal_nan=True)
    return a.tobytes() == b.tobytes()


@pytest.mark.parametrize("seed", range(4))
def test_random_malformed_calls(seed):
    d = Draw(1000 + seed)
    outcomes = {}
    for _ in range(400):
        d.kept = []
        try:
            one_call(d)
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except ALLOWED as e:
            name = type(e).__name__
            outcomes[name] = outcomes.get(name, 0) + 1
            for a, copy in d.kept:  # a failing call changes none of its arrays
                assert _same(a, copy), (name, str(e))
    assert outcomes.get("ok", 0) >= 20, outcomes  # the draws do reach the library's work
