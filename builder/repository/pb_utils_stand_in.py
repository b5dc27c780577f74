"""A stand-in for Triton's ``triton_python_backend_utils`` (the module the python backend's stub gives
model.py), so that builder/repository/served_replay.py can run a version's own model.py in-process,
without a server. It holds only what templates/python_backend/model.py uses: dtype names, tensors,
requests and responses, errors, metric families (counted nowhere) and a logger (kept in ``LOGGED``).
Nothing here talks to Triton; a name model.py starts to use must be added here too (the replay then
fails with the AttributeError, naming it).

Usage::

    sys.modules["triton_python_backend_utils"] = pb_utils_stand_in   # while model.py is imported
    responses = model.execute([StandInRequest({"x": array})])
"""

from __future__ import annotations

import numpy as np

NUMPY_TYPES = {"TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
               "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
               "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
               "TYPE_STRING": np.object_}
LOGGED: list[str] = []


def triton_string_to_numpy(name: str):
    return NUMPY_TYPES[name]


class TritonModelException(Exception):
    pass


class TritonError(Exception):
    INVALID_ARG = 3  # the stub's code for HTTP 400 (model.py passes it as given)

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code

    def message(self) -> str:
        return str(self)


class Tensor:
    def __init__(self, name: str, array: np.ndarray):
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class StandInRequest:
    """One request as execute() receives it: its input tensors by name."""

    def __init__(self, inputs: dict[str, np.ndarray]):
        self.tensors = {name: Tensor(name, np.asarray(array)) for name, array in inputs.items()}


def get_input_tensor_by_name(request: StandInRequest, name: str) -> Tensor | None:
    return request.tensors.get(name)


class InferenceResponse:
    def __init__(self, output_tensors=None, error: TritonError | None = None):
        self._tensors, self._error = list(output_tensors or []), error

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class _Metric:
    def __init__(self, labels: dict[str, str]):
        self.labels, self.value = labels, 0.0

    def increment(self, value: float) -> None:
        self.value += value

    def set(self, value: float) -> None:
        self.value = value


class MetricFamily:
    COUNTER, GAUGE = 0, 1

    def __init__(self, name: str, description: str, kind: int):
        self.name, self.description, self.kind = name, description, kind

    def Metric(self, labels: dict[str, str]) -> _Metric:  # noqa: N802 - pb_utils' spelling
        return _Metric(labels)


class Logger:
    @staticmethod
    def log_info(message: str) -> None:
        LOGGED.append(message)

    @staticmethod
    def log_warn(message: str) -> None:
        LOGGED.append(message)

    @staticmethod
    def log_error(message: str) -> None:
        LOGGED.append(message)

    @staticmethod
    def log_verbose(message: str) -> None:
        LOGGED.append(message)
