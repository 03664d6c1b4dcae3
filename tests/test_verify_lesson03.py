"""Lesson 03's claims, one module per part (course_lib/teaching/claims/lesson03a.py and lesson03b.py), hold in its
parts' runs and a false one is named; the facts it shows about libraries, which do not depend on the run, are checked
here directly."""
import pickle
import re
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

from course_lib import MyModel
from course_lib.teaching.verify import ROOT, ClaimFailed, Run, verify

from notebook_runner import executed as _executed



def test_syncbatchnorm_is_refused_for_a_model_on_the_cpu():
    """Part a, section 3's 'Also': SyncBatchNorm works only for modules on GPUs."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="GPU"):
            DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(MyModel()))
    finally:
        dist.destroy_process_group()


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).write_text, (self.marker, "ran\n"))


def test_weights_only_refuses_a_pickled_call_and_weights_only_false_runs_it(tmp_path):
    """Part b, section 8: weights_only=True names the refused global and runs nothing; weights_only=False runs the payload."""
    marker, trapped = tmp_path / "marker.txt", tmp_path / "untrusted.pt"
    torch.save({"model": MyModel().state_dict(), "note": _Payload(marker)}, trapped)
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global"):
        torch.load(trapped, weights_only=True)
    assert not marker.exists()
    torch.load(trapped, weights_only=False)
    assert marker.read_text() == "ran\n"


def test_the_seeds_squeeze_drops_the_batch_dimension_of_one_sample():
    """Part b, section 9: the seed's forward returns (10,) for one image; timm's accuracy and argmax(1) fail on it."""
    from timm.utils import accuracy

    class SeedModel(MyModel):
        def forward(self, x):
            return self.head(self.norm(self.conv(x))).squeeze()

    one, label = torch.randn(1, 1, 28, 28), torch.tensor([3])
    seed, fixed = SeedModel().eval(), MyModel().eval()
    assert seed(one).shape == (10,) and fixed(one).shape == (1, 10) and seed(one.repeat(8, 1, 1, 1)).shape == (8, 10)
    with pytest.raises(IndexError):
        accuracy(seed(one), label, topk=(1, 3))
    with pytest.raises(IndexError):
        seed(one).argmax(1)
    assert len(accuracy(fixed(one), label, topk=(1, 3))) == 2


def test_torchruns_auto_on_a_64_core_machine_without_gpus_is_64_processes():
    """Part b, section 11: torchrun resolves --nproc-per-node auto with determine_local_world_size."""
    from torch.distributed.run import determine_local_world_size

    with mock.patch("torch.accelerator.is_available", return_value=False), \
            mock.patch("torch._utils.cpu_count", return_value=64):
        assert determine_local_world_size("auto") == 64


def test_without_set_epoch_every_epoch_repeats_epoch_0s_order():
    """Part b's 'Also: forgetting set_epoch', as the lesson asks it: rank 0's first indices of 60,000 on 2 ranks."""
    sampler = DistributedSampler(range(60_000), num_replicas=2, rank=0, shuffle=True)
    without = [list(sampler)[:8] for _ in range(2)]
    with_set = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        with_set.append(list(sampler)[:8])
    assert without[0] == without[1] and with_set[0] != with_set[1]


A = "03a_pitfalls_setup_and_evaluation"
B = "03b_pitfalls_checkpoints_and_speed"


def test_part_a_claims_hold_in_its_run_and_a_misprinted_single_process_count_is_found():
    """On the run tests/test_notebooks.py left (it runs first): every claim of 03a holds; then the count of correct
    predictions that section 2 printed for one process is changed, and that claim alone fails."""
    nb = _executed(A)
    expected = 21 + (Run(nb, ROOT).parameters["MAX_STEPS"] is None)  # whole epochs: the 90% claim too
    assert verify(A, nb, ROOT / "notebooks") == expected
    cell = next(c for c in nb.cells if c.get("id") == "6ad4e3e5")
    printed = next(o for o in cell.outputs if "correct in this process" in o.get("text", ""))
    printed["text"] = re.sub(r"\d+(?= / 10000 correct in this process)", "1", printed["text"])
    with pytest.raises(ClaimFailed, match="one process counts as many correct predictions") as failed:
        verify(A, nb, ROOT / "notebooks")
    assert "1 of" in str(failed.value), failed.value  # only that claim


def test_part_b_claims_hold_in_its_run_and_a_slow_tensor_loader_is_found():
    """On the run tests/test_notebooks.py left: every claim of 03b holds; then the printed speeds of section 10 are
    changed so that the tensors in memory read slower than PIL, and that claim alone fails."""
    nb = _executed(B)
    assert verify(B, nb, ROOT / "notebooks") == 10
    cell = next(c for c in nb.cells if c.get("id") == "bc5a72d5")
    speeds = next(o for o in cell.outputs if "samples/s" in o.get("text", ""))
    speeds["text"] = re.sub(r"[\d,]+(?= samples/s  tensors in memory)", "1", speeds["text"])
    with pytest.raises(ClaimFailed, match="tensors in memory read faster than per-sample PIL decoding") as failed:
        verify(B, nb, ROOT / "notebooks")
    assert "1 of" in str(failed.value), failed.value  # only that claim
