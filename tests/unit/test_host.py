"""The host profile (builder/core/host.py): parsing, usable cores under a cgroup quota, comparing a recorded
host with this one, and sizing serving to a host - all with injected hosts and timings, so nothing
here depends on the machine the tests run on."""

from __future__ import annotations

import shutil

import pytest
import yaml

from builder.core.host import (cgroup_cpu_limit, compare_hosts, cpu_info, host_profile, isa_class, serving_size,
                          size_serving, usable_cores)

EPYC_AVX2 = {"cpu_model": "AMD EPYC 7B13", "isa_flags": ["avx2"], "isa_class": "avx2", "usable_cores": 2}
ZEN4_VNNI = {"cpu_model": "AMD EPYC 9B14", "isa_flags": ["avx2", "avx512_vnni", "avx512f"],
             "isa_class": "avx512_vnni", "usable_cores": 2}


def test_cpuinfo_gives_model_flags_and_isa_class():
    text = "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu sse avx2 avx512f avx512_vnni amx_tile\n" \
           "processor\t: 1\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu sse avx2\n"
    model, flags = cpu_info(text)
    assert model == "AMD EPYC 9B14"
    assert flags == ["amx_tile", "avx2", "avx512_vnni", "avx512f"]
    assert isa_class(flags) == "amx"
    assert isa_class(["avx2", "avx512f", "avx512_vnni"]) == "avx512_vnni"
    assert isa_class(["avx2", "avx512f"]) == "avx512"
    assert isa_class(["avx2"]) == "avx2"
    assert isa_class([]) == "other"


def _fake_root(tmp_path):
    """A reader of absolute paths under tmp_path; no /proc there, so the usual mounts' tops are read."""
    return lambda path: (tmp_path / path.lstrip("/")).read_text()


