"""How parameters are cut into push/pull buckets and spread over the PS ranks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ralp_pipe.engine.strategies.base import FlatLayout, PushPullClient, plan_buckets

SIZES = [300, 50, 1000, 20, 4000]  # a model's parameters in model order (elements)


def _covers_once(buckets, total: int) -> None:
    cuts = sorted((b.start, b.stop) for b in buckets)
    assert cuts[0][0] == 0 and cuts[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:])), "buckets overlap or leave a gap"


def test_buckets_cut_across_parameters_and_balance_the_servers_by_bytes() -> None:
    buckets = plan_buckets(SIZES, [5, 6, 7], 500)
    _covers_once(buckets, sum(SIZES))
    assert [b.start for b in buckets] == sorted(b.start for b in buckets)  # sending order = flat order
    assert all(len(b) <= 500 for b in buckets) and len(buckets) == 11  # 5370 elements in 500s
    loads = {s: sum(len(b) for b in buckets if b.server == s) for s in (5, 6, 7)}
    assert max(loads.values()) - min(loads.values()) <= 500  # within one bucket
    assert [b.server for b in buckets[:3]] == [5, 6, 7]  # consecutive buckets travel in parallel


def test_a_model_smaller_than_a_bucket_per_server_still_reaches_every_server() -> None:
    buckets = plan_buckets(SIZES, [5, 6], 10**6)
    assert sorted(len(b) for b in buckets) == [2685, 2685] and {b.server for b in buckets} == {5, 6}


def test_zero_keeps_each_parameter_whole_on_one_server() -> None:
    buckets = plan_buckets(SIZES, [5, 6], 0)
    offsets = FlatLayout(tuple(SIZES)).offsets()
    assert sorted((b.start, b.stop) for b in buckets) == sorted(
        (offsets[i], offsets[i] + n) for i, n in enumerate(SIZES)
    )
    assert {b.server for b in buckets if len(b) == 4000} != {b.server for b in buckets if len(b) == 1000}


@pytest.mark.parametrize("servers", [[3], [3, 4, 5]])
def test_the_sequential_layout_is_one_contiguous_near_equal_range_per_server(servers: list[int]) -> None:
    buckets = plan_buckets(SIZES, servers, None)
    _covers_once(buckets, sum(SIZES))
    assert [b.server for b in buckets] == servers
    assert max(len(b) for b in buckets) - min(len(b) for b in buckets) <= 1


class LedgerComm:
    """A communicator whose transfers complete when waited on; it logs every push, pull and wait, in order."""

    ordered_p2p = False
    wait_s = 0.0

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.starts: dict[int, int] = {}  # a bucket's first element -> its index

    def isend(self, tensor: torch.Tensor, dst: int, category: str) -> tuple[str, int]:
        self.log.append(("push", self._bucket(tensor)))
        return ("push", self._bucket(tensor))

    def irecv(self, tensor: torch.Tensor, src: int) -> tuple[str, int]:
        return ("pull", self._bucket(tensor))

    def wait(self, handles: list[tuple[str, int]], setup: bool = False) -> None:
        self.log += [("waited", b) for kind, b in handles if kind == "pull"]

    def add_wait(self, seconds: float) -> None:
        pass

    def _bucket(self, tensor: torch.Tensor) -> int:
        return self.starts[tensor.storage_offset()]


@pytest.mark.parametrize("servers", [[9], [8, 9]])
@pytest.mark.parametrize("credit", [0, 1, 2])
def test_a_worker_pushes_at_most_credit_buckets_per_server_ahead_of_its_pulls(credit: int, servers: list[int]) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))  # 60 elements: 6 buckets of 10
    params = list(net.parameters())
    buckets = plan_buckets([p.numel() for p in params], servers, 10)
    comm = LedgerComm()
    comm.starts = {b.start: index for index, b in enumerate(buckets)}
    client = PushPullClient(comm, params, buckets, overlap=True, credit=credit)  # type: ignore[arg-type]
    client.begin()
    net(torch.randn(2, 4)).sum().backward()  # every bucket's gradients are ready by the end
    during_backward = sum(kind == "push" for kind, _ in comm.log)
    client.end_backward()
    # every bucket leaves during backward, a bucket without credit right after its server's oldest pull was waited
    # for (a push deferred to a later hook would wait for the end of backward: pulls cannot be polled)
    assert during_backward == len(buckets)
    waits_in_backward = sum(kind == "waited" for kind, _ in comm.log)
    assert waits_in_backward == (0 if credit == 0 else len(buckets) - credit * len(servers)), comm.log
    assert [b for kind, b in comm.log if kind == "push"] == list(range(len(buckets)))  # always in bucket order
    pending: dict[int, set[int]] = {server: set() for server in servers}  # pushed, pull not yet waited for
    for kind, b in comm.log:
        server = buckets[b].server
        if kind == "push":
            assert not credit or len(pending[server]) < credit, comm.log
            pending[server].add(b)
        else:
            pending[server].discard(b)
