"""Data parallel, FSDP2, tensor parallel, tensor + sequence parallel, pipeline parallel and, on 4 processes, FSDP2 x
tensor parallel on a 2 x 2 mesh, on the same model, side by side: the time of a training step, the bytes each rank sends in it, and the parameter bytes each rank holds.

The model is the course's RowTransformer (lessons 10 on), the global batch the same for every strategy: DDP and FSDP2
give each rank batch/N samples, tensor parallel gives every rank the whole batch and a share of every layer (lesson
10's plans, imported from the module its notebook writes), pipeline parallel gives each rank a stage of the model (a
block; the embedding on the first, the norm and head on the last: lesson 11's Stage, from its module) and runs the
whole batch through them in 4 micro-batches with PyTorch's PipelineStage and Schedule1F1B. FSDP2 x TP (lesson 12's
shard_2d, from its module) runs on the mesh init_device_mesh(device, (2, 2), mesh_dim_names=("dp", "tp")): lesson 10's
Megatron plan inside each row of 2 ranks (mesh["tp"]), FSDP2 along each column (mesh["dp"]); each dp row takes its
half of the global batch, the two tp ranks of a row the same half. Steps are timed with
course_lib.time_side_by_side on every rank: rounds in which each strategy takes its steps in turn, so that a change in
the machine's load hits them all; a round's figure is its slowest rank's. The collectives of one step, and the bytes
of the whole tensors they carry, are counted with lesson 10's CommBytes (PyTorch's CommDebugMode, which sees c10d's
collectives as well: DDP's bucket all-reduces, FSDP's all-gathers and reduce-scatters); "sent" is what a ring sends
per rank: 2(N-1)/N of an all-reduce's tensor, (N-1)/N of an all-gather's or a reduce-scatter's (lesson 10's RING and
sent_bytes), N the size of the group the collective runs on, read from its arguments: every process for the 1-D
strategies, 2 for FSDP2 x TP's (TP's all-reduces inside a row, FSDP's all-gathers and reduce-scatters along a column).

CommDebugMode does not see point-to-point sends, so pipeline parallel's bytes are computed, not counted: each
micro-batch's activations (micro-batch x 28 tokens x 64 dims x 4 bytes) cross each of the N-1 boundaries forward and
their gradient backward, 2(N-1) x batch x 28 x 64 x 4 bytes a step; "sent" is that over N (at 2 stages, the first
sends the activations, the last the gradients). Its parameter bytes are rank 0's stage's (the larger; every rank's
are in the json). The model's 2 blocks make at most 2 stages: with --nproc 4 there is no PP row; a 2 x 2 mesh needs
4 processes: at any other count there is no FSDP2 x TP row. The json's "not run" says why for each.

  python benchmarks/parallelisms.py                      # 2 processes, 5 rounds of 10 steps, batch 64
  python benchmarks/parallelisms.py --nproc 4 --out DIR --name parallelisms-4.json   # no PP; FSDP2 x TP
  python benchmarks/parallelisms.py --fast               # 3 rounds of 3 steps (the tests)

Writes parallelisms.json (or --name) into --out (default notebooks/runs/10_tensor_parallel/) and prints a table. On GPUs (one
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
STRATEGIES = ("DDP", "FSDP2", "TP", "TP + SP", "PP", "FSDP2 x TP")
MODULES = ("runs/10_tensor_parallel/megatron.py", "runs/10_tensor_parallel/plans.py",
           "runs/11_pipeline_parallel/pipeline.py", "runs/12_device_meshes/meshes.py")
MESH_2D = (2, 2)  # FSDP2 x TP's mesh, ("dp", "tp"): only on 2 x 2 = 4 processes
LAYERS = 2  # RowTransformer's default: PP runs where they cut into one stage per process
MICRO = 4  # PP's micro-batches per step
PP_BYTES = "computed from the activation shapes, not counted (CommDebugMode does not see send/recv)"


def pp_bytes(nproc: int, batch: int, tokens: int = 28, dim: int = 64, itemsize: int = 4) -> int:
    """The bytes pipeline parallel's stages send each other in a step: every micro-batch's activations forward and
    their gradient backward, across each of the nproc - 1 boundaries."""
    return 2 * (nproc - 1) * MICRO * (batch // MICRO) * tokens * dim * itemsize


def group_size(args, kwargs=None, world: int = 1) -> int:
    """The number of ranks in the group a collective runs on, from its arguments as CommDebugMode sees them: c10d's
    ops take the ProcessGroup, the functional ones (DTensor's) its registered name."""
    import torch
    from torch.distributed import ProcessGroup
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, torch.ScriptObject):  # c10d's ops get the group boxed
            a = ProcessGroup.unbox(a)
        if isinstance(a, ProcessGroup):
            return a.size()
        if isinstance(a, str):
            try:
                return _resolve_process_group(a).size()
            except (KeyError, RuntimeError, ValueError):
                continue
    return world


