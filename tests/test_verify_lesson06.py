"""Lesson 06's claims (course_lib/teaching/claims/lesson06a.py, lesson06b.py, lesson06c.py) hold in the run of each
of its parts and a false one is named; the fact of PyTorch that the lesson's loss fix rests on is tested here."""
import shutil

import pytest
import torch
import torch.nn.functional as F

from course_lib.teaching.verify import ROOT, ClaimFailed, verify
from notebook_runner import runs_with_one_lost_sample, executed as _executed

HEAVY = shutil.ignore_patterns("logs", "rng_state*", "optimizer.pt", "scheduler.pt")


def test_nll_loss_of_log_softmax_is_cross_entropy():
    """Section 2f: the correct loss for raw outputs."""
    torch.manual_seed(0)
    logits, labels = torch.randn(8, 10), torch.randint(0, 10, (8,))
    assert torch.allclose(F.nll_loss(F.log_softmax(logits, dim=1), labels), F.cross_entropy(logits, labels))


def test_part_06a_claims_hold_in_its_run_and_a_printed_fact_that_changed_is_found():
    """Every claim of 06a holds; then the cell of section 2f says nll_loss of log_softmax is not cross_entropy, and
    that claim alone fails."""
    nb = _executed("06a_trainer_seed_defects")
    assert verify("06a_trainer_seed_defects", nb, ROOT / "notebooks") == 13
    cell = next(c for c in nb.cells if c.get("id") == "54eeb6d0")
    for out in cell.outputs:
        if "text" in out:
            out["text"] = out["text"].replace("cross_entropy(logits): True", "cross_entropy(logits): False")
    with pytest.raises(ClaimFailed, match="nll_loss of log_softmax is cross_entropy") as failed:
        verify("06a_trainer_seed_defects", nb, ROOT / "notebooks")
    assert "1 of" in str(failed.value), failed.value  # only that claim


def test_part_06b_claims_hold_in_its_run_and_a_resume_that_evaluated_less_is_found(tmp_path):
    """Every claim of 06b holds; then the resumed launch's metrics say it counted 9,999 validation images, and that
    claim alone fails."""
    nb = _executed("06b_trainer_processes_checkpoints")
    assert verify("06b_trainer_processes_checkpoints", nb, ROOT / "notebooks") == 21
    with pytest.raises(ClaimFailed, match="the resumed launch ran only the one new epoch") as failed:
        verify("06b_trainer_processes_checkpoints", nb, runs_with_one_lost_sample("06_trainer", "", tmp_path, HEAVY))
    assert "1 of" in str(failed.value), failed.value  # only that claim


def test_part_06c_claims_hold_in_its_run_and_a_level_that_evaluated_less_is_found(tmp_path):
    """Every claim of 06c holds; then the Trainer level's metrics say it counted 9,999 validation images, and that
    claim alone fails."""
    nb = _executed("06c_trainer_three_levels")
    assert verify("06c_trainer_three_levels", nb, ROOT / "notebooks") == 6
    with pytest.raises(ClaimFailed, match="each level trained") as failed:
        verify("06c_trainer_three_levels", nb, runs_with_one_lost_sample("06_trainer", "level_trainer", tmp_path, HEAVY))
    assert "1 of" in str(failed.value), failed.value  # only that claim
