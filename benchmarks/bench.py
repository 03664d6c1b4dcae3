"""Where does the time of distributed MNIST training go? Six measurements of the lessons' own scripts, in one run.

    python benchmarks/bench.py --fast --out benchmarks/results/<machine>   # from the repository root
    python ../benchmarks/bench.py --fast                                   # from notebooks/ (lesson 07)

Every launch runs a script exactly as a lesson's notebook cell writes it (read with
``course_lib.scripts.script_cells``, written into a temporary folder, started with ``course_lib.torchrun``):
lesson 07's ``runs/07_performance/train.py`` (lesson 02's train.py plus marked regions), lesson 06's
``level_ddp.py``, ``level_accelerate.py`` and ``level_trainer.py``, and lesson 01's ``hello.py``.

1. data pipeline: lesson 07's script on 1 process fed five ways: the seed's torchvision pipeline (per-sample
   ToTensor, num_workers 0 and >0), lesson 02's TensorDataset loader, the whole split on the device, and
   compute only (the epoch's batches sliced ahead: no data work in the loop); samples/s and time per epoch.
2. scaling: 1 and 2 processes (1..N GPUs where present), efficiency T1/(N*TN), and the share of a step in
   the gradient all-reduce (a timing communication hook; and the step without any all-reduce), for MyModel
   and a timm resnet18. On CPUs also one process with one thread per core on the same global batch, side by
   side with the DDP processes: the baseline that using the cores by processes has to beat.
3. abstraction overhead: lesson 06's three levels (raw DDP, Accelerate, the Trainer), ratios to raw DDP.
4. mixed precision: bf16 autocast vs fp32 on this device (lesson 07's --mixed-precision).
5. launch overhead: course_lib.torchrun vs the same torchrun command run from a shell (lesson 01's hello.py), and
   a cell on lesson 01's pool of ranks (course_lib.start_ranks) vs that launch.
6. inside DDP: lesson 08's step-time comparison on a pool of ranks, with the lesson's own modules (no communication,
   naive, flat, bucketed and PyTorch's DDP on its MLP, in rounds), then a bucket-size sweep of its BucketedDDP and
   PyTorch's DDP at 3, 2 and 1 buckets.

The load is checked first (and again at the end) and reported when the machine is busy. Each ratio is
measured side by side in one run: its launches follow each other, ``--repeats`` rounds of them in
alternating order; a figure is the median, with its range (over the rounds, or over the timed chunks of steps
within a launch when there is one round). Timing starts after a few warm-up steps, so process start-up and
imports are not counted. ``--fast`` times a fixed number of steps and extrapolates to an epoch (marked
``"extrapolated": true``); without it MyModel's epochs are timed whole. Writes ``bench.json`` (every figure and
every launch) and ``bench.png`` into ``--out`` (default: notebooks/runs/07_performance/, git-ignored).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = ROOT / "notebooks" / "runs" / "07_performance"
sys.path.insert(0, str(ROOT))  # course_lib from this checkout when run from a shell

import course_lib  # noqa: E402
from course_lib.scripts import LineageError, script_source  # noqa: E402

SECTIONS = ("pipeline", "scaling", "abstraction", "mixed_precision", "launch", "inside_ddp")
MODELS = ("mymodel", "resnet18")  # the scaling and mixed-precision sections measure each

#: The scripts the benchmark launches: the paths their lessons' %%write_script cells give (found in whichever notebook).
SCRIPTS = {
    "train": "runs/07_performance/train.py",
    "level_ddp": "runs/06_trainer/level_ddp.py",
    "level_accelerate": "runs/06_trainer/level_accelerate.py",
    "level_trainer": "runs/06_trainer/level_trainer.py",
    "hello": "runs/01_collectives/hello.py",
    "train_naive": "runs/08_inside_ddp/train_naive.py",
    "train_flat": "runs/08_inside_ddp/train_flat.py",
    "train_bucketed": "runs/08_inside_ddp/train_bucketed.py",
    "checks": "runs/08_inside_ddp/checks.py",
    "timing": "runs/08_inside_ddp/timing.py",
}
#: Lesson 08's modules the inside-DDP section imports on the pool: its wrappers and models, then its timing helpers.
INSIDE_DDP_MODULES = ("runs/08_inside_ddp/checks.py", "runs/08_inside_ddp/timing.py")
#: Bucket caps of the sweep, in MB: lesson 08's 7.5 MB MLP in 3, 2 and 1 buckets.
SWEEP_CAPS = (0.01, 1.0, 25.0)

#: The targets on the 2-process CPU run: (figure, at most, what it compares).
TARGETS = {
    "tensor_pipeline_vs_compute_only": (1.2, "lesson-02 TensorDataset loader epoch / compute-only epoch, 2 processes"),
    "accelerate_vs_ddp": (1.10, "Accelerate epoch / raw DDP epoch (lesson 06's levels), 2 processes"),
    "trainer_vs_ddp": (1.30, "Trainer epoch / raw DDP epoch (lesson 06's levels), 2 processes"),
    "course_lib_launch_vs_shell": (1.1, "course_lib.torchrun wall time / the same command from a shell"),
    "pool_cell_vs_launch": (0.01, "a barrier cell on lesson 01's pool of ranks / the launch of hello.py, round trip"),
    "bucketed_vs_torch_ddp": (1.15, "step of lesson 08's BucketedDDP / step of PyTorch's DDP, same buckets, 2 processes"),
}

PIPELINES = ("seed_workers0", "seed_workers", "tensor_loader", "tensors_on_device", "compute_only")
TRAIN_SAMPLES = 60_000
BUSY_LOAD = 0.5  # a 1-minute load average above this many runnable processes per CPU: the machine is busy


def log(message: str) -> None:
    print(message, flush=True)


def settings(fast: bool, cuda: bool, steps: int | None = None, repeats: int | None = None) -> dict:
    """Steps per launch. Fast: ``warmup`` untimed steps, then ``steps`` timed ones; else whole epochs (MyModel)."""
    return {
        "fast": fast,
        "batch": 256,  # the course's batch per process (docs/conventions.md)
        "rounds": repeats or (1 if fast else 3),
        "mymodel": {"warmup": 5, "steps": (steps or 30) if fast else None, "log_every": 5 if fast else 20},
        # A resnet18 step on one CPU core takes about as long as a whole MyModel epoch: a few steps show the trend.
        "resnet18": {"warmup": 1, "steps": (20 if cuda else 3) if fast else (100 if cuda else 10),
                     "log_every": 5 if cuda else 1, "batch": 128 if cuda else 32, "val_samples": 64},
        # bf16 autocast on a CPU without bf16 units can be many times slower (convolutions' slow path):
        # fixed steps in both modes, and a small resnet18 batch on CPUs.
        "mixed_precision": {"mymodel": {"warmup": 5, "steps": (steps or 30) if fast else 60, "log_every": 5},
                            "resnet18": {"warmup": 1, "steps": (20 if cuda else 2) if fast else (100 if cuda else 5),
                                         "log_every": 5 if cuda else 1, "batch": 128 if cuda else 8,
                                         "val_samples": 64}},
        "launch_pairs": repeats or (2 if fast else 5),
    }


# --- the machine and its load ------------------------------------------------------------------


def machine() -> dict:
    import torch

    gpus = course_lib.gpu_count()
    # The processor's name alone does not tell two generations of a virtual CPU apart; its bf16 instructions do
    # (they decide the mixed-precision section).
    return {"platform": platform.platform(), "processor": course_lib.devices.cpu_name(), "cpu_count": os.cpu_count(),
            "cpu_bf16_instructions": course_lib.devices.cpu_bf16_flags(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(gpus)],
            "python": platform.python_version(), "torch": torch.__version__}


def check_load(when: str, ours_recently: bool = False) -> dict:
    """The load average and the CPU time in use now (by other programs: ours are not running); ``busy`` when
    timings will be disturbed. ``ours_recently``: our own launches just ran, so the load average counts them
    and only the CPU time now says whether others are busy."""
    import psutil

    used = psutil.cpu_percent(interval=2.0)  # every program, over two seconds, while we run nothing
    load = list(os.getloadavg())
    cpus = os.cpu_count() or 1
    busy = used > 100 * BUSY_LOAD or (not ours_recently and load[0] > BUSY_LOAD * cpus)
    state = {"when": when, "load_average": load, "cpu_percent": used, "cpu_count": cpus, "busy": busy}
    verdict = ("BUSY: other programs compete for the CPUs; timings are slower and noisier than on an idle "
               "machine, so compare the ratios of this run, not its absolute times, with other runs") if busy else "idle"
    log(f"load check ({when}): load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {cpus} CPUs, "
        f"{used:.0f}% CPU in use: {verdict}")
    return state


# --- launches of the lessons' scripts ---------------------------------------------------------


def lesson_scripts(folder: Path) -> dict:
    """Write each script the benchmark launches, from its notebook cell, under ``folder``; {name: path}."""
    written = {}
    for name, target in SCRIPTS.items():
        try:
            text = script_source(target)
        except LineageError as err:
            raise SystemExit(f"{err}\nbench.py launches that script: restore its cell or update SCRIPTS in "
                             "benchmarks/bench.py.") from err
        path = folder / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written[name] = path
    return written


def train_args(model: str, data: str, comm: str, cfg: dict, mixed_precision: str = "no",
               num_workers: int = 0) -> list[str]:
    """Lesson 07's flags for one launch, always in this order (equal launches are measured once per round)."""
    knobs = cfg[model]
    args = ["--model", model, "--data", data, "--comm", comm, "--batch-size", knobs.get("batch", cfg["batch"]),
            "--log-every", knobs["log_every"]]
    if num_workers:
        args += ["--num-workers", num_workers]
    if mixed_precision != "no":
        args += ["--mixed-precision", mixed_precision]
    if knobs["steps"]:
        args += ["--max-steps", knobs["warmup"] + knobs["steps"]]
    if knobs.get("val_samples"):
        args += ["--val-samples", knobs["val_samples"]]
    return [str(a) for a in args]


