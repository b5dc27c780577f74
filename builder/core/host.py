"""The host profile: where a build measured (CPU model, ISA flags and class, cores usable by THIS
process, thread settings, GPU), how another host differs from it, and how serving is sized to a host.

Usage::

    profile = host_profile()                       # recorded in metadata.yaml under "host"
    for line in compare_hosts(meta["host"], host_profile()):
        progress(line)                             # serve / check / validate say it; nothing prints here
    instances, threads = size_serving(usable_cores=4, batch_seconds=0.004, overhead_seconds=0.0005)

Usable cores are the cores this process may run on: the affinity mask (os.sched_getaffinity) bounded by
the cgroup CPU quota of its own group and every group above it (v2 ``cpu.max``, v1
``cpu.cfs_quota_us / cpu.cfs_period_us``), never the host's count: a container on a 64-core host with a
2-CPU quota has 2.
"""

from __future__ import annotations

import math
import os
import platform
import posixpath
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from builder.core.processes import run_command

ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "avx_vnni", "neon", "asimd")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# from the best to the plainest; a host is in the first class whose flags it has
ISA_CLASSES = (("amx", ("amx_tile",)), ("avx512_vnni", ("avx512_vnni",)), ("avx512", ("avx512f",)),
               ("avx2", ("avx2",)))


def cpu_info(text: str) -> tuple[str, list[str]]:
    """The CPU model and the ISA flags of interest, from /proc/cpuinfo's text."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags.update(value.split())
    model = model or platform.processor() or platform.machine()
    return model, sorted(f for f in ISA_FLAGS if f in flags)


def isa_class(flags: list[str]) -> str:
    """"amx", "avx512_vnni", "avx512", "avx2" or "other": what decides INT8 and FP32 speed."""
    for name, needed in ISA_CLASSES:
        if all(f in flags for f in needed):
            return name
    return "other"


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def _unescape(field: str) -> str:
    """mountinfo writes a space in a path as \\040 (and tab, newline, backslash likewise)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _cgroup_mounts(mountinfo: str) -> list[tuple[str, str, str]]:
    """(kind, mount root inside the hierarchy, mount point): kind "v2" for cgroup2, "v1" for a v1
    hierarchy with the cpu controller; other mounts are left out."""
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 4:
            continue
        fstype, options = fields[dash + 1], set(fields[dash + 3].split(","))
        kind = "v2" if fstype == "cgroup2" else "v1" if fstype == "cgroup" and "cpu" in options else None
        if kind:
            mounts.append((kind, _unescape(fields[3]), _unescape(fields[4])))
    return mounts


def _group_folders(group: str, mounts: list[tuple[str, str]]) -> list[str]:
    """The folders from the process's group up to the top of what is mounted, for one hierarchy.

    The group path in /proc/self/cgroup is relative to the hierarchy's root (or the cgroup namespace's);
    a mount shows the hierarchy from its own root (a container's bind mount of its group shows that group
    at the mount point), so the group's folder is the mount point plus the group path past the mount root.
    A group outside every mount root (a namespace's "/.." paths) can only be seen at the mount point."""
    holding = [(root.rstrip("/"), point) for root, point in mounts
               if group == root.rstrip("/") or group.startswith(root.rstrip("/") + "/")]
    if not holding:
        return [point for _, point in mounts[:1]]
    deepest = max(len(root) for root, _ in holding)  # the mount nearest the group shows the most of its path
    folders = []
    for root, point in (m for m in holding if len(m[0]) == deepest):
        parts = [p for p in group[len(root):].split("/") if p and p != "."]
        parts = [] if ".." in parts else parts
        folders += [posixpath.join(point, *parts[:depth]) for depth in range(len(parts), -1, -1)]
    return folders


def _quota_at(kind: str, folder: str, read: Callable[[str], str]) -> float | None:
    """CPUs one group's own quota allows; None where it sets none ("max", -1) or has no such file."""
    try:
        if kind == "v2":
            parts = read(posixpath.join(folder, "cpu.max")).split()
            if not parts or parts[0] == "max":
                return None
            quota, period = int(parts[0]), int(parts[1]) if len(parts) > 1 else 100000
        else:
            quota = int(read(posixpath.join(folder, "cpu.cfs_quota_us")))
            period = int(read(posixpath.join(folder, "cpu.cfs_period_us")))
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


