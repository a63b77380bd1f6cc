"""Times PyTorch's CPU attention on one of pagedattn's bench shapes, for bench/compare/compare.py.

    python torch_cpu.py decode|prefill BATCH CTX f32|f16|bf16 THREADS REPEATS sdpa|grouped

32 query / 8 KV heads x 128, contiguous K/V (torch has no paged cache). `sdpa`:
torch.nn.functional.scaled_dot_product_attention with K and V expanded to the 32 query heads
beforehand (untimed; its fused CPU kernel takes equal head counts, so it reads each KV byte for
every query head of the group); prefill is causal. `grouped` (decode only): the 4 query heads
of a KV head as a 4-row matrix, scores = q k^T by matmul, softmax in fp32, then p v, so each KV
byte is read once, in the cache dtype. Prints one JSON line: the times in ms of REPEATS runs
after one warm-up run.
"""
import sys

import torch
import torch.nn.functional as F

from timing import report


def main(argv):
    mode, batch, ctx, dt, threads, reps, variant = argv
    batch, ctx, threads, reps = int(batch), int(ctx), int(threads), int(reps)
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dt]
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    d, h, hk = 128, 32, 8
    nq = ctx if mode == "prefill" else 1
    q = torch.rand(batch, h, nq, d, generator=g).sub_(0.5).to(dtype)
    k = torch.rand(batch, hk, ctx, d, generator=g).sub_(0.5).to(dtype)
    v = torch.rand(batch, hk, ctx, d, generator=g).sub_(0.5).to(dtype)
    scale = d ** -0.5
    if variant == "sdpa":
        k = k.repeat_interleave(h // hk, dim=1)
        v = v.repeat_interleave(h // hk, dim=1)

        def run():
            return F.scaled_dot_product_attention(q, k, v, is_causal=mode == "prefill", scale=scale)
    elif variant == "grouped" and mode == "decode":
        qg = q.reshape(batch, hk, h // hk, d)

        def run():
            s = torch.matmul(qg, k.transpose(-1, -2)).float().mul_(scale)
            p = torch.softmax(s, dim=-1).to(dtype)
            return torch.matmul(p, v)
    else:
        raise SystemExit(f"unknown variant {variant} for {mode}")
    report(f"torch {torch.__version__} {variant}", run, reps)


if __name__ == "__main__":
    main(sys.argv[1:])
