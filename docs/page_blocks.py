"""Blocks of the pages under ``docs/`` written from files of the repository (``make docs``).

The device model's calibration is stated by the files it was written to (``config/device/arch/*.yaml``: each
file's leading comment says what was fitted and its left-out error, its values are the fit); the example output is
the excerpt kept in ``docs/records/example-summary.md``. A calibration or an example run done again changes the
pages by regeneration only.
"""

from __future__ import annotations

from pathlib import Path

import records as r
import yaml

ROOT = r.DOCS.parent
ARCH = ROOT / "config" / "device" / "arch"
DEVICES = ROOT / "config" / "device"
FIELDS = ("conv_efficiency", "conv3x3_efficiency", "matmul_efficiency", "memory_efficiency", "launch_overhead_us")
EXAMPLE = r.RECORDS / "example-summary.md"


def _leading_comment(path: Path) -> str:
    """The comment lines at the top of `path`, joined into one line."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def calibration() -> str:
    """One row per architecture file: the GPUs that use it, its fitted values and what its comment says."""
    users: dict[str, list[str]] = {}
    for path in sorted(DEVICES.glob("*.yaml")):
        arch = (yaml.safe_load(path.read_text()) or {}).get("arch")
        if arch:
            users.setdefault(arch, []).append(path.stem)
    rows = []
    for path in sorted(ARCH.glob("*.yaml")):
        values = yaml.safe_load(path.read_text()) or {}
        fitted = ", ".join(f"{key.split('_')[0]} {r.num(values[key])}" for key in FIELDS if key in values)
        gpus = ", ".join(f"`{name}`" for name in users.get(path.stem, [])) or "none shipped"
        rows.append(
            [
                f"`arch/{path.name}`",
                gpus,
                fitted,
                _leading_comment(path).replace("|error|", "absolute error").replace("|", "\\|"),
            ]
        )
    return (
        r.table(["file", "GPUs (`config/device/`)", "values (launch in µs)", "what was fitted, and how well"], rows)
        + "\n"
    )


def example_summary() -> str:
    """The kept excerpt of a real summary.md: its header comment as a caption, then the excerpt."""
    text = EXAMPLE.read_text()
    if not text.startswith("<!--"):
        raise r.RecordError(f"{EXAMPLE}: lacks its header comment (command and revision)")
    header, _, body = text.partition("-->")
    caption = r.wrap(header.removeprefix("<!--").strip())
    return f"{caption}\n\n```markdown\n{body.strip()}\n```\n"


# What each field of metrics.json (ralp_pipe.contract.records.RunMetrics) holds; the table below is written from
# the dataclass's fields, so a field added there shows here, marked undescribed until it gets a line.
METRICS = {
    "schema_version": "the record's schema version (a newer file than this ralp-pipe reads is refused)",
    "model": "the model (`model.name`)",
    "dataset": "the dataset (`dataset.name`)",
    "num_classes": "its class count (1000 or 21841)",
    "strategy": "the strategy (`ps`, `allreduce`, `ralp_h`, `ralp_n`, `dtf`, `byteps`)",
    "gpus": "N, the GPUs of the configuration (`cluster.gpus`)",
    "workers": "the ranks computing the lower layers on a batch of their own",
    "num_ps": "the parameter servers (for RALP, the PS device)",
    "split": "RALP's split: the index of the unit the lower part ends with; null for the other strategies",
    "network": "the network's name (`network.name`)",
    "rate": 'its configured rate (`"unlimited"` where nothing shapes the link)',
    "link_gbit": "the rate the run's link had: the tc rate where shaped, else the plan's probe",
    "link_source": "where `link_gbit` comes from (configured tc rate or probed)",
    "batch_size": "images per worker per step",
    "global_batch": "images per step of all workers",
    "image_size": "the crop's side in pixels",
    "warmup_steps": "steps run before the measured window",
    "measure_steps": "steps in the measured window",
    "images_per_sec": "images of all workers in the measured window / the window's wall time (rank 0's)",
    "target_images_per_sec": "a dilated run's images/sec x D, the figure for the emulated target; null undilated",
    "dilation": "a dilated run's factor, mode, target, link rates, compute batch and crop, overruns, late_s, "
    "needed_factor and how `auto` chose D; null undilated",
    "transport": "`strategy.transport_cap` set (`dtf`'s gRPC): the share of the link it leaves, how the run applied it; else null",
    "intra_host": "emulated hosts of several GPUs: their count, each rank's host, the interconnect, the route",
    "gate": "one job of a concurrent workload: the workload's jobs, whose windows started together",
    "images_per_step": "workers x batch",
    "step_time_s": "the window's wall time / the measured steps",
    "window_s": "the measured window's wall time (rank 0's, between barriers)",
    "gb_per_step": "bytes the senders counted per step, summed over ranks, averaged over the measured steps, "
    "in GB, by category (gradients, parameters, activations, activation_gradients, labels) and total",
    "analytic_gb_per_step": "the same by the analytic volume formula, to check the counted bytes against",
    "wire_gb_per_step": "what the kernel's link counters saw (emulated hosts, SLURM nodes); null elsewhere",
    "wire_per_host": "the same per host",
    "world_size": "the ranks of the run",
    "roles": "every rank's role (worker, ps, ps_device)",
    "hosts": "every rank's host name (the SLURM node it ran on)",
    "peak_rss_mb": "every rank's peak resident memory, MiB",
    "timeline": "when each phase of the run ended (seconds since the epoch): the driver's and rank 0's",
    "device": "the ranks' torch device (cpu, cuda:0)",
    "backend": "gloo or nccl",
    "loader": "`train.loader` (dali, torchvision, synthetic)",
    "hardware": "the machine: host name, CPU model and count, memory, GPUs, platform",
    "versions": "Python and package versions",
    "git_revision": "the checkout's commit (`-dirty` where it had uncommitted changes)",
    "config_hash": "a hash of the resolved configuration",
    "config": "the whole resolved configuration the run composed",
}


def metrics_fields() -> str:
    """A table of metrics.json's fields, in the record's order: its type, whether runs.parquet copies it, what it
    holds."""
    from dataclasses import fields

    from ralp_pipe.contract.records import VERSION_KEY, RunMetrics

    rows = [[f"`{VERSION_KEY}`", "`int`", "", METRICS[VERSION_KEY]]]
    for f in fields(RunMetrics):
        kind = str(f.type).replace("|", "or")
        column = "yes" if f.metadata.get("column") else ""
        rows.append(
            [f"`{f.name}`", f"`{kind}`", column, METRICS.get(f.name, "*(not described yet: docs/page_blocks.py)*")]
        )
    return r.table(["field", "type", "in runs.parquet", "what it holds"], rows) + "\n"


def claims_speedups() -> str:
    """The paper-dilated matrix's measured speedups at N = 8 beside the predicted ones over `dtf`, with its source."""
    m = "paper-dilated"
    header = ["model / classes", "RALP-N over `ps`", "over `allreduce`", "over `dtf` (predicted, not measured)"]
    rows = r.speedup_rows()
    caption = r.wrap(f"""At N = 8, at 1 / 10 / 25 Gbit/s ({r.source(m)}: {r.fig(m, "runs")} runs in
        {r.minutes(r.value(m, "wall_s"))} on 2 cores; the planner's predictions within {r.fig(m, "median_miss_pct")}%
        median over {r.fig(m, "configurations")} configurations, the largest miss {r.fig(m, "largest_miss_pct")}%):""")
    return caption + "\n\n" + r.table(header, rows) + "\n"


