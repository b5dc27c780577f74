"""``EmbeddedServer``'s model-control methods (builder/serving/embedded.py): the repository index, a
model's state and readiness, load, unload and wait, each turning Triton's answer into a ``ServerError``
that quotes its reason (or the log lines about the model) and names the log.

Usage (through ``EmbeddedServer``, which mixes this in)::

    server.unload_model("resnet_python")
    server.load_model("resnet_python")           # ServerError quoting Triton's reason on failure
    server.model_state("resnet_python")          # ("READY", "")
"""

from __future__ import annotations

from builder.core.errors import ServerError
from builder.serving import startup
from builder.serving.client import TritonError
from builder.serving.server_log import readable

__all__ = ["ModelControl"]


class ModelControl:
    """Mixed into ``EmbeddedServer``: it provides ``_call``, ``_real_paths``, ``_model_log_lines``,
    ``_log_size``, ``left_out``, ``models``, ``http_url`` and ``log_path``."""

    def repository_index(self) -> list[dict]:
        """``/v2/repository/index``: one ``{"name", "version", "state", "reason"}`` dict per model."""
        return self._call("repository index", lambda c: c.repository_index())

    def model_state(self, name: str) -> tuple[str | None, str]:
        """``(state, reason)`` of a model from the repository index (READY if any version is); None if absent."""
        return self._call("repository index", lambda c: c.model_state(name))

    def model_ready(self, name: str) -> bool:
        """Whether model ``name`` is ready for inference."""
        return self._call(f"readiness of model '{name}'", lambda c: c.model_ready(name))

    def load_model(self, name: str, config_json: str | None = None, timeout: float = 120.0) -> None:
        """Load (or reload) model ``name``, optionally with a JSON config override; blocks until done.

        Raises ``ServerError`` quoting Triton's reason (and the log lines about the model) if it
        fails, ``ServerDiedError`` if the server died meanwhile.
        """

        if name in self.left_out:
            raise ServerError(f"model '{name}' cannot be served by the embedded server: {self.left_out[name]}")
        since = self._log_size()
        try:
            self._call(f"load of model '{name}'", lambda c: c.load_model(name, config_json), network_timeout=timeout)
        except TritonError as err:
            if err.unreachable:
                raise ServerError(f"tritonserver at {self.http_url} did not answer while loading '{name}': "
                                  f"{err.reason}") from None
            reason = readable(self._real_paths(err.reason).strip().rstrip(";"))
            if not reason:  # no reason in the answer: quote the log lines about the model
                reason = "\n".join(self._model_log_lines(name, since)) or str(err)
            raise ServerError(f"tritonserver could not load model '{name}': {reason}\nfull log: {self.log_path}") from None
        startup.remove_new_bytecode(self._local_repository, self._bytecode)
        if name not in self.models:
            self.models.append(name)

    def unload_model(self, name: str, wait: bool = True, timeout: float = 60.0, unload_dependents: bool = False) -> None:
        """Unload model ``name``; with ``wait``, return once Triton no longer lists it as ready."""
        self._call(f"unload of model '{name}'",
                   lambda c: c.unload_model(name, wait=wait, timeout=timeout, unload_dependents=unload_dependents))
        if name in self.models:
            self.models.remove(name)

    def wait_for_model(self, name: str, timeout: float = 60.0) -> None:
        """Wait until model ``name`` is READY; ``ServerError`` with Triton's reason if it became UNAVAILABLE."""

        try:
            self._call(f"load of model '{name}'", lambda c: c.wait_for_model(name, timeout))
        except TritonError as err:
            if err.state == "UNAVAILABLE":
                raise ServerError(f"model '{name}' is UNAVAILABLE: {readable(self._real_paths(err.reason))}\n"
                                  f"full log: {self.log_path}") from None
            raise
