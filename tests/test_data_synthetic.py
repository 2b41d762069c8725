"""The synthetic ImageNet twin: same bytes every run, real JPEGs of the configured size."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from ralp_pipe.config import SyntheticSource
from ralp_pipe.data.synthetic import generate, synset_ids


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_same_settings_give_the_same_bytes(tmp_path):
    options = SyntheticSource(images_per_class=3, height=24, width=40, seed=7)
    a = tree(generate(tmp_path / "a" / "source", 12, options, workers=2))
    b = tree(generate(tmp_path / "b" / "source", 12, options, workers=1))
    assert a == b and len(a) == 36
    assert sorted({name.split("/")[0] for name in a}) == synset_ids(12)
    assert "n00000011/n00000011_2.JPEG" in a
    with Image.open(io.BytesIO(a["n00000003/n00000003_1.JPEG"])) as image:
        assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (40, 24))
    assert len(set(a.values())) == 36
    other = tree(generate(tmp_path / "c" / "source", 12, SyntheticSource(3, 24, 40, seed=8)))
    assert other.keys() == a.keys() and other != a


def test_finished_collection_is_kept_and_changed_settings_rebuild(tmp_path):
    target = tmp_path / "source"
    generate(target, 4, SyntheticSource(2, 16, 16, 0))
    before = {p: p.stat().st_mtime_ns for p in target.rglob("*")}
    generate(target, 4, SyntheticSource(2, 16, 16, 0))
    assert {p: p.stat().st_mtime_ns for p in target.rglob("*")} == before
    generate(target, 3, SyntheticSource(1, 16, 16, 0))
    assert sorted(tree(target)) == [f"n0000000{i}/n0000000{i}_0.JPEG" for i in range(3)]
