"""Real TensorFlow PS / PyTorch DDP beside ralp-pipe's `dtf` / `allreduce` and the planner, on emulated links.

    python benchmarks/peers --models alexnet --hosts 2 4 --rates 200mbit 1gbit --repeats 2 \
        --peers tf_ps ddp --batch 8 --size 224 --steps 3 --out results/peers

For every model, N and rate it profiles and plans the configuration once (the prediction), then runs,
repeat by repeat, each peer and the ralp-pipe strategy beside it, one after the other (so the
shared machine's drift hits both alike). Writes ``peers.parquet`` (one row per peer run with the
ralp-pipe run beside it), ``peers.md`` (means with 95% t-intervals over the repeats) and
``peers.json`` (the command, the git revision and the rows) into ``--out``. ``--no-ours`` and
``--no-prediction`` run the peers alone (the test's loopback check). Exits 1 if a peer's loss is not
finite. `dtf` runs with this machine's measured gRPC cap and TF PS costs (``--transport-cap``,
``--ps-cpu-costs``: the records under docs/records by default).

Instead of training: ``--transport RATE...`` measures gRPC against a TCP stream (transport.py), ``--ps-cpu`` a TF
PS task's CPU per byte and per tensor (ps_cpu.py), and ``--variant NAME=OVERRIDES ... --against RECORD`` prices
`dtf` under variants beside a record's TensorFlow (variants.py).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: `peers` as a package

import pandas as pd  # noqa: E402

from peers import ps_cpu, transport, variants  # noqa: E402
from peers.harness import PEERS, Setting, predict, record, run_ours, run_peer  # noqa: E402
from ralp_pipe.results.intervals import mean_interval  # noqa: E402
from ralp_pipe.runtime.hardware import threads_per_rank  # noqa: E402
from record import record_of, revision, write_record  # noqa: E402

RECORDS = Path(__file__).resolve().parents[2] / "docs" / "records"
TRANSPORT_RECORD, PS_CPU_RECORD = RECORDS / "peers-transport.json", RECORDS / "peers-ps-cpu.json"


def transport_cap(given: str) -> list[str]:
    """The cap `dtf` runs with (``--transport-cap``), as overrides: a rate as given, none for the shipped one,
    else a record's."""
    if given == "shipped":
        return []
    path = Path(given)
    if not path.exists():
        return [f"strategy.transport_cap={given}"]  # a rate; ralp-pipe refuses a bad one naming the key
    cap = transport.cap_of_record(path)
    print(f"dtf runs with strategy.transport_cap={cap}, gRPC's median cap in {path}", flush=True)
    return [f"strategy.transport_cap={cap}"]


