"""Lesson 10's checks (course_lib/teaching/checks/lesson10.py) judge behaviour on every rank against one process: the
solutions pass (tests/test_nbgrader.py and the grader run them), and the usual mistakes fail with their own hints (a
plan that breaks the model's forward, as a layer left whole does, is reported with the error)."""
import re

import pytest

from course_lib.teaching import checks
from course_lib.teaching.checks.harness import CheckFailed

ROW = """
import torch
import torch.distributed as dist
import torch.nn.functional as F


class SumOverRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        {backward}


def row_parallel(x_share, weight_share, bias):
    {body}
"""
HONEST_BACKWARD, HONEST_BODY = "return grad", "return SumOverRanks.apply(F.linear(x_share, weight_share)) + bias"

PLAN = """
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel


def tp_plan(model):
    plan = {{}}
    for i in range(len(model.layers)):
        block = f"layers.{{i}}."
        plan.update({{block + name: ColwiseParallel() for name in {column}}})
        plan.update({{block + name: RowwiseParallel() for name in {row}}})
        if {entry}:
            plan.update({{block + half: PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Replicate(),
                                                          use_local_output=False) for half in ("mix", "ffn")}})
    return plan
"""
COLUMN, ROWWISE = ("mix.q", "mix.k", "mix.v", "ffn.gate", "ffn.up"), ("mix.out", "ffn.down")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("backward, body, hint", [
    (HONEST_BACKWARD, "return SumOverRanks.apply(F.linear(x_share, weight_share, bias))",
     "The bias was added on every rank before the sum"),
    ("dist.all_reduce(grad)\n        return grad", HONEST_BODY, "The backward of a sum over the ranks is the identity"),
], ids=["bias-on-every-rank", "all-reduce-in-backward"])
def test_a_row_parallel_mistake_fails_with_its_hint(tmp_path, backward, body, hint):
    script = write(tmp_path, "row_parallel.py", ROW.format(backward=backward, body=body))
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        checks.check_row_parallel(script, nproc=2)


@pytest.mark.parametrize("column, row, entry, hint", [
    (COLUMN, ROWWISE, False, "must share one input whose gradient is summed once"),
    (COLUMN[:-1], ROWWISE, True, "every one of the seven matrices of a block needs a style"),
], ids=["no-shared-input", "a-layer-left-whole"])
def test_a_plan_mistake_fails_with_its_hint(tmp_path, column, row, entry, hint):
    script = write(tmp_path, "plan.py", PLAN.format(column=column, row=row, entry=entry))
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        checks.check_tp_plan(script, nproc=2)
