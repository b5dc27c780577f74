"""User errors the prober found raw tracebacks or misleading texts for: each is one clear message naming
the option, field or file and the fix (README: Errors policy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.errors import UserInputError


def fake_model(repo: Path, name: str, versions=(1,)) -> Path:
    """A model folder as the repository holds it: config.pbtxt and numbered version folders."""
    folder = repo / name
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\n')
    for version in versions:
        (folder / str(version)).mkdir()
        (folder / str(version) / "metadata.yaml").write_text("name: x\n")
    return folder


def test_register_names_the_missing_or_unsupported_registry(tmp_path, monkeypatch):
    from builder.storage.mlflow_registry import materialise, register_version

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model = fake_model(tmp_path / "repo", "m")
    with pytest.raises(UserInputError, match=r"--registry: which MLflow server\? pass --registry URL or set "
                                             r"\$MLFLOW_TRACKING_URI"):
        register_version(None, model)
    for url in ("notaurl", "file:///tmp/mlruns", "sqlite:///mlflow.db"):
        with pytest.raises(UserInputError, match=rf"--registry {url}: only http\(s\) MLflow tracking servers are "
                                                 r"supported; give the MLflow server's http\(s\):// URL"):
            register_version(url, model)
    with pytest.raises(UserInputError, match=r"--registry file:///x: only http\(s\) MLflow tracking servers"):
        materialise("models:/m/1", "file:///x")


def test_register_names_a_repository_given_for_a_model_folder(tmp_path):
    from builder.storage.mlflow_registry import register_version

    repo = tmp_path / "repo"
    fake_model(repo, "a")
    fake_model(repo, "b")
    with pytest.raises(UserInputError, match=rf"{repo} is a model repository, not a model folder; pass "
                                             rf"<repository>/<model name>: {repo / 'a'}, {repo / 'b'}"):
        register_version("http://127.0.0.1:1", repo)
    with pytest.raises(UserInputError, match=rf"{tmp_path / 'nope'}: no such model folder"):
        register_version("http://127.0.0.1:1", tmp_path / "nope")
    with pytest.raises(UserInputError, match=r"no version 3 to register \(versions there: 1\); pass --version"):
        register_version("http://127.0.0.1:1", repo / "a", version=3)
    with pytest.raises(UserInputError, match=r"empty: no version to register \(versions there: none\)"):
        register_version("http://127.0.0.1:1", fake_model(repo, "empty", versions=()))


@pytest.mark.parametrize("content", ["garbage", "pickled", "objects", "keys"])
def test_a_broken_reference_npz_is_named_and_never_unpickled(tmp_path, content):
    import pickle

    import numpy as np

    from builder.repository.metadata import read_reference

    path = tmp_path / "reference.npz"
    if content == "garbage":
        path.write_bytes(b"tamper\n")
    elif content == "pickled":
        path.write_bytes(pickle.dumps({"input/000_a/x": np.zeros(2)}))
    elif content == "objects":
        np.savez(path, **{"input/000_a/x": np.array([{"a": 1}], dtype=object)})
    else:
        np.savez(path, x=np.zeros(2))
    with pytest.raises(UserInputError, match=rf"{path}: not a plain numeric \.npz of reference cases as build writes "
                                             r"it \(.*\); it is never unpickled: rebuild the version with "
                                             r"triton-builder build"):
        read_reference(path)
