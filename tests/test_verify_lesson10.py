"""Lesson 10's claims (course_lib/teaching/claims/lesson10.py) hold in its run, and a false one is found: in a table
the notebook drew, and in what one rank saved (pool.save) where the notebook shows only rank 0."""
import copy
import json
import shutil

import pytest

from course_lib.teaching.verify import ROOT, ClaimFailed, verify

from notebook_runner import executed, table_in

LESSON = "10_tensor_sequence_parallel"
RUNS = ROOT / "notebooks" / "runs" / "10_tensor_parallel"


def test_10s_claims_hold_in_its_run_and_a_plan_that_sends_more_is_found():
    """Every claim holds; then Megatron's plan shows one all-reduce more in the backward: that claim fails, and only
    it."""
    nb = executed(LESSON)
    assert verify(LESSON, nb, ROOT / "notebooks") == 17
    doctored = copy.deepcopy(nb)
    row = next(r for r in table_in(doctored, "l10-plans-show")["rows"] if r["plan"] == "Megatron's")
    row["in the blocks, backward"] = row["in the blocks, backward"].replace("4 all-reduces", "5 all-reduces")
    with pytest.raises(ClaimFailed, match="Megatron's plan sends by hand's 2 \\+ 2") as failed:
        verify(LESSON, doctored, ROOT / "notebooks")
    assert "1 of 17" in str(failed.value), failed.value


def _worse_gradient(ranks):
    ranks["hand_result"][-1]["max |gradient - reference|"] = 3e-4


def _fewer_seen(ranks):
    ranks["trained"][-1]["sequence parallel"][1] -= 1  # one validation image not counted, on the last rank


def _other_plan(ranks):
    ranks["plan_rows"][-1][1]["calls"].pop()  # the last rank sent one collective less in Megatron's plan


@pytest.mark.parametrize("doctor, claim", [
    (_worse_gradient, "Megatron by hand gives one process's logits and gradients"),
    (_fewer_seen, "every rank evaluates all 10,000 validation images once"),
    (_other_plan, "every rank sends what rank 0 sends"),
], ids=["gradient", "evaluation", "plan"])
def test_what_the_notebook_shows_only_of_rank_0_is_checked_on_every_rank(doctor, claim, tmp_path):
    nb = executed(LESSON)
    shutil.copytree(RUNS, tmp_path / "runs" / "10_tensor_parallel", ignore=shutil.ignore_patterns("*.pt"))
    saved = tmp_path / "runs" / "10_tensor_parallel" / "ranks.json"
    ranks = json.loads(saved.read_text())
    doctor(ranks)
    saved.write_text(json.dumps(ranks))
    with pytest.raises(ClaimFailed) as failed:
        verify(LESSON, nb, tmp_path)
    assert str(failed.value).count("\n  - ") == 1 and claim in str(failed.value), str(failed.value)