def level_args(cfg: dict) -> list[str]:
    knobs = cfg["mymodel"]
    args = ["--epochs", 1, "--batch-size", cfg["batch"]]
    if knobs["steps"]:
        args += ["--max-steps", knobs["warmup"] + knobs["steps"]]
    return [str(a) for a in args]


def chunk_step_seconds(step_records: list[dict]) -> list[float]:
    """Seconds per step between consecutive step records; the steps up to the first record are the warm-up."""
    return [(b["seconds"] - a["seconds"]) / (b["step"] - a["step"])
            for a, b in zip(step_records, step_records[1:]) if b["step"] > a["step"]]


class Runner:
    """Launches the lessons' scripts and keeps every launch's measurement, per configuration and round."""

    def __init__(self, scripts: dict, folder: Path, runs: dict, rounds: int):
        self.scripts, self.folder, self.runs, self.rounds = scripts, folder, runs, rounds

    @staticmethod
    def key(script: str, nproc: int, args: list[str], env: dict) -> str:
        prefix = "".join(f"{k}={v} " for k, v in sorted(env.items()))
        return f"{prefix}{script} x{nproc} {' '.join(args)}".strip()

    def measure(self, configs: list[tuple[str, int, list[str], dict]]) -> list[str]:
        """Launch each (script, nproc, args, env) once per round, alternating the order; return their keys."""
        keys = [self.key(*config) for config in configs]
        for round_ in range(self.rounds):
            order = list(zip(keys, configs))
            for key, config in (order if round_ % 2 == 0 else order[::-1]):
                rounds = self.runs.setdefault(key, {"script": config[0], "nproc": config[1], "args": config[2],
                                                    "env": config[3], "rounds": []})["rounds"]
                if len(rounds) <= round_:  # measured already in this round by another section
                    rounds.append(self.launch(*config))
        return keys

    def launch(self, script: str, nproc: int, args: list[str], env: dict) -> dict:
        run_dir = self.folder / "launches" / f"{sum(len(r['rounds']) for r in self.runs.values()):03d}"
        # One thread per process at every process count: N processes are N workers of the same size.
        result = course_lib.torchrun(self.scripts[script], nproc=nproc, script_args=args,
                                     env={"OMP_NUM_THREADS": 1, **env}, run_dir=run_dir, quiet=True, timeout=900)
        epoch = result.events("epoch")[-1]
        chunks = chunk_step_seconds(result.events("step"))
        steps, train_seconds = epoch["steps"], epoch["train_seconds"]
        step_s = statistics.median(chunks) if chunks else train_seconds / steps
        return {"step_s": step_s, "chunk_step_s": chunks, "steps": steps, "train_seconds": train_seconds,
                "first_batch_s": epoch.get("first_batch_seconds"), "backend": epoch.get("backend"),
                "world_size": epoch.get("world_size"), "val_acc": epoch.get("val_acc"),
                "val_count": epoch.get("val_count"),
                "allreduce_s_per_step": epoch["allreduce_seconds"] / steps if "allreduce_seconds" in epoch else None,
                "wall_s": result.duration}

    def step_s(self, key: str) -> list[float]:
        return [r["step_s"] for r in self.runs[key]["rounds"][:self.rounds]]

    def value(self, key: str, name: str) -> list:
        return [r[name] for r in self.runs[key]["rounds"][:self.rounds]]


def spread(values: list[float], chunks: list[float] | None = None) -> dict:
    """Median and range of a figure: over the rounds, or over one launch's chunks when there is one round."""
    if len(values) == 1 and chunks and len(chunks) > 1:
        return {"median": values[0], "min": min(chunks), "max": max(chunks), "over": f"{len(chunks)} chunks"}
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "over": f"{len(values)} round{'s' * (len(values) != 1)}"}


def ratio_spread(runner: Runner, top: str, bottom: str) -> dict:
    """step(top) / step(bottom) per round (their launches side by side); median and range.

    With one round, the range comes from the two launches' chunk ranges (slowest over fastest and back).
    """
    ratios = [a / b for a, b in zip(runner.step_s(top), runner.step_s(bottom))]
    chunks_top, chunks_bottom = runner.value(top, "chunk_step_s")[0], runner.value(bottom, "chunk_step_s")[0]
    if len(ratios) == 1 and len(chunks_top) > 1 and len(chunks_bottom) > 1:
        return {"median": ratios[0], "min": min(chunks_top) / max(chunks_bottom),
                "max": max(chunks_top) / min(chunks_bottom), "over": "chunks of 1 round"}
    return spread(ratios)


