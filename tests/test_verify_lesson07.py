"""Lesson 07's claims (course_lib/teaching/claims/lesson07a.py and lesson07b.py) hold in the runs tests/test_notebooks.py
left, and a changed fact is found and named, in each part; the operation counts of its two models, which do not
depend on the run, are checked here directly."""
import json
import shutil

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from course_lib import MyModel
from course_lib.teaching.verify import ROOT, ClaimFailed, verify
from notebook_runner import runs_with_one_lost_sample, executed as _executed

PART_A, PART_B = "07a_performance_scaling", "07b_performance_launch"
CLAIMS = {PART_A: 4, PART_B: 8}


def test_resnet18_needs_over_100_times_mymodels_operations_per_sample():
    """Part 07a's FLOP table: FlopCounterMode counts a training sample of each model, as the lesson does."""
    timm = pytest.importorskip("timm")

    def per_sample(model, batch=8):
        with FlopCounterMode(display=False) as counter:
            F.cross_entropy(model(torch.randn(batch, 1, 28, 28)), torch.randint(0, 10, (batch,))).backward()
        return counter.get_total_flops() / batch

    mymodel = per_sample(MyModel())
    resnet18 = per_sample(timm.create_model("resnet18", pretrained=False, num_classes=10, in_chans=1))
    assert resnet18 > 100 * mymodel > 0, (resnet18, mymodel)


def test_part_07as_claims_hold_in_its_run_and_a_negative_figure_in_its_bench_json_is_found(tmp_path):
    nb = _executed(PART_A)
    assert verify(PART_A, nb, ROOT / "notebooks") == CLAIMS[PART_A]
    out = nbformat.read(ROOT / "notebooks" / f"{PART_A}.ipynb", as_version=4)  # OUT, as the parameters cell sets it
    folder = "runs/07_performance/07a"
    assert f'OUT = "{folder}"' in next(c.source for c in out.cells if "parameters" in c.metadata.get("tags", []))
    shutil.copytree(ROOT / "notebooks" / folder, tmp_path / folder)
    result = json.loads((tmp_path / folder / "bench.json").read_text())
    result["scaling"]["mymodel"]["efficiency"]["2"] = -0.5
    (tmp_path / folder / "bench.json").write_text(json.dumps(result))
    with pytest.raises(ClaimFailed, match=r"bench.json holds every figure[^\n]*scaling.mymodel.2.efficiency") as failed:
        verify(PART_A, nb, tmp_path)
    assert f"1 of {CLAIMS[PART_A]}" in str(failed.value), failed.value  # only that claim


def test_part_07bs_claims_hold_in_its_run_and_a_lost_validation_sample_is_found(tmp_path):
    nb = _executed(PART_B)
    assert verify(PART_B, nb, ROOT / "notebooks") == CLAIMS[PART_B]
    with pytest.raises(ClaimFailed, match="the compact view's run finished its epoch") as failed:
        verify(PART_B, nb, runs_with_one_lost_sample("07_performance", "compact", tmp_path))
    assert f"1 of {CLAIMS[PART_B]}" in str(failed.value), failed.value  # only that claim


def test_a_panel_whose_epoch_bar_stopped_short_is_found():
    nb = _executed(PART_B)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    bar = next(m["state"] for m in state.values() if m["model_name"] == "IntProgressModel"
               and str(m["state"].get("description", "")).startswith("epochs"))
    bar["value"] = int(bar["max"]) - 1
    with pytest.raises(ClaimFailed, match="epoch bar ended full") as failed:
        verify(PART_B, nb, ROOT / "notebooks")
    assert f"1 of {CLAIMS[PART_B]}" in str(failed.value), failed.value
