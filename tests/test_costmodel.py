"""The cost model on a hand-computed example: two units, a known link and update rate, three strategies.

Profile: unit u0 (1000 parameter bytes) and u1 (3000), profiled at batches 2 and 4:

    u0: fwd 0.010 / 0.018 s, bwd 0.020 / 0.036 s      u1: fwd 0.005 / 0.009 s, bwd 0.010 / 0.018 s

so at batch 3 (interpolated) u0 = fwd 0.014 + bwd 0.028, u1 = fwd 0.007 + bwd 0.014, and at
batch 6 (beyond the last batch: scaled by 6/4) u1 = fwd 0.0135 + bwd 0.027.
Aggregation 2e-7 s and SGD update 1e-6 s per parameter byte; P = 4000 bytes in all.
Link: 1e6 bytes/s, 1 ms per message; the all-reduce's measured bus bandwidth is 5e5 bytes/s.
W = 2 workers, batch b = 3 per worker, one PS.
"""

from __future__ import annotations

import pytest

from ralp_pipe.planning.costmodel import ComputeCosts, Link, Pipelining, Pricing, UnitCost, predict

W, B = 2, 3
COSTS = ComputeCosts(
    units=(
        UnitCost("u0", 1000, (2, 4), (0.010, 0.018), (0.020, 0.036)),
        UnitCost("u1", 3000, (2, 4), (0.005, 0.009), (0.010, 0.018)),
    ),
    update_s_per_byte=1e-6,
    aggregate_s_per_byte=2e-7,
)
LINK = Link(bytes_per_s=1e6, latency_s=1e-3, allreduce_bytes_per_s=5e5)


def volume(**bytes_by_category: int) -> dict[str, int]:
    """A step's bytes by category plus their "total", as engine.volume.step_bytes returns them."""
    return {**bytes_by_category, "total": sum(bytes_by_category.values())}


def test_unit_times_are_interpolated_between_and_scaled_beyond_the_profiled_batches() -> None:
    """Batch 1: scaled from batch 2; batch 3: halfway; batch 6: scaled from batch 4."""
    u0, u1 = COSTS.units
    assert u0.fwd(1) == pytest.approx(0.005)  # 0.010 x 1/2
    assert u0.fwd(3) == pytest.approx(0.014) and u0.bwd(3) == pytest.approx(0.028)  # (0.010 + 0.018) / 2 ...
    assert u1.fwd(6) == pytest.approx(0.0135) and u1.bwd(6) == pytest.approx(0.027)  # 0.009 x 6/4, 0.018 x 6/4


def test_ps_step_time_matches_the_hand_computation() -> None:
    """ps: fwd+bwd and zeroing on the workers, W passes + SGD on the PS, push and pull over its link."""
    # bytes: every worker pushes P gradients and pulls P parameters: 2 x 4000 + 2 x 4000 = 16000
    pred = predict("ps", W, 2, volume(gradients=8000, parameters=8000), Pricing(COSTS, B, LINK))
    # compute = fwd (0.014 + 0.007) + bwd (0.028 + 0.014) + 1 zeroing pass 4000 x 2e-7 = 0.063 + 0.0008 = 0.0638
    assert pred.compute_s == pytest.approx(0.0638)
    # server = (W = 2 passes x 2e-7 + 1e-6) x 4000 / 1 PS = 1.4e-6 x 4000 = 0.0056
    assert pred.server_s == pytest.approx(0.0056)
    # comm = 16000 / 1 PS / 1e6 + 2 messages x 1 ms = 0.016 + 0.002 = 0.018
    assert pred.comm_s == pytest.approx(0.018)
    # step = 0.0638 + 0.0056 + 0.018 = 0.0874 s; 2 x 3 = 6 images / 0.0874 s
    assert pred.step_time_s == pytest.approx(0.0874)
    assert pred.images_per_sec == pytest.approx(6 / 0.0874)