# where the hierarchies are mounted when /proc/self/mountinfo cannot be read (not Linux, a locked-down /proc)
_DEFAULT_MOUNTS = [("v2", "/", "/sys/fs/cgroup"), ("v1", "/", "/sys/fs/cgroup/cpu"),
                   ("v1", "/", "/sys/fs/cgroup/cpu,cpuacct")]


def cgroup_cpu_limit(read: Callable[[str], str] = _read_text) -> float | None:
    """CPUs the cgroup CPU quota allows THIS process, None where there is no quota.

    The process's own group comes from /proc/self/cgroup (the v2 line "0::PATH", the v1 line whose
    controllers include cpu), found under its hierarchy's mount from /proc/self/mountinfo; every group
    from it up to the mounted top is read (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``),
    since a parent's quota binds its children too, and the smallest wins. Reading only the top of the
    tree saw no quota for a systemd slice, a nested group or a container run without a cgroup namespace.
    ``read`` (an absolute path -> its text, OSError where absent) is injectable for tests."""
    try:
        groups = {}
        for line in read("/proc/self/cgroup").splitlines():
            number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
            if number == "0" and not controllers:
                groups.setdefault("v2", path.strip() or "/")
            elif "cpu" in controllers.split(","):
                groups.setdefault("v1", path.strip() or "/")
    except OSError:
        groups = {"v2": "/", "v1": "/"}  # no /proc: the tops of the usual mounts, as before
    try:
        mounts = _cgroup_mounts(read("/proc/self/mountinfo"))
    except OSError:
        mounts = _DEFAULT_MOUNTS
    limits = []
    for kind, group in groups.items():
        for folder in _group_folders(group, [(root, point) for k, root, point in mounts if k == kind]):
            limit = _quota_at(kind, folder, read)
            if limit is not None:
                limits.append(limit)
    return min(limits) if limits else None


READ_QUOTA = object()  # usable_cores's default: read this process's cgroup quota (cgroup_cpu_limit)


def usable_cores(affinity: int | None = None, quota: float | None | object = READ_QUOTA) -> int:
    """Cores this process may use: the affinity count bounded by the cgroup quota (rounded up, at least 1).
    ``quota`` None: no quota; by default the one this process runs under (a 2-CPU container on a 64-core
    host has 2: the measuring threads, OpenVINO's and tune's layouts follow it, as the recorded profile does)."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if quota is READ_QUOTA:
        quota = cgroup_cpu_limit()
    if quota is not None:
        affinity = min(affinity, max(1, math.ceil(quota - 1e-9)))
    return max(1, affinity)


def gpu_profile() -> list[dict[str, str]]:
    """Each GPU's name, compute capability and driver (nvidia-smi), [] where there is none."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = run_command(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version",
                            "--format=csv,noheader"], timeout=20)
    except Exception:  # noqa: BLE001 - a broken driver is "no GPU" for the profile
        return []
    return parse_gpus(done.stdout) if done.returncode == 0 else []


