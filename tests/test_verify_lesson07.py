"""Lesson 07's claims (course_lib/teaching/claims/lesson07.py) hold in the run tests/test_notebooks.py left, and a
changed fact is found and named; the operation counts of its two models, which do not depend on the run, are
checked here directly."""

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from course_lib import MyModel
from course_lib.teaching.verify import ROOT, ClaimFailed, verify
from notebook_runner import runs_with_one_lost_sample

EXECUTED = ROOT / "test-output" / "executed"
CLAIMS = 10


def test_resnet18_needs_over_100_times_mymodels_operations_per_sample():
    """Section 2's FLOP table: FlopCounterMode counts a training sample of each model, as the lesson does."""
    timm = pytest.importorskip("timm")

    def per_sample(model, batch=8):
        with FlopCounterMode(display=False) as counter:
            F.cross_entropy(model(torch.randn(batch, 1, 28, 28)), torch.randint(0, 10, (batch,))).backward()
        return counter.get_total_flops() / batch

    mymodel = per_sample(MyModel())
    resnet18 = per_sample(timm.create_model("resnet18", pretrained=False, num_classes=10, in_chans=1))
    assert resnet18 > 100 * mymodel > 0, (resnet18, mymodel)


def _executed():
    if not (EXECUTED / "07_performance.ipynb").exists():  # checked when the test runs, after tests/test_notebooks.py
        pytest.skip("lesson 07 has not been executed by tests/test_notebooks.py in this run")
    return nbformat.read(EXECUTED / "07_performance.ipynb", as_version=4)


def test_lesson_07s_claims_hold_in_its_run_and_a_lost_validation_sample_is_found(tmp_path):
    nb = _executed()
    assert verify("07_performance", nb, ROOT / "notebooks") == CLAIMS
    with pytest.raises(ClaimFailed, match="the compact view's run finished its epoch") as failed:
        verify("07_performance", nb, runs_with_one_lost_sample("07_performance", "compact", tmp_path))
    assert f"1 of {CLAIMS}" in str(failed.value), failed.value  # only that claim


def test_a_panel_whose_epoch_bar_stopped_short_is_found():
    nb = _executed()
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    bar = next(m["state"] for m in state.values() if m["model_name"] == "IntProgressModel"
               and str(m["state"].get("description", "")).startswith("epochs"))
    bar["value"] = int(bar["max"]) - 1
    with pytest.raises(ClaimFailed, match="epoch bar ended full") as failed:
        verify("07_performance", nb, ROOT / "notebooks")
    assert f"1 of {CLAIMS}" in str(failed.value), failed.value
