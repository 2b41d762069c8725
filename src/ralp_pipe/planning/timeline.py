"""A pipelined `dtf` step, variable by variable, as the engine runs it: the timeline the cost model prices.

Distributed TensorFlow's variables travel whole, so where one variable is large (ResNet-50/22K's 179 MB fc
weight) no bucket-level formula says when the step ends: its push shares its host's link with the other
variables' pushes and its pull with the other task's replies. This module runs the step as events:

- **Workers**, one group per worker host (its GPUs run in lockstep; where they sum before the push the group
  pushes once, else each GPU its own copy, and the group's transfers stand for that many flows): forward
  unit by unit, each waiting for the pulls of its own variables from the step before; backward in reverse, a
  unit's gradients ready when its backward ends; the next step starts once every push has been issued and has
  landed (the engine's ``end_backward`` and ``begin``).
- **Senders**: push each variable in backward order once it is ready, to its PS task; a host's leader first
  waits the interconnect's time for the host's sum (:meth:`Hosts.in_host_s`, as the engine's priced wait).
- **PS tasks**: take their variables in that order; each once every pusher's copy has landed, then reduce and
  update it (the profile's seconds per byte) and send it back to every pusher, or, with a step-end barrier
  (``strategy.step_barrier``, TensorFlow's), send all of the task's variables back once every one is updated;
  a step ends, as the engine's server loop does, once every reply has landed.
- **Relays**: a host's leader hands each pulled variable to its other GPUs after the interconnect's time again,
  one variable after another (a group without a sum has none: its GPUs use each variable as it lands).
- **Links**: every host has one link, full duplex, at the transport's achieved rate; the transfers crossing a
  link share it max-min fairly (TCP flows through one shaper), those between one pair of ranks in order (one
  connection), each arriving a latency after its last byte left. On hosts of several GPUs every transfer also
  crosses its GPUs' interconnect port (``port_bytes_per_s`` each); one between a GPU and a PS task of its own
  host crosses nothing else (at one GPU per host it is free, as the emulation's loopback runs it).

The step's length is the period of the steady state (:data:`STEPS` steps, from all parameters in place).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Generator, Sequence

STEPS = 4  # steps run; the last two give the period (the first starts with every parameter in place)
MAX_HOSTS = 8  # the most hosts a timeline is run for (simulate leaves `dtf` out beyond): its cost grows as hosts²
_EPS = 1e-12  # bytes of a transfer treated as done (float rounding of rate x time)


@dataclass(frozen=True)
class DtfStep:
    """What one pipelined `dtf` step runs on: per-unit seconds, the variables, where they and the workers are."""

    fwd_s: Sequence[float]  # per placement unit, forward
    bwd_s: Sequence[float]  # per placement unit, backward
    begin_s: float  # a step's work before its forward (zeroing the flat gradients)
    sizes: Sequence[int]  # each variable's bytes, in creation order
    units: Sequence[int]  # each variable's placement unit
    owners: Sequence[int]  # each variable's PS task
    group_hosts: Sequence[int]  # the host of each pushing worker group
    group_pushers: Sequence[int]  # the GPUs of each group that push their own copy (1 where a host sums first)
    task_hosts: Sequence[int]  # the host of each PS task
    sum_s_per_byte: Sequence[float]  # per group, its leader's interconnect seconds per byte for the host's sum
    server_s_per_byte: float  # a PS task's reduce and update per byte
    link_bytes_per_s: float
    port_bytes_per_s: float = math.inf  # a GPU's interconnect to its host (the PS task's memory or the NIC)
    latency_s: float = 0.0
    barrier: bool = False  # a PS task replies only once all of its variables are updated (strategy.step_barrier)


@dataclass
class _Signal:
    """Something that happens once; processes waiting for it resume when it does."""

    fired: bool = False
    waiters: list[Callable[[], None]] = field(default_factory=list)


@dataclass(eq=False)
class _Transfer:
    pair: tuple[int, int]
    bytes_left: float
    links: tuple[int, ...]
    landed: _Signal
    weight: int  # the flows it stands for (identical ones, in lockstep): its share of a link is that many
    latency_s: float
    rate: float = 0.0
    fixed: int = -1  # the last sharing round that gave it a rate


Process = Generator["float | _Signal", None, None]


class _Timeline:
    """Processes, timed events and the shared links of one simulated run."""

    def __init__(self, capacities: Sequence[float]):
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._capacities = list(capacities)  # bytes/s of each link
        self._queues: dict[tuple[int, int], deque[_Transfer]] = {}
        self._active: list[_Transfer] = []
        self._shared_at = 0.0  # when the active transfers' bytes and rates were last brought up to date
        self._rounds = itertools.count()
        self._dirty = False  # transfers started or ended since the rates were shared
        self._first: _Transfer | None = None  # the active transfer to end first at the shared rates

    def at(self, time: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (time, next(self._order), action))

    def fire(self, signal: _Signal) -> None:
        signal.fired = True
        waiters, signal.waiters = signal.waiters, []
        for resume in waiters:
            self.at(self.now, resume)

    def start(self, process: Process) -> None:
        def resume() -> None:
            for wanted in process:
                if isinstance(wanted, _Signal):
                    if not wanted.fired:
                        wanted.waiters.append(resume)
                        return
                elif wanted > 0:
                    self.at(self.now + wanted, resume)
                    return

        self.at(self.now, resume)

    def send(
        self, pair: tuple[int, int], links: tuple[int, ...], size: float, weight: int = 1, latency_s: float = 0.0
    ) -> _Signal:
        """Queue `size` bytes on connection `pair` across `links` (none: landed at once), as `weight` flows of
        size / `weight` each, landing `latency_s` after the last byte left."""
        landed = _Signal()
        if not links or size <= 0:
            self.fire(landed)
            return landed
        queue = self._queues.setdefault(pair, deque())
        queue.append(_Transfer(pair, float(size), links, landed, weight, latency_s))
        if len(queue) == 1:
            self._progress()
            self._active.append(queue[0])
            self._dirty = True
        return landed

    def _progress(self) -> None:
        """Bring the active transfers' bytes left up to now at their current rates."""
        elapsed = self.now - self._shared_at
        if elapsed > 0:
            for transfer in self._active:
                transfer.bytes_left -= transfer.rate * elapsed
        self._shared_at = self.now

    def _share(self) -> None:
        """Max-min fair rates of the active transfers over the links (progressive filling: the link offering the
        least per transfer fixes its transfers' rate; a share only grows as others are fixed, so stale heap
        entries are skipped)."""
        self._progress()
        left = list(self._capacities)
        flows = [0] * len(left)
        crossing: dict[int, list[_Transfer]] = {}
        for transfer in self._active:
            for link in transfer.links:
                flows[link] += transfer.weight
                crossing.setdefault(link, []).append(transfer)
        heap = [(left[link] / flows[link], link) for link in crossing]
        heapq.heapify(heap)
        round_ = next(self._rounds)
        while heap:
            share, link = heapq.heappop(heap)
            if not flows[link] or share != left[link] / flows[link]:
                continue
            for transfer in crossing[link]:
                if transfer.fixed == round_:
                    continue
                transfer.rate, transfer.fixed = share * transfer.weight, round_
                for other in transfer.links:
                    left[other] -= transfer.rate
                    flows[other] -= transfer.weight
                    if other != link and flows[other]:
                        heapq.heappush(heap, (left[other] / flows[other], other))
        self._first = min(self._active, key=lambda t: t.bytes_left / t.rate, default=None)
        self._dirty = False

    def run(self) -> None:
        """Run until nothing is left to happen."""
        while self._events or self._active:
            if self._dirty:
                self._share()
            next_event = self._events[0][0] if self._events else float("inf")
            first = self._first
            done_at = self._shared_at + first.bytes_left / first.rate if first is not None else float("inf")
            if first is not None and done_at <= next_event:
                self.now = done_at
                self._progress()
                self._land([t for t in self._active if t is first or t.bytes_left <= _EPS * t.rate])
            else:
                self.now = next_event
                _, _, action = heapq.heappop(self._events)
                action()

    def _land(self, done: list[_Transfer]) -> None:
        for transfer in done:
            self._active.remove(transfer)
            queue = self._queues[transfer.pair]
            queue.popleft()
            if queue:
                self._active.append(queue[0])
            self.at(self.now + transfer.latency_s, functools.partial(self.fire, transfer.landed))
        self._dirty = True