def parse_gpus(text: str) -> list[dict[str, str]]:
    """nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader, as records."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "compute_capability": parts[1], "driver": parts[2]})
    return gpus


def _tensorrt_version() -> str | None:
    try:
        import tensorrt  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001
        return None
    return getattr(tensorrt, "__version__", None)


def _cuda_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def host_isa_flags() -> list[str]:
    """This CPU's ISA flags of note (``host_profile``'s): e.g. which quantisation recipes won on this host class."""
    try:
        return list(cpu_info(Path("/proc/cpuinfo").read_text())[1])
    except OSError:
        return []


def host_profile(cpuinfo: Path = Path("/proc/cpuinfo"), cgroup_read: Callable[[str], str] = _read_text,
                 with_gpu: bool = True) -> dict[str, Any]:
    """This host as metadata.yaml records it (plain types only); ``cgroup_read``: cgroup_cpu_limit's."""
    try:
        model, flags = cpu_info(cpuinfo.read_text())
    except OSError:
        model, flags = platform.processor() or platform.machine(), []
    quota = cgroup_cpu_limit(cgroup_read)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    profile: dict[str, Any] = {
        "cpu_model": model, "machine": platform.machine(), "isa_flags": flags, "isa_class": isa_class(flags),
        "usable_cores": usable_cores(affinity, quota), "affinity_cores": affinity,
        "cgroup_cpu_quota": quota, "host_cores": os.cpu_count(),
        "threads": {k: os.environ[k] for k in THREAD_VARIABLES if k in os.environ},
    }
    if with_gpu:
        gpus = gpu_profile()
        if gpus:
            profile["gpus"] = gpus
            profile["cuda"] = _cuda_version()
            profile["tensorrt"] = _tensorrt_version()
    return profile


# the fields compare_hosts reads, each with the type every build writes
_RECORD_FIELDS = (("cpu_model", str, "a string"), ("isa_flags", list, "a list"), ("isa_class", str, "a string"),
                  ("usable_cores", int, "a whole number"))


def host_record_problem(recorded: Any) -> str | None:
    """What is wrong with a metadata.yaml ``host`` record (hand-edited, damaged, another tool's), None
    where compare_hosts can read it."""
    if not isinstance(recorded, dict):
        return f"host is not a mapping (it is {type(recorded).__name__} {str(recorded)[:40]!r})"
    for key, kind, words in _RECORD_FIELDS:
        if key not in recorded:
            return f"host.{key} is missing"
        value = recorded[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"host.{key} is not {words} (it is {type(value).__name__} {str(value)[:40]!r})"
    if not all(isinstance(flag, str) for flag in recorded["isa_flags"]):
        return "host.isa_flags is not a list of flag names"
    if recorded["usable_cores"] < 1:
        return f"host.usable_cores is {recorded['usable_cores']}, below 1"
    gpus = recorded.get("gpus")
    if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, dict) for g in gpus)):
        return "host.gpus is not a list of mappings"
    return None


def compare_hosts(recorded: dict[str, Any] | None, current: dict[str, Any], *, model: str = "this model",
                  source: str | Path | None = None, per_process: bool = True) -> list[str]:
    """Plain warnings where the current host differs from the one the build measured on (ISA class,
    usable cores, GPU): what was measured where, and what to run. ``per_process=False`` leaves out the
    usable cores, which belong to the process (its affinity and cgroup), for a caller that is not the
    process that serves (check). [] where they match or nothing was
    recorded (a version built before host profiles: one line saying so). A malformed record is one
    warning naming ``source`` (the metadata.yaml) and the field, and is otherwise ignored: the profile
    is advice, and a hand-edited one must not take serving down."""
    if recorded is None or recorded == {}:
        return [f"{model}: metadata.yaml records no host profile (built before host profiles); "
                f"run `triton-builder select {model}` here to measure it on this host"]
    problem = host_record_problem(recorded)
    if problem:
        return [f"{model}: {source or 'metadata.yaml'}: {problem}: rebuild, or run `triton-builder select {model}` "
                "here to record this host (the host profile is ignored until then)"]
    out = []
    was, now = recorded.get("isa_class"), current.get("isa_class")
    if was != now:
        out.append(f"{model}: variants were measured on {recorded.get('cpu_model')} ({was}: "
                   f"{', '.join(recorded.get('isa_flags') or []) or 'no ISA flags of note'}); this host is "
                   f"{current.get('cpu_model')} ({now}). The winner (e.g. INT8 vs FP32) may differ here: run "
                   f"`triton-builder select {model}` on this host to re-measure and republish")
    cores_was, cores_now = recorded.get("usable_cores"), current.get("usable_cores")
    if per_process and cores_was != cores_now:
        out.append(f"{model}: serving was sized for {cores_was} usable cores where it was built; this process "
                   f"may use {cores_now}. Run `triton-builder select {model}` here (or `triton-builder tune`) "
                   f"to size instances x threads for this host")
    gpus_was = [str(g.get("name")) for g in recorded.get("gpus") or []]
    gpus_now = [str(g.get("name")) for g in current.get("gpus") or []]
    if gpus_was and gpus_was != gpus_now:
        out.append(f"{model}: built on GPU {', '.join(gpus_was)}; this host has "
                   f"{', '.join(gpus_now) or 'no GPU'}: TensorRT plans are GPU-specific "
                   f"(`triton-builder validate --gpu` checks a plan's compatibility)")
    return out


