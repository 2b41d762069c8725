"""`ralp-pipe compare` given hostile bundles: each is refused as `ralp-pipe verify` refuses it, in one line naming
the bundle and the member, and nothing is compared or written; a good bundle still compares, and each side says
what was checked of it."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Callable

import pytest

from conftest import Ran
from ralp_pipe.cli import main as cli
from support.bundles import forge, members

TOP = "smoke-0123"
METRICS = f"{TOP}/runs/synthetic1k/vgg11/n2-1gbit/ralp_n/r0/metrics.json"
CHECKED = "bundle: checked as `ralp-pipe verify` does, but for its plots"


def with_link(source: Path, target: Path, name: str, to: str) -> Path:
    """Copy bundle `source` to `target` with a symbolic link member `name` pointing at `to` added."""
    with tarfile.open(source) as old, tarfile.open(target, "w:gz") as new:
        for member in old.getmembers():
            new.addfile(member, old.extractfile(member) if member.isfile() else None)
        link = tarfile.TarInfo(name)
        link.type, link.linkname = tarfile.SYMTYPE, to
        new.addfile(link)
    return target


def forged_numbers(bundle: Path, target: Path) -> Path:
    """A copy whose run claims twice its images/sec, with SHA256SUMS rewritten to match, as a careful forger would."""
    record = json.loads(members(bundle)[METRICS])
    record["images_per_sec"] *= 2
    return forge(bundle, target, {METRICS: json.dumps(record).encode()})


HOSTILE: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "climbs-out": (
        lambda b, t: forge(b, t, {f"{TOP}/../evil.json": b"{}"}),
        f"member '{TOP}/../evil.json' leaves the bundle folder",
    ),
    "absolute": (lambda b, t: forge(b, t, {"/tmp/evil.json": b"{}"}), "member '/tmp/evil.json' has an absolute"),
    "link": (
        lambda b, t: with_link(b, t, f"{TOP}/runs/evil", "/etc/passwd"),
        f"member '{TOP}/runs/evil' is a link (to '/etc/passwd')",
    ),
    "checksum": (
        lambda b, t: forge(b, t, {METRICS: b'{"images_per_sec": 1e9}'}, checksums=False),
        f"bundle checksums do not hold: {METRICS}: checksum mismatch",
    ),
    "forged-numbers": (forged_numbers, "metrics.json records images_per_sec="),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", HOSTILE)
def test_a_bundle_verify_refuses_is_refused_by_compare_in_one_line_and_nothing_is_written(
    bundle: Path, tmp_path: Path, ralp_pipe: Callable[..., Ran], kind: str
) -> None:
    make, reason = HOSTILE[kind]
    hostile = make(bundle, tmp_path / "hostile.tar.gz")
    before = sorted(tmp_path.rglob("*"))
    verified = ralp_pipe("verify", str(hostile))
    assert verified.returncode == 1 and reason in verified.stderr, verified.stderr  # verify refuses it for this
    proc = ralp_pipe("compare", str(bundle), str(hostile))
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(
        f"ralp-pipe compare: data error: bundle {hostile} is refused, as `ralp-pipe verify` refuses it: "
    ), lines[0]
    assert reason in lines[0] and lines[0].endswith("; nothing was compared"), lines[0]
    assert proc.stdout == "", "something was compared"
    assert sorted(tmp_path.rglob("*")) == before and not (tmp_path.parent / "evil.json").exists()


@pytest.mark.slow
def test_a_good_bundle_compares_saying_what_was_checked_of_each_side(
    bundle: Path, ralp_pipe: Callable[..., Ran]
) -> None:
    proc = ralp_pipe("compare", str(bundle), str(bundle))
    assert proc.returncode == 0, proc.stderr
    assert f"A: {bundle} ({CHECKED})" in proc.stdout and f"B: {bundle} ({CHECKED})" in proc.stdout
    assert "8 configurations" in proc.stdout


def test_a_results_folder_is_compared_saying_it_was_not_checksum_verified(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = bundle.parents[1]
    assert cli(["compare", str(bundle), str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"A: {bundle} ({CHECKED})" in out
    assert f"B: {folder} (folder: NOT checksum-verified, a folder has no checksums; " in out
