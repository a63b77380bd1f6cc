"""Checks `pagedattn bench --json` output read from stdin: one JSON document with the limits it
measured and one result per case asked for, every figure finite and consistent with the others.
argv[1]: the case name expected; argv[2]: "1" when the build is optimized (not Debug); argv[3]
(optional): the heads "HQ/HKV" the run was asked for (default 32/8), checked against the document
and, for a decode case, against the work its rates imply; argv[4] (optional): the --layout asked
for ("nhd" or "hnd"; "preferred" or absent: none, the backend's preferred one); argv[5]
(optional): the --blocks asked for (default shuffled; "hot": the floor is the compute floor
alone, the KV coming from the caches); argv[6] (optional): the --block-size asked for (default 16)."""
import json
import math
import sys

doc = json.load(sys.stdin)
case, optimized = sys.argv[1], sys.argv[2] == "1"
hq, hkv = map(int, (sys.argv[3] if len(sys.argv) > 3 else "32/8").split("/"))
assert doc["heads"] == {"query": hq, "kv": hkv, "size": 128}, doc["heads"]
assert doc["cache_layout"] == (sys.argv[4] if len(sys.argv) > 4 else "preferred"), doc["cache_layout"]
blocks = sys.argv[5] if len(sys.argv) > 5 else "shuffled"
assert doc["block_tables"] == blocks, doc["block_tables"]
assert doc["block_size"] == (int(sys.argv[6]) if len(sys.argv) > 6 else 16), doc["block_size"]
assert doc["optimized_build"] is optimized, doc["optimized_build"]
assert doc["online_cores"] >= 1 and 1 <= doc["all_threads"] <= doc["online_cores"], doc
# the read probe walks at least max(512 MiB, 2 x the LLC) under --quick (every test here runs it)
assert doc["read_buffer_mib"] >= 512 and doc["read_buffer_mib"] * 1048576 >= 2 * doc["llc_bytes"], doc
(lim,) = doc["limits"]
assert lim["threads"] == 1 and lim["read_gbs"] > 0 and lim["fma_gflops"] > 0, lim
(res,) = doc["results"]
assert res["case"] == case and res["backend"] == "cpu" and res["threads"] == 1, res
assert 0 < res["min_ms"] <= res["median_ms"] <= res["max_ms"], res
assert res["repeats"] >= 1, res
# one timed pass walks as much KV as the read probe (it used to stop at 256 MiB, 16 layers: a
# short decode then came from the LLC and read "faster than memory"), but a hot one: one layer
if blocks == "hot":
    assert res["layers"] == 1, res
elif case.startswith("decode ") or case.startswith("mixed "):
    assert res["pass_mib"] >= 0.99 * doc["read_buffer_mib"], res
# steal time (Linux /proc/stat): what the hypervisor took during the case, or null elsewhere
assert res["steal_ms"] is None or (math.isfinite(res["steal_ms"]) and res["steal_ms"] >= 0), res
if sys.platform.startswith("linux"):
    assert res["steal_ms"] is not None, res
for key in ("kv_gbs", "gflops", "tokens_per_s", "floor_ms", "fraction"):
    assert math.isfinite(res[key]) and res[key] > 0, (key, res[key])
# the fraction is the floor over the median; the floor is the larger roofline time (KV bytes over
# the read bandwidth, useful flops over the FMA peak), both recoverable from the rates
t_mem = res["kv_gbs"] * res["median_ms"] / lim["read_gbs"] if blocks != "hot" else 0.0
# (the bf16 dot-product peak for a bf16 or fp8 case, bf16 queries, where the CPU has one and it
# beats the FMA peak)
bf16 = (case.endswith(" bf16") or " fp8" in case) and lim["bf16_dot_gflops"] is not None and lim["bf16_dot_gflops"] > lim["fma_gflops"]
peak = lim["bf16_dot_gflops"] if bf16 else lim["fma_gflops"]
t_fma = res["gflops"] * res["median_ms"] / peak
floor = max(t_mem, t_fma)
assert abs(res["floor_ms"] - floor) <= 2e-3 * floor, (res, t_mem, t_fma)
compute = "bf16 dot" if bf16 else "fp32 fma"
assert res["bound"] == ("memory" if t_mem > t_fma else compute), (res["bound"], t_mem, t_fma)
assert abs(res["fraction"] - res["floor_ms"] / res["median_ms"]) <= 2e-3 * res["fraction"], res
# a decode step: every query head reads each of its KV head's keys once (QK and PV: 4 x 128
# flops) and the cache holds K and V of HKV heads x 128 per token, so flops / KV bytes =
# 2 HQ / (HKV x element size)
if case.startswith("decode "):
    es = {"f32": 4, "f16": 2, "bf16": 2}.get(case.split()[-1], 1)
    ratio = (res["gflops"] * 1e9) / (res["kv_gbs"] * 1e9)
    assert abs(ratio - 2.0 * hq / (hkv * es)) <= 1e-3 * ratio, (ratio, hq, hkv, es)
print("bench --json: ok,", case, "fraction", res["fraction"])
