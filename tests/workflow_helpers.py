"""Running the real Snakefile from tests: in a scratch working directory, with a dry-run job parser."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "workflow" / "Snakefile")]


def config_args(config: dict[str, Any]) -> list[str]:
    """`--config` arguments (values as JSON, which Snakemake reads as YAML)."""
    return ["--config", *(f"{key}={json.dumps(value)}" for key, value in config.items())] if config else []


def snakemake(
    workdir: Path, *args: str, config: dict[str, Any] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run snakemake on the repository's Snakefile with results under `workdir`."""
    command = [*SNAKEMAKE, "--directory", str(workdir), *args, *config_args(config or {})]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=workdir)


def pending(workdir: Path, config: dict[str, Any] | None = None) -> set[tuple[str, str]]:
    """(rule, wildcards) of every job a dry run would execute."""
    result = snakemake(workdir, "--dry-run", "--cores", "1", config=config, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    jobs: set[tuple[str, str]] = set()
    rule = None
    for line in result.stdout.splitlines():
        match = re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line.strip())
        if match:
            if rule:
                jobs.add((rule, ""))
            rule = match.group(1)
        elif rule and line.strip().startswith("wildcards:"):
            jobs.add((rule, line.split(":", 1)[1].strip()))
            rule = None
        elif rule and line.strip().startswith("resources:"):
            jobs.add((rule, ""))
            rule = None
    if rule:
        jobs.add((rule, ""))
    return jobs
