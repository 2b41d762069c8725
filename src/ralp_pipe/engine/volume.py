"""Analytic bytes sent per training step, by category, counted once at the sender.

These are the figures :mod:`ralp_pipe.engine.comm` counts where tensors are sent; the byte tests
prove the two agree exactly. Each strategy names its function in the strategy table
(:mod:`ralp_pipe.config.strategies`). Per step, with W workers, P model parameters, P_low parameters
below the split, A activation elements per image at the split and batch b per worker:

- `ps`: every worker pushes P gradients and every worker receives P parameters (sent by the
  PSes): gradients = W*P, parameters = W*P elements. On hosts of several GPUs a host's other workers
  push theirs to its first worker and receive the parameters from it, which pushes the host's sum
  and pulls once (:func:`host_groups`): the same W*P each way, of which only the pushes and pulls of
  the hosts' first workers cross host links (:func:`push_pull_link_bytes`).
- `dtf`: as `ps`, every worker pushes every gradient and pulls every variable, each whole to and
  from the PS task holding it (:func:`variable_owners`): gradients = W*P, parameters = W*P elements
  (on hosts of several GPUs, summed inside a host as with `ps` where ``variable_update`` says so).
- `allreduce`: each gradient bucket of n elements goes through a ring all-reduce; rank r sends
  the chunks the ring schedule gives it (:func:`ring_send_elements`, chunks as
  ``torch.tensor_split`` cuts them), which sums to exactly 2*(N-1)*n over the N ranks, so
  gradients = 2*(W-1)*P elements whatever the bucket layout.
- `ralp_h` / `ralp_n`: each worker sends b*A activations, its b labels (int64, the PS device
  computes the loss) and P_low gradients; the PS device sends back b*A activation gradients
  and P_low parameters to each worker.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Mapping, Sequence, Union

from ralp_pipe.config import strategy_kind
from ralp_pipe.contract.topology import Topology
from ralp_pipe.contract.unit_table import UnitTable, check_split
from ralp_pipe.contract.unit_table import variable_owners as variable_owners  # the engine's dtf imports it here

if TYPE_CHECKING:  # torch units are priced as the models build them; a unit table needs neither torch nor the models
    from ralp_pipe.engine.models import Unit

Units = Union["Sequence[Unit]", UnitTable]  # a model's placement units: torch modules, or their sizes only

CATEGORIES = ("gradients", "parameters", "activations", "activation_gradients", "labels")
LABEL_BYTES = 8  # labels travel as int64


def ring_chunks(numel: int, world: int) -> list[int]:
    """Sizes of the `world` chunks a ring all-reduce cuts a buffer of `numel` elements into."""
    base, extra = divmod(numel, world)
    return [base + (1 if i < extra else 0) for i in range(world)]


def ring_send_elements(numel: int, world: int, rank: int) -> int:
    """Elements `rank` sends in a ring all-reduce of `numel` elements over `world` ranks.

    Reduce-scatter: in step s (0..world-2) rank r sends chunk (r - s) mod world; all-gather:
    in step s it sends chunk (r + 1 - s) mod world.
    """
    if world < 2:
        return 0
    chunks = ring_chunks(numel, world)
    steps = range(world - 1)
    return sum(chunks[(rank - s) % world] for s in steps) + sum(chunks[(rank + 1 - s) % world] for s in steps)


def split_activation_elements(units: Units, split: int, image_size: int) -> int:
    """Elements of the activation one image produces at the split (output of units[split-1])."""
    if isinstance(units, UnitTable):
        return units.split_activation_elements(split, image_size)
    check_split(split, len(units))
    return math.prod(_shapes(tuple(units), image_size)[split - 1][1:])


@functools.lru_cache(maxsize=2)
def _shapes(units: tuple[Unit, ...], image_size: int) -> list[tuple[int, ...]]:
    """Every unit's output shape for one image, computed once for all the splits a planner prices."""
    from ralp_pipe.engine.models import activation_shapes

    return activation_shapes(list(units), image_size, batch=1)


def parameters(units: Units) -> int:
    """Trainable parameters (elements) of every unit of `units` together."""
    if isinstance(units, UnitTable):
        return sum(u.param_count for u in units)
    from ralp_pipe.engine.models import parameter_count

    return sum(parameter_count(u.module) for u in units)


