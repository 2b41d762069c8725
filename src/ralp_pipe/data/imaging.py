"""Turn one source file into the RGB JPEG bytes a shard stores, or say why it cannot be used."""

from __future__ import annotations

import io

from PIL import Image, UnidentifiedImageError

JPEG_QUALITY = 90


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
            rgb = image.convert("RGB")
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
