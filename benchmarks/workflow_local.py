"""Wall time of the whole default workflow (`snakemake --cores all`, experiment `dilated`) against its budget.

Target: at most 10 minutes on a 2-core machine, shard generation included. Runs in a fresh
scratch folder (nothing is reused), printing Snakemake's "k of n steps done" lines as they come,
then the measured time, the budget and their ratio, and the time spent per rule, read from the
timestamps of Snakemake's log (kept as `workflow.log` in the folder). `--fresh` measures what a new user
waits for: a clone of this repository's HEAD, its `make setup` with an empty installer cache, then the
workflow with the clone's environment; the budget then holds set-up and workflow together.
Run: `python benchmarks/workflow_local.py [--experiment local] [--keep DIR] [--fresh [--record FILE]] [--overrides KEY=VALUE ...]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from record import write_record  # noqa: E402

BUDGET_S = 10 * 60


def rule_times(log: str) -> dict[str, float]:
    """Seconds between each job's start stamp and its 'Finished' stamp, summed per rule."""
    stamps = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$")
    totals: dict[str, float] = defaultdict(float)
    started: dict[str, tuple[str, datetime]] = {}
    now = None
    rule = None
    for line in log.splitlines():
        match = stamps.match(line.strip())
        if match:
            now = datetime.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")
            continue
        head = re.match(r"^(?:local)?rule (\w+):$", line.strip())
        if head:
            rule = head.group(1)
        job = re.match(r"^jobid: (\d+)$", line.strip())
        if job and rule and now:
            started[job.group(1)] = (rule, now)
        done = re.match(r"^Finished jobid: (\d+)", line.strip())
        if done and now and done.group(1) in started:
            name, begin = started.pop(done.group(1))
            totals[name] += (now - begin).total_seconds()
    return dict(totals)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="dilated")
    parser.add_argument("--keep", type=Path, help="run in this folder instead of a temporary one")
    parser.add_argument("--overrides", nargs="+", help="Hydra overrides, e.g. 'experiment.networks=[1gbit]'")
    parser.add_argument("--fresh", action="store_true", help="clone HEAD and time its `make setup` first")
    parser.add_argument(
        "--record", type=Path, help="with --fresh: add this run's seconds to a docs record (JSON; the latest 4 kept)"
    )
    args = parser.parse_args()
    if args.record and not args.fresh:
        parser.error("--record keeps fresh-clone timings: give --fresh too")
    work = args.keep or Path(tempfile.mkdtemp(prefix="ralp-workflow-"))
    work.mkdir(parents=True, exist_ok=True)
    repo, python, setup_s = REPO, Path(sys.executable), 0.0
    if args.fresh:
        repo, python, setup_s = fresh_setup(work)
    command = [
        str(python),
        "-m",
        "snakemake",
        "--snakefile",
        str(repo / "workflow" / "Snakefile"),
        "--directory",
        str(work),
        "--cores",
        "all",
        "--config",
        f"experiment={args.experiment}",
        *([f"overrides={json.dumps(args.overrides)}"] if args.overrides else []),
    ]
    log = work / "workflow.log"
    print(f"workflow {args.experiment} in {work}; Snakemake's output goes to {log}", flush=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True, env=_rule_env(python))
    returncode = _follow(proc, log, start)
    elapsed = time.perf_counter() - start
    text = log.read_text()
    for name, seconds in sorted(rule_times(text).items(), key=lambda kv: -kv[1]):
        print(f"  {name:16s} {seconds:8.0f} s")
    total = setup_s + elapsed
    with_setup = (
        f"set-up {setup_s:.0f} s + workflow {elapsed:.0f} s = {total:.0f} s" if args.fresh else f"{elapsed:.0f} s"
    )
    print(
        f"workflow {args.experiment}: {with_setup} measured, budget {BUDGET_S} s, "
        f"ratio {total / BUDGET_S:.2f} ({_verdict(returncode, total)}); "
        f"exit {returncode}; results in {work}"
    )
    if returncode != 0:
        print(text[-8000:], file=sys.stderr)
    elif args.record:
        record_timing(args.record, setup_s, elapsed)
    return returncode


def record_timing(path: Path, setup_s: float, workflow_s: float, keep: int = 4) -> None:
    """Add one fresh-clone run's set-up and workflow seconds to the record at `path`, keeping the latest `keep`."""
    old = json.loads(path.read_text())["figures"] if path.exists() else {"setup_s": [], "workflow_s": []}
    figures = {key: [*old[key], round(new)][-keep:] for key, new in (("setup_s", setup_s), ("workflow_s", workflow_s))}
    write_record(path, figures, note=f"set-up and workflow seconds of the latest {keep} fresh-clone runs")


def _verdict(returncode: int, elapsed: float) -> str:
    if returncode != 0:
        return "FAILED: no verdict on the budget"
    return "within budget" if elapsed <= BUDGET_S else "OVER budget"


def fresh_setup(work: Path) -> tuple[Path, Path, float]:
    """Clone this repository's HEAD into `work`/clone and run its `make setup` with empty installer caches; return
    the clone, its interpreter and the set-up's seconds."""
    clone = work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    caches = {"UV_CACHE_DIR": str(work / "uv-cache"), "PIP_NO_CACHE_DIR": "1"}
    print(f"set-up of a fresh clone in {clone} (empty installer caches)", flush=True)
    start = time.perf_counter()
    subprocess.run(["make", "-C", str(clone), "setup"], check=True, env={**os.environ, **caches})
    setup_s = time.perf_counter() - start
    shutil.rmtree(work / "uv-cache", ignore_errors=True)
    print(f"  set-up {setup_s:.0f} s", flush=True)
    return clone, clone / ".venv" / "bin" / "python", setup_s


def _rule_env(python: Path) -> dict[str, str]:
    """This environment with `python`'s scripts (`ralp-pipe`) first on PATH, as the rules call them."""
    scripts = str(python.parent)
    return {**os.environ, "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")])}


def _follow(proc: subprocess.Popen[str], log: Path, start: float) -> int:
    """Wait for Snakemake, printing each of its "k of n steps" lines with the time since `start`."""
    done = re.compile(r"^\d+ of \d+ steps \(.*\) done$")
    printed = 0
    while True:
        code = proc.poll()
        text = log.read_text(errors="replace")
        lines = text[: text.rfind("\n") + 1].splitlines()  # whole lines only
        for line in lines[printed:]:
            if done.match(line.strip()):
                print(f"  {time.perf_counter() - start:6.0f} s  {line.strip()}", flush=True)
        printed = len(lines)
        if code is not None:
            return code
        time.sleep(5)


if __name__ == "__main__":
    sys.exit(main())
