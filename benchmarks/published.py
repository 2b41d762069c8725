"""Published clusters of several GPUs per host, predicted: images/sec and scaling efficiency beside the figures.

    python benchmarks/published.py [--data benchmarks/published_clusters.csv] [--record docs/records/published.json]

For every cluster, model and batch of the data file (TensorFlow's benchmark page of May 2017: one DGX-1 of
8 P100, hosts of 8 K80 dies, 1-8 such hosts with Distributed TensorFlow) it models the model on the row's
device (``ralp-pipe simulate --target``'s profile), prices the row's strategy on hosts of its GPUs with
its interconnect and link (the simulator's cost model, `dtf` with the shipped config/strategy/dtf.yaml but
the row's variable_update and PS tasks, colocated one per host), and prints per row the predicted and
published images/sec and scaling efficiency: throughput / (N x the same side's one-GPU figure). Then the
median and worst |error| of the efficiency, in points, overall and per cluster and strategy, each beside the
error of predicting perfect scaling (100%) for every row: the model has skill only where it beats that. A row whose device or model the checkout does not
have is left out with the reason printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from ralp_pipe.config import ConfigError, load
from ralp_pipe.contract.topology import hosts_of
from ralp_pipe.engine import devicemodel
from ralp_pipe.planning.batches import profile_batches
from ralp_pipe.planning.planner import dtf_options, pipelining_of, whole_variables
from ralp_pipe.planning.simulate import Grid, Servers, simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write_record  # noqa: E402

DATA = Path(__file__).with_name("published_clusters.csv")
IMAGE_SIZE = {"inception_v3": 299}  # the rest: 224 px, as tf_cnn_benchmarks ran them
ONE_HOST_LINK_GBIT = 10.0  # a one-host row crosses no network link; the Link object still needs a rate


def predicted(config: dict[str, Any], gpus: list[int]) -> dict[int, float]:
    """Predicted images/sec of one published configuration at every N of `gpus` (1 included)."""
    link = config["link_gbit"] if pd.notna(config["link_gbit"]) else ONE_HOST_LINK_GBIT
    overrides = [
        f"model={config['model']}",
        "dataset=synthetic1k",
        f"train.batch_size={config['batch']}",
        f"train.image_size={IMAGE_SIZE.get(config['model'], 224)}",
        f"cluster.gpus_per_node={config['gpus_per_node']}",
        f"interconnect={config['interconnect']}",
        "strategy=dtf",
    ]
    if isinstance(config["variable_update"], str):
        overrides.append(f"strategy.variable_update={config['variable_update']}")
    cfg = load(devicemodel.target_overrides(config["device"], overrides))
    profile = devicemodel.modelled_profile(cfg, profile_batches(cfg.train.batch_size, gpus), max(gpus))
    t = cfg.train
    units = devicemodel.unit_table(cfg.model.name, cfg.dataset.num_classes, t.image_size, cfg.model.dropout, t)
    variables = whole_variables(units, dtf_options(cfg))
    out: dict[int, float] = {}
    for n, num_ps in config["num_ps"].items():
        servers = Servers(num_ps, colocated=True, per_host=False, pipelining=pipelining_of(cfg))
        frame = simulate(
            profile, units, cfg.train.batch_size, Grid([n], [link], 0.0), servers, hosts_of(cfg), variables
        )
        strategy = config["strategy"]  # N = 1: the one-GPU reference, no communication
        out[n] = float(frame[frame.strategy == strategy].images_per_sec.iloc[0])
    return out


GROUPS = {  # the published clusters as the summary groups them
    "dgx1-p100": "DGX-1, 8 P100",
    "gce-k80x8": "one host of 8 K80 dies (GCE, EC2 p2.8xlarge)",
    "ec2-p2.8xlarge": "one host of 8 K80 dies (GCE, EC2 p2.8xlarge)",
    "ec2-p2.8xlarge-distributed": "1-8 p2.8xlarge hosts, Distributed TensorFlow",
}


def rows_of(data: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per published multi-GPU figure: predicted and published images/sec and scaling efficiency."""
    keys = ["cluster", "model", "batch", "device", "gpus_per_node", "interconnect", "link_gbit", "strategy"]
    rows: list[dict[str, Any]] = []
    for key, group in data.groupby(keys, dropna=False, sort=False):
        config = dict(zip(keys, key))
        config["variable_update"] = group.variable_update.iloc[0]
        config["num_ps"] = dict(zip(group.gpus, group.num_ps))
        try:
            prediction = predicted(config, sorted(group.gpus))
        except ConfigError as exc:
            print(f"| {config['cluster']} | {config['model']} | {config['batch']} | left out: {exc} |")
            continue
        published = dict(zip(group.gpus, group.images_per_sec))
        for n in sorted(published):
            if n == 1:
                continue
            rows.append(
                {
                    "cluster": config["cluster"],
                    "model": config["model"],
                    "batch": int(config["batch"]),
                    "strategy": config["strategy"],
                    "gpus": int(n),
                    "predicted_images_per_sec": prediction[n],
                    "published_images_per_sec": float(published[n]),
                    "predicted_efficiency_pct": 100 * prediction[n] / (n * prediction[1]),
                    "published_efficiency_pct": 100 * published[n] / (n * published[1]),
                }
            )
    return rows