def not_run(nproc: int) -> dict:
    """The strategies that do not run on ``nproc`` processes, and why."""
    why = {}
    if LAYERS % nproc:
        why["PP"] = f"the model's {LAYERS} blocks do not cut into {nproc} stages"
    if nproc != MESH_2D[0] * MESH_2D[1]:
        why["FSDP2 x TP"] = (f"its {MESH_2D[0]} x {MESH_2D[1]} mesh (dp x tp) needs {MESH_2D[0] * MESH_2D[1]} "
                             f"processes, not {nproc}")
    return why


def worker(out: str, rounds: int, steps: int, batch: int) -> None:
    """One process of the launch: every strategy built, one step of each counted, then timed side by side."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_lib import RowTransformer, time_side_by_side
    from pipeline import Stage  # lesson 11's module, on sys.path (see main)
    from meshes import shard_2d  # lesson 12's
    from plans import RING, CommBytes, parallelize, sent_bytes  # lesson 10's

    class GroupBytes(CommBytes):
        """CommBytes that also counts each collective by the size of its group, and what each rank sends in it."""

        def __enter__(self):
            self.by_group, self.sent = {}, {}  # "op on N": calls, bytes sent per rank
            return super().__enter__()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before, whole = self.get_total_counts(), sum(self.bytes.values())
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if self.get_total_counts() > before:
                op, size = func.__name__.split(".")[0], group_size(args, kwargs, n)
                key = f"{op} on {size}"
                self.by_group[key] = self.by_group.get(key, 0) + 1
                if op in RING:  # the others stop the run below
                    self.sent[key] = self.sent.get(key, 0) + sent_bytes(op, sum(self.bytes.values()) - whole, size)
            return out

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
    skipped = not_run(n)

    def build(kind):
        torch.manual_seed(0)
        model = RowTransformer(layers=LAYERS).to(device)
        if kind == "PP":  # this rank's stage; the first reads the whole batch, the last the labels
            part = Stage(model, rank, n)
            schedule = Schedule1F1B(PipelineStage(part, rank, n, device), n_microbatches=MICRO,
                                    loss_fn=F.cross_entropy)
            optimizer = torch.optim.SGD(part.parameters(), lr=0.01)

            def pipeline_step():
                optimizer.zero_grad()
                if part.first and part.last:  # one process: one stage
                    schedule.step(images, target=labels)
                elif part.first:
                    schedule.step(images)
                else:  # the last of 2 stages (the model's 2 blocks make no more)
                    schedule.step(target=labels)
                optimizer.step()
            return part, pipeline_step
        data = (images[mine], labels[mine])  # data parallel: this rank's samples
        if kind == "FSDP2 x TP":  # lesson 10's plan inside each row (tp), FSDP2 along each column (dp)
            mesh_2d = init_device_mesh(device.type, MESH_2D, mesh_dim_names=("dp", "tp"))
            rows, row = MESH_2D[0], mesh_2d["dp"].get_local_rank()
            half = slice(row * batch // rows, (row + 1) * batch // rows)  # a row's tp ranks: the same half
            model, data = shard_2d(model, mesh_2d), (images[half], labels[half])
        elif kind == "DDP":
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

    built = {kind: build(kind) for kind in STRATEGIES if kind not in skipped}
    found = {}
    for kind, (model, step) in built.items():
        step()  # FSDP and DDP set themselves up in their first step, the pipeline's stages learn their shapes
        with GroupBytes() as comm:
            step()
        unknown = sorted({op for (_, op, _) in comm.bytes} - set(RING))
        if unknown:
            raise SystemExit(f"{kind}: collectives this benchmark has no ring factor for: {unknown}")
        found[kind] = {"collectives": sum(comm.calls.values()), "whole bytes": sum(comm.bytes.values()),
                       "sent bytes": sum(comm.sent.values()), "collectives by group size": comm.by_group,
                       "sent bytes by collective": comm.sent,
                       "bytes": "counted by CommDebugMode",
                       "parameter bytes": sum((p.to_local() if isinstance(p, DTensor) else p).nbytes
                                              for p in model.parameters())}
        if kind == "PP":  # send/recv only, which CommDebugMode does not see: the bytes from the activations' shapes
            if comm.calls:
                raise SystemExit(f"PP: CommDebugMode now sees {dict(comm.calls)}: count its bytes, do not compute them")
            whole = pp_bytes(n, batch, tokens=images.shape[-2], dim=model.width, itemsize=images.element_size())
            found[kind].update({"collectives": f"{2 * (n - 1) * MICRO} send/recv", "whole bytes": whole,
                                "sent bytes": whole / n, "bytes": PP_BYTES})
    mine_params = {kind: found[kind]["parameter bytes"] for kind in found}
    timings = time_side_by_side({kind: step for kind, (_, step) in built.items()}, rounds=rounds, calls=steps,
                                warmup=1)
    everyone = [None] * n
    dist.all_gather_object(everyone, {"seconds": {kind: t.seconds for kind, t in timings.items()},
                                      "parameter bytes": mine_params})
    if rank == 0:
        for kind in found:  # a round lasts as long as its slowest rank
            found[kind]["round ms"] = [1000 * max(r["seconds"][kind][i] for r in everyone) for i in range(rounds)]
        if "PP" in found:  # each stage holds its own parameters
            found["PP"]["parameter bytes by rank"] = [r["parameter bytes"]["PP"] for r in everyone]
        Path(out).write_text(json.dumps({"nproc": n, "backend": dist.get_backend(), "found": found}))
    dist.destroy_process_group()


def summarize(raw: dict, rounds: int, steps: int, batch: int) -> dict:
    found, ddp = raw["found"], raw["found"]["DDP"]["round ms"]
    rows = {}
    for kind in found:
        ms = found[kind]["round ms"]
        ratios = [a / b for a, b in zip(ms, ddp)]  # round by round: the same load for both
        rows[kind] = {"step_ms": {"median": statistics.median(ms), "min": min(ms), "max": max(ms)},
                      "vs_ddp": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
                      **{k: v for k, v in found[kind].items() if k != "round ms"}}
    result = {"nproc": raw["nproc"], "backend": raw["backend"], "batch": batch,
              "over": f"{rounds} rounds of {steps} steps each", "strategies": rows}
    if not_run(raw["nproc"]):
        result["not run"] = not_run(raw["nproc"])
    return result


def run(nproc: int = 2, rounds: int = 5, steps: int = 10, batch: int = 64, out=DEFAULT_OUT,
        name: str = "parallelisms.json") -> dict:
    """Launch the comparison on ``nproc`` processes, write ``name`` into ``out``, return it."""
    from course_lib.scripts import script_source

    if 4 % nproc:
        raise SystemExit(f"--nproc {nproc}: tensor parallel gives each process whole heads of the model's 4; use 1, "
                         "2 or 4")
    if batch % nproc or batch % MICRO:
        raise SystemExit(f"--batch {batch}: data parallel cuts it into {nproc} shares and PP into {MICRO} micro-batches")
    from course_lib.devices import machine_load, machine_summary

    busy, load = machine_load()  # other programs' share of the CPUs, just before the launch
    with tempfile.TemporaryDirectory(prefix="parallelisms-") as tmp:
        for module in MODULES:  # lessons 10's and 11's modules, as their notebooks write them
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
    (out / name).write_text(json.dumps(result, indent=1))
    return result


def table(result: dict) -> str:
    busy = f" {result['machine']['load before']}" if result["machine"]["busy"] else ""
    lines = [f"RowTransformer, global batch {result['batch']}, {result['nproc']} processes ({result['backend']}), "
             f"{result['over']}; ms per step: median (range of the rounds); {result['machine']['summary']}.{busy}",
             f"{'strategy':<10} {'ms/step':>22} {'vs DDP':>20} {'collectives':>12} {'sent KB/rank':>13} {'params KB/rank':>15}"]
    for kind, r in result["strategies"].items():
        ms, vs = r["step_ms"], r["vs_ddp"]
        lines.append(f"{kind:<10} {ms['median']:>8.1f} ({ms['min']:.1f}-{ms['max']:.1f}) "
                     f"{vs['median']:>8.2f}x ({vs['min']:.2f}-{vs['max']:.2f}) {r['collectives']:>12} "
                     f"{r['sent bytes'] / 1e3:>13.1f} {r['parameter bytes'] / 1e3:>15.1f}")
    if "PP" in result["strategies"]:
        pp = result["strategies"]["PP"]
        lines += [f"PP: {MICRO} micro-batches (Schedule1F1B); its bytes are computed from the activation shapes, "
                  "2(N-1) x batch x 28 x 64 x 4,",
                  f"    not counted (CommDebugMode does not see send/recv); parameter KB by rank, each its stage's: "
                  f"{', '.join(f'{b / 1e3:.1f}' for b in pp['parameter bytes by rank'])}."]
    if "FSDP2 x TP" in result["strategies"]:
        lines.append(f"FSDP2 x TP: a 2 x 2 mesh (dp x tp); sent counted in groups of 2: "
                     f"{result['strategies']['FSDP2 x TP']['collectives by group size']}.")
    for kind, why in result.get("not run", {}).items():
        lines.append(f"{kind}: not run: {why}.")
    return "\n".join(lines)


def main(argv=None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 3 with --fast)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per strategy and round (default 10; 3 with --fast)")
    p.add_argument("--batch", type=int, default=64, help="the global batch (divisible by --nproc)")
    p.add_argument("--fast", action="store_true")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--name", default="parallelisms.json", help="the json's file name in --out")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # one process of the launch
    args = p.parse_args(argv)
    rounds, steps = args.rounds or (3 if args.fast else 5), args.steps or (3 if args.fast else 10)
    if args.worker:
        worker(args.worker, rounds, steps, args.batch)
        return None
    result = run(args.nproc, rounds, steps, args.batch, args.out, args.name)
    print(table(result))
    print(f"wrote {Path(args.out) / args.name}")
    return result


if __name__ == "__main__":
    main()
