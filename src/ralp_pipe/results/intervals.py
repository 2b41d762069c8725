"""Confidence intervals across repeats: Student's t for a mean, the delta method for a ratio of means.

A configuration measured in k independent repeats has the mean images/sec, its sample standard
deviation (k - 1 in the denominator) and a 95% t-interval of the mean, mean ± t(0.975, k - 1) s / sqrt(k).
A speedup (or a change between two bundles) is a ratio of two such means, A / B, from independent
repeats; its interval comes from the delta method: the relative variance of the ratio is the sum
of the relative variances of the two means, s_A² / (k_A Ā²) + s_B² / (k_B B̄²), with Welch-Satterthwaite
degrees of freedom for the t quantile. One repeat gives no interval (NaN).

The t quantile is computed here (no scipy in the environment): the t distribution's CDF from the
regularised incomplete beta function (a continued fraction), inverted by bisection.

Pooled intervals (:func:`pool`, :func:`pooled_interval`): with few repeats per configuration (2 give t = 12.7 at
one degree of freedom) the tables estimate the run-to-run spread once for many configurations whose runs vary
alike, as a one-way analysis of variance does: the pooled within-configuration variance of ln(images/sec),
sum over configurations of sum over repeats (ln x - mean of ln x)² / sum over configurations (k - 1), with
that sum of k - 1 as degrees of freedom. Its square root is the relative standard deviation of one run; a
configuration's interval is mean ± t(0.975, df) x relative SD x mean / sqrt(k). What varies between runs is
what varies between fresh sets of ranks (the host's scheduling, the emulated links' jitter), assumed alike in
every configuration of the pool; :class:`Pool` keeps the largest configuration's own relative SD beside the
pooled one, so a configuration that varies more than the pool shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

LEVEL = 0.95  # two-sided confidence of every interval in the tables
_EPS, _TINY, _MAX_TERMS = 1e-15, 1e-300, 500


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b), evaluated with the modified Lentz method."""
    f = c = 1.0
    d = 0.0
    for j in range(1, 2 * _MAX_TERMS):
        m = j // 2
        if j % 2:  # odd terms d_(2m+1)
            term = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:  # even terms d_(2m)
            term = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + term * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + term / c
        c = c if abs(c) > _TINY else _TINY
        f *= c * d
        if abs(c * d - 1.0) < _EPS:
            return f
    raise ArithmeticError(f"incomplete beta I_{x}({a}, {b}) did not converge")


def incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularised incomplete beta function I_x(a, b) for 0 <= x <= 1 and a, b > 0."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete_beta needs 0 <= x <= 1, got {x}")
    if x in (0.0, 1.0):
        return x
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below this point; use the symmetry above it
        return 1.0 - incomplete_beta(1.0 - x, b, a)
    log_front = a * math.log(x) + b * math.log1p(-x) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    return math.exp(log_front) / (a * _beta_fraction(x, a, b))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"t distribution needs df > 0, got {df}")
    tail = 0.5 * incomplete_beta(df / (df + t * t), df / 2, 0.5)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, by bisection on :func:`t_cdf` (to 1e-12 relative)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile needs 0 < p < 1, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, 2 * high
    while high - low > 1e-12 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


def _t_half(df: float) -> float:
    return t_quantile(0.5 + LEVEL / 2, df)


@dataclass(frozen=True)
class Estimate:
    """A mean over repeats: its value, sample standard deviation, count and the interval's half-width."""

    mean: float
    std: float
    count: int
    half_width: float
    df: float = math.nan  # degrees of freedom of `std`; NaN: count - 1 (its own repeats)

    @property
    def dof(self) -> float:
        """Degrees of freedom of :attr:`std`: :attr:`df` where pooled, else count - 1."""
        return self.count - 1 if math.isnan(self.df) else self.df

    @property
    def low(self) -> float:
        """Lower end of the interval."""
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        """Upper end of the interval."""
        return self.mean + self.half_width


def mean_interval(values: Sequence[float]) -> Estimate:
    """Mean, standard deviation and 95% t-interval half-width of `values` (NaN std and width for one value)."""
    count = len(values)
    if count == 0:
        raise ValueError("mean_interval needs at least one value")
    mean = math.fsum(values) / count
    if count == 1:
        return Estimate(mean, math.nan, 1, math.nan)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (count - 1))
    return Estimate(mean, std, count, _t_half(count - 1) * std / math.sqrt(count))


def ratio_interval(top: Estimate, bottom: Estimate) -> Estimate:
    """top.mean / bottom.mean with its 95% delta-method interval (independent repeats, Welch df).

    The returned `std` is the delta method's standard error of the ratio and `count` the smaller
    repeat count; the width is NaN when either side's std has no degrees of freedom (a single repeat,
    unpooled) or a mean of 0. Each side's t degrees of freedom are its :attr:`Estimate.dof` (the pool's where pooled).
    """
    ratio = top.mean / bottom.mean if bottom.mean else math.nan
    count = min(top.count, bottom.count)
    if min(top.dof, bottom.dof) < 1 or not top.mean or not bottom.mean:
        return Estimate(ratio, math.nan, count, math.nan)
    terms = [(e.std / e.mean) ** 2 / e.count for e in (top, bottom)]
    relative = math.fsum(terms)
    if relative == 0.0:
        return Estimate(ratio, 0.0, count, 0.0)
    df = relative**2 / math.fsum(term**2 / e.dof for term, e in zip(terms, (top, bottom)))
    if not (math.isnan(top.df) or math.isnan(bottom.df)):  # pooled: one spread estimate may stand behind both sides
        df = min(df, max(top.df, bottom.df))
    error = abs(ratio) * math.sqrt(relative)
    return Estimate(ratio, error, count, _t_half(df) * error)


@dataclass(frozen=True)
class Pool:
    """The run-to-run spread of a set of configurations: pooled relative SD (of ln images/sec) and its degrees of
    freedom, with the largest configuration's own relative SD beside it (NaN where none has 2 repeats)."""

    relative_std: float
    df: int
    configurations: int
    largest_own: float


def pool(groups: Sequence[Sequence[float]]) -> Pool:
    """The pooled relative SD of `groups` (each a configuration's repeats, all > 0): sum of squared deviations of
    ln x from each configuration's mean of ln x over sum of (k - 1); NaN with no configuration of 2 repeats."""
    squares, df, own = 0.0, 0, []
    for values in groups:
        if any(v <= 0 for v in values):
            raise ValueError(f"pooled intervals need positive values, got {list(values)}")
        logs = [math.log(v) for v in values]
        centre = math.fsum(logs) / len(logs) if logs else 0.0
        deviations = math.fsum((y - centre) ** 2 for y in logs)
        squares += deviations
        df += max(len(logs) - 1, 0)
        if len(logs) > 1:
            own.append(math.sqrt(deviations / (len(logs) - 1)))
    relative = math.sqrt(squares / df) if df else math.nan
    return Pool(relative, df, len(groups), max(own, default=math.nan))


def pooled_interval(values: Sequence[float], spread: Pool) -> Estimate:
    """Mean of `values` with the 95% t-interval of the pooled relative SD `spread` (df: the pool's): std = relative
    SD x mean, half-width = t(0.975, df) x std / sqrt(k); NaN std and width where the pool has no df."""
    count = len(values)
    if count == 0:
        raise ValueError("pooled_interval needs at least one value")
    mean = math.fsum(values) / count
    if not spread.df:
        return Estimate(mean, math.nan, count, math.nan, 0.0)
    std = spread.relative_std * abs(mean)
    return Estimate(mean, std, count, _t_half(spread.df) * std / math.sqrt(count), float(spread.df))
