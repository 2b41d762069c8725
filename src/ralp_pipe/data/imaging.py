"""Turn one source file into the RGB JPEG bytes a shard stores, or say why it cannot be used.

Pillow's own ``convert("RGB")`` clips high-bit-depth pixels and drops alpha as it finds it,
so those modes are mapped here first:

* 16-bit integer (``I;16``, ``I;16B``, ...): ``value * 255 / 65535``.
* 32-bit integer (``I``): the same when every value lies in [0, 65535] (a 16-bit image stored
  as ``I``, the common case for PNG and TIFF); otherwise the image's own [min, max] range is
  stretched to [0, 255], since no fixed bit depth is known.
* float (``F``): values in [0, 1] (``max <= 1``) are clipped to [0, 1] and scaled by 255;
  otherwise the image's [min, max] range is stretched to [0, 255]. NaN counts as 0.
* alpha (``LA``, ``La``, ``PA``, ``RGBA``, ``RGBa``, ``P`` with a transparent colour):
  composited onto a white background (ImageNet's product shots mostly sit on white).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

JPEG_QUALITY = 90
BACKGROUND = (255, 255, 255)
_ALPHA_MODES = ("LA", "La", "PA", "RGBA", "RGBa")


class BadImage(ValueError):
    """A source file that is not a usable image; the message is the reason recorded in the manifest."""


def to_rgb_jpeg(data: bytes, resize_shorter: int | None) -> tuple[bytes, bool]:
    """Return (JPEG bytes, re-encoded?) for `data`; RGB JPEGs needing no resize are kept byte for byte."""
    if not data:
        raise BadImage("empty file (0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            fmt, mode, size = image.format, image.mode, image.size
            target = _target_size(size, resize_shorter)
            if fmt == "JPEG" and mode == "RGB" and target == size:
                return data, False
            rgb = to_rgb(image)
    except UnidentifiedImageError:
        raise BadImage("not an image (no known image format)") from None
    except Image.DecompressionBombError as exc:
        raise BadImage(f"too large to decode safely: {exc}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise BadImage(f"cannot decode ({_kind(data)}): {exc}") from None
    if target != size:
        rgb = rgb.resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=JPEG_QUALITY)
    return out.getvalue(), True


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` as 8-bit RGB: high bit depths scaled, transparency composited onto BACKGROUND (module doc)."""
    if image.mode.startswith("I") or image.mode == "F":
        return Image.fromarray(_to_8bit(np.asarray(image), image.mode == "F"), "L").convert("RGB")
    if image.mode in _ALPHA_MODES or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _to_8bit(values: np.ndarray, is_float: bool) -> np.ndarray:
    """Single-channel integer or float pixels scaled to uint8 as the module doc describes."""
    pixels = np.nan_to_num(values.astype(np.float64), nan=0.0)
    low, high = (float(pixels.min()), float(pixels.max())) if pixels.size else (0.0, 0.0)
    if is_float and high <= 1:
        scaled = np.clip(pixels, 0, 1) * 255
    elif not is_float and low >= 0 and high <= 65535:
        scaled = pixels * (255 / 65535)
    else:
        scaled = (pixels - low) * (255 / (high - low)) if high > low else np.zeros_like(pixels)
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def _kind(data: bytes) -> str:
    """Short name of the file type from its magic bytes, for error messages."""
    if data[:3] == b"\xff\xd8\xff":
        return "JPEG data, truncated or corrupt"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "PNG data, truncated or corrupt"
    return "unrecognised data"


def _target_size(size: tuple[int, int], resize_shorter: int | None) -> tuple[int, int]:
    """Size after shrinking the shorter side to `resize_shorter` (images are never enlarged)."""
    width, height = size
    shorter = min(width, height)
    if resize_shorter is None or shorter <= resize_shorter:
        return size
    scale = resize_shorter / shorter
    return max(1, round(width * scale)), max(1, round(height * scale))
