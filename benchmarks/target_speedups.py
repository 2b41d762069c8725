"""The paper's evaluation, predicted for a target GPU: RALP's speedup over `byteps` and over `allreduce`.

    python benchmarks/target_speedups.py [--target v100] [--gpus 4 8 16] [--link-gbit 1 10 25]

For VGG-16/22K, VGG-11/1K and ResNet-50/1K and /22K at batch 32 and 224 px it models each model on the
target (``ralp-pipe profile --target``'s profile), prices every strategy with the simulator's cost model
(the best split of each RALP variant; `byteps`: the partitioned PS with one server colocated on every worker
host, as BytePS and Distributed TensorFlow are deployed at scale) and prints a Markdown table of RALP-N's and RALP-H's speedups.
These are predictions of the cost model, not measurements.
"""

from __future__ import annotations

import argparse

from ralp_pipe.config import load
from ralp_pipe.engine import devicemodel, models
from ralp_pipe.planning.profiling import profile_batches
from ralp_pipe.planning.simulate import Grid, simulate

PAIRS = (
    ("vgg16", "synthetic22k"),
    ("vgg11", "synthetic1k"),
    ("resnet50", "synthetic1k"),
    ("resnet50", "synthetic22k"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="v100")
    parser.add_argument("--gpus", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--link-gbit", type=float, nargs="+", default=[1.0, 10.0, 25.0])
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    rows = []
    for model, dataset in PAIRS:
        overrides = [f"model={model}", f"dataset={dataset}", f"train.batch_size={args.batch}", "train.image_size=224"]
        cfg = load(devicemodel.target_overrides(args.target, overrides))
        profile = devicemodel.modelled_profile(cfg, profile_batches(args.batch, args.gpus), max(args.gpus))
        units = models.model_units(model, cfg.dataset.num_classes, cfg.model.dropout)
        frame = simulate(profile, units, args.batch, Grid(args.gpus, args.link_gbit))
        for (n, gbit), point in frame.groupby(["gpus", "link_gbit"]):
            rate = point.set_index("strategy").images_per_sec
            rows.append(
                f"| {model}/{'22K' if cfg.dataset.num_classes > 20000 else '1K'} | {n} | {gbit:g} | "
                + " | ".join(
                    f"{rate[s] / rate[base]:.2f}" for s in ("ralp_n", "ralp_h") for base in ("byteps", "allreduce")
                )
                + f" | {rate.idxmax()} |"
            )
    print(f"Predicted for {devicemodel.describe(cfg.device)}, batch {args.batch} per worker, 224 px (modelled):\n")
    print(
        "| model/classes | N | Gbit/s | RALP-N / byteps | RALP-N / allreduce | RALP-H / byteps | RALP-H / allreduce "
        "| fastest |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
