"""Is a TensorRT plan usable where it is about to be deployed? A plan (TensorRT engine) only loads on
the GPU architecture and the TensorRT version it was built with; served elsewhere, Triton fails with
"engine plan file is generated on an incompatible device" (or a serialization version error).

The rule checked here, against the record every plan carries in its metadata.yaml (key
``tensorrt``: gpu_name, compute_capability, tensorrt_version, profiles, precision):

- **compute capability**: the target GPU's must equal the recorded one (e.g. 9.0 = H100/H200,
  8.9 = L4/L40, 8.6 = A10/RTX 30xx, 8.0 = A100). A different GPU *model* with the same compute
  capability is accepted and named in the report (TensorRT allows it, with possibly other timings).
- **TensorRT version**: same major.minor (10.5.0 and 10.5.1 match, 10.5 and 10.6 do not). TensorRT's
  "version-compatible" engines are not recognised: they are built and checked like any other plan.

The target comes from, in this order: the arguments (``triton-builder validate --gpu 9.0
--tensorrt-version 10.5.0``), else this machine (nvidia-smi for the GPU; trtexec or the ``tensorrt``
Python package for the TensorRT version). When neither gives a value, that part is NOT silently
passed: it is a failure that says what could not be checked and how to supply it.

This module uses the standard library only: ``builder.tensorrt.plan_build`` imports it inside the
NGC Triton image, where only python3 is available.

Usage::

    failures = plan_compatibility_failures(meta, gpu="9.0", tensorrt_version="10.5.0")
    result = check_plan_compatibility(meta, gpu="9.0", tensorrt_version="10.5.0")
    result.failures, result.checked     # problems; what was compared with what (for the report)
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import UserInputError
from builder.core.processes import TimeoutExpired, run_command

REBUILD_HINT = "rebuild the plan on the target: docker compose --profile plans run --rm build-plans"
TRTEXEC_DEFAULT = "/usr/src/tensorrt/bin/trtexec"  # where the NGC images keep it
NVIDIA_SMI_QUERY = ["--query-gpu=index,uuid,compute_cap,name", "--format=csv,noheader"]
_AUTO: Any = object()  # "detect on this machine"


# --------------------------------------------------------------------------------------------
# parsing


def parse_compute_capability(text: str) -> tuple[int, int]:
    """'9.0', '8.6', 'sm_90', 'sm86', '90', '120' -> (major, minor). Raises UserInputError otherwise."""
    value = str(text).strip().lower()
    match = re.fullmatch(r"(\d{1,2})\.(\d)", value)
    if match:
        return int(match.group(1)), int(match.group(2))
    match = re.fullmatch(r"(?:sm_?)?(\d{2,3})", value)
    if match:
        digits = match.group(1)
        return int(digits[:-1]), int(digits[-1])
    raise UserInputError(
        f"--gpu {text!r}: give the target GPU's compute capability as X.Y, e.g. 9.0 (H100/H200), "
        "8.9 (L4/L40), 8.6 (A10, RTX 30xx), 8.0 (A100); `nvidia-smi --query-gpu=compute_cap --format=csv` "
        "prints it on the target")


def format_compute_capability(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def parse_tensorrt_version(text: str) -> tuple[int, ...]:
    """'10.5.0', '10.5.0.18', '10.5', '8.6.1' -> a tuple of ints. Raises UserInputError otherwise."""
    value = str(text).strip().lstrip("vV")
    if not re.fullmatch(r"\d+(\.\d+){1,3}", value):
        raise UserInputError(f"--tensorrt-version {text!r}: give a version such as 10.5.0 (at least major.minor)")
    return tuple(int(part) for part in value.split("."))


def format_version(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def tensorrt_versions_compatible(built: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """The rule: same major.minor."""
    return tuple(built[:2]) == tuple(target[:2])


def tensorrt_version_from_log(text: str) -> str | None:
    """The TensorRT version trtexec reports: its 'TensorRT version: 10.5.0' line, else the banner
    '&&&& RUNNING TensorRT.trtexec [TensorRT v100500]' (v8601 = 8.6.1; v100500 = 10.5.0)."""
    match = re.search(r"TensorRT version:\s*(\d+(?:\.\d+){1,3})", text)
    if match:
        return match.group(1)
    match = re.search(r"\[TensorRT v(\d+(?:\.\d+){1,3})\]", text)
    if match:
        return match.group(1)
    match = re.search(r"\[TensorRT v(\d{4,6})\]", text)
    if not match:
        return None
    number = int(match.group(1))
    if number >= 10000:  # TensorRT 10+: major * 10000 + minor * 100 + patch
        return f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    return f"{number // 1000}.{number // 100 % 10}.{number % 100}"  # TensorRT 8/9: major * 1000 + ...


def parse_nvidia_smi(text: str) -> list[dict[str, str]]:
    """Rows of ``nvidia-smi --query-gpu=index,uuid,compute_cap,name --format=csv,noheader``."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) != 4 or not re.fullmatch(r"\d+\.\d+", parts[2]):
            raise ValueError(f"unexpected nvidia-smi line {line.strip()!r} (the driver may be too old to report "
                             "compute_cap: R510 or newer is needed)")
        gpus.append({"index": parts[0], "uuid": parts[1], "compute_capability": parts[2], "name": parts[3]})
    return gpus


