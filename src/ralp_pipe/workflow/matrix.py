"""The experiment matrix the Snakefile expands: one training run per (dataset, model) x strategy x N x network x repeat.

The workflow's own settings come from Snakemake's ``--config`` (see :func:`parse_settings`):

``experiment``
    name of a file in ``config/experiment/`` (default ``dilated``);
``overrides``
    Hydra overrides applied to every stage (a YAML list, or one string split like a shell line),
    e.g. ``train.measure_steps=5 cluster=emulated``; ``experiment.*`` keys reshape the matrix;
``dataset_overrides``
    per-dataset ``dataset.*`` overrides, e.g. ``{imagenet1k: [dataset.source=/data/train]}``;
``stage_options``
    extra command-line options per stage (not config keys), e.g. ``{profile: "--repeats 1"}``;
``launcher``
    ``local`` (default) or ``slurm``: set by ``profiles/slurm``; stages then compose ``cluster=slurm``
    (training runs its ranks with ``srun``), or keep an emulated experiment's ``cluster=emulated`` (each job's
    hosts on its node), and jobs ask SLURM for ``cluster.slurm.*`` resources.

Each stage is given only the overrides that can change what it computes (:data:`STAGE_KEYS`),
and the resolved values of those keys become the rule's ``params``, so Snakemake reruns a stage
only when something it reads changed.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ralp_pipe.atomic import write_json_atomic
from ralp_pipe.config import (
    AUTO_FACTOR,
    CONFIG_DIR,
    REFERENCE,
    Config,
    ConfigError,
    TrainConfig,
    cluster_kind,
    digest,
    refuse_repeated,
    strategy_kind,
    to_dict,
    validate,
)
from ralp_pipe.config.schema import MODELLED
from ralp_pipe.contract.layout import MAX_CONCURRENT_JOBS, PATHS, RUN_ID, SEQUENTIAL_SUFFIX, arm, log_path
from ralp_pipe.contract.stages import STAGES
from ralp_pipe.contract.topology import cpu_share, links_of
from ralp_pipe.workflow.compositions import cached_load
from ralp_pipe.workflow.slurm import concurrent_resources, job_resources, ranks_per_node

# Matrix dimensions each stage's outputs are keyed by (one job per distinct combination).
STAGE_DIMS: dict[str, tuple[str, ...]] = {
    "prepare_shards": ("dataset",),
    "profile": ("dataset", "model", "gpus"),  # one per compute key (profile_fields) and N (profile_gpus)
    "probe": ("network",),  # the link probe: one per network
    "plan": ("dataset", "model", "gpus", "network"),
    # where a run's factor is auto (Matrix.checks_links): one per hosts and pattern (Matrix.link_fields) and network
    "check_links": ("network",),
    "train": ("dataset", "model", "strategy", "gpus", "network", "repeat"),
}
# stages whose jobs are named by what a run's config makes of its dimensions (Matrix.path), and their output
OUTPUT_OF = {"profile": "profile", "check_links": "link_check"}
COMMAND_OF = {"probe": "profile"}  # stages run by another stage's command (`ralp-pipe profile --link-only`)
KEYS_OF = {"probe": "LINK_CONFIG_KEYS"}  # the declaration of a stage's keys in its module, where not CONFIG_KEYS


_STATEMENT_LINES = 60  # the longest a declaration is looked for


def declared_keys(stage: str) -> tuple[str, ...]:
    """The config keys workflow stage `stage` reads: those its command's module (``contract.stages.STAGES``) declares
    next to the code reading them, read from its source so that parsing the workflow imports no stage."""
    module = importlib.util.find_spec(STAGES[COMMAND_OF.get(stage, stage).replace("_", "-")][0])
    assert module is not None and module.origin is not None
    name = KEYS_OF.get(stage, "CONFIG_KEYS")
    source = Path(module.origin).read_text()
    # Parsing only the statement (its first lines that parse) instead of the whole module: a tenth of the time.
    start = re.search(rf"^{name}\s*=(?!=)", source, re.MULTILINE)
    lines = source[start.start() :].splitlines(keepends=True)[:_STATEMENT_LINES] if start else []
    for end in range(1, len(lines) + 1):
        try:
            statement = ast.parse("".join(lines[:end])).body
        except SyntaxError:
            continue
        if len(statement) == 1 and _assigns(statement[0], name):
            return tuple(ast.literal_eval(statement[0].value))  # type: ignore[attr-defined]
        break
    for node in ast.parse(source).body:  # the declaration is written otherwise
        if _assigns(node, name):
            return tuple(ast.literal_eval(node.value))  # type: ignore[attr-defined]
    raise LookupError(f"{module.origin} declares no {name}")


def _assigns(node: ast.stmt, name: str) -> bool:
    """Whether `node` is ``name = value``."""
    return isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]


# Config keys each stage reads; a key covers everything below it ("train" covers "train.lr").
STAGE_KEYS: dict[str, tuple[str, ...]] = {stage: declared_keys(stage) for stage in STAGE_DIMS}
COMPOSE_KEYS = ("dataset.layout", "dataset.source")  # a real dataset composes only with its path
MATRIX_GROUPS = ("dataset", "model", "strategy", "network")
WORKFLOW_KEYS = ("experiment", "cluster.gpus", "strategy.plan")
# an experiment.variants override naming one of these selects matrix runs (by the Run field) instead of setting it
VARIANT_SELECTORS = {"dataset": "dataset", "model": "model", "strategy": "strategy", "cluster.gpus": "gpus",
                     "network": "network"}  # fmt: skip
SCHEMA = CONFIG_DIR.parent / "workflow" / "schemas" / "config.schema.yaml"  # the --config keys


@dataclass(frozen=True)
class Run:
    """One run of the matrix: repeat `repeat` of training `model` on `dataset` with `strategy` on N=`gpus`
    (`overlap` False: the sequential ablation of experiment.sequential)."""

    dataset: str
    model: str
    strategy: str
    gpus: int
    network: str
    overlap: bool = True
    repeat: int = 0
    variant: str = ""  # the experiment.variants entry it runs ("": the matrix's own run)

    @property
    def arm(self) -> str:
        """The run's strategy row and folder name (``ps``, ``ps-sequential``, ``ralp_n-real``)."""
        return arm(self.strategy, self.overlap, self.variant or None)

    @property
    def wildcards(self) -> dict[str, str]:
        """The run as Snakemake wildcard values (its fields and its arm)."""
        return {**{k: str(v) for k, v in dataclasses.asdict(self).items()}, "arm": self.arm}


