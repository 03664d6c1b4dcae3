"""Lesson 11's claims (course_lib/teaching/claims/lesson11.py) hold in its run, and a false one is found: in a table
the notebook drew, and in what one rank saved (pool.save) where the notebook shows only rank 0."""
import copy
import json
import shutil

import pytest

from course_lib.teaching.verify import ROOT, ClaimFailed, verify

from notebook_runner import executed, table_in

LESSON = "11_pipeline_parallel"
RUNS = ROOT / "notebooks" / "runs" / "11_pipeline_parallel"


def _claims(nb) -> int:
    return verify(LESSON, nb, ROOT / "notebooks")


def test_11s_claims_hold_in_its_run_and_a_bubble_off_the_formula_is_found():
    """Every claim holds; then 1F1B's bubble at the largest m is drawn 0.3 above the formula: the claim that it stays
    near the formula fails, and with it the one that it falls as m grows, and nothing else."""
    nb = executed(LESSON)
    total = _claims(nb)
    assert total >= 20
    doctored = copy.deepcopy(nb)
    rows = table_in(doctored, "l11-time-show", "The bubble on")["rows"]
    row = [r for r in rows if r["schedule"] == "one_f_one_b"][-1]
    row["bubble measured (median)"] = str(float(row["formula (p-1)/(m+p-1)"]) + 0.3)
    with pytest.raises(ClaimFailed, match="one_f_one_b: the measured bubble stays within") as failed:
        verify(LESSON, doctored, ROOT / "notebooks")
    assert f"of {total}" in str(failed.value) and str(failed.value).count("\n  - ") <= 2, failed.value


def _worse_gradient(ranks):
    ranks["hand_rows"][-1][-1]["max |gradient - reference|"] = 3e-4


def _more_kept(ranks):
    ranks["hand_rows"][0][1]["most micro-batches kept"] += 1  # rank 0 under 1F1B kept one micro-batch too many


def _fewer_seen(ranks):
    ranks["trained"][-1]["pipeline"][1] -= 1  # one validation image not counted, as the last rank saw it


def _library_gradient(ranks):
    ranks["library_rows"][-1][2]["max |gradient - reference|"] = 1e-3  # interleaved, on the last rank


@pytest.mark.parametrize("doctor, claim", [
    (_worse_gradient, "GPipe and 1F1B by hand give one process's loss and gradients"),
    (_more_kept, "GPipe keeps all 4 micro-batches on every stage; 1F1B at most p - rank"),
    (_fewer_seen, "every rank gets the pipeline's count of all 10,000 validation images"),
    (_library_gradient, "PyTorch's GPipe, 1F1B and interleaved 1F1B give one process's"),
], ids=["gradient", "memory", "evaluation", "library"])
def test_what_the_notebook_shows_only_of_rank_0_is_checked_on_every_rank(doctor, claim, tmp_path):
    nb = executed(LESSON)
    shutil.copytree(RUNS, tmp_path / "runs" / "11_pipeline_parallel", ignore=shutil.ignore_patterns("*.pt"))
    saved = tmp_path / "runs" / "11_pipeline_parallel" / "ranks.json"
    ranks = json.loads(saved.read_text())
    doctor(ranks)
    saved.write_text(json.dumps(ranks))
    with pytest.raises(ClaimFailed) as failed:
        verify(LESSON, nb, tmp_path)
    assert str(failed.value).count("\n  - ") == 1 and claim in str(failed.value), str(failed.value)
