"""Decode and prefill times with logits spread wide (bench/NOTES.md, forty-first pass).

Keys whose logit lies 87 to 104 below their row's maximum weigh exp(s - m), an fp32 subnormal;
Intel cores serve every FMA that takes one by a microcode assist. This times one thread of the cpu
backend over the same shapes with ordinary and with wide logits (keys or queries times 30, fp8
codes up to 120), so that a build's cost of such rows shows as the ratio of the two.

    PYTHONPATH=python PAGEDATTN_LIBRARY=build/libpagedattn.so PAGEDATTN_NUM_THREADS=1 \
        [PAGEDATTN_CPU_ISA=avx2] taskset -c 0 python3 bench/micro/wide_logits.py
"""
import time

import ml_dtypes
import numpy as np

import pagedattn as pa

BF16 = np.dtype(ml_dtypes.bfloat16)
rng = np.random.default_rng(0)


def best_ms(f, reps=3):
    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return min(ts) * 1e3


def decode(k, v, q, lens, bt, **kw):
    return best_ms(lambda: pa.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=bt,
                                                      causal=True, backend="cpu", **kw))


def main():
    S, ctx, bs, Hkv, H, D = 16, 2048, 16, 8, 32, 128
    nb = S * ctx // bs
    bt = rng.permutation(nb).astype(np.int32).reshape(S, -1)
    q = rng.standard_normal((S, 1, H, D), dtype=np.float32).astype(BF16)
    lens = np.full(S, ctx, np.int32)
    shape = (nb, bs, Hkv, D)
    v = rng.standard_normal(shape, dtype=np.float32).astype(BF16)
    for mag in (1, 30):
        k = (rng.standard_normal(shape, dtype=np.float32) * mag).astype(BF16)
        print("decode %d x %d bf16, keys x %-3d %8.2f ms" % (S, ctx, mag, decode(k, v, q, lens, bt)),
              flush=True)
    for hi in (56, 120):
        k8 = rng.integers(0, hi, size=shape, dtype=np.uint8)
        v8 = rng.integers(0, 56, size=shape, dtype=np.uint8)
        print("decode %d x %d e4m3, codes < %-3d %8.2f ms"
              % (S, ctx, hi, decode(k8, v8, q, lens, bt, kv_cache_dtype="fp8")), flush=True)
    T = 1024
    kk = rng.standard_normal((T, Hkv, D), dtype=np.float32)
    vv = rng.standard_normal((T, Hkv, D), dtype=np.float32)
    cu = np.array([0, T], np.int32)
    for mag in (1, 30):
        qq = rng.standard_normal((T, H, D), dtype=np.float32) * mag
        ms = best_ms(lambda: pa.flash_attn_varlen_func(qq, kk, vv, T, cu, T, cu, causal=True,
                                                       backend="cpu"))
        print("prefill %d causal f32, queries x %-3d %8.2f ms" % (T, mag, ms), flush=True)


if __name__ == "__main__":
    main()
