"""`tune`'s search (builder/tuning/search.py, tune.py) without a server: the layouts (instances x intra-op
threads) it tries from injected usable cores, how a candidate writes them into the config, the config as
built as the baseline, the quick search that compares candidates where the default scored, and the
winner rule - with injected throughputs."""

from __future__ import annotations

import os

import pytest

from builder.core.errors import UserInputError
from builder.tuning.search import Candidate, ModelControl, Search, built_candidate, derived_max_batch_sizes
from builder.tuning.tune import _choose, _layouts, _thread_counts, host_layouts

PYTHON_BASE = {"name": "m", "backend": "python", "max_batch_size": 8,
               "dynamic_batching": {"max_queue_delay_microseconds": "0"},
               "parameters": {"intra_op_threads": {"string_value": "1"}},
               "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
BUILT_2X1 = dict(PYTHON_BASE, instance_group=[{"count": 2, "kind": "KIND_CPU"}])


def test_host_layouts_follow_the_usable_cores():
    assert host_layouts(2, threaded=True) == [(1, 2), (2, 1), (3, 1)]
    assert host_layouts(8, threaded=True) == [(1, 8), (2, 4), (4, 2), (8, 1), (9, 1)]
    assert host_layouts(1, threaded=True) == [(1, 1), (2, 1)]
    assert host_layouts(4, threaded=False) == [(1, 0), (2, 0), (4, 0), (5, 0)]


def test_layouts_leave_out_the_config_as_built_and_name_built_threads_zero():
    default = built_candidate(BUILT_2X1)
    assert (default.instances, default.threads, default.batching, default.delay_us) == (2, 0, True, 0)
    assert _layouts(BUILT_2X1, default, None, usable_cores=2) == [(1, 2), (3, 0)]  # 2 x 1 is the default
    assert _layouts(BUILT_2X1, default, [1, 2, 4], usable_cores=2) == [(1, 0), (4, 0)]
    onnx = {"name": "m", "platform": "onnxruntime_onnx", "max_batch_size": 8, "instance_group": [{"count": 1}]}
    assert _layouts(onnx, built_candidate(onnx), None, usable_cores=2) == [(2, 0), (3, 0)]


def test_thread_counts_are_only_those_given():
    assert _thread_counts(PYTHON_BASE, None) == []
    assert _thread_counts(PYTHON_BASE, [1, 3]) == [1, 3]
    assert _thread_counts({"backend": "onnxruntime"}, None) == []
    with pytest.raises(UserInputError, match="--threads: this model's config sets no intra-op thread count"):
        _thread_counts({"backend": "onnxruntime"}, [2])


def test_built_candidate_reads_the_config_on_disk():
    built = built_candidate(dict(BUILT_2X1, dynamic_batching={"max_queue_delay_microseconds": "500",
                                                              "preferred_batch_size": [4]}))
    assert (built.label, built.delay_us, built.preferred, built.max_batch_size) == ("default", 500, [4], 8)
    assert built_candidate(dict(PYTHON_BASE, dynamic_batching=None) | {"max_batch_size": 0}).batching is False
    assert built.config(BUILT_2X1)["instance_group"][0]["count"] == 2


@pytest.mark.parametrize("concurrency, instances, built_max, sizes", [
    (16, 3, 32, [4, 8]), (16, 1, 32, [16]), (16, 2, 8, [])])
def test_derived_max_batch_sizes(concurrency, instances, built_max, sizes):
    assert derived_max_batch_sizes(concurrency, instances, built_max) == sizes


def test_a_thread_candidate_sets_intra_op_threads():
    config = Candidate("2 x 2", True, 0, 2, 8, threads=2).config(PYTHON_BASE)
    assert config["parameters"]["intra_op_threads"] == {"string_value": "2"}
    assert config["instance_group"][0]["count"] == 2
    assert PYTHON_BASE["parameters"]["intra_op_threads"] == {"string_value": "1"}  # the base is left alone
    assert Candidate("as built", True, 0, 1, 8).config(PYTHON_BASE)["parameters"]["intra_op_threads"] == \
        {"string_value": "1"}


class InjectedSearch(Search):
    """The staged search with throughputs given per (instances, threads, max batch): no server. Records the
    concurrency each candidate was measured at: the default climbs, the others are probed."""

    def __init__(self, throughput, levels=(1, 2, 4, 8, 16), budget=50.0):
        self.throughput, self.order, self.measured, self.max_candidates = throughput, [], {}, 20
        self.levels, self.budget, self.operating, self.probe_level_s, self.per_level_s = list(levels), budget, None, 1, 1
        self.measured_at: dict[str, list[int]] = {}
        self.current = None

    def measure(self, candidate, confirm_round=False):
        if candidate.key in self.measured:
            return self.measured[candidate.key]
        self.current = candidate
        self.measured[candidate.key] = candidate
        self.order.append(candidate)
        if self.operating is None:
            candidate.levels, candidate.best = self.climb()
        else:
            candidate.levels, candidate.best = self.probe(self.operating)
        return candidate

    def measure_once(self, concurrency, max_s=None):
        c = self.current
        rps = self.throughput.get((c.instances, c.threads or 1, c.max_batch_size), 100.0)
        rps += 1.0 if c.delay_us else 0.0  # a delay helps a little, whatever the layout
        rps *= min(concurrency, 8) / 8  # saturates at 8 in flight
        p99 = concurrency * 2.0  # 16 in flight: 32 ms
        self.measured_at.setdefault(c.label, []).append(concurrency)
        row = {"throughput_rps": rps, "p99_ms": p99, "concurrency": concurrency, "failures": 0,
               "server_avg_batch": 2.0}
        return row, p99 <= self.budget


@pytest.mark.parametrize("throughput, winner", [
    ({(2, 1, 8): 400.0, (1, 2, 8): 380.0, (3, 1, 8): 390.0}, (2, 0, 8)),  # the built layout stays
    ({(2, 1, 8): 300.0, (1, 2, 8): 290.0, (3, 1, 8): 420.0}, (3, 0, 8)),  # one more instance than cores
    ({(2, 1, 8): 300.0, (1, 2, 8): 360.0, (3, 1, 8): 310.0}, (1, 2, 8)),  # threads win: compute-bound
])
def test_quick_search_climbs_once_then_probes_where_the_default_scored(throughput, winner):
    search = InjectedSearch(throughput, budget=30.0)  # p99 = 2 ms x concurrency: 16 is over
    default = built_candidate(BUILT_2X1)
    none, built = search.candidates(default, [(1, 2), (3, 0)], [100], None)
    assert built is default and none.label == "no batching"
    assert search.measured_at["default"][:5] == [1, 2, 4, 8, 16]  # the default climbs ...
    assert search.operating == 8  # ... and scores where throughput saturates
    assert search.measured_at["1 x 2 threads"] == [8]  # the others where it scored (16 ms x 16/8 > 30 ms: no step up)
    tried = [(c.instances, c.threads, c.max_batch_size) for c in search.order]
    assert (1, 2, 8) in tried and (3, 0, 8) in tried
    delay = next(c for c in search.order if c.delay_us == 100)  # the delay stage starts from the best layout
    best_layout = max([c for c in search.order if not c.delay_us and c.batching and c.max_batch_size == 8],
                      key=lambda c: c.score)
    assert (delay.instances, delay.threads) == (best_layout.instances, best_layout.threads)
    chosen = _choose([c for c in search.order if not c.delay_us and c.max_batch_size == 8], default, 0.05)
    assert (chosen.instances, chosen.threads, chosen.max_batch_size) == winner


def test_probe_steps_down_when_over_the_budget_and_up_with_room():
    search = InjectedSearch({}, budget=10.0)  # p99 = 2 ms x concurrency: 4 within, 8 over
    search.current = Candidate("x", True, 0, 1, 8)
    rows, best = search.probe(8)
    assert [r["concurrency"] for r in rows] == [8, 4] and best["concurrency"] == 4
    assert search.measured_at["x"] == [8, 4]  # over the budget at 8: measured once there, then one level down
    rows, best = search.probe(2)  # p99 4 ms, x 4/2 = 8 ms <= 10: one level up as well
    assert [r["concurrency"] for r in rows] == [2, 4] and best["concurrency"] == 4
    search.budget = 20.0
    rows, best = search.probe(4)  # p99 8 ms, forecast 16 ms at 8 <= 20: up, and it scores there
    assert [r["concurrency"] for r in rows] == [4, 8] and best["concurrency"] == 8
    search.budget = 15.0
    rows, best = search.probe(4)  # forecast 16 ms > 15: stays
    assert [r["concurrency"] for r in rows] == [4] and best["concurrency"] == 4


def test_the_winner_is_closest_to_the_config_as_built_within_the_margin():
    default = built_candidate(BUILT_2X1)
    default.best = {"throughput_rps": 100.0}
    near = Candidate("3 instances", True, 0, 3, 8)
    near.best = {"throughput_rps": 104.0}  # within 5 %: not worth a change
    assert _choose([default, near], default, 0.05) is default
    near.best = {"throughput_rps": 106.0}
    assert _choose([default, near], default, 0.05) is near
    # a top scorer far ahead: a config closer to the default within 5 % of it is chosen only where it
    # beats the default by more than 5 % itself, else the top scorer
    top = Candidate("delay 100 us", True, 100, 3, 8)
    top.best = {"throughput_rps": 110.0}
    near.best = {"throughput_rps": 105.5}
    assert _choose([default, near, top], default, 0.05) is near
    near.best = {"throughput_rps": 104.9}
    assert _choose([default, near, top], default, 0.05) is top


def test_tune_publish_makes_the_tuned_config_a_new_version(built_repository, tmp_path):
    import json
    import shutil

    import yaml

    from builder.core.errors import BuilderError
    from builder.repository.config import config_as_dict
    from builder.repository.republish import publish_tuned
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
    assert served["parameters"]["intra_op_thread_count"] == {"string_value": "2"}  # the onnxruntime backend's key
    meta = yaml.safe_load((repo / "digits_cnn" / "2" / "metadata.yaml").read_text())
    assert meta["serving"]["instances"] == 2 and meta["serving"]["intra_op_threads"] == 2
    assert meta["tuned_from"] == {"version": 1}
    assert json.loads((repo / "digits_cnn" / "2" / "tuning.json").read_text())["winner"] == "2 x 2"
    assert validate_model(repo / "digits_cnn", 2).ok  # same model files, replayed against reference.npz

    changed = dict(base, input=[dict(base["input"][0], name="other")])
    with pytest.raises(BuilderError, match="changes 'input': tuning may only change scheduling"):
        publish_tuned(repo, "digits_cnn", config_text_from_dict(changed), {})


def test_read_config_takes_no_max_batch_sizes_as_derive_them(tmp_path):
    from builder.repository.tuned import config_text_from_dict
    from builder.tuning.tune import _read_config

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(config_text_from_dict(PYTHON_BASE))
    assert _read_config(tmp_path, "m", None, 1)[2]["max_batch_size"] == 8
    with pytest.raises(UserInputError, match=r"--max-batch-sizes \[16\]: must be <= the built max_batch_size 8"):
        _read_config(tmp_path, "m", [4, 16], 1)


def test_a_corrupt_served_config_is_named_with_the_fix(tmp_path):
    from builder.tuning.tune import _read_config

    (tmp_path / "m").mkdir()
    config = tmp_path / "m" / "config.pbtxt"
    config.write_text('name: "m"\nthis is not a config\n')
    with pytest.raises(UserInputError, match=rf"^{config} does not parse with Triton's schema: .*; fix that file or "
                                             r"rebuild the model \(triton-builder build\) before tuning it") as caught:
        _read_config(tmp_path, "m", None, 1)
    assert caught.value.exit_code == 2


def test_a_candidate_keeps_the_bases_other_batching_settings():
    base = dict(PYTHON_BASE, dynamic_batching={"max_queue_delay_microseconds": "0", "preferred_batch_size": [8],
                                               "default_queue_policy": {"timeout_action": "REJECT"}})
    config = Candidate("d", True, 100, 1, 8).config(base)
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": "100",
                                          "default_queue_policy": {"timeout_action": "REJECT"}}
    assert Candidate("p", True, 0, 1, 8, [4]).config(base)["dynamic_batching"]["preferred_batch_size"] == [4]


