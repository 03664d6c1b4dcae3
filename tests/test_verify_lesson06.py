"""Lesson 06's claims (course_lib/teaching/claims/lesson06.py) hold in its run and a false one is named; the fact of
PyTorch that the lesson's loss fix rests on is tested here."""
import shutil

import nbformat
import pytest
import torch
import torch.nn.functional as F

from course_lib.teaching.verify import ROOT, ClaimFailed, verify
from notebook_runner import runs_with_one_lost_sample

EXECUTED = ROOT / "test-output" / "executed"


def test_nll_loss_of_log_softmax_is_cross_entropy():
    """Section 2f: the correct loss for raw outputs."""
    torch.manual_seed(0)
    logits, labels = torch.randn(8, 10), torch.randint(0, 10, (8,))
    assert torch.allclose(F.nll_loss(F.log_softmax(logits, dim=1), labels), F.cross_entropy(logits, labels))


def test_lesson_06s_claims_hold_in_its_run_and_a_level_that_evaluated_less_is_found(tmp_path):
    """On the run tests/test_notebooks.py left (it runs first): every claim holds; then the Trainer level's metrics
    say it counted 9,999 validation images, and that claim alone fails."""
    if not (EXECUTED / "06_trainer.ipynb").exists():  # checked when the test runs, after test_notebooks.py
        pytest.skip("lesson 06 has not been executed by tests/test_notebooks.py in this run")
    nb = nbformat.read(EXECUTED / "06_trainer.ipynb", as_version=4)
    assert verify("06_trainer", nb, ROOT / "notebooks") == 40
    heavy = shutil.ignore_patterns("logs", "rng_state*", "optimizer.pt", "scheduler.pt")
    with pytest.raises(ClaimFailed, match="each level trained") as failed:
        verify("06_trainer", nb, runs_with_one_lost_sample("06_trainer", "level_trainer", tmp_path, heavy))
    assert "1 of" in str(failed.value), failed.value  # only that claim
