"""`ralp-pipe compare A B`: the change in images/sec of every configuration from A to B, told apart from noise.

A and B are bundles (``.tar.gz`` written by `ralp-pipe bundle`), results folders (holding
``tables/runs.parquet``) or tables folders (holding ``runs.parquet``). A bundle is checked as
`ralp-pipe verify` checks it (member names and kinds, sizes, checksums, contents, and its tables
recomputed from its raw records) and one that verify refuses is not compared; only its plots, which
compare does not read, are not redrawn. A folder carries no checksums: the output says so for each
side. Configurations are joined
on model, dataset, N, network and strategy row (a ``-sequential`` row is its own configuration).
Images/sec are the tables' first figure, the target's: target-equivalent where a configuration was
time-dilated (the emulator's wall clock x D, which may differ between A and B), measured where not; a
runs table written before that column order has its target-equivalent figures taken for its dilated rows
(:func:`target_first`). Per configuration the change is B's mean images/sec over A's, minus 1, with a 95% delta-method
interval over both sets of repeats (:func:`~ralp_pipe.results.intervals.ratio_interval`). A change
is *beyond noise* when each mean lies outside the other's 95% t-interval, i.e. the difference is
larger than the noise of A and larger than the noise of B; with a single repeat on either side
there is no interval and no change is called beyond noise. The exit status is 1 when any
configuration slowed down beyond noise, else 0. A RALP configuration whose split differs between
A and B (each side's planner chose from its own profile) is still joined, and the table names
both splits: its change includes the other placement.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ralp_pipe.contract.layout import PATHS, RUNS_TABLE
from ralp_pipe.errors import BundleRefused, ConfigError, DataError
from ralp_pipe.results.intervals import Estimate, ratio_interval
from ralp_pipe.results.tables import CONFIGURATION
from ralp_pipe.results.verify import verify_bundle

NEEDED = ("repeats", "images_per_sec", "images_per_sec_std", "images_per_sec_ci_low", "images_per_sec_ci_high")
PLACEMENT = ("split", "split_unit")  # RALP's split point and its unit's name (null for ps and allreduce)
REGRESSED, IMPROVED, WITHIN, NO_INTERVAL, ONLY_A, ONLY_B = (
    "REGRESSION",
    "improvement",
    "within noise",
    "no interval (1 repeat)",
    "only in A",
    "only in B",
)


@dataclass
class Comparison:
    """The joined configurations with their change and verdict, and whether any regressed beyond noise."""

    table: pd.DataFrame
    regressions: int


def _from_bundle(path: Path) -> pd.DataFrame:
    """The runs table of a bundle that holds as `ralp-pipe verify` checks it (but for its plots, unread here)."""
    try:
        return verify_bundle(path, redraw=False).tables.runs
    except BundleRefused as exc:
        raise DataError(
            f"bundle {path} is refused, as `ralp-pipe verify` refuses it: {exc}; nothing was compared"
        ) from None


def provenance(path: Path) -> str:
    """What was checked of input `path`: a bundle all but its plots, a folder nothing (it has no checksums)."""
    if path.is_file():
        return "bundle: checked as `ralp-pipe verify` does, but for its plots"
    return "folder: NOT checksum-verified, a folder has no checksums; `ralp-pipe verify` checks a bundle of it"


def _parquet(source: Any, name: str) -> pd.DataFrame:
    try:
        return pd.read_parquet(source)
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read runs table {name}: {exc}") from exc


def read_runs(path: Path) -> pd.DataFrame:
    """The runs table (one row per configuration) of a bundle, a results folder or a tables folder."""
    if path.is_file():
        frame, name = _from_bundle(path), str(path)
    else:
        candidates = [path / PATHS["tables"] / RUNS_TABLE, path / RUNS_TABLE]
        table = next((c for c in candidates if c.is_file()), None)
        if table is None:
            raise ConfigError(
                f"{path} is neither a bundle nor a folder with {candidates[0].relative_to(path)} or {RUNS_TABLE}: "
                f"pass a bundle (.tar.gz) or a results folder after `ralp-pipe aggregate`"
            )
        frame, name = _parquet(table, str(table)), str(table)
    missing = [c for c in (*CONFIGURATION, *NEEDED) if c not in frame.columns]
    if missing:
        raise DataError(
            f"runs table of {name} lacks column {', '.join(missing)}: it predates repeats; "
            f"re-run `ralp-pipe aggregate` on its records"
        )
    frame = target_first(frame)
    _check_values(frame, name)
    return frame


def target_first(frame: pd.DataFrame) -> pd.DataFrame:
    """A runs table with `images_per_sec` the target's: as it is where the table already leads with it (it has
    `emulator_images_per_sec`); in an older table, whose `images_per_sec` was the emulator's wall clock, a dilated
    row's `target_images_per_sec` and interval, its standard deviation scaled by D (one D per configuration)."""
    if "emulator_images_per_sec" in frame.columns or "target_images_per_sec" not in frame.columns:
        return frame
    dilated = frame["dilation_factor"].notna()
    target = {
        "images_per_sec": frame["target_images_per_sec"],
        "images_per_sec_ci_low": frame["target_images_per_sec_ci_low"],
        "images_per_sec_ci_high": frame["target_images_per_sec_ci_high"],
        "images_per_sec_std": frame["images_per_sec_std"] * frame["dilation_factor"],
    }
    return frame.assign(**{column: values.where(dilated, frame[column]) for column, values in target.items()})


