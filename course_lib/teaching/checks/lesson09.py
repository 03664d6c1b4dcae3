"""Checks of lesson 09 (sharding): bytes per rank against a measurement, a sharded checkpoint across world sizes.

The bytes are measured in a launch that does not load the learner's file; the checkpoint's ranks get only their
own rows of batches the check draws at random, and their parameters are compared here with one process's.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from .harness import Report, reported, run_harness, secret_generator

STRATEGIES = ("ddp", "zero1", "fsdp")
OPTIMIZERS = ("sgd", "adam")


def check_bytes_per_rank(script, nproc: int = 2) -> None:
    """Task 09.1: ``bytes_per_rank`` gives what DDP, ZeroRedundancyOptimizer and fully_shard really hold per rank."""
    report = Report("09.1", f"bytes_per_rank against tensors measured on each of {nproc} processes")
    found = run_harness("09.1", script, """
    import warnings
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    warnings.filterwarnings("ignore")

    def model():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(240, 240) for _ in range(6)])  # splits evenly over 1, 2 or 3 ranks

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    def nbytes(tensors):
        return sum(local(t).numel() * local(t).element_size() for t in tensors if t is not None)

    def make(kind, params):
        if kind == "sgd":
            return torch.optim.SGD(params, lr=0.01, momentum=0.9)
        return torch.optim.Adam(params, lr=1e-3)

    def measured(strategy, kind, sharded):
        net = model()
        if not sharded:  # a world of one: what every strategy holds on a single process
            optimizer, wrapped = make(kind, net.parameters()), net
        elif strategy == "fsdp":
            mesh = init_device_mesh("cpu", (world_size,))
            for layer in net:
                fully_shard(layer, mesh=mesh)
            wrapped = fully_shard(net, mesh=mesh)
            optimizer = make(kind, wrapped.parameters())
        else:
            wrapped = DDP(net)
            if strategy == "zero1":
                optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=
                                                    torch.optim.SGD if kind == "sgd" else torch.optim.Adam,
                                                    **({"lr": 0.01, "momentum": 0.9} if kind == "sgd" else {"lr": 1e-3}))
            else:
                optimizer = make(kind, wrapped.parameters())
        wrapped(torch.randn(4, 240)).sum().backward()
        optimizer.step()
        state = optimizer.optim.state if strategy == "zero1" and sharded else optimizer.state
        return {"parameters": nbytes(wrapped.parameters()), "gradients": nbytes(p.grad for p in wrapped.parameters()),
                "optimizer": nbytes(t for s in state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)}

    report(num_params=sum(p.numel() for p in model().parameters()),
           measured={f"{strategy}/{kind}/{size}": measured(strategy, kind, sharded)
                     for strategy in ("ddp", "zero1", "fsdp") for kind in ("sgd", "adam")
                     for size, sharded in ((1, False), (world_size, True))})
    """, nproc=nproc, load_learner=False)  # the check's own measurement: your file is not loaded in it
    num_params = found[0]["num_params"]
    answers = run_harness("09.1", script, """
    answers = {}
    for case in inputs["cases"]:
        strategy, kind, size = case.split("/")
        try:
            answer = learner.bytes_per_rank(inputs["num_params"], kind, int(size), strategy)
            answers[case] = {k: float(v) for k, v in answer.items()}
        except NotImplementedError:
            raise
        except Exception as error:
            answers[case] = {"error": f"{type(error).__name__}: {error}"}
    report(answers=answers)
    """, nproc=1, inputs=[{"num_params": num_params, "cases": list(found[0]["measured"])}])[0]["answers"]
    hints = {"parameters": "Parameters are fp32 (4 bytes each); only FSDP shards them.",
             "gradients": "Gradients take as many bytes as the parameters; ZeRO-1 keeps them whole, FSDP shards them.",
             "optimizer": "SGD with momentum keeps one fp32 buffer per parameter, Adam two; ZeRO-1 and FSDP divide "
                          "them by the world size, DDP does not."}
    for rank, r in sorted(found.items()):
        wrong = 0
        for case, measured in r["measured"].items():
            answer = answers.get(case) if isinstance(answers, dict) else None
            if not isinstance(answer, dict) or "error" in answer or set(answer) != set(measured):
                report.fail(f"rank {rank}, {case}: bytes_per_rank returned {answer}",
                            "Return a dict with the keys 'parameters', 'gradients' and 'optimizer' (bytes on one rank).")
                wrong += 1
                continue
            for key in measured:
                if abs(answer[key] - measured[key]) > 0.01 * max(measured[key], 1):
                    strategy, kind, size = case.split("/")
                    report.fail(f"rank {rank}, {strategy} with {kind} at world size {size}: {key} "
                                f"{answer[key]:,.0f} bytes, measured {measured[key]:,} bytes", hints[key])
                    wrong += 1
        if not wrong:
            report.ok(f"rank {rank}: all {len(r['measured'])} cases ({', '.join(STRATEGIES)} x {', '.join(OPTIMIZERS)} "
                      f"at world sizes 1 and {nproc}, {num_params:,} parameters) equal the bytes measured there")
    report.done()


class Net(nn.Module):
    """Task 09.2's model: children with parameters of their own, and one without."""

    def __init__(self):
        super().__init__()
        self.inp, self.act, self.mid, self.out = nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 30), nn.Linear(30, 10)

    def forward(self, x):
        return self.out(self.act(self.mid(self.act(self.inp(x)))))


