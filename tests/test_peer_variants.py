"""The peer harness's `--variant` table: variants parsed from the command line, TensorFlow's means read from a
peers record, one line per setting with each variant's predicted / TensorFlow ratio."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def variants():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("peer_variants", ROOT / "benchmarks/peers/variants.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_variants_parse_and_tabulate_against_the_records_tensorflow(variants) -> None:  # type: ignore[no-untyped-def]
    parsed = variants.parse(["base=", "no cap=strategy.transport_cap=null,strategy.step_barrier=false"])
    assert parsed == {"base": [], "no cap": ["strategy.transport_cap=null", "strategy.step_barrier=false"]}
    with pytest.raises(SystemExit, match="NAME=KEY=VALUE"):
        variants.parse(["nameless"])
    tf = variants.peer_means(ROOT / "docs/records/peers-dtf.json")
    assert tf[("alexnet", 4, "200mbit")] > 0
    rows = [
        {"model": "alexnet", "hosts": 4, "rate": "1gbit", "variant": v, "tf_images_per_sec": 2.0,
         "predicted_over_tf": r}
        for v, r in (("base", 0.8), ("no cap", 1.04))
    ]  # fmt: skip
    table = variants.markdown(rows)
    assert "| setting | TF img/s | base | no cap |" in table
    assert "| alexnet N = 4, 1gbit | 2 | 0.80 | 1.04 |" in table
