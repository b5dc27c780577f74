"""The Python API's errors name its parameters where the shared checks name the CLI's flags
(builder/core/errors.py); the CLI keeps its flags."""

from __future__ import annotations

import pytest

import builder
from builder.core.errors import as_parameters
from builder.core.errors import UserInputError


def test_flags_that_are_parameters_are_written_as_the_parameters_others_are_kept():
    text = "--tie-margin 2: a fraction within 0..1; pass --public-key or set $KEY; --load-seconds stays"
    assert as_parameters(text, {"tie_margin", "public_key"}) == (
        "tie_margin 2: a fraction within 0..1; pass public_key or set $KEY; --load-seconds stays")


def test_a_flag_spelt_unlike_its_parameter_is_mapped_to_it():
    assert as_parameters("--run-time 0: give seconds; --model-version 3", {"run_time_s", "version"}) == (
        "run_time_s 0: give seconds; version 3")
    assert as_parameters("--timeout 5", {"timeout"}) == "timeout 5"  # check's own timeout keeps its name


def test_a_python_caller_of_tune_reads_the_parameter_it_passed(tmp_path):
    with pytest.raises(UserInputError, match=r"^tie_margin 2(\.0)?: a fraction within 0..1") as raised:
        builder.tune("digits_cnn", tmp_path, p99_budget_ms=50, tie_margin=2.0)
    assert "--tie-margin" not in str(raised.value)


def test_the_cli_keeps_its_flags(tmp_path, capsys):
    from builder.cli import main

    assert main(["tune", "digits_cnn", "--repository", str(tmp_path), "--p99-budget-ms", "50",
                 "--tie-margin", "2"]) == 2
    assert "--tie-margin 2" in capsys.readouterr().err