def share_spread(step_ratio: dict) -> dict:
    """1 - (step without all-reduce / step with it), from that ratio's spread."""
    return {"median": max(0.0, 1 - step_ratio["median"]), "min": max(0.0, 1 - step_ratio["max"]),
            "max": max(0.0, 1 - step_ratio["min"]), "over": step_ratio["over"]}


def steps_per_epoch(nproc: int, batch: int) -> int:
    return math.ceil(math.ceil(TRAIN_SAMPLES / nproc) / batch)


def throughput(runner: Runner, key: str, nproc: int, batch: int, extrapolated: bool) -> dict:
    step_s = runner.step_s(key)
    chunks = runner.value(key, "chunk_step_s")[0]
    median = statistics.median(step_s)
    return {"step_ms": median * 1e3, "step_ms_spread": {k: v * 1e3 if isinstance(v, float) else v
                                                        for k, v in spread(step_s, chunks).items()},
            "samples_per_s": nproc * batch / median, "epoch_s": median * steps_per_epoch(nproc, batch),
            "steps_timed": len(chunks) or runner.value(key, "steps")[0], "extrapolated": extrapolated}


# --- 1. data pipeline --------------------------------------------------------------------------


def pipeline_configs(cfg: dict, workers: int) -> dict:
    def args(data, num_workers=0):
        return ("train", 1, train_args("mymodel", data, "hook", cfg, num_workers=num_workers), {})

    return {"seed_workers0": args("torchvision"), "seed_workers": args("torchvision", workers),
            "tensor_loader": args("tensors"), "tensors_on_device": args("device"), "compute_only": args("ahead")}


def measure_pipeline(runner: Runner, cfg: dict) -> dict:
    """Lesson 07's script on one process, the same training steps fed five ways."""
    workers = min(4, max(1, course_lib.cpu_count()))  # the seed asked for 4
    configs = pipeline_configs(cfg, workers)
    keys = dict(zip(configs, runner.measure(list(configs.values()))))
    device = "cuda" if runner.value(keys["compute_only"], "backend")[0] == "nccl" else "cpu"
    described = {
        "seed_workers0": "torchvision MNIST + ToTensor per sample, num_workers=0 (--data torchvision)",
        "seed_workers": f"torchvision MNIST + ToTensor per sample, num_workers={workers}",
        "tensor_loader": "TensorDataset + DataLoader (lesson 02, --data tensors)",
        "tensors_on_device": f"whole split as tensors on {device}, sliced by the sampler's order (--data device)",
        "compute_only": "the epoch's batches sliced ahead, already in memory: no data work in the loop (--data ahead)",
    }
    variants = {}
    for name, key in keys.items():
        variants[name] = {**throughput(runner, key, 1, cfg["batch"], bool(cfg["mymodel"]["steps"])),
                          "first_batch_s": statistics.median(runner.value(key, "first_batch_s")),
                          "what": described[name], "launch": key}
        variants[name]["epoch_vs_compute_only"] = ratio_spread(runner, key, keys["compute_only"])["median"]
        variants[name]["epoch_vs_compute_only_spread"] = ratio_spread(runner, key, keys["compute_only"])
        row = variants[name]
        log(f"  {name:18s} {row['samples_per_s']:9.0f} samples/s, epoch {row['epoch_s']:6.1f}s"
            f"{' (extrapolated)' if row['extrapolated'] else ''}, {row['epoch_vs_compute_only']:.2f}x compute only")
    return {"device": device, "batch": cfg["batch"], "threads": 1, "num_workers": workers, "variants": variants}


# --- 2. scaling --------------------------------------------------------------------------------


def scaling_nprocs() -> list[int]:
    gpus = course_lib.gpu_count()
    if gpus < 2:
        return [1, 2]  # on CPU processes (see measure_scaling)
    return sorted({n for n in (1, 2, 4, 8) if n <= gpus} | {gpus})


def grad_bytes(model: str) -> int:
    if model == "resnet18":
        import timm

        network = timm.create_model("resnet18", pretrained=False, num_classes=10, in_chans=1)
    else:
        network = course_lib.MyModel()
    return sum(p.numel() * p.element_size() for p in network.parameters() if p.requires_grad)


def scaling_configs(cfg: dict, model: str, nproc: int, hide_gpu: dict) -> tuple:
    return (("train", nproc, train_args(model, "tensors", "hook", cfg), hide_gpu),
            ("train", nproc, train_args(model, "tensors", "none", cfg), hide_gpu))


def threads_config(cfg: dict, model: str, threads: int, hide_gpu: dict) -> tuple:
    """One process using ``threads`` cores for intra-op parallelism, on the global batch of ``threads`` DDP ranks."""
    batch = cfg[model].get("batch", cfg["batch"])
    cfg = {**cfg, model: {**cfg[model], "batch": threads * batch}}
    return ("train", 1, train_args(model, "tensors", "none", cfg), {**hide_gpu, "OMP_NUM_THREADS": str(threads)})


