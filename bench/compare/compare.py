#!/usr/bin/env python3
"""pagedattn beside other CPU attention implementations, on the bench's standard shapes.

    python3 bench/compare/compare.py [--pagedattn build/tools/pagedattn]
        [--torch-python PY] [--ipex-python PY] [--ggml build-ggml/ggml_fa] [--threads 1,2]
        [--rounds 3] [--repeats 3] [--cases SUBSTR]

Each round runs every implementation once per case and thread count, one after another, in an
order that rotates from round to round (this host is shared and noisy: a slow minute then hits
all of them alike). pagedattn runs through `pagedattn bench --json` (paged cache, block 16);
PyTorch (when PY imports torch) through torch_cpu.py, as SDPA and, for decode, as grouped
matmuls; Intel Extension for PyTorch (when PY, by default the torch one, imports it) through
ipex_cpu.py, its paged attention over the same kind of paged cache; ggml (when --ggml names the
binary made by build_ggml.sh) through ggml_fa. Reported:
min / median / max over all the timed runs of all rounds, and each other implementation's median
over pagedattn's (above 1: pagedattn is faster). The implementations differ in what they can take:
torch has no paged cache and no fp8 matmul on the CPU, ggml has no fp8 (its q8_0, 8.5 bits per
value with a scale per 32, stands in beside fp8 and is labelled so), and ggml's FA takes f32 queries.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# (pagedattn case, mode, batch, ctx, torch dtype or None, ggml K/V type)
CASES = [
    ("decode b16 x 4096 bf16", "decode", 16, 4096, "bf16", "bf16"),
    ("decode b16 x 4096 f16", "decode", 16, 4096, "f16", "f16"),
    ("decode b16 x 4096 fp8_e4m3", "decode", 16, 4096, None, "q8_0"),
    ("decode b1 x 32768 bf16", "decode", 1, 32768, "bf16", "bf16"),
    ("decode b1 x 32768 f16", "decode", 1, 32768, "f16", "f16"),
    ("decode b1 x 32768 fp8_e4m3", "decode", 1, 32768, None, "q8_0"),
    ("prefill 2048 causal f32", "prefill", 1, 2048, "f32", "f32"),
    ("prefill 2048 causal bf16", "prefill", 1, 2048, "bf16", "bf16"),
]


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout[r.stdout.index("{"):])


def pagedattn_times(exe, case, threads, repeats):
    out = run_json([exe, "bench", "--cases", case, "--threads", str(threads), "--repeats", str(repeats), "--json"])
    res = [r for r in out["results"] if r["case"] == case and r["threads"] == threads]
    if len(res) != 1:
        raise RuntimeError(f"pagedattn bench gave {len(res)} results for {case!r}")
    r = res[0]
    # bench reports min/median/max of its repeats; keep all three as samples of this round
    return [r["min_ms"], r["median_ms"], r["max_ms"]], r["backend"]


def has_torch(py):
    return py and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0


def has_ipex(py):
    code = "import intel_extension_for_pytorch.llm.modules"
    return py and subprocess.run([py, "-c", code], capture_output=True).returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagedattn", default="build/tools/pagedattn")
    ap.add_argument("--torch-python", default=sys.executable)
    ap.add_argument("--ipex-python", default=None, help="python that imports IPEX (default: --torch-python)")
    ap.add_argument("--ggml", default=None)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default="")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    torch_py = a.torch_python if has_torch(a.torch_python) else None
    if not torch_py:
        print(f"(torch: not importable by {a.torch_python}; skipped)")
    ipex_py = a.ipex_python or torch_py
    ipex_py = ipex_py if has_ipex(ipex_py) else None
    if not ipex_py:
        print("(IPEX: not importable; skipped)")
    if a.ggml and not os.access(a.ggml, os.X_OK):
        sys.exit(f"--ggml {a.ggml}: not an executable (make it with bench/compare/build_ggml.sh)")

    jobs = []  # (case row, threads, impl label, runner)
    for c in CASES:
        name, mode, b, ctx, tdt, gdt = c
        if a.cases not in name:
            continue
        for t in threads:
            jobs.append((c, t, "pagedattn", lambda n=name, t=t: pagedattn_times(a.pagedattn, n, t, a.repeats)[0]))
            if torch_py and tdt:
                variants = ["sdpa", "grouped"] if mode == "decode" else ["sdpa"]
                for v in variants:
                    cmd = [torch_py, os.path.join(HERE, "torch_cpu.py"), mode, str(b), str(ctx), tdt, str(t), str(a.repeats), v]
                    jobs.append((c, t, f"torch {v} ({tdt})", lambda cmd=cmd: run_json(cmd)["times_ms"]))
            if ipex_py and tdt:
                cmd = [ipex_py, os.path.join(HERE, "ipex_cpu.py"), mode, str(b), str(ctx), tdt, str(t), str(a.repeats)]
                jobs.append((c, t, f"ipex paged ({tdt})", lambda cmd=cmd: run_json(cmd)["times_ms"]))
            if a.ggml:
                cmd = [a.ggml, mode, str(b), str(ctx), gdt, str(t), str(a.repeats)]
                jobs.append((c, t, f"ggml ({gdt})", lambda cmd=cmd: run_json(cmd)["times_ms"]))

    samples = {}
    for rnd in range(a.rounds):
        order = jobs[rnd % len(jobs):] + jobs[:rnd % len(jobs)] if jobs else []
        for i, (c, t, label, fn) in enumerate(order):
            print(f"round {rnd + 1}/{a.rounds}, {i + 1}/{len(order)}: {c[0]}, {t} thr, {label}", file=sys.stderr, flush=True)
            samples.setdefault((c[0], t, label), []).extend(fn())

    print(f"load average at the end: {os.getloadavg()[0]:.2f}; {a.rounds} rounds x {a.repeats} repeats")
    print(f"{'case':30} {'thr':>3}  {'implementation':24} {'min ms':>9} {'median':>9} {'max ms':>9}  vs pagedattn")
    for c in CASES:
        for t in threads:
            base = samples.get((c[0], t, "pagedattn"))
            if not base:
                continue
            bmed = statistics.median(base)
            for (name, tt, label), xs in samples.items():
                if name != c[0] or tt != t:
                    continue
                med = statistics.median(xs)
                ratio = "" if label == "pagedattn" else f"{med / bmed:8.2f}x slower" if med >= bmed else f"{bmed / med:8.2f}x faster"
                print(f"{c[0]:30} {t:3}  {label:24} {min(xs):9.1f} {med:9.1f} {max(xs):9.1f}  {ratio}")


if __name__ == "__main__":
    main()
