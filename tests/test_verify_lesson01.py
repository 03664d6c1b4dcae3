"""Lesson 01's claims (course_lib/teaching/claims/lesson01a.py and lesson01b.py, one module per part) hold in the runs
tests/test_notebooks.py left, and a changed fact is found and named: a table row the collectives drew (part a), a
record of the all_reduce measurement (part b)."""
import json
import shutil

import pytest

from course_lib.teaching.verify import ROOT, ClaimFailed, verify

from notebook_runner import executed as _executed

PART_A, PART_B = "01a_process_groups_collectives", "01b_ddp_by_hand"
CLAIMS_A, CLAIMS_B = 12, 11  # 23 for the lesson, as before it came in two parts


def test_lesson_01as_claims_hold_in_its_run_and_a_wrong_broadcast_is_found():
    nb = _executed(PART_A)
    assert verify(PART_A, nb, ROOT / "notebooks") == CLAIMS_A
    table = next(out.metadata["course_table"] for cell in nb.cells if cell.cell_type == "code"
                 for out in cell.get("outputs", []) if out.get("metadata", {}).get("course_table", {}).get("title")
                 == "broadcast")
    table["rows"][-1]["after"] = "[0.0, 0.0, 0.0]"  # the last rank kept its zeros
    with pytest.raises(ClaimFailed, match="every rank holds rank 0's tensor") as failed:
        verify(PART_A, nb, ROOT / "notebooks")
    assert f"1 of {CLAIMS_A}" in str(failed.value), failed.value  # only that claim


def test_lesson_01bs_claims_hold_in_its_run_and_a_size_missing_from_the_all_reduce_measurement_is_found(tmp_path):
    nb = _executed(PART_B)
    assert verify(PART_B, nb, ROOT / "notebooks") == CLAIMS_B
    (tmp_path / "runs" / "01_collectives").mkdir(parents=True)
    metrics = tmp_path / "runs" / "01_collectives" / "metrics.jsonl"
    shutil.copy(ROOT / "notebooks" / "runs" / "01_collectives" / "metrics.jsonl", metrics)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    del records[len(records) // 2]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ClaimFailed, match="timed every size") as failed:
        verify(PART_B, nb, tmp_path)
    assert f"1 of {CLAIMS_B}" in str(failed.value), failed.value


def test_a_wrong_gradient_of_ddp_by_hand_is_found():
    """Part b: one step's gradient difference over the tolerance fails exactly the claim about the gradients."""
    nb = _executed(PART_B)
    table = next(out.metadata["course_table"] for cell in nb.cells if cell.cell_type == "code"
                 for out in cell.get("outputs", []) if "max |grad by hand - grad DDP|"
                 in out.get("metadata", {}).get("course_table", {}).get("columns", []))
    table["rows"][-1]["max |grad by hand - grad DDP|"] = 1.0
    with pytest.raises(ClaimFailed, match="the gradients averaged by hand equal DDP's") as failed:
        verify(PART_B, nb, ROOT / "notebooks")
    assert f"1 of {CLAIMS_B}" in str(failed.value), failed.value
