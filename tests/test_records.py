"""Typed records between stages: version 1 without a version key, newer versions and bad files refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ralp_pipe.contract.records import SCHEMA_VERSION, Plan, Profile, RunMetrics
from ralp_pipe.errors import DataError
from workflow_records import metrics


def test_unversioned_run_record_reads_as_version_1_and_writes_the_same_keys_with_the_version(tmp_path: Path) -> None:
    doc = metrics("vgg11", "synthetic1k", "ralp_n", 4)
    del doc["window_s"]  # a key that came later, with a default
    (tmp_path / "metrics.json").write_text(json.dumps(doc))
    record = RunMetrics.read(tmp_path / "metrics.json")
    assert record.run == "synthetic1k/vgg11/n4-1gbit/ralp_n/r0" and record.split == 8 and record.window_s is None
    record.write(tmp_path / "again.json")
    written = json.loads((tmp_path / "again.json").read_text())
    assert next(iter(written)) == "schema_version" and written["schema_version"] == SCHEMA_VERSION == 1
    assert {k: v for k, v in written.items() if k in doc} == doc
    assert RunMetrics.read(tmp_path / "again.json") == record


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema_version": 2, "strategies": {}}', "schema_version 2 but this ralp-pipe reads up to 1"),
        ('{"schema_version": "1", "strategies": {}}', "not a positive integer"),
        ("{}", "lacks key 'strategies'"),
        ('{"strategies": {}, "stratgies": {}}', "unknown key 'stratgies'"),
        ("[1, 2]", "not a JSON object"),
        ('{"strategies": ', "cannot read plan"),
        (None, "cannot read plan"),
    ],
)
def test_bad_plan_files_are_data_errors_naming_the_file(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=message) as err:
        Plan.read(path)
    assert str(path) in str(err.value)


def test_profile_lists_the_missing_keys() -> None:
    with pytest.raises(DataError, match="profile p.json lacks key 'units', 'update'"):
        Profile.from_dict(
            {"model": "m", "num_classes": 1, "image_size": 8, "batches": {}, "device": "cpu", "link": {}}, "p.json"
        )
