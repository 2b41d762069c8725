"""Composing `config/` with Hydra, building the typed :class:`Config` and validating its values.

Every stage reads its settings through :func:`load`, which composes the Hydra tree with the
user's overrides, checks types against the schema's dataclasses and then checks values
(choices, ranges, paths) so that a bad setting fails early with a message naming the key,
the value and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import asdict, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Sequence, cast, get_args, get_origin, get_type_hints

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from ralp_pipe.config.clusters import cluster_kind
from ralp_pipe.config.schema import (
    ARCH_FIELDS,
    ARCHES,
    AUTO_FACTOR,
    BACKENDS,
    CLUSTERS,
    CONFIG_DIR,
    DEVICES,
    DILATION_MODES,
    LAYOUTS,
    LOADERS,
    MIN_IMAGE_SIZE,
    MODELS,
    PROFILE_TARGET_SUFFIX,
    PS_PLACEMENTS,
    SAFE_NAME,
    VARIABLE_PLACEMENTS,
    VARIABLE_UPDATES,
    ClusterConfig,
    Config,
    DatasetConfig,
    DeviceConfig,
    ExperimentConfig,
    NetworkConfig,
    StrategyConfig,
    TrainConfig,
)
from ralp_pipe.config.strategies import STRATEGY_KINDS, strategy_kind
from ralp_pipe.config.units import rate_bits_per_s, size_bytes
from ralp_pipe.errors import ConfigError


def load(overrides: Sequence[str] = (), config_dir: Path = CONFIG_DIR) -> Config:
    """Compose `config/` with Hydra `overrides`, type-check it and validate its values.

    Every failure is one line naming the override or key at fault and what is allowed there.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException, MissingConfigException

    _check_keys(overrides, config_dir)
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            raw = compose(config_name="config", overrides=list(overrides))
    except MissingConfigException as exc:
        raise ConfigError(_missing_option(exc, config_dir)) from exc
    except HydraException as exc:
        raise ConfigError(f"cannot compose the configuration from {config_dir}: {_one_line(str(exc))}") from exc
    try:
        data = OmegaConf.to_container(raw, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(_unresolved(exc, raw)) from exc
    return from_dict(cast(dict[str, Any], data), config_dir)


def _parse_overrides(overrides: Sequence[str]) -> list[Any]:
    """Hydra's reading of `overrides` (its ``Override`` objects); a malformed one is refused naming it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return list(OverridesParser.create().parse_overrides(list(overrides)))
    except OverrideParseException as exc:
        raise ConfigError(
            f"override {exc.override!r} is not of the form key=value (or group=option, +key=value, ~key): "
            f"{_one_line(exc.message)}"
        ) from exc


def refuse_repeated(overrides: Sequence[str]) -> None:
    """Refuse a key given twice in one list of overrides, which Hydra would silently settle by the last."""
    seen: dict[str, str] = {}
    for override in _parse_overrides(overrides):
        key = override.key_or_group
        if key in seen:
            raise ConfigError(f"{key} is given twice ({seen[key]}, then {override.input_line}): give it once")
        seen[key] = override.input_line


def _check_keys(overrides: Sequence[str], config_dir: Path) -> None:
    """Refuse an override of a key the schema does not have, or of a section as if it were a value."""
    groups = {p.name for p in config_dir.iterdir() if p.is_dir()}
    for override in _parse_overrides(overrides):
        key = override.key_or_group
        if key in groups or key.split(".")[0] == "hydra" or override.is_delete():
            continue  # a group's option (checked by Hydra), Hydra's own settings, a deletion
        kind = _schema_type(key)
        if is_dataclass(kind):
            raise ConfigError(
                f"{override.input_line}: {key} is a section, not a value; set its keys "
                f"({', '.join(f.name for f in fields(kind))}), e.g. {key}.{fields(kind)[0].name}=..."
            )


# keys the schema no longer has, and what to set instead (an old config or override setting one is refused with it)
REMOVED_KEYS = {
    "cluster.slurm.gpus_per_node": "set cluster.gpus_per_node to the GPUs of one node (plan, emulation and SLURM "
    "share it) and cluster.device=cuda to ask SLURM for them (cpu or auto: CPU nodes, no GPU asked for)",
}


def _schema_type(key: str) -> Any:
    """The schema's type of dotted config `key` (list indices ignored); refused naming what is there if none."""
    kind: Any = Config
    plain = re.sub(r"\[\d+\]", "", key)
    if plain in REMOVED_KEYS:
        raise ConfigError(f"{plain} is no longer a config key: {REMOVED_KEYS[plain]}")
    parts = plain.split(".")
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth])
        if get_origin(kind) is dict:  # a mapping's entry (experiment.gpus_by_model.alexnet): its value type
            kind = get_args(kind)[1]
            continue
        if not is_dataclass(kind):
            raise ConfigError(f"there is no config key {key!r}: {where} holds {_describe(kind)}, not keys")
        hints = get_type_hints(kind)
        if part not in hints:
            raise ConfigError(
                f"there is no config key {key!r}; the keys of {where or 'the configuration'} are: "
                f"{', '.join(f.name for f in fields(kind))}"
            )
        kind = hints[part]
    return kind


