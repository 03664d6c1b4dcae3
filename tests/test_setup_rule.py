"""Every script's setup() picks its backend by the course's one rule, the rule course_lib's choose_backend uses:
NCCL on CUDA only when this build has NCCL and every local rank gets its own GPU, else gloo. Checked on CPU with
the GPU count, NCCL's presence and the launch's local world size faked."""
import ast
import inspect
import os
import types
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from course_lib import devices
from course_lib.scripts import regions, script_cells
from course_lib.scripts import LESSON_GLOB

ROOT = Path(__file__).resolve().parent.parent
SETUPS = []
for folder in ("notebooks", "solutions"):
    for notebook in sorted((ROOT / folder).glob(LESSON_GLOB)):
        for target, _, text in script_cells(notebook):
            tree = ast.parse(text)
            for node in tree.body:
                if not (isinstance(node, ast.FunctionDef) and node.name == "setup"
                        and "init_process_group" in ast.unparse(node)):
                    continue
                # Lesson 03's seed_init.py keeps the seed's setup on purpose, in regions named `seed`.
                seeds = [r for r in regions(text) if r.name == "seed" and node.lineno - 1 <= r.first < node.end_lineno]
                if not seeds:
                    SETUPS.append(pytest.param(ast.unparse(node), id=f"{notebook.stem}:{target}"))

CASES = [  # (GPUs, NCCL in the build, local world size) -> backend
    (0, True, 2, "gloo"), (2, True, 2, "nccl"), (1, True, 2, "gloo"), (2, False, 2, "gloo"), (4, True, 1, "nccl"),
]


def test_the_scripts_have_setups_to_check():
    assert len(SETUPS) >= 15


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}gpus-nccl{c[1]}-local{c[2]}")
@pytest.mark.parametrize("source", SETUPS)
def test_setup_chooses_the_backend_by_the_course_rule(source, case, monkeypatch):
    gpus, nccl, local_world, expected = case
    joined = {}
    fake_cuda = types.SimpleNamespace(is_available=lambda: gpus > 0, device_count=lambda: gpus,
                                      set_device=lambda device: joined.setdefault("set_device", device))
    fake_torch = types.SimpleNamespace(device=torch.device, cuda=fake_cuda, backends=torch.backends)
    fake_dist = types.SimpleNamespace(
        is_nccl_available=lambda: nccl,
        init_process_group=lambda backend, **kw: joined.update(backend=backend, **kw),
        get_rank=lambda: 0, get_world_size=lambda: local_world)
    for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(local_world), LOCAL_WORLD_SIZE=str(local_world),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        monkeypatch.setenv(name, value)
    namespace = {"torch": fake_torch, "dist": fake_dist, "os": os, "timedelta": timedelta}
    exec(source, namespace)
    required = [p for p in inspect.signature(namespace["setup"]).parameters.values() if p.default is p.empty]
    namespace["setup"](*[60] * len(required))  # e.g. lesson 03's setup(timeout): seconds
    assert joined["backend"] == expected
    assert ("set_device" in joined) == (expected == "nccl"), "set_device exactly when each rank has its own GPU"
    monkeypatch.setattr(devices, "gpu_count", lambda: gpus)
    monkeypatch.setattr(devices.dist, "is_nccl_available", lambda: nccl)
    assert devices.choose_backend(local_world) == expected, "course_lib's rule and the scripts' agree"