def _lower(units: Units, split: int) -> Units:
    """The units below `split`."""
    return UnitTable(units.units[:split], units.image_size) if isinstance(units, UnitTable) else units[:split]


def step_bytes(
    strategy: str,
    units: Units,
    split: int | None,
    topology: Topology,
    batch_size: int,
    image_size: int,
    bytes_per_element: int = 4,
) -> dict[str, int]:
    """Bytes sent per step by all ranks together, by category and in "total" (the strategy's volume function)."""
    if strategy != topology.strategy:
        raise ValueError(f"strategy {strategy!r} does not match the topology's {topology.strategy!r}")
    sent = strategy_kind(strategy).volume_function(units, split, topology, batch_size, image_size, bytes_per_element)
    result = {**dict.fromkeys(CATEGORIES, 0), **sent}
    result["total"] = sum(result.values())
    return result


def push_pull_bytes(
    units: Units, split: int | None, topology: Topology, batch_size: int, image_size: int, bytes_per_element: int
) -> dict[str, int]:
    """`ps`: every worker pushes all gradients and receives all parameters."""
    params = parameters(units) * bytes_per_element
    return {"gradients": topology.num_workers * params, "parameters": topology.num_workers * params}


def host_groups(topology: Topology) -> list[list[int]]:
    """The workers of `topology` by host, in rank order, each host's first worker (its leader) first: one push per
    host carries the gradients of a group. One GPU per host: a group of one per worker."""
    groups: dict[int, list[int]] = {}
    for worker in topology.workers:
        groups.setdefault(topology.hosts[worker], []).append(worker)
    return list(groups.values())


def push_pull_link_bytes(
    topology: Topology, loads: Mapping[int, int], summed: bool = True
) -> dict[int, dict[str, int]]:
    """Bytes each host's link carries per `ps` or `dtf` step, out ("tx") and in ("rx"), by host: PS rank s holds
    ``loads[s]`` bytes; each host's first worker (`summed`: its host's sum) or every worker pushes them to it and
    pulls them back. The transfers between ranks of one host (the sums and the relays back, a colocated PS
    task's own worker) cross no link."""
    pushers = [group[0] for group in host_groups(topology)] if summed else topology.workers
    links = {host: {"tx": 0, "rx": 0} for host in sorted(set(topology.hosts))}
    for pusher in pushers:
        for server, size in loads.items():
            near, far = topology.hosts[pusher], topology.hosts[server]
            if near != far:
                for host in (near, far):  # the push out of one and into the other, the pull back
                    links[host]["tx"] += size
                    links[host]["rx"] += size
    return links


def whole_variable_bytes(
    units: Units, split: int | None, topology: Topology, batch_size: int, image_size: int, bytes_per_element: int
) -> dict[str, int]:
    """`dtf`: every worker pushes each gradient whole to its variable's PS task and pulls each variable back,
    the bytes of `ps` however the variables are spread over the tasks."""
    return push_pull_bytes(units, split, topology, batch_size, image_size, bytes_per_element)


def ring_bytes(
    units: Units, split: int | None, topology: Topology, batch_size: int, image_size: int, bytes_per_element: int
) -> dict[str, int]:
    """`allreduce`: a ring all-reduce of all gradients over the workers."""
    params = parameters(units)
    return {"gradients": 2 * (topology.num_workers - 1) * params * bytes_per_element}


def placement_bytes(
    units: Units, split: int | None, topology: Topology, batch_size: int, image_size: int, bytes_per_element: int
) -> dict[str, int]:
    """Layer placement: activations, labels and lower-unit gradients up, their gradients and parameters down."""
    if split is None:
        raise ValueError(f"strategy {topology.strategy!r} needs a split point")
    workers = topology.num_workers
    lower = workers * parameters(_lower(units, split)) * bytes_per_element
    activations = workers * batch_size * split_activation_elements(units, split, image_size) * bytes_per_element
    return {
        "gradients": lower,
        "parameters": lower,
        "activations": activations,
        "activation_gradients": activations,
        "labels": workers * batch_size * LABEL_BYTES,
    }
