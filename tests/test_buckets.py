"""How parameters are cut into push/pull buckets and spread over the PS ranks."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from ralp_pipe.engine.strategies.base import FlatLayout, PushPullClient, plan_buckets, receive_buffers

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
    """A communicator whose pulls land only when the test lands them; it logs every push and every landed pull,
    in order, and which thread waited where."""

    ordered_p2p = False
    wait_s = 0.0

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.starts: dict[int, int] = {}  # a bucket's first element -> its index
        self.landed: dict[int, threading.Event] = {}
        self.credit_waits = 0  # waits not counted as the step's (the sender thread's)

    def isend(self, tensor: torch.Tensor, dst: int, category: str, stands_for: int | None = None) -> tuple[str, int]:
        self.log.append(("push", self._bucket(tensor)))
        return ("push", self._bucket(tensor))

    def irecv(self, tensor: torch.Tensor, src: int) -> tuple[str, int]:
        self.landed.setdefault(self._bucket(tensor), threading.Event())
        return ("pull", self._bucket(tensor))

    def land(self, b: int) -> None:
        self.log.append(("landed", b))
        self.landed.setdefault(b, threading.Event()).set()

    def wait(self, handles: list[tuple[str, int]], counted: bool = True) -> None:
        for kind, b in handles:
            if kind == "pull":
                self.credit_waits += not counted
                assert self.landed[b].wait(timeout=10), f"bucket {b}'s pull never landed"

    def add_wait(self, seconds: float) -> None:
        pass

    def _bucket(self, tensor: torch.Tensor) -> int:
        return self.starts[tensor.storage_offset()]


def _pushed(comm: LedgerComm, count: int) -> None:
    deadline = time.monotonic() + 10
    while sum(kind == "push" for kind, _ in comm.log) < count:
        assert time.monotonic() < deadline, comm.log
        time.sleep(0.001)


@pytest.mark.slow
@pytest.mark.parametrize("servers", [[9], [8, 9]])
@pytest.mark.parametrize("credit", [0, 1, 2])
def test_a_worker_pushes_at_most_credit_buckets_per_server_ahead_of_its_pulls_while_backward_runs_on(
    credit: int, servers: list[int]
) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))  # 60 elements: 6 buckets of 10
    params = list(net.parameters())
    buckets = plan_buckets([p.numel() for p in params], servers, 10)
    comm = LedgerComm()
    comm.starts = {b.start: index for index, b in enumerate(buckets)}
    client = PushPullClient(comm, params, buckets, overlap=True, credit=credit)  # type: ignore[arg-type]
    client.begin()
    # no pull lands during backward: with credit, backward still ends (the sender waits, not the hook)
    net(torch.randn(2, 4)).sum().backward()
    first = len(buckets) if credit == 0 else credit * len(servers)
    _pushed(comm, first)
    time.sleep(0.05)
    assert sum(kind == "push" for kind, _ in comm.log) == first, comm.log
    landing = threading.Thread(target=lambda: [(time.sleep(0.01), comm.land(b)) for b in range(len(buckets))])
    landing.start()
    client.end_backward()  # returns once every bucket is pushed
    assert sum(kind == "push" for kind, _ in comm.log) == len(buckets)
    landing.join()
    client.finish()
    assert comm.credit_waits == (0 if credit == 0 else len(buckets) - credit * len(servers)), comm.log
    assert [b for kind, b in comm.log if kind == "push"] == list(range(len(buckets)))  # always in bucket order
    pending: dict[int, set[int]] = {server: set() for server in servers}  # pushed, pull not yet landed
    for kind, b in comm.log:
        server = buckets[b].server
        if kind == "push":
            assert not credit or len(pending[server]) < credit, comm.log
            pending[server].add(b)
        else:
            pending[server].discard(b)


@pytest.mark.parametrize("modelled", [False, True])
def test_a_modelled_worker_pushes_and_pulls_through_one_buffer_the_size_of_its_largest_bucket(modelled: bool) -> None:
    """Modelled units produce no gradient and nothing is trained: every push and pull goes through one zeroed buffer
    of the largest bucket (N = 16 of VGG/22K fits), the same bytes; a computing worker holds the parameters and
    their gradients, each bucket its own elements."""
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))  # 40 elements: buckets of 10, 10, 10, 10
    params = list(net.parameters())
    buckets = plan_buckets([p.numel() for p in params], [9], 10)
    comm = LedgerComm()
    sent: list[tuple[int, int]] = []
    comm.isend = lambda tensor, dst, category: (  # type: ignore[method-assign]
        sent.append((tensor.data_ptr(), tensor.numel())) or ("push", 0)
    )
    client = PushPullClient(comm, params, buckets, overlap=False, modelled=modelled)  # type: ignore[arg-type]
    shared = client.flat_grads.data_ptr() == client.flat_params.data_ptr()
    assert shared == modelled
    assert client.flat_params.numel() == (max(len(b) for b in buckets) if modelled else 40)
    flat = client.flat_params.untyped_storage().data_ptr()
    assert all((p.untyped_storage().data_ptr() == flat) != modelled for p in params)  # modelled: their own storage
    client.flat_grads.fill_(1.0)
    client.begin()
    assert client.flat_grads.eq(1.0 if modelled else 0.0).all()  # a computing worker's gradients start at zero
    client.send_initial()
    assert [n for _, n in sent] == [len(b) for b in buckets]  # every bucket's bytes
    pointers = {pointer for pointer, _ in sent}
    assert pointers == (
        {client.flat_params.data_ptr()} if modelled else {client.flat_params[b.start :].data_ptr() for b in buckets}
    )


def test_a_servers_buckets_share_credit_sets_of_receive_buffers_where_that_holds_less() -> None:
    sizes = [100, 100, 100, 100, 60]
    shared = receive_buffers(sizes, sets=3, credit=2, dtype=torch.float32, device=None)
    storages = {buf.untyped_storage().data_ptr() for inbox in shared if inbox for buf in inbox}
    assert len(storages) == 2 * 3  # 2 sets of 3 workers' buffers, not 5 x 3
    for i, (inbox, size) in enumerate(zip(shared, sizes)):
        assert inbox is not None and [b.numel() for b in inbox] == [size] * 3
        assert [b.data_ptr() for b in inbox] == [b.data_ptr() for b in shared[i % 2]]  # type: ignore[union-attr]
    # no cap, or no saving (one large bucket, or no more buckets than credit): every bucket its own
    assert receive_buffers(sizes, 3, 0, torch.float32, None) == [None] * 5
    assert receive_buffers([400, 10, 10], 3, 2, torch.float32, None) == [None] * 3
    assert receive_buffers([100, 100], 3, 4, torch.float32, None) == [None] * 2
    assert receive_buffers([], 3, 4, torch.float32, None) == []