def measure_scaling(runner: Runner, cfg: dict, models=MODELS) -> dict:
    """Lesson 07's script on 1..N processes: throughput, efficiency, all-reduce share (hook and no all-reduce)."""
    # With one GPU, 1 process would use it and 2 would fall back to CPUs: compare like with like on CPUs.
    hide_gpu = {"CUDA_VISIBLE_DEVICES": ""} if course_lib.gpu_count() == 1 else {}
    if hide_gpu:
        cfg = {**cfg, "resnet18": settings(cfg["fast"], cuda=False)["resnet18"]}
    results = {}
    for model in models:
        batch = cfg[model].get("batch", cfg["batch"])
        extrapolated = bool(cfg[model]["steps"])
        per_nproc, keys = {}, {}
        nprocs = scaling_nprocs()
        threads = None  # on CPUs: one process with a thread per core, the baseline DDP has to beat
        for n in nprocs:
            configs = list(scaling_configs(cfg, model, n, hide_gpu))
            if n == max(nprocs) > 1 and (hide_gpu or not course_lib.gpu_count()):
                configs.append(threads_config(cfg, model, n, hide_gpu))
            hooked, none, *baseline = runner.measure(configs)
            if baseline:
                threads = {"threads": n, "key": baseline[0], "ddp_key": hooked}
            keys[n] = hooked
            row = throughput(runner, hooked, n, batch, extrapolated)
            allreduce = [a for a in runner.value(hooked, "allreduce_s_per_step")]
            share_hook = [a / s for a, s in zip(allreduce, runner.step_s(hooked))]
            share_none = [max(0.0, 1 - a / b) for a, b in zip(runner.step_s(none), runner.step_s(hooked))]
            per_nproc[str(n)] = {**row, "allreduce_ms_per_step": statistics.median(allreduce) * 1e3,
                                 "comm_share_hook": statistics.median(share_hook),
                                 "comm_share_no_sync": statistics.median(share_none),
                                 "comm_share_no_sync_spread": share_spread(ratio_spread(runner, none, hooked)),
                                 "backend": runner.value(hooked, "backend")[0], "launch": hooked, "launch_no_sync": none}
            log(f"  {model} x{n}: {row['samples_per_s']:.0f} samples/s, all-reduce share "
                f"{per_nproc[str(n)]['comm_share_hook']:.0%} (hook) / {per_nproc[str(n)]['comm_share_no_sync']:.0%} "
                "(no all-reduce)")
        one, largest = per_nproc[str(min(keys))], per_nproc[str(max(keys))]
        size = grad_bytes(model)
        baseline = None
        if threads:
            n = threads["threads"]
            # The same global batch per step both ways (n x batch in one process, batch on each of n ranks):
            # step time over step time is the speed-up of DDP's processes over one process's threads.
            baseline = {**throughput(runner, threads["key"], 1, n * batch, extrapolated), "threads": n,
                        "global_batch": n * batch, "launch": threads["key"],
                        "ddp_speedup": ratio_spread(runner, threads["key"], threads["ddp_key"])}
            log(f"  {model} 1 process x {n} threads: {baseline['samples_per_s']:.0f} samples/s; {n} DDP processes "
                f"{baseline['ddp_speedup']['median']:.2f}x of it")
        results[model] = {
            "batch_per_rank": batch, "device": "cuda" if one["backend"] == "nccl" else "cpu", "grad_MB": size / 1e6,
            "per_nproc": per_nproc, "threads_baseline": baseline,
            # T1 / (N * TN) with T the time per epoch; the per-rank batch is fixed, so an epoch at N
            # processes has 1/N of the steps: this equals samples/s at N over N times samples/s at 1.
            "efficiency": {n: row["samples_per_s"] / (int(n) * one["samples_per_s"]) for n, row in per_nproc.items()},
            # the same figure as step time at the fewest processes over step time at n: its spread per round
            "efficiency_spread": {n: ratio_spread(runner, keys[min(keys)], keys[int(n)]) for n in per_nproc},
            "comm_share_hook": largest["comm_share_hook"], "comm_share_no_sync": largest["comm_share_no_sync"],
            "allreduce_GB_per_s": (size / (largest["allreduce_ms_per_step"] / 1e3) / 1e9
                                   if largest["allreduce_ms_per_step"] > 0 else None),
        }
    return results


# --- 3. abstraction overhead -------------------------------------------------------------------


def measure_abstraction(runner: Runner, cfg: dict, nproc: int) -> dict:
    """Lesson 06's three levels on ``nproc`` processes, and lesson 07's loader vs compute only beside them."""
    levels = {"ddp": "level_ddp", "accelerate": "level_accelerate", "trainer": "level_trainer"}
    pair = {"tensor_loader": ("train", nproc, train_args("mymodel", "tensors", "hook", cfg), {}),
            "compute_only": ("train", nproc, train_args("mymodel", "ahead", "hook", cfg), {})}
    configs = [(script, nproc, level_args(cfg), {}) for script in levels.values()] + list(pair.values())
    keys = runner.measure(configs)
    level_keys, (loader, ceiling) = dict(zip(levels, keys[:3])), keys[3:]
    extrapolated = bool(cfg["mymodel"]["steps"])
    rows, ratios, ratio_ranges = {}, {}, {}
    for name, key in level_keys.items():
        rows[name] = {**throughput(runner, key, nproc, cfg["batch"], extrapolated),
                      "backend": runner.value(key, "backend")[0], "launch": key}
        ratio_ranges[name] = ratio_spread(runner, key, level_keys["ddp"])
        ratios[name] = ratio_ranges[name]["median"]
        log(f"  {name}: epoch {rows[name]['epoch_s']:.1f}s, {ratios[name]:.2f}x raw DDP "
            f"(range {ratio_ranges[name]['min']:.2f}-{ratio_ranges[name]['max']:.2f})")
    pipeline = ratio_spread(runner, loader, ceiling)
    loader_row = throughput(runner, loader, nproc, cfg["batch"], extrapolated)
    ceiling_row = throughput(runner, ceiling, nproc, cfg["batch"], extrapolated)
    log(f"  lesson 07's loader vs compute only on {nproc} processes: {pipeline['median']:.2f}x")
    return {"nproc": nproc, "levels": rows, "ratio_to_ddp": ratios, "ratio_spread": ratio_ranges,
            "ddp_pipeline": {"tensor_loader_epoch_s": loader_row["epoch_s"], "compute_only_epoch_s": ceiling_row["epoch_s"],
                             "ratio": pipeline["median"], "ratio_spread": pipeline, "launches": [loader, ceiling]}}


# --- 4. mixed precision ------------------------------------------------------------------------


def measure_mixed_precision(runner: Runner, cfg: dict, models=MODELS) -> dict:
    """Lesson 07's compute-only steps (--data ahead) in fp32 and under bf16 autocast, for each model, 1 process."""
    results = {}
    for model in models:
        knobs = {**cfg, **cfg["mixed_precision"]}
        fp32, bf16 = runner.measure([("train", 1, train_args(model, "ahead", "hook", knobs, precision), {})
                                     for precision in ("no", "bf16")])
        row = {"batch": knobs[model].get("batch", cfg["batch"]),
               "fp32": {"step_ms": statistics.median(runner.step_s(fp32)) * 1e3, "launch": fp32},
               "bf16": {"step_ms": statistics.median(runner.step_s(bf16)) * 1e3, "launch": bf16}}
        speedup = ratio_spread(runner, fp32, bf16)
        row.update(bf16_speedup=speedup["median"], bf16_speedup_spread=speedup)
        results[model] = row
        log(f"  {model}: fp32 {row['fp32']['step_ms']:.1f} ms/step, bf16 {row['bf16']['step_ms']:.1f} ms/step")
    device = "cuda" if runner.value(fp32, "backend")[0] == "nccl" else "cpu"
    return {"device": device, "models": results}


# --- 5. launch overhead ------------------------------------------------------------------------


def portable(text: str, folder: Path) -> str:
    """``text`` with this run's temporary folder as ``$BENCH_TMP``, the repository's own paths relative to it, and
    an environment outside it (conda) as ``$PREFIX``: a committed result names no path of the machine it ran on."""
    text = text.replace(str(folder), "$BENCH_TMP").replace(f"{ROOT}{os.sep}", "")
    return text.replace(f"{sys.prefix}{os.sep}", f"$PREFIX{os.sep}")


