"""`tune` also searches intra-op threads per instance (builder/tuning/search.py, tune.py): which thread
counts it tries (from injected usable cores), how a candidate writes them into the config, and that the
staged search carries the best thread count on - with injected throughputs, no server."""

from __future__ import annotations

import pytest

from builder.errors import UserInputError
from builder.tuning.search import Candidate, Search
from builder.tuning.tune import _thread_counts

PYTHON_BASE = {"name": "m", "backend": "python", "max_batch_size": 8,
               "parameters": {"intra_op_threads": {"string_value": "1"}},
               "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}


def test_thread_counts_follow_the_usable_cores():
    assert _thread_counts(PYTHON_BASE, None, usable_cores=2) == [2]
    assert _thread_counts(PYTHON_BASE, None, usable_cores=8) == [2, 4, 8]
    assert _thread_counts(PYTHON_BASE, None, usable_cores=1) == []
    assert _thread_counts(PYTHON_BASE, [1, 3], usable_cores=2) == [1, 3]
    assert _thread_counts({"backend": "onnxruntime"}, None, usable_cores=8) == []
    with pytest.raises(UserInputError, match="--threads: this model's config has no intra_op_threads"):
        _thread_counts({"backend": "onnxruntime"}, [2], usable_cores=8)


def test_a_thread_candidate_sets_intra_op_threads():
    config = Candidate("2 x 2", True, 0, 2, 8, threads=2).config(PYTHON_BASE)
    assert config["parameters"]["intra_op_threads"] == {"string_value": "2"}
    assert config["instance_group"][0]["count"] == 2
    assert PYTHON_BASE["parameters"]["intra_op_threads"] == {"string_value": "1"}  # the base is left alone
    assert Candidate("as built", True, 0, 1, 8).config(PYTHON_BASE)["parameters"]["intra_op_threads"] == \
        {"string_value": "1"}


class InjectedSearch(Search):
    """The staged search with throughputs given per (instances, threads): no server."""

    def __init__(self, throughput):
        self.throughput, self.order, self.measured, self.max_candidates = throughput, [], {}, 20

    def measure(self, candidate, confirm_round=False):
        if candidate.key in self.measured:
            return self.measured[candidate.key]
        rps = self.throughput.get((candidate.instances, candidate.threads or 1), 100.0)
        rps += 1.0 if candidate.delay_us else 0.0  # a delay helps a little, whatever the threads
        candidate.best = {"throughput_rps": rps, "p99_ms": 1.0}
        self.measured[candidate.key] = candidate
        self.order.append(candidate)
        return candidate


@pytest.mark.parametrize("throughput, instances, threads", [
    ({(1, 1): 228.0, (2, 1): 400.0, (2, 2): 380.0}, 2, 0),   # overhead-bound: instances win, threads as built
    ({(1, 1): 100.0, (2, 1): 150.0, (2, 2): 290.0}, 2, 2),   # compute-bound: threads win on top of instances
])
def test_search_tries_threads_with_the_best_instance_count_and_keeps_the_winner(throughput, instances, threads):
    search = InjectedSearch(throughput)
    search.candidates(8, [1, 2], [100], [], thread_counts=[2])
    tried = [(c.instances, c.threads) for c in search.order]
    assert (2, 2) in tried
    last = search.order[-1]  # the delay candidate, built from the best so far
    assert last.delay_us == 100 and (last.instances, last.threads) == (instances, threads)


def test_tune_publish_makes_the_tuned_config_a_new_version(built_repository, tmp_path):
    import json
    import shutil

    import yaml

    from builder.errors import BuilderError
    from builder.repository.config import config_as_dict
    from builder.repository.reselect import publish_tuned
    from builder.repository.tuned import config_text_from_dict
    from builder.repository.validate import validate_model

    repo = tmp_path / "repo"
    shutil.copytree(built_repository / "digits_cnn", repo / "digits_cnn")
    base = config_as_dict((repo / "digits_cnn" / "config.pbtxt").read_text())
    text = config_text_from_dict(Candidate("2 x 2", True, 100, 2, base["max_batch_size"], threads=2).config(base))
    published = publish_tuned(repo, "digits_cnn", text, {"winner": "2 x 2", "throughput_rps": 400.0})
    assert published["version"] == 2
    served = config_as_dict((repo / "digits_cnn" / "config.pbtxt").read_text())
    assert served["instance_group"][0]["count"] == 2
    assert served["parameters"]["intra_op_threads"] == {"string_value": "2"}
    meta = yaml.safe_load((repo / "digits_cnn" / "2" / "metadata.yaml").read_text())
    assert meta["serving"]["instances"] == 2 and meta["serving"]["intra_op_threads"] == 2
    assert meta["tuned_from"] == {"version": 1}
    assert json.loads((repo / "digits_cnn" / "2" / "tuning.json").read_text())["winner"] == "2 x 2"
    assert validate_model(repo / "digits_cnn", 2).ok  # same model files, replayed against reference.npz

    changed = dict(base, input=[dict(base["input"][0], name="other")])
    with pytest.raises(BuilderError, match="changes 'input': tuning may only change scheduling"):
        publish_tuned(repo, "digits_cnn", config_text_from_dict(changed), {})
