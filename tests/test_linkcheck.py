"""The link check: the smallest dilation factor at which emulated links deliver their rate, both ways at once."""

from __future__ import annotations

import json

import pytest

from ralp_pipe.config.dilation import shaped_rate
from ralp_pipe.errors import ConfigError
from ralp_pipe.runtime.linkcheck import FactorChoice, accurate_factor


def _check_records(choice: FactorChoice) -> None:
    """Factors tried in ascending order up to the chosen one, which alone meets the threshold."""
    factors = [m.factor for m in choice.measurements]
    assert factors == sorted(factors) and factors[-1] == choice.factor
    assert all(m.worst < choice.threshold for m in choice.measurements[:-1])
    assert choice.measurements[-1].worst >= choice.threshold
    for m in choice.measurements:
        assert m.shaped_rate == shaped_rate(choice.rate, m.factor)
        assert m.worst == min(m.upload, m.download)
        assert m.seconds > 0 and 0 <= m.kernel_cpu <= 1 and m.timing_error >= 0
        assert m.wire_upload > 0 and m.wire_download > 0  # the interface counters saw the traffic
    record = choice.to_dict()
    assert json.loads(json.dumps(record)) == record
    assert record["factor"] == choice.factor and len(record["measurements"]) == len(factors)
    assert record["measurements"][-1]["worst"] == choice.measurements[-1].worst


@pytest.mark.netns
def test_a_low_rate_is_accurate_undilated() -> None:
    choice = accurate_factor(4, "200mbit")
    assert choice.factor == 1 and len(choice.measurements) == 1, choice.to_dict()
    _check_records(choice)
    # The interface counts TCP payload plus one header per offloaded packet: ~0.96 of what tbf released.
    only = choice.measurements[0]
    assert 0.85 < only.wire_upload < 1.1 and 0.85 < only.wire_download < 1.1, only


@pytest.mark.netns
@pytest.mark.slow  # one cluster per factor tried, ~2 s each on 2 loaded cores
def test_a_rate_too_high_for_the_machine_is_dilated() -> None:
    choice = accurate_factor(6, "40gbit")
    assert choice.factor > 1, choice.to_dict()
    _check_records(choice)


@pytest.mark.netns
def test_no_accurate_factor_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"9 hosts at 100gbit / D deliver at best 0\.\d\d of their rate \(D=1\)"):
        accurate_factor(9, "100gbit", candidates=(1,))


def test_an_unlimited_rate_needs_no_check() -> None:
    choice = accurate_factor(3, "unlimited")
    assert choice.factor == 1 and choice.measurements == ()
    assert choice.to_dict()["measurements"] == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"hosts": 1}, "at least 2 hosts"),
        ({"threshold": 0.0}, r"threshold must be in \(0, 1\], got 0.0"),
        ({"threshold": 1.5}, r"threshold must be in \(0, 1\], got 1.5"),
        ({"candidates": ()}, "positive candidate factors"),
        ({"candidates": (1, 0)}, "positive candidate factors"),
        ({"seconds": 0}, "window must be positive"),
        ({"rate": "10gbps"}, "not a tc rate"),
    ],
)
def test_bad_input_is_refused_before_any_cluster(arguments: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        accurate_factor(**{"hosts": 4, "rate": "1gbit", **arguments})
