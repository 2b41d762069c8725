"""The typed schema of the configuration: one dataclass per Hydra group, and the allowed choices."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ralp_pipe.config.clusters import CLUSTER_KINDS
from ralp_pipe.config.strategies import STRATEGY_KINDS, trainable_strategies

# The Hydra tree (config/): package data of ralp_pipe (``ralp_pipe/conf``), found through importlib.resources, so an
# installed wheel composes anywhere; in a source checkout ``src/ralp_pipe/conf`` links to the checkout's config/,
# the tree users edit, and this resolves to it.
CONFIG_DIR = Path(str(resources.files("ralp_pipe") / "conf")).resolve()

MODELS = (
    "alexnet",
    "vgg11",
    "vgg13",
    "vgg16",
    "vgg19",
    "vgg11_bn",
    "vgg13_bn",
    "vgg16_bn",
    "vgg19_bn",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "inception_v3",
)
STRATEGIES = tuple(STRATEGY_KINDS)  # the built-in strategies in table order (what each is: config/strategies.py)
REFERENCE = ("allreduce", 1)  # (strategy, N) of the single-device reference run: no communication
PS_PLACEMENTS = ("dedicated", "colocated")  # where `ps` PS ranks run: hosts of their own, or beside workers
# dtf: how tf.train.replica_device_setter places whole variables on PS tasks (in creation order: round-robin, or
# onto the least-loaded task), and tf_cnn_benchmarks' variable_update (a host's GPUs summed before the push, or
# every GPU pushing)
VARIABLE_PLACEMENTS = ("round_robin", "greedy")
VARIABLE_UPDATES = ("distributed_replicated", "parameter_server")
LAYOUTS = ("folders", "tars", "synthetic")
LOADERS = ("synthetic", "dali", "torchvision")
CLUSTERS = tuple(CLUSTER_KINDS)
DEVICES = ("auto", "cpu", "cuda")
ARCHES = ("kepler", "pascal", "volta", "ampere", "hopper")  # GPU generations with fitted efficiencies (device.arch)
ARCH_FIELDS = ("conv_efficiency", "conv3x3_efficiency", "matmul_efficiency", "memory_efficiency", "launch_overhead_us")
BACKENDS = ("auto", "gloo", "nccl")
AUTO_FACTOR = "auto"  # dilation.factor measured before the run (engine/dilation.py)
REAL, MODELLED = "real", "modelled"  # dilation.mode: real compute padded, or the target's time alone
DILATION_MODES = (REAL, MODELLED)
PROFILE_TARGET_SUFFIX = ".json"  # a dilation.target ending so is a profile file, anything else a config/device entry
MIN_IMAGE_SIZE = {"alexnet": 64, "inception_v3": 75}  # smallest input whose feature maps do not vanish
# the types of keys declared Any because OmegaConf has no unions of value types, as compose.py checks them
UNION_TYPES = {"dilation.factor": 'float | "auto" | None'}
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class SyntheticSource:
    """Settings of the deterministic JPEG generator used when no real ImageNet exists."""

    images_per_class: int = 2  # generated images of each class
    height: int = 72  # generated images' height in pixels (before any crop)
    width: int = 88  # generated images' width in pixels
    seed: int = 0  # generator seed: the same seed writes the same bytes


@dataclass
class ShardOptions:
    """How `prepare-shards` packs images into webdataset tar shards."""

    images_per_shard: int = 256  # images in one tar shard (the last may hold fewer)
    # shrink images whose shorter side is longer to this many pixels (re-encoded as JPEG; never enlarged); None: keep
    resize_shorter: int | None = None
    strict: bool = False  # an unreadable source image stops preparation; false: skipped and listed in the manifest
    workers: int = 2  # processes writing shards in parallel


@dataclass
class DatasetConfig:
    """An image collection: where it lives, its layout and its class count."""

    name: str = "synthetic1k"  # the dataset's name: its folder below <results>/data and its rows' `dataset` column
    num_classes: int = 1000  # classes of the dataset: the classifier's outputs (model.num_classes follows it)
    # folders: class folders of JPEGs (ILSVRC train/); tars: one tar per class (ImageNet-21K); synthetic: generated
    layout: str = "synthetic"
    source: str | None = None
    synthetic: SyntheticSource = field(default_factory=SyntheticSource)
    shards: ShardOptions = field(default_factory=ShardOptions)


@dataclass
class ModelConfig:
    """A torchvision CNN; `num_classes` always comes from the dataset."""

    name: str = "vgg11"  # the torchvision architecture, one of MODELS
    dropout: float = 0.5  # dropout probability of the classifier (VGG, AlexNet)


@dataclass
class StrategyConfig:
    """How parameters and layers are placed on workers and parameter servers."""

    name: str = "ps"  # the strategy, one of STRATEGIES (what each does: docs/method/strategies.md)
    num_ps: int = 1  # parameter-server ranks (ps; RALP's PS device is always one)
    # RALP: placement units run by the workers (the rest on the PS device); None: the plan's, else after the last conv/pool unit
    split: int | None = None
    plan: str | None = None  # RALP: a plan file written by `ralp-pipe plan`, whose split the run takes
    overlap: bool = True  # pipelined push/pull (Distributed TensorFlow, BytePS); false: the sequential ablation
    bucket_mb: float = (
        1.0  # push/pull bucket size (BytePS partitions 4 MB; 1 MB is faster here, README); 0: one per parameter
    )
    credit: int = (
        4  # buckets per server a worker may have pushed and not yet pulled back (BytePS scheduling credit); 0: no cap
    )
    ps_placement: str = "dedicated"  # ps only: PS ranks on hosts of their own, or colocated with workers
    variable_placement: str = "round_robin"  # dtf only: one of VARIABLE_PLACEMENTS
    variable_update: str = "distributed_replicated"  # dtf only: one of VARIABLE_UPDATES
    # dtf only: what the transport moves alone (a tc rate; gRPC's: config/strategy/dtf.yaml); a byte costs the link's
    # time plus 1/cap; None: the link's rate
    transport_cap: str | None = None
    # dtf only: a PS task sends its variables back only once every push of the step is applied on every task
    # (TensorFlow's step-end barrier; the workers read them during the next forward); false: each variable as soon as
    # it is updated
    step_barrier: bool = False
    # dtf only: a PS task's CPU nanoseconds per byte to apply one worker's gradient to a variable (TensorFlow applies
    # each worker's separately: ApplyMomentum); None: the profile's reduce and SGD step, as for `ps`
    ps_apply_ns_per_byte: float | None = None
    # dtf only: a PS task's CPU microseconds per tensor it receives or sends (gRPC's RecvTensor call, apart from bytes)
    rpc_us_per_tensor: float = 0.0


@dataclass
class SlurmConfig:
    """What jobs ask SLURM for and what its nodes hold (``workflow/rules``; the numbers: ralp_pipe.workflow.slurm)."""

    partition: str | None = None  # the partition jobs are submitted to (sbatch -p); None: the cluster's default
    account: str | None = None  # the account every job is charged to (sbatch -A); None: the plugin guesses one
    cpus_per_task: int = 1  # CPUs of one rank (and of a profile job, which times one rank's compute)
    mem_mb: int = 4000  # memory of one rank; a training job asks for this x its ranks on a node
    time_min: int = 30  # time limit of jobs without an internal timeout (shards, profile, plan)
    margin_min: int = 10  # training's limit: init_timeout_s + timeout_s, plus this margin
    exclusive: bool = True  # measurement jobs (train, profile, link probe) take whole nodes
    max_nodes: int | None = None  # nodes the partition has; None: not checked
    cpus_per_node: int | None = None  # CPUs of one node; None: not checked
    mem_mb_per_node: int | None = None  # memory of one node; None: not checked


@dataclass
class ClusterConfig:
    """Where the ranks of one training run execute."""

    # where ranks run: local (processes here), emulated (one network namespace per host, links shaped by tc), slurm (srun)
    kind: str = "local"
    gpus: int = 4
    # GPUs of one host (a SLURM node) behind its one network link: plan, simulate, the emulator and SLURM place ranks
    # on hosts of this many (1: a host each)
    gpus_per_node: int = 1
    device: str = "auto"  # auto | cpu | cuda; under SLURM jobs ask for GPUs only with cuda (cpu, auto: CPU nodes)
    backend: str = "auto"
    timeout_s: int = 900
    init_timeout_s: int = 60  # seconds the ranks may take to join the process group
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


@dataclass
class InterconnectConfig:
    """What links the GPUs of one host (``config/interconnect/<name>.yaml``): the bytes/s one GPU moves each
    direction to the others, from the cited source; None (`none`): no interconnect, one GPU per host."""

    name: str = "none"  # the interconnect's name, one of config/interconnect/
    gbytes_per_s: float | None = None  # GB/s (10^9 bytes) per GPU per direction
    source: str = ""  # where the figure comes from


@dataclass
class NetworkConfig:
    """The link between hosts: a tc rate for the emulated cluster, or loopback."""

    name: str = "loopback"  # the network's name: its rows' `network` column
    # each host link's rate in both directions, as tc writes it (1gbit, 200mbit); unlimited: not shaped
    rate: str = "unlimited"
    burst: str = "1mb"  # tc tbf bucket size of each shaped link: the bytes that may pass at once above the rate
    interface: str | None = None  # on SLURM: the fabric's interface ranks bind to; None: the one routing to rank 0


@dataclass
class TrainConfig:
    """The throughput recipe and optimiser of one training run."""

    batch_size: int = 8
    image_size: int = 64
    warmup_steps: int = 5
    measure_steps: int = 100
    lr: float = 0.01  # SGD learning rate
    momentum: float = 0.9  # SGD momentum
    weight_decay: float = 0.0  # SGD L2 weight decay
    seed: int = 0  # seed of the model's initial weights and the synthetic batches
    loader: str = "synthetic"
    loader_threads: int = 2  # threads of the DALI or torchvision loader of each worker
    # torch threads: this host's CPUs split over this many ranks (None: the ranks of the run on the
    # host); the N=1 reference sets the largest run's count, so its one rank computes as one of those
    cpu_share: int | None = None
    amp: bool = False  # mixed precision (torch.autocast to bfloat16) on CUDA devices; ignored on CPUs
    repeat: int = 0  # which of experiment.repeats this run is (set by the workflow; changes nothing it computes)
    # the experiment.variants entry this run is (set by the workflow): its row is <strategy>-<variant>
    variant: str | None = None
    # one job of a concurrent workload (set by the concurrent stage): the folder where its gate_jobs jobs meet, so
    # that their measured windows start together and the link stays loaded until the last closes (engine/gate.py)
    gate: str | None = None
    gate_jobs: int = 1


@dataclass
class DeviceConfig:
    """A target GPU for modelled profiles (``config/device/<name>.yaml``; the model: engine/devicemodel.py).

    Peaks and bandwidth come from the vendor's data sheet; the efficiencies and the launch overhead are the
    architecture's (``config/device/arch/<arch>.yaml``, fitted on published training throughput of that
    generation by ``benchmarks/device_model.py``) unless set here: a null field takes the arch's value.
    """

    name: str = "v100"  # defaults: config/device/v100.yaml, the default option of the group (a test keeps them equal)
    arch: str = "volta"  # one of ARCHES: whose fitted efficiencies and launch overhead the null fields take
    peak_fp32_tflops: float = 15.7  # FP32 peak of the data sheet, TFLOP/s
    peak_tf32_tflops: float | None = None  # tensor-core TF32 (Ampere and later); convolutions use it, as cuDNN does
    peak_fp16_tflops: float | None = 125.0  # tensor-core FP16 (recorded; modelled profiles price FP32 training)
    memory_gbps: float = 900.0  # memory bandwidth of the data sheet, GB/s
    memory_gb: float = 16.0  # device memory of the data sheet, GB
    reserved_gb: float = 0.5  # CUDA context, cuDNN workspaces and allocator slack: never holds tensors
    launch_overhead_us: float | None = None  # per kernel (framework dispatch + launch), added to every priced kernel
    # achieved / peak FLOP/s of convolutions, counted as direct convolutions: above 1 where cuDNN's Winograd
    # or FFT algorithms do fewer multiplies than the direct count (3x3 stride-1 kernels above all)
    conv_efficiency: float | None = None  # every other convolution (1x1, strided, 7x7, 11x11), forward and backward
    conv3x3_efficiency: float | None = None  # 3x3 stride-1 convolutions, forward and backward
    matmul_efficiency: float | None = None  # achieved / peak FLOP/s of matrix multiplies (the FC layers)
    memory_efficiency: float | None = None  # achieved / peak bytes/s of every kernel's reads and writes


@dataclass
class DilationConfig:
    """Time-dilated emulation of a target GPU on links at network.rate (engine/dilation.py).

    With a factor D every rank pads each placement unit's forward and backward, and the servers' gradient
    aggregation and SGD update, to D x the target's time, and emulated links run at rate / D. The target is a
    config/device entry, priced by the device model, or a profile file (a `target` ending in ``.json``, written
    by `ralp-pipe profile --out FILE`, for the run's model, class count and image size), whose measured times
    are used as they are, interpolated to the run's batches as the cost model does.
    The target configuration is the run's own (model, dataset, train.batch_size, train.image_size): every
    message carries its bytes; in `real` mode the ranks may compute at a smaller batch and image size.
    """

    factor: Any = None  # D > 0 (below 1: time compression), or "auto" (the smallest fitting D, measured); None: none
    mode: str = "real"  # real: run the real computation, then wait; modelled: no computation, only the wait
    # the config/device entry emulated (its shipped file, apart from the `device` group), or a profile file
    # (`ralp-pipe profile --out FILE`): a path ending in .json
    target: str = "v100"
    compute_batch_size: int | None = None  # real mode: images per worker the ranks compute on (None: train's)
    compute_image_size: int | None = None  # real mode: the crop they compute on (None: train's)
    margin: float = 1.25  # auto, real mode: D = this x the largest measured/target unit time
    link_accuracy: float = 0.95  # auto, modelled mode: least achieved/asked rate of links at R / D, of gloo at 2R / D

    @property
    def target_profile(self) -> Path | None:
        """The profile file `target` names (it ends in :data:`PROFILE_TARGET_SUFFIX`); None for a device entry."""
        return Path(self.target) if self.target.endswith(PROFILE_TARGET_SUFFIX) else None


@dataclass
class ExperimentConfig:
    """The matrix the workflow expands: one training run per combination."""

    name: str = "local"  # the experiment's name: its bundle's and results' name
    datasets: list[str] = field(default_factory=lambda: ["synthetic1k"])  # config/dataset entries the matrix runs
    models: list[str] = field(default_factory=lambda: ["vgg11"])  # config/model entries the matrix runs
    pairs: list[list[str]] = field(default_factory=list)  # [dataset, model] pairs to run; empty: every combination
    strategies: list[str] = field(default_factory=trainable_strategies)  # strategies the matrix runs, in table order
    # the N (ranks: workers and PS devices together) each configuration runs at
    gpus: list[int] = field(default_factory=lambda: [4])
    # the N a model may run at: its entry narrows gpus (so narrowing gpus needs no edit of it); others: every N
    gpus_by_model: dict[str, list[int]] = field(default_factory=dict)
    # the same for a strategy (one this machine cannot run at every N, e.g. its ranks' memory)
    gpus_by_strategy: dict[str, list[int]] = field(default_factory=dict)
    networks: list[str] = field(default_factory=lambda: ["loopback"])  # config/network entries the matrix runs on
    networks_by_model: dict[str, list[str]] = field(default_factory=dict)  # a model's networks, the same way
    # name -> overrides: the runs its model=, dataset=, strategy=, cluster.gpus= and network= overrides select (all
    # where it has none) run again with its other overrides, in rows <strategy>-<name>
    variants: dict[str, list[str]] = field(default_factory=dict)
    # models also profiled on this machine (measured) where target is set, at their smallest N, and planned from that
    # profile on their first network beside the target's plan (summary.md)
    measured_profiles: list[str] = field(default_factory=list)
    # workloads of jobs run at once on one emulated network: each a list of jobs, a job one string of overrides
    concurrent: list[list[str]] = field(default_factory=list)
    repeats: int = 1  # independent runs of every training configuration (fresh ranks each)
    sequential: list[str] = field(default_factory=list)  # strategies also run with strategy.overlap=false
    reference: bool = False  # also run the single-device reference (allreduce at N=1: no communication)
    target: str | None = None  # a config/device entry: profiles are modelled for that GPU; None: measured here

    def gpus_of(self, model: str, strategy: str) -> list[int]:
        """The N `model` runs at under `strategy`: experiment.gpus as its model's and strategy's entries narrow it."""
        own = (self.gpus_by_model.get(model, self.gpus), self.gpus_by_strategy.get(strategy, self.gpus))
        return [g for g in self.gpus if all(g in narrowed for narrowed in own)]

    def networks_of(self, model: str) -> list[str]:
        """The networks `model` runs on: experiment.networks as its entry narrows them."""
        return [n for n in self.networks if n in self.networks_by_model.get(model, self.networks)]


@dataclass
class PathsConfig:
    """Where results are written."""

    results: str = "results"  # the folder every stage writes below (relative to the working directory)


@dataclass
class Config:
    """The whole resolved configuration of one stage invocation."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    interconnect: InterconnectConfig = field(default_factory=InterconnectConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    dilation: DilationConfig = field(default_factory=DilationConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
