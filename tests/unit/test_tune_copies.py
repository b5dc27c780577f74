"""tune's candidates served as copies of the model: which files a copy is made of (the load itself:
tests/integration/test_loadtest.py)."""

from __future__ import annotations

from builder.tuning.search import served_copy_files


def _model(tmp_path):
    folder = tmp_path / "m"
    for relative, data in {"config.pbtxt": b"name: 'm'", "tuning.json": b"{}", "labels.txt": b"a\nb\n",
                           "warmup/x.bin": b"\0" * 8, "1/model.onnx": b"old", "3/model.onnx": b"new",
                           "3/model.py": b"# stub", "3/__pycache__/model.cpython-311.pyc": b"cache",
                           "3/openvino/model.xml": b"<xml/>"}.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def test_a_copy_is_the_served_version_as_version_1_with_the_model_folders_own_files(tmp_path):
    files = served_copy_files(_model(tmp_path), 3)
    assert files == {"file:1/model.onnx": b"new", "file:1/model.py": b"# stub", "file:1/openvino/model.xml": b"<xml/>",
                     "file:labels.txt": b"a\nb\n", "file:warmup/x.bin": b"\0" * 8}


def test_no_copy_over_the_size_limit_or_without_the_version_folder(tmp_path):
    folder = _model(tmp_path)
    assert served_copy_files(folder, 3, limit=10) is None  # 3 + 6 + 6 + 4 + 8 bytes > 10
    assert served_copy_files(folder, 3, limit=27) is not None
    assert served_copy_files(folder, 2) is None
