"""Harnesses used only by the tests and benchmarks (not part of the installed package)."""
