"""The CLI keeps third-party libraries from writing into HOME or warning under -q: onnxruntime's
telemetry queue (ORT_DISABLE_TELEMETRY) and matplotlib's cache in an unwritable HOME."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SESSION = textwrap.dedent("""
    import sys
    if sys.argv[1] == "quiet":
        from builder.cli import quiet_environment
        quiet_environment()
    import onnx, onnxruntime
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
""")


def _env(home: Path, tmp: Path, **more: str) -> dict[str, str]:
    # CI=true switches onnxruntime's telemetry off by itself: the control run must look like a user's shell
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORT_DISABLE_TELEMETRY", "MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "CI")}
    return {**env, "HOME": str(home), "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT), **more}


def test_onnxruntime_writes_no_telemetry_into_home(tmp_path):
    for mode in ("plain", "quiet"):
        home = tmp_path / mode
        home.mkdir()
        subprocess.run([sys.executable, "-c", SESSION, mode], env=_env(home, tmp_path), check=True, timeout=120,
                       capture_output=True)
    # the control shows what the CLI prevents (onnxruntime 1.31's 1DS device id and event queue)
    assert (tmp_path / "plain" / ".cache" / "Microsoft").is_dir()
    assert list((tmp_path / "quiet").rglob("*")) == []


def test_the_cli_sets_the_telemetry_switch_and_keeps_the_users_own(monkeypatch):
    from builder.cli import quiet_environment

    monkeypatch.setenv("MPLCONFIGDIR", os.environ.get("MPLCONFIGDIR", "unchanged"))  # restored after the test
    monkeypatch.setenv("ORT_DISABLE_TELEMETRY", "")
    monkeypatch.delenv("ORT_DISABLE_TELEMETRY")
    quiet_environment()
    assert os.environ["ORT_DISABLE_TELEMETRY"] == "1"
    monkeypatch.setenv("ORT_DISABLE_TELEMETRY", "0")
    quiet_environment()
    assert os.environ["ORT_DISABLE_TELEMETRY"] == "0"


def test_matplotlib_in_an_unwritable_home_is_quiet(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where HOME's parent should be: nothing can be created below it (even as root)")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = ("from builder.cli import quiet_environment; quiet_environment(); import matplotlib; "
            "matplotlib.use('Agg'); import matplotlib.pyplot as plt; plt.figure(); import os; "
            "print(os.environ['MPLCONFIGDIR'])")
    done = subprocess.run([sys.executable, "-c", code], env=_env(blocked / "home", tmp), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    private = Path(done.stdout.strip())
    assert private.parent == tmp and private.is_dir() and (private.stat().st_mode & 0o077) == 0
