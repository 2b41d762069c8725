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
  update it (seconds per byte, and per variable for its RPCs) and send it back to every pusher, or, with a
  step-end barrier (``strategy.step_barrier``, TensorFlow's, global), send all of the task's variables back once
  every task has updated every one of its own, in forward order;
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
import gc
import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Generator, Sequence

STEPS = 4  # steps run; the last two give the period (the first starts with every parameter in place)
MAX_HOSTS = 16  # the most hosts a timeline is run for (simulate leaves `dtf` out beyond): its cost grows ~hosts²
_EPS = 1e-12  # seconds left of a transfer treated as done (float rounding of rate x time)


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
    server_s_per_variable: float = 0.0  # ... and per variable, apart from its bytes (its RPCs)
    port_bytes_per_s: float = math.inf  # a GPU's interconnect to its host (the PS task's memory or the NIC)
    latency_s: float = 0.0
    barrier: bool = False  # a PS task replies only once every task's variables are updated (strategy.step_barrier)


@dataclass
class _Signal:
    """Something that happens once; processes waiting for it resume when it does."""

    fired: bool = False
    waiters: list[Callable[[], None]] = field(default_factory=list)


_Kind = tuple[tuple[int, ...], int]  # a transfer's links and weight: all that its max-min fair rate depends on


@dataclass(eq=False)
class _Transfer:
    pair: tuple[int, int]
    bytes_left: float  # at `since`
    links: tuple[int, ...]
    landed: _Signal
    weight: int  # the flows it stands for (identical ones, in lockstep): its share of a link is that many
    latency_s: float
    rate: float = 0.0
    since: float = 0.0  # when `bytes_left` was last brought up to date (it has sent at `rate` since)
    kind: _Kind = ((), 0)  # its links and weight


Process = Generator["float | _Signal", None, None]


class _Timeline:
    """Processes, timed events and the shared links of one simulated run.

    The links' max-min fair rates depend only on how many transfers of each kind (links and weight) are active, so
    they are shared again only when those counts changed, once time is about to move on (any number of transfers
    starting or ending at one instant cost one sharing; one ending with the next of its connection, of its kind,
    taking its place, none), and the rates of counts seen before are looked up. Each transfer's end at its rate
    waits in a heap."""

    def __init__(
        self, capacities: Sequence[float], shares: dict[frozenset[tuple[_Kind, int]], dict[_Kind, float]] | None = None
    ):
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._capacities = list(capacities)  # bytes/s of each link
        self._queues: dict[tuple[int, int], deque[_Transfer]] = {}
        self._active: dict[_Transfer, None] = {}  # in the order they became active
        self._kinds: dict[_Kind, int] = {}  # active transfers of each kind
        self._dirty = False  # the kinds' counts changed since the rates were shared
        self._ends: list[tuple[float, int, _Transfer]] = []  # (end at its rate, order, transfer)
        self._shares = {} if shares is None else shares  # rates by the kinds' counts (runs on the same links may share)

    def at(self, time: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (time, next(self._order), action))

    def fire(self, signal: _Signal) -> None:
        signal.fired = True
        waiters, signal.waiters = signal.waiters, []
        for resume in waiters:
            self.at(self.now, resume)

    def when(self, signal: _Signal, action: Callable[[], None]) -> None:
        """Run `action` once `signal` has fired (as a process waiting for it would resume)."""
        if signal.fired:
            self.at(self.now, action)
        else:
            signal.waiters.append(action)

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
        queue.append(_Transfer(pair, float(size), links, landed, weight, latency_s, kind=(links, weight)))
        if len(queue) == 1:
            self._activate(queue[0])
            self._count(queue[0].kind, 1)
        return landed

    def _activate(self, transfer: _Transfer) -> None:
        self._active[transfer] = None
        transfer.since = self.now

    def _count(self, kind: _Kind, change: int) -> None:
        count = self._kinds.get(kind, 0) + change
        if count:
            self._kinds[kind] = count
        else:
            del self._kinds[kind]
        self._dirty = True

    def _share(self) -> None:
        """Give each active transfer its kind's max-min fair rate; where that changed, its end changes."""
        key = frozenset(self._kinds.items())
        rates = self._shares.get(key)
        if rates is None:
            rates = self._shares[key] = self._max_min_fair()
        now, changed = self.now, False
        for transfer in self._active:
            rate = rates[transfer.kind]
            if rate != transfer.rate:
                transfer.bytes_left -= transfer.rate * (now - transfer.since)
                transfer.since, transfer.rate, changed = now, rate, True
        if changed:
            order = self._order
            self._ends[:] = [(t.since + t.bytes_left / t.rate, next(order), t) for t in self._active]
            heapq.heapify(self._ends)
        self._dirty = False

    def _max_min_fair(self) -> dict[_Kind, float]:
        """The rate of one transfer of each active kind, max-min fair over the links (progressive filling: the link
        offering the least per flow fixes its kinds' rate; a share only grows as others are fixed, so stale heap
        entries are skipped)."""
        left = list(self._capacities)
        flows = [0] * len(left)
        crossing: dict[int, list[_Kind]] = {}
        for kind, count in self._kinds.items():
            links, weight = kind
            for link in links:
                flows[link] += weight * count
                if link in crossing:
                    crossing[link].append(kind)
                else:
                    crossing[link] = [kind]
        heap = [(left[link] / flows[link], link) for link in crossing]
        heapq.heapify(heap)
        rates: dict[_Kind, float] = {}
        while heap:
            share, link = heapq.heappop(heap)
            if not flows[link] or share != left[link] / flows[link]:
                continue
            touched = set()
            for kind in crossing[link]:
                if kind in rates:
                    continue
                links, weight = kind
                rates[kind] = share * weight
                total = weight * self._kinds[kind]
                for other in links:
                    left[other] -= share * total
                    flows[other] -= total
                    touched.add(other)
            for other in touched:
                if other != link and flows[other]:
                    heapq.heappush(heap, (left[other] / flows[other], other))
        return rates

    def run(self) -> None:
        """Run until nothing is left to happen."""
        events, ends, inf = self._events, self._ends, math.inf
        while True:
            next_event = events[0][0] if events else inf
            if self._dirty and next_event > self.now:
                self._share()
            if not self._dirty and ends and ends[0][0] <= next_event:
                self.now = ends[0][0]
                self._land()
            elif events:
                self.now = next_event
                _, _, action = heapq.heappop(events)
                action()
            else:
                return

    def _land(self) -> None:
        """Land the transfers ending now (and those within float rounding of it); the next transfer of each
        connection starts, at the landed one's rate where of its kind."""
        now, ends = self.now, self._ends
        while ends and ends[0][0] - now <= _EPS:
            _, _, transfer = heapq.heappop(ends)
            del self._active[transfer]
            queue = self._queues[transfer.pair]
            queue.popleft()
            if queue and queue[0].kind == transfer.kind:
                following = queue[0]
                self._activate(following)
                following.rate = transfer.rate
                heapq.heappush(ends, (now + following.bytes_left / following.rate, next(self._order), following))
            else:
                self._count(transfer.kind, -1)
                if queue:
                    self._activate(queue[0])
                    self._count(queue[0].kind, 1)
            self.at(now + transfer.latency_s, functools.partial(self.fire, transfer.landed))


def _run(
    step: DtfStep,
    server_s_per_byte: float,
    server_s_per_variable: float,
    shares: dict[frozenset[tuple[_Kind, int]], dict[_Kind, float]],
) -> float:
    """The steady-state period of `step` with the PS tasks' reduce and update at `server_s_per_byte` and
    `server_s_per_variable`, the links' rates looked up in or added to `shares`."""
    hosts = max([*step.group_hosts, *step.task_hosts]) + 1
    groups, tasks, count = len(step.group_hosts), len(step.task_hosts), len(step.sizes)
    weights = step.group_pushers
    # links: each host's way out and way in, then each group's GPUs' ports out and in (where they are finite)
    up, down = range(hosts), range(hosts, 2 * hosts)
    ports = math.isfinite(step.port_bytes_per_s)
    port_out, port_in = range(2 * hosts, 2 * hosts + groups), range(2 * hosts + groups, 2 * hosts + 2 * groups)
    port_rates = [w * step.port_bytes_per_s for w in weights] if ports else []
    timeline = _Timeline([step.link_bytes_per_s] * 2 * hosts + port_rates * 2, shares)
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
    updated = [0] * STEPS  # per step, the PS tasks that have updated all their variables (the barrier's count)
    everywhere = [_Signal() for _ in range(STEPS)]  # ... fired once all have

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
                timeline.when(landed, functools.partial(count_copy, k, v))
            timeline.fire(issued[k][g])

    def count_copy(k: int, v: int) -> None:
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
                    timeline.when(landed, functools.partial(timeline.fire, (pulled if relays[g] else usable)[k][g][v]))

            for v in mine:
                yield arrived[k][v]
                yield server_s_per_byte * step.sizes[v] + server_s_per_variable
                if not step.barrier:
                    reply(v)
            if step.barrier:  # once every task is updated, in the order the next forward needs them
                updated[k] += 1
                if updated[k] == tasks:
                    timeline.fire(everywhere[k])
                yield everywhere[k]
                for v in reversed(mine):
                    reply(v)
            for landed in replies:
                yield landed

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
    shares: dict[frozenset[tuple[_Kind, int]], dict[_Kind, float]] = {}  # the two runs cross the same links
    collecting = gc.isenabled()
    gc.disable()  # a run makes and drops many objects, no cycles beyond its processes' (collected afterwards)
    try:
        period = _run(step, step.server_s_per_byte, step.server_s_per_variable, shares)
        busy = step.server_s_per_byte or step.server_s_per_variable
        free = _run(step, 0.0, 0.0, shares) if busy else period
    finally:
        if collecting:
            gc.enable()
    return period, max(0.0, period - free)
