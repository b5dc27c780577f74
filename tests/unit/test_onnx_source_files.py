"""An ONNX source's external data, wherever the file keeps it (a subfolder, one file per tensor): checked
at stage load, copied into the build as model.onnx.data, published with the model and hashed in
metadata.yaml's source - and a missing file or one outside the model's folder is an exit-2 message."""

from __future__ import annotations

import pytest
import torch
import yaml

from builder.core.errors import UserInputError
from builder.pipeline import build


def onnx_source(tmp_path, **save):
    """tmp_path/src/{model.onnx, spec.yaml}, the weights saved as external data with onnx.save_model(**save)."""
    import onnx
    folder = tmp_path / "src"
    folder.mkdir()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    torch.onnx.export(model, (torch.randn(1, 16),), str(folder / "model.onnx"), input_names=["x"],
                      output_names=["y"], dynamo=False, dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    proto = onnx.load(str(folder / "model.onnx"))
    (folder / "sub").mkdir()  # onnx writes into folders, never makes them
    onnx.save_model(proto, str(folder / "model.onnx"), save_as_external_data=True, size_threshold=0, **save)
    spec = {"name": "ext", "source": {"onnx": "model.onnx"}, "inputs": [{"name": "x", "dtype": "float32",
            "shape": [16]}], "outputs": [{"name": "y"}], "max_batch_size": 8, "variants": ["onnx"]}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    return folder / "spec.yaml"


@pytest.mark.parametrize("save", [{"location": "sub/weights.bin"}, {"all_tensors_to_one_file": False}])
@pytest.mark.parametrize("kept_external", [False, True])
def test_external_data_in_any_layout_is_built_published_and_validated(tmp_path, quiet, monkeypatch, save,
                                                                      kept_external):
    from builder.repository.validate import validate_model
    if kept_external:  # as a model over 1 GiB is: its weights stay beside it in the published version
        monkeypatch.setattr("builder.stages.common.EXTERNAL_DATA_THRESHOLD", 0)
    spec = onnx_source(tmp_path, **save)
    build(spec, tmp_path / "repo", benchmark_seconds=0, progress=quiet)
    version = tmp_path / "repo" / "ext" / "1"
    # onnx keeps tensors under 1 KiB inline: the first layer's weights (2 KiB) are external
    assert (version / "model.onnx.data").is_file() == kept_external
    assert not [p for p in version.iterdir() if p.is_dir()]
    hashed = yaml.safe_load((version / "metadata.yaml").read_text())["source"]["sha256"]
    files = {p.relative_to(spec.parent).as_posix() for p in spec.parent.rglob("*") if p.is_file()} - {"spec.yaml"}
    assert set(hashed) == files and len(files) > 1
    report = validate_model(tmp_path / "repo" / "ext")
    assert report.ok, report.lines()


def test_a_missing_external_data_file_is_named_at_load(tmp_path, quiet):
    spec = onnx_source(tmp_path, location="sub/weights.bin")
    (spec.parent / "sub" / "weights.bin").unlink()
    with pytest.raises(UserInputError, match=r"source.onnx: model.onnx keeps tensor '.*' in the external data file "
                                             r"sub/weights.bin, which does not exist in .*src; put that file there"):
        build(spec, tmp_path / "repo", progress=quiet)
    assert not (tmp_path / "repo").exists()


def test_external_data_outside_the_model_folder_is_refused(tmp_path, quiet):
    import onnx
    spec = onnx_source(tmp_path, location="weights.bin")
    (spec.parent / "weights.bin").rename(tmp_path / "weights.bin")
    proto = onnx.load(str(spec.parent / "model.onnx"), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../weights.bin"
    onnx.save_model(proto, str(spec.parent / "model.onnx"))
    with pytest.raises(UserInputError, match=r"source.onnx: model.onnx keeps tensor '.*' in '../weights.bin', "
                                             r"outside its folder .*; move the data file into that folder"):
        build(spec, tmp_path / "repo", progress=quiet)
    (spec.parent / "weights.bin").write_bytes(b"short")
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "weights.bin"
    onnx.save_model(proto, str(spec.parent / "model.onnx"))
    with pytest.raises(UserInputError, match=r"source.onnx: weights.bin holds 5 bytes but model.onnx reads tensor"):
        build(spec, tmp_path / "repo", progress=quiet)


def test_an_onnx_source_newer_than_the_release_is_the_users_to_convert(tmp_path, quiet):
    import onnx
    spec = onnx_source(tmp_path, location="weights.bin")
    path = spec.parent / "model.onnx"
    proto = onnx.load(str(path), load_external_data=False)
    proto.ir_version = 11
    for op in proto.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = 23
    onnx.save_model(proto, str(path))
    with pytest.raises(UserInputError) as err:
        build(spec, tmp_path / "repo", progress=quiet, triton_release="24.10")
    text = str(err.value)
    assert text.startswith("source.onnx: the file is newer than the Triton release this build targets loads")
    assert "- model.onnx: ONNX IR version 11 > 10, the newest onnxruntime" in text
    assert "convert the file (model = onnx.version_converter.convert_version(onnx.load(path), 21); " \
           "model.ir_version = 10; onnx.save(model, path)) or export it again with opset 21 or lower" in text
    assert "implements: the same conversion" in text
    assert "onnx.opset" not in text  # the spec's onnx.opset only applies to an export from PyTorch
    assert not (tmp_path / "repo").exists()
