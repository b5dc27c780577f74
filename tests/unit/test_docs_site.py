"""The docs site: its reference pages are what the code gives (scripts/gen_docs_reference.py), every spec key and
every option of every verb is on them, and `mkdocs build --strict` passes (every link and anchor resolves, every
page is in the nav)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, load_script

GENERATOR = ROOT / "scripts" / "gen_docs_reference.py"


def _generator():
    return load_script(GENERATOR, "gen_docs_reference")


@pytest.fixture(scope="module")
def gen():
    return _generator()


@pytest.mark.parametrize("page", ["cli.md", "spec.md"])
def test_committed_reference_pages_are_what_the_code_gives(gen, page):
    path = ROOT / "docs" / "reference" / page
    assert path.is_file(), f"{path.relative_to(ROOT)} missing: run python scripts/gen_docs_reference.py"
    assert path.read_text(encoding="utf-8") == gen.pages()[path], \
        f"docs/reference/{page} is out of date with the code: run python scripts/gen_docs_reference.py and commit it"


def test_every_cli_option_of_every_verb_is_on_the_cli_page(gen):
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", page, flags=re.M | re.S))
    missing = []
    for verb, parser in gen.verbs().items():
        if verb not in sections:
            missing.append(verb)
            continue
        flags = {f for a in parser._actions if not isinstance(a, argparse._HelpAction) for f in a.option_strings
                 if f.startswith("--") and f not in ("--quiet", "--verbose")}
        missing += [f"{verb} {flag}" for flag in sorted(flags) if f"`{flag}" not in sections[verb]
                    and f", {flag}" not in sections[verb]]
    assert missing == [], f"not on docs/reference/cli.md: {missing}; run python scripts/gen_docs_reference.py"


def test_every_spec_key_is_on_the_spec_page(gen):
    page = (ROOT / "docs" / "reference" / "spec.md").read_text(encoding="utf-8")
    missing = [key for key in gen.spec_keys() if f"| `{key}` |" not in page]
    assert missing == [], f"not on docs/reference/spec.md: {missing}; run python scripts/gen_docs_reference.py"


def test_every_tuple_of_known_spec_keys_is_a_section_of_the_generator(gen):
    assert gen.uncovered_key_tuples() == [], "a new mapping of the spec: add it to sections() in " \
        "scripts/gen_docs_reference.py (and describe its keys in DESCRIPTIONS)"


def test_the_generator_notices_a_missing_key(gen, monkeypatch):
    from builder.spec import model as spec

    monkeypatch.setattr(spec, "_DEPLOY_KEYS", (*spec._DEPLOY_KEYS, "not_a_real_key"))
    with pytest.raises(SystemExit, match="deploy.not_a_real_key"):
        gen.render_spec()


def test_every_page_under_docs_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert [p for p in pages if f": {p}\n" not in nav] == []


def test_mkdocs_build_strict_passes(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs / mkdocstrings are not installed: pip install -c requirements/constraints.txt '.[docs]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    for page in ("index.html", "reference/cli/index.html", "reference/spec/index.html", "reference/api/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "validate_model" in api and "check_served" in api, "mkdocstrings rendered the API page"
    shutil.rmtree(tmp_path / "site")
