"""Data parallel, FSDP2, tensor parallel and tensor + sequence parallel on the same model, side by side: the time of a
training step, the bytes each rank sends in it, and the parameter bytes each rank holds.

The model is the course's RowTransformer (lessons 10 on), the global batch the same for every strategy: DDP and FSDP2
give each rank batch/N samples, tensor parallel gives every rank the whole batch and a share of every layer (lesson
10's plans, imported from the module its notebook writes). Steps are timed with course_lib.time_side_by_side on every
rank: rounds in which each strategy takes its steps in turn, so that a change in the machine's load hits them all; a
round's figure is its slowest rank's. The collectives of one step, and the bytes of the whole tensors they carry, are
counted with lesson 10's CommBytes (PyTorch's CommDebugMode, which sees c10d's collectives as well: DDP's bucket
all-reduces, FSDP's all-gathers and reduce-scatters); "sent" is what a ring sends per rank: 2(N-1)/N of an
all-reduce's tensor, (N-1)/N of an all-gather's or a reduce-scatter's (lesson 10's RING and sent_bytes).

  python benchmarks/parallelisms.py                      # 2 processes, 5 rounds of 10 steps, batch 64
  python benchmarks/parallelisms.py --nproc 4 --out DIR  # any world size that divides the model's 4 heads
  python benchmarks/parallelisms.py --fast               # 3 rounds of 3 steps (the tests)

Writes parallelisms.json into --out (default notebooks/runs/10_tensor_parallel/) and prints a table. On GPUs (one
per process) it uses NCCL, else gloo on the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "notebooks" / "runs" / "10_tensor_parallel"
STRATEGIES = ("DDP", "FSDP2", "TP", "TP + SP")
MODULES = ("runs/10_tensor_parallel/megatron.py", "runs/10_tensor_parallel/plans.py")


def worker(out: str, rounds: int, steps: int, batch: int) -> None:
    """One process of the launch: every strategy built, one step of each counted, then timed side by side."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_lib import RowTransformer, time_side_by_side
    from plans import RING, CommBytes, parallelize, sent_bytes  # lesson 10's module, on sys.path (see main)

    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (n,))
    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(batch, 1, 28, 28, generator=g).to(device), torch.randint(0, 10, (batch,), generator=g).to(device)
    mine = slice(rank * batch // n, (rank + 1) * batch // n)

    def build(kind):
        torch.manual_seed(0)
        model = RowTransformer().to(device)
        data = (images[mine], labels[mine])  # data parallel: this rank's samples
        if kind == "DDP":
            model = DDP(model)
        elif kind == "FSDP2":
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:  # tensor parallel: the whole batch on every rank, a share of every layer
            model, data = parallelize(model, mesh, sequence=kind == "TP + SP"), (images, labels)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            optimizer.zero_grad()
            with loss_parallel():  # logits cut by class under TP + SP; no change for the others
                F.cross_entropy(model(data[0]), data[1]).backward()
            optimizer.step()
        return model, step

    built = {kind: build(kind) for kind in STRATEGIES}
    found = {}
    for kind, (model, step) in built.items():
        step()  # FSDP and DDP set themselves up in their first step
        with CommBytes() as comm:
            step()
        unknown = sorted({op for (_, op, _) in comm.bytes} - set(RING))
        if unknown:
            raise SystemExit(f"{kind}: collectives this benchmark has no ring factor for: {unknown}")
        sent = sum(sent_bytes(op, b, n) for (_, op, _), b in comm.bytes.items())
        whole = sum(comm.bytes.values())
        found[kind] = {"collectives": sum(comm.calls.values()), "whole bytes": whole, "sent bytes": sent,
                       "parameter bytes": sum((p.to_local() if isinstance(p, DTensor) else p).nbytes
                                              for p in model.parameters())}
    timings = time_side_by_side({kind: step for kind, (_, step) in built.items()}, rounds=rounds, calls=steps,
                                warmup=1)
    everyone = [None] * n
    dist.all_gather_object(everyone, {kind: t.seconds for kind, t in timings.items()})
    if rank == 0:
        for kind in STRATEGIES:  # a round lasts as long as its slowest rank
            found[kind]["round ms"] = [1000 * max(r[kind][i] for r in everyone) for i in range(rounds)]
        Path(out).write_text(json.dumps({"nproc": n, "backend": dist.get_backend(), "found": found}))
    dist.destroy_process_group()


def summarize(raw: dict, rounds: int, steps: int, batch: int) -> dict:
    found, ddp = raw["found"], raw["found"]["DDP"]["round ms"]
    rows = {}
    for kind in STRATEGIES:
        ms = found[kind]["round ms"]
        ratios = [a / b for a, b in zip(ms, ddp)]  # round by round: the same load for both
        rows[kind] = {"step_ms": {"median": statistics.median(ms), "min": min(ms), "max": max(ms)},
                      "vs_ddp": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
                      **{k: found[kind][k] for k in ("collectives", "whole bytes", "sent bytes", "parameter bytes")}}
    return {"nproc": raw["nproc"], "backend": raw["backend"], "batch": batch,
            "over": f"{rounds} rounds of {steps} steps each", "strategies": rows}


def run(nproc: int = 2, rounds: int = 5, steps: int = 10, batch: int = 64, out=DEFAULT_OUT) -> dict:
    """Launch the comparison on ``nproc`` processes, write ``parallelisms.json`` into ``out``, return it."""
    from course_lib.scripts import script_source

    if 4 % nproc:
        raise SystemExit(f"--nproc {nproc}: tensor parallel gives each process whole heads of the model's 4; use 1, "
                         "2 or 4")
    from course_lib.devices import machine_load, machine_summary

    busy, load = machine_load()  # other programs' share of the CPUs, just before the launch
    with tempfile.TemporaryDirectory(prefix="parallelisms-") as tmp:
        for module in MODULES:  # lesson 10's modules, as its notebook writes them
            (Path(tmp) / Path(module).name).write_text(script_source(module))
        raw_path = Path(tmp) / "raw.json"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([tmp, str(ROOT)]))
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                               str(nproc), __file__, "--worker", str(raw_path), "--rounds", str(rounds), "--steps",
                               str(steps), "--batch", str(batch)], env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"the launch failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        result = summarize(json.loads(raw_path.read_text()), rounds, steps, batch)
    result["machine"] = {"summary": machine_summary(), "load before": load, "busy": busy}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "parallelisms.json").write_text(json.dumps(result, indent=1))
    return result


