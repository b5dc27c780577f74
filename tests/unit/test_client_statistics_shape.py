"""TritonClient.statistics has one shape over HTTP and gRPC whatever Triton's HTTP JSON leaves out
(issue 39: an empty ``response_stats`` missing over HTTP on one host, present over gRPC)."""

from __future__ import annotations

import copy

from google.protobuf import json_format
from tritonclient.grpc import service_pb2

from builder.serving.client import _message, normalised_statistics

HTTP_ANSWER = {"model_stats": [{
    "name": "digits_cnn", "version": "1", "last_inference": 1795868059263, "inference_count": 3, "execution_count": 2,
    "inference_stats": {"success": {"count": 2, "ns": 48116544}, "fail": {"count": 0, "ns": 0},
                        "queue": {"count": 2, "ns": 177573}, "compute_input": {"count": 2, "ns": 120930},
                        "compute_infer": {"count": 2, "ns": 47651003}, "compute_output": {"count": 2, "ns": 159176},
                        "cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
    "response_stats": {},
    "batch_stats": [{"batch_size": 2, "compute_input": {"count": 1, "ns": 47791},
                     "compute_infer": {"count": 1, "ns": 883090}, "compute_output": {"count": 1, "ns": 86478}}],
    "memory_usage": []}]}


def _without(answer: dict, *keys: str) -> dict:
    answer = copy.deepcopy(answer)
    for key in keys:
        del answer["model_stats"][0][key]
    return answer


def _grpc_form(answer: dict):
    """The protobuf message a gRPC client receives for the same statistics."""
    return json_format.ParseDict(answer, service_pb2.ModelStatisticsResponse())


def test_an_empty_field_left_out_or_written_gives_the_same_answer():
    written = normalised_statistics(HTTP_ANSWER)
    left_out = normalised_statistics(_without(HTTP_ANSWER, "response_stats", "memory_usage"))
    assert written == left_out
    assert written["model_stats"][0]["response_stats"] == {} and written["model_stats"][0]["memory_usage"] == []


def test_http_and_grpc_forms_are_identical_with_and_without_the_empty_field():
    for raw in (HTTP_ANSWER, _without(HTTP_ANSWER, "response_stats")):
        assert normalised_statistics(raw) == _message(_grpc_form(raw))


def test_counters_are_ints_and_text_stays_text():
    entry = normalised_statistics(HTTP_ANSWER)["model_stats"][0]
    assert entry["version"] == "1" and entry["name"] == "digits_cnn"
    assert entry["inference_stats"]["success"]["count"] == 2 and entry["last_inference"] == 1795868059263
    assert entry["batch_stats"][0]["batch_size"] == 2


def test_a_newer_servers_unknown_field_is_dropped_as_grpc_drops_it():
    raw = copy.deepcopy(HTTP_ANSWER)
    raw["model_stats"][0]["future_counter"] = {"count": 1}
    assert "future_counter" not in normalised_statistics(raw)["model_stats"][0]
