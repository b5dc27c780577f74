"""SIGKILL a digits build at seeded random moments, N times, and count what a kill can break:
partial versions (a version folder without every file, or a model without config.pbtxt), folders
left behind before the next build swept them, and whether the next build takes the right number.

Usage: python benchmarks/fault_kills.py [--kills 50] [--seed 7] [--max-delay 9]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.repository.layout import existing_versions  # noqa: E402
from builder.repository.validate import validate_model  # noqa: E402
from builder.core.scratch import WORK_PREFIX, staging_prefix  # noqa: E402


def build(spec: Path, repo: Path, tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp))
    return subprocess.Popen([sys.executable, "-m", "builder", "build", str(spec), "--repository", str(repo),
                             "--variants", "onnx", "--benchmark-seconds", "0", "-q"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def partial_versions(repo: Path) -> list[str]:
    model = repo / "digits_cnn"
    bad = []
    versions = existing_versions(model)
    if versions and not (model / "config.pbtxt").is_file():
        bad.append("config.pbtxt missing")
    for version in versions:
        if not validate_model(model, version).ok:
            bad.append(f"version {version}")
    return bad


def leftovers(repo: Path, tmp: Path) -> int:
    return (sum(p.name.startswith(WORK_PREFIX) for p in tmp.iterdir())
            + sum(p.name.startswith(staging_prefix(repo)) for p in repo.parent.iterdir()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-delay", type=float, default=9.0, help="kill within this many seconds of the start")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="fault-kills-"))
    spec_dir = work / "digits"
    shutil.copytree(ROOT / "examples" / "digits", spec_dir, ignore=shutil.ignore_patterns("__pycache__"))
    repo, tmp = work / "model_repository", work / "tmp"
    tmp.mkdir()
    rows, started = [], time.monotonic()
    try:
        for trial in range(1, args.kills + 1):
            before = existing_versions(repo / "digits_cnn")
            delay = rng.uniform(0.3, args.max_delay)
            proc = build(spec_dir / "spec.yaml", repo, tmp)
            try:
                proc.wait(delay)
                killed = False
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                killed = True
            after = existing_versions(repo / "digits_cnn")
            rows.append({"trial": trial, "delay": delay, "killed": killed, "published": len(after) > len(before),
                         "partial": partial_versions(repo), "left": leftovers(repo, tmp)})
            print(f"  trial {trial:3d}: {'killed' if killed else 'finished'} at {delay:4.1f} s, "
                  f"published {rows[-1]['published']}, partial {rows[-1]['partial'] or 0}, "
                  f"folders left {rows[-1]['left']}", flush=True)
        final_before = existing_versions(repo / "digits_cnn")
        final = build(spec_dir / "spec.yaml", repo, tmp)
        final.wait(600)
        final_versions = existing_versions(repo / "digits_cnn")
        left_after = leftovers(repo, tmp)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    killed = [r for r in rows if r["killed"]]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    print(f"\nhost: {cpu}, {os.cpu_count()} cores; {len(rows)} trials in {time.monotonic() - started:.0f} s")
    print("| figure | value |\n|---|---|")
    print(f"| builds killed | {len(killed)} of {len(rows)} (the rest finished before their kill time) |")
    print(f"| killed builds that had published | {sum(r['published'] for r in killed)} |")
    print(f"| partial versions seen after a kill | {sum(bool(r['partial']) for r in rows)} |")
    print(f"| most folders left at once (swept by the next build) | {max((r['left'] for r in rows), default=0)} |")
    print(f"| folders left after the final build | {left_after} |")
    ok_number = final.returncode == 0 and final_versions == final_before + [len(final_before) + 1]
    print(f"| final build exit code / version right | {final.returncode} / {ok_number} |")
    return 0 if ok_number and left_after == 0 and not any(r["partial"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
