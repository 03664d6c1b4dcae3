"""Lesson 09's claims (course_lib/teaching/claims/lesson09a.py, lesson09b.py, lesson09c.py) hold in the runs of its
three parts and a false one is found; the byte counts of 09a's section 1, which do not depend on the run, are checked
here directly."""
import copy

import pytest

from course_lib.scripts import script_source
from course_lib.teaching.verify import ROOT, ClaimFailed, verify

from notebook_runner import executed, table_in

MEMORY, SCRIPT, LIBRARIES = "09a_sharding_memory_zero_fsdp", "09b_sharded_script_and_checkpoints", "09c_sharding_in_the_libraries"


def test_one_step_holds_exactly_the_formulas_bytes_of_state():
    """09a, section 1: parameters, gradients and optimizer state of one step are 4+4+4, 4+4+8 and (bf16 with an fp32
    master copy) 2+2+12 bytes per parameter, to the byte, for both of the lesson's models."""
    space = {}
    exec(script_source("runs/09_sharding/memory.py"), space)  # the module 09a writes and its ranks import
    formula = {"SGD + momentum": (4, 4, 4), "Adam": (4, 4, 8), space["MIXED"]: (2, 2, 12)}
    for model in space["MODELS"]:
        rows = [space["memory_of_one_step"](model, o) for o in space["OPTIMIZERS"]]
        for r in rows + [space["memory_of_a_mixed_precision_step"](model)]:
            psi = r["parameters"]
            measured = (r["parameter bytes"], r["gradient bytes"], r["optimizer bytes"])
            assert measured == tuple(b * psi for b in formula[r["optimizer"]]), r


def test_09as_claims_hold_in_its_run_and_an_uneven_zero_partition_is_found():
    """Every claim of 09a holds; then ZeRO-1's fullest rank shows 1.5x its even share: that claim fails, and only it."""
    nb = executed(MEMORY)
    assert verify(MEMORY, nb, ROOT / "notebooks") == 16
    doctored = copy.deepcopy(nb)
    table = table_in(doctored, "l09-zero-show")
    next(r for r in table["rows"] if r["optimizer"] == "ZeroRedundancyOptimizer")["largest rank / formula"] = "1.500"
    with pytest.raises(ClaimFailed, match="ZeRO-1's fullest rank holds within 10%") as failed:
        verify(MEMORY, doctored, ROOT / "notebooks")
    assert "1 of 16" in str(failed.value), failed.value


def test_09bs_claims_hold_in_its_run_and_a_changed_shard_count_is_found():
    """Every claim of 09b holds; then the checkpoint's file table shows a third shard: the claims of one shard file per
    rank and of a manifest listing every file fail, and only they."""
    nb = executed(SCRIPT)
    assert verify(SCRIPT, nb, ROOT / "notebooks") == 16
    doctored = copy.deepcopy(nb)
    table = table_in(doctored, "l09-dcp-files")
    table["rows"].append({**table["rows"][-1], "file": "__2_0.distcp"})
    with pytest.raises(ClaimFailed, match="one shard file per rank") as failed:
        verify(SCRIPT, doctored, ROOT / "notebooks")
    assert "2 of" in str(failed.value) and "manifest.json lists every file" in str(failed.value), failed.value


def test_09bs_claim_that_every_damaged_checkpoint_is_refused_reads_the_printed_lines():
    nb = executed(SCRIPT)
    cell = next(c for c in nb.cells if c.get("id") == "l09-torn")
    # the printed lines may come in several stream outputs (as the kernel flushed them): doctor the one that holds it
    shown = next(o for o in cell.outputs if o.get("output_type") == "stream"
                 and "a missing shard, load_into: RuntimeError" in o["text"])
    shown["text"] = shown["text"].replace("a missing shard, load_into: RuntimeError", "a missing shard, load_into: accepted")
    with pytest.raises(ClaimFailed, match="load_into refuses all four damaged checkpoints"):
        verify(SCRIPT, nb, ROOT / "notebooks")


def test_09cs_claims_hold_in_its_run_and_a_lost_validation_sample_is_found():
    """Every claim of 09c holds; then the Trainer's row shows 9,999 validation samples: the claim that the Accelerate
    and Trainer runs counted 10,000 fails, and only it."""
    nb = executed(LIBRARIES)
    checked = verify(LIBRARIES, nb, ROOT / "notebooks")
    assert checked == (6 if "gloo" in table_in(nb, "l09-accelerate-launch")["title"] else 3)
    doctored = copy.deepcopy(nb)
    table = table_in(doctored, "l09-accelerate-launch")
    next(r for r in table["rows"] if r["script"].startswith("train_trainer.py"))["of 10,000"] = 9_999
    with pytest.raises(ClaimFailed, match="the Accelerate and Trainer runs counted 10,000") as failed:
        verify(LIBRARIES, doctored, ROOT / "notebooks")
    assert f"1 of {checked}" in str(failed.value), failed.value