def _run(step: DtfStep, server_s_per_byte: float) -> float:
    """The steady-state period of `step` with the PS tasks' reduce and update at `server_s_per_byte`."""
    hosts = max([*step.group_hosts, *step.task_hosts]) + 1
    groups, tasks, count = len(step.group_hosts), len(step.task_hosts), len(step.sizes)
    weights = step.group_pushers
    # links: each host's way out and way in, then each group's GPUs' ports out and in (where they are finite)
    up, down = range(hosts), range(hosts, 2 * hosts)
    ports = math.isfinite(step.port_bytes_per_s)
    port_out, port_in = range(2 * hosts, 2 * hosts + groups), range(2 * hosts + groups, 2 * hosts + 2 * groups)
    port_rates = [w * step.port_bytes_per_s for w in weights] if ports else []
    timeline = _Timeline([step.link_bytes_per_s] * 2 * hosts + port_rates * 2)
    order = [v for v in reversed(range(count)) if step.sizes[v]]  # backward's order, the flat layout's
    by_unit: dict[int, list[int]] = {}
    for v in order:
        by_unit.setdefault(step.units[v], []).append(v)
    starts: list[list[float]] = [[] for _ in range(groups)]

    def signals() -> list[list[list[_Signal]]]:  # [step][group][variable]
        return [[[_Signal() for _ in range(count)] for _ in range(groups)] for _ in range(STEPS)]

    ready, pulled, usable = signals(), signals(), signals()
    relays = [seconds > 0 for seconds in step.sum_s_per_byte]  # groups whose leader relays to other GPUs
    issued = [[_Signal() for _ in range(groups)] for _ in range(STEPS)]
    pushes: list[list[list[_Signal]]] = [[[] for _ in range(groups)] for _ in range(STEPS)]
    arrived = [[_Signal() for _ in range(count)] for _ in range(STEPS)]
    copies = [[0] * count for _ in range(STEPS)]

    def route(g: int, task: int, push: bool, v: int) -> tuple[tuple[int, ...], float, int, float]:
        """`send`'s links, bytes, weight and latency for variable `v` between group `g` and `task`: its GPUs'
        ports, then the hosts' links where the two are on different hosts."""
        source, target = step.group_hosts[g], step.task_hosts[task]
        if not push:
            source, target = target, source
        links: tuple[int, ...] = ((port_out if push else port_in)[g],) if ports else ()
        latency = 0.0
        if source != target:
            links, latency = (*links, up[source], down[target]), step.latency_s
        return links, weights[g] * step.sizes[v], weights[g], latency

    def worker(g: int) -> Process:
        for k in range(STEPS):
            if k:
                yield issued[k - 1][g]
                for push in pushes[k - 1][g]:
                    yield push
            starts[g].append(timeline.now)
            yield step.begin_s
            for unit, seconds in enumerate(step.fwd_s):
                if k:
                    for v in by_unit.get(unit, []):
                        yield usable[k - 1][g][v]
                yield seconds
            for unit in reversed(range(len(step.bwd_s))):
                yield step.bwd_s[unit]
                for v in by_unit.get(unit, []):
                    timeline.fire(ready[k][g][v])

    def sender(g: int) -> Process:
        for k in range(STEPS):
            for v in order:
                yield ready[k][g][v]
                yield step.sum_s_per_byte[g] * step.sizes[v]
                task = step.owners[v]
                landed = timeline.send((g, groups + task), *route(g, task, True, v))
                pushes[k][g].append(landed)
                timeline.start(count_copy(k, v, landed))
            timeline.fire(issued[k][g])

    def count_copy(k: int, v: int, landed: _Signal) -> Process:
        yield landed
        copies[k][v] += 1
        if copies[k][v] == groups:
            timeline.fire(arrived[k][v])

    def server(task: int) -> Process:
        mine = [v for v in order if step.owners[v] == task]
        for k in range(STEPS):
            replies: list[_Signal] = []

            def reply(v: int, k: int = k, replies: list[_Signal] = replies) -> None:
                for g in range(groups):
                    landed = timeline.send((groups + task, g), *route(g, task, False, v))
                    replies.append(landed)
                    timeline.start(hand_on(landed, (pulled if relays[g] else usable)[k][g][v]))

            for v in mine:
                yield arrived[k][v]
                yield server_s_per_byte * step.sizes[v]
                if not step.barrier:
                    reply(v)
            if step.barrier:
                for v in mine:
                    reply(v)
            for landed in replies:
                yield landed

    def hand_on(landed: _Signal, target: _Signal) -> Process:
        yield landed
        timeline.fire(target)

    def relay(g: int) -> Process:
        for k in range(STEPS):
            for v in order:
                yield pulled[k][g][v]
                yield step.sum_s_per_byte[g] * step.sizes[v]
                timeline.fire(usable[k][g][v])

    for g in range(groups):
        for process in (worker(g), sender(g), *([relay(g)] if relays[g] else [])):
            timeline.start(process)
    for task in range(tasks):
        timeline.start(server(task))
    timeline.run()
    return max((s[-1] - s[-3]) / 2 for s in starts)


def dtf_period(step: DtfStep) -> tuple[float, float]:
    """(step seconds, of which the PS tasks' reduce and update add) of a pipelined `dtf` step (see module doc);
    the second is the step's length less the same step's with the servers' work free."""
    period = _run(step, step.server_s_per_byte)
    free = _run(step, 0.0) if step.server_s_per_byte else period
    return period, max(0.0, period - free)
