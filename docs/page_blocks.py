"""Blocks of the pages under ``docs/`` written from files of the repository (``make docs``).

The device model's calibration is stated by the files it was written to (``config/device/arch/*.yaml``: each
file's leading comment says what was fitted and its left-out error, its values are the fit); the example output is
the excerpt kept in ``docs/records/example-summary.md``. A calibration or an example run done again changes the
pages by regeneration only.
"""

from __future__ import annotations

from pathlib import Path

import records as r
import yaml

ROOT = r.DOCS.parent
ARCH = ROOT / "config" / "device" / "arch"
DEVICES = ROOT / "config" / "device"
FIELDS = ("conv_efficiency", "conv3x3_efficiency", "matmul_efficiency", "memory_efficiency", "launch_overhead_us")
EXAMPLE = r.RECORDS / "example-summary.md"


def _leading_comment(path: Path) -> str:
    """The comment lines at the top of `path`, joined into one line."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def calibration() -> str:
    """One row per architecture file: the GPUs that use it, its fitted values and what its comment says."""
    users: dict[str, list[str]] = {}
    for path in sorted(DEVICES.glob("*.yaml")):
        arch = (yaml.safe_load(path.read_text()) or {}).get("arch")
        if arch:
            users.setdefault(arch, []).append(path.stem)
    rows = []
    for path in sorted(ARCH.glob("*.yaml")):
        values = yaml.safe_load(path.read_text()) or {}
        fitted = ", ".join(f"{key.split('_')[0]} {r.num(values[key])}" for key in FIELDS if key in values)
        gpus = ", ".join(f"`{name}`" for name in users.get(path.stem, [])) or "none shipped"
        rows.append(
            [
                f"`arch/{path.name}`",
                gpus,
                fitted,
                _leading_comment(path).replace("|error|", "absolute error").replace("|", "\\|"),
            ]
        )
    return (
        r.table(["file", "GPUs (`config/device/`)", "values (launch in µs)", "what was fitted, and how well"], rows)
        + "\n"
    )


def example_summary() -> str:
    """The kept excerpt of a real summary.md: its header comment as a caption, then the excerpt."""
    text = EXAMPLE.read_text()
    if not text.startswith("<!--"):
        raise r.RecordError(f"{EXAMPLE}: lacks its header comment (command and revision)")
    header, _, body = text.partition("-->")
    caption = r.wrap(header.removeprefix("<!--").strip())
    return f"{caption}\n\n```markdown\n{body.strip()}\n```\n"
