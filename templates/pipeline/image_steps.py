"""Image pre-processing of a Hugging Face image-classification pipeline, written by triton-builder.

Plain Python (numpy and Pillow; no Triton import): the python step beside this file (preprocess_image.py)
serves it, and the build runs the very same file on the validation images. It does what transformers'
PIL image processors do with the folder's preprocessor_config.json: decode, EXIF-rotate, RGB, resize
(height/width, or shortest_edge), centre crop, rescale, normalise, channels first.

Usage::

    processor = ImageProcessor(json.load(open("preprocessor_config.json")))
    pixels, problems = processor.process([png_bytes, jpeg_bytes])   # float32 [rows, 3, H, W]; problems: {row: why}
"""

import io

import numpy as np


class ImageProcessor:
    def __init__(self, config):
        self.config = config
        size = config.get("size") or {}
        if isinstance(size, int):
            size = {"shortest_edge": size}
        self.size = size
        crop = config.get("crop_size") or {}
        self.crop = {"height": crop, "width": crop} if isinstance(crop, int) else crop
        self.do_crop = bool(config.get("do_center_crop")) and bool(self.crop)
        self.resample = int(config.get("resample", 2))

    def output_shape(self):
        """[3, H, W] of the model's pixel_values."""
        target = self.crop if self.do_crop else self.size
        if "height" not in target:
            raise ValueError("preprocessor_config.json: size has no height/width and there is no crop_size; the "
                             "served image size is not fixed")
        return [3, int(target["height"]), int(target["width"])]

    def _resize(self, image):
        from PIL import Image

        if not self.config.get("do_resize", True):
            return image
        if "height" in self.size:
            return image.resize((int(self.size["width"]), int(self.size["height"])), resample=Image.Resampling(self.resample))
        width, height = image.size
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = int(self.size["shortest_edge"]), int(int(self.size["shortest_edge"]) * long / short)
        target = (new_short, new_long) if width <= height else (new_long, new_short)
        return image.resize(target, resample=Image.Resampling(self.resample))

    def one(self, data):
        """float32 [3, H, W] from encoded image bytes; ValueError naming what is wrong with them."""
        from PIL import Image, ImageOps, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except UnidentifiedImageError:
            raise ValueError("not a readable image (an unknown format or a corrupt header); send the encoded file "
                             "bytes (JPEG, PNG, ...)") from None
        except (OSError, ValueError) as exc:
            raise ValueError(f"not a readable image ({type(exc).__name__}: {exc}); send the whole encoded file "
                             "(JPEG, PNG, ...)") from None
        image = ImageOps.exif_transpose(image).convert("RGB")
        pixels = np.asarray(self._resize(image)).transpose(2, 0, 1)  # uint8 CHW, as transformers' PIL backend
        if self.do_crop:
            height, width = pixels.shape[1:]
            crop_h, crop_w = int(self.crop["height"]), int(self.crop["width"])
            if height < crop_h or width < crop_w:
                padded = np.zeros((3, max(height, crop_h), max(width, crop_w)), dtype=pixels.dtype)
                top, left = -(-(padded.shape[1] - height) // 2), -(-(padded.shape[2] - width) // 2)
                padded[:, top:top + height, left:left + width] = pixels
                pixels, height, width = padded, padded.shape[1], padded.shape[2]
            top, left = (height - crop_h) // 2, (width - crop_w) // 2
            pixels = pixels[:, top:top + crop_h, left:left + crop_w]
        out = pixels
        if self.config.get("do_rescale", True):
            out = (out.astype(np.float64) * float(self.config.get("rescale_factor", 1 / 255))).astype(np.float32)
        else:
            out = out.astype(np.float32)
        if self.config.get("do_normalize", True):
            mean = np.array(self.config.get("image_mean", [0.5, 0.5, 0.5]), dtype=np.float32)
            std = np.array(self.config.get("image_std", [0.5, 0.5, 0.5]), dtype=np.float32)
            out = ((out.T - mean) / std).T
        return np.ascontiguousarray(out, dtype=np.float32)

    @staticmethod
    def statistics(values, problems):
        """(images, their pixels as sent (width x height), the sum of their mean brightness 0-255) of the servable
        rows: what the image drift counters add (decoding again is cheap next to the model)."""
        from PIL import Image

        count = pixels = 0
        brightness = 0.0
        for row, value in enumerate(values):
            if row in problems:
                continue
            image = Image.open(io.BytesIO(bytes(value)))
            count, pixels = count + 1, pixels + image.size[0] * image.size[1]
            brightness += float(np.asarray(image.convert("L").reduce(4) if min(image.size) >= 8 else
                                           image.convert("L")).mean())
        return count, pixels, brightness

    def process(self, values):
        shape = self.output_shape()
        pixels = np.zeros([len(values)] + shape, dtype=np.float32)
        problems = {}
        for row, value in enumerate(values):
            if not isinstance(value, (bytes, bytearray)) or not value:
                problems[row] = f"image {row} is empty or not bytes; send the encoded image file as BYTES"
                continue
            try:
                pixels[row] = self.one(bytes(value))
            except ValueError as exc:
                problems[row] = f"image {row} is {exc}"
        return pixels, problems
