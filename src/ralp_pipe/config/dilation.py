"""The dilation arithmetic every layer needs (engine/dilation.py owns the rest): the factor as a number, whether ranks
compute, and the rate emulated links run at (slowed to what the strategy's transport achieves over them, ``strategy.transport_cap``)."""

from __future__ import annotations

from ralp_pipe.config.schema import AUTO_FACTOR, REAL, Config
from ralp_pipe.config.units import payload_bytes_per_s, rate_bits_per_s, rate_bytes_per_s


def fixed_factor(cfg: Config) -> float | None:
    """``dilation.factor`` as a number (None when undilated or still ``auto``)."""
    factor = cfg.dilation.factor
    return None if factor is None or factor == AUTO_FACTOR else float(factor)


def computes_for_real(cfg: Config) -> bool:
    """Whether the run's ranks compute (undilated, or mode real) or only wait (mode modelled: no data read)."""
    return cfg.dilation.factor is None or cfg.dilation.mode == REAL


def shaped_rate(rate: str, factor: float | None) -> str:
    """The tc rate emulated links run at: `rate` / `factor` (unchanged without dilation or when unlimited)."""
    bits = rate_bits_per_s(rate)
    if factor is None or bits is None:
        return rate
    return f"{bits / factor:.0f}bit"


def transport_efficiency(rate: str, cap: str | None) -> float:
    """The share of a link of `rate`'s TCP payload rate a transport moving `cap` on its own achieves over it, each
    byte costing the link's time and the transport's in series (:func:`~ralp_pipe.config.units.in_series`); 1
    without a cap or on an unlimited link."""
    payload = payload_bytes_per_s(rate)
    capped = None if cap is None else rate_bytes_per_s(cap, "strategy.transport_cap")
    if payload is None or capped is None:
        return 1.0
    return capped / (payload + capped)  # in_series(payload, capped) / payload


def transport_rate(rate: str, cap: str | None) -> str:
    """The rate a link of `rate` carrying a transport capped at `cap` is shaped to (unlimited stays unlimited)."""
    bits = rate_bits_per_s(rate)
    efficiency = transport_efficiency(rate, cap)
    if bits is None or efficiency == 1.0:
        return rate
    return f"{bits * efficiency:.0f}bit"


def emulated_rate(cfg: Config) -> str:
    """The tc rate a run's emulated links are shaped to: ``network.rate`` x the transport's efficiency over it
    (``strategy.transport_cap``, :func:`transport_efficiency`) / D, so a transfer of `dtf` over gRPC takes as
    long as the cost model prices it."""
    return shaped_rate(transport_rate(cfg.network.rate, cfg.strategy.transport_cap), fixed_factor(cfg))