def ps_cpu_costs(given: str) -> list[str]:
    """A TF PS task's CPU costs `dtf` runs with (``--ps-cpu-costs``): none for the shipped ones, else a record's."""
    if given == "shipped":
        return []
    overrides = ps_cpu.overrides_of_record(Path(given))
    print(f"dtf runs with {' '.join(overrides)}, a TF PS task's costs in {given}", flush=True)
    return overrides


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per setting and peer: means and 95% half-widths over the repeats, ratios of the means."""
    keys = ["model", "hosts", "rate", "batch", "image_size", "peer", "strategy"]
    out = []
    for key, group in rows.groupby(keys, sort=False):
        row = dict(zip(keys, key))
        row["repeats"] = len(group)
        for column in ("peer_images_per_sec", "ours_images_per_sec"):
            values = group[column].dropna().tolist()
            estimate = mean_interval(values) if values else None
            row[column] = estimate.mean if estimate else math.nan
            row[column.replace("images_per_sec", "half_width")] = estimate.half_width if estimate else math.nan
        row["paired_ours_over_peer"] = [round(v, 3) for v in group.ours_over_peer]  # run beside run, per repeat
        row["predicted_images_per_sec"] = group.predicted_images_per_sec.iloc[0]
        row["ours_over_peer"] = row["ours_images_per_sec"] / row["peer_images_per_sec"]
        row["predicted_over_peer"] = row["predicted_images_per_sec"] / row["peer_images_per_sec"]
        for column in ("peer_busiest_tx_mb", "peer_busiest_rx_mb", "ours_busiest_tx_mb", "ours_busiest_rx_mb"):
            row[column] = group[column].mean()
        out.append(row)
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame) -> str:
    """The summary as a Markdown table."""

    def figure(mean: float, half: float) -> str:
        if math.isnan(mean):
            return "-"
        return f"{mean:.3g} ± {half:.2g}" if not math.isnan(half) else f"{mean:.3g}"

    def _span(values: list[float]) -> str:
        finite = [v for v in values if math.isfinite(v)]
        return f"{min(finite):.2f}-{max(finite):.2f}" if finite else "-"

    lines = [
        "| model | N | rate | peer | ralp-pipe | peer img/s | ralp-pipe img/s | predicted img/s | ours / peer (runs) "
        "| predicted / peer | busiest link MB/step up, down: peer | ralp-pipe |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.model} {r.image_size} px b{r.batch} | {r.hosts} | {r.rate} | {r.peer} | {r.strategy} "
            f"| {figure(r.peer_images_per_sec, r.peer_half_width)} | {figure(r.ours_images_per_sec, r.ours_half_width)} "
            f"| {r.predicted_images_per_sec:.3g} | {r.ours_over_peer:.2f} ({_span(r.paired_ours_over_peer)}) "
            f"| {r.predicted_over_peer:.2f} "
            f"| {r.peer_busiest_tx_mb:.0f}, {r.peer_busiest_rx_mb:.0f} | {r.ours_busiest_tx_mb:.0f}, {r.ours_busiest_rx_mb:.0f} |"
        )
    return "\n".join(lines) + "\n"


def write(frame: pd.DataFrame, command: str, out: Path) -> pd.DataFrame:
    """peers.parquet (the runs), peers.md (the summary) and peers.json (a record of both) into `out`."""
    frame.to_parquet(out / "peers.parquet", index=False)
    table = summary(frame)
    (out / "peers.md").write_text(f"`{command}` at {revision()}\n\n" + markdown(table))
    figures = {"runs": frame.to_dict(orient="records"), "summary": table.to_dict(orient="records")}
    note = "One row per peer run with the ralp-pipe run beside it (runs) and means with 95% t half-widths (summary)."
    (out / "peers.json").write_text(json.dumps(record_of(figures, note, command), indent=1, default=str) + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    """Run the harness with `argv`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["alexnet"])
    parser.add_argument("--hosts", nargs="+", type=int, default=[2])
    parser.add_argument("--rates", nargs="+", default=["1gbit"], help="tc rates per host link, or unlimited")
    parser.add_argument("--peers", nargs="+", choices=sorted(PEERS), default=["tf_ps", "ddp"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-ours", action="store_true", help="run the peers only")
    parser.add_argument("--no-prediction", action="store_true", help="skip profile and plan")
    parser.add_argument(
        "--transport",
        nargs="+",
        metavar="RATE",
        help="instead: TensorFlow's gRPC transfer rate between two hosts at each RATE (or unlimited), into transport.json",
    )
    parser.add_argument("--transport-mb", type=float, default=100.0, help="the tensor the transport benchmark copies")
    parser.add_argument(
        "--ps-cpu",
        action="store_true",
        help="instead: a PS task's CPU seconds per byte (ApplyMomentum, ApplyGradientDescent, AddN) and per tensor "
        "(RecvTensor over gRPC) in TensorFlow, into ps_cpu.json",
    )
    parser.add_argument("--ps-cpu-sizes", nargs="+", type=float, default=[1, 4, 16, 64, 128], help="tensor MB")
    parser.add_argument("--ps-cpu-counts", nargs="+", type=int, default=[1, 16, 64, 128, 256], help="tensors per run")
    parser.add_argument(
        "--ps-cpu-costs",
        default=str(PS_CPU_RECORD),
        help="`dtf`'s strategy.ps_apply_ns_per_byte and rpc_us_per_tensor: `shipped` (config/strategy/dtf.yaml's) or "
        "a --ps-cpu record's (default: this machine's, docs/records/peers-ps-cpu.json)",
    )
    parser.add_argument(
        "--transport-cap",
        default=str(TRANSPORT_RECORD),
        help="`dtf`'s strategy.transport_cap: a tc rate, `shipped` (config/strategy/dtf.yaml's), or a --transport "
        "record whose median cap is taken (default: this machine's, docs/records/peers-transport.json)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        metavar="NAME=OVERRIDES",
        help="instead: the planner's dtf for each setting under each variant (NAME=KEY=VALUE[,KEY=VALUE...], "
        "appended to the dtf overrides above) beside --against's TensorFlow, into variants.json",
    )
    parser.add_argument(
        "--against", type=Path, help="with --variant: a peers record (e.g. docs/records/peers-dtf.json)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/peers " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.transport:
        found = transport.measure(args.transport, args.transport_mb, 3, args.out)
        note = "TF gRPC copies of one tensor between two emulated hosts against one TCP stream on the same link."
        write_record(args.out / "transport.json", {"rates": found}, note, command)
        print(transport.markdown(found))
        return 0
    if args.ps_cpu:
        threads = threads_per_rank(4)  # a PS task's threads as the harness runs them at N = 2 (2 x N ranks)
        found = ps_cpu.measure(args.ps_cpu_sizes, args.ps_cpu_counts, args.repeats, threads, args.out)
        note = "A TF PS task's CPU seconds per byte and per tensor: least-squares lines through each size's median."
        write_record(args.out / "ps_cpu.json", found, note, command)
        print(ps_cpu.markdown(found))
        return 0
    dtf = (*transport_cap(args.transport_cap), *ps_cpu_costs(args.ps_cpu_costs))
    if args.variant:
        if args.against is None or not args.against.exists():
            parser.error("--variant needs --against, an existing peers record (e.g. docs/records/peers-dtf.json)")
        settings = [
            Setting(model, hosts, rate, args.batch, args.size, args.classes, args.warmup, args.steps, dtf)
            for model in args.models
            for hosts in args.hosts
            for rate in args.rates
        ]
        found = variants.run(settings, variants.parse(args.variant), args.against, args.out)
        note = f"The planner's dtf under each variant against {args.against.name}'s mean TensorFlow images/sec."
        write_record(args.out / "variants.json", {"rows": found}, note, command)
        print(variants.markdown(found))
        return 0
    rows = []
    for model in args.models:
        for hosts in args.hosts:
            for rate in args.rates:
                setting = Setting(model, hosts, rate, args.batch, args.size, args.classes, args.warmup, args.steps, dtf)
                folder = args.out / setting.label
                predicted = {} if args.no_prediction else predict(setting, folder / "plan")
                for repeat in range(args.repeats):
                    for peer in args.peers:
                        strategy = PEERS[peer]
                        measured = run_peer(peer, setting, folder / f"r{repeat}" / peer)
                        ours = None
                        if not args.no_ours:
                            ours = run_ours(strategy, setting, folder / f"r{repeat}" / strategy)
                        rows.append(record(setting, repeat, measured, ours, predicted.get(strategy)))
                        print(json.dumps(rows[-1]), flush=True)
                        frame = pd.DataFrame(rows)
                        frame.to_parquet(args.out / "peers.parquet", index=False)
    frame = pd.DataFrame(rows)
    table = write(frame, command, args.out)
    print(markdown(table))
    finite = all(math.isfinite(v) for v in frame.peer_loss_last)
    if not finite:
        print("a peer's loss is not finite", file=sys.stderr)
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
