"""The dilation arithmetic every layer needs (engine/dilation.py owns the rest): the factor as a number, and the
rate emulated links run at."""

from __future__ import annotations

from ralp_pipe.config.schema import AUTO_FACTOR, Config
from ralp_pipe.config.units import rate_bits_per_s


def fixed_factor(cfg: Config) -> float | None:
    """``dilation.factor`` as a number (None when undilated or still ``auto``)."""
    factor = cfg.dilation.factor
    return None if factor is None or factor == AUTO_FACTOR else float(factor)


def shaped_rate(rate: str, factor: float | None) -> str:
    """The tc rate emulated links run at: `rate` / `factor` (unchanged without dilation or when unlimited)."""
    bits = rate_bits_per_s(rate)
    if factor is None or bits is None:
        return rate
    return f"{bits / factor:.0f}bit"
