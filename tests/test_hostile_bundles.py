"""Hostile bundles and results folders: tar bombs, malformed members with good checksums, links out of --root."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from ralp_pipe.cli import main as cli
from ralp_pipe.errors import BundleRefused
from ralp_pipe.results import verify
from ralp_pipe.results.verify import Limits, verify_bundle
from support.bundles import forge, members

TOP = "smoke-0123"
METRICS = f"{TOP}/runs/synthetic1k/vgg11/n2-1gbit/ralp_n/r0/metrics.json"
ZEROS = bytes(4 << 20)  # 4 MiB of zeros: gzip shrinks it to a few KiB


def refused(bundle: Path, capsys: pytest.CaptureFixture[str], *options: str) -> str:
    """Run `ralp-pipe verify`, expect exit status 1 and one REFUSED line on stderr; return that line."""
    assert cli(["verify", *options, str(bundle)]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert "OK" not in captured.out and len(lines) == 1 and "Traceback" not in captured.err
    assert lines[0].startswith(f"ralp-pipe verify: REFUSED: {bundle}: ")
    return lines[0]


@pytest.mark.slow
def test_default_limits_accept_a_normal_bundle(bundle: Path) -> None:
    assert bundle.stat().st_size < Limits().floor_bytes  # the floor, not the ratio, decides for small bundles
    assert verify_bundle(bundle).runs == 8


def test_bomb_over_max_bytes_is_refused_before_it_is_inflated(bundle: Path, tmp_path: Path, capsys) -> None:
    bomb = forge(bundle, tmp_path / "bomb.tar.gz", {f"{TOP}/runs/zeros.bin": ZEROS})
    assert bomb.stat().st_size < bundle.stat().st_size + (16 << 10)  # 4 MiB more unpacked, < 16 KiB more packed
    line = refused(bomb, capsys, "--max-bytes", "1M")
    assert f"member '{TOP}/runs/zeros.bin' declares {len(ZEROS)} bytes" in line and "--max-bytes" in line


@pytest.mark.slow
def test_bomb_over_the_expansion_ratio_is_refused(bundle: Path, tmp_path: Path) -> None:
    bomb = forge(bundle, tmp_path / "bomb.tar.gz", {f"{TOP}/runs/zeros.bin": ZEROS})
    with pytest.raises(BundleRefused, match=r"over the limit of \d+ for a \d+-byte bundle \(ratio 10,"):
        verify_bundle(bomb, Limits(expand_ratio=10, floor_bytes=0))
    assert verify_bundle(bomb, Limits(expand_ratio=10_000, floor_bytes=0)).runs == 8  # checksums hold: only size


def test_bomb_larger_than_the_free_scratch_space_is_refused(bundle: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(verify.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 1 << 20})())
    bomb = forge(bundle, tmp_path / "bomb.tar.gz", {f"{TOP}/runs/zeros.bin": ZEROS})
    with pytest.raises(BundleRefused, match="bytes free in"):
        verify_bundle(bomb)


@pytest.mark.slow
def test_members_are_streamed_in_chunks_never_read_whole(bundle: Path, monkeypatch) -> None:
    sizes: list[int] = []
    original = tarfile.ExFileObject.read

    def recording(self, size=-1):  # type: ignore[no-untyped-def]
        sizes.append(size)
        return original(self, size)

    monkeypatch.setattr(tarfile.ExFileObject, "read", recording)
    verify_bundle(bundle)
    assert sizes and all(0 < size <= verify.CHUNK for size in sizes)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {f"{TOP}/runs/clash": b"{}", f"{TOP}/runs/clash/metrics.json": b"{}"},
            f"member '{TOP}/runs/clash' is a file, but member '{TOP}/runs/clash/metrics.json' is inside it",
        ),
        ({METRICS: b"[1, 2, 3]"}, f"member '{METRICS}' holds a JSON list, not an object"),
        ({METRICS: b"\xff\xfe{}"}, f"member '{METRICS}' is not UTF-8 JSON"),
        ({METRICS: b'{"model": "vgg11"}'}, "the raw records do not aggregate"),
        (
            {f"{TOP}/tables/summary.md": b"\x89PNG\r\n\x1a\n\x00\x00\xff"},
            f"member '{TOP}/tables/summary.md' is not UTF-8",
        ),
        ({f"{TOP}/tables/summary.md": b"# Results\n\x00\x00"}, f"member '{TOP}/tables/summary.md' is binary"),
        ({f"{TOP}/tables/runs.parquet": b"PAR1 garbage PAR1"}, f"'{TOP}/tables/runs.parquet' is not a readable"),
        (
            {f"{TOP}/runs/synthetic1k/vgg11/n2-1gbit/ps/r0/steps.parquet": b"garbage"},
            "steps.parquet' is not a readable",
        ),
    ],
    ids=[
        "file-and-folder",
        "json-list",
        "json-not-utf8",
        "record-lacks-keys",
        "md-not-utf8",
        "md-nul",
        "parquet-table",
        "parquet-steps",
    ],
)
def test_malformed_member_with_good_checksums_is_refused_naming_it(
    bundle: Path, tmp_path: Path, capsys, change: dict[str, bytes], message: str
) -> None:
    forged = forge(bundle, tmp_path / "forged.tar.gz", change)
    assert message in refused(forged, capsys)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results folder with one run record, and a file outside it."""
    root = tmp_path / "results"
    (root / "runs" / "a").mkdir(parents=True)
    (root / "runs" / "a" / "metrics.json").write_text("{}\n")
    (tmp_path / "secret.txt").write_text("host secret\n")
    return root


def bundle_cli(root: Path, *includes: Path | str) -> int:
    out = root.parent / "out.tar.gz"
    return cli(["bundle", "--root", str(root), "--include", *map(str, includes), "--out", str(out)])


@pytest.mark.parametrize("link", ["runs/a/hostname", "runs/b"])
def test_link_out_of_the_root_is_refused_naming_it(results: Path, capsys, link: str) -> None:
    target = results.parent / ("secret.txt" if link.endswith("hostname") else "")
    (results / link).symlink_to(target)
    assert bundle_cli(results, results / "runs") == 1
    err = capsys.readouterr().err
    assert f"ralp-pipe bundle: REFUSED: bundle input {results / link} is a symbolic link to" in err
    assert not (results.parent / "out.tar.gz").exists()


@pytest.mark.slow
def test_link_within_the_root_is_bundled_under_its_own_name(results: Path) -> None:
    (results / "runs" / "b").symlink_to(results / "runs" / "a")
    assert bundle_cli(results, results / "runs") == 0
    names = set(members(results.parent / "out.tar.gz"))
    assert {"out/runs/a/metrics.json", "out/runs/b/metrics.json"} <= names


def test_link_loop_is_refused(results: Path, capsys) -> None:
    (results / "runs" / "a" / "up").symlink_to(results / "runs")
    assert bundle_cli(results, results / "runs") == 1
    assert "a folder above it" in capsys.readouterr().err


@pytest.mark.parametrize("include", ["{root}/../secret.txt", "{root}/runs/../../secret.txt"])
def test_include_escaping_the_root_is_refused(results: Path, capsys, include: str) -> None:
    assert bundle_cli(results, include.format(root=results)) == 2
    assert "is not below the results folder" in capsys.readouterr().err
