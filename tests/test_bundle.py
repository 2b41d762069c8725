"""Bundles: a good bundle verifies; tampered members and unsafe member paths are refused unextracted."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from ralp_pipe.cli import main as cli
from ralp_pipe.errors import BundleRefused
from ralp_pipe.results.bundle import CHECKSUMS, make_bundle
from ralp_pipe.results.verify import verify_bundle
from support.bundles import forge, members

LOCK = Path(__file__).resolve().parents[1] / "envs" / "requirements.lock"


@pytest.mark.slow
def test_good_bundle_verifies_and_holds_records_tables_environment_and_checksums(bundle: Path) -> None:
    result = verify_bundle(bundle)
    assert result.top == "smoke-0123" and result.runs == 8
    names = set(members(bundle))
    for name in (
        "runs/synthetic1k/vgg11/n2-1gbit/ps/r0/metrics.json",
        "runs/synthetic1k/vgg11/n4-1gbit/ralp_n/r0/steps.parquet",
        "tables/runs.parquet",
        "tables/summary.md",
        "tables/concurrent.parquet",
        "concurrent/w0/concurrent.json",
        "tables/plots/speedup.png",
        "configs/smoke.json",
        "environment.json",
        "requirements.lock",
        CHECKSUMS,
    ):
        assert f"smoke-0123/{name}" in names
    assert cli(["verify", str(bundle)]) == 0


def test_bundle_bytes_are_reproducible(bundle: Path, tmp_path: Path) -> None:
    root = bundle.parents[1]
    again = tmp_path / "again" / bundle.name
    make_bundle(again, root, [root / n for n in ("configs", "runs", "plans", "concurrent", "tables")], LOCK)
    assert again.read_bytes() == bundle.read_bytes()


def test_tampered_record_fails_its_checksum(bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    name = "smoke-0123/runs/synthetic1k/vgg11/n2-1gbit/ralp_n/r0/metrics.json"
    data = members(bundle)[name].replace(b'"images_per_sec": 240.0', b'"images_per_sec": 999.0')
    tampered = forge(bundle, tmp_path / "tampered.tar.gz", {name: data}, checksums=False)
    with pytest.raises(BundleRefused, match=f"{name}: checksum mismatch"):
        verify_bundle(tampered)
    assert cli(["verify", str(tampered)]) == 1
    assert f"ralp-pipe verify: REFUSED: {tampered}: bundle checksums do not hold" in capsys.readouterr().err


def test_record_changed_with_matching_checksum_fails_its_recomputation(bundle: Path, tmp_path: Path) -> None:
    name = "smoke-0123/runs/synthetic1k/vgg11/n2-1gbit/ralp_n/r0/metrics.json"
    data = members(bundle)[name].replace(b'"images_per_sec": 240.0', b'"images_per_sec": 999.0')
    forged = forge(bundle, tmp_path / "forged.tar.gz", {name: data})
    with pytest.raises(BundleRefused, match="ralp_n/r0: metrics.json records images_per_sec=999.0, but its step"):
        verify_bundle(forged)


def test_unlisted_member_is_refused(bundle: Path, tmp_path: Path) -> None:
    target = forge(bundle, tmp_path / "extra.tar.gz", {"smoke-0123/runs/extra.json": b"{}"}, checksums=False)
    with pytest.raises(BundleRefused, match="extra.json: not in SHA256SUMS"):
        verify_bundle(target)


def crafted(tmp_path: Path, info: tarfile.TarInfo, data: bytes = b"") -> Path:
    """A one-member tar.gz next to a legitimate member, written without any safety check."""
    path = tmp_path / "crafted.tar.gz"
    with gzip.open(path, "wb") as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        ok = tarfile.TarInfo("b/SHA256SUMS")
        tar.addfile(ok, io.BytesIO(b""))
        info.size = len(data) if info.isfile() else 0
        tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize(
    ("info", "message"),
    [
        (_info("/etc/evil"), "absolute"),
        (_info("b/../../evil"), r"leaves the bundle folder"),
        (_info("../evil"), r"leaves the bundle folder"),
        (_info("b/link", tarfile.SYMTYPE, "/etc/passwd"), "is a link"),
        (_info("b/link", tarfile.SYMTYPE, "../../outside"), "is a link"),
        (_info("b/hard", tarfile.LNKTYPE, "/etc/passwd"), "is a link"),
        (_info("b/dev", tarfile.CHRTYPE), "device, fifo or other special file"),
        (_info("b/fifo", tarfile.FIFOTYPE), "device, fifo or other special file"),
        (_info("other/file"), "exactly one top folder"),
    ],
)
def test_unsafe_member_paths_are_refused_without_extracting(
    tmp_path: Path, info: tarfile.TarInfo, message: str
) -> None:
    path = crafted(tmp_path, info, b"x")
    before = set(os.listdir(tmp_path))
    with pytest.raises(BundleRefused, match=message):
        verify_bundle(path)
    assert set(os.listdir(tmp_path)) == before
    assert not Path("/etc/evil").exists()


@pytest.mark.slow
def test_tampered_concurrent_table_fails_recomputation(bundle: Path, tmp_path: Path) -> None:
    name = "smoke-0123/concurrent/w0/concurrent.json"
    data = members(bundle)[name].replace(b'"together_images_per_sec": 50.0', b'"together_images_per_sec": 100.0')
    forged = forge(bundle, tmp_path / "forged.tar.gz", {name: data})
    with pytest.raises(BundleRefused, match="concurrent.parquet differs"):
        verify_bundle(forged)