_WORDS = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans")}


def _describe(kind: Any, plural: bool = False) -> str:
    """Words for a schema type: "an integer", "a list of integers", "a string or null"."""
    args = [a for a in get_args(kind) if a is not type(None)]
    if len(args) < len(get_args(kind)):  # Optional
        return f"{_describe(args[0], plural)} or null"
    if get_origin(kind) is list:
        return f"{'lists' if plural else 'a list'} of {_describe(args[0], True)}"
    if get_origin(kind) is dict:
        return f"{'mappings' if plural else 'a mapping'} of names to {_describe(args[1], True)}"
    if is_dataclass(kind):
        return f"a section (keys: {', '.join(f.name for f in fields(kind))})"
    return _WORDS.get(kind, ("a string", "strings"))[plural]


def _one_line(text: str) -> str:
    """Hydra's or OmegaConf's message in one line: its lines joined, without the search path and links."""
    lines = []
    for line in text.splitlines():
        if line.startswith(("Config search path", "    full_key:")):
            break
        if line.strip() and not line.startswith("See https://"):
            lines.append(line.strip())
    return ": ".join(lines)


def _missing_option(exc: Any, config_dir: Path) -> str:
    """The message for a group option that has no file: the group, the option and the group's options."""
    group, _, option = str(exc.missing_cfg_file or "").rpartition("/")
    options = list(exc.options or []) or sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
    if not (group and options):
        return f"cannot compose the configuration from {config_dir}: {_one_line(str(exc))}"
    return f"{group}={option!r} is not allowed; choose one of: {', '.join(options)}"


def _unresolved(exc: OmegaConfBaseException, raw: Any) -> str:
    """The message for a value whose interpolation fails (``${oc.env:UNSET}``): the key, its value and why."""
    key = getattr(exc, "full_key", None) or "?"
    node: Any = OmegaConf.to_container(raw, resolve=False)
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    cause = exc.__cause__
    reason = str(cause.args[0]) if isinstance(cause, Exception) and cause.args else _one_line(str(exc))
    return f"{key}={node!r} cannot be resolved: {reason}; set what it refers to, or give the value itself"


def from_dict(data: dict[str, Any], config_dir: Path = CONFIG_DIR) -> Config:
    """Build a validated :class:`Config` from plain data (for example a saved resolved config); the device's
    null efficiencies take its architecture's (:func:`with_arch`)."""
    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, data)
    except ConfigKeyError as exc:
        _schema_type(exc.full_key or "")  # raises, naming the keys that are there
        raise ConfigError(f"config key {exc.full_key!r}: {_one_line(exc.msg)}") from exc
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        if not key:
            raise ConfigError(f"configuration: {_one_line(str(exc))}") from exc
        base = re.sub(r"\[\d+\]", "", key)
        must = f"{'it' if base == key else base} must be {_describe(_schema_type(key))}"
        raise ConfigError(f"{key}={getattr(exc, 'value', None)!r} is not allowed: {must}") from exc
    cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    cfg.device = with_arch(cfg.device, config_dir)
    validate(cfg)
    return cfg