class RecordingClient:
    """Stands in for TritonClient's model control (no server): records loads and unloads."""

    def __init__(self):
        self.calls = []

    def load_model(self, name, config_json=None, files=None):
        self.calls.append(("load", name, sorted(files) if files is not None else None))

    def unload_model(self, name, **kwargs):
        self.calls.append(("unload", name))


class RecordingControl(ModelControl):
    """ModelControl over a recording client: its own serve() and drop_copy(); load() and the loaded
    config recorded instead of asked of a server."""

    def __init__(self, files=None):
        self.model, self.files, self.copy_name, self.copies = "m", files, None, 0
        self.client, self.loads, self.by_name = RecordingClient(), [], {}

    def load(self, config):
        self.loads.append(config)
        self.by_name["m"] = config

    def serve(self, config, on_file=False):
        name, sent = super().serve(config, on_file)
        self.by_name[name] = sent
        return name, sent

    def loaded_config(self, name=None):
        return self.by_name.get(name or "m") or BUILT_2X1


def _recording_search(files=None):
    from types import SimpleNamespace

    search = InjectedSearch({})
    search.server, search.stats, search.say = RecordingControl(files), SimpleNamespace(close=lambda: None), lambda m: None
    search.engine = SimpleNamespace(model="m")
    search.base, search.names, search.file_key, search.model = BUILT_2X1, {}, None, "m"
    real_measure = Search.measure.__get__(search)  # the real measure(), over the recording control

    def measure(candidate, confirm_round=False):
        search.current = candidate
        return real_measure(candidate, confirm_round)

    search.measure = measure
    return search


