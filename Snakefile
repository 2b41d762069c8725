# The ralp-pipe workflow: prepare_shards -> profile -> plan -> train -> aggregate -> bundle.
#
#   snakemake --cores all                                   # the `local` experiment
#   snakemake --cores all --config experiment=smoke         # another file of config/experiment/
#   snakemake --cores all --config experiment=smoke 'overrides=["train.measure_steps=5"]'
#   snakemake --cores all --profile slurm                   # training runs as SLURM jobs
#
# `--config` keys are documented in src/ralp_pipe/matrix.py (experiment, overrides,
# dataset_overrides, launcher). The configuration is composed once here, at parse time.
import shlex
import sys

from snakemake.exceptions import WorkflowError

from ralp_pipe.config import ConfigError
from ralp_pipe.workflow.matrix import Matrix, parse_settings

try:
    MATRIX = Matrix(parse_settings(config))
except ConfigError as exc:
    raise WorkflowError(f"configuration error: {exc}") from None

RESULTS = MATRIX.results
RALP = shlex.join([sys.executable, "-m", "ralp_pipe.cli"])
EXPERIMENT = MATRIX.settings.experiment
BUNDLE = f"{MATRIX.path('bundles')}/{EXPERIMENT}-{MATRIX.digest()}.tar.gz"

wildcard_constraints:
    dataset=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    model=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    strategy=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    network=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    gpus=r"\d+",

include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/planning.smk"
include: "workflow/rules/training.smk"
include: "workflow/rules/results.smk"

localrules: all, aggregate, resolved_config, bundle


rule all:
    input:
        BUNDLE,
