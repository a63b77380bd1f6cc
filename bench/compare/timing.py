"""Shared by torch_cpu.py and ipex_cpu.py: the timing loop and the JSON line compare.py reads."""
import json
import time


def report(impl, run, reps):
    """One warm-up call of run(), then reps timed calls; prints {"impl", "times_ms"} as one line."""
    import torch

    with torch.inference_mode():
        run()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"impl": impl, "times_ms": times}))
