"""The typed records the stages hand each other: a run's metrics, a profile, a plan.

Each record is a frozen dataclass whose fields are the JSON keys, in the order they are
written; the JSON also carries ``"schema_version"`` (:data:`SCHEMA_VERSION`). A file without
it is read as version 1; a newer version, a missing required key or an unknown key is refused
with a :class:`~ralp_pipe.errors.DataError` naming the file and the key. Fields with a default
may be absent from a version-1 file (hand-written plans and test records hold only what their
readers use). Parts whose shape belongs to another module (the config, per-host wire bytes,
unit tables, plan entries) stay plain dicts.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping, Self, Sequence

from ralp_pipe.atomic import write_json_atomic
from ralp_pipe.config import Config, ConfigError, made_for
from ralp_pipe.contract.layout import CONFIGURATION_ID, RUN_ID, arm
from ralp_pipe.errors import DataError

SCHEMA_VERSION = 1
VERSION_KEY = "schema_version"
_COLUMN = {"column": True}  # field metadata: copied as is into runs.parquet


@dataclass(frozen=True, kw_only=True)
class Record:
    """Base of the records: JSON keys = dataclass fields, plus the schema version."""

    KIND: ClassVar[str] = "record"
    STAGE: ClassVar[str] = ""  # the `ralp-pipe` stage that writes it

    @classmethod
    def required(cls) -> tuple[str, ...]:
        """Keys every file of this record must hold."""
        return tuple(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], source: str | Path) -> Self:
        """The record of a parsed JSON document read from `source` (named in errors)."""
        where = f"{cls.KIND} {source}"
        if not isinstance(doc, Mapping):
            raise DataError(f"{where} is not a JSON object: re-run `ralp-pipe {cls.STAGE}`")
        version = doc.get(VERSION_KEY, 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise DataError(f"{where} has {VERSION_KEY}={version!r}, not a positive integer")
        if version > SCHEMA_VERSION:
            raise DataError(
                f"{where} has {VERSION_KEY} {version} but this ralp-pipe reads up to {SCHEMA_VERSION}: "
                f"upgrade ralp-pipe or re-run `ralp-pipe {cls.STAGE}`"
            )
        known = {f.name for f in fields(cls)}
        missing = [key for key in cls.required() if key not in doc]
        if missing:
            raise DataError(f"{where} lacks key {', '.join(map(repr, missing))}: re-run `ralp-pipe {cls.STAGE}`")
        unknown = sorted(set(doc) - known - {VERSION_KEY})
        if unknown:
            raise DataError(f"{where} has unknown key {', '.join(map(repr, unknown))} for {VERSION_KEY} {version}")
        return cls(**{key: value for key, value in doc.items() if key in known})

    @classmethod
    def read(cls, path: str | Path) -> Self:
        """The record in JSON file `path`."""
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"cannot read {cls.KIND} {path}: {exc}; write it with `ralp-pipe {cls.STAGE}`") from exc
        return cls.from_dict(doc, path)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: schema version first, then the fields in order."""
        return {VERSION_KEY: SCHEMA_VERSION, **{f.name: getattr(self, f.name) for f in fields(self)}}

    def write(self, path: str | Path) -> None:
        """Write the record to `path` atomically."""
        write_json_atomic(path, self.to_dict())


