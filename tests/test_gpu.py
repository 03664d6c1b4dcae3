"""GPU checks: run only where CUDA GPUs are present (a GPU runner), skipped cleanly elsewhere."""
import pytest

import course_lib
from course_lib import torchrun

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(course_lib.gpu_count() == 0, reason="needs CUDA GPUs"),
]

NCCL_SCRIPT = """
import os, torch, torch.distributed as dist
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
t = torch.ones(1, device="cuda") * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"{dist.get_backend()} {torch.cuda.current_device()} {t.item():g}")
dist.destroy_process_group()
"""


def test_default_is_one_nccl_process_per_gpu():
    assert course_lib.default_nproc() == course_lib.gpu_count()
    assert course_lib.choose_backend() == "nccl"


def test_nccl_all_reduce_on_every_gpu(write):
    n = course_lib.gpu_count()
    result = torchrun(write("nccl.py", NCCL_SCRIPT), nproc=n, backend="nccl", quiet=True)
    expected_sum = n * (n + 1) / 2
    assert sorted(result.outputs) == list(range(n))
    for rank, text in result.outputs.items():
        backend, device, total = text.split()
        assert backend == "nccl" and int(device) == rank and float(total) == expected_sum


def test_setup_lesson_launches_one_rank_per_gpu():
    from notebook_runner import ROOT, execute_notebook

    nb = execute_notebook(ROOT / "notebooks" / "00_setup.ipynb")
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    n = course_lib.gpu_count()
    assert f"{n} ranks, each saw WORLD_SIZE={n}" in text
    assert "backend=nccl device=cuda:" in text