def _check_values(frame: pd.DataFrame, name: str) -> None:
    """Refuse a row whose repeats is not a whole number of at least 1, or whose images/sec is not finite."""
    repeats = pd.to_numeric(frame["repeats"], errors="coerce")
    rate = pd.to_numeric(frame["images_per_sec"], errors="coerce")
    usable = (repeats >= 1) & (repeats % 1 == 0) & rate.abs().lt(math.inf)  # NaN compares False
    if usable.all():
        return
    row = frame[~usable].iloc[0]
    where = ", ".join(f"{key}={row[key]}" for key in CONFIGURATION)
    raise DataError(
        f"runs table of {name}: the row {where} has repeats={row['repeats']!r} and "
        f"images_per_sec={row['images_per_sec']!r} (repeats must be a whole number >= 1, images_per_sec finite): "
        f"the table is damaged; re-run `ralp-pipe aggregate` on its records"
    )


def verdict(a: Estimate, b: Estimate) -> str:
    """Whether B's mean differs from A's beyond the noise of both (each mean outside the other's interval)."""
    if math.isnan(a.half_width) or math.isnan(b.half_width):
        return NO_INTERVAL
    difference = b.mean - a.mean
    if abs(difference) <= max(a.half_width, b.half_width):
        return WITHIN
    return IMPROVED if difference > 0 else REGRESSED


def compare(a: pd.DataFrame, b: pd.DataFrame) -> Comparison:
    """Join two runs tables by configuration; per row A's and B's images/sec, the change and its verdict."""
    columns = [*CONFIGURATION, *NEEDED, *PLACEMENT]
    joined = _placed(a)[columns].merge(
        _placed(b)[columns], on=CONFIGURATION, how="outer", suffixes=("_a", "_b"), indicator="side"
    )
    rows = []
    for row in joined.itertuples(index=False):
        configuration = {key: getattr(row, key) for key in CONFIGURATION}
        if row.side != "both":
            only = ONLY_A if row.side == "left_only" else ONLY_B
            rows.append({**configuration, "verdict": only})
            continue
        pick = {side: _side(row, side) for side in ("a", "b")}
        change = ratio_interval(pick["b"], pick["a"])
        rows.append(
            {
                **configuration,
                "images_per_sec_a": pick["a"].mean,
                "half_width_a": pick["a"].half_width,
                "repeats_a": pick["a"].count,
                "images_per_sec_b": pick["b"].mean,
                "half_width_b": pick["b"].half_width,
                "repeats_b": pick["b"].count,
                "change": change.mean - 1.0,
                "change_half_width": change.half_width,
                "verdict": verdict(pick["a"], pick["b"]),
                "split_change": _split_change(row),
            }
        )
    table = pd.DataFrame(rows).sort_values(CONFIGURATION).reset_index(drop=True)
    return Comparison(table, int((table["verdict"] == REGRESSED).sum()))


