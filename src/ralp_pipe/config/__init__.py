"""Configuration: the typed schema (:mod:`.schema`), Hydra composition and validation (:mod:`.compose`),
units such as tc rates (:mod:`.units`) and what each cluster kind means (:mod:`.clusters`)."""

from ralp_pipe.config.clusters import CLUSTER_KINDS, ClusterKind, cluster_kind
from ralp_pipe.config.compose import digest, from_dict, load, to_dict, validate, workload
from ralp_pipe.config.schema import (
    BACKENDS, CLUSTERS, CONFIG_DIR, DEVICES, LAYOUTS, LOADERS, MODELS, RALP_STRATEGIES, STRATEGIES, ClusterConfig, Config,
    DatasetConfig, ExperimentConfig, ModelConfig, NetworkConfig, PathsConfig, ShardOptions, SlurmConfig,
    StrategyConfig, SyntheticSource, TrainConfig,
)
from ralp_pipe.errors import ConfigError

__all__ = [
    "BACKENDS", "CLUSTERS", "CLUSTER_KINDS", "CONFIG_DIR", "DEVICES", "LAYOUTS", "LOADERS", "MODELS", "RALP_STRATEGIES",
    "STRATEGIES",
    "ClusterConfig", "ClusterKind", "Config", "ConfigError", "DatasetConfig", "ExperimentConfig", "ModelConfig",
    "NetworkConfig", "PathsConfig", "ShardOptions", "SlurmConfig", "StrategyConfig", "SyntheticSource", "TrainConfig",
    "cluster_kind", "digest", "from_dict", "load", "to_dict", "validate", "workload",
]