def with_arch(device: DeviceConfig, config_dir: Path = CONFIG_DIR) -> DeviceConfig:
    """`device` with every null fitted field (:data:`ARCH_FIELDS`) taken from its architecture's
    ``config/device/arch/<arch>.yaml``; the fields it sets itself stay."""
    _choice("device.arch", device.arch, ARCHES)
    missing = [name for name in ARCH_FIELDS if getattr(device, name) is None]
    if not missing:
        return device
    path = config_dir / "device" / "arch" / f"{device.arch}.yaml"
    try:
        fitted = OmegaConf.to_container(OmegaConf.load(path))
    except (OSError, OmegaConfBaseException) as exc:
        raise ConfigError(f"device.arch={device.arch}: cannot read {path} ({_one_line(str(exc))})") from exc
    absent = [name for name in missing if not isinstance(fitted, dict) or fitted.get(name) is None]
    if absent:
        raise ConfigError(
            f"{path} gives no {', '.join(absent)}: run `python benchmarks/device_model.py --write`, or set "
            f"{', '.join(f'device.{name}' for name in absent)}"
        )
    assert isinstance(fitted, dict)
    values: dict[str, Any] = {name: float(fitted[name]) for name in missing}
    return replace(device, **values)


def _validate_dilation(cfg: Config) -> None:
    """The dilation section: a mode, a shipped target or a readable profile file, a factor > 0 or "auto", a compute
    size no larger than the run's. (What the profile holds is checked against the run where it is read:
    :func:`ralp_pipe.engine.dilation.target_profile`.)"""
    d, t = cfg.dilation, cfg.train
    _choice("dilation.mode", d.mode, DILATION_MODES)
    profile = d.target_profile
    if profile is None:
        _choice("dilation.target", d.target, device_entries())
    elif not (profile.is_file() and os.access(profile, os.R_OK)):
        raise ConfigError(
            f"dilation.target={d.target!r} names no readable profile file (a target ending in "
            f"{PROFILE_TARGET_SUFFIX} is one): write it with `ralp-pipe profile --out {d.target}` or name a "
            f"config/device entry ({', '.join(device_entries())})"
        )
    factor = d.factor
    if factor is not None and factor != AUTO_FACTOR:
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise ConfigError(f"dilation.factor={factor!r} is not allowed: give a number > 0, {AUTO_FACTOR} or null")
        _in_range(
            "dilation.factor",
            factor,
            0.0,
            math.inf,
            f"(0, inf): D >= 1 slows the emulated cluster, 0 < D < 1 runs it faster than the target (e.g. 0.5, 0.25, "
            f"0.125, where `ralp-pipe check-links` finds its links accurate at rate / D); or {AUTO_FACTOR} or null "
            "(no dilation)",
            low_open=True,
        )
    _in_range("dilation.margin", d.margin, 1.0, math.inf, "[1, inf)")
    _in_range("dilation.link_accuracy", d.link_accuracy, 0.0, 1.0, "(0, 1]", low_open=True)
    for key, value, target in (
        ("compute_batch_size", d.compute_batch_size, t.batch_size),
        ("compute_image_size", d.compute_image_size, t.image_size),
    ):
        if value is None:
            continue
        if d.mode != "real":
            raise ConfigError(f"dilation.{key}={value} applies to mode real only (modelled mode computes nothing)")
        _in_range(f"dilation.{key}", value, 1, target, f"[1, {target}] (train.{key.removeprefix('compute_')})")
    if d.compute_image_size is not None:
        _at_least("dilation.compute_image_size", d.compute_image_size, MIN_IMAGE_SIZE.get(cfg.model.name, 32))
    planned = cfg.experiment.target
    if factor is not None and planned is not None and planned != d.target:
        remedy = "set experiment.target=null" if profile is not None else "give both the same config/device entry"
        raise ConfigError(
            f"experiment.target={planned} plans for another GPU than dilation.target={d.target} emulates: {remedy}"
        )


