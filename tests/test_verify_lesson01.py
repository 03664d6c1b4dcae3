"""Lesson 01's claims (course_lib/teaching/claims/lesson01.py) hold in the run tests/test_notebooks.py left, and a
changed fact is found and named: a table row the collectives drew, a record of the all_reduce measurement."""
import json
import shutil

import nbformat
import pytest

from course_lib.teaching.verify import ROOT, ClaimFailed, verify

EXECUTED = ROOT / "test-output" / "executed"
CLAIMS = 23


def _executed():
    if not (EXECUTED / "01_collectives.ipynb").exists():  # checked when the test runs, after tests/test_notebooks.py
        pytest.skip("lesson 01 has not been executed by tests/test_notebooks.py in this run")
    return nbformat.read(EXECUTED / "01_collectives.ipynb", as_version=4)


def test_lesson_01s_claims_hold_in_its_run_and_a_wrong_broadcast_is_found():
    nb = _executed()
    assert verify("01_collectives", nb, ROOT / "notebooks") == CLAIMS
    table = next(out.metadata["course_table"] for cell in nb.cells if cell.cell_type == "code"
                 for out in cell.get("outputs", []) if out.get("metadata", {}).get("course_table", {}).get("title")
                 == "broadcast")
    table["rows"][-1]["after"] = "[0.0, 0.0, 0.0]"  # the last rank kept its zeros
    with pytest.raises(ClaimFailed, match="every rank holds rank 0's tensor") as failed:
        verify("01_collectives", nb, ROOT / "notebooks")
    assert f"1 of {CLAIMS}" in str(failed.value), failed.value  # only that claim


def test_a_size_missing_from_the_all_reduce_measurement_is_found(tmp_path):
    nb = _executed()
    (tmp_path / "runs" / "01_collectives").mkdir(parents=True)
    metrics = tmp_path / "runs" / "01_collectives" / "metrics.jsonl"
    shutil.copy(ROOT / "notebooks" / "runs" / "01_collectives" / "metrics.jsonl", metrics)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    del records[len(records) // 2]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ClaimFailed, match="timed every size") as failed:
        verify("01_collectives", nb, tmp_path)
    assert f"1 of {CLAIMS}" in str(failed.value), failed.value