@dataclass(frozen=True, kw_only=True)
class RunMetrics(Record):
    """metrics.json of one training run (see :mod:`ralp_pipe.engine.metrics` for the definitions)."""

    KIND: ClassVar[str] = "run record"
    STAGE: ClassVar[str] = "train"

    model: str = field(metadata=_COLUMN)
    dataset: str = field(metadata=_COLUMN)
    num_classes: int
    strategy: str = field(metadata=_COLUMN)
    gpus: int = field(metadata=_COLUMN)
    workers: int = field(metadata=_COLUMN)
    num_ps: int = field(metadata=_COLUMN)
    split: int | None = field(metadata=_COLUMN)
    network: str = field(metadata=_COLUMN)
    rate: str = field(metadata=_COLUMN)  # network.rate as configured ("unlimited" where nothing shapes the link)
    link_gbit: float | None = None  # the rate the run's link had: the tc rate where shaped, else the plan's probe
    link_source: str | None = None  # where link_gbit comes from (engine.metrics.link_rate); None: unknown
    batch_size: int = field(metadata=_COLUMN)
    global_batch: int = field(metadata=_COLUMN)
    image_size: int = field(metadata=_COLUMN)
    warmup_steps: int = field(metadata=_COLUMN)
    measure_steps: int = field(metadata=_COLUMN)
    images_per_sec: float = field(metadata=_COLUMN)
    # a dilated run's images/sec x its factor (engine/dilation.py); None when undilated
    target_images_per_sec: float | None = field(default=None, metadata=_COLUMN)
    # factor, mode, target_device, target_link_rate, shaped_link_rate, compute_batch_size, compute_image_size,
    # overruns and late_s (measured steps), needed_factor, auto (how auto chose the factor); None: undilated
    dilation: dict[str, Any] | None = None
    # strategy.transport_cap set (dtf's gRPC): the cap, the share of the link it leaves, whether and how the run applied it
    transport: dict[str, Any] | None = None
    # emulated hosts of several GPUs: their count, each rank's host, the interconnect and how ranks of one host
    # exchanged data (route), where RALP's PS device was; None at one GPU per host
    intra_host: dict[str, Any] | None = None
    # one job of a concurrent workload: the workload's jobs, whose windows started together (train.gate), and the
    # unmeasured steps this one ran after its window while the others measured; None for a run alone
    gate: dict[str, Any] | None = None
    images_per_step: int = field(metadata=_COLUMN)
    step_time_s: float = field(metadata=_COLUMN)
    window_s: float | None = None
    gb_per_step: dict[str, float]  # by category and "total"
    analytic_gb_per_step: dict[str, float]
    wire_gb_per_step: float | None  # the kernel's link counters (emulated hosts, SLURM nodes); None elsewhere
    wire_per_host: dict[str, Any] | None = None
    world_size: int | None = None
    roles: list[str] | None = None
    hosts: list[str] | None = None  # host name of every rank (the SLURM node it ran on)
    peak_rss_mb: list[float] | None = None  # peak resident memory of every rank's process, MiB
    # when each phase of the run ended, in seconds since the epoch: the driver's (started, imported, configured,
    # hosts_up, ranks_done, recorded) and rank 0's (engine/rank.py RankResult.timeline); None in older records
    timeline: dict[str, float] | None = None
    device: str | None = field(default=None, metadata=_COLUMN)  # torch device of the ranks (cpu, cuda:0)
    backend: str | None = field(default=None, metadata=_COLUMN)  # gloo or nccl
    loader: str | None = field(default=None, metadata=_COLUMN)  # train.loader
    hardware: dict[str, Any]
    versions: dict[str, Any]
    git_revision: str | None = field(metadata=_COLUMN)
    config_hash: str = field(metadata=_COLUMN)
    config: dict[str, Any]

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The fields runs.parquet copies unchanged, in order."""
        return tuple(f.name for f in fields(cls) if f.metadata.get("column"))

    def _setting(self, section: str, key: str, default: Any) -> Any:
        return (self.config.get(section) or {}).get(key, default)

    @property
    def overlap(self) -> bool:
        """Whether the run pipelined its push/pull (``strategy.overlap``; records without it: True)."""
        return bool(self._setting("strategy", "overlap", True))

    @property
    def cluster_kind(self) -> str | None:
        """The cluster kind the run ran on (``cluster.kind``; records without it: None)."""
        return self._setting("cluster", "kind", None)

    @property
    def dilation_factor(self) -> float:
        """The run's dilation factor D (its seconds are D times the target's); NaN for an undilated run."""
        return float((self.dilation or {}).get("factor") or math.nan)

    @property
    def repeat(self) -> int:
        """Which repeat of its configuration the run is (``train.repeat``; records without it: 0)."""
        return int(self._setting("train", "repeat", 0))

    @property
    def arm(self) -> str:
        """The strategy's row name: the strategy, or ``<strategy>-sequential`` without overlap, then ``-<variant>``
        for a run of an experiment.variants entry (``train.variant``)."""
        return arm(self.strategy, self.overlap, self.variant)

    @property
    def variant(self) -> str | None:
        """The experiment.variants entry the run is (``train.variant``; records without it: None)."""
        return self._setting("train", "variant", None)

    @property
    def configuration(self) -> str:
        """The run's configuration, shared by its repeats: dataset/model/n<N>-<network>/arm."""
        return CONFIGURATION_ID.format(**self._ids())

    @property
    def run(self) -> str:
        """The run's name: dataset/model/n<N>-<network>/arm/r<repeat>."""
        return RUN_ID.format(**self._ids())

    def _ids(self) -> dict[str, Any]:
        names = ("dataset", "model", "gpus", "network", "arm", "repeat")
        return {name: getattr(self, name) for name in names}