# What both launches of task 09.2's check share: the model sharded by the learner's shard(), and a step on this
# rank's rows of each batch (the check's inputs).
_SHARDED = """
    import warnings
    from pathlib import Path
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from course_lib.teaching.checks.lesson09 import Net

    warnings.filterwarnings("ignore")

    def train_steps(model, optimizer, batches):
        for x, y in batches:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    def full_parameters(model):
        return {n: p.full_tensor() for n, p in model.named_parameters()}

    torch.manual_seed(0)
    model = Net()
    mesh = init_device_mesh("cpu", (world_size,))
    returned = learner.shard(model, mesh)
    units = sorted(name or "(root)" for name, m in model.named_modules() if isinstance(m, FSDPModule))
    all_dtensors = all(isinstance(p, DTensor) for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    folder = Path(inputs["folder"])
"""


def _rows(batches, nproc):
    """Each rank's contiguous rows of every batch: what rank r trains on."""
    return [[(x[r * len(x) // nproc:(r + 1) * len(x) // nproc], y[r * len(y) // nproc:(r + 1) * len(y) // nproc])
             for x, y in batches] for r in range(nproc)]


def check_sharded_resume(script, nproc: int = 2) -> None:
    """Task 09.2: ``shard`` makes one unit per child with parameters; ``load_checkpoint`` resumes at another size."""
    import tempfile

    import torch.nn.functional as F

    larger = nproc + 1
    report = Report("09.2", f"shard() and load_checkpoint(): saved on {nproc} processes, resumed on {larger}")
    folder = tempfile.mkdtemp(prefix="check-09-2-")
    os.chmod(folder, 0o777)  # the ranks write their shards here, as the user the grader runs submissions as
    g = secret_generator()
    batches = [(torch.randn(12, 20, generator=g), torch.randint(0, 10, (12,), generator=g)) for _ in range(3)]
    torch.manual_seed(0)
    reference = Net()  # one process, the whole batches
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    after = []
    for x, y in batches:
        opt_ref.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        opt_ref.step()
        after.append({n: p.detach().clone() for n, p in reference.named_parameters()})
    saved = run_harness("09.2", script, _SHARDED + """
    train_steps(model, optimizer, inputs["batches"])
    learner.save_checkpoint(folder / "checkpoints" / "checkpoint-1.pt", model, optimizer, 1, rank)
    report(units=units, all_dtensors=all_dtensors, returned_model=returned is model)
    """, nproc=nproc, inputs=[{"folder": folder, "batches": rows[:2]} for rows in _rows(batches, nproc)])
    first = saved[0]
    report.expect(first.get("units") == ["(root)", "inp", "mid", "out"] and first.get("all_dtensors"),
                  "shard(): one FSDP unit for each child with parameters (inp, mid, out) and the root; every "
                  "parameter a DTensor",
                  f"shard(): the FSDP units are {first.get('units')}, every parameter a DTensor: "
                  f"{first.get('all_dtensors')}",
                  "Call fully_shard(child, mesh=mesh) on each child that has parameters (ReLU has none), then "
                  "fully_shard(model, mesh=mesh) on the root.")
    report.expect(first.get("returned_model") is True, "shard() returns the model",
                  "shard() does not return the model it sharded",
                  "fully_shard changes the module in place and returns it: return the root's result.")
    if report.failures:
        report.done()
    resumed = run_harness("09.2", script, _SHARDED + """
    epoch = learner.load_checkpoint(folder / "checkpoints" / "dcp-1", model, optimizer)
    loaded = full_parameters(model)
    train_steps(model, optimizer, inputs["batches"])
    report(epoch=epoch, loaded=loaded, final=full_parameters(model))
    """, nproc=larger, inputs=[{"folder": folder, "batches": rows[2:]} for rows in _rows(batches, larger)])[0]

    def worst(key, want):
        got = reported("09.2", 0, resumed, key)
        if not isinstance(got, dict) or set(got) != set(want):
            report.stop(f"the resumed run reported no parameters named like the model's ({sorted(want)})")
        return max((got[n].float() - want[n]).abs().max().item() for n in want)

    report.expect(resumed.get("epoch") == 1, "load_checkpoint returned the saved epoch (1)",
                  f"load_checkpoint returned {resumed.get('epoch')!r}, the checkpoint holds epoch 1",
                  "Put a placeholder 'epoch' in the state dict you load into and return what DCP filled in.")
    loaded = worst("loaded", after[1])
    report.expect(loaded < 1e-5, f"the parameters loaded on {larger} processes equal those {nproc} processes trained "
                  f"(one process on the whole batches, max difference {loaded:.1e})",
                  f"the parameters loaded on {larger} processes differ from those {nproc} processes trained by up to "
                  f"{loaded:.2e}",
                  "Build the state dict to load into from get_state_dict(model, optimizer) (this rank's shards), "
                  "dcp.load it, then set_state_dict(...) so that the model and the optimizer take it.")
    if loaded < 1e-5:
        final = worst("final", after[2])
        report.expect(final < 1e-5, f"one more step on {larger} processes equals one process's third step "
                      f"(max difference {final:.1e}): the momentum came back too",
                      f"after one more step the parameters differ from one process's by {final:.2e}",
                      "The optimizer's state must be loaded as well: pass the optimizer to get_state_dict and "
                      "set_state_dict and load both parts.")
    report.done()
