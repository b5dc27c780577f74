"""Every option a verb's --help lists is documented in prose (README.md, the docs site's hand-written pages under
docs/, or the READMEs beside the code it drives): a flag only --help knows is one a user reading the docs never
finds. docs/reference/cli.md is left out: it is generated from --help itself (tests/unit/test_docs_site.py)."""

from __future__ import annotations

import argparse

import pytest

from tests.conftest import ROOT

DOCS = ["README.md", "loadtest/README.md", "monitoring/README.md", "examples/README.md",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
GENERATED = {"docs/reference/cli.md", "docs/reference/spec.md"}  # written from the parser: not evidence of prose
ALWAYS = {"--help", "-h", "-q", "-v", "--quiet", "--verbose"}  # the common ones, documented once for every verb


def _verbs() -> dict[str, argparse.ArgumentParser]:
    from builder.cli import make_parser

    parser = make_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subparsers.choices)


@pytest.mark.parametrize("verb", sorted(_verbs()))
def test_every_flag_of_the_verb_is_documented(verb):
    docs = "\n".join((ROOT / name).read_text() for name in DOCS if name not in GENERATED and (ROOT / name).is_file())
    flags = {flag for action in _verbs()[verb]._actions for flag in action.option_strings if flag.startswith("--")}
    undocumented = sorted(f for f in flags - ALWAYS if f not in docs)
    assert not undocumented, f"triton-builder {verb}: {', '.join(undocumented)} appear only in --help"