def measure_launch(scripts: dict, folder: Path, pairs: int, nproc: int = 2) -> dict:
    """Wall time of course_lib.torchrun vs the very command it prints, pasted into a shell; alternating."""
    run_dir = folder / "launch_probe"
    library, shell = [], []
    for i in range(pairs):
        for turn in (("lib", "shell") if i % 2 == 0 else ("shell", "lib")):
            if turn == "lib":
                start = time.perf_counter()
                result = course_lib.torchrun(scripts["hello"], nproc=nproc, run_dir=run_dir,
                                             env={"OMP_NUM_THREADS": 1}, quiet=True)
                library.append(time.perf_counter() - start)
                command = result.command_line  # as printed: `torchrun`, not the venv's full path
                # The same line with the venv's torchrun by its full path (pair 0 starts with course_lib).
                shell_command = ("".join(f"{k}={shlex.quote(str(v))} " for k, v in result.spec.env.items())
                                 + shlex.join(result.command))
            else:
                start = time.perf_counter()
                subprocess.run(shell_command, shell=True, check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                shell.append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(library, shell)]
    ratio = spread(ratios)
    command, shell_command = portable(command, folder), portable(shell_command, folder)
    log(f"  course_lib median {statistics.median(library):.2f}s vs shell {statistics.median(shell):.2f}s "
        f"({pairs} pairs): {ratio['median']:.2f}x (range {ratio['min']:.2f}-{ratio['max']:.2f})")
    return {"nproc": nproc, "repeats": pairs, "course_lib_s": library, "shell_s": shell, "command": command,
            "shell_command": shell_command, "ratio": ratio["median"], "ratio_spread": ratio,
            "pool": measure_pool(nproc, statistics.median(library))}


def measure_pool(nproc: int, launch_s: float, cells: int = 20) -> dict:
    """Lesson 01's pool of ranks: its start, then the round trip of a cell doing hello.py's collective (a barrier)
    on every rank, against the launch of hello.py measured just before."""
    pool = course_lib.start_ranks(nproc, quiet=True)
    try:
        trips = []
        for _ in range(cells):
            start = time.perf_counter()
            pool.run("dist.barrier()")
            trips.append(time.perf_counter() - start)
    finally:
        pool.stop()
    trip = spread([statistics.median(trips)], trips)
    log(f"  pool of {nproc} ranks: started in {pool.start_seconds:.1f}s, a barrier cell {1000 * trip['median']:.1f} ms "
        f"(median of {cells}), {launch_s / trip['median']:.0f}x faster than the launch of hello.py ({launch_s:.2f}s)")
    return {"nproc": nproc, "start_s": pool.start_seconds, "cells": cells, "cell_s": trips,
            "cell_median_s": trip["median"], "cell_spread": trip, "launch_s": launch_s,
            "ratio": trip["median"] / launch_s}


# --- 6. inside DDP -----------------------------------------------------------------------------


def measure_inside_ddp(folder: Path, fast: bool, repeats: int | None = None, nproc: int = 2) -> dict:
    """Lesson 08's versions side by side on a pool of ranks, with the lesson's own modules, then a bucket-size sweep.

    Each round times every version (then every cap) in turn, so a change in the machine's load hits them all; a
    step lasts as long as its slower rank. Figures are medians over all timed steps, with the range of the rounds'
    medians. ``repeats``: the rounds (default 3 fast, 5 otherwise).
    """
    steps, rounds = 10 if fast else 30, repeats or (3 if fast else 5)
    pool = course_lib.start_ranks(nproc, quiet=True)
    try:
        modules = str(folder / "notebooks" / "runs" / "08_inside_ddp")  # where lesson_scripts() wrote them
        pool.run(f"import sys; sys.path.insert(0, {modules!r})")
        pool.run("from checks import BucketedDDP\nfrom timing import VARIANTS, big_mlp, step_seconds")
        pool.push(STEPS=steps, ROUNDS=rounds, CAPS=list(SWEEP_CAPS))
        pool.run("""
bench_versions = {name: [] for name in VARIANTS}  # one list of step times per round
bench_sweep = {impl: {str(cap): [] for cap in CAPS} for impl in ("bucketed", "torch DDP")}
for round_ in range(ROUNDS):
    for name in VARIANTS:
        bench_versions[name].append(step_seconds(name, 1.0, STEPS))
    for cap in CAPS:
        for impl in bench_sweep:
            bench_sweep[impl][str(cap)].append(step_seconds(impl, cap, STEPS))
bench_buckets = [len(BucketedDDP(big_mlp(), bucket_cap_mb=cap).buckets) for cap in CAPS]
bench_order = list(VARIANTS)
""")
        per_rank_versions, per_rank_sweep = pool.pull("bench_versions"), pool.pull("bench_sweep")
        buckets, order, backend = pool.pull("bench_buckets")[0], pool.pull("bench_order")[0], pool.backend
    finally:
        pool.stop()

    def figure(per_rank: list[list[list[float]]]) -> dict:
        """Per rank, per round, step times -> ms per step (slower rank), median over all and range of round medians."""
        by_round = [[1000 * max(t) for t in zip(*(rank[i] for rank in per_rank))] for i in range(rounds)]
        medians = [statistics.median(r) for r in by_round]
        return {"step_ms": statistics.median([t for r in by_round for t in r]),
                "spread": {"median": statistics.median(medians), "min": min(medians), "max": max(medians),
                           "over": f"{rounds} rounds of {steps} steps"}}

    versions = {name: figure([rank[name] for rank in per_rank_versions]) for name in order}
    torch_ms = versions["torch DDP"]["step_ms"]
    for row in versions.values():
        row["vs_torch_ddp"] = row["step_ms"] / torch_ms
    sweep = {impl: {str(cap): {**figure([rank[impl][str(cap)] for rank in per_rank_sweep]), "buckets": n}
                    for cap, n in zip(SWEEP_CAPS, buckets)} for impl in ("bucketed", "torch DDP")}
    for name, row in versions.items():
        log(f"  {name}: {row['step_ms']:.1f} ms/step ({row['vs_torch_ddp']:.2f}x PyTorch's DDP)")
    for cap, n in zip(SWEEP_CAPS, buckets):
        log(f"  bucket_cap_mb {cap}: {n} bucket(s); ours {sweep['bucketed'][str(cap)]['step_ms']:.1f} ms, "
            f"PyTorch's {sweep['torch DDP'][str(cap)]['step_ms']:.1f} ms")
    return {"nproc": nproc, "backend": backend, "steps": steps, "rounds": rounds, "bucket_cap_mb": 1.0,
            "modules": list(INSIDE_DDP_MODULES), "versions": versions, "sweep": sweep,
            "ratio": versions["bucketed"]["vs_torch_ddp"]}


# --- the whole run -----------------------------------------------------------------------------


def target_table(result: dict) -> dict:
    measured = {
        "tensor_pipeline_vs_compute_only": result.get("abstraction", {}).get("ddp_pipeline", {}).get("ratio"),
        "accelerate_vs_ddp": result.get("abstraction", {}).get("ratio_to_ddp", {}).get("accelerate"),
        "trainer_vs_ddp": result.get("abstraction", {}).get("ratio_to_ddp", {}).get("trainer"),
        "course_lib_launch_vs_shell": result.get("launch", {}).get("ratio"),
        "pool_cell_vs_launch": result.get("launch", {}).get("pool", {}).get("ratio"),
        "bucketed_vs_torch_ddp": result.get("inside_ddp", {}).get("ratio"),
    }
    section = {"tensor_pipeline_vs_compute_only": "abstraction", "accelerate_vs_ddp": "abstraction",
               "trainer_vs_ddp": "abstraction", "course_lib_launch_vs_shell": "launch", "pool_cell_vs_launch": "launch",
               "bucketed_vs_torch_ddp": "inside_ddp"}
    adopted = result.get("adopted", {})
    return {name: {"measured": measured[name], "target": target, "what": what,
                   "met": None if measured[name] is None else measured[name] <= target,
                   "source": "reference run" if section[name] in adopted else "this run"}
            for name, (target, what) in TARGETS.items()}


