"""Process pools for the CPU-bound data stages."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def process_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of `workers` fresh interpreter processes (spawned: safe next to threads such as tqdm's)."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