# a python-backend request's cost outside the model, per request: digits (a tiny CNN) serves 1263 req/s
# at concurrency 1 under perf_analyzer on the 2-core dev host (../shared/PLATFORM.md): ~0.8 ms
PYTHON_BACKEND_OVERHEAD_S = 0.0008
# threads pay off once a batch-1 inference (in-process, all usable cores) takes at least this many times the
# overhead. Measured 2026-11-24 (2-core AMD EPYC avx512_vnni, perf_analyzer gRPC, 3 interleaved rounds,
# medians, 1 x 2 threads vs 2 x 1 thread): digits 0.02 ms: c=16 4,553 vs 6,592 req/s (instances win: one
# stub serialises the per-request overhead); conv nets of 0.49 ms: c=1 912 vs 651, c=16 1,332 vs 1,387
# (even under load); 0.98 ms: c=1 669 vs 399, c=16 903 vs 882, p99 31 vs 41 ms; convnet64 1.3 ms: c=1
# 541 vs 276, c=4 635 vs 528, c=16 647 vs 602 (threads win: one request uses both cores)
COMPUTE_BOUND_RATIO = 1.0


def compute_bound(batch_seconds: float, overhead_seconds: float = PYTHON_BACKEND_OVERHEAD_S,
                  ratio: float = COMPUTE_BOUND_RATIO) -> bool:
    """A batch-1 inference of ``batch_seconds`` takes at least ``ratio`` times the per-request overhead."""
    return batch_seconds >= ratio * max(overhead_seconds, 1e-9)


def size_serving(usable_cores: int, batch_seconds: float, overhead_seconds: float = PYTHON_BACKEND_OVERHEAD_S,
                 max_instances: int = 8, ratio: float = COMPUTE_BOUND_RATIO) -> tuple[int, int]:
    """(instances, intra_op_threads) for a CPU model on a host with ``usable_cores``.

    ``batch_seconds`` is the measured time of one batch-1 inference in-process (all usable cores);
    ``overhead_seconds`` the per-request cost outside the model (the backend's). Compute-bound (the
    inference takes at least ``ratio`` times the overhead): few instances with several threads each, so
    one request uses the cores - at low concurrency a request finishes in about half the time on 2 cores,
    and under load it serves as much or more. Overhead-bound (small models): one instance per core, one
    thread each, so requests and their overhead run in parallel (one instance would serialise it: digits
    served 0.69x). instances x threads never exceeds the usable cores. The figures behind the threshold:
    the comment above COMPUTE_BOUND_RATIO; `triton-builder tune` measures layouts on the serving host.
    """
    cores = max(1, int(usable_cores))
    if cores == 1:
        return 1, 1
    if compute_bound(batch_seconds, overhead_seconds, ratio):
        # two instances keep the cores busy while the other instance's request is in its overhead
        instances = 2 if cores >= 4 else 1
        return instances, cores // instances
    return min(cores, max_instances), 1


def serving_size(benchmark: dict[str, Any] | None, cores: int) -> tuple[int, int, str] | None:
    """(instances, threads, why) from a variant's benchmark record (builder/stages/benchmark.py), None
    where it has no batch-1 latency (the benchmark was skipped)."""
    p50 = ((benchmark or {}).get("latency_ms_b1") or {}).get("p50")
    if not p50:
        return None
    instances, threads = size_serving(cores, p50 / 1000.0)
    kind = "compute-bound" if compute_bound(p50 / 1000.0) else "overhead-bound"
    return instances, threads, (f"{instances} instance(s) x {threads} intra-op thread(s): {cores} usable cores, "
                                f"batch-1 p50 {p50:.3f} ms ({kind} against ~{PYTHON_BACKEND_OVERHEAD_S * 1e3:.1f} ms "
                                f"per-request overhead)")