def _result(fast: bool, nproc: int | None, steps: int | None, repeats: int | None, previous: dict | None):
    """``previous`` if it was made with these settings (else an error), or a new, empty result."""
    cuda = course_lib.gpu_count() > 0
    cfg = settings(fast, cuda, steps, repeats)
    nproc = nproc or (course_lib.gpu_count() or 2)
    if previous and (previous["settings"] != cfg or previous["nproc"] != nproc):
        raise ValueError("previous= holds a run with other settings; start a new one (previous=None)")
    result = previous or {"machine": machine(), "settings": cfg, "nproc": nproc, "runs": {}, "load": [],
                          "date": time.strftime("%Y-%m-%d %H:%M %Z"),
                          "note": ("fast: a fixed number of steps per launch, epoch times extrapolated" if fast
                                   else "MyModel: whole epochs timed")}
    return result, cfg, nproc


def adopt(reference: dict, section: str, fast: bool = True, out=None, nproc: int | None = None,
          steps: int | None = None, repeats: int | None = None, plot: bool = True, previous: dict | None = None,
          **_) -> dict:
    """Take ``section`` from an earlier run's result (a ``bench.json``, loaded) instead of measuring it now.

    For a notebook that measures only some sections live: the result records, under ``"adopted"``, each section
    that came from elsewhere with the machine, settings, date and load of the run that measured it. Takes the
    same keyword arguments as ``run`` (so one ``options`` dict serves both) and writes ``bench.json`` the same way.
    """
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r}; choose from {', '.join(SECTIONS)}")
    if section not in reference:
        raise ValueError(f"the reference run has no {section!r} section; measure it live instead")
    result, _, _ = _result(fast, nproc, steps, repeats, previous)
    result[section] = json.loads(json.dumps(reference[section]))  # a copy: the reference stays as it was
    result.setdefault("adopted", {})[section] = {
        "machine": reference["machine"], "settings": reference["settings"], "nproc": reference["nproc"],
        "date": reference.get("measured_at", {}).get(section, reference.get("date", "not recorded")),
        "note": reference["note"],
        "busy": any(state["busy"] for state in reference.get("load", []))}
    result["targets"] = target_table(result)
    _write(result, Path(out or DEFAULT_OUT).resolve(), plot)
    return result


class Session:
    """A notebook's part of the benchmark: each of its ``sections`` measured now when ``live`` names it, else read
    from the reference run (``reference``, a bench.json path), and the machine that measured each one named.

    Lesson 07's two parts use one each: ``result = session.measure("pipeline")``, ``session.where("pipeline")``.
    ``options`` are ``run``'s keyword arguments (fast, out, nproc, repeats)."""

    def __init__(self, sections, live, reference, **options):
        unknown = set(live) - set(sections)
        if unknown:
            raise ValueError(f"LIVE names section(s) {sorted(unknown)} this part does not measure; "
                             f"choose from {tuple(sections)}")
        self.sections, self.live, self.reference_path = tuple(sections), tuple(live), reference
        self.options = {"plot": False, **options}
        self.reference = json.loads(Path(reference).read_text()) if set(sections) - set(live) else None
        self.result, self.started = None, time.monotonic()

    def command(self) -> str:
        """The same run from a shell, from the notebooks/ folder."""
        fast, repeats, out = self.options.get("fast"), self.options.get("repeats"), self.options.get("out")
        words = ["python ../benchmarks/bench.py", "--fast" if fast else "", f"--repeats {repeats}" if repeats else "",
                 f"--sections {','.join(self.sections)}",
                 f"--nproc {self.options['nproc']}" if self.options.get("nproc") else "", f"--out {out}" if out else ""]
        return " ".join(word for word in words if word)

    def elapsed(self) -> float:
        """Seconds since the session started."""
        return time.monotonic() - self.started

    def summary(self) -> str:
        now = ", ".join(s for s in self.sections if s in self.live) or "nothing"
        ref = ", ".join(s for s in self.sections if s not in self.live) or "nothing"
        return f"measured now: {now} | from the reference run: {ref}"

    def measure(self, section, **kwargs) -> dict:
        """Measure ``section`` now if LIVE names it, else take it from the reference run; say which. The result
        so far (every section of this session) comes back."""
        if section in self.live:
            self.result = run(**self.options, **kwargs, sections=[section], previous=self.result)
            print(f"{section}: measured now, on this machine")
        else:
            self.result = adopt(self.reference, section, **self.options, previous=self.result)
            ref = self.result["adopted"][section]
            print(f"{section}: from the reference run {self.reference_path} ({ref['machine']['processor']}, "
                  f"{ref['machine']['cpu_count']} CPUs, GPUs: {', '.join(ref['machine']['gpus']) or 'none'}; "
                  f"{ref['date']}; {ref['note']}{'; the machine was BUSY' if ref['busy'] else ''}). "
                  f"Put {section!r} in LIVE to measure it here.")
        return self.result

    def where(self, section) -> str:
        """The machine that measured ``section``: this one, or the reference run's, named."""
        ref = (self.result or {}).get("adopted", {}).get(section)
        if ref is None:
            return "this machine"
        machine = ref["machine"]
        return f"the reference run's machine ({machine['processor']}, {machine['cpu_count']} CPUs), not this one"


def ratio(spread: dict) -> str:
    """A ratio as its median and range: ``1.23x (1.10-1.31)``."""
    return f"{spread['median']:.2f}x ({spread['min']:.2f}-{spread['max']:.2f})"


def verdict(spread: dict, above: str = "faster", below: str = "slower") -> str:
    """'a tie' when the range crosses 1 or the median is within 5 % of it; else which way the ratio went."""
    if spread["min"] <= 1 <= spread["max"] or abs(spread["median"] - 1) < 0.05:
        return "a tie"
    return above if spread["median"] > 1 else below