def test_pipelined_ps_hides_its_transfers_behind_backward_but_not_the_last_pull() -> None:
    """ps, pipelined in 1000-byte buckets: both link directions at once, overlapped with backward."""
    pred = predict(
        "ps",
        W,
        2,
        volume(gradients=8000, parameters=8000),
        Pricing(COSTS, B, LINK, pipelining=Pipelining(bucket_bytes=1000)),
    )
    # one direction of the PS link: 8000 / 1e6 = 0.008 s; the PS's own work: 0.0056 s (as above);
    # backward (0.028 + 0.014 = 0.042 s) hides both entirely: exposed = max(0, 0.008 - 0.042) = 0
    # the last bucket: its update is 1000 / 4000 of the server's work = 0.0014 s, and its pull to
    # both workers is 2 x 1000 / 1e6 = 0.002 s plus two 1 ms latencies = 0.004 s
    assert pred.compute_s == pytest.approx(0.0638)
    assert pred.server_s == pytest.approx(0.0014)
    assert pred.comm_s == pytest.approx(0.004)
    assert pred.step_time_s == pytest.approx(0.0692)


def test_pipelined_ps_on_a_slow_link_exposes_what_backward_cannot_hide() -> None:
    """At 1e5 bytes/s one direction takes 0.08 s: 0.038 s of it outlasts backward."""
    slow = Link(bytes_per_s=1e5, latency_s=1e-3, allreduce_bytes_per_s=5e5)
    bytes_ = volume(gradients=8000, parameters=8000)
    pipelined = predict("ps", W, 2, bytes_, Pricing(COSTS, B, slow, pipelining=Pipelining(bucket_bytes=1000)))
    # exposed = 0.08 - 0.042 = 0.038; tail = 2 x 1000 / 1e5 + 0.002 = 0.022; comm = 0.060
    assert pipelined.comm_s == pytest.approx(0.060)
    assert pipelined.step_time_s == pytest.approx(0.0638 + 0.0014 + 0.060)
    # sequentially the same link carries push then pull: 16000 / 1e5 + 0.002 = 0.162
    sequential = predict("ps", W, 2, bytes_, Pricing(COSTS, B, slow))
    assert sequential.comm_s == pytest.approx(0.162)
    assert sequential.step_time_s == pytest.approx(0.0638 + 0.0056 + 0.162)


def test_two_parameter_servers_split_the_reduction_and_the_transfer() -> None:
    """ps with 2 PSes: each server reduces and moves half of the bytes."""
    pred = predict("ps", W, 2, volume(gradients=8000, parameters=8000), Pricing(COSTS, B, LINK, num_ps=2))
    # server = 1.4e-6 x 4000 / 2 = 0.0028; comm = 16000 / 2 / 1e6 + 0.002 = 0.010
    assert pred.server_s == pytest.approx(0.0028)
    assert pred.comm_s == pytest.approx(0.010)
    assert pred.step_time_s == pytest.approx(0.0638 + 0.0028 + 0.010)


def test_colocated_parameter_servers_share_the_worker_links() -> None:
    """ps with 2 PSes colocated, PS i on worker i's host: each link carries half a model each way."""
    bytes_ = volume(gradients=8000, parameters=8000)
    pred = predict("ps", W, 2, bytes_, Pricing(COSTS, B, LINK, num_ps=2, colocated=True))
    # host 0 sends: worker 0's push of PS 1's shard (2000) + PS 0's pull to worker 1 (2000) = 4000 per
    # direction, the pull in the other; sequential comm = 2 x 4000 / 1e6 + 0.002 = 0.010
    assert pred.comm_s == pytest.approx(0.010)
    assert pred.server_s == pytest.approx(0.0028)
    # one PS colocated with worker 0: its link carries worker 1's whole model each way (4000),
    # worker 0's exchange stays on its host: 2 x 4000 / 1e6 + 0.002 = 0.010, against 0.018 dedicated
    one = predict("ps", W, 2, bytes_, Pricing(COSTS, B, LINK, num_ps=1, colocated=True))
    assert one.comm_s == pytest.approx(0.010)
    # pipelined with 1000-byte buckets: the last bucket is pulled by the one remote worker only:
    # 1 x 1000 / 1e6 + 0.002 = 0.003
    piped = predict("ps", W, 2, bytes_, Pricing(COSTS, B, LINK, num_ps=2, colocated=True, pipelining=Pipelining(1000)))
    assert piped.comm_s == pytest.approx(0.003)


