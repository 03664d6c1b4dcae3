"""Lesson 09's claims (course_lib/teaching/claims/lesson09.py) hold in its run and a false one is found; the byte
counts of section 1, which do not depend on the run, are checked here directly."""
import copy

import nbformat
import pytest
import torch

from course_lib.teaching.notebooks import px_cells
from course_lib.teaching.verify import ROOT, ClaimFailed, verify

EXECUTED = ROOT / "test-output" / "executed"
NOTEBOOK = ROOT / "notebooks" / "09_sharding.ipynb"


def test_one_step_holds_exactly_the_formulas_bytes_of_state():
    """Section 1: parameters, gradients and optimizer state of one step are 4+4+4, 4+4+8 and (bf16 with an fp32
    master copy) 2+2+12 bytes per parameter, to the byte, for both of the lesson's models."""
    space = {"torch": torch, "device": torch.device("cpu")}
    exec(px_cells(NOTEBOOK, ["l09-memory-defs"])["l09-memory-defs"], space)
    formula = {"SGD + momentum": (4, 4, 4), "Adam": (4, 4, 8), space["MIXED"]: (2, 2, 12)}
    for model in space["MODELS"]:
        rows = [space["memory_of_one_step"](model, o) for o in space["OPTIMIZERS"]]
        for r in rows + [space["memory_of_a_mixed_precision_step"](model)]:
            psi = r["parameters"]
            measured = (r["parameter bytes"], r["gradient bytes"], r["optimizer bytes"])
            assert measured == tuple(b * psi for b in formula[r["optimizer"]]), r


def test_lesson_09s_claims_hold_in_its_run_and_a_changed_shard_count_is_found():
    """On the run tests/test_notebooks.py left (it runs first): every claim holds; then the checkpoint's file table
    shows a third shard: the claims of one shard file per rank and of a manifest listing every file fail, and only
    they."""
    if not (EXECUTED / "09_sharding.ipynb").exists():  # checked when the test runs, after tests/test_notebooks.py
        pytest.skip("lesson 09 has not been executed by tests/test_notebooks.py in this run")
    nb = nbformat.read(EXECUTED / "09_sharding.ipynb", as_version=4)
    assert verify("09_sharding", nb, ROOT / "notebooks") == 35
    doctored = copy.deepcopy(nb)
    cell = next(c for c in doctored.cells if c.get("id") == "l09-dcp-files")
    table = next(o for o in cell.outputs if "course_table" in o.get("metadata", {}))["metadata"]["course_table"]
    table["rows"].append({**table["rows"][-1], "file": "__2_0.distcp"})
    with pytest.raises(ClaimFailed, match="one shard file per rank") as failed:
        verify("09_sharding", doctored, ROOT / "notebooks")
    assert "2 of" in str(failed.value) and "manifest.json lists every file" in str(failed.value), failed.value


def test_lesson_09s_claim_that_every_damaged_checkpoint_is_refused_reads_the_printed_lines():
    if not (EXECUTED / "09_sharding.ipynb").exists():
        pytest.skip("lesson 09 has not been executed by tests/test_notebooks.py in this run")
    nb = nbformat.read(EXECUTED / "09_sharding.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.get("id") == "l09-torn")
    shown = next(o for o in cell.outputs if o.get("output_type") == "stream" and "load_into" in o["text"])
    shown["text"] = shown["text"].replace("a missing shard, load_into: RuntimeError", "a missing shard, load_into: accepted")
    with pytest.raises(ClaimFailed, match="load_into refuses all four damaged checkpoints"):
        verify("09_sharding", nb, ROOT / "notebooks")