def _choice(key: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def _at_least(key: str, value: int | float, low: int | float) -> None:
    if value < low:
        raise ConfigError(f"{key}={value!r} must be at least {low}")


def _in_range(
    key: str, value: float, low: float, high: float, shown: str, low_open: bool = False, high_open: bool = False
) -> None:
    """Refuse NaN, infinities and values outside [low, high] (open ends as flagged)."""
    inside = (
        math.isfinite(value)
        and (low < value if low_open else low <= value)
        and (value < high if high_open else value <= high)
    )
    if not inside:
        raise ConfigError(f"{key}={value!r} must be a finite number in {shown}")


def _safe_name(key: str, value: str) -> None:
    if not SAFE_NAME.match(value):
        raise ConfigError(f"{key}={value!r} may hold only letters, digits, '_', '.' and '-' (it names files and jobs)")


def validate(cfg: Config) -> None:
    """Refuse values that no stage can use, naming the key, the value and what is allowed."""
    _validate_dataset(cfg.dataset)
    _choice("model.name", cfg.model.name, MODELS)
    if not 0.0 <= cfg.model.dropout < 1.0:
        raise ConfigError(f"model.dropout={cfg.model.dropout!r} must be in [0, 1)")
    _validate_strategy(cfg.strategy)
    _validate_cluster(cfg.cluster, cfg.strategy.name)
    _validate_hosts(cfg)
    _validate_network(cfg.network, cfg.cluster.kind)
    _validate_train(cfg.train, cfg.model.name)
    _validate_device(cfg)
    _validate_dilation(cfg)
    _validate_experiment(cfg.experiment)


def _validate_dataset(d: DatasetConfig) -> None:
    """The dataset's name, layout and class count, where its images are, and how its shards are cut."""
    _safe_name("dataset.name", d.name)
    _choice("dataset.layout", d.layout, LAYOUTS)
    _at_least("dataset.num_classes", d.num_classes, 2)
    if d.layout != "synthetic":
        if not d.source:
            raise ConfigError(
                f"dataset.source is missing for dataset '{d.name}' (layout '{d.layout}'): "
                f"set dataset.source=/path/to/imagenet on the command line"
            )
        if not Path(d.source).is_dir():
            raise ConfigError(
                f"dataset.source={d.source!r} (dataset '{d.name}') is not a readable folder: "
                f"point it at the ImageNet class folders or per-synset tars"
            )
    _at_least("dataset.synthetic.images_per_class", d.synthetic.images_per_class, 1)
    _at_least("dataset.synthetic.height", d.synthetic.height, 8)
    _at_least("dataset.synthetic.width", d.synthetic.width, 8)
    _at_least("dataset.shards.images_per_shard", d.shards.images_per_shard, 1)
    _at_least("dataset.shards.workers", d.shards.workers, 1)
    if d.shards.resize_shorter is not None:
        _at_least("dataset.shards.resize_shorter", d.shards.resize_shorter, 8)


def _validate_strategy(s: StrategyConfig) -> None:
    _choice("strategy.name", s.name, tuple(STRATEGY_KINDS))
    _at_least("strategy.num_ps", s.num_ps, 1)
    if s.split is not None:
        _at_least("strategy.split", s.split, 1)
    _in_range("strategy.bucket_mb", s.bucket_mb, 0.0, math.inf, "[0, inf)")
    _at_least("strategy.credit", s.credit, 0)
    _choice("strategy.ps_placement", s.ps_placement, PS_PLACEMENTS)
    _choice("strategy.variable_placement", s.variable_placement, VARIABLE_PLACEMENTS)
    _choice("strategy.variable_update", s.variable_update, VARIABLE_UPDATES)
    if s.transport_cap is not None and not rate_bits_per_s(s.transport_cap, "strategy.transport_cap"):
        raise ConfigError(f"strategy.transport_cap={s.transport_cap!r}: give a positive rate (e.g. 19gbit) or null")
    if s.step_barrier and s.name != "dtf":
        raise ConfigError(f"strategy.step_barrier=true applies to dtf only (strategy={s.name}): leave it false")
    if s.ps_apply_ns_per_byte is not None:
        _in_range("strategy.ps_apply_ns_per_byte", s.ps_apply_ns_per_byte, 0.0, math.inf, "(0, inf)", low_open=True)
    _in_range("strategy.rpc_us_per_tensor", s.rpc_us_per_tensor, 0.0, math.inf, "[0, inf)")


def _validate_hosts(cfg: Config) -> None:
    """GPUs per host at least 1, and an interconnect with a bandwidth where hosts hold several."""
    _at_least("cluster.gpus_per_node", cfg.cluster.gpus_per_node, 1)
    _safe_name("interconnect.name", cfg.interconnect.name)
    rate = cfg.interconnect.gbytes_per_s
    if rate is not None:
        _in_range("interconnect.gbytes_per_s", rate, 0.0, math.inf, "(0, inf)", low_open=True)
    elif cfg.cluster.gpus_per_node > 1:
        raise ConfigError(
            f"cluster.gpus_per_node={cfg.cluster.gpus_per_node} but interconnect={cfg.interconnect.name!r} has no "
            f"bandwidth: name what links a host's GPUs (interconnect=pcie3, nvlink1, nvlink2, nvlink3 or nvlink4)"
        )


def _validate_cluster(c: ClusterConfig, strategy: str) -> None:
    """The cluster's kind, device and backend, enough devices for `strategy`, its timeouts and SLURM requests."""
    _choice("cluster.kind", c.kind, CLUSTERS)
    _choice("cluster.device", c.device, DEVICES)
    _choice("cluster.backend", c.backend, BACKENDS)
    _at_least("cluster.gpus", c.gpus, 1)
    kind = strategy_kind(strategy)
    if c.gpus < kind.min_gpus:
        raise ConfigError(
            f"cluster.gpus={c.gpus} is too few for {strategy}: it needs at least {kind.min_gpus} ({kind.ranks})"
        )
    _at_least("cluster.timeout_s", c.timeout_s, 1)
    _at_least("cluster.init_timeout_s", c.init_timeout_s, 1)
    for key in ("partition", "account"):
        if getattr(c.slurm, key) is not None:
            _safe_name(f"cluster.slurm.{key}", getattr(c.slurm, key))
    for key in ("cpus_per_task", "mem_mb", "time_min", "margin_min"):
        _at_least(f"cluster.slurm.{key}", getattr(c.slurm, key), 1)
    for key in ("max_nodes", "cpus_per_node", "mem_mb_per_node"):
        if getattr(c.slurm, key) is not None:
            _at_least(f"cluster.slurm.{key}", getattr(c.slurm, key), 1)


def _validate_network(n: NetworkConfig, cluster: str) -> None:
    """The network's name, rate, burst and interface; no rate on a cluster whose fabric nothing shapes."""
    _safe_name("network.name", n.name)
    rate_bits_per_s(n.rate, "network.rate")
    size_bytes(n.burst, "network.burst")
    if n.interface is not None:
        _safe_name("network.interface", n.interface)
    if cluster_kind(cluster).on_fabric and n.rate != "unlimited":
        raise ConfigError(
            f"network '{n.name}' sets network.rate={n.rate!r}, but nothing shapes a SLURM cluster's network: "
            f"its fabric is what the hardware is; use a network naming the fabric's interface "
            f"(experiment.networks=[fabric], network.interface=...) or cluster=emulated for a shaped link"
        )


def _validate_train(t: TrainConfig, model: str) -> None:
    """Batch, image size (at least what `model` takes), steps, loader and SGD settings of a run."""
    _at_least("train.batch_size", t.batch_size, 1)
    _at_least("train.image_size", t.image_size, MIN_IMAGE_SIZE.get(model, 32))
    _at_least("train.warmup_steps", t.warmup_steps, 0)
    _at_least("train.measure_steps", t.measure_steps, 1)
    _at_least("train.loader_threads", t.loader_threads, 1)
    if t.cpu_share is not None:
        _at_least("train.cpu_share", t.cpu_share, 1)
    _choice("train.loader", t.loader, LOADERS)
    _in_range("train.lr", t.lr, 0.0, math.inf, "(0, inf)", low_open=True)
    _in_range("train.momentum", t.momentum, 0.0, 1.0, "[0, 1)", high_open=True)
    _in_range("train.weight_decay", t.weight_decay, 0.0, math.inf, "[0, inf)")
    _at_least("train.repeat", t.repeat, 0)
    _at_least("train.gate_jobs", t.gate_jobs, 1)
    if t.variant is not None:
        _safe_name("train.variant", t.variant)


def _validate_experiment(e: ExperimentConfig) -> None:
    """The matrix the experiment asks for: its models, strategies, N, repeats, names and pairs."""
    _safe_name("experiment.name", e.name)
    if e.target is not None and e.target.endswith(PROFILE_TARGET_SUFFIX):
        raise ConfigError(
            f"experiment.target={e.target} is a profile file, but the workflow profiles and plans only for a "
            f"config/device entry ({', '.join(device_entries())}) or null: emulate a profile with "
            f"`ralp-pipe train dilation.target={e.target}`"
        )
    if e.target is not None:
        _choice("experiment.target", e.target, device_entries())
    for model in e.models:
        _choice("experiment.models[]", model, MODELS)
    for strategy in e.strategies:
        _choice("experiment.strategies[]", strategy, tuple(STRATEGY_KINDS))
    for gpus in e.gpus:
        _at_least("experiment.gpus[]", gpus, 2)
    _narrowing("gpus", e.gpus_by_model, e.gpus, ("model", "models"), e.models, MODELS)
    _narrowing("gpus", e.gpus_by_strategy, e.gpus, ("strategy", "strategies"), e.strategies, tuple(STRATEGY_KINDS))
    _narrowing("networks", e.networks_by_model, e.networks, ("model", "models"), e.models, MODELS)
    for name in e.variants:
        _safe_name("experiment.variants", name)
    for model in e.measured_profiles:
        _choice("experiment.measured_profiles[]", model, e.models)
    _at_least("experiment.repeats", e.repeats, 1)
    for strategy in e.sequential:
        _choice("experiment.sequential[]", strategy, e.strategies)
    for name in (*e.datasets, *e.networks):
        _safe_name("experiment.datasets/networks[]", name)
    for pair in e.pairs:
        if len(pair) != 2 or pair[0] not in e.datasets or pair[1] not in e.models:
            raise ConfigError(
                f"experiment.pairs has {list(pair)!r}: each pair is [dataset, model] with the dataset in "
                f"experiment.datasets={e.datasets} and the model in experiment.models={e.models}"
            )


def _narrowing(
    name: str, by: dict[str, Any], every: list[Any], of: tuple[str, str], listed: list[str], known: Sequence[str]
) -> None:
    """experiment.<name>_by_<of>: each entry a known model or strategy (`of`: its singular and plural) with the
    values of experiment.<name> it may run at. An entry narrows, so narrowing the experiment (fewer models, N or
    networks) needs no edit of it; a `listed` one its entry leaves with none of experiment.<name> is refused."""
    one, many = of
    for key, own in by.items():
        _choice(f"experiment.{name}_by_{one}", key, known)
        if not own:
            raise ConfigError(f"experiment.{name}_by_{one}.{key} is empty: list the {name} it runs at, or drop it")
        if key in listed and not set(own) & set(every):
            raise ConfigError(
                f"experiment.{name}_by_{one}.{key}={list(own)} has none of experiment.{name}={every}, so {one} "
                f"{key} would not run: drop it from experiment.{many} or add one of its {name} to experiment.{name}"
            )


def device_entries(config_dir: Path = CONFIG_DIR) -> list[str]:
    """Names of the target-device entries, ``config/device/<name>.yaml``."""
    return sorted(p.stem for p in (config_dir / "device").glob("*.yaml"))


def _validate_device(cfg: Config) -> None:
    """The target device's specs are positive, its efficiencies (its own or its arch's) within what the model
    allows."""
    v = with_arch(cfg.device)
    _safe_name("device.name", v.name)
    for key in ("peak_fp32_tflops", "memory_gbps", "memory_gb", "conv_efficiency", "conv3x3_efficiency"):
        _in_range(f"device.{key}", getattr(v, key), 0.0, math.inf, "(0, inf)", low_open=True)
    for key in ("peak_tf32_tflops", "peak_fp16_tflops"):
        if getattr(v, key) is not None:
            _in_range(f"device.{key}", getattr(v, key), 0.0, math.inf, "(0, inf)", low_open=True)
    for key in ("matmul_efficiency", "memory_efficiency"):
        _in_range(f"device.{key}", getattr(v, key), 0.0, 1.0, "(0, 1]", low_open=True)
    for key in ("launch_overhead_us",):
        _in_range(f"device.{key}", getattr(v, key), 0.0, math.inf, "[0, inf)")
    _in_range(
        "device.reserved_gb", v.reserved_gb, 0.0, v.memory_gb, f"[0, device.memory_gb={v.memory_gb:g})", high_open=True
    )


def made_for(cfg: Config) -> dict[str, Any]:
    """What a profile or plan is made for: model, dataset, class count, image size, batch."""
    return {
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "num_classes": cfg.dataset.num_classes,
        "image_size": cfg.train.image_size,
        "batch_size": cfg.train.batch_size,
    }


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of a config, for JSON files and Snakemake params."""
    return asdict(cfg)


def digest(data: Any) -> str:
    """Stable short hash of JSON-serialisable data (configs, params)."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
