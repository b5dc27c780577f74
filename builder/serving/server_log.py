"""Reading tritonserver's log: drop what is expected without a GPU, make Triton's quoted messages
readable, and pick the lines that explain a failure.

Usage::

    tail = meaningful_tail(log_text, 20)            # indented, GPU-less noise and tables dropped
    errors = startup_error_lines(log_text)          # E... / error lines, else the tail
    lines = model_log_lines(log_text, "resnet")     # lines about a model that say it failed
    crash = crash_lines(log_text)                   # "while loading: m:1:\n  terminate called ..." or ""
    crash_marks(log_text)                           # ["malloc_consolidate(): ...", "Signal (6) received."]
    describe_exit(-9)                               # "exited with code -9 (killed by SIGKILL)"
"""

from __future__ import annotations

import re
import signal

__all__ = ["is_noise", "readable", "describe_exit", "meaningful_tail", "startup_error_lines", "model_log_lines",
           "crash_lines", "crash_marks"]

# Expected on machines without a GPU; never the reason anything failed.
_NOISE = ("NVML", "DCGM", "CudaDriverHelper", "pinned memory", "pinned_memory")


def is_noise(line: str) -> bool:
    stripped = line.strip()
    if not stripped or stripped[0] in "+|" or any(word in line for word in _NOISE):
        return True
    return stripped.endswith("]") and stripped[0] in "IW"  # a header line whose table was dropped


def readable(line: str) -> str:
    """Triton quotes messages with literal ``\\n``; show them as indented lines."""
    parts = [part.rstrip() for part in line.replace("\\n", "\n").splitlines() if part.strip()]
    return "\n    ".join(parts)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"exited with code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"exited with code {code}"
    return f"exited with code {code}"


def meaningful_tail(text: str, lines: int = 20) -> str:
    """The last ``lines`` meaningful log lines (GPU-less noise and tables dropped), indented."""
    kept = [readable(line) for line in text.splitlines() if not is_noise(line)]
    return "\n".join("  " + line for line in kept[-lines:]) or "  (log is empty)"


def model_log_lines(text: str, name: str) -> list[str]:
    """Log lines about model ``name`` that say it failed."""
    found = []
    for line in text.splitlines():
        if is_noise(line):
            continue
        about = f"'{name}'" in line or f"/{name}/" in line
        if about and ("fail" in line.lower() or "error" in line.lower()):
            found.append(readable(line))
    return found


#: an uncaught C++ exception (e.g. a python-backend stub given wrong arguments): tritonserver goes on
#: waiting for the dead process and never becomes live
_CRASH_MARK = "terminate called after throwing"


def crash_lines(text: str) -> str:
    """``"while loading: M:1:\\n  terminate called ...\\n    what(): ..."`` if a process crashed, else ``""``."""
    if _CRASH_MARK not in text:
        return ""
    lines = text.splitlines()
    crashed = [line.strip() for line in lines if _CRASH_MARK in line or "what():" in line]
    loading = [line.split('"')[1] for line in lines if '"loading: ' in line and line.count('"') >= 2]
    return (f"while {loading[-1]}" if loading else "while starting") + ":\n" + \
        "\n".join("  " + line for line in crashed[-4:])


#: Triton's handler of a fatal signal prints this (then a backtrace); every stop prints it for SIGTERM too
_SIGNAL_LINE = re.compile(r"^Signal \((\d+)\) received")
_STOP_SIGNALS = {int(signal.SIGINT), int(signal.SIGTERM)}
_TRITON_LINE = re.compile(r"^[IWEV]\d{4} ")  # "I1125 04:31:00.791412 13813 file.cc:624] ..."


def crash_marks(text: str) -> list[str]:
    """The lines of ``text`` saying a process crashed (the last 6): Triton's "Signal (6) received."
    for a fatal signal, with the line before it when that is no Triton log line (glibc's reason, as
    "malloc_consolidate(): unaligned fastbin chunk detected"), and an uncaught C++ exception's
    "terminate called ..." / "what(): ..." lines. A crashed server may hang instead of exiting."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        signalled = _SIGNAL_LINE.match(line)
        if signalled and int(signalled.group(1)) not in _STOP_SIGNALS:
            before = lines[i - 1].strip() if i else ""
            if before and not _TRITON_LINE.match(before) and not is_noise(before) and before not in found:
                found.append(before)
            found.append(line.strip())
        elif _CRASH_MARK in line or line.strip().startswith("what():"):
            found.append(line.strip())
    return found[-6:]


def startup_error_lines(text: str) -> str:
    """The error lines of a failed start (the last 15), else the meaningful tail."""
    errors = [readable(l) for l in text.splitlines() if not is_noise(l) and (l.startswith("E") or l.lower().startswith("error"))]
    if errors:
        return "\n".join("  " + line for line in errors[-15:])
    return meaningful_tail(text)


def real_paths(text: str, link, repository) -> str:
    """``text`` with the repository's symlink (a path the stub can take) replaced by the real folder;
    our own "# triton-builder:" lines keep the link: they say what was run, and which folder it is."""
    return "\n".join(line if line.startswith("# triton-builder") else line.replace(str(link), str(repository))
                     for line in text.split("\n"))
