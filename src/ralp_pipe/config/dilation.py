"""The dilation arithmetic every layer needs (engine/dilation.py owns the rest): the factor as a number, whether ranks
compute, and the rate emulated links run at (slowed to the strategy's transport's achieved throughput, ``strategy.transport_efficiency``)."""

from __future__ import annotations

from ralp_pipe.config.schema import AUTO_FACTOR, REAL, Config
from ralp_pipe.config.units import rate_bits_per_s


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


def transport_rate(rate: str, efficiency: float) -> str:
    """The rate a transport achieving `efficiency` of a link of `rate` moves data at (unlimited stays unlimited)."""
    bits = rate_bits_per_s(rate)
    if bits is None or efficiency == 1.0:
        return rate
    return f"{bits * efficiency:.0f}bit"


def emulated_rate(cfg: Config) -> str:
    """The tc rate a run's emulated links are shaped to: ``network.rate`` x ``strategy.transport_efficiency`` / D,
    so a transfer of `dtf` over gRPC takes bytes / (efficiency x rate), as the cost model prices it."""
    return shaped_rate(transport_rate(cfg.network.rate, cfg.strategy.transport_efficiency), fixed_factor(cfg))
