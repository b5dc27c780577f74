"""`make test-fast` (pytest -m "not slow" tests/unit) selects the unit tests that build no model and start no
server: its selection is collected in a subprocess, as the Makefile collects it, and checked here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# the collection, with what the checks need of each test: its marks' reasons and the fixtures it uses
COLLECT = textwrap.dedent("""
    import inspect, json, re, sys
    from pathlib import Path
    import pytest

    ROOT = Path.cwd().resolve()
    BUILDS = re.compile(r"(?<![\\w.])build\\(|\\brun_cli\\(|(?<![\\w.])serve\\(|\\b(?:EmbeddedServer|MlflowServer"
                        r"|LocalPrometheus|MotoS3Server|checked_server|serving_context|_Locust)\\(")

    def source_with_helpers(func):
        # a fixture's source and that of the functions of its own module it calls by name
        try:
            text = inspect.getsource(func)
        except (OSError, TypeError):
            return ""
        module = sys.modules.get(func.__module__)
        for name in set(re.findall(r"\\b(_?\\w+)\\(", text)):
            helper = getattr(module, name, None)
            if inspect.isfunction(helper) and helper is not func and helper.__module__ == func.__module__:
                try:
                    text += inspect.getsource(helper)
                except (OSError, TypeError):
                    pass
        return text

    def conftest_key(fixturedef):
        return f"{Path(fixturedef.func.__code__.co_filename).name}::{fixturedef.argname}"

    class Dump:
        def __init__(self):
            self.deselected, self.building, self.items = [], {}, []

        def pytest_deselected(self, items):
            self.deselected += [item.nodeid for item in items]
            self.scan(items)

        def scan(self, items):
            # the fixtures of tests/ these items use whose code builds or starts a server: {key: a test using it}
            for item in items:
                info = item._fixtureinfo
                for name in item.fixturenames:
                    for fixturedef in info.name2fixturedefs.get(name) or ():
                        path = Path(fixturedef.func.__code__.co_filename)
                        if ROOT / "tests" in path.parents and BUILDS.search(source_with_helpers(fixturedef.func)):
                            self.building.setdefault(conftest_key(fixturedef), item.nodeid)

        def pytest_collection_finish(self, session):
            global conftest
            conftest = next(plugin for plugin in session.config.pluginmanager.get_plugins()
                            if getattr(plugin, "__file__", None) == str(ROOT / "tests" / "conftest.py"))
            self.scan(session.items)
            self.items = []
            for item in session.items:
                self.items.append({"id": item.nodeid, "slow_fixtures": conftest.slow_fixtures_of(item),
                                   "slow": [str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("slow")]})

    conftest = None
    dump = Dump()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", sys.argv[1], "tests/unit"],
                       plugins=[dump])
    registry = sorted(conftest.SLOW_FIXTURES) if conftest else []
    print("@@" + json.dumps({"code": int(code), "selected": dump.items, "deselected": dump.deselected,
                             "building": dump.building, "registry": registry}))
""")


def _marker_expression() -> str:
    """The -m expression of the Makefile's test-fast target."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "the Makefile has no test-fast target"
    found = re.search(r"-m \"([^\"]+)\"", recipe.group(1))
    assert found and "tests/unit" in recipe.group(1), recipe.group(1)
    return found.group(1)


@pytest.fixture(scope="module")
def collected() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    proc = subprocess.run([sys.executable, "-c", COLLECT, _marker_expression()], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)
    line = next((line for line in proc.stdout.splitlines() if line.startswith("@@")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(line[2:])
    assert result["code"] == 0, proc.stdout[-3000:]
    return result


def test_the_fast_target_deselects_slow_tests_only():
    assert _marker_expression() == "not slow"


def test_the_fast_selection_is_most_of_the_unit_suite(collected):
    selected, deselected = collected["selected"], collected["deselected"]
    assert len(selected) >= 500 and len(selected) > 3 * len(deselected), (len(selected), len(deselected))
    assert all(item["id"].startswith("tests/unit/") for item in selected)


def test_no_fast_test_uses_a_fixture_that_builds_or_starts_a_server(collected):
    offenders = {item["id"]: item["slow_fixtures"] for item in collected["selected"]
                 if item["slow_fixtures"] or item["slow"]}
    assert offenders == {}


def test_every_fixture_that_builds_or_starts_a_server_is_registered(collected):
    """A fixture of tests/ whose code builds (build( / run_cli() or starts a server (EmbeddedServer, MLflow,
    Prometheus, moto's S3 server, Locust) leaves the fast loop only when tests/conftest.py's SLOW_FIXTURES
    names it: it must be there."""
    missing = {key: used_by for key, used_by in collected["building"].items() if key not in collected["registry"]}
    assert missing == {}, "add these fixtures to SLOW_FIXTURES in tests/conftest.py, with a reason"


def test_every_registered_fixture_exists_and_is_recognised(collected):
    """SLOW_FIXTURES names no fixture gone or renamed, and the scan above recognises each of them (it works)."""
    assert sorted(set(collected["registry"]) - set(collected["building"])) == []


@pytest.mark.parametrize("nodeid", [
    "tests/unit/test_cli.py::test_validate_json_for_ci_pipelines",                 # built_repository (session)
    "tests/unit/test_variants.py::test_default_variants_on_cpu_targets",           # a module fixture that builds
    "tests/unit/test_lifecycle_guards.py::test_register_attaches_the_versions_own_config_once",  # MLflow server
    "tests/unit/test_cli.py::test_quiet_build_prints_results_but_no_progress",     # marked: a CLI build
])
def test_known_slow_tests_are_left_out(collected, nodeid):
    assert nodeid in collected["deselected"]
    assert nodeid not in {item["id"] for item in collected["selected"]}


@pytest.mark.parametrize("nodeid", [
    "tests/unit/test_cli.py::test_version_flag",
    "tests/unit/test_fast_selection.py::test_no_fast_test_uses_a_fixture_that_builds_or_starts_a_server",
])
def test_known_fast_tests_are_kept(collected, nodeid):
    assert nodeid in {item["id"] for item in collected["selected"]}