def test_the_config_already_served_is_measured_without_a_reload_and_not_restored():
    search = _recording_search()
    default = built_candidate(BUILT_2X1)
    search.serving_file(default)
    search.measure(default)
    assert search.server.loads == []  # the server serves the file: measured as it is
    other = Candidate("3 instances", True, 0, 3, 8)
    search.measure(other)
    assert [c["instance_group"][0]["count"] for c in search.server.loads] == [3]
    search.measure(default, confirm_round=True)  # back to the file's config: a reload
    assert len(search.server.loads) == 2 and search.restore() is None
    assert len(search.server.loads) == 2  # ... and none to restore it
    search.measure(other, confirm_round=True)
    assert search.restore() is None and search.server.loads[-1] is None  # restored from the file
    assert search.server.client.calls == []  # no copies without files


def test_candidates_are_copies_and_the_model_itself_is_never_reloaded():
    PID = os.getpid()  # in the copies' names: two tunes of one model never load over each other's copies
    search = _recording_search(files={"file:1/model.onnx": b"onnx"})
    default = built_candidate(BUILT_2X1)
    search.serving_file(default)
    search.measure(default)
    assert search.engine.model == "m" and search.server.client.calls == []
    three, one = Candidate("3 instances", True, 0, 3, 8), Candidate("1 instances", True, 0, 1, 8)
    search.measure(three)
    assert search.engine.model == f"m__tune{PID}_1"
    assert search.server.by_name[f"m__tune{PID}_1"]["name"] == f"m__tune{PID}_1"
    assert search.server.by_name[f"m__tune{PID}_1"]["instance_group"][0]["count"] == 3
    search.measure(one)  # the previous copy is unloaded as the next one loads
    assert search.server.client.calls == [("load", f"m__tune{PID}_1", ["file:1/model.onnx"]), ("unload", f"m__tune{PID}_1"),
                                          ("load", f"m__tune{PID}_2", ["file:1/model.onnx"])]
    search.measure(default, confirm_round=True)  # the file's config: the model itself; the copy stays loaded
    calls = search.server.client.calls
    assert search.engine.model == "m" and len(calls) == 3
    search.measure(one, confirm_round=True)  # back to the copy loaded now: no reload
    assert search.engine.model == f"m__tune{PID}_2" and len(calls) == 3
    search.measure(three, confirm_round=True)  # another config: the next copy, the previous one unloaded
    assert calls[3:] == [("unload", f"m__tune{PID}_2"), ("load", f"m__tune{PID}_3", ["file:1/model.onnx"])]
    assert search.restore() is None and search.engine.model == "m"
    assert calls[-1] == ("unload", f"m__tune{PID}_3")
    assert search.server.loads == []  # the model itself: never unloaded, never reloaded


