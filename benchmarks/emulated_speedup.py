"""RALP vs PS on the emulated 1 Gbit/s cluster, and two PS jobs sharing one PS host link.

Targets: VGG-11 / 21841 classes, N=4: ralp_n >= 3x ps images/sec and >= 10x fewer GB/step;
ResNet-50 / 1000 classes: speedup near 1; each of two concurrent ps jobs slower than alone.
Every figure comes from real `ralp-pipe train` / `ralp-pipe concurrent` runs (gloo over the
emulated network, 1 warm-up + 2 measured steps by default). Run:
`python benchmarks/emulated_speedup.py [--steps 2] [--out DIR]`. Mind memory: VGG-11 with
21841 classes is 218M parameters per copy, 5 processes for ps with N=4.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import emulated_recipe  # noqa: E402
from runs import train as train_run


def train(out: Path, overrides: list[str]) -> tuple[float, float, float]:
    """One run's images/sec, counted GB/step and wire GB/step."""
    metrics = train_run(out, overrides)
    return float(metrics["images_per_sec"]), float(metrics["gb_per_step"]["total"]), float(metrics["wire_gb_per_step"])


def main() -> int:
    """Measure both models with ps and ralp_n, then the concurrent pair; print side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="measured steps per run (after 1 warm-up)")
    parser.add_argument("--out", type=Path, default=None, help="keep run folders here (default: temporary)")
    args = parser.parse_args()
    common = emulated_recipe("1gbit", args.steps)
    ok = True
    with tempfile.TemporaryDirectory(prefix="ralp-speedup-") as tmp:
        root = args.out or Path(tmp)
        print(
            f"{'model':<10} {'classes':>7} {'ps img/s':>9} {'ralp_n img/s':>13} {'speedup':>8} "
            f"{'ps GB/step':>11} {'ralp_n GB/step':>15} {'GB ratio':>9} {'wire GB/step ps':>16}"
        )
        for model, dataset, check in (("vgg11", "synthetic22k", True), ("resnet50", "synthetic1k", False)):
            ps = train(root / f"{model}-ps", [*common, f"model={model}", f"dataset={dataset}", "strategy=ps"])
            ralp = train(root / f"{model}-ralp_n", [*common, f"model={model}", f"dataset={dataset}", "strategy=ralp_n"])
            speedup, ratio = ralp[0] / ps[0], ps[1] / ralp[1]
            print(
                f"{model:<10} {dataset[9:]:>7} {ps[0]:9.2f} {ralp[0]:13.2f} {speedup:8.2f} {ps[1]:11.4f} "
                f"{ralp[1]:15.4f} {ratio:9.1f} {ps[2]:16.4f}"
            )
            if check:
                ok &= speedup >= 3 and ratio >= 10
        job = "model=vgg11 dataset=synthetic1k strategy=ps cluster.gpus=2"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "ralp_pipe.cli",
                "concurrent",
                "--out",
                str(root / "concurrent"),
                "--job",
                job,
                "--job",
                job,
                *(o for o in common if not o.startswith("cluster.gpus")),
            ],
            check=True,
        )
        summary = json.loads((root / "concurrent" / "concurrent.json").read_text())
        for entry in summary["jobs"]:
            print(
                f"concurrent job {entry['job']}: alone {entry['alone_images_per_sec']:.2f} img/s, together "
                f"{entry['together_images_per_sec']:.2f} img/s, slowdown {entry['slowdown']:.2f}x"
            )
            ok &= entry["slowdown"] > 1.2
    print("targets met" if ok else "targets NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
