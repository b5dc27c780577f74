"""``serve`` follows its repository: a version change made while it runs (``build``, ``select --write``,
``tune --publish``, ``rollback``) reaches the running server without a restart and without a dropped request.

Why this and not Triton's poll mode: ``serve`` runs Triton in explicit mode (the model-control API, with the
server's key, is what ``tune``, the rollouts and ``replicas`` drive), and only this process holds that key.
So ``serve`` itself watches each model folder - its ``config.pbtxt`` (the version_policy a rollback or a
publish rewrites) and its version folders - and, when one changed and stayed unchanged for a moment, asks
Triton to load that model again with its own key. Triton loads the versions the new config names before it
unloads the ones it no longer names, so requests keep being answered throughout (measured: 0 failed requests
under load, tests/integration/test_serve_follows_rollback.py). A change read while a publish holds the
repository's lock waits for it (``reading_lock``); a publish is atomic anyway (a version folder renamed into
place, config.pbtxt replaced last), so the watch never loads half of one.

Models are reloaded steps first, then the ensembles that use them. A new model folder is loaded when the
server serves the whole repository. A reload Triton refuses is announced with its reason, and the server
keeps answering with what it had.

Usage (``serve_forever`` does this)::

    watch = RepositoryWatch(server, announce)
    while serving:
        watch.poll()          # cheap between changes: stats one config.pbtxt and lists one folder per model
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Callable

from builder.core.errors import ServerError, UserInputError
from builder.repository.config import parse_config
from builder.repository.layout import reading_lock
from builder.serving.backends import model_dirs, unsupported_models

__all__ = ["WATCH_INTERVAL_S", "SETTLE_S", "RepositoryWatch", "folder_state"]

WATCH_INTERVAL_S = 1.0  # how often the folders are looked at
SETTLE_S = 0.5  # a change must look the same this long later before it is loaded (a copy still in progress)


def folder_state(folder: Path) -> tuple:
    """What a reload depends on in one model folder: its config.pbtxt's bytes (hashed) and its version
    folders (name and inode: a version folder replaced whole by a rename is a new one)."""
    config = folder / "config.pbtxt"
    try:
        digest = hashlib.sha256(config.read_bytes()).hexdigest()
    except OSError:
        digest = None
    versions = []
    try:
        for entry in folder.iterdir():
            if entry.name.isdigit() and entry.is_dir():
                versions.append((int(entry.name), entry.stat().st_ino))
    except OSError:
        pass
    return digest, tuple(sorted(versions))


class RepositoryWatch:
    """Reloads the models of ``server`` (a started ``EmbeddedServer``, explicit model control) whose folders
    changed; ``announce`` gets one line per reload. ``whole_repository``: new model folders are loaded too."""

    def __init__(self, server, announce: Callable[[str], object], interval: float = WATCH_INTERVAL_S,
                 settle: float = SETTLE_S, whole_repository: bool = True, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.server = server
        self.repository = Path(server.repository)
        self.announce = announce
        self.interval = interval
        self.settle = settle
        self.whole_repository = whole_repository
        self._clock, self._sleep = clock, sleep
        self._next = clock() + interval
        self.states = self._snapshot()
        self.reloads: list[tuple[str, bool]] = []  # (model, loaded), in order: what the tests read

    def _snapshot(self) -> dict[str, tuple]:
        try:
            folders = model_dirs(self.repository)
        except OSError:
            return {}
        return {folder.name: folder_state(folder) for folder in folders}

    def poll(self) -> list[str]:
        """Look at the folders when ``interval`` has passed since the last look; reload what changed and
        settled. Returns the models it (re)loaded this time."""
        if self._clock() < self._next:
            return []
        self._next = self._clock() + self.interval
        seen = self._snapshot()
        changed = [name for name, state in seen.items() if self.states.get(name) != state]
        if not changed:
            return []
        self._sleep(self.settle)
        with reading_lock(self.repository):
            settled = self._snapshot()
            changed = [name for name in changed if settled.get(name) == seen.get(name)]
            loaded = self._reload([name for name in changed if self._wanted(name)])
        for name in changed:  # a change that did not settle is looked at again next time
            self.states[name] = settled[name]
        return loaded

    def _wanted(self, name: str) -> bool:
        return name in self.server.models or name in self.server.failed or self.whole_repository

    def _reload(self, names: list[str]) -> list[str]:
        if not names:
            return []
        left_out = unsupported_models(self.repository)
        loaded = []
        for name in sorted(names, key=lambda n: (self._is_ensemble(n), n)):  # steps before their ensembles
            if name in left_out:
                self.announce(f"  watch    {name} changed but cannot be served here: {left_out[name]}")
                continue
            before = self._ready_versions(name)
            try:
                self.server.load_model(name)
            except ServerError as err:
                self.reloads.append((name, False))
                self.announce(f"  watch    {name} changed; Triton refused to load it, so it keeps answering with "
                              f"what it had: {err}".replace("\n", "\n           "))
                continue
            self.server.failed.pop(name, None)
            self.reloads.append((name, True))
            loaded.append(name)
            now = self._ready_versions(name)
            was = f" (was {_versions_text(before)})" if before else " (new)"
            self.announce(f"  watch    {name} changed on disk: reloaded, now answering with version "
                          f"{_versions_text(now)}{was}")
        return loaded

    def _is_ensemble(self, name: str) -> bool:
        try:
            return parse_config((self.repository / name / "config.pbtxt").read_text()).platform == "ensemble"
        except (OSError, UserInputError):  # unreadable: left out by unsupported_models, named there
            return False

    def _ready_versions(self, name: str) -> list[str]:
        try:
            with self.server.triton() as client:
                return [str(v) for v in client.model_metadata(name).get("versions", [])]
        except Exception:  # noqa: BLE001 - only said in the announcement; not served yet is []
            return []


def _versions_text(versions: list[str]) -> str:
    return ", ".join(versions) if versions else "none"
