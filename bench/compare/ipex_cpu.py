"""Times Intel Extension for PyTorch's paged attention on one of pagedattn's bench shapes, for
bench/compare/compare.py.

    python ipex_cpu.py decode|prefill BATCH CTX f32|f16|bf16|fp8_e4m3 THREADS REPEATS

IPEX (intel-extension-for-pytorch, the CPU kernels vLLM's CPU backend called before it had its
own) takes a paged cache as pagedattn does: [blocks, KV heads, block size, head] (HND), block 16,
each sequence's blocks spread over the pool in a random order (as `pagedattn bench`'s default
tables). 32 query / 8 KV heads x 128. decode: PagedAttention.single_query_cached_kv_attention
(one query token per sequence, context CTX); prefill: PagedAttention.flash_attn_varlen_func over
the same kind of cache, one causal prompt of CTX tokens. Prints one JSON line: the times in ms of
REPEATS runs after one warm-up run; exits 3 (with a line on stderr) for a dtype IPEX refuses.
"""
import sys

import torch

from timing import report

try:
    from intel_extension_for_pytorch.llm.modules import PagedAttention
except ImportError as e:  # (compare.py probes for this)
    print(f"no IPEX: {e}", file=sys.stderr)
    sys.exit(2)


def main(argv):
    mode, batch, ctx, dt, threads, reps = argv
    batch, ctx, threads, reps = int(batch), int(ctx), int(threads), int(reps)
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    if dt not in dtypes:
        print(f"IPEX's paged attention takes no {dt} cache here", file=sys.stderr)
        sys.exit(3)
    dtype = dtypes[dt]
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    d, h, hk, bs = 128, 32, 8, 16
    nbps = (ctx + bs - 1) // bs
    nb = batch * nbps
    tables = torch.randperm(nb, generator=g).reshape(batch, nbps).to(torch.int32)
    kc = torch.rand(nb, hk, bs, d, generator=g).sub_(0.5).to(dtype)
    vc = torch.rand(nb, hk, bs, d, generator=g).sub_(0.5).to(dtype)
    scale = d ** -0.5
    if mode == "decode":
        q = torch.rand(batch, h, d, generator=g).sub_(0.5).to(dtype)
        out = torch.empty_like(q)
        head_mapping = torch.arange(hk, dtype=torch.int32).repeat_interleave(h // hk)
        lens = torch.full((batch,), ctx, dtype=torch.int32)

        def run():
            PagedAttention.single_query_cached_kv_attention(out, q, kc, vc, head_mapping, scale, tables, lens, bs,
                                                            ctx, None)
    elif mode == "prefill":
        if batch != 1:
            raise SystemExit("prefill: one prompt")
        q = torch.rand(ctx, h, d, generator=g).sub_(0.5).to(dtype)
        out = torch.empty_like(q)
        cu = torch.tensor([0, ctx], dtype=torch.int32)

        def run():
            PagedAttention.flash_attn_varlen_func(out, q, kc, vc, cu, cu, ctx, ctx, scale, True, tables, None)
    else:
        raise SystemExit(f"unknown mode {mode}")
    import intel_extension_for_pytorch as ipex
    report(f"ipex {ipex.__version__}", run, reps)


if __name__ == "__main__":
    main(sys.argv[1:])
