"""Model-control requests for a server that stopped answering, sent by a detached process that waits
for it to wake up (tune's clean-up after a hang: the copy it loaded unloaded, the model it replaced
loaded from its file again).

Usage::

    pid = control_when_back("127.0.0.1:8001", "grpc", unload=["m__tune1234_1"], load=["m"],
                            repository="model_repository", keep_bytecode=bytecode_dirs(repository))
"""

from __future__ import annotations

from pathlib import Path

from builder.core.processes import LocalService
from builder.serving import control_key
from builder.serving.client import TritonClient, TritonError, split_url
from builder.serving.startup import remove_new_bytecode

#: how long ``control_when_back``'s process waits for a hung server to take its requests
CLEANUP_PATIENCE_S = 600.0


def control_when_back(url: str, protocol: str | None, unload=(), load=(), patience: float | None = None,
                      repository: str | Path | None = None, keep_bytecode=()) -> int:
    """Model-control requests (``unload``, then ``load`` from the files) for a server that stopped answering,
    sent by a detached process that waits for its answers up to ``patience`` seconds; its pid. A hung
    server takes a request when it wakes up, but a gRPC call given up before then is cancelled (a copy
    tune loaded stayed loaded): the call must still be waiting. A server that refuses connections ends it
    at once (a new server starts from its files). A load from the files of ``repository`` writes the python
    stub's bytecode into the published version folder: the process then removes the ``__pycache__``
    folders there that are not in ``keep_bytecode`` (those that were there before). The server's control
    key (builder/serving/control_key.py) goes to the process in its environment."""
    import json
    import os
    import sys


    key = control_key.key_for(split_url(url, protocol)[0])  # handed over in its environment, not its arguments

    class Helper(LocalService):
        label = "model-control helper"
        die_with_parent = False  # it outlives this process: that is what it is for
        log_path = Path(os.devnull)

        def _command(self):
            args = json.dumps([url, protocol, list(unload), list(load), patience or CLEANUP_PATIENCE_S,
                               str(repository) if repository is not None else None, sorted(map(str, keep_bytecode))])
            return [sys.executable, "-c", "import json, sys; from builder.serving.control_helper import "
                    "control_now; control_now(*json.loads(sys.argv[1]))", args]

        def _env(self):  # this package, installed or not
            root = os.path.dirname(os.path.dirname(sys.modules["builder"].__file__))  # the folder holding builder/
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
            return dict(env, **{control_key.ENV: key}) if key else env

        def stop(self, timeout=None):  # never stopped, not even at this process's exit
            return None

    helper = Helper()
    try:
        helper.start()
    except RuntimeError:
        pass  # it ended at once: it got its answers (or a refusal)
    return helper.pid


def control_now(url: str, protocol: str | None, unload: list[str], load: list[str], patience: float,
                repository: str | None = None, keep_bytecode: list[str] = ()) -> None:
    """What ``control_when_back``'s process does: the requests, each given ``patience`` seconds, then the
    bytecode a load wrote into ``repository`` removed."""

    with TritonClient(url, protocol, network_timeout=patience, connection_timeout=patience) as client:
        for call, names in ((client.unload_model, unload), (client.load_model, load)):
            for name in names:
                try:
                    call(name)
                except TritonError:
                    pass  # refused or never answered: nothing more to do
    if repository is not None and load:
        remove_new_bytecode(Path(repository), {Path(p) for p in keep_bytecode})
