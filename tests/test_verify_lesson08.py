"""Lesson 08's claims, one module per part (course_lib/teaching/claims/lesson08a.py, 08b, 08c), hold in each part's run
and a false one is found; 08b's traffic counter, which does not depend on the run, is checked here directly."""
import copy
import json
import shutil

import pytest
import torch
import torch.distributed as dist

from course_lib.scripts import script_source
from course_lib.teaching.verify import ROOT, ClaimFailed, verify

from notebook_runner import executed as _executed, table_in as _table

BUILD, OPTIONS, HANGS = "08a_build_ddp", "08b_ddp_options_hooks_compile", "08c_ddp_hangs_and_mnist"


def test_counted_wire_counts_all_reduces_inside_and_gives_the_real_one_back(tmp_path):
    """Section 8's counted_wire() (08b's module wire.py): calls and bytes inside, from zero each time; afterwards,
    even after an error, dist.all_reduce is torch's own again (section 9 trains with hooks inside it)."""
    space = {}
    exec(script_source("runs/08_inside_ddp/wire.py"), space)
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


def test_lesson_08as_claims_hold_in_its_run_and_a_changed_bucket_size_is_found():
    """Every claim of 08a holds; then DDP's rebuilt buckets, as the table shows them, differ from ours by one byte,
    and only that claim fails."""
    nb = _executed(BUILD)
    assert verify(BUILD, nb, ROOT / "notebooks") == 13
    doctored = copy.deepcopy(nb)
    _table(doctored, "l08-buckets-show")["rows"][0]["DDP reported, rebuilt (B)"] = "2,857 | 16,384 | 5,376"
    with pytest.raises(ClaimFailed, match="DDP's rebuilt buckets have our bytes") as failed:
        verify(BUILD, doctored, ROOT / "notebooks")
    assert "1 of" in str(failed.value), failed.value  # only that claim


def test_lesson_08bs_claims_hold_in_its_run_and_a_changed_byte_count_is_found():
    """Every claim of 08b holds; then fp16 compression, as the hooks' table shows it, sends one byte more than half
    of allreduce's, and only that claim fails."""
    nb = _executed(OPTIONS)
    assert verify(OPTIONS, nb, ROOT / "notebooks") == 21
    doctored = copy.deepcopy(nb)
    row = next(r for r in _table(doctored, "l08-hooks-show")["rows"] if r["hook"] == "fp16 compression")
    row["bytes sent per step"] = f"{int(row['bytes sent per step'].replace(',', '')) + 1:,}"
    with pytest.raises(ClaimFailed, match="fp16 compression sends half allreduce's bytes") as failed:
        verify(OPTIONS, doctored, ROOT / "notebooks")
    assert "1 of" in str(failed.value), failed.value


def test_lesson_08cs_claims_hold_in_its_run_and_a_rank_that_was_not_named_is_found():
    """Every claim of 08c holds; then monitored_barrier's printed line names no rank it should, and only that claim
    fails."""
    nb = _executed(HANGS)
    assert verify(HANGS, nb, ROOT / "notebooks") == 13
    doctored = copy.deepcopy(nb)
    cell = next(c for c in doctored.cells if c.get("id") == "l08-diverge-barrier-show")
    stream = next(o for o in cell.outputs if o.get("output_type") == "stream" and "named rank(s)" in o["text"])
    stream["text"] = stream["text"].replace("named rank(s) 1,", "named rank(s) 0,", 1)
    with pytest.raises(ClaimFailed, match="monitored_barrier names every rank that did not call it") as failed:
        verify(HANGS, doctored, ROOT / "notebooks")
    assert "1 of" in str(failed.value), failed.value


def test_lesson_08cs_claim_that_the_training_run_counted_every_image_reads_its_metrics(tmp_path):
    nb = _executed(HANGS)
    (tmp_path / "runs" / "08_inside_ddp" / "bucketed").mkdir(parents=True)
    source = ROOT / "notebooks" / "runs" / "08_inside_ddp" / "bucketed" / "metrics.jsonl"
    (tmp_path / "runs" / "08_inside_ddp" / "bucketed" / "metrics.jsonl").write_text(
        source.read_text().replace('"val_count": 10000', '"val_count": 9999'))
    ranks = "runs/08_inside_ddp/ranks-08c.json"  # what the pool's ranks found, as the run left it
    (tmp_path / ranks).write_text((ROOT / "notebooks" / ranks).read_text())
    with pytest.raises(ClaimFailed, match="each counting the 10,000 validation images"):
        verify(HANGS, nb, tmp_path)


@pytest.mark.parametrize("part, doctor, claim", [
    (BUILD, lambda ranks: ranks["unused_error"].__setitem__(-1, None), "every rank refuses the parameter"),
    (OPTIONS, lambda ranks: ranks["compile_graphs"][-1][0].__setitem__("graphs", 1),
     "every rank's backend received the same graphs"),
    (HANGS, lambda ranks: ranks["barrier_cases"][-1].append(ranks["barrier_cases"][0][0]),
     "only rank 0 called the barriers"),
], ids=["08a", "08b", "08c"])
def test_what_the_notebook_shows_only_of_rank_0_is_checked_on_every_rank(part, doctor, claim, tmp_path):
    """Each part saves every rank's findings (pool.save); one rank's, changed in that file, fails exactly one claim."""
    shutil.copytree(ROOT / "notebooks" / "runs" / "08_inside_ddp", tmp_path / "runs" / "08_inside_ddp",
                    ignore=shutil.ignore_patterns("*.pt", "checkpoints"))
    saved = tmp_path / "runs" / "08_inside_ddp" / f"ranks-{part[:3]}.json"
    ranks = json.loads(saved.read_text())
    doctor(ranks)
    saved.write_text(json.dumps(ranks))
    with pytest.raises(ClaimFailed) as failed:
        verify(part, _executed(part), tmp_path)
    assert str(failed.value).count("\n  - ") == 1 and claim in str(failed.value), str(failed.value)