@dataclass(frozen=True)
class Settings:
    """What the user asked the workflow for: an experiment plus Hydra overrides."""

    experiment: str = "dilated"
    overrides: tuple[str, ...] = ()
    dataset_overrides: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    slurm: bool = False
    stage_options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _override_list(value: str | Sequence[str]) -> tuple[str, ...]:
    """A list of overrides as given, or one string split like a shell line."""
    return tuple(shlex.split(value)) if isinstance(value, str) else tuple(value)


def _check_schema(config: dict[str, Any]) -> None:
    """Check ``--config`` against the workflow's JSON schema (filling its defaults in)."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate as validate_schema

    try:
        validate_schema(config, str(SCHEMA))
    except WorkflowError as exc:
        reason = next((line for line in str(exc).splitlines() if line.startswith("ValidationError")), str(exc))
        raise ConfigError(
            f"--config does not match {SCHEMA.name} (keys: config/README.md): "
            f"{reason.removeprefix('ValidationError: ')}"
        ) from None


def override_key(override: str) -> str:
    """The config key an override sets: ``+train.lr=1`` -> ``train.lr``, ``model=vgg16`` -> ``model``."""
    key, sep, _ = override.partition("=")
    if not sep or not key.lstrip("~+"):
        raise ConfigError(f"override {override!r} is not of the form key=value")
    return key.lstrip("~+")


def parse_settings(config: Mapping[str, Any]) -> Settings:
    """Read the workflow's ``--config`` dictionary; unknown keys and misplaced overrides are refused."""
    config = dict(config)
    _check_schema(config)
    slurm = config["launcher"] == "slurm"
    experiment = str(config["experiment"])
    overrides = _override_list(config["overrides"])
    if overrides:  # none, none repeated: Hydra's override parser is not even imported
        refuse_repeated(overrides)
    for override in overrides:
        key = override_key(override)
        if key in MATRIX_GROUPS or key in WORKFLOW_KEYS:
            raise ConfigError(
                f"override {override!r} would fight the experiment matrix: pass the experiment with "
                f"--config experiment=NAME and choose matrix values with experiment.* overrides, "
                f"e.g. 'experiment.models=[vgg11]' or 'experiment.gpus=[2,4]' (plans come from the plan stage)"
            )
        if slurm and key == "cluster" and override.partition("=")[2] != "emulated":
            raise ConfigError(
                f"override {override!r}: the slurm profile runs every stage with cluster=slurm, or with "
                f"cluster=emulated (each job's emulated hosts on the node SLURM gives it)"
            )
    per_dataset = {str(name): _override_list(value) for name, value in config["dataset_overrides"].items()}
    for name, values in per_dataset.items():
        try:
            refuse_repeated([*overrides, *values])  # one dataset's keys once, and not in overrides too
        except ConfigError as exc:
            raise ConfigError(f"dataset_overrides.{name} (with overrides): {exc}") from exc
        for override in values:
            if not override_key(override).startswith("dataset."):
                raise ConfigError(f"dataset_overrides.{name}: {override!r} is not a dataset.* override")
    options = {str(stage): _override_list(value) for stage, value in config["stage_options"].items()}
    for stage, values in options.items():
        if values and not values[0].startswith("--"):
            raise ConfigError(f"stage_options.{stage}={list(values)!r} must start with an option like --repeats")
    return Settings(experiment, overrides, per_dataset, slurm, options)


