"""Lesson 08's claims (course_lib/teaching/claims/lesson08.py) hold in its run and a false one is found; its traffic
counter, which does not depend on the run, is checked here directly."""
import copy

import nbformat
import pytest
import torch
import torch.distributed as dist

from course_lib.teaching.notebooks import px_cells
from course_lib.teaching.verify import ROOT, ClaimFailed, verify

EXECUTED = ROOT / "test-output" / "executed"
NOTEBOOK = ROOT / "notebooks" / "08_inside_ddp.ipynb"


def test_counted_wire_counts_all_reduces_inside_and_gives_the_real_one_back(tmp_path):
    """Section 8's counted_wire(): calls and bytes inside, from zero each time; afterwards, even after an error,
    dist.all_reduce is torch's own again (section 9 trains with hooks inside it)."""
    space = {"torch": torch, "dist": dist}
    exec(px_cells(NOTEBOOK, ["l08-accum-defs"])["l08-accum-defs"], space)
    real = dist.all_reduce
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        for _ in range(2):
            with space["counted_wire"]() as wire:
                dist.all_reduce(torch.ones(10))
                dist.all_reduce(torch.ones(3, dtype=torch.float16))
            assert wire == {"calls": 2, "bytes": 46} and dist.all_reduce is real
        with pytest.raises(RuntimeError), space["counted_wire"]():
            raise RuntimeError("a step failed")
        assert dist.all_reduce is real is torch.distributed.distributed_c10d.all_reduce
    finally:
        dist.destroy_process_group()


def test_lesson_08s_claims_hold_in_its_run_and_a_changed_bucket_size_is_found():
    """On the run tests/test_notebooks.py left (it runs first): every claim holds; then DDP's rebuilt buckets, as
    the table shows them, differ from ours by one byte, and only that claim fails."""
    if not (EXECUTED / "08_inside_ddp.ipynb").exists():  # checked when the test runs, after tests/test_notebooks.py
        pytest.skip("lesson 08 has not been executed by tests/test_notebooks.py in this run")
    nb = nbformat.read(EXECUTED / "08_inside_ddp.ipynb", as_version=4)
    assert verify("08_inside_ddp", nb, ROOT / "notebooks") == 34
    doctored = copy.deepcopy(nb)
    cell = next(c for c in doctored.cells if c.get("id") == "l08-buckets-show")
    table = next(o for o in cell.outputs if "course_table" in o.get("metadata", {}))["metadata"]["course_table"]
    table["rows"][0]["DDP reported, rebuilt (B)"] = "2,857 | 16,384 | 5,376"
    with pytest.raises(ClaimFailed, match="DDP's rebuilt buckets have our bytes") as failed:
        verify("08_inside_ddp", doctored, ROOT / "notebooks")
    assert "1 of" in str(failed.value), failed.value  # only that claim


def test_lesson_08s_claim_that_the_training_run_counted_every_image_reads_its_metrics(tmp_path):
    if not (EXECUTED / "08_inside_ddp.ipynb").exists():
        pytest.skip("lesson 08 has not been executed by tests/test_notebooks.py in this run")
    nb = nbformat.read(EXECUTED / "08_inside_ddp.ipynb", as_version=4)
    (tmp_path / "runs" / "08_inside_ddp" / "bucketed").mkdir(parents=True)
    source = ROOT / "notebooks" / "runs" / "08_inside_ddp" / "bucketed" / "metrics.jsonl"
    (tmp_path / "runs" / "08_inside_ddp" / "bucketed" / "metrics.jsonl").write_text(
        source.read_text().replace('"val_count": 10000', '"val_count": 9999'))
    with pytest.raises(ClaimFailed, match="each counting the 10,000 validation images"):
        verify("08_inside_ddp", nb, tmp_path)