def _write(result: dict, out: Path, plot: bool) -> None:
    """``bench.json`` into ``out``, and ``bench.png`` when ``plot`` (a notebook draws its own plots)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    if plot:
        import matplotlib.pyplot as plt

        plt.close(plot_result(result, out / "bench.png"))


def run(fast: bool = True, out=None, nproc: int | None = None, sections=SECTIONS, steps: int | None = None,
        repeats: int | None = None, plot: bool = True, previous: dict | None = None,
        models=MODELS) -> dict:
    """Run the chosen sections and write ``bench.json`` (and ``bench.png``) into ``out``; return the result.

    ``previous``: the result of an earlier call with the same settings (a notebook runs one section per cell);
    its sections and launches are kept, and a launch it already measured is not repeated. ``models``: the
    models of the scaling section (a notebook may run them in two cells).
    """
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown section(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    out = Path(out or DEFAULT_OUT).resolve()
    out.mkdir(parents=True, exist_ok=True)
    course_lib.prepare_mnist(verbose=False)  # once, before any launch (the scripts check it again)
    result, cfg, nproc = _result(fast, nproc, steps, repeats, previous)
    for section in sections:  # measured now, so no longer taken from a reference run
        result.get("adopted", {}).pop(section, None)
        result.setdefault("measured_at", {})[section] = time.strftime("%Y-%m-%d %H:%M %Z")
    result["load"].append(check_load("start", ours_recently=bool(result["load"])))
    result["machine"]["busy"] = any(state["busy"] for state in result["load"])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        folder = Path(tmp)
        scripts = lesson_scripts(folder / "notebooks")
        result["scripts"] = {name: f"%%write_script {target}" for name, target in SCRIPTS.items()}
        runner = Runner(scripts, folder, result["runs"], cfg["rounds"])
        steps_note = (f"{cfg['mymodel']['warmup']} warm-up + {cfg['mymodel']['steps']} timed steps"
                      if cfg["mymodel"]["steps"] else "whole epochs")
        if "pipeline" in sections:
            log(f"[1/6] data pipeline: lesson 07's train.py, 1 process, {steps_note}")
            result["pipeline"] = measure_pipeline(runner, cfg)
        if "scaling" in sections:
            log(f"[2/6] scaling: lesson 07's train.py ({', '.join(models)}) on {', '.join(map(str, scaling_nprocs()))} "
                "processes")
            result["scaling"] = {**result.get("scaling", {}), **measure_scaling(runner, cfg, models)}
        if "abstraction" in sections:
            log(f"[3/6] abstraction levels: lesson 06's level scripts on {nproc} processes")
            result["abstraction"] = measure_abstraction(runner, cfg, nproc)
        if "mixed_precision" in sections:
            log("[4/6] mixed precision: lesson 07's train.py --mixed-precision bf16 vs fp32, 1 process")
            result["mixed_precision"] = measure_mixed_precision(runner, cfg, models)
        if "launch" in sections:
            log("[5/6] launch overhead: lesson 01's hello.py, course_lib.torchrun vs the shell")
            result["launch"] = measure_launch(scripts, folder, cfg["launch_pairs"])
        if "inside_ddp" in sections:
            log("[6/6] inside DDP: lesson 08's versions and a bucket-size sweep, on a pool of 2 ranks")
            result["inside_ddp"] = measure_inside_ddp(folder, fast, repeats)
    result["load"].append(check_load("end", ours_recently=True))
    result["machine"]["busy"] = any(state["busy"] for state in result["load"])
    result["targets"] = target_table(result)
    result["seconds"] = result.get("seconds", 0) + time.perf_counter() - started
    _write(result, out, plot)
    log(f"wrote {out / 'bench.json'}" + (f" and {out / 'bench.png'}" if plot else "")
        + f" in {time.perf_counter() - started:.0f}s")
    return result


# --- what a complete result holds --------------------------------------------------------------


def required_figures(result: dict) -> dict:
    """Every number the benchmark promises, by a dotted name (tests check them all)."""
    figures = {}
    for name in PIPELINES:
        for key in ("samples_per_s", "epoch_s", "epoch_vs_compute_only"):
            figures[f"pipeline.{name}.{key}"] = result["pipeline"]["variants"][name][key]
    for model in result["scaling"]:  # every model measured (MODELS unless --models chose fewer)
        scaling = result["scaling"][model]
        for n, row in scaling["per_nproc"].items():
            figures[f"scaling.{model}.{n}.samples_per_s"] = row["samples_per_s"]
            figures[f"scaling.{model}.{n}.efficiency"] = scaling["efficiency"][n]
        for key in ("comm_share_hook", "comm_share_no_sync", "grad_MB"):
            figures[f"scaling.{model}.{key}"] = scaling[key]
        if scaling.get("threads_baseline"):  # CPUs only: one process on every core, by threads
            figures[f"scaling.{model}.threads_baseline.samples_per_s"] = scaling["threads_baseline"]["samples_per_s"]
            figures[f"scaling.{model}.threads_baseline.ddp_speedup"] = scaling["threads_baseline"]["ddp_speedup"]["median"]
    for level in ("ddp", "accelerate", "trainer"):
        figures[f"abstraction.{level}.epoch_s"] = result["abstraction"]["levels"][level]["epoch_s"]
        figures[f"abstraction.{level}.ratio_to_ddp"] = result["abstraction"]["ratio_to_ddp"][level]
    figures["abstraction.tensor_pipeline_vs_compute_only"] = result["abstraction"]["ddp_pipeline"]["ratio"]
    for model in result["mixed_precision"]["models"]:
        row = result["mixed_precision"]["models"][model]
        figures[f"mixed_precision.{model}.fp32_step_ms"] = row["fp32"]["step_ms"]
        figures[f"mixed_precision.{model}.bf16_step_ms"] = row["bf16"]["step_ms"]
        figures[f"mixed_precision.{model}.bf16_speedup"] = row["bf16_speedup"]
    figures["launch.ratio"] = result["launch"]["ratio"]
    for key in ("start_s", "cell_median_s", "ratio"):
        figures[f"launch.pool.{key}"] = result["launch"]["pool"][key]
    for name, row in result["inside_ddp"]["versions"].items():
        figures[f"inside_ddp.{name}.step_ms"] = row["step_ms"]
        figures[f"inside_ddp.{name}.vs_torch_ddp"] = row["vs_torch_ddp"]
    for impl, caps in result["inside_ddp"]["sweep"].items():
        for cap, row in caps.items():
            figures[f"inside_ddp.sweep.{impl}.{cap}.step_ms"] = row["step_ms"]
    for name in TARGETS:
        figures[f"targets.{name}"] = result["targets"][name]["measured"]
    return figures


# --- plots -------------------------------------------------------------------------------------


def _error(spread_: dict, median: float | None = None) -> list[float]:
    median = spread_["median"] if median is None else median
    return [max(0.0, median - spread_["min"]), max(0.0, spread_["max"] - median)]


def plot_result(result: dict, path=None, targets: bool = True):
    """One figure, a panel per question, ranges as error bars; saved to ``path`` when given. Returns the figure.

    ``targets=False`` leaves out the course's goals (the dashed lines and the targets panel): lesson 07 shows what
    was measured; the goals belong to the benchmark's own report.
    """
    import matplotlib

    if path is not None and "ipykernel" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    (pipe_ax, scale_ax, comm_ax, inside_ax), (level_ax, mp_ax, target_ax, sweep_ax) = axes
    if "pipeline" in result:
        variants = result["pipeline"]["variants"]
        names = list(variants)
        pipe_ax.barh(names, [variants[n]["epoch_vs_compute_only"] for n in names],
                     xerr=list(zip(*[_error(variants[n]["epoch_vs_compute_only_spread"]) for n in names])),
                     color=["tab:red", "tab:orange", "tab:blue", "tab:cyan", "tab:gray"][:len(names)])
        pipe_ax.set_xlabel("epoch time / compute only (one process)")
        pipe_ax.set_title("1. data pipeline, same training step")
        pipe_ax.invert_yaxis()
    if "scaling" in result:
        for model, row in result["scaling"].items():
            ns = [int(n) for n in row["per_nproc"]]
            scale_ax.errorbar(ns, [row["efficiency"][str(n)] * n for n in ns], marker="o", label=model, capsize=3,
                              yerr=list(zip(*[[e * n for e in _error(row["efficiency_spread"][str(n)],
                                                                     row["efficiency"][str(n)])] for n in ns])))
        ns = [int(n) for n in next(iter(result["scaling"].values()))["per_nproc"]]
        scale_ax.plot(ns, ns, "k--", alpha=0.4, label="ideal")
        scale_ax.set_xlabel("processes")
        scale_ax.set_ylabel("speed-up (samples/s vs 1 process)")
        scale_ax.set_title("2. scaling")
        scale_ax.legend()
        models = list(result["scaling"])
        width = 0.35
        xs = range(len(models))
        comm_ax.bar([x - width / 2 for x in xs], [result["scaling"][m]["comm_share_hook"] for m in models], width,
                    label="all-reduce time / step (hook)")
        comm_ax.bar([x + width / 2 for x in xs], [result["scaling"][m]["comm_share_no_sync"] for m in models], width,
                    label="1 - step without all-reduce / step")
        comm_ax.set_xticks(list(xs), [f"{m}\n{result['scaling'][m]['grad_MB']:.1f} MB grads" for m in models])
        comm_ax.set_ylabel("share of a step (largest process count)")
        comm_ax.set_title("2. gradient all-reduce share")
        comm_ax.legend(fontsize=8)
    if "abstraction" in result:
        ratios, ranges = result["abstraction"]["ratio_to_ddp"], result["abstraction"]["ratio_spread"]
        level_ax.bar(list(ratios), list(ratios.values()), color=["tab:gray", "tab:blue", "tab:purple"],
                     yerr=list(zip(*[_error(ranges[n]) for n in ratios])), capsize=4)
        for name, (target, _) in TARGETS.items() if targets else ():
            if name in ("accelerate_vs_ddp", "trainer_vs_ddp"):
                x = 1 if name.startswith("accelerate") else 2
                level_ax.hlines(target, x - 0.4, x + 0.4, colors="k", linestyles="dashed")
        level_ax.set_ylabel("epoch time / raw DDP")
        level_ax.set_title("3. abstraction overhead" + (" (dashed: target)" if targets else ""))
    if "mixed_precision" in result:
        models = result["mixed_precision"]["models"]
        mp_ax.bar(list(models), [row["bf16_speedup"] for row in models.values()], color="tab:green",
                  yerr=list(zip(*[_error(row["bf16_speedup_spread"]) for row in models.values()])), capsize=4)
        mp_ax.axhline(1.0, color="k", alpha=0.4)
        mp_ax.set_ylabel("fp32 step time / bf16 step time")
        mp_ax.set_title(f"4. bf16 autocast on {result['mixed_precision']['device']}")
    if "inside_ddp" in result:
        section = result["inside_ddp"]
        versions = section["versions"]
        names = list(versions)
        inside_ax.barh(names, [versions[n]["step_ms"] for n in names], capsize=3,
                       xerr=list(zip(*[_error(versions[n]["spread"], versions[n]["step_ms"]) for n in names])),
                       color=["tab:gray", "tab:red", "tab:orange", "tab:green", "tab:blue"][:len(names)])
        inside_ax.invert_yaxis()
        inside_ax.set_xlabel(f"ms per step, {section['nproc']} ranks ({section['backend']})")
        inside_ax.set_title("6. lesson 08's versions of DDP")
        caps = list(next(iter(section["sweep"].values())))
        width = 0.38
        for offset, (impl, rows) in zip((-width / 2, width / 2), section["sweep"].items()):
            sweep_ax.bar([x + offset for x in range(len(caps))], [rows[c]["step_ms"] for c in caps], width, capsize=3,
                         yerr=list(zip(*[_error(rows[c]["spread"], rows[c]["step_ms"]) for c in caps])),
                         label="ours (BucketedDDP)" if impl == "bucketed" else "PyTorch's DDP")
        buckets = section["sweep"]["bucketed"]
        sweep_ax.set_xticks(range(len(caps)), [f"{c} MB\n{buckets[c]['buckets']} bucket(s)" for c in caps])
        sweep_ax.set_ylabel("ms per step")
        sweep_ax.set_title("6. bucket_cap_mb")
        sweep_ax.legend(fontsize=8)
    table = result.get("targets", {})
    names = [n for n in table if table[n]["measured"] is not None]
    if targets:
        target_ax.barh(names, [table[n]["measured"] / table[n]["target"] for n in names],
                       color=["tab:green" if table[n]["met"] else "tab:red" for n in names])
        target_ax.axvline(1.0, color="k", linestyle="dashed")
        target_ax.set_xlabel("measured / target (left of the line: met)")
        target_ax.set_title("targets (incl. 5. launch overhead)")
    else:
        target_ax.barh(names, [table[n]["measured"] for n in names], color="tab:blue")
        target_ax.axvline(1.0, color="k", linestyle="dashed")
        target_ax.set_xlabel("ratio (1: a tie)")
        target_ax.set_title("this run's ratios (incl. 5. launch overhead)")
    target_ax.invert_yaxis()
    load = (f"load {result['load'][0]['load_average'][0]:.1f} at start{' (BUSY)' if result['machine']['busy'] else ''}"
            if result["load"] else "nothing measured live")
    adopted = f"; from a reference run: {', '.join(result['adopted'])}" if result.get("adopted") else ""
    fig.suptitle(f"{result['machine']['processor']}, {result['machine']['cpu_count']} CPUs, "
                 f"GPUs: {', '.join(result['machine']['gpus']) or 'none'}; {result['note']}; {load}{adopted}",
                 fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=90)
    return fig


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fast", action="store_true", help="time a fixed number of steps, extrapolate to epochs")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for bench.json and bench.png")
    p.add_argument("--nproc", type=int, default=None, help="processes for the abstraction levels (default: GPUs, else 2)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--steps", type=int, default=None, help="timed MyModel steps per launch in fast mode (default 30)")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated subset of {','.join(MODELS)} for the scaling and mixed-precision sections")
    p.add_argument("--repeats", type=int, default=None,
                   help="rounds of every launch (default: 1 fast, 3 otherwise); also the launch-overhead pairs (default 2 fast, 5) "
                        "and the inside-DDP rounds (default 3 fast, 5)")
    args = p.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    models = tuple(m for m in args.models.split(",") if m)
    if set(models) - set(MODELS) or not models:
        p.error(f"unknown model(s) in {args.models!r}; choose from {', '.join(MODELS)}")
    result = run(fast=args.fast, out=args.out, nproc=args.nproc, sections=sections, steps=args.steps,
                 repeats=args.repeats, models=models)
    for name, row in result["targets"].items():
        if row["measured"] is not None:
            log(f"{name:32s} {row['measured']:.2f} (target <= {row['target']}) {'met' if row['met'] else 'NOT met'}")
    if result["machine"]["busy"]:
        log("The machine was busy during this run (see the load checks above): the figures are slower and noisier "
            "than on an idle machine.")
    return result


if __name__ == "__main__":
    main()
