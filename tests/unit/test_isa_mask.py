"""benchmarks/as_avx2_only.sh: a process started through it sees an AVX2-only CPU - in /proc/cpuinfo, in the
CPUID instruction (threads included), and so in what PyTorch and OpenVINO dispatch. Where the host cannot hide
ISA (no CPUID faulting, no user namespaces, no compiler) the script must refuse with a reason."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "as_avx2_only.sh"
HIDDEN = ("avx512", "amx", "avx_vnni")

PROBE = r'''
import re, threading, torch, openvino as ov
from pathlib import Path
flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")).split()
print("FLAGS", " ".join(f for f in flags if re.match(r"avx|amx", f)))
print("TORCH", torch.backends.cpu.get_cpu_capability())
seen = []
threading.Thread(target=lambda: seen.append(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))).start()
import time; time.sleep(0.1)
while not seen: time.sleep(0.05)
print("OPENVINO", " ".join(seen[0]))
'''


def _can_hide() -> str | None:
    if "cpuid_fault" not in Path("/proc/cpuinfo").read_text():
        return "no CPUID faulting on this CPU or kernel"
    if shutil.which("gcc") is None:
        return "no gcc"
    if subprocess.run(["unshare", "--map-root-user", "--mount", "true"], capture_output=True).returncode:
        return "no user namespaces"
    return None


def test_a_process_started_through_it_sees_an_avx2_only_cpu(tmp_path):
    why = _can_hide()
    if why:
        with pytest.raises(subprocess.CalledProcessError):
            subprocess.run([str(SCRIPT), "true"], check=True, capture_output=True)
        pytest.skip(f"cannot hide ISA here ({why}): the script refuses, checked above")
    out = subprocess.run([str(SCRIPT), str(ROOT / ".venv" / "bin" / "python"), "-c", PROBE], check=True,
                         capture_output=True, text=True, env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
                         timeout=300).stdout
    said = dict(line.split(" ", 1) for line in out.splitlines() if line.split(" ", 1)[0] in
                ("FLAGS", "TORCH", "OPENVINO"))
    assert "avx2" in said["FLAGS"].split() and not any(f.startswith(HIDDEN) for f in said["FLAGS"].split())
    assert said["TORCH"] == "AVX2"
    assert not {"BF16", "FP16"} & set(said["OPENVINO"].split()) and "FP32" in said["OPENVINO"].split()


def test_without_a_command_it_says_how_to_use_it():
    if _can_hide():
        pytest.skip("cannot hide ISA here")
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage: " in done.stderr and "COMMAND [ARG...] | --check" in done.stderr
