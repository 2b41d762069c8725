"""Interval arithmetic: the t quantile against published values, the mean's and the ratio's intervals by hand."""

from __future__ import annotations

import math

import pytest

from ralp_pipe.results.intervals import (
    Estimate,
    mean_interval,
    pool,
    pooled_interval,
    ratio_interval,
    t_cdf,
    t_quantile,
)

# 97.5% quantiles of Student's t (two-sided 95%), e.g. scipy.stats.t.ppf(0.975, df), to 9 digits.
T_975 = {1: 12.706204736, 2: 4.302652730, 3: 3.182446305, 4: 2.776445105, 9: 2.262157163, 30: 2.042272456}


@pytest.mark.parametrize("df", sorted(T_975))
def test_t_quantile_matches_the_tables(df: int) -> None:
    assert t_quantile(0.975, df) == pytest.approx(T_975[df], abs=1e-8)
    assert t_quantile(0.025, df) == pytest.approx(-T_975[df], abs=1e-8)


@pytest.mark.parametrize("t", [-3.7, -0.4, 0.0, 0.7, 2.5, 40.0])
def test_t_cdf_matches_the_closed_forms_of_one_and_two_degrees_of_freedom(t: float) -> None:
    """df = 1 is the Cauchy distribution, 1/2 + atan(t)/pi; df = 2 has F(t) = 1/2 + t / (2 sqrt(2 + t^2))."""
    assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


def test_fractional_degrees_of_freedom_lie_between_their_neighbours_and_tend_to_the_normal() -> None:
    assert T_975[3] > t_quantile(0.975, 3.5) > T_975[4]
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959963985, abs=1e-6)  # the normal's 97.5% point


def test_mean_interval_of_three_values_by_hand() -> None:
    """10, 12, 14: mean 12, s = 2, half-width t(0.975, 2) x 2 / sqrt(3) = 4.96828."""
    estimate = mean_interval([10.0, 12.0, 14.0])
    assert (estimate.mean, estimate.std, estimate.count) == (12.0, 2.0, 3)
    assert estimate.half_width == pytest.approx(4.302652730 * 2 / math.sqrt(3), rel=1e-9)
    assert (estimate.low, estimate.high) == pytest.approx((12 - 4.968275, 12 + 4.968275), abs=1e-5)


def test_one_value_has_no_interval() -> None:
    estimate = mean_interval([7.0])
    assert estimate.mean == 7.0 and math.isnan(estimate.std) and math.isnan(estimate.half_width)
    assert math.isnan(ratio_interval(estimate, mean_interval([1.0, 2.0])).half_width)


def test_ratio_interval_by_the_delta_method_with_welch_degrees_of_freedom() -> None:
    """A: mean 200, s 10, k 3; B: mean 100, s 10, k 5. Relative variances 100/(3 x 200^2) and 100/(5 x 100^2)."""
    a, b = Estimate(200.0, 10.0, 3, math.nan), Estimate(100.0, 10.0, 5, math.nan)
    va, vb = 100 / (3 * 200**2), 100 / (5 * 100**2)
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 4)  # Welch-Satterthwaite: 5.9588
    assert df == pytest.approx(5.9588, rel=1e-4)
    ratio = ratio_interval(a, b)
    assert ratio.mean == 2.0 and ratio.std == pytest.approx(2.0 * math.sqrt(va + vb))
    assert ratio.half_width == pytest.approx(t_quantile(0.975, df) * 2.0 * math.sqrt(va + vb))
    assert 2.446911851 < t_quantile(0.975, df) < 2.570581836  # between t(0.975, 6) and t(0.975, 5)


def test_pooled_spread_is_the_within_configuration_variance_of_logs_by_hand() -> None:
    """ln-deviations: (±ln 1.1 / 2 around the log-mean) twice in the first group, 0 in the second: sum of squares
    ln(1.1)² / 2, over 1 + 2 degrees of freedom; a single repeat adds none."""
    spread = pool([[100.0, 110.0], [50.0, 50.0, 50.0], [7.0]])
    assert spread.df == 3 and spread.configurations == 3
    assert spread.relative_std == pytest.approx(math.sqrt(math.log(1.1) ** 2 / 2 / 3))
    assert spread.largest_own == pytest.approx(math.log(1.1) / math.sqrt(2))
    estimate = pooled_interval([100.0, 110.0], spread)
    assert estimate.mean == 105.0 and estimate.dof == 3 and estimate.std == pytest.approx(105.0 * spread.relative_std)
    assert estimate.half_width == pytest.approx(t_quantile(0.975, 3) * estimate.std / math.sqrt(2))
    single = pooled_interval([7.0], spread)  # one repeat still gets the pool's interval
    assert single.half_width == pytest.approx(t_quantile(0.975, 3) * 7.0 * spread.relative_std)


def test_a_pool_without_degrees_of_freedom_gives_no_interval_and_refuses_non_positive_values() -> None:
    spread = pool([[3.0], [4.0]])
    assert spread.df == 0 and math.isnan(spread.relative_std)
    assert math.isnan(pooled_interval([3.0], spread).half_width)
    with pytest.raises(ValueError, match="positive"):
        pool([[1.0, 0.0]])


def test_ratio_of_two_pooled_estimates_takes_the_pool_s_degrees_of_freedom() -> None:
    """Both sides from one pool: Welch would count 2 x 4 degrees of freedom for one spread estimate; it is 4."""
    spread = pool([[1.0, 1.1, 0.9], [2.0, 2.1, 1.9]])
    top, bottom = pooled_interval([1.0, 1.1, 0.9], spread), pooled_interval([2.0, 2.1, 1.9], spread)
    ratio = ratio_interval(top, bottom)
    assert ratio.half_width == pytest.approx(t_quantile(0.975, 4) * 0.5 * math.sqrt(2 * spread.relative_std**2 / 3))