def relevant(key: str, keys: Sequence[str]) -> bool:
    """Whether config `key` and one of `keys` overlap (one is the other or lies below it)."""
    return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in keys)


def select(data: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The parts of a nested config dict named by dotted `keys`."""
    out: dict[str, Any] = {}
    for key in keys:
        head, *rest = key.split(".")
        node: Any = data[head]
        for part in rest:
            node = node[part]
        out[key] = node
    return out


class Matrix:
    """The resolved experiment: its runs, each run's config and each stage's arguments and params."""

    def __init__(self, settings: Settings, config_dir: Path = CONFIG_DIR) -> None:
        self.settings = settings
        own = cached_load([f"experiment={settings.experiment}", *settings.overrides], config_dir)
        # under the slurm profile an emulated experiment keeps its cluster: each job makes its hosts on its node
        self.emulated = cluster_kind(own.cluster.kind).launcher == "emulated"
        head = [f"experiment={settings.experiment}", *self.launcher_args(), *settings.overrides]
        self.base = cached_load(head, config_dir)
        e = self.base.experiment
        unknown = sorted(set(settings.dataset_overrides) - set(e.datasets))
        if unknown:
            raise ConfigError(f"dataset_overrides name {', '.join(unknown)}, not in experiment.datasets={e.datasets}")
        # Each group option only changes its own section (no cross-group interpolation in config/),
        # so composing once per option instead of once per run gives the same configs, much faster.
        self._sections: dict[tuple[str, str], Any] = {}
        for group, options in (
            ("dataset", e.datasets),
            ("model", e.models),
            ("strategy", list(dict.fromkeys([*e.strategies, *([REFERENCE[0]] if e.reference else [])]))),
            ("network", e.networks),
        ):
            for option in options:
                extra = self.group_args(group, option)
                section = getattr(self._compose(head + extra, group, option), group)
                if section.name != option:
                    raise ConfigError(
                        f"{group} '{option}' sets {group}.name={section.name!r}: outputs are named by "
                        f"the option, so keep {group}.name equal to it"
                    )
                self._sections[group, option] = section
        self.runs = [
            Run(d, m, s, g, n, overlap, r)
            for d, m in self.pairs()
            for s, overlap in self._arms()
            for g in e.gpus_of(m, s)
            for n in e.networks_of(m)
            for r in range(e.repeats)
        ]
        self._variant_bases = {name: self._variant_base(head, name) for name in e.variants}
        self.runs += self._variant_runs()
        matrix_runs = set(self.runs)
        self.runs += [run for run in self._reference_runs() if run not in matrix_runs]
        self.measured_runs = self._measured_runs()
        self._configs = {run: self._config(run, STAGE_DIMS["train"]) for run in self.runs}
        self._first: dict[tuple[str, ...], dict[tuple[str, ...], Run]] = {}
        self._job_runs: dict[str, dict[str, Run]] = {}  # stage of OUTPUT_OF -> its output path -> the first run
        self._digest: str | None = None
        self._check_workloads()
        if settings.slurm:
            self.check_slurm()

    def _arms(self) -> list[tuple[str, bool]]:
        """(strategy, overlap) of every strategy row: each strategy as configured, then the sequential ablations;
        a strategy `train` cannot run refused."""
        e = self.base.experiment
        for strategy in e.strategies:
            strategy_kind(strategy).check_trainable()
        arms = [(s, self._sections["strategy", s].overlap) for s in e.strategies]
        pipelined = [s for s in e.sequential if self._sections["strategy", s].overlap]
        if len(pipelined) < len(e.sequential):
            raise ConfigError(
                f"experiment.sequential={e.sequential} adds strategy.overlap=false runs of strategies that "
                f"already run with strategy.overlap=false: drop experiment.sequential or the overlap override"
            )
        return arms + [(s, False) for s in pipelined]

    def variant_overrides(self, name: str) -> tuple[dict[str, str], list[str]]:
        """Variant `name`'s selectors (matrix field -> value, from its model=, dataset=, strategy=, cluster.gpus= and
        network= overrides) and its other overrides, those its runs add."""
        selectors: dict[str, str] = {}
        others: list[str] = []
        for override in self.base.experiment.variants[name]:
            key, value = override_key(override), override.partition("=")[2]
            if key in VARIANT_SELECTORS:
                selectors[VARIANT_SELECTORS[key]] = value
            else:
                others.append(override)
        return selectors, others

    def _variant_base(self, head: list[str], name: str) -> Config:
        """The experiment's config with variant `name`'s overrides; refused where they change what a plan, profile
        or shards read (a variant reruns training only: its runs read the matrix's plans)."""
        _, others = self.variant_overrides(name)
        base = self._compose(head + others, "variant", name)
        for stage in ("prepare_shards", "profile", "plan"):
            for key in STAGE_KEYS[stage]:
                ours, theirs = (select(to_dict(c), [key])[key] for c in (base, self.base))
                same = (ours is None) == (theirs is None) if key == "dilation.factor" else ours == theirs
                if not same:  # of dilation.factor a plan reads only whether the run is dilated
                    raise ConfigError(
                        f"experiment.variants.{name} changes {key} ({theirs!r} -> {ours!r}), which the {stage} stage "
                        f"reads: a variant reruns training only, on the matrix's shards, profiles and plans"
                    )
        return base

    def _variant_runs(self) -> list[Run]:
        """A run of every variant for each matrix run (pipelined arms) its selectors match, each repeat."""
        runs = []
        for name in self.base.experiment.variants:
            if f"-{name}" == SEQUENTIAL_SUFFIX:
                raise ConfigError(f"experiment.variants.{name}: the name is the sequential ablation's row suffix")
            selectors, _ = self.variant_overrides(name)
            matched = [
                dataclasses.replace(run, variant=name)
                for run in self.runs
                if run.overlap and not run.variant and all(str(getattr(run, f)) == v for f, v in selectors.items())
            ]
            if not matched:
                raise ConfigError(f"experiment.variants.{name} selects no run of the matrix ({selectors})")
            runs += matched
        return runs

    def _measured_runs(self) -> list[Run]:
        """For each model of experiment.measured_profiles, its first run at its smallest N (the run whose
        profile is measured here and planned on its network)."""
        e = self.base.experiment
        if e.measured_profiles and e.target is None:
            raise ConfigError(
                f"experiment.measured_profiles={e.measured_profiles} adds measured profiles beside the target's, "
                f"but experiment.target is null: every profile is measured already"
            )
        runs = []
        for model in e.measured_profiles:
            own = [run for run in self.runs if run.model == model and run.gpus > 1 and not run.variant]
            runs.append(min(own, key=lambda run: run.gpus))
        return runs

    def _reference_runs(self) -> list[Run]:
        """The single-device reference of every (dataset, model) and repeat (experiment.reference), on the
        model's first network: one rank has no link to shape."""
        e = self.base.experiment
        if not e.reference:
            return []
        strategy, gpus = REFERENCE
        overlap = self._sections["strategy", strategy].overlap
        return [
            Run(d, m, strategy, gpus, e.networks_of(m)[0], overlap, r)
            for d, m in self.pairs()
            for r in range(e.repeats)
        ]

    def pairs(self) -> list[tuple[str, str]]:
        """The (dataset, model) pairs: experiment.pairs where given, else every dataset with every model."""
        e = self.base.experiment
        return [(d, m) for d in e.datasets for m in e.models if not e.pairs or [d, m] in e.pairs]

    def _train_section(self, run: Run, base: Config) -> TrainConfig:
        """The train section of `run` (from `base`, its variant's where it has one): its repeat and variant, and
        for the reference on a cluster whose ranks share this host's CPUs, the torch threads of one rank of the
        experiment's largest run (what the profile times)."""
        return dataclasses.replace(
            base.train,
            repeat=run.repeat,
            cpu_share=cpu_share(self.base, run.strategy, run.gpus),
            variant=run.variant or None,
        )

    def launcher_args(self) -> list[str]:
        """``cluster=slurm`` when the workflow runs under the slurm profile: every stage runs in SLURM jobs, whose
        ranks are srun tasks unless the experiment's cluster is emulated (its hosts then are namespaces on the job's
        node: :mod:`ralp_pipe.workflow.slurm`)."""
        return ["cluster=slurm"] if self.settings.slurm and not self.emulated else []

    @staticmethod
    def _compose(overrides: list[str], group: str, option: str) -> Config:
        try:
            return cached_load(overrides)
        except ConfigError as exc:
            raise ConfigError(f"experiment {group} '{option}': {exc}") from exc

    def group_args(self, group: str, option: str) -> list[str]:
        """The overrides that select `option` of `group` (plus per-dataset overrides)."""
        return (
            [f"{group}={option}", *self.settings.dataset_overrides.get(option, ())]
            if group == "dataset"
            else [f"{group}={option}"]
        )

    def _config(self, run: Run, dims: Sequence[str]) -> Config:
        """`run`'s config where the matrix chooses `dims`; other groups keep the experiment's default."""
        # a variant changes training only (Matrix._variant_base): other stages compose the matrix's base
        base = self._variant_bases[run.variant] if run.variant and "repeat" in dims else self.base
        sections = {g: self._sections[g, getattr(run, g)] for g in MATRIX_GROUPS if g in dims}
        if "strategy" in sections:  # training reads its split from the plan stage's output (its rule's --plan)
            overlap = sections["strategy"].overlap and run.overlap
            sections["strategy"] = dataclasses.replace(
                sections["strategy"], plan=self.path("plan", run), overlap=overlap
            )
        if "repeat" in dims:
            sections["train"] = self._train_section(run, base)
        cluster = base.cluster
        if "gpus" in dims:
            cluster = dataclasses.replace(cluster, gpus=run.gpus)
        cfg = dataclasses.replace(base, cluster=cluster, **sections)
        try:
            validate(cfg)
        except ConfigError as exc:
            raise ConfigError(f"run {run.wildcards}: {exc}") from exc
        return cfg

    def config(self, run: Run) -> Config:
        """The resolved config of one training run."""
        return self._configs[run]

    @property
    def results(self) -> str:
        """The results folder every stage writes under."""
        return self.base.paths.results

    def path(self, name: str, run: Run | None = None, **fields: Any) -> str:
        """Output `name` of the results layout (:data:`PATHS`) for `run` or `fields` (else a pattern)."""
        template = f"{self.results}/{PATHS[name]}"
        if run or fields:
            own = {} if run is None else self._fields(name, run)
            return template.format(**own, **fields)
        return template

    def log(self, stage: str) -> str:
        """The log of a job of `stage` (:func:`ralp_pipe.contract.layout.log_path`), a pattern of its wildcards."""
        return f"{self.results}/{log_path(stage)}"

    def _fields(self, name: str, run: Run) -> dict[str, str]:
        """The fields output `name`'s path takes from `run`."""
        if name == "profile":
            return self.profile_fields(run)
        if name == "measured_profile":
            return self.profile_fields(run, measured=True)
        if name == "link_check":
            return self.link_fields(run)
        return run.wildcards

    def link_fields(self, run: Run) -> dict[str, str]:
        """What `run`'s link check is made for, as its path's fields: its network, hosts and their links' pattern
        (:func:`ralp_pipe.contract.topology.links_of`)."""
        hosts, pattern = links_of(self.config(run))
        return {"network": run.network, "hosts": str(hosts), "pattern": str(pattern)}

    def profile_fields(self, run: Run, measured: bool = False) -> dict[str, str]:
        """What `run`'s compute profile depends on, as the profile path's fields: model, class count,
        per-worker batch, image size, the device kind (cluster kind and device, or ``target-<entry>`` for a
        profile modelled for ``experiment.target``) and the N it profiles; `measured`: its profile measured here
        (experiment.measured_profiles)."""
        cfg = self.measured_config("profile", run) if measured else self.stage_config("profile", run)
        return {
            "model": run.model,
            "classes": str(cfg.dataset.num_classes),
            "batch": str(cfg.train.batch_size),
            "size": str(cfg.train.image_size),
            "hw": f"target-{target}"
            if (target := cfg.experiment.target)
            else f"{cfg.cluster.kind}-{cfg.cluster.device}",
            "gpus": str(self.profile_gpus(run)),
        }

    def job_run(self, stage: str, wildcards: Mapping[str, str]) -> Run:
        """The (first) run a job of `stage` with these wildcard values stands for."""
        output = OUTPUT_OF.get(stage)
        if output is None:
            return self.first(**dict(wildcards))
        if stage not in self._job_runs:  # built on first use: one entry per job
            runs = self.runs if stage == "profile" else [run for run in self.runs if self.checks_links(run)]
            self._job_runs[stage] = {}
            for run in runs:
                self._job_runs[stage].setdefault(self.path(output, run), run)
        try:
            return self._job_runs[stage][self.path(output, None, **wildcards)]
        except KeyError:
            raise ConfigError(
                f"no run of experiment '{self.settings.experiment}' has a {stage} job for {dict(wildcards)}"
            ) from None

    def first(self, **wildcards: str) -> Run:
        """A run matching the given wildcard values (stages shared by several runs use any of them)."""
        keys = tuple(sorted(wildcards))
        if keys not in self._first:  # one index per set of wildcard names, built on first use
            index: dict[tuple[str, ...], Run] = {}
            for run in self.runs:
                index.setdefault(tuple(run.wildcards[k] for k in keys), run)
            self._first[keys] = index
        try:
            return self._first[keys][tuple(str(wildcards[k]) for k in keys)]
        except KeyError:
            raise ConfigError(f"no run of experiment '{self.settings.experiment}' matches {wildcards}") from None

    @property
    def workloads(self) -> list[list[str]]:
        """The concurrent workloads of the experiment: each a list of jobs (Hydra override strings)."""
        return [list(w) for w in self.base.experiment.concurrent]

    def workload_plans(self, index: int) -> list[str | None]:
        """The plan each job of workload `index` trains with: the matrix's plan of the job's dataset, model, N and
        network where the job places layers with no split or plan of its own (None: none, or the matrix has no run
        of that configuration, and the job takes strategy.split or the default split), so that a job runs the split
        its configuration runs in the matrix."""
        plans: list[str | None] = []
        for cfg in self._workload_configs[index]:
            plan = None
            if strategy_kind(cfg.strategy.name).places_layers and cfg.strategy.split is None and not cfg.strategy.plan:
                try:
                    run = self.first(
                        dataset=cfg.dataset.name,
                        model=cfg.model.name,
                        gpus=str(cfg.cluster.gpus),
                        network=cfg.network.name,
                    )
                except ConfigError:
                    run = None
                plan = None if run is None else self.path("plan", run)
            plans.append(plan)
        return plans

    def concurrent_args(self) -> list[str]:
        """Arguments of the one `ralp-pipe concurrent` call that runs every workload (`--workload` each, in order, so
        workload i lands in concurrent/w<i>, every job with its plan, :meth:`workload_plans`), then the overrides
        every job shares (the experiment and the user's training overrides)."""
        args = []
        for index, workload in enumerate(self.workloads):
            plans = self.workload_plans(index)
            jobs = [
                job if plan is None else f"{job} {shlex.quote(f'strategy.plan={plan}')}"
                for job, plan in zip(workload, plans)
            ]
            args += ["--workload", json.dumps(jobs)]
        common = [o for o in self.settings.overrides if relevant(override_key(o), STAGE_KEYS["train"])]
        return [*args, f"experiment={self.settings.experiment}", *common]

    def concurrent_params(self) -> str:
        """Rerun key of the concurrent workloads: their arguments and the resolved training config."""
        data = {"args": self.concurrent_args(), "config": select(to_dict(self.base), STAGE_KEYS["train"])}
        return json.dumps(data, sort_keys=True)

    def _check_workloads(self) -> None:
        """Compose every job of every concurrent workload (each on the emulated network), refusing bad ones."""
        head = [f"experiment={self.settings.experiment}", *self.settings.overrides, "cluster=emulated"]
        self._workload_configs: list[list[Config]] = []
        for index, workload in enumerate(self.workloads):
            if not 2 <= len(workload) <= MAX_CONCURRENT_JOBS:
                raise ConfigError(
                    f"experiment.concurrent[{index}]={workload!r} has {len(workload)} jobs: a workload runs 2 to "
                    f"{MAX_CONCURRENT_JOBS} jobs at once (each job alone is k = 1)"
                )
            self._workload_configs.append(
                [self._compose(head + shlex.split(job), "concurrent job", job) for job in workload]
            )

    def concurrent_resources(self) -> dict[str, Any]:
        """SLURM resources of the job running every concurrent workload
        (:func:`ralp_pipe.workflow.slurm.concurrent_resources`)."""
        return concurrent_resources(self.base, self._workload_configs, self.workloads)

    def checks_links(self, run: Run) -> bool:
        """Whether `run` takes its dilation factor from a ``check_links`` job: modelled ``auto`` on emulated links
        between two hosts or more (one check per hosts, pattern and network, shared by every run that has them)."""
        cfg = self.config(run)
        d = cfg.dilation
        return (
            d.factor == AUTO_FACTOR
            and d.mode == MODELLED
            and cluster_kind(cfg.cluster.kind).launcher == "emulated"
            and links_of(cfg)[0] > 1
        )

    def link_check(self, run: Run) -> list[str]:
        """The ``check_links`` output `run` reads (none where it needs none: :meth:`checks_links`)."""
        return [self.path("link_check", run)] if self.checks_links(run) else []

    def profile_gpus(self, run: Run) -> int:
        """The N whose compute profile `run` is planned from: its own, so changing experiment.gpus leaves every
        other N's profile as it is; at N=1, which has no PS-device batch, the experiment's largest N, whose
        profile times the worker batch with the threads the single-device reference gets (one rank's of the
        largest run, :func:`ralp_pipe.contract.topology.cpu_share`)."""
        return run.gpus if run.gpus > 1 else max(self.base.experiment.gpus)

    def _stage_run(self, stage: str, run: Run) -> Run:
        """The run a job of `stage` composes for `run`: a profile job, for the N it profiles."""
        return dataclasses.replace(run, gpus=self.profile_gpus(run)) if stage == "profile" else run

    def stage_keys(self, stage: str, run: Run) -> tuple[str, ...]:
        """Config keys `stage` reads for `run` (:data:`STAGE_KEYS`): a plan reads experiment.gpus only at N=1,
        for the reference's CPU share, so other plans (and the training runs after them) keep their keys."""
        keys = STAGE_KEYS[stage]
        return tuple(k for k in keys if k != "experiment.gpus") if stage == "plan" and run.gpus > 1 else keys

    def stage_config(self, stage: str, run: Run) -> Config:
        """The config `stage` composes for `run` (equal to the run's config on every key it reads)."""
        return self.config(run) if stage == "train" else self._config(self._stage_run(stage, run), STAGE_DIMS[stage])

    def measured_config(self, stage: str, run: Run) -> Config:
        """The config `stage` composes for `run`'s profile measured here or the plan made from it
        (experiment.measured_profiles): the stage's own, with experiment.target null."""
        cfg = self.stage_config(stage, run)
        return dataclasses.replace(cfg, experiment=dataclasses.replace(cfg.experiment, target=None))

    def measured_args(self, stage: str, run: Run) -> list[str]:
        """The Hydra overrides of `stage` (profile or plan) for `run`'s measured profile: the stage's own, the
        profile measuring this machine (experiment.target=null)."""
        args = [a for a in self.stage_args(stage, run) if not a.startswith("experiment.target=")]
        return [*args, "experiment.target=null"] if stage == "profile" else args

    def measured_params(self, stage: str, run: Run) -> str:
        """Rerun key of the measured profile's `stage` job for `run` (as :meth:`stage_params`)."""
        data = {
            "config": select(to_dict(self.measured_config(stage, run)), self.stage_keys(stage, run)),
            "args": self.measured_args(stage, run),
        }
        return json.dumps(data, sort_keys=True)

    def measured_run(self, stage: str, wildcards: Mapping[str, str]) -> Run:
        """The run of experiment.measured_profiles a `stage` job (profile or plan) with these wildcards is for."""
        output = "measured_profile" if stage == "profile" else "measured_plan"
        wanted = self.path(output, None, **wildcards)
        for run in self.measured_runs:
            if self.path(output, run) == wanted:
                return run
        raise ConfigError(f"no model of experiment.measured_profiles has a measured {stage} job for {dict(wildcards)}")

    def stage_args(self, stage: str, run: Run) -> list[str]:
        """The Hydra overrides `stage` gets for `run`: the matrix choices it is keyed by, plus the
        user's overrides of keys it reads. Input files are no overrides: each rule passes its inputs'
        paths as options (training's plan as ``--plan``, which sets strategy.plan)."""
        run = self._stage_run(stage, run)
        keys, dims = self.stage_keys(stage, run), STAGE_DIMS[stage]
        options = self.settings.stage_options.get(COMMAND_OF.get(stage, stage), ())
        args = [f"experiment={self.settings.experiment}"]
        if relevant("cluster", keys):
            args += self.launcher_args()
        for group in MATRIX_GROUPS:
            if group in dims:  # the option, and those of its per-dataset overrides the stage reads or composes with
                option, *extra = self.group_args(group, getattr(run, group))
                args += [option, *(o for o in extra if relevant(override_key(o), (*keys, *COMPOSE_KEYS)))]
        if "gpus" in dims:
            args.append(f"cluster.gpus={run.gpus}")
        args += [o for o in self.settings.overrides if relevant(override_key(o), keys)]
        if "repeat" in dims:  # after the user's overrides: the matrix decides the arm and the repeat
            args += [] if run.overlap else ["strategy.overlap=false"]
            if run.variant:
                args += [*self.variant_overrides(run.variant)[1], f"train.variant={run.variant}"]
            args.append(f"train.repeat={run.repeat}")
            share = self.config(run).train.cpu_share
            if share != self.base.train.cpu_share:
                args.append(f"train.cpu_share={share}")
        # a key the user's overrides set and the matrix sets after them once, as the matrix's: the command
        # refuses a key given twice
        last = {override_key(o): i for i, o in enumerate(args)}
        return [*options, *(o for i, o in enumerate(args) if last[override_key(o)] == i)]

    def stage_params(self, stage: str, run: Run) -> str:
        """JSON of what `stage` reads for `run` (resolved values and arguments): Snakemake's rerun key."""
        data = {
            "config": select(to_dict(self.stage_config(stage, run)), self.stage_keys(stage, run)),
            "args": self.stage_args(stage, run),
        }
        return json.dumps(data, sort_keys=True)

    def stage_command(self, stage: str, run: Run) -> str:
        """The stage's Hydra overrides as one shell-quoted string."""
        return shlex.join(self.stage_args(stage, run))

    def slurm_resources(self, run: Run, stage: str) -> dict[str, Any]:
        """SLURM resources of a job of `stage` for `run` (:func:`ralp_pipe.workflow.slurm.job_resources`);
        the link probe spans as many nodes (at most two) as the training runs of its network do."""
        if stage == "check_links":  # the hosts of the run it checks
            return job_resources(self.config(run), stage)
        if stage != "probe":
            return job_resources(self.stage_config(stage, run), stage)
        spans = max(len(ranks_per_node(self.config(r))) for r in self.runs if r.network == run.network)
        return job_resources(self.stage_config(stage, run), stage, probe_nodes=spans)

    def check_slurm(self) -> None:
        """Refuse, while the workflow parses, any job of the experiment that SLURM cannot place (with the numbers)."""
        for stage in ("prepare_shards", "profile", "plan"):
            self.slurm_resources(self.runs[0], stage)
        for network in self.base.experiment.networks:
            self.slurm_resources(self.first(network=network), "probe")
        for run in self.runs:
            self.slurm_resources(run, "train")
        if self.workloads:
            self.concurrent_resources()

    def resolved(self) -> dict[str, Any]:
        """Every run's resolved config, keyed by its run id (for bundles)."""
        return {run_id(run): to_dict(cfg) for run, cfg in self._configs.items()}

    def write_resolved(self, path: str | Path) -> None:
        """Write the workflow settings, the experiment's config and every run's config as JSON."""
        doc = {
            "settings": {
                "experiment": self.settings.experiment,
                "overrides": list(self.settings.overrides),
                "dataset_overrides": {k: list(v) for k, v in self.settings.dataset_overrides.items()},
                "launcher": "slurm" if self.settings.slurm else "local",
                "stage_options": {k: list(v) for k, v in self.settings.stage_options.items()},
            },
            "experiment": to_dict(self.base),
            "runs": self.resolved(),
        }
        write_json_atomic(path, doc)

    def digest(self) -> str:
        """Short hash of the whole resolved experiment (names its bundle); computed once (the rules ask again)."""
        if self._digest is None:
            self._digest = digest(self.resolved())
        return self._digest

    def __iter__(self) -> Iterator[Run]:
        return iter(self.runs)


def run_id(run: Run) -> str:
    """A run's path below ``runs/``: dataset/model/n<N>-<network>/<arm>/r<repeat>."""
    return RUN_ID.format(**run.wildcards)
