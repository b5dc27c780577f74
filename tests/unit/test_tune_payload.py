"""The default payload of loadtest, sweep and tune (builder/tuning/payload.py): a reference.npz built the
way build writes it, with validation cases beside generated ones, sends the validation cases alone (the
generated ones hold random values over value_range: sent to a production server they fire its drift
alerts) and says so; without validation cases it sends them all, saying they may move the drift gauges."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from builder.repository.metadata import reference_bytes
from builder.spec.model import parse_spec
from builder.accuracy.tensors import build_cases
from builder.tuning.loadtest import LOADTEST_DIR
from builder.tuning.payload import ModelInterface, default_payload, load_samples, locust_payload, read_npz_samples

SPEC = {"name": "tok", "source": {"module": "model:build"}, "max_batch_size": 16, "outputs": [{"name": "logits"}],
        "inputs": [{"name": "ids", "dtype": "int64", "shape": [-1], "value_range": [0, 100],
                    "min_shape": [2], "opt_shape": [8], "max_shape": [32]},
                   {"name": "mask", "dtype": "bool", "shape": [-1], "min_shape": [2], "opt_shape": [8],
                    "max_shape": [32]}]}
VALIDATION = {"ids": (np.arange(24).reshape(2, 12) % 50).astype(np.int64), "mask": np.ones((2, 12), bool)}
TOK = ModelInterface("tok", [("ids", "INT64", [-1]), ("mask", "BOOL", [-1])], ["logits"], 16, {})


def _repository(tmp_path: Path, validation) -> tuple[Path, Path]:
    """A repository holding tok version 1 with the reference.npz build writes (ids [0, 50) in validation)."""
    cases = build_cases(parse_spec(SPEC, tmp_path / "spec.yaml"), validation)
    outputs = [{"logits": np.zeros((len(next(iter(c["inputs"].values()))), 2), np.float32)} for c in cases]
    version = tmp_path / "repo" / "tok" / "1"
    version.mkdir(parents=True)
    (version.parent / "config.pbtxt").write_text('name: "tok"\n')
    (version / "reference.npz").write_bytes(reference_bytes(cases, outputs))
    return version.parent.parent, version / "reference.npz"


def _locust_reads(path: Path) -> list[dict[str, np.ndarray]]:
    spec = importlib.util.spec_from_file_location("triton_target", LOADTEST_DIR / "triton_target.py")
    target = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(target)
    return target._read_npz(path, ["ids", "mask"], True)


def test_the_validation_cases_alone_are_sent_by_default_and_the_source_says_so(tmp_path):
    repo, reference = _repository(tmp_path, VALIDATION)
    samples, source = load_samples(TOK, repository=repo)  # sweep and tune
    assert source == f"the 3 validation case(s) (its 12 generated case(s) left out) of {reference}"
    assert len(samples) == 1 + 3 + 16  # the rows of val_b1, val_b3, val_b16
    assert all(s["ids"].shape == (1, 12) and s["ids"].max() < 50 for s in samples)

    copy = default_payload(repo, "tok")  # loadtest's: a file Locust reads by itself
    assert copy != reference and copy.parts[-2:] == ("tok-v1-validation-cases", "reference.npz")
    with np.load(copy) as archive:
        assert {key.split("/")[1] for key in archive.files} == {"000_val_b1", "001_val_b3", "002_val_b16"}
    rows = _locust_reads(copy)
    assert len(rows) == len(samples) and all(r["ids"].max() < 50 for r in rows)



def test_locust_reads_the_copy_and_the_summary_names_the_reference(tmp_path):
    repo, reference = _repository(tmp_path, VALIDATION)
    path, source = locust_payload(TOK, None, repo)
    assert path.parts[-2:] == ("tok-v1-validation-cases", "reference.npz")
    assert source == f"the 3 validation case(s) (its 12 generated case(s) left out) of {reference}"
    assert locust_payload(TOK, reference, None) == (reference.resolve(), str(reference.resolve()))
    assert locust_payload(TOK, None, None) == (None, "generated from the model's metadata")

def test_a_payload_given_is_sent_whole(tmp_path):
    _, reference = _repository(tmp_path, VALIDATION)
    samples, source = load_samples(TOK, payload=reference)
    assert source == str(reference)
    assert len(samples) == len(read_npz_samples(reference, ["ids", "mask"], True)) > 20
    assert max(int(s["ids"].max()) for s in samples) >= 50  # the generated rows too


def test_without_validation_cases_all_are_sent_with_the_drift_warning(tmp_path):
    repo, reference = _repository(tmp_path, None)
    samples, source = load_samples(TOK, repository=repo)
    assert source == (f"generated inputs, which may move the server's drift gauges (the build had no validation "
                      f"data; give --payload to send your own): all 12 case(s) of {reference}")
    assert default_payload(repo, "tok") == reference  # nothing to leave out: the file itself


def test_the_copy_goes_when_the_process_ends(tmp_path):
    repo, _ = _repository(tmp_path, VALIDATION)
    code = "import sys; from builder.tuning.payload import default_payload; print(default_payload(sys.argv[1], 'tok'))"
    done = subprocess.run([sys.executable, "-c", code, str(repo)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    copy = Path(done.stdout.strip())
    assert copy.name == "reference.npz" and not copy.parent.parent.exists()


@pytest.mark.parametrize("case, validation", [("000_val_b1", True), ("003_val", True), ("004_gen_b1_dmin", False),
                                              ("005_gen_b0_dskew_hl", False), ("006_validation_x", False)])
def test_validation_case_keys(case, validation):
    from builder.tuning.payload import VALIDATION_CASE

    assert bool(VALIDATION_CASE.match(case)) == validation