@dataclass(frozen=True, kw_only=True)
class Profile(Record):
    """A profile of one model on one device: measured (`ralp-pipe profile`), or modelled for a target GPU
    (`ralp-pipe profile --target NAME`, :mod:`ralp_pipe.engine.devicemodel`); both have this schema."""

    KIND: ClassVar[str] = "profile"
    STAGE: ClassVar[str] = "profile"

    model: str
    dataset: str | None = None
    num_classes: int
    image_size: int
    batch_size: int | None = None
    gpus: int | None = None
    batches: dict[str, int]  # role or batch -> batch size profiled
    device: str  # cpu, cuda or analytic
    kind: str = "measured"  # measured on `device`, or modelled for `target`
    target: dict[str, Any] | None = None  # the device entry a modelled profile priced (config/device/<name>.yaml)
    model_version: str | None = None  # the device model that priced a modelled profile
    worker_memory_bytes: int | None = None  # modelled: what one worker holds training the whole model
    training_backend: str | None = None
    cluster_kind: str | None = None
    warmup: int | None = None
    repeats: int | None = None
    memory_method: str | None = None
    hardware: dict[str, Any] | None = None
    link: dict[str, Any]  # "measured" (None or the probe's result), configured rate
    units: list[dict[str, Any]]  # one row per placement unit, see planning.profiling
    update: dict[str, Any]
    profile_seconds: float | None = None

    @property
    def device_name(self) -> str:
        """What the profile times: the device entry a modelled profile priced, the GPU a CUDA profile ran on (its
        `hardware` record's first GPU), else `device` (cpu)."""
        if self.target and self.target.get("name"):
            return str(self.target["name"])
        gpus = (self.hardware or {}).get("gpus") or []
        if self.device == "cuda" and gpus and gpus[0].get("name"):
            return str(gpus[0]["name"])
        return self.device

    def unit_seconds(self, batch: int) -> tuple[list[float], list[float]]:
        """Every unit's forward and backward seconds at `batch` (:func:`at_batch` over the batches it was timed at)."""
        curves = [unit_curve(row) for row in self.units]
        return (
            [at_batch(batches, fwd, batch) for batches, fwd, _ in curves],
            [at_batch(batches, bwd, batch) for batches, _, bwd in curves],
        )

    def seconds_per_byte(self) -> tuple[float, float]:
        """Seconds per parameter byte of the SGD update and of adding one more gradient set (`update`)."""
        try:
            return float(self.update["update_s_per_byte"]), float(self.update["aggregate_s_per_byte"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"profile's update lacks a number {exc}: re-run `ralp-pipe {self.STAGE}`") from exc


def check_profile_matches(profile: Profile, cfg: Config, path: str | Path) -> None:
    """Refuse a profile (read from `path`) of another model, class count or image size than `cfg`."""
    wanted = made_for(cfg)
    for key in ("model", "num_classes", "image_size"):
        value, profiled = wanted[key], getattr(profile, key)
        if profiled != value:
            raise ConfigError(
                f"profile {path} has {key}={profiled!r} but the configuration asks for {value!r}: "
                f"profile that configuration or pass matching overrides"
            )


def unit_curve(row: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
    """A profile unit row's batches (ascending) and its forward and backward seconds at each (``by_batch``)."""
    name = row.get("name") if isinstance(row, Mapping) else None
    try:
        by_batch = row["by_batch"]
        batches = sorted(by_batch, key=int)
        curve = (
            tuple(int(b) for b in batches),
            tuple(float(by_batch[b]["fwd_s"]) for b in batches),
            tuple(float(by_batch[b]["bwd_s"]) for b in batches),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"profile unit {name!r} has no forward and backward seconds per batch ({exc!r})") from exc
    if not batches or curve[0][0] < 1:
        raise DataError(f"profile unit {name!r} has no batch of at least 1 in by_batch")
    return curve


def at_batch(batches: Sequence[int], values: Sequence[float], batch: int) -> float:
    """`values` timed at the ascending `batches`, at `batch`: linear between two of them, proportional to the batch
    below the first and beyond the last (as numpy.interp between them, without importing numpy)."""
    if batch <= batches[0]:
        return values[0] * batch / batches[0]
    if batch >= batches[-1]:
        return values[-1] * batch / batches[-1]
    i = bisect_right(batches, batch) - 1
    slope = (values[i + 1] - values[i]) / (batches[i + 1] - batches[i])
    return slope * (batch - batches[i]) + values[i]


@dataclass(frozen=True, kw_only=True)
class LinkProbe(Record):
    """The link of one network as training's ranks see it (`ralp-pipe profile --link-only`)."""

    KIND: ClassVar[str] = "link probe"
    STAGE: ClassVar[str] = "profile --link-only"

    network: str
    cluster_kind: str
    interface: str | None = None  # the fabric's interface the probe bound to (SLURM); None: auto
    measured: dict[str, Any] | None  # the probe's result (bytes/s per direction, latency, all-reduce)
    configured_rate: str | None = None  # network.rate where the cluster shapes its links, else None
    configured_bytes_per_s: float | None = None
    hardware: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Plan(Record):
    """A plan: the chosen split and predictions of every strategy (`ralp-pipe plan`)."""

    KIND: ClassVar[str] = "plan"
    STAGE: ClassVar[str] = "plan"

    model: str | None = None
    dataset: str | None = None
    num_classes: int | None = None
    image_size: int | None = None
    batch_size: int | None = None
    gpus: int | None = None
    network: str | None = None
    cluster_kind: str | None = None
    bandwidth_bytes_per_s: float | None = None
    bandwidth_source: str | None = None
    latency_s: float | None = None
    allreduce_bytes_per_s: float | None = None
    shared_cpu: dict[str, int | None] | None = None  # cores, profile_threads, share (None: the world)
    profile: str | None = None
    profile_kind: str | None = None  # the profile's kind: measured (on profile_device) or modelled (for it)
    profile_device: str | None = None  # what the profile prices: cpu or cuda where measured, the target entry's name
    link: str | None = None  # the link record the plan priced transfers with; None: the profile's own link
    recommended: str | None = None
    strategies: dict[str, dict[str, Any]]  # strategy -> plan entry at `gpus`; the engine reads its "split"
    by_gpus: dict[str, dict[str, dict[str, Any]]] | None = None  # str(N) -> strategy -> plan entry
