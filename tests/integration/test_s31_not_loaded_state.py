"""A model in the repository that the server never loaded: loadtest, sweep and tune say "load it first" over
gRPC as over HTTP (gRPC's empty state read as one said "(state : no reason given); fix it and restart")."""

from __future__ import annotations

import pytest

from builder.core.errors import ServerError
from builder.serving.embedded import EmbeddedServer
from builder.tuning.payload import fetch_model
from tests.integration.python_models import python_model

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("not_loaded") / "repo"
    python_model(repo, "add_one")
    python_model(repo, "never_loaded")  # in the repository, not loaded at start
    with EmbeddedServer(repo, load_models=["add_one"], ready_timeout=90) as served:
        yield served


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_never_loaded_says_load_it_first_over_both_protocols(server, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    with pytest.raises(ServerError, match=rf"model 'never_loaded' is not ready on Triton at {url}; load it first "
                                          r"\(triton-builder serve loads every model of the repository\)"):
        fetch_model(url, protocol, "never_loaded")