# measured (2-core EPYC, convnet64 ONNX FP32 served 2 x 1, perf_analyzer, delays 0/500/2000 us interleaved
# twice at concurrency 4 and 16): delay 0 was best or tied every time, though batch 16 ran 2.3x the
# samples/s of batch 1 in-process; a delay must be earned by a much larger batching gain, and stays small
BATCHING_PAYS = 3.0  # samples/s at the best batch over batch 1 in-process: below this, delay 0
DELAY_SHARE = 0.1  # where it pays, a request waits at most a tenth of a batch-1 inference for company
MAX_QUEUE_DELAY_US = 1000


def size_queue_delay(batch_seconds: float | None, throughput_by_batch: dict[Any, float] | None,
                     overhead_seconds: float = PYTHON_BACKEND_OVERHEAD_S, pays: float = BATCHING_PAYS,
                     share: float = DELAY_SHARE, max_delay_us: int = MAX_QUEUE_DELAY_US) -> tuple[int, str]:
    """(max_queue_delay_microseconds, why) from the in-process benchmark: the batch-1 time and the
    samples/s at each batch size (builder/stages/benchmark.py's ``throughput_by_batch``).

    Delay 0 unless batching pays a lot (the best batch runs at least ``pays`` times the samples/s of
    batch 1) AND the model's batch-1 time is at least the per-request overhead: where the overhead
    outweighs the model, batches form from the requests queued while an instance works, without
    waiting, and a delay only adds latency (500 us doubled digits' latency at concurrency 1; on
    convnet64, 2.3x faster per sample at batch 16, delay 0 still served the most). Where both hold,
    requests wait up to ``share`` of a batch-1 inference (in 50 us steps, at most ``max_delay_us``).
    `triton-builder tune` measures delays on the serving host.
    """
    rates = {int(b): float(r) for b, r in (throughput_by_batch or {}).items() if r}
    if not batch_seconds or 1 not in rates or len(rates) < 2:
        return 0, "delay 0: no in-process throughput at batch 1 and a larger batch to size it from"
    best = max((b for b in rates if b > 1), key=lambda b: rates[b])
    gain = rates[best] / rates[1]
    if gain < pays:
        return 0, (f"delay 0: batching does not pay in-process (batch {best}: {gain:.2f}x the samples/s of batch 1, "
                   f"< {pays:g}x)")
    if batch_seconds < overhead_seconds:  # the in-process time is the model's compute alone
        return 0, (f"delay 0: batching pays (batch {best}: {gain:.1f}x batch 1) but the per-request overhead "
                   f"(~{overhead_seconds * 1e3:.1f} ms) outweighs the model's batch-1 {batch_seconds * 1e3:.3f} ms: "
                   "batches form from queued requests without waiting")
    delay = int(min(max_delay_us, max(50, round(share * batch_seconds * 1e6 / 50) * 50)))
    return delay, (f"delay {delay} us: batching pays (batch {best}: {gain:.1f}x the samples/s of batch 1) and the "
                   f"model's batch-1 {batch_seconds * 1e3:.3f} ms is at least the ~{overhead_seconds * 1e3:.1f} ms "
                   f"per-request overhead: wait up to {share:g} of a batch-1 inference for requests to batch with")


def host_warnings(metadata: dict[str, Any], model: str, current: dict[str, Any] | None = None, *,
                  source: str | Path | None = None, per_process: bool = True) -> list[str]:
    """compare_hosts for a version's metadata.yaml record (``source``: its path, for the warnings) against
    this host (``current`` injectable)."""
    recorded = metadata.get("host") if isinstance(metadata, dict) else metadata
    if current is None:
        gpus = isinstance(recorded, dict) and isinstance(recorded.get("gpus"), list) and bool(recorded["gpus"])
        current = host_profile(with_gpu=gpus)
    return compare_hosts(recorded, current, model=model, source=source, per_process=per_process)
