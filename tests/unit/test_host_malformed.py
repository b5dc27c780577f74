"""A damaged or hand-edited ``host`` record in metadata.yaml (metadata.yaml is not hashed): one warning
naming the file and the field, never a traceback, and validate/serve/check go on (builder/core/host.py)."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from builder.core.host import compare_hosts, host_warnings

HERE = {"cpu_model": "AMD EPYC 9B14", "isa_flags": ["avx2", "avx512_vnni", "avx512f"], "isa_class": "avx512_vnni",
        "usable_cores": 2}
FIX = r": rebuild, or run `triton-builder select m` here to record this host \(the host profile is ignored"


@pytest.mark.parametrize("host, problem", [
    ("x", r"host is not a mapping \(it is str 'x'\)"),
    ([], r"host is not a mapping \(it is list '\[\]'\)"),
    ({**HERE, "isa_flags": "avx2"}, r"host\.isa_flags is not a list \(it is str 'avx2'\)"),
    ({**HERE, "isa_flags": ["avx2", 3]}, r"host\.isa_flags is not a list of flag names"),
    ({**HERE, "usable_cores": "2"}, r"host\.usable_cores is not a whole number \(it is str '2'\)"),
    ({**HERE, "usable_cores": True}, r"host\.usable_cores is not a whole number"),
    ({**HERE, "usable_cores": 0}, r"host\.usable_cores is 0, below 1"),
    ({**HERE, "isa_class": None}, r"host\.isa_class is not a string"),
    ({k: v for k, v in HERE.items() if k != "cpu_model"}, r"host\.cpu_model is missing"),
    ({**HERE, "gpus": "H100"}, r"host\.gpus is not a list of mappings"),
])
def test_each_malformed_record_is_one_warning_naming_the_file_and_the_field(host, problem):
    [line] = host_warnings({"host": host}, "m", dict(HERE), source="repo/m/1/metadata.yaml")
    assert re.match("m: repo/m/1/metadata.yaml: " + problem, line), line
    assert re.search(FIX, line), line


def test_without_a_source_the_warning_still_names_metadata_yaml():
    [line] = compare_hosts({**HERE, "usable_cores": "2"}, dict(HERE), model="m")
    assert line.startswith("m: metadata.yaml: host.usable_cores is not a whole number")


def test_a_sound_record_still_compares_and_an_absent_one_says_so():
    assert host_warnings({"host": HERE}, "m", dict(HERE)) == []
    assert host_warnings({"host": {**HERE, "gpus": [{"name": "H100"}]}}, "m", dict(HERE))[0].endswith(
        "(`triton-builder validate --gpu` checks a plan's compatibility)")
    for absent in ({}, {"host": None}, {"host": {}}):
        assert "records no host profile" in host_warnings(absent, "m", dict(HERE))[0]


def test_a_metadata_that_is_not_a_mapping_is_a_warning_too():
    [line] = host_warnings("text", "m", dict(HERE), source="x/metadata.yaml")  # type: ignore[arg-type]
    assert "x/metadata.yaml: host is not a mapping" in line


def test_validate_and_serve_warn_and_go_on(built_repository, tmp_path):
    from builder.repository.validate import validate_model
    from builder.serving.serve import served_host_warnings

    copy = tmp_path / "repo" / "digits_cnn"
    shutil.copytree(built_repository / "digits_cnn", copy)
    meta_path = copy / "1" / "metadata.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    meta["host"] = {**meta["host"], "isa_flags": "avx2"}  # metadata.yaml is not among the hashed files
    meta_path.write_text(yaml.safe_dump(meta))
    report = validate_model(copy, current_host=dict(HERE))
    assert report.ok
    [line] = report.host_warnings
    assert f"{meta_path}: host.isa_flags is not a list" in line
    [line] = served_host_warnings(tmp_path / "repo", ["digits_cnn"], dict(HERE))
    assert "host.isa_flags is not a list" in line
