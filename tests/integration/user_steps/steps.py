"""The spec's own steps: clients send "1.0,2,3,4" texts and get a class name back. numpy only."""
import numpy as np

NAMES = ["low", "middle", "high"]


def parse(inputs):
    rows = []
    for value in inputs["csv"].reshape(-1):
        text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        numbers = [float(part) for part in text.split(",")]
        if len(numbers) != 4:
            raise ValueError(f"expected 4 comma-separated numbers, got {len(numbers)} in {text!r}")
        rows.append(numbers)
    return {"x": np.array(rows, dtype=np.float32)}


def name_class(outputs):
    logits = outputs["logits"]
    best = logits.argmax(axis=1)
    return {"label": np.array([[NAMES[i].encode()] for i in best], dtype=object),
            "score": logits.max(axis=1, keepdims=True).astype(np.float32)}