def _placed(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with the placement columns (empty where a table from before them lacks them)."""
    return frame.assign(**{c: frame[c] if c in frame.columns else pd.NA for c in PLACEMENT})


def _split_name(row: Any, side: str) -> str:
    """One side's split as its unit's name and index ("-" without a split)."""
    index, unit = getattr(row, f"split_{side}"), getattr(row, f"split_unit_{side}")
    if pd.isna(index):
        return "-"
    return f"{unit} ({int(index)})" if not pd.isna(unit) else str(int(index))


def _split_change(row: Any) -> str | None:
    """ "A's split -> B's" where the two sides placed the layers differently, else None."""
    before, after = _split_name(row, "a"), _split_name(row, "b")
    return None if before == after else f"{before} -> {after}"


def _side(row: Any, side: str) -> Estimate:
    """A's or B's mean images/sec of a joined row, with its standard deviation, repeats and interval half-width."""

    def value(name: str) -> float:
        return float(getattr(row, f"{name}_{side}"))

    half = (value("images_per_sec_ci_high") - value("images_per_sec_ci_low")) / 2
    df = float(getattr(row, f"images_per_sec_df_{side}", math.nan))  # pooled spread's (tables without it: k - 1)
    return Estimate(value("images_per_sec"), value("images_per_sec_std"), int(value("repeats")), half, df)


def _number(value: Any, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _pm(mean: float, half: float, digits: int = 1, scale: float = 1.0, suffix: str = "") -> str:
    if isinstance(mean, float) and math.isnan(mean):
        return "-"
    text = f"{mean * scale:+.{digits}f}" if suffix == "%" else _number(mean * scale, digits)
    return text + ("" if math.isnan(half) else f" ± {_number(half * scale, digits)}") + suffix


def render(comparison: Comparison, a: str, b: str) -> str:
    """The comparison as a text table, one line per configuration, and a closing verdict."""
    table = comparison.table
    header = ["model", "dataset", "N", "network", "strategy", "A img/s", "B img/s", "change", "verdict", "split A -> B"]
    lines = [f"A: {a}", f"B: {b}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in table.itertuples(index=False):
        present = r.verdict not in (ONLY_A, ONLY_B)
        cells = [r.model, r.dataset, str(r.gpus), r.network, r.strategy]
        cells += (
            [
                f"{_pm(r.images_per_sec_a, r.half_width_a)} (k={r.repeats_a})",
                f"{_pm(r.images_per_sec_b, r.half_width_b)} (k={r.repeats_b})",
                _pm(r.change, r.change_half_width, 1, 100.0, "%"),
            ]
            if present
            else ["-", "-", "-"]
        )
        moved = getattr(r, "split_change", None)
        lines.append("| " + " | ".join([*cells, r.verdict, "same" if not isinstance(moved, str) else moved]) + " |")
    counts = table["verdict"].value_counts()
    summary = ", ".join(f"{int(n)} {name}" for name, n in counts.items())
    lines += [
        "",
        f"{len(table)} configurations: {summary}. Images/sec: the target's (target-equivalent where dilated). "
        "Intervals: 95% (t over repeats, their spread pooled over configurations; the change by the delta method); beyond noise = each mean outside the "
        "other's interval.",
    ]
    moved = int(table["split_change"].notna().sum()) if "split_change" in table.columns else 0
    if moved:
        lines.append(
            f"{moved} configuration{'s' * (moved > 1)} ran with another split in B (each side's planner chose "
            f"from its own profile): {'their changes include' if moved > 1 else 'its change includes'} the other placement."
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe compare`."""
    parser.add_argument("a", type=Path, help="the reference: a bundle (.tar.gz), a results folder or a tables folder")
    parser.add_argument("b", type=Path, help="the one compared with it (same kinds)")


def main(args: argparse.Namespace) -> int:
    """Print the comparison; exit 1 when a configuration regressed beyond noise."""
    if args.overrides:
        raise ConfigError(f"compare takes two paths, not overrides: {' '.join(args.overrides)}")
    comparison = compare(read_runs(args.a), read_runs(args.b))
    print(render(comparison, f"{args.a} ({provenance(args.a)})", f"{args.b} ({provenance(args.b)})"))
    return 1 if comparison.regressions else 0
