"""ralp-pipe: reproduce the RALP paper's distributed CNN training evaluation."""

__version__ = "0.1.0"
