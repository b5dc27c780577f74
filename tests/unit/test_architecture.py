"""The house rules on builder/ (scripts/check-architecture.py; ../shared/ARCHITECTURE.md), and the
checker itself on a small made-up package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-architecture.py"


def _checker():
    return load_script(SCRIPT, "check_architecture")


checker = _checker()



@pytest.mark.parametrize("rule", checker.RULES)
def test_house_rule(rule):
    problems = checker.check(ROOT, {rule})[rule]
    assert not problems, f"{rule}:\n" + "\n".join(problems)


def test_the_script_runs_and_prints_every_rule():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    for rule in checker.RULES:
        assert f"{rule}: " in done.stdout


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_finds_what_it_should_on_a_made_up_package(tmp_path):
    root = _write(tmp_path, {
        "builder/__init__.py": "",
        "builder/a.py": "from builder import b\n",
        "builder/b.py": "import builder.a\n",
        "builder/c.py": "def f():\n    from builder import d\n",  # inside a function: a circle all the same
        "builder/d.py": "from builder.c import f\nimport subprocess\nsubprocess.run(['true'])\n",
        "builder/e.py": "def g():\n    import builder.a  # deferred: a heavy import, said so\n",
        "builder/core/low.py": "from builder.spec import x\n",
        "builder/core/ok.py": "from builder.core.processes import y\n",
        "builder/optimise/tool.py": "from builder.core.ok import y\nfrom builder.a import z\n",
        "builder/api.py": "",
        "builder/spec.py": "def h():\n    import builder.api  # deferred: no reason that holds, but said\n",
        "builder/pipeline.py": "from builder.stages import one\n",
        "builder/report.py": "from builder.stages.one import x\nfrom builder.stages.common import y\n",
        "builder/core/processes.py": "import subprocess\nsubprocess.Popen(['true'])\n",
        "builder/stages/__init__.py": "from builder.stages import one, two\n",
        "builder/stages/base.py": "",
        "builder/stages/common.py": "",
        "builder/stages/one.py": "from builder.stages.base import x\nfrom builder.stages.common import y\n",
        "builder/stages/two.py": "def g():\n    from builder.stages import one\n",
        "builder/big.py": "x = 1\n" * 501,
        "builder/assets_old.py": "from pathlib import Path\nP = Path(__file__).resolve().parents[1]\n",
        "builder/talk.py": "import tritonclient.http\n",
        "builder/schema.py": "from tritonclient.grpc import model_config_pb2\n",
    })
    found = checker.check(root)
    assert found["cycles"] == ["import circle: builder.a <-> builder.b", "import circle: builder.c <-> builder.d"]
    assert found["deferred"] == ["builder/c.py:2: a builder import inside a function without a '# deferred: <why>' "
                                 "comment (move it to the top of the module)",
                                 "builder/stages/two.py:2: a builder import inside a function without a "
                                 "'# deferred: <why>' comment (move it to the top of the module)"]
    assert found["floors"] == [
        "builder/core/low.py: imports builder.spec (builder.core stands below it: it may import only builder.core)",
        "builder/optimise/tool.py: imports builder.a (builder.optimise stands below it: it may import only "
        "builder.optimise, builder.core)",
        "builder/report.py: imports builder.stages.one (a stage: only builder/pipeline.py runs stages; "
        "shared pieces go to a folder below)",
        "builder/spec.py: imports builder.api (an entry module: only the entry floor (api, cli, main_job, pipeline) "
        "imports it)"]
    assert found["stages"] == ["builder/stages/two.py: imports builder.stages.one "
                               "(shared helpers go to builder/stages/common.py)"]
    assert found["subprocess"] == ["builder/d.py:3: subprocess.run (processes start in builder.core.processes)"]
    assert found["size"] == ["builder/big.py: 501 lines (max 500)"]
    assert [p.split(":")[0] for p in found["parents"]] == ["builder/assets_old.py"]
    assert [p.split(":")[0] for p in found["tritonclient"]] == ["builder/talk.py"]
