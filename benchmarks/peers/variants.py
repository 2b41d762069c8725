"""The planner's `dtf` under variants of its structure, beside a peers record's real TensorFlow: which loss term
closes which gap, without running anything but the profile and the plan.

``python benchmarks/peers --variant NAME=KEY=VALUE[,KEY=VALUE...] ... --against docs/records/peers-dtf.json``
prices every setting of ``--models``/``--hosts``/``--rates`` once per variant (its overrides replacing the
harness's `dtf` ones of the same keys) from one CPU profile per setting, and writes ``variants.json`` with,
per setting and variant, the predicted images/sec and its ratio to the record's mean TensorFlow figure. The
planner predicts ralp-pipe's own `dtf` within 2% in that record, so a variant that reaches TensorFlow there
names what `dtf` would have to do alike.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

from peers.harness import Setting, predict


def parse(given: Sequence[str]) -> dict[str, list[str]]:
    """``NAME=KEY=VALUE,KEY=VALUE`` arguments as {name: overrides} (``NAME=`` alone: no override)."""
    variants = {}
    for item in given:
        name, sep, overrides = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--variant {item!r}: give NAME=KEY=VALUE[,KEY=VALUE...] (or NAME= for none)")
        variants[name] = [o for o in overrides.split(",") if o]
    return variants


def peer_means(path: Path) -> dict[tuple[str, int, str], float]:
    """Mean TensorFlow images/sec per (model, hosts, rate) of a peers record's summary."""
    summary = json.loads(path.read_text())["figures"]["summary"]
    return {(r["model"], r["hosts"], r["rate"]): r["peer_images_per_sec"] for r in summary if r["peer"] == "tf_ps"}


def run(settings: Sequence[Setting], variants: dict[str, list[str]], against: Path, out: Path) -> list[dict[str, Any]]:
    """Each setting's `dtf` prediction under each variant, beside `against`'s TensorFlow (rows as printed)."""
    peers = peer_means(against)
    rows = []
    for setting in settings:
        tf = peers.get((setting.model, setting.hosts, setting.rate))
        for name, overrides in variants.items():
            keys = {o.partition("=")[0] for o in overrides}
            kept = [o for o in setting.dtf if o.partition("=")[0] not in keys]  # a variant's key replaces the harness's
            varied = dataclasses.replace(setting, dtf=(*kept, *overrides))
            predicted = predict(varied, out / setting.label)["dtf"]
            rows.append(
                {
                    "model": setting.model,
                    "hosts": setting.hosts,
                    "rate": setting.rate,
                    "variant": name,
                    "overrides": list(overrides),
                    "predicted_images_per_sec": predicted,
                    "tf_images_per_sec": tf,
                    "predicted_over_tf": None if tf is None else predicted / tf,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table: one line per setting, one column per variant (predicted / TensorFlow)."""
    names = list(dict.fromkeys(r["variant"] for r in rows))
    lines = ["| setting | TF img/s | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for key in dict.fromkeys((r["model"], r["hosts"], r["rate"]) for r in rows):
        mine = {r["variant"]: r for r in rows if (r["model"], r["hosts"], r["rate"]) == key}
        tf = next(iter(mine.values()))["tf_images_per_sec"]
        cells = [f"{mine[n]['predicted_over_tf']:.2f}" if mine[n]["predicted_over_tf"] else "-" for n in names]
        lines.append(f"| {key[0]} N = {key[1]}, {key[2]} | {tf:.3g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