def test_allreduce_step_time_matches_the_hand_computation() -> None:
    """allreduce: fwd+bwd and two bucket copies, (N-1)/N of an addition + SGD, a ring at the bus bandwidth.

    All 4000 parameter bytes fit DDP's first bucket (1 MiB), which is ready only when backward ends:
    nothing of the ring is hidden, with or without the overlap."""
    # bytes: 2 (W - 1) P = 2 x 1 x 4000 = 8000 over all ranks
    pred = predict("allreduce", W, 2, volume(gradients=8000), Pricing(COSTS, B, LINK))
    # compute = 0.063 + 2 copies x 4000 x 2e-7 = 0.063 + 0.0016 = 0.0646
    assert pred.compute_s == pytest.approx(0.0646)
    # server = (1/2 x 2e-7 + 1e-6) x 4000 = 1.1e-6 x 4000 = 0.0044
    assert pred.server_s == pytest.approx(0.0044)
    # comm = 8000 / 2 workers = 4000 bytes per worker at min(link 1e6, bus 5e5) = 5e5 bytes/s -> 0.008,
    # plus 2 (N - 1) = 2 latency-bound steps x 1 ms = 0.002 -> 0.010
    assert pred.comm_s == pytest.approx(0.010)
    # step = 0.0646 + 0.0044 + 0.010 = 0.079 s
    assert pred.step_time_s == pytest.approx(0.079)
    sequential = predict("allreduce", W, 2, volume(gradients=8000), Pricing(COSTS, B, LINK, ddp_overlap=False))
    assert sequential.comm_s == pytest.approx(0.010)


MIB = 2**20


def test_the_single_device_reference_pays_no_ddp_bucket_copies() -> None:
    """allreduce at N=1 trains without DDP: forward+backward and the SGD update, no bucket copies, no ring."""
    pred = predict("allreduce", 1, 1, volume(gradients=0), Pricing(COSTS, B, LINK))
    assert pred.compute_s == pytest.approx(0.063)  # fwd 0.021 + bwd 0.042 at batch 3, interpolated
    assert pred.server_s == pytest.approx(1e-6 * 4000) and pred.comm_s == 0.0


def test_allreduce_overlaps_ddp_buckets_with_backward() -> None:
    """DDP's buckets (1 MiB, then 25 MiB, in backward's order) are all-reduced one at a time as soon as backward
    has produced their gradients; only what runs on after backward is exposed."""
    costs = ComputeCosts(
        units=(  # model order; backward runs c, b, a: ending 0.005, 0.025 and 0.035 s after it began
            UnitCost("a", 2 * MIB, (3,), (0.001,), (0.010,)),
            UnitCost("b", 25 * MIB, (3,), (0.001,), (0.020,)),
            UnitCost("c", 1 * MIB, (3,), (0.001,), (0.005,)),
        ),
        update_s_per_byte=0.0,
        aggregate_s_per_byte=0.0,
    )
    fast = Link(bytes_per_s=1000 * MIB, latency_s=1e-3)  # 1 ms per MiB a worker sends, 1 ms per message
    sent = volume(gradients=2 * (W - 1) * 28 * MIB)  # each worker sends 28 MiB: 2(N-1)/N of the model
    pred = predict("allreduce", W, 2, sent, Pricing(costs, B, fast))
    # bucket 1 (c's 1 MiB) ready at 0.005: ring 0.001 + 2 (N - 1) = 2 latencies 0.002 -> ends 0.008;
    # bucket 2 (the next 25 MiB, b's last gradient at 0.025): 0.025 + 0.025 + 0.002 -> 0.052;
    # bucket 3 (the last 2 MiB, a's at 0.035) waits for bucket 2: 0.052 + 0.002 + 0.002 -> 0.056;
    # backward ends at 0.035, so 0.021 s of the rings is exposed
    assert pred.comm_s == pytest.approx(0.021)
    # without the overlap the whole ring follows backward: 28 MiB at 1 ms per MiB + 2 latencies
    after = predict("allreduce", W, 2, sent, Pricing(costs, B, fast, ddp_overlap=False))
    assert after.comm_s == pytest.approx(0.030)