def table(result: dict) -> str:
    busy = f" {result['machine']['load before']}" if result["machine"]["busy"] else ""
    lines = [f"RowTransformer, global batch {result['batch']}, {result['nproc']} processes ({result['backend']}), "
             f"{result['over']}; ms per step: median (range of the rounds); {result['machine']['summary']}.{busy}",
             f"{'strategy':<9} {'ms/step':>22} {'vs DDP':>20} {'collectives':>12} {'sent KB/rank':>13} {'params KB/rank':>15}"]
    for kind, r in result["strategies"].items():
        ms, vs = r["step_ms"], r["vs_ddp"]
        lines.append(f"{kind:<9} {ms['median']:>8.1f} ({ms['min']:.1f}-{ms['max']:.1f}) "
                     f"{vs['median']:>8.2f}x ({vs['min']:.2f}-{vs['max']:.2f}) {r['collectives']:>12} "
                     f"{r['sent bytes'] / 1e3:>13.1f} {r['parameter bytes'] / 1e3:>15.1f}")
    return "\n".join(lines)


def main(argv=None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 3 with --fast)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per strategy and round (default 10; 3 with --fast)")
    p.add_argument("--batch", type=int, default=64, help="the global batch (divisible by --nproc)")
    p.add_argument("--fast", action="store_true")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # one process of the launch
    args = p.parse_args(argv)
    rounds, steps = args.rounds or (3 if args.fast else 5), args.steps or (3 if args.fast else 10)
    if args.worker:
        worker(args.worker, rounds, steps, args.batch)
        return None
    result = run(args.nproc, rounds, steps, args.batch, args.out)
    print(table(result))
    print(f"wrote {Path(args.out) / 'parallelisms.json'}")
    return result


if __name__ == "__main__":
    main()
