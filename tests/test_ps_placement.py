"""Colocated parameter servers on the emulated cluster: PS rank i shares worker i's namespace and link."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.train import train_metrics

pytestmark = [pytest.mark.netns, pytest.mark.slow]  # one 4-rank emulated training run (~15 s)


def test_colocated_ps_ranks_share_their_workers_hosts_and_only_remote_shards_cross_the_links(tmp_path: Path) -> None:
    out = tmp_path / "run"
    overrides = [
        "cluster=emulated",
        "network=1gbit",
        "model=resnet18",
        "strategy=ps",
        "strategy.num_ps=2",
        "strategy.ps_placement=colocated",
        "cluster.gpus=2",
        "dataset.num_classes=10",
        "train.batch_size=2",
        "train.image_size=32",
        "train.warmup_steps=1",
        "train.measure_steps=2",
        "train.loader=synthetic",
    ]
    metrics = train_metrics(out, overrides)
    assert metrics["world_size"] == 4 and sorted(metrics["wire_per_host"]) == ["h0", "h1"]
    counted = metrics["gb_per_step"]["total"]
    assert counted == pytest.approx(metrics["analytic_gb_per_step"]["total"], rel=1e-9)
    # each PS has one local worker, whose push and pull stay on the host: (W-1)/W = 1/2 of the
    # counted bytes cross a link, plus TCP/IP headers (under 5% at these message sizes)
    crossing = counted / 2
    assert crossing <= metrics["wire_gb_per_step"] <= 1.05 * crossing, (counted, metrics["wire_gb_per_step"])
    for link in metrics["wire_per_host"].values():  # both links carry the same half, each direction
        assert link["tx"] == pytest.approx(crossing / 2, rel=0.05) and link["rx"] == pytest.approx(
            crossing / 2, rel=0.05
        )