# --------------------------------------------------------------------------------------------
# this machine


def query_gpus(nvidia_smi: str | None = None) -> tuple[list[dict[str, str]] | None, str]:
    """(GPUs from nvidia-smi, "") or (None, why there is no answer)."""
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi not found"
    try:
        done = run_command([exe, *NVIDIA_SMI_QUERY], timeout=60)
    except (OSError, TimeoutExpired) as exc:
        return None, f"nvidia-smi did not run: {exc}"
    if done.returncode != 0:
        detail = " ".join((done.stderr or done.stdout).split())[:200]
        return None, f"nvidia-smi failed (exit {done.returncode}): {detail}"
    try:
        gpus = parse_nvidia_smi(done.stdout)
    except ValueError as exc:
        return None, str(exc)
    if not gpus:
        return None, "nvidia-smi lists no GPU"
    return gpus, ""


def find_trtexec() -> str | None:
    """$TRTEXEC, else trtexec on PATH, else the NGC location."""
    explicit = os.environ.get("TRTEXEC")
    if explicit:
        return explicit
    found = shutil.which("trtexec")
    if found:
        return found
    return TRTEXEC_DEFAULT if os.access(TRTEXEC_DEFAULT, os.X_OK) else None


def probe_trtexec_version(trtexec: str) -> str | None:
    """The TensorRT version of a trtexec binary, from the banner of ``trtexec --help``."""
    try:
        done = run_command([trtexec, "--help"], timeout=60)
    except (OSError, TimeoutExpired):
        return None
    return tensorrt_version_from_log((done.stdout or "") + (done.stderr or ""))


def local_tensorrt_version() -> tuple[str | None, str]:
    """(version, where it came from) or (None, why not found)."""
    trtexec = find_trtexec()
    if trtexec:
        version = probe_trtexec_version(trtexec)
        if version:
            return version, f"this machine's trtexec ({trtexec})"
    from importlib import metadata
    for package in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt-cu11"):
        try:
            return metadata.version(package), f"this machine's Python package {package}"
        except metadata.PackageNotFoundError:
            continue
    return None, "no trtexec and no tensorrt Python package here"


# --------------------------------------------------------------------------------------------
# the check


@dataclass
class CompatibilityResult:
    failures: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # "compute capability 9.0 == 9.0 (--gpu)", ...

    @property
    def ok(self) -> bool:
        return not self.failures


