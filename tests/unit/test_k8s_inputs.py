"""`k8s` refuses what would only fail in the cluster: an invalid image reference (Kubernetes' schema
takes any string), and warns of a repository endpoint on loopback (in a pod, that is the pod)."""

from __future__ import annotations

import pytest

from builder.core.errors import UserInputError
from builder.scaleout.k8s import DEFAULT_IMAGE, render_manifests
from tests.conftest import run_cli


@pytest.mark.parametrize("image", ["foo bar:latest", "foo/Bar:1", "foo:bad tag", "foo@sha256:xyz", "", "foo:",
                                   "-foo:1", "registry.local:5000/"])
def test_an_invalid_image_reference_is_refused_naming_the_flag(tmp_path, image):
    with pytest.raises(UserInputError, match=r"--image .*: not a valid image reference; use \[REGISTRY"):
        render_manifests("s3://models-bucket/prod", tmp_path, image=image)
    with pytest.raises(UserInputError, match=r"--locust-image .*: not a valid image reference"):
        render_manifests("s3://models-bucket/prod", tmp_path, locust_image=image)
    assert not (tmp_path / "base").exists()  # refused before anything is written


@pytest.mark.parametrize("image", [DEFAULT_IMAGE, "triton:1", "registry.local:5000/team/triton-server:24.10-py3",
                                   "localhost/a__b.c-d", "ghcr.io/org/img@sha256:" + "a" * 64,
                                   "img:v1@sha256:" + "0" * 64])
def test_valid_image_references_render(tmp_path, image):
    result = render_manifests("s3://models-bucket/prod", tmp_path, image=image)
    assert f"image: {image}" in (tmp_path / "base" / "triton-deployment.yaml").read_text() or \
        f'image: "{image}"' in (tmp_path / "base" / "triton-deployment.yaml").read_text()
    assert not any(n.startswith("warning:") for n in result.notes)


@pytest.mark.parametrize("url", ["s3://127.0.0.1:9000/models/prod", "s3://localhost:9000/models/prod"])
def test_a_loopback_endpoint_is_warned_about(tmp_path, url):
    result = render_manifests(url, tmp_path)
    host = url.split("//")[1].split(":")[0]
    assert any(line.startswith(f"warning: --repository-url {url}: inside a pod, {host} is the pod itself, not "
                               "this machine") for line in result.lines())
    assert not any(n.startswith("warning:") for n in render_manifests("s3://minio.storage:9000/models/prod",
                                                                      tmp_path / "other").notes)


def test_k8s_cli_refuses_a_bad_image_with_exit_code_2(tmp_path):
    result = run_cli("k8s", "--repository-url", "s3://models/prod", "--out", str(tmp_path), "--image",
                     "foo bar:latest", "--no-validate")
    assert result.returncode == 2 and "--image 'foo bar:latest': not a valid image reference" in result.stderr


def test_the_image_follows_the_triton_release(tmp_path):
    """k8s runs the stock NGC image of --triton-release (default: the newest in the release table)."""
    out = tmp_path / "k8s"
    proc = run_cli("k8s", "--repository-url", "s3://models-bucket/prod", "--out", str(out), "--triton-release", "26.07",
                   "--no-validate")
    assert proc.returncode == 0, proc.stderr
    assert "nvcr.io/nvidia/tritonserver:26.07-py3" in (out / "base" / "triton-deployment.yaml").read_text()
    assert DEFAULT_IMAGE == "nvcr.io/nvidia/tritonserver:26.08-py3"
    both = run_cli("k8s", "--repository-url", "s3://models-bucket/prod", "--out", str(tmp_path / "x"),
                   "--triton-release", "26.07", "--image", "triton:1", "--no-validate")
    assert both.returncode == 2 and "--image and --triton-release both name the Triton image" in both.stderr
    unknown = run_cli("k8s", "--repository-url", "s3://models-bucket/prod", "--out", str(tmp_path / "y"),
                      "--triton-release", "19.01", "--no-validate")
    assert unknown.returncode == 2 and "--triton-release 19.01: not in triton-builder's runtime table" in unknown.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