def test_usable_cores_follow_the_cgroup_quota_not_the_host(tmp_path):
    cgroup = tmp_path / "sys" / "fs" / "cgroup"
    (cgroup / "cpu").mkdir(parents=True)
    (cgroup / "cpu.max").write_text("150000 100000\n")  # v2: 1.5 CPUs
    assert cgroup_cpu_limit(_fake_root(tmp_path)) == 1.5
    assert usable_cores(affinity=64, quota=1.5) == 2
    (cgroup / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(_fake_root(tmp_path)) is None
    assert usable_cores(affinity=64, quota=None) == 64
    (cgroup / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (cgroup / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(_fake_root(tmp_path)) == 4.0
    (cgroup / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(_fake_root(tmp_path)) is None
    assert usable_cores(affinity=2, quota=8.0) == 2



def test_the_measuring_threads_and_tunes_layouts_follow_this_processs_quota(monkeypatch):
    """A 1-CPU quota on a 2-core affinity: measured with 2 threads and tuned for 2 cores before, while
    metadata recorded 1 usable core (a 64-core host's container measured with 64 threads)."""
    from builder.core import host
    from builder.model.measure import cpu_cores
    from builder.tuning.search import built_candidate
    from builder.tuning.tune import _layouts

    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(host, "cgroup_cpu_limit", lambda read=None: 1.0)
    assert usable_cores() == 1 and cpu_cores() == 1
    base = {"name": "m", "backend": "python", "max_batch_size": 8, "dynamic_batching": {},
            "parameters": {"intra_op_threads": {"string_value": "1"}}, "instance_group": [{"count": 1}]}
    assert _layouts(base, built_candidate(base), None, None) == [(2, 0)]  # 1 core: 2 x the built threads; 2 cores: 3
    monkeypatch.setattr(host, "cgroup_cpu_limit", lambda read=None: None)
    assert usable_cores() == 2 and cpu_cores() == 2

def test_profile_of_this_host_is_plain_yaml(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name : Test CPU\nflags : avx2 avx512f\n")
    (tmp_path / "sys" / "fs" / "cgroup").mkdir(parents=True)
    (tmp_path / "sys" / "fs" / "cgroup" / "cpu.max").write_text("100000 100000\n")
    profile = host_profile(cpuinfo, _fake_root(tmp_path), with_gpu=False)
    assert profile["cpu_model"] == "Test CPU" and profile["isa_class"] == "avx512"
    assert profile["usable_cores"] == 1 and profile["cgroup_cpu_quota"] == 1.0
    assert yaml.safe_load(yaml.safe_dump(profile)) == profile


def test_gpus_from_nvidia_smi_csv():
    from builder.core.host import parse_gpus

    text = "NVIDIA H100 80GB HBM3, 9.0, 550.54.15\nNVIDIA H100 80GB HBM3, 9.0, 550.54.15\n"
    assert parse_gpus(text) == [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                                 "driver": "550.54.15"}] * 2
    assert parse_gpus("") == []


def test_same_host_gives_no_warning_and_a_different_one_says_what_to_run():
    assert compare_hosts(ZEN4_VNNI, dict(ZEN4_VNNI), model="m") == []
    lines = compare_hosts(ZEN4_VNNI, EPYC_AVX2, model="m")
    assert len(lines) == 1
    assert "measured on AMD EPYC 9B14 (avx512_vnni" in lines[0] and "this host is AMD EPYC 7B13 (avx2)" in lines[0]
    assert "triton-builder select m" in lines[0]
    lines = compare_hosts(EPYC_AVX2, {**EPYC_AVX2, "usable_cores": 16}, model="m")
    assert len(lines) == 1 and "sized for 2 usable cores" in lines[0] and "may use 16" in lines[0]
    assert "no host profile" in compare_hosts(None, EPYC_AVX2, model="m")[0]
    gpu = {**EPYC_AVX2, "gpus": [{"name": "NVIDIA H100"}]}
    assert "no GPU" in compare_hosts(gpu, EPYC_AVX2, model="m")[0]


def test_compute_bound_model_gets_fewer_instances_with_more_threads():
    assert size_serving(8, batch_seconds=0.050, overhead_seconds=0.001) == (2, 4)
    assert size_serving(2, batch_seconds=0.050, overhead_seconds=0.001) == (1, 2)
    assert size_serving(1, batch_seconds=0.050, overhead_seconds=0.001) == (1, 1)


def test_overhead_bound_model_gets_one_instance_per_core_with_one_thread():
    assert size_serving(2, batch_seconds=0.0005, overhead_seconds=0.001) == (2, 1)
    assert size_serving(4, batch_seconds=0.0005, overhead_seconds=0.001) == (4, 1)
    assert size_serving(64, batch_seconds=0.0005, overhead_seconds=0.001) == (8, 1)  # capped


def test_threads_once_a_batch_1_inference_takes_the_overhead():
    """The crossover measured on 2 cores: 0.49 ms -> instances, 0.98 ms and 1.3 ms -> threads (0.8 ms overhead)."""
    assert size_serving(2, batch_seconds=0.00049) == (2, 1)
    assert size_serving(2, batch_seconds=0.00098) == (1, 2)
    assert size_serving(2, batch_seconds=0.0013) == (1, 2)
    assert size_serving(8, batch_seconds=0.0013) == (2, 4)


def test_serving_size_reads_the_benchmark_record():
    assert serving_size(None, 4) is None
    assert serving_size({"latency_ms_b1": {"p50": 0.5}}, 4)[:2] == (4, 1)
    instances, threads, why = serving_size({"latency_ms_b1": {"p50": 80.0}}, 4)
    assert (instances, threads) == (2, 2) and "compute-bound" in why
    assert "overhead-bound" in serving_size({"latency_ms_b1": {"p50": 0.5}}, 4)[2]


def test_one_core_names_the_model_by_its_time_not_by_the_single_thread():
    """On one usable core every model gets 1 x 1; a 2.5 ms model was still called overhead-bound."""
    instances, threads, why = serving_size({"latency_ms_b1": {"p50": 2.5}}, 1)
    assert (instances, threads) == (1, 1) and "compute-bound" in why


def test_config_for_applies_the_size_unless_the_spec_sets_instances(digits_copy):
    from builder.repository.publish import config_for
    from builder.spec.model import load_spec
    from tests.conftest import edit_spec

    signature = {"logits": ("float32", [10])}
    spec = load_spec(digits_copy / "spec.yaml")
    config = config_for(spec, "onnx", "python", "digits_cnn", signature, sizing=(1, 2))
    assert config.instance_groups[0].count == 1 and config.parameters["intra_op_threads"] == "2"
    config = config_for(spec, "onnx", "python", "digits_cnn", signature)
    assert config.instance_groups[0].count == 1 and config.parameters["intra_op_threads"] == "1"
    deploy = yaml.safe_load((digits_copy / "spec.yaml").read_text()).get("deploy") or {}
    edit_spec(digits_copy, deploy={**deploy, "instances": 3})
    spec = load_spec(digits_copy / "spec.yaml")
    config = config_for(spec, "onnx", "python", "digits_cnn", signature, sizing=(2, 1))
    assert config.instance_groups[0].count == 3 and config.parameters["intra_op_threads"] == "1"


def test_config_for_applies_the_sized_delay_unless_the_spec_sets_one(digits_copy):
    from builder.repository.publish import config_for
    from builder.spec.model import load_spec
    from tests.conftest import edit_spec

    signature = {"logits": ("float32", [10])}
    spec = load_spec(digits_copy / "spec.yaml")
    assert spec.deploy.max_queue_delay_auto
    delay = lambda config: config.dynamic_batching.max_queue_delay_microseconds  # noqa: E731
    assert delay(config_for(spec, "onnx", "python", "digits_cnn", signature, queue_delay_us=650)) == 650
    assert delay(config_for(spec, "onnx", "python", "digits_cnn", signature)) == 0  # not measured: the default
    assert delay(config_for(spec, "onnx", "gpu", "digits_cnn", signature, queue_delay_us=650)) == 0  # GPU: the spec
    deploy = yaml.safe_load((digits_copy / "spec.yaml").read_text()).get("deploy") or {}
    edit_spec(digits_copy, deploy={**deploy, "max_queue_delay_microseconds": 0})  # set, even to 0: the user's
    spec = load_spec(digits_copy / "spec.yaml")
    assert not spec.deploy.max_queue_delay_auto
    assert delay(config_for(spec, "onnx", "python", "digits_cnn", signature, queue_delay_us=650)) == 0


def test_validate_warns_on_a_host_that_differs(built_repository, tmp_path):
    from builder.repository.validate import validate_model

    copy = tmp_path / "repo" / "digits_cnn"
    shutil.copytree(built_repository / "digits_cnn", copy)
    meta_path = copy / "1" / "metadata.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    assert meta["host"]["usable_cores"] >= 1 and "isa_class" in meta["host"]  # recorded by the build
    meta["host"] = ZEN4_VNNI  # metadata.yaml is not among the hashed files
    meta_path.write_text(yaml.safe_dump(meta))
    report = validate_model(copy, current_host=EPYC_AVX2)
    assert report.ok  # a warning, not a failure
    assert any("host:" in line and "triton-builder select digits_cnn" in line for line in report.lines())
    assert validate_model(copy, current_host=dict(ZEN4_VNNI)).host_warnings == []


def test_serve_warns_for_each_model_built_elsewhere(built_repository):
    from builder.serving.serve import served_host_warnings

    meta = yaml.safe_load((built_repository / "digits_cnn" / "1" / "metadata.yaml").read_text())
    assert served_host_warnings(built_repository, ["digits_cnn"], meta["host"]) == []
    lines = served_host_warnings(built_repository, ["digits_cnn"], {**meta["host"], "isa_class": "other"})
    assert len(lines) == 1 and lines[0].startswith("digits_cnn: variants were measured on")


@pytest.mark.slow(reason="builds and measures a model")
def test_a_measured_build_sizes_serving_to_its_host(tmp_path):
    """A real build with a short benchmark: whatever this host measures, the config holds the chosen
    instances x threads, within the usable cores, and metadata.yaml says why."""
    from builder.core.host import usable_cores as host_cores
    from builder.pipeline import build
    from builder.repository.config import config_as_dict
    from tests.conftest import EXAMPLES

    repo = tmp_path / "repo"
    build(EXAMPLES / "digits/spec.yaml", repo, variants=["onnx"], benchmark_seconds=0.3, progress=lambda m: None)
    meta = yaml.safe_load((repo / "digits_cnn" / "1" / "metadata.yaml").read_text())
    serving, cores = meta["serving"], host_cores()
    assert meta["host"]["usable_cores"] == cores
    assert serving["instances"] * serving["intra_op_threads"] <= cores
    assert f"{cores} usable cores" in serving["sized"]
    config = config_as_dict((repo / "digits_cnn" / "config.pbtxt").read_text())
    assert config["instance_group"][0]["count"] == serving["instances"]
    assert config["parameters"]["intra_op_thread_count"]["string_value"] == str(serving["intra_op_threads"])
    # the batching delay: sized from the same benchmark (whatever it measured here), recorded with its reason
    assert int(config["dynamic_batching"].get("max_queue_delay_microseconds", 0)) == \
        serving["max_queue_delay_microseconds"]
    assert serving["delay_sized"].startswith(f"delay {serving['max_queue_delay_microseconds']}")


def test_queue_delay_is_sized_only_where_batching_pays_and_the_model_outweighs_the_overhead():
    from builder.core.host import size_queue_delay

    # 4 ms a batch-1 inference (> 0.8 ms overhead) and batch 8 runs 3x the samples/s: wait a tenth of it
    delay, why = size_queue_delay(0.004, {1: 250.0, 4: 500.0, 8: 750.0}, overhead_seconds=0.0008)
    assert delay == 400 and why.startswith("delay 400 us: batching pays (batch 8: 3.0x the samples/s of batch 1)")
    assert size_queue_delay(0.0013, {"1": 700.0, "8": 2800.0}, overhead_seconds=0.0008)[0] == 150  # keys from YAML
    assert size_queue_delay(0.050, {1: 20.0, 2: 60.0}, overhead_seconds=0.0008)[0] == 1000  # capped
    # batching does not pay enough: delay 0, whatever the model's time (convnet64 here: 2.3x at batch 16)
    delay, why = size_queue_delay(0.0068, {1: 130.0, 16: 294.0}, overhead_seconds=0.0008)
    assert delay == 0 and why == "delay 0: batching does not pay in-process (batch 16: 2.26x the samples/s of " \
                                 "batch 1, < 3x)"
    # it pays, but the per-request overhead outweighs the model (digits: 0.05 ms against ~0.8 ms): delay 0
    delay, why = size_queue_delay(0.00005, {1: 20000.0, 64: 400000.0}, overhead_seconds=0.0008)
    assert delay == 0 and "the per-request overhead (~0.8 ms) outweighs the model's batch-1 0.050 ms" in why
    assert "batch 64: 20.0x" in why
    # not measured (benchmark skipped, or batch 1 only)
    assert size_queue_delay(None, None)[0] == 0
    assert size_queue_delay(0.004, {1: 250.0})[1].startswith("delay 0: no in-process throughput at batch 1 and a")