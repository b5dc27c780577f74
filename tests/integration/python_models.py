"""Tiny python-backend models written straight into a repository, for the embedded-server tests.

Usage::

    version = python_model(repo, "add_one")            # repo/add_one/{config.pbtxt, 1/model.py}
    python_model(repo, "broken", "class TritonPythonModel: ...")
"""

from __future__ import annotations

import textwrap
from pathlib import Path

ADD_ONE_PY = textwrap.dedent(
    """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                out = pb_utils.Tensor("OUTPUT0", (x + 1).astype(np.float32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses
    """
)


def python_model(repo: Path, name: str, code: str = ADD_ONE_PY) -> Path:
    """A python-backend model taking INPUT0 [4] FP32 to OUTPUT0, batching up to 8; its version folder."""
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        instance_group [ {{ kind: KIND_CPU count: 1 }} ]
        """))
    (version / "model.py").write_text(code)
    return version