def peers() -> str:
    """The peers harness's records (``docs/records/peers*.json``): where each came from, or that none is kept."""
    found = sorted(r.RECORDS.glob("peers*.json"))
    if not found:
        return (
            r.wrap("""No record of the peers harness (Distributed TensorFlow's own parameter servers and PyTorch DDP
            run on the emulated hosts) is kept yet, so this page states none of its figures.""")
            + "\n"
        )
    lines = [f"- `docs/records/{path.name}`: {r.source(path.stem)}" for path in found]
    return (
        "Records of the peers harness (Distributed TensorFlow's own parameter servers and PyTorch DDP on the emulated hosts):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def pricing() -> str:
    """The pricing benchmark's record (``docs/records/pricing.json``): each grid's configurations per CPU second and
    the whole command's wall seconds on every side, `benchmarks/published.py`'s seconds, the cost of one alone."""
    p = "pricing"
    figures = r.record(p)["figures"]
    sides = list(figures["published_s"])

    def cell(found: dict | None) -> str:
        if found is None:
            return "not done"
        rate = found["rows"] / found["command_cpu_s"]
        return (
            f"{rate:,.0f}/s, {found['command_s']:.1f} s" if rate >= 10 else f"{rate:.2g}/s, {found['command_s']:.1f} s"
        )

    rows = [[name, *(cell(grid[side]) for side in sides)] for name, grid in figures["grids"].items()]
    rows.append(["`benchmarks/published.py`, whole", *(f"{figures['published_s'][s]:.1f} s" for s in sides)])
    alone = figures["pricing_alone_ms"]
    caption = r.wrap(f"""{r.source(p)} ({figures["model"]}, batch 32 at 224 px; each cell: configurations per CPU
        second of the whole command, start-up included, then its wall seconds, on the shared 2-core machine):""")
    tail = r.wrap(f"""The cost model alone, the profile built, over the default grid: {alone["sequential transfers"]:.2f}
        ms a configuration with sequential transfers, {alone["pipelined, dtf's timeline"]:.1f} ms with `dtf`'s
        pipelined timeline.""")
    return caption + "\n\n" + r.table(["grid", *sides], rows) + "\n\n" + tail + "\n"
