"""Lesson 05's claims, one module per part (course_lib/teaching/claims/lesson05a.py, 05b, 05c), hold in each part's run
and a false one is named; the facts about Accelerate's prepared loaders that the lesson shows, and that do not depend
on its run, are tested here."""
import json
import shutil

import pytest
import torch
from accelerate.data_loader import prepare_data_loader
from accelerate.state import AcceleratorState
from torch.utils.data import DataLoader, TensorDataset

from course_lib.teaching.verify import ROOT, ClaimFailed, verify

from notebook_runner import executed



@pytest.fixture
def fresh_accelerate():
    """Accelerate keeps one state per process: start and leave this test without one."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _epoch(seedable, epoch=1, skip=0, draws=0):
    """Lesson 05b's epoch_batches: one epoch of a shuffled, prepared loader of the numbers 0-63, seed 0."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, set_seed

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=seedable))
    set_seed(0)
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(64)), batch_size=8, shuffle=True))
    loader.set_epoch(epoch)
    torch.rand(draws)
    if skip:
        loader = accelerator.skip_first_batches(loader, skip)
    return [batch[0].tolist() for batch in loader]


def test_a_seedable_sampler_resumes_mid_epoch_with_the_batches_left(fresh_accelerate):
    """05b, section 7: set_seed + set_epoch fix the order, whatever was drawn since; skip_first_batches skips."""
    whole = _epoch(seedable=True)
    resumed = _epoch(seedable=True, skip=3, draws=1000)
    assert resumed == whole[3:] and len(resumed) == len(whole) - 3
    assert _epoch(seedable=True, epoch=2) != whole  # each epoch its own order


def test_split_batches_and_even_batches_share_ten_numbers_over_three_processes():
    """05c's table: the batch size per process or cut in pieces; even batches repeat, uneven read once."""
    ten = TensorDataset(torch.arange(10))
    shares = {(split, even): [[b[0].tolist() for b in prepare_data_loader(
        DataLoader(ten, batch_size=6 if split else 4), num_processes=3, process_index=rank, split_batches=split,
        even_batches=even)] for rank in range(3)] for split in (False, True) for even in (True, False)}
    assert {split: [len(shares[split, True][r][0]) for r in range(3)] for split in (False, True)} == \
        {False: [4, 4, 4], True: [2, 2, 2]}
    assert all(len(set(map(len, shares[split, True]))) == 1 for split in (False, True))  # the same batch count
    assert sorted(n for batches in shares[False, False] for b in batches for n in b) == list(range(10))


PARTS = {"05a": "05a_accelerate_port", "05b": "05b_accelerate_trap_and_evaluation",
         "05c": "05c_accelerate_precision_accumulation"}


def _executed(part):
    """A part's executed notebook (``part``: "05a", ...), or a skip."""
    return executed(PARTS[part])


def _doctored(tmp_path, run_dir, change):
    """A copy of lesson 05's runs with one run's metrics changed by ``change(record)``; the copy's folder."""
    shutil.copytree(ROOT / "notebooks" / "runs" / "05_accelerate", tmp_path / "runs" / "05_accelerate",
                    ignore=shutil.ignore_patterns("logs", "state", "*.pkl"))
    metrics = tmp_path / "runs" / "05_accelerate" / run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    for record in records:
        change(record)
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def test_lesson_05as_claims_hold_in_its_run_and_a_baseline_that_lost_images_is_found(tmp_path):
    """Every claim of 05a holds; then lesson 02's baseline run says it counted 9,999 images, and that claim alone
    fails."""
    nb = _executed("05a")
    assert verify(PARTS["05a"], nb, ROOT / "notebooks") == 16

    def lose_one(record):
        if record.get("event") == "epoch":
            record["val_count"] = 9_999

    with pytest.raises(ClaimFailed, match="lesson 02's script under torchrun trained") as failed:
        verify(PARTS["05a"], nb, _doctored(tmp_path, "ddp", lose_one))
    assert "1 of" in str(failed.value), failed.value  # only that claim


def test_lesson_05bs_claims_hold_in_its_run_and_an_evaluation_that_counted_repeats_is_found(tmp_path):
    """Every claim of 05b holds; then the evaluation at EVAL_NPROC processes says it kept the repeated samples too,
    and that claim alone fails."""
    nb = _executed("05b")
    assert verify(PARTS["05b"], nb, ROOT / "notebooks") == 12

    def keep_repeats(record):
        if record.get("event") == "eval":
            record["val_count"] = sum(record["val_seen"])

    with pytest.raises(ClaimFailed, match="gather_for_metrics kept exactly 10,000 images") as failed:
        verify(PARTS["05b"], nb, _doctored(tmp_path, "eval", keep_repeats))
    assert "1 of" in str(failed.value), failed.value  # only that claim


def test_lesson_05cs_claims_hold_in_its_run_and_a_wrong_accumulation_is_found(tmp_path):
    """Every claim of 05c holds; then the accumulation run's metrics say the optimizer stepped on every batch, and
    that claim alone fails."""
    nb = _executed("05c")
    assert verify(PARTS["05c"], nb, ROOT / "notebooks") == 11

    def step_every_batch(record):
        if record.get("event") == "epoch":
            record["optimizer_steps"] = record["steps_per_epoch"]

    with pytest.raises(ClaimFailed, match="the optimizer stepped once per") as failed:
        verify(PARTS["05c"], nb, _doctored(tmp_path, "accum", step_every_batch))
    assert "1 of" in str(failed.value), failed.value  # only that claim
