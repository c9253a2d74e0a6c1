"""ImageInput's per-image pipeline (CPU path), in Caffe2's order:

1. decode to HWC uint8, BGR (or gray), converting gray<->colour as requested;
2. crop to the bounding box (ignored when it does not fit);
3. inception-style random-sized crop (``scale_jitter_type=1``, training only);
4. resize so the shorter side is ``scale`` (or up to ``minsize`` / a ``random_scale`` draw;
   ``warp`` resizes to a square) with area interpolation;
5. crop ``crop`` x ``crop``: centred in test mode, at a random offset in training;
6. mirror (p=0.5, training only), then float32;
7. colour jitter (saturation, brightness, contrast in a random order), 8. PCA lighting;
9. ``(v - mean[c]) / std[c]`` per BGR channel.

OpenCV decodes, converts and resizes with the calls and flags Caffe2 makes (``imdecode``
with ``IMREAD_COLOR`` or ``IMREAD_GRAYSCALE``, ``cvtColor``, ``resize`` with ``INTER_AREA``),
so the pixels are Caffe2's; it releases the GIL, so decode threads run in parallel.  Crops
are numpy views, copied once, into the float32 batch row.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dpgraph.data.records import ImageRecord
from dpgraph.errors import DataInputError, MissingDependencyError

#: PCA lighting: eigenvectors (rows R, G, B) and eigenvalues of ImageNet pixel covariance.
EIGVEC = np.array([[-144.7125, 183.396, 102.2295], [-148.104, -1.1475, -207.57],
                   [-148.818, -177.174, 107.1765]], dtype=np.float32)
EIGVAL = np.array([0.2175, 0.0188, 0.0045], dtype=np.float32)
ERROR_SIDE = 224


class Draws(Protocol):
    """The random draws the pipeline makes (a ``numpy.random.Generator`` has them; the op
    hands in a cheaper counter-based stream per image)."""

    def random(self) -> float: ...

    def uniform(self, low: float, high: float) -> float: ...

    def integers(self, low: int, high: int) -> int: ...

    def permutation(self, count: int) -> Any: ...

    def normal(self, loc: float, scale: float, size: int) -> np.ndarray: ...


@dataclass(frozen=True)
class ImageParams:
    """The ImageInput arguments the per-image pipeline uses."""

    crop: int
    scale: int = -1
    minsize: int = -1
    warp: bool = False
    channels: int = 3
    is_test: bool = False
    mirror: bool = False
    scale_jitter_type: int = 0
    random_scale: tuple[int, int] = (-1, -1)
    color_jitter: bool = False
    saturation: float = 0.4
    brightness: float = 0.4
    contrast: float = 0.4
    color_lighting: bool = False
    lighting_std: float = 0.1
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    bbox: tuple[int, int, int, int] | None = None
    gpu_transform: bool = False


@functools.cache
def opencv() -> Any:
    """The ``cv2`` module (imported at the first image: it takes ~0.1 s)."""
    try:
        import cv2
    except ImportError as error:
        raise MissingDependencyError(
            f"ImageInput decodes and resizes images with OpenCV, which is not importable "
            f"({error}); install it with: pip install opencv-python-headless") from None
    return cv2


def decode(record: ImageRecord, channels: int) -> np.ndarray:
    """The record's image as HWC uint8, BGR (3 channels) or gray (1 channel).  An encoded
    image that OpenCV cannot decode raises ``ValueError``."""
    cv2 = opencv()
    if record.encoded is not None:
        flag = cv2.IMREAD_COLOR if channels == 3 else cv2.IMREAD_GRAYSCALE
        pixels = cv2.imdecode(np.frombuffer(record.encoded, dtype=np.uint8), flag)
        if pixels is None or pixels.size == 0:
            raise ValueError("OpenCV could not decode the encoded image")
    else:
        assert record.pixels is not None
        pixels = record.pixels
        if pixels.shape[2] != channels:
            pixels = cv2.cvtColor(pixels, cv2.COLOR_BGR2GRAY if channels == 1
                                  else cv2.COLOR_GRAY2BGR)
    return pixels.reshape(pixels.shape[0], pixels.shape[1], channels)


def _bbox(pixels: np.ndarray, box: tuple[int, int, int, int] | None) -> np.ndarray:
    if box is None or min(box) < 0:
        return pixels
    ymin, xmin, height, width = box
    if pixels.shape[0] < ymin + height or pixels.shape[1] < xmin + width:
        return pixels
    return pixels[ymin:ymin + height, xmin:xmin + width]


def resize(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """``pixels`` resized to ``width`` x ``height`` with OpenCV's area interpolation (true
    area averaging when shrinking), keeping the channel axis."""
    cv2 = opencv()
    out = cv2.resize(pixels, (width, height), interpolation=cv2.INTER_AREA)
    return out.reshape(height, width, pixels.shape[2])


def _inception_crop(pixels: np.ndarray, crop: int, rng: Draws) -> np.ndarray | None:
    height, width = pixels.shape[:2]
    area = height * width
    for _ in range(10):
        target = math.ceil(rng.uniform(0.08, 1.0) * area)
        ratio = rng.uniform(3 / 4, 4 / 3)
        new_h, new_w = int(math.sqrt(target / ratio)), int(math.sqrt(target * ratio))
        if 1 <= new_h <= height and 1 <= new_w <= width:
            y = int(rng.integers(0, height - new_h + 1))
            x = int(rng.integers(0, width - new_w + 1))
            return resize(pixels[y:y + new_h, x:x + new_w], crop, crop)
    return None


def _rescale(pixels: np.ndarray, params: ImageParams, rng: Draws) -> np.ndarray:
    low, high = params.random_scale
    if low > 0:
        side = int(rng.integers(low, high + 1))
    else:
        side = params.scale if params.scale > 0 else params.minsize
    rows, cols = pixels.shape[:2]
    if params.warp:
        height = width = side
    elif rows > cols:
        width, height = side, int(rows * side / cols)
    else:
        height, width = side, int(cols * side / rows)
    changed = (height, width) != (rows, cols)
    if (params.scale > 0 and changed) or height > rows or width > cols:
        return resize(pixels, width, height)
    return pixels


def crop_pixels(pixels: np.ndarray, params: ImageParams, rng: Draws) -> np.ndarray:
    """Steps 2-6 on decoded HWC uint8 pixels: the ``crop`` x ``crop`` x C window (a view of
    the resized image, or a mirrored copy)."""
    pixels = _bbox(pixels, params.bbox)
    cropped = None
    if params.scale_jitter_type == 1 and not params.is_test:
        cropped = _inception_crop(pixels, params.crop, rng)
    pixels = _rescale(pixels, params, rng) if cropped is None else cropped
    (rows, cols), crop = pixels.shape[:2], params.crop
    if rows < crop or cols < crop:
        raise DataInputError(f"Image height must be bigger than crop: the image is "
                             f"{rows}x{cols} after resizing, crop is {crop}.")
    if params.is_test:
        x, y = (cols - crop) // 2, (rows - crop) // 2
    else:
        x = int(rng.integers(0, cols - crop + 1))
        y = int(rng.integers(0, rows - crop + 1))
    window = pixels[y:y + crop, x:x + crop]
    if params.mirror and (params.gpu_transform or not params.is_test) and rng.random() < 0.5:
        return mirror(window)
    return window


def mirror(pixels: np.ndarray) -> np.ndarray:
    """HWC pixels with the columns reversed, as a contiguous copy (OpenCV's flip)."""
    return opencv().flip(pixels, 1).reshape(pixels.shape)


def _gray(values: np.ndarray) -> np.ndarray:
    return 0.114 * values[..., 0] + 0.587 * values[..., 1] + 0.299 * values[..., 2]


def _jitter(values: np.ndarray, params: ImageParams, rng: Draws) -> np.ndarray:
    for step in rng.permutation(3):
        if step == 0:
            alpha = np.float32(1 + rng.uniform(-params.saturation, params.saturation))
            values = values * alpha + (_gray(values) * (1 - alpha))[..., None]
        elif step == 1:
            values = values * np.float32(1 + rng.uniform(-params.brightness, params.brightness))
        else:
            alpha = np.float32(1 + rng.uniform(-params.contrast, params.contrast))
            values = values * alpha + np.float32(_gray(values).mean() * (1 - alpha))
    return values.astype(np.float32, copy=False)


def _lighting(values: np.ndarray, params: ImageParams, rng: Draws
              ) -> np.ndarray:
    alphas = rng.normal(0.0, params.lighting_std, size=3).astype(np.float32)
    delta_rgb = EIGVEC @ (EIGVAL * alphas)
    return values + delta_rgb[::-1].astype(np.float32)


#: Rows of float32 output normalised together: the cast and the two in-place passes over a
#: block of about this size stay in a core's L2 cache (a 224 x 224 BGR crop is one block:
#: fewer, longer numpy calls also let two decode threads hand the GIL over less often).
_BLOCK_BYTES = 640 * 1024
#: Per-channel constants are tiled over up to this many rows, so numpy's inner loops run
#: over several rows at a time (one call per 224-pixel row costs ~40% of the pass).
_GROUP = 8


def normalize(pixels: np.ndarray, params: ImageParams,
              out: np.ndarray | None = None) -> np.ndarray:
    """Step 9 on HWC uint8 or float pixels: float32 ``(v - mean[c]) * (1/std[c])``, written
    into ``out`` when given (a row of the batch, so no extra copy).

    uint8 pixels are first cast into ``out`` (numpy's fast contiguous cast), then the
    subtraction and the scaling run in place, a block of rows at a time, with scalar
    constants when every channel has the same mean and std (one long contiguous loop) and
    per-channel constants tiled along several rows otherwise."""
    if out is None:
        out = np.empty(pixels.shape, dtype=np.float32)
    if not out.flags.c_contiguous:  # a caller's strided view: broadcast per channel
        mean, scale = _constants(params.mean, params.std, pixels.shape[-1], pixels.shape[-1])
        np.subtract(pixels, mean, out=out, dtype=np.float32)
        np.multiply(out, scale, out=out)
        return out
    rows = out.shape[0]
    blocks = max(1, math.ceil(out.nbytes / _BLOCK_BYTES))
    step = math.ceil(math.ceil(rows / blocks) / _GROUP) * _GROUP  # whole groups of rows
    for start in range(0, rows, step):
        _normalize_rows(pixels[start:start + step], out[start:start + step], params)
    return out


def _normalize_rows(pixels: np.ndarray, out: np.ndarray, params: ImageParams) -> None:
    rows = out.shape[0]
    group = next(g for g in (_GROUP, 4, 2, 1) if rows % g == 0)
    flat = out.reshape(rows // group, -1)
    mean, scale = _constants(params.mean, params.std, out.shape[-1], flat.shape[1])
    if pixels.dtype == np.uint8:
        np.copyto(out, pixels, casting="unsafe")
        np.subtract(flat, mean, out=flat)
    else:
        np.subtract(pixels.reshape(flat.shape), mean, out=flat, dtype=np.float32)
    np.multiply(flat, scale, out=flat)


@functools.lru_cache(maxsize=64)
def _constants(mean: tuple[float, ...], std: tuple[float, ...], channels: int,
               length: int) -> tuple[Any, Any]:
    """float32 ``mean[c]`` and ``1/std[c]``: scalars when all channels agree, else tiled
    over ``length`` interleaved values (read-only: shared by every decode thread)."""
    means = np.array(mean[:channels], dtype=np.float32)
    scales = np.float32(1.0) / np.array(std[:channels], dtype=np.float32)
    if (means == means[0]).all() and (scales == scales[0]).all():
        return means[0], scales[0]
    rows = np.tile(means, length // channels), np.tile(scales, length // channels)
    for row in rows:
        row.flags.writeable = False
    return rows


def augment(record: ImageRecord, params: ImageParams, rng: Draws
            ) -> tuple[np.ndarray, bool]:
    """Steps 1-8: the crop (a uint8 view, or float32 after colour jitter / lighting) and
    whether decoding failed (the image is then a 224x224 zero image, as in Caffe2)."""
    try:
        decoded, failed = decode(record, params.channels), False
    except MissingDependencyError:
        raise
    except Exception:  # noqa: BLE001  (any decoder failure counts as a decode error)
        decoded, failed = error_image(params.channels), True
    pixels = crop_pixels(decoded, params, rng)
    if (params.color_jitter or params.color_lighting) and not params.is_test \
            and params.channels == 3 and not params.gpu_transform:
        values = pixels.astype(np.float32)
        if params.color_jitter:
            values = _jitter(values, params, rng)
        if params.color_lighting:
            values = _lighting(values, params, rng)
        return values, failed
    return pixels, failed


def transform(record: ImageRecord, params: ImageParams, rng: Draws,
              out: np.ndarray | None = None) -> tuple[np.ndarray, bool]:
    """The whole pipeline: float32 HWC BGR (the uint8 crop on the GPU-transform path) and
    whether decoding failed.  ``out`` receives the float result when given."""
    pixels, failed = augment(record, params, rng)
    if params.gpu_transform:
        return np.ascontiguousarray(pixels), failed
    return normalize(pixels, params, out), failed


def error_image(channels: int) -> np.ndarray:
    """What a record that fails to decode becomes (before cropping): a 224x224 zero image."""
    return np.zeros((ERROR_SIDE, ERROR_SIDE, channels), dtype=np.uint8)