def test_ralp_n_step_time_matches_the_hand_computation() -> None:
    """ralp_n split 1: u0 on the workers at b, u1 on the PS device at W x b, everything over its one link."""
    # bytes: lower gradients and parameters W x 1000 = 2000 each; activations and their gradients
    # W x b x 100 elements x 4 bytes = 2400 each; labels W x b x 8 = 48 -> total 8848
    bytes_ = volume(gradients=2000, parameters=2000, activations=2400, activation_gradients=2400, labels=48)
    pred = predict("ralp_n", W, 2, bytes_, Pricing(COSTS, B, LINK), split=1)
    # compute = u0 fwd 0.014 + bwd 0.028 + zeroing 1000 x 2e-7 = 0.042 + 0.0002 = 0.0422
    assert pred.compute_s == pytest.approx(0.0422)
    # server = u1 at batch 6: fwd 0.0135 + bwd 0.027, + (W - 1) x 1000 x 2e-7 = 0.0002 summing the lower
    # gradient sets, + SGD of all 4000 bytes x 1e-6 = 0.004 -> 0.0405 + 0.0002 + 0.004 = 0.0447
    assert pred.server_s == pytest.approx(0.0447)
    # comm = 8848 / 1e6 + 4 transfers x 1 ms = 0.008848 + 0.004 = 0.012848
    assert pred.comm_s == pytest.approx(0.012848)
    # step = 0.0422 + 0.0447 + 0.012848 = 0.099748 s
    assert pred.step_time_s == pytest.approx(0.099748)
    assert pred.images_per_step == 6 and pred.split == 1


def test_pipelined_ralp_n_sends_each_direction_at_its_own_rate() -> None:
    """ralp_n split 1, pipelined in 1000-byte buckets: activations up, their gradients down while the PS
    device updates u1, then the lower part's push and pull as pipelined ps, hidden by u0's backward."""
    bytes_ = volume(gradients=2000, parameters=2000, activations=2400, activation_gradients=2400, labels=48)
    pred = predict("ralp_n", W, 2, bytes_, Pricing(COSTS, B, LINK, pipelining=Pipelining(1000)), split=1)
    # compute as sequentially: 0.0422
    assert pred.compute_s == pytest.approx(0.0422)
    # server: u1 at batch 6 0.0405; u1's SGD (3000 x 1e-6 = 0.003) while the activation gradients come
    # down (0.0034, below): hidden; the lower part's reduce and SGD 1000 x (2e-7 + 1e-6) = 0.0012, all in
    # its one (last) bucket -> 0.0405 + 0.0012 = 0.0417
    assert pred.server_s == pytest.approx(0.0417)
    # comm: up (2400 + 48) / 1e6 + 1 ms = 0.003448; down 2400 / 1e6 + 1 ms = 0.0034; the lower push
    # (2000 / 1e6 = 0.002 s one way) hidden by u0's backward (0.028 s), its last bucket's pull to both
    # workers 2 x 1000 / 1e6 + 2 ms = 0.004 -> 0.010848
    assert pred.comm_s == pytest.approx(0.010848)
    # sequentially (test above) every byte waits for the one before: 0.099748 s against 0.094748 s
    assert pred.step_time_s == pytest.approx(0.0422 + 0.0417 + 0.010848)


