"""Per-request cost of DriftWindow.observe() (a micro-benchmark, not a test).

Prints microseconds per observe() call, averaged over many calls, for:
  * a [1,1,8,8] float32 image + [1,10] logits batch (the `digits` example shape)
  * a [16,1,64,64] float32 image batch + [16,10] logits (the `convnet64` example shape)
each at sample_every=1 and sample_every=10, plus the cost of one scores() call.

Usage: python benchmarks/drift_overhead.py [--calls 5000]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np

from builder.monitoring import drift_profile


def _load_drift():
    # load builder/monitoring/drift.py by path: it is self-contained, like in a model folder
    path = Path(__file__).resolve().parent.parent / "builder" / "monitoring" / "drift.py"
    spec = importlib.util.spec_from_file_location("drift", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench(drift, shape, calls, sample_every, rng):
    ref_n = 512 if shape[0] == 1 else 32
    ref = {"image": rng.random((ref_n * shape[0],) + shape[1:], dtype=np.float32)}
    ref_out = {"logits": rng.normal(size=(ref_n * shape[0], 10)).astype(np.float32)}
    profile = drift_profile.build_profile(ref, ref_out)
    win = drift.DriftWindow(profile, window=512, sample_every=sample_every)
    batches = [
        ({"image": rng.random(shape, dtype=np.float32)},
         {"logits": rng.normal(size=(shape[0], 10)).astype(np.float32)})
        for _ in range(16)
    ]
    for i in range(min(calls, 200)):  # warm-up (fills position caches)
        win.observe(*batches[i % 16])
    t0 = time.perf_counter()
    for i in range(calls):
        win.observe(*batches[i % 16])
    per_call = (time.perf_counter() - t0) / calls * 1e6
    t0 = time.perf_counter()
    n_scores = 200
    for _ in range(n_scores):
        win.scores()
    score_us = (time.perf_counter() - t0) / n_scores * 1e6
    return per_call, score_us, len(profile["features"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args(argv)
    drift = _load_drift()
    rng = np.random.default_rng(0)
    print(f"numpy {np.__version__}; {args.calls} observe() calls per small-batch case; window=512")
    print(f"{'batch':<34} {'sample_every':>12} {'us/request':>11} {'us/row':>8} {'scores() us':>12}")
    for shape in [(1, 1, 8, 8), (16, 1, 64, 64)]:
        for every in (1, 10):
            calls = args.calls if shape[0] == 1 else max(args.calls // 5, 100)
            us, score_us, nfeat = bench(drift, shape, calls, every, rng)
            label = f"image{list(shape)} + logits[{shape[0]},10]"
            print(f"{label:<34} {every:>12} {us:>11.1f} {us / shape[0]:>8.2f} {score_us:>12.1f}")
    print("(us/request = mean wall time of one observe() call, sampled or not;"
          f" {nfeat} features: image channel, output class, output score)")


if __name__ == "__main__":
    main()
