"""The images a Hugging Face image pipeline is verified on: listed in data.validation, or generated.

Usage::

    images = read_images(Path("data/images.txt"), "data.validation")   # encoded files, one path per line
    images = generated_images()                                        # seeded PNGs and JPEGs of varied sizes
    pixels = processed(processor, images, "data.validation")           # as the served image step makes them

The processor is the served step's own (templates/pipeline/image_steps.py ImageProcessor).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from builder.core import assets
from builder.core.errors import UserInputError
from builder.core.files import module_from_file


def processor_for(config_file: Path):
    module = module_from_file(assets.pipeline_step("image_steps.py"), "triton_builder_image_steps")
    return module.ImageProcessor(json.loads(config_file.read_text(encoding="utf-8")))


def read_images(path: Path, field: str) -> list[bytes]:
    if path.suffix != ".txt":
        raise UserInputError(f"{field}: {path.name}: for an image source give a .txt listing image files (JPEG, PNG, "
                             "...), one path per line, relative to that file")
    files = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    missing = [f for f in files if not (path.parent / f).is_file()]
    if missing or not files:
        raise UserInputError(f"{field}: {path.name} lists {'no image' if not files else ', '.join(missing[:3])}"
                             f"{' (not found)' if missing else ''}; list image files, relative to {path.parent}")
    return [(path.parent / f).read_bytes() for f in files]


def generated_images(count: int = 12, seed: int = 0) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    for i in range(count):
        height, width = int(rng.integers(16, 160)), int(rng.integers(16, 160))
        smooth = rng.integers(0, 255, (2, 2, 3)).astype(np.float64)  # a gradient plus noise: not only noise
        ys, xs = np.linspace(0, 1, height)[:, None, None], np.linspace(0, 1, width)[None, :, None]
        base = (smooth[0, 0] * (1 - ys) * (1 - xs) + smooth[1, 1] * ys * xs + smooth[0, 1] * (1 - ys) * xs
                + smooth[1, 0] * ys * (1 - xs))
        pixels = np.clip(base + rng.normal(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "PNG" if i % 2 == 0 else "JPEG")
        images.append(buffer.getvalue())
    return images


def processed(processor, images: list[bytes], field: str) -> np.ndarray:
    pixels, problems = processor.process(images)
    if problems:
        raise UserInputError(f"{field}: {len(problems)} image(s) cannot be served: "
                             + "; ".join(problems[row] for row in sorted(problems)[:3]))
    return pixels