def misses(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median and worst |error| of the scaling efficiency, in points: the model's, and predicting 100% for every
    row (perfect scaling, the skill baseline)."""
    model = [abs(r["predicted_efficiency_pct"] - r["published_efficiency_pct"]) for r in rows]
    perfect = [abs(100 - r["published_efficiency_pct"]) for r in rows]
    return {
        "rows": len(rows),
        "model_median": statistics.median(model),
        "model_worst": max(model),
        "perfect_median": statistics.median(perfect),
        "perfect_worst": max(perfect),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="published figures (CSV; see its header)")
    parser.add_argument("--record", type=Path, help="also write the rows and their misses as a docs record (JSON)")
    args = parser.parse_args()
    print(
        "| cluster | model | batch | strategy | N | predicted img/s | published img/s | predicted eff. | published eff. |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    rows = rows_of(pd.read_csv(args.data, comment="#"))
    for r in rows:
        print(
            f"| {r['cluster']} | {r['model']} | {r['batch']} | {r['strategy']} | {r['gpus']} | "
            f"{r['predicted_images_per_sec']:,.0f} | {r['published_images_per_sec']:,.0f} | "
            f"{r['predicted_efficiency_pct']:.1f}% | {r['published_efficiency_pct']:.1f}% |"
        )
    if not rows:
        return
    overall = misses(rows)
    print(
        f"\nscaling efficiency, |predicted - published| over {overall['rows']} rows: median "
        f"{overall['model_median']:.1f} points, worst {overall['model_worst']:.1f}; predicting perfect scaling "
        f"(100%) for every row: median {overall['perfect_median']:.1f}, worst {overall['perfect_worst']:.1f}"
    )
    groups = []
    frame = pd.DataFrame(rows).assign(group=lambda f: f.cluster.map(lambda c: GROUPS.get(c, c)))
    for (group, strategy), part in frame.groupby(["group", "strategy"], sort=False):
        g = {"cluster": group, "strategy": strategy, **misses(part.to_dict("records"))}
        groups.append(g)
        print(
            f"  {group}, {strategy}: {g['rows']} rows, model {g['model_median']:.1f} / {g['model_worst']:.1f}, "
            f"perfect scaling {g['perfect_median']:.1f} / {g['perfect_worst']:.1f} (median / worst points)"
        )
    if args.record:
        write_record(args.record, {"overall": overall, "groups": groups, "rows": rows})


if __name__ == "__main__":
    main()
