"""Lesson 12's claims (course_lib/teaching/claims/lesson12.py) hold in its run, and a false one is found: in a table
the notebook drew, and in what one rank saved (pool.save, ranks-4.json and ranks-8.json) where the notebook shows
only rank 0 or the worst of the ranks."""
import copy
import json
import shutil

import pytest

from course_lib.teaching.verify import ROOT, ClaimFailed, verify

from notebook_runner import executed, table_in

LESSON = "12_device_meshes"
RUNS = ROOT / "notebooks" / "runs" / "12_device_meshes"


def _other_choice(table):
    table["title"] = table["title"].replace("1 x 32 x 2", "2 x 16 x 2")  # the rule said to take a pipeline


def _pp_costs_memory(table):
    row = next(r for r in table["rows"] if (r["pp"], r["tp"]) == (4, 2))
    row["GB per GPU"] = round(row["GB per GPU"] / 2, 1)  # 4 stages drawn as halving the memory (it still fits)


@pytest.mark.parametrize("doctor, claim", [
    (_other_choice, "the rule picks 1 x 32 x 2: no pipeline"),
    (_pp_costs_memory, "for a given TP degree, the number of pipeline stages does not change the memory per GPU"),
], ids=["chosen", "memory"])
def test_12s_claims_hold_in_its_run_and_a_false_choice_of_mesh_is_found(doctor, claim):
    """Every claim holds; then the table of the 64-GPU layouts is drawn with one value changed: the claim about it
    fails, and only it."""
    nb = executed(LESSON)
    total = verify(LESSON, nb, ROOT / "notebooks")
    assert total >= 20
    doctored = copy.deepcopy(nb)
    doctor(table_in(doctored, "l12-choose", "64 GPUs of 80 GB"))
    with pytest.raises(ClaimFailed, match=claim) as failed:
        verify(LESSON, doctored, ROOT / "notebooks")
    assert f"1 of {total}" in str(failed.value) and str(failed.value).count("\n  - ") == 1, failed.value


def _worse_gradient(ranks):
    ranks["step_row"][-1]["max |gradient - reference|"] = 3e-4  # the 2-D step, on the last rank


def _fewer_seen(ranks):
    ranks["trained"][-1]["FSDP2 x TP"][1] -= 1  # one validation image not counted, as the last rank saw it


def _ring_bytes(ranks):
    ranks["ring_row"][-1]["bytes sent"] += ranks["ring_row"][-1]["keys and values of one share"]  # one share more


def _three_d_gradient(ranks):
    next(r for r in ranks["three_d"] if r["rank"] == 7)["max |gradient - reference|"] = 1e-3


@pytest.mark.parametrize("saved, doctor, claim", [
    ("ranks-4.json", _worse_gradient, "FSDP2 x TP gives one process's gradients within 1e-05 on every rank"),
    ("ranks-4.json", _fewer_seen, "the two rows' counts add up to all 10,000 validation images"),
    ("ranks-4.json", _ring_bytes, "each rank sends the keys and values of a share N - 1 times"),
    ("ranks-8.json", _three_d_gradient, "PP x FSDP x TP on 2 x 2 x 2 gives one process's gradients within 1e-05"),
], ids=["gradient", "evaluation", "ring", "3d"])
def test_what_the_notebook_shows_only_of_rank_0_is_checked_on_every_rank(saved, doctor, claim, tmp_path):
    nb = executed(LESSON)
    shutil.copytree(RUNS, tmp_path / "runs" / "12_device_meshes", ignore=shutil.ignore_patterns("*.pt"))
    path = tmp_path / "runs" / "12_device_meshes" / saved
    ranks = json.loads(path.read_text())
    doctor(ranks)
    path.write_text(json.dumps(ranks))
    with pytest.raises(ClaimFailed) as failed:
        verify(LESSON, nb, tmp_path)
    assert str(failed.value).count("\n  - ") == 1 and claim in str(failed.value), str(failed.value)