def check_plan_compatibility(meta: dict[str, Any], gpu: str | None = None, tensorrt_version: str | None = None, *,
                             local_gpus: Any = _AUTO, local_tensorrt: Any = _AUTO) -> CompatibilityResult:
    """Compare the plan's record with the target. ``local_gpus`` / ``local_tensorrt`` default to
    detecting this machine; pass a value (or None for "nothing here") to decide it yourself."""
    result = CompatibilityResult()
    record = meta.get("tensorrt") or {}
    filename = (meta.get("artifact") or {}).get("file", "model.plan")
    if not record.get("compute_capability") or not record.get("tensorrt_version"):
        result.failures.append(
            f"{filename}: metadata.yaml has no TensorRT compatibility record (tensorrt.compute_capability, "
            f"tensorrt.tensorrt_version), so nothing says where this plan can run; {REBUILD_HINT}")
        return result
    built_cc = parse_compute_capability(record["compute_capability"])
    built_gpu = f"compute capability {format_compute_capability(built_cc)} ({record.get('gpu_name') or 'GPU name not recorded'})"
    built_trt = parse_tensorrt_version(record["tensorrt_version"])

    # --- the GPU
    if gpu is not None:
        targets = [(parse_compute_capability(gpu), None, f"--gpu {gpu}")]
    else:
        if local_gpus is _AUTO:
            local_gpus, why = query_gpus()
        else:
            why = "no GPU here"
        if local_gpus:
            targets = [(parse_compute_capability(g["compute_capability"]), g.get("name"),
                        f"this machine's GPU {g.get('index', '?')} (nvidia-smi)") for g in local_gpus]
        else:
            targets = []
            result.failures.append(
                f"cannot check {filename} against the target GPU: no target GPU given (--gpu X.Y, e.g. --gpu 9.0) "
                f"and no GPU here ({why}); the plan was built for {built_gpu}")
    for cc, name, source in targets:
        if cc != built_cc:
            result.failures.append(
                f"{filename} was built for {built_gpu} but the target GPU has compute capability "
                f"{format_compute_capability(cc)}{f' ({name})' if name else ''} [{source}]: TensorRT engines only run on "
                f"the GPU architecture they were built for; {REBUILD_HINT}")
        else:
            same_model = not name or not record.get("gpu_name") or name == record.get("gpu_name")
            result.checked.append(
                f"compute capability {format_compute_capability(cc)} matches [{source}]"
                + ("" if same_model else f" (built on {record.get('gpu_name')}, target is {name}: same architecture, "
                                         "timings may differ)"))

    # --- TensorRT
    if tensorrt_version is not None:
        target_trt, source = parse_tensorrt_version(tensorrt_version), f"--tensorrt-version {tensorrt_version}"
    else:
        if local_tensorrt is _AUTO:
            found, source = local_tensorrt_version()
        else:
            found, source = local_tensorrt, "this machine"
        target_trt = parse_tensorrt_version(found) if found else None
        if target_trt is None:
            result.failures.append(
                f"cannot check {filename} against the target TensorRT: no target version given (--tensorrt-version, "
                f"e.g. --tensorrt-version 10.5.0: the TensorRT in the serving Triton image) and none here "
                f"({source if local_tensorrt is _AUTO else 'no TensorRT here'}); the plan was built with TensorRT "
                f"{format_version(built_trt)}")
    if target_trt is not None:
        if tensorrt_versions_compatible(built_trt, target_trt):
            result.checked.append(f"TensorRT {format_version(target_trt)} has the plan's major.minor "
                                  f"{format_version(built_trt[:2])} [{source}]")
        else:
            result.failures.append(
                f"{filename} was built with TensorRT {format_version(built_trt)} but the target has TensorRT "
                f"{format_version(target_trt)} [{source}]: a plan loads only in the same TensorRT major.minor "
                f"({format_version(built_trt[:2])}); {REBUILD_HINT}")
    return result


def plan_compatibility_failures(meta: dict[str, Any], gpu: str | None = None, tensorrt_version: str | None = None,
                                **detect: Any) -> list[str]:
    """One line per problem (empty: compatible). See check_plan_compatibility."""
    return check_plan_compatibility(meta, gpu=gpu, tensorrt_version=tensorrt_version, **detect).failures
