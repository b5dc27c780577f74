"""A model the server never loaded: gRPC's repository index fills in "" for its version and state (protobuf
defaults) where HTTP leaves them out; read as a state, "" made loadtest/sweep/tune say "(state : no reason
given); fix it and restart the server" over gRPC where HTTP says "load it first". With a real server:
tests/integration/test_s31_not_loaded_state.py."""

from __future__ import annotations

from builder.serving.client import TritonClient


def test_grpc_index_entry_of_a_model_never_loaded_has_no_state(monkeypatch):
    from tritonclient.grpc import service_pb2

    never = service_pb2.RepositoryIndexResponse.ModelIndex(name="nob")
    failed = service_pb2.RepositoryIndexResponse.ModelIndex(name="bad", version="1", state="UNAVAILABLE",
                                                            reason="load failed")
    client = TritonClient("127.0.0.1:1", "grpc")
    monkeypatch.setattr(client.raw, "get_model_repository_index",
                        lambda **kw: service_pb2.RepositoryIndexResponse(models=[never, failed]))
    assert client.repository_index()[0] == {"name": "nob", "reason": ""}  # as HTTP gives it
    assert client.model_state("nob") == (None, "")
    assert client.model_state("bad") == ("UNAVAILABLE", "load failed")
    client.close()
