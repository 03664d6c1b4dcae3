"""Checks of lesson 10 (tensor parallel): a row-parallel linear layer, and a plan for a model of the check's own.

Each rank gets inputs only the check knows (``harness.run_harness``): weights, a batch and the gradient flowing back,
drawn when the check runs. The check computes the whole layer (or the whole model) in its own process and compares
every rank's outputs and gradients with its share of them; task 10.2 also counts what the plan sent, with PyTorch's
``CommDebugMode`` in the harness, and looks at which rows and columns each rank holds.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.model import Attention

from .harness import Report, reported, run_harness, secret_generator

IN, OUT, ROWS = 48, 20, 5  # task 10.1's layer and batch: 48 input features divide over 1, 2, 3 or 4 ranks


def check_row_parallel(script, nproc: int = 2) -> None:
    """Task 10.1: ``row_parallel(x_share, weight_share, bias)`` gives the whole layer's output on every rank, and
    each rank's share of the whole layer's gradients."""
    report = Report("10.1", f"row_parallel on {nproc} processes against the whole layer in one process")
    g = secret_generator()
    x, weight, bias = torch.randn(ROWS, IN, generator=g), torch.randn(OUT, IN, generator=g), torch.randn(OUT, generator=g)
    upstream = torch.randn(ROWS, OUT, generator=g)  # the gradient of the loss with respect to the output
    cols = IN // nproc
    shares = [{"x": x[:, r * cols:(r + 1) * cols].clone(), "weight": weight[:, r * cols:(r + 1) * cols].clone(),
               "bias": bias.clone(), "upstream": upstream} for r in range(nproc)]
    found = run_harness("10.1", script, """
        x = inputs["x"].requires_grad_()
        weight, bias = inputs["weight"].requires_grad_(), inputs["bias"].requires_grad_()
        out = learner.row_parallel(x, weight, bias)
        (out * inputs["upstream"]).sum().backward()
        report(out=out.detach(), x_grad=x.grad, weight_grad=weight.grad, bias_grad=bias.grad)
    """, nproc=nproc, inputs=shares)
    x, weight, bias = (t.clone().requires_grad_() for t in (x, weight, bias))
    want = F.linear(x, weight, bias)
    (want * upstream).sum().backward()
    for rank, values in sorted(found.items()):
        mine = slice(rank * cols, (rank + 1) * cols)
        out = reported("10.1", rank, values, "out", like=want).float()
        if not report.expect((out - want).abs().max().item() < 1e-4, f"rank {rank}: the output is the whole layer's",
                             f"rank {rank}: the output differs from the whole layer's by up to "
                             f"{(out - want).abs().max().item():.2e}", _output_hint(out, want, bias, nproc)):
            continue
        for key, whole, what in (("x_grad", x.grad[:, mine], "its share of the input"),
                                 ("weight_grad", weight.grad[:, mine], "its columns of the weight"),
                                 ("bias_grad", bias.grad, "the bias")):
            value = values.get(key)
            if value is None or not torch.is_tensor(value) or value.shape != whole.shape:
                report.fail(f"rank {rank}: no gradient of {what} of the right shape (got {type(value).__name__})",
                            "Keep the computation differentiable: the input, the weight and the bias must all get a "
                            "gradient from backward().")
                continue
            diff = (value.float() - whole).abs().max().item()
            times = (value.float() * whole).sum().item() / max((whole * whole).sum().item(), 1e-12)
            report.expect(diff < 1e-4, f"rank {rank}: the gradient of {what} is the whole layer's",
                          f"rank {rank}: the gradient of {what} differs from the whole layer's by up to {diff:.2e}"
                          + (f" ({times:.0f}x it)" if abs(times - round(times)) < 1e-3 and round(times) > 1 else ""),
                          "The backward of a sum over the ranks is the identity: each rank's partial output gets the "
                          "whole output's gradient as it is, with no collective in the backward.")
    report.done()


def _output_hint(out, want, bias, nproc) -> str:
    if nproc > 1 and (out - (want + (nproc - 1) * bias)).abs().max().item() < 1e-4:
        return "The bias was added on every rank before the sum, so it counts world_size times: add it once, after."
    return ("Each rank's columns give a partial sum of the output; all-reduce (SUM) those partial sums, in the forward "
            "only, then add the bias.")


# --- task 10.2 -----------------------------------------------------------------------------------------------------


class GatedFFN(nn.Module):
    """A gated MLP (as in Llama): down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(dim, hidden), nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GatedBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.norm1, self.mix = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2, self.ffn = nn.LayerNorm(dim), GatedFFN(dim, hidden)

    def forward(self, x):
        x = x + self.mix(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class GatedModel(nn.Module):
    """Task 10.2's model: MNIST's rows as tokens, 3 blocks of attention (``mix``) and a gated MLP (``ffn``)."""

    def __init__(self, dim: int = 48, heads: int = 4, hidden: int = 96, layers: int = 3):
        super().__init__()
        self.embed = nn.Linear(28, dim)
        self.layers = nn.ModuleList(GatedBlock(dim, heads, hidden) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 10)

    def forward(self, x):
        h = self.embed(x.reshape(len(x), 28, 28))
        for block in self.layers:
            h = block(h)
        return self.head(self.norm(h).mean(dim=1))


CUT = {"mix.q": 0, "mix.k": 0, "mix.v": 0, "mix.out": 1, "ffn.gate": 0, "ffn.up": 0, "ffn.down": 1}  # dim cut


def check_tp_plan(script, nproc: int = 2) -> None:
    """Task 10.2: ``tp_plan(model)`` is Megatron's split of GatedModel: every gradient equals one process's, each
    rank holds its share of the seven matrices of every block, and a step sends 2 all-reduces per block and pass."""
    report = Report("10.2", f"tp_plan on GatedModel, {nproc} processes, against one process")
    g = secret_generator()
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))
    batch = {"images": torch.randn(6, 1, 28, 28, generator=g), "labels": torch.randint(0, 10, (6,), generator=g),
             "seed": seed}
    found = run_harness("10.2", script, """
        from collections import Counter

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.debug import CommDebugMode
        from torch.distributed.tensor.parallel import parallelize_module
        import torch.nn.functional as F

        from course_lib.teaching.checks.lesson10 import GatedModel

        torch.manual_seed(inputs["seed"])
        model = GatedModel()
        plan = learner.tp_plan(model)
        try:
            parallelize_module(model, init_device_mesh("cpu", (world_size,)), plan)
            with CommDebugMode() as comm:
                F.cross_entropy(model(inputs["images"]), inputs["labels"]).backward()
        except Exception as error:  # a plan that does not fit the model: said, with the error
            report(error=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
            raise SystemExit(0)
        sent = Counter()
        for module, passes in comm.comm_module_counts.items():
            if module == "Global":
                for which, counts in passes.items():
                    for op, count in counts.items():
                        sent[f"{which} {str(op).split('.')[-1]}"] += count
        local = {name: list((p.to_local() if isinstance(p, DTensor) else p).shape) for name, p in model.named_parameters()}
        grads = {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad)
                 for name, p in model.named_parameters()}
        report(sent=dict(sent), local=local, grads=grads)
    """, nproc=nproc, inputs=[batch] * nproc)
    torch.manual_seed(seed)
    reference = GatedModel()
    F.cross_entropy(reference(batch["images"]), batch["labels"]).backward()
    layers = len(reference.layers)
    want_sent = {"forward all_reduce": 2 * layers, "backward all_reduce": 2 * layers}
    for rank, values in sorted(found.items()):
        if isinstance(values, dict) and "error" in values:
            report.fail(f"rank {rank}: with this plan the model fails: {values['error']}",
                        "A column-wise layer leaves each rank its share of the output features, which only a row-wise "
                        "layer (or work done feature by feature) can take; every one of the seven matrices of a block "
                        "needs a style.")
            continue
        grads, local = reported("10.2", rank, values, "grads"), reported("10.2", rank, values, "local")
        worst = max(((grads[name] - p.grad).abs().max().item() if name in grads and grads[name] is not None
                     and grads[name].shape == p.grad.shape else float("inf"))
                    for name, p in reference.named_parameters())
        report.expect(worst < 1e-5, f"rank {rank}: every gradient equals one process's (within {worst:.1e})",
                      f"rank {rank}: the gradients differ from one process's by up to {worst:.2e}",
                      "Column-wise where a layer's output features can be cut with no message (q, k, v, gate, up), "
                      "row-wise where the partial sums are added (out, down).")
        wrong = [f"{name} holds {local.get(name)}" for name, p in reference.named_parameters()
                 for layer, dim in CUT.items() if name.startswith("layers.") and f".{layer}.weight" in name
                 and local.get(name) != [s // nproc if d == dim else s for d, s in enumerate(p.shape)]]
        report.expect(not wrong, f"rank {rank}: holds 1/{nproc} of the seven matrices of every block, cut the way "
                                 "Megatron cuts them", f"rank {rank}: " + "; ".join(wrong[:3]),
                      "Every one of the seven linear layers of a block needs a style in the plan.")
        sent = reported("10.2", rank, values, "sent")
        report.expect(sent == want_sent, f"rank {rank}: sent 2 all-reduces per block in each pass ({sent})",
                      f"rank {rank}: sent {sent}, Megatron's split sends {want_sent}",
                      "Layers that read the same input (q, k and v; gate and up) must share one input whose gradient "
                      "is summed once: a PrepareModuleInput on the module around them (mix, ffn), with "
                      "use_local_output=False.")
    report.done()