@pytest.mark.parametrize(
    ("update_s_per_byte", "exposed_s"),
    [
        # SGD 5e-6 s/byte: u1's update 0.015 s outlasts the way down (0.0034) by 0.0116, the lower part's reduce
        # and SGD 1000 x (2e-7 + 5e-6) = 0.0052: 0.0168 s in all, hidden by u0's backward (0.028 s)
        (5e-6, 0.0),
        # SGD 1e-5 s/byte: 0.03 - 0.0034 = 0.0266 late, + 1000 x (2e-7 + 1e-5) = 0.0102 -> 0.0368 s, of which
        # backward hides 0.028: 0.0088 s exposed
        (1e-5, 0.0088),
    ],
)
def test_pipelined_ralp_n_hides_the_upper_update_behind_the_workers_backward(
    update_s_per_byte: float, exposed_s: float
) -> None:
    """ralp_n split 1, one 1000-byte bucket: the PS device serves the lower part once u1 is updated; pushes
    arrive meanwhile, and the workers' backward hides that delay as far as it lasts."""
    costs = ComputeCosts(COSTS.units, update_s_per_byte=update_s_per_byte, aggregate_s_per_byte=2e-7)
    bytes_ = volume(gradients=2000, parameters=2000, activations=2400, activation_gradients=2400, labels=48)
    pred = predict("ralp_n", W, 2, bytes_, Pricing(costs, B, LINK, pipelining=Pipelining(1000)), split=1)
    # server: u1 at batch 6 0.0405, what backward does not hide, and the one (last) bucket's reduce and SGD
    lower_server = 1000 * (2e-7 + update_s_per_byte)
    assert pred.server_s == pytest.approx(0.0405 + exposed_s + lower_server)
    # comm as in the test above: up 0.003448, down 0.0034, the last bucket's pull to both workers 0.004
    assert pred.comm_s == pytest.approx(0.010848)


def test_an_exposed_upper_update_on_a_link_bound_ps_device_counts_as_server_time() -> None:
    """ralp_n split 1 on a 5e4 bytes/s link with SGD 3e-5 s/byte: the PS device is link-bound, and its upper
    update outlasts the workers' whole backward; that excess is server time, the exposed pushes network time."""
    costs = ComputeCosts(COSTS.units, update_s_per_byte=3e-5, aggregate_s_per_byte=2e-7)
    slow = Link(bytes_per_s=5e4, latency_s=1e-3)
    bytes_ = volume(gradients=2000, parameters=2000, activations=2400, activation_gradients=2400, labels=48)
    pred = predict("ralp_n", W, 2, bytes_, Pricing(costs, B, slow, pipelining=Pipelining(1000)), split=1)
    # u1's update 3000 x 3e-5 = 0.09 outlasts the way down (2400 / 5e4 + 1 ms = 0.049) by 0.041; then the
    # push 2000 / 5e4 = 0.04 outlasts the lower part's reduce and SGD 1000 x (2e-7 + 3e-5) = 0.0302. Of those
    # 0.081 s, u0's backward hides 0.028: the last 0.04 are the push, the 0.013 before them the update
    lower_server = 1000 * (2e-7 + 3e-5)
    assert pred.server_s == pytest.approx(0.0405 + 0.013 + lower_server)
    # comm: up 2448 / 5e4 + 1 ms = 0.04996, down 0.049, the exposed push 0.04, the last bucket's pull to both
    # workers 2 x 1000 / 5e4 + 2 ms = 0.042
    assert pred.comm_s == pytest.approx(0.04996 + 0.049 + 0.04 + 0.042)
    # the step is where it was when the whole 0.053 s counted as network time
    assert pred.step_time_s == pytest.approx(0.0422 + 0.0405 + lower_server + 0.053 + 0.04996 + 0.049 + 0.042)


@pytest.mark.parametrize("split", [None, 0, 2])
def test_ralp_n_without_a_split_inside_the_model_is_refused(split: int | None) -> None:
    """Two units leave exactly one split point: 1."""
    with pytest.raises(ValueError, match=rf"split point {split} .*out of range: choose 1\.\.1"):
        predict("ralp_n", W, 2, volume(gradients=1), Pricing(COSTS, B, LINK), split=split)