@pytest.mark.parametrize("by_delay, tried", [
    ({100: 110.0, 500: 80.0, 2000: 200.0}, [100, 500]),  # 500 served less than 100: 2000 is not tried
    ({100: 110.0, 500: 108.0, 2000: 200.0}, [100, 500, 2000]),  # within 5 % of the best: go on
    ({100: 130.0, 500: 150.0, 2000: 160.0}, [100, 500, 2000]),  # rising: every delay
    ({100: 90.0, 500: 200.0}, [100]),  # the first delay already served less than none
])
def test_the_delay_stage_stops_once_a_longer_delay_serves_less(by_delay, tried):
    class DelaySearch(InjectedSearch):
        def measure_once(self, concurrency, max_s=None):
            row, within = super().measure_once(concurrency, max_s)
            if self.current.delay_us:
                row["throughput_rps"] = by_delay[self.current.delay_us] * min(concurrency, 8) / 8
            return row, within

    search = DelaySearch({(2, 1, 8): 100.0}, budget=30.0)
    search.candidates(built_candidate(BUILT_2X1), [], [2000, 100, 500], [])
    assert [c.delay_us for c in search.order if c.label.startswith("delay ")] == tried


@pytest.mark.parametrize("files, confirm_rows, loads", [
    ({"file:1/model.onnx": b"onnx"}, 2, 0),  # copies: winner and default once more each, back to back, no reload
    (None, 1, 1),  # the model itself reloaded: one confirm each, the default's costs a reload
])
def test_the_confirm_round_measures_winner_and_default_back_to_back_with_copies(files, confirm_rows, loads):
    from builder.tuning.tune import _confirm

    search = _recording_search(files=files)
    search.throughput = {(3, 1, 8): 200.0}  # 3 instances serve twice the default's 100
    default = built_candidate(BUILT_2X1)
    search.serving_file(default)
    search.measure(default)
    search.operating = default.best["concurrency"]
    three = search.measure(Candidate("3 instances", True, 0, 3, 8))
    reloads_before = len(search.server.loads) + len(search.server.client.calls)
    winner = _confirm(search, default, three, 0.05)
    assert winner is three
    for candidate in (three, default):
        assert sum(1 for row in candidate.levels if row.get("confirm_round")) == confirm_rows, candidate.label
    assert len(search.server.loads) + len(search.server.client.calls) - reloads_before == loads


def test_the_built_config_winning_says_what_the_server_serves():
    from pathlib import Path

    from builder.tuning.tune import built_config_won

    path = Path("repo/m/config.pbtxt")
    assert built_config_won(path, False, loaded_differs=False) == (
        "the config as built won: nothing written (repo/m/config.pbtxt already serves it)")
    # the server loaded an older config than the file (a newer build since): the file is not what it serves
    assert built_config_won(path, True, loaded_differs=True) == (
        "the config as built won: nothing published (repo/m/config.pbtxt already holds it; the server still serves "
        "the config it loaded before, which differs: restart `triton-builder serve` to load the file)")
