"""Where does the time of distributed MNIST training go? Five measurements, side by side, in one run.

    python benchmarks/bench.py --fast --out benchmarks/results/<machine>   # from the repository root
    python ../benchmarks/bench.py --fast                                   # from notebooks/ (lesson 07)

1. data pipeline: the seed's torchvision MNIST + per-sample ToTensor (num_workers 0 and >0), the
   lesson-02 TensorDataset loader, the whole dataset as tensors on the device, and compute only
   (the same steps on batches sliced ahead, already in memory: the ceiling); samples/s and time per epoch.
2. scaling: samples/s with 1 and 2 processes (1..N GPUs where present), efficiency T1/(N*TN), and
   the share of a step spent in the gradient all-reduce, for MyModel and a timm resnet18.
3. abstraction overhead: raw DDP vs Accelerate vs the Trainer (scripts/level_*.py), ratios to DDP.
4. mixed precision: bf16 autocast vs fp32 on this device.
5. launch overhead: course_lib.torchrun vs the same torchrun command run from a shell.

``--fast`` times a fixed number of steps and extrapolates to an epoch (marked ``"extrapolated": true``);
without it whole epochs are timed. Writes ``bench.json`` (every figure) and ``bench.png`` into
``--out`` (default: notebooks/runs/07_performance/, git-ignored).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
DEFAULT_OUT = HERE.parent / "notebooks" / "runs" / "07_performance"
sys.path.insert(0, str(SCRIPTS))  # the level scripts' shared helpers (common.py)

from common import build_model, time_steps  # noqa: E402

import course_lib  # noqa: E402
from course_lib import devices, launch  # noqa: E402
from course_lib.data import DEFAULT_ROOT  # noqa: E402

SECTIONS = ("pipeline", "scaling", "abstraction", "mixed_precision", "launch")

#: The targets on the 2-process CPU run: (figure, at most, what it compares).
TARGETS = {
    "tensor_pipeline_vs_compute_only": (1.2, "lesson-02 TensorDataset loader epoch / compute-only epoch, 2 processes"),
    "accelerate_vs_ddp": (1.10, "Accelerate epoch / raw DDP epoch, 2 processes"),
    "trainer_vs_ddp": (1.30, "Trainer epoch / raw DDP epoch, 2 processes"),
    "course_lib_launch_vs_shell": (1.1, "course_lib.torchrun wall time / the same command from a shell"),
}

PIPELINES = ("seed_workers0", "seed_workers", "tensor_loader", "tensors_on_device", "compute_only")


def settings(fast: bool, cuda: bool, steps: int | None = None, repeats: int | None = None) -> dict:
    """Steps per measurement. Fast: a fixed number of steps, extrapolated; else whole epochs."""
    small = steps or 30
    return {
        "fast": fast,
        "batch": 128,
        "mymodel": {"steps": small if fast else 0, "warmup": 5},
        # A resnet18 step is ~0.5 s on one CPU core: a few steps show the trend.
        "resnet18": {"steps": (20 if cuda else 2) if fast else (100 if cuda else 10), "warmup": 2 if cuda else 1,
                     "batch": 128 if cuda else 32},
        "pipeline": {"steps": small if fast else 0, "warmup": 3},
        "mixed_precision": {"steps": small if fast else 200, "warmup": 3, "resnet_steps": 2 if fast else 10},
        "launch_repeats": repeats or (2 if fast else 5),
    }


def log(message: str) -> None:
    print(message, flush=True)


# --- 1. data pipeline ------------------------------------------------------------------------


def _sgd_step(model, device):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)).backward()
        optimizer.step()

    return step


def _first_batch_s(batches) -> float:
    start = time.perf_counter()
    next(iter(batches()))
    return time.perf_counter() - start


def measure_pipeline(cfg: dict, device: torch.device, root=DEFAULT_ROOT) -> dict:
    """The same MyModel training step fed five ways, in this process (one CPU thread, like one rank)."""
    from torch.utils.data import DataLoader, TensorDataset

    batch = cfg["batch"]
    args = SimpleNamespace(epochs=1, **cfg["pipeline"])
    seed_train, _ = course_lib.mnist_datasets(root)
    X, y = course_lib.mnist_tensors(train=True, root=root)
    per_epoch = math.ceil(len(X) / batch)
    workers = min(4, max(1, devices.cpu_count()))  # the seed asked for 4
    Xd, yd = X.to(device), y.to(device)

    def on_device():
        order = torch.randperm(len(Xd), device=device)
        for i in range(0, len(Xd), batch):
            index = order[i:i + batch]
            yield Xd[index], yd[index]

    # The ceiling: distinct batches sliced ahead of time, so no data work is left inside the timed loop.
    # (Repeating one batch is no ceiling: the model fits it, its gradients shrink to denormal floats
    # and CPU arithmetic on those is several times slower.)
    order = torch.randperm(len(Xd), generator=torch.Generator().manual_seed(0)).to(device)
    fixed = [(Xd[index], yd[index]) for index in order.split(batch)]
    feeds = {
        "seed_workers0": lambda: DataLoader(seed_train, batch_size=batch, shuffle=True, num_workers=0),
        "seed_workers": lambda: DataLoader(seed_train, batch_size=batch, shuffle=True, num_workers=workers,
                                           pin_memory=device.type == "cuda"),
        "tensor_loader": lambda: DataLoader(TensorDataset(X, y), batch_size=batch, shuffle=True),
        "tensors_on_device": on_device,
        "compute_only": lambda: fixed,
    }
    described = {
        "seed_workers0": "torchvision MNIST + ToTensor per sample, num_workers=0",
        "seed_workers": f"torchvision MNIST + ToTensor per sample, num_workers={workers}",
        "tensor_loader": "TensorDataset + DataLoader (lesson 02)",
        "tensors_on_device": f"whole dataset as tensors on {device.type}, sliced by a random permutation",
        "compute_only": "the epoch's batches sliced ahead, already in memory (the ceiling)",
    }
    results = {}
    for name, feed in feeds.items():
        torch.manual_seed(0)
        model = course_lib.MyModel().to(device)
        if name.startswith("seed_workers") and name != "seed_workers0":
            loader = feed()  # one loader: its workers start once, as within one epoch
            batches = lambda loader=loader: loader  # noqa: E731
        else:
            batches = feed
        first = _first_batch_s(batches)
        figures = time_steps(batches, _sgd_step(model, device), args, per_epoch, batch, device)
        results[name] = {**figures, "first_batch_s": first, "what": described[name]}
        log(f"  {name:18s} {figures['samples_per_s']:9.0f} samples/s, epoch {figures['epoch_s']:6.1f}s"
            f"{' (extrapolated)' if figures['extrapolated'] else ''}")
    ceiling = results["compute_only"]["epoch_s"]
    for name in results:
        results[name]["epoch_vs_compute_only"] = results[name]["epoch_s"] / ceiling
    return {"device": str(device), "batch": batch, "threads": torch.get_num_threads(), "num_workers": workers,
            "variants": results}


# --- 2. and 3. launches ----------------------------------------------------------------------


def _launch_level(level: str, nproc: int, out: Path, model: str, batch, steps, warmup, env=None) -> dict:
    """Run benchmarks/scripts/level_<level>.py under course_lib.torchrun and read rank 0's JSON."""
    name = f"{level}_{model.replace(',', '+')}_x{nproc}"
    json_path = out / "levels" / f"{name}.json"
    json_path.unlink(missing_ok=True)
    args = ["--model", model, "--batch", batch, "--steps", steps, "--warmup", warmup, "--out", json_path]
    # One thread per process at every process count: N processes are N workers of the same size
    # (by default one process would get every core, and its threads fight any other load for them).
    course_lib.torchrun(SCRIPTS / f"level_{level}.py", nproc=nproc, script_args=args,
                        env={"OMP_NUM_THREADS": 1, **(env or {})},
                        run_dir=out / "levels" / name, quiet=True, timeout=900)
    return json.loads(json_path.read_text())


def scaling_nprocs() -> list[int]:
    gpus = devices.gpu_count()
    if gpus < 2:
        return [1, 2]  # on CPU processes (see measure_scaling)
    counts = sorted({n for n in (1, 2, 4, 8) if n <= gpus} | {gpus})
    return counts


def measure_scaling(cfg: dict, out: Path) -> dict:
    """level_ddp.py on 1..N processes (both models in one launch): throughput, efficiency, all-reduce share."""
    models = ("mymodel", "resnet18")
    # With one GPU, 1 process would use it and 2 would fall back to CPUs: compare like with like on CPUs.
    hide_gpu = {"CUDA_VISIBLE_DEVICES": ""} if devices.gpu_count() == 1 else {}
    if hide_gpu:
        cfg = {**cfg, "resnet18": settings(cfg["fast"], cuda=False)["resnet18"]}
    knobs = {m: {"batch": cfg[m].get("batch", cfg["batch"]), **cfg[m]} for m in models}
    runs = {}
    for n in scaling_nprocs():
        joined = {key: ",".join(str(knobs[m][key]) for m in models) for key in ("batch", "steps", "warmup")}
        launched = _launch_level("ddp", n, out, ",".join(models), env=hide_gpu, **joined)["models"]
        for m in models:
            runs.setdefault(m, {})[n] = launched[m]
            log(f"  {m} x{n}: {launched[m]['loader']['samples_per_s']:.0f} samples/s")
    results = {}
    for model in models:
        one, largest = runs[model][min(runs[model])], runs[model][max(runs[model])]
        results[model] = {
            "batch_per_rank": knobs[model]["batch"],
            "device": one["device"].split(":")[0],
            "grad_MB": one["grad_bytes"] / 1e6,
            "per_nproc": {str(n): {"samples_per_s": r["loader"]["samples_per_s"],
                                   "epoch_s": r["loader"]["epoch_s"],
                                   "compute_only_samples_per_s": r["compute_only"]["samples_per_s"],
                                   "step_ms": r["loader"]["step_s"] * 1e3,
                                   "extrapolated": r["loader"]["extrapolated"],
                                   "comm_share_hook": r["comm"]["share_hook"],
                                   "comm_share_no_sync": r["comm"]["share_no_sync"],
                                   "allreduce_ms_per_step": r["comm"]["allreduce_s_per_step"] * 1e3,
                                   "backend": r["backend"]} for n, r in runs[model].items()},
            # T1 / (N * TN) with T the time per epoch; the per-rank batch is fixed, so an epoch at N
            # processes has 1/N of the steps: this equals samples/s at N over N times samples/s at 1.
            "efficiency": {str(n): r["loader"]["samples_per_s"] / (n * one["loader"]["samples_per_s"])
                           for n, r in runs[model].items()},
            "comm_share_hook": largest["comm"]["share_hook"],
            "comm_share_no_sync": largest["comm"]["share_no_sync"],
            "allreduce_GB_per_s": largest["comm"]["allreduce_GB_per_s"],
            "_ddp_runs": runs[model],
        }
    return results


def measure_abstraction(cfg: dict, out: Path, ddp: dict, nproc: int) -> dict:
    """Accelerate and the Trainer against the raw DDP run of the same settings (MyModel, nproc processes)."""
    knobs = cfg["mymodel"]
    levels = {"ddp": ddp}
    for level in ("accelerate", "trainer"):
        levels[level] = _launch_level(level, nproc, out, "mymodel", cfg["batch"], knobs["steps"], knobs["warmup"])
        log(f"  {level}: epoch {levels[level]['loader']['epoch_s']:.1f}s")
    base = ddp["loader"]["epoch_s"]
    return {
        "nproc": nproc,
        "levels": {name: {"epoch_s": r["loader"]["epoch_s"], "samples_per_s": r["loader"]["samples_per_s"],
                          "extrapolated": r["loader"]["extrapolated"], "steps_timed": r["loader"]["steps_timed"]}
                   for name, r in levels.items()},
        "ratio_to_ddp": {name: r["loader"]["epoch_s"] / base for name, r in levels.items()},
        "ddp_pipeline": {"tensor_loader_epoch_s": ddp["loader"]["epoch_s"],
                         "compute_only_epoch_s": ddp["compute_only"]["epoch_s"],
                         "ratio": ddp["loader"]["epoch_s"] / ddp["compute_only"]["epoch_s"]},
    }


# --- 4. mixed precision ----------------------------------------------------------------------


def measure_mixed_precision(cfg: dict, device: torch.device) -> dict:
    """Compute-only steps in fp32 and under bf16 autocast, for MyModel and resnet18, on ``device``."""
    knobs = cfg["mixed_precision"]
    results = {}
    for model_name, steps, batch in (("mymodel", knobs["steps"], cfg["batch"]),
                                     ("resnet18", knobs["resnet_steps"], cfg["resnet18"]["batch"])):
        args = SimpleNamespace(steps=steps, warmup=min(knobs["warmup"], steps, 1 if model_name == "resnet18" else 99),
                               epochs=1)
        x, y = torch.randn(batch, 1, 28, 28, device=device), torch.randint(0, 10, (batch,), device=device)
        row = {}
        for precision in ("fp32", "bf16"):
            torch.manual_seed(0)
            model = build_model(model_name).to(device)
            step = _sgd_step(model, device)
            if precision == "bf16":
                plain = step

                def step(x, y, plain=plain):
                    with torch.autocast(device.type, dtype=torch.bfloat16):
                        plain(x, y)

            figures = time_steps(lambda: [(x, y)] * (steps + args.warmup), step, args, 1, batch, device)
            row[precision] = {"step_ms": figures["step_s"] * 1e3, "samples_per_s": figures["samples_per_s"]}
        row["bf16_speedup"] = row["fp32"]["step_ms"] / row["bf16"]["step_ms"]
        results[model_name] = row
        log(f"  {model_name}: fp32 {row['fp32']['step_ms']:.1f} ms/step, bf16 {row['bf16']['step_ms']:.1f} ms/step")
    return {"device": str(device), "models": results}


# --- 5. launch overhead ----------------------------------------------------------------------

PROBE = '''"""The smallest distributed job: join a gloo group, meet at a barrier, leave.

    torchrun --standalone --nproc-per-node 2 probe.py
"""
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
'''


def measure_launch(cfg: dict, out: Path, nproc: int = 2) -> dict:
    """Wall time of course_lib.torchrun vs the very command it runs, started from a shell; alternating."""
    probe_dir = out / "launch_probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    probe = probe_dir / "probe.py"
    probe.write_text(PROBE)
    library, shell = [], []
    for i in range(cfg["launch_repeats"]):
        for turn in (("lib", "shell") if i % 2 == 0 else ("shell", "lib")):
            if turn == "lib":
                start = time.perf_counter()
                result = course_lib.torchrun(probe, nproc=nproc, quiet=True)
                library.append(time.perf_counter() - start)
                command = launch._display(result.command)
            else:
                # The very command course_lib runs (venv's torchrun by its full path, same flags).
                shell_command = shlex.join(launch.torchrun_command(probe, nproc, log_dir=probe_dir / "logs"))
                start = time.perf_counter()
                subprocess.run(shell_command, shell=True, check=True, env=launch.launch_env(nproc),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                shell.append(time.perf_counter() - start)
    # The fastest of each: the launch least disturbed by other programs on the machine.
    ratio = min(library) / min(shell)
    log(f"  course_lib {min(library):.2f}s vs shell {min(shell):.2f}s (fastest of {len(shell)}): x{ratio:.2f}")
    return {"nproc": nproc, "repeats": cfg["launch_repeats"], "course_lib_s": library, "shell_s": shell,
            "command": command, "shell_command": shell_command, "ratio": ratio}


# --- the whole run ----------------------------------------------------------------------------


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    gpus = devices.gpu_count()
    return {
        "platform": platform.platform(), "processor": _cpu_name(),
        "cpu_count": os.cpu_count(), "load_average_at_start": list(os.getloadavg()),
        "gpus": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "python": platform.python_version(), "torch": torch.__version__,
    }


def target_table(result: dict) -> dict:
    measured = {
        "tensor_pipeline_vs_compute_only": result.get("abstraction", {}).get("ddp_pipeline", {}).get("ratio"),
        "accelerate_vs_ddp": result.get("abstraction", {}).get("ratio_to_ddp", {}).get("accelerate"),
        "trainer_vs_ddp": result.get("abstraction", {}).get("ratio_to_ddp", {}).get("trainer"),
        "course_lib_launch_vs_shell": result.get("launch", {}).get("ratio"),
    }
    return {name: {"measured": measured[name], "target": target, "what": what,
                   "met": None if measured[name] is None else measured[name] <= target}
            for name, (target, what) in TARGETS.items()}


def run(fast: bool = True, out=None, nproc: int | None = None, sections=SECTIONS, steps: int | None = None,
        repeats: int | None = None, plot: bool = True) -> dict:
    """Run the chosen sections and write ``bench.json`` (and ``bench.png``) into ``out``; return the result."""
    out = Path(out or DEFAULT_OUT).resolve()
    out.mkdir(parents=True, exist_ok=True)
    course_lib.prepare_mnist(DEFAULT_ROOT, verbose=False)
    device = torch.device("cuda:0" if devices.gpu_count() else "cpu")
    cfg = settings(fast, device.type == "cuda", steps, repeats)
    nproc = nproc or (devices.gpu_count() or 2)
    result = {"machine": machine(), "settings": cfg, "nproc": nproc,
              "note": "fast: a fixed number of steps per measurement, epoch times extrapolated" if fast
              else "whole epochs timed"}
    started = time.perf_counter()
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)  # in-process measurements behave like one rank (OMP_NUM_THREADS=1)
    try:
        if "pipeline" in sections:
            log("[1/5] data pipeline (in this process)")
            result["pipeline"] = measure_pipeline(cfg, device)
        if "mixed_precision" in sections:
            log("[4/5] mixed precision (in this process)")
            result["mixed_precision"] = measure_mixed_precision(cfg, device)
    finally:
        torch.set_num_threads(threads)
    ddp_runs = None
    if "scaling" in sections:
        log("[2/5] scaling (level_ddp.py on 1..N processes)")
        result["scaling"] = measure_scaling(cfg, out)
        ddp_runs = result["scaling"]["mymodel"].pop("_ddp_runs")
        result["scaling"]["resnet18"].pop("_ddp_runs")
    if "abstraction" in sections:
        log(f"[3/5] abstraction levels on {nproc} processes")
        if ddp_runs is None or nproc not in ddp_runs or result["scaling"]["mymodel"]["device"] != device.type:
            knobs = cfg["mymodel"]
            ddp = _launch_level("ddp", nproc, out, "mymodel", cfg["batch"], knobs["steps"], knobs["warmup"])
            ddp = ddp["models"]["mymodel"]
        else:
            ddp = ddp_runs[nproc]
        result["abstraction"] = measure_abstraction(cfg, out, ddp, nproc)
    if "launch" in sections:
        log("[5/5] launch overhead")
        result["launch"] = measure_launch(cfg, out, nproc=2)
    result["targets"] = target_table(result)
    result["seconds"] = time.perf_counter() - started
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    if plot:
        import matplotlib.pyplot as plt

        plt.close(plot_result(result, out / "bench.png"))  # saved; a notebook draws its own plots
    log(f"wrote {out / 'bench.json'}" + (f" and {out / 'bench.png'}" if plot else "")
        + f" in {result['seconds']:.0f}s")
    return result


# --- what a complete result holds ---------------------------------------------------------------


def required_figures(result: dict) -> dict:
    """Every number the benchmark promises, by a dotted name (tests check them all)."""
    figures = {}
    for name in PIPELINES:
        for key in ("samples_per_s", "epoch_s", "epoch_vs_compute_only"):
            figures[f"pipeline.{name}.{key}"] = result["pipeline"]["variants"][name][key]
    for model in ("mymodel", "resnet18"):
        scaling = result["scaling"][model]
        for n, row in scaling["per_nproc"].items():
            figures[f"scaling.{model}.{n}.samples_per_s"] = row["samples_per_s"]
            figures[f"scaling.{model}.{n}.efficiency"] = scaling["efficiency"][n]
        for key in ("comm_share_hook", "comm_share_no_sync", "grad_MB"):
            figures[f"scaling.{model}.{key}"] = scaling[key]
    for level in ("ddp", "accelerate", "trainer"):
        figures[f"abstraction.{level}.epoch_s"] = result["abstraction"]["levels"][level]["epoch_s"]
        figures[f"abstraction.{level}.ratio_to_ddp"] = result["abstraction"]["ratio_to_ddp"][level]
    figures["abstraction.tensor_pipeline_vs_compute_only"] = result["abstraction"]["ddp_pipeline"]["ratio"]
    for model in ("mymodel", "resnet18"):
        row = result["mixed_precision"]["models"][model]
        figures[f"mixed_precision.{model}.fp32_step_ms"] = row["fp32"]["step_ms"]
        figures[f"mixed_precision.{model}.bf16_step_ms"] = row["bf16"]["step_ms"]
        figures[f"mixed_precision.{model}.bf16_speedup"] = row["bf16_speedup"]
    figures["launch.ratio"] = result["launch"]["ratio"]
    for name in TARGETS:
        figures[f"targets.{name}"] = result["targets"][name]["measured"]
    return figures


# --- plots ----------------------------------------------------------------------------------------


def plot_result(result: dict, path=None):
    """One figure, a panel per question; saved to ``path`` when given. Returns the figure."""
    import matplotlib

    if path is not None and "ipykernel" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    (pipe_ax, scale_ax, comm_ax), (level_ax, mp_ax, target_ax) = axes
    if "pipeline" in result:
        variants = result["pipeline"]["variants"]
        names = list(variants)
        pipe_ax.barh(names, [variants[n]["samples_per_s"] for n in names],
                     color=["tab:red", "tab:orange", "tab:blue", "tab:cyan", "tab:gray"][:len(names)])
        pipe_ax.set_xlabel("samples/s (one process)")
        pipe_ax.set_title("1. data pipeline, same training step")
        pipe_ax.invert_yaxis()
    if "scaling" in result:
        for model, row in result["scaling"].items():
            ns = [int(n) for n in row["per_nproc"]]
            scale_ax.plot(ns, [row["efficiency"][str(n)] * n for n in ns], marker="o", label=model)
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
                    label="1 - no_sync step / step")
        comm_ax.set_xticks(list(xs), [f"{m}\n{result['scaling'][m]['grad_MB']:.1f} MB grads" for m in models])
        comm_ax.set_ylabel("share of a step")
        comm_ax.set_title("2. gradient all-reduce share")
        comm_ax.legend(fontsize=8)
    if "abstraction" in result:
        ratios = result["abstraction"]["ratio_to_ddp"]
        level_ax.bar(list(ratios), list(ratios.values()), color=["tab:gray", "tab:blue", "tab:purple"])
        for name, (target, _) in TARGETS.items():
            if name in ("accelerate_vs_ddp", "trainer_vs_ddp"):
                x = 1 if name.startswith("accelerate") else 2
                level_ax.hlines(target, x - 0.4, x + 0.4, colors="k", linestyles="dashed")
        level_ax.set_ylabel("epoch time / raw DDP")
        level_ax.set_title("3. abstraction overhead (dashed: target)")
    if "mixed_precision" in result:
        models = result["mixed_precision"]["models"]
        mp_ax.bar(list(models), [row["bf16_speedup"] for row in models.values()], color="tab:green")
        mp_ax.axhline(1.0, color="k", alpha=0.4)
        mp_ax.set_ylabel("fp32 step time / bf16 step time")
        mp_ax.set_title(f"4. bf16 autocast on {result['mixed_precision']['device']}")
    table = result.get("targets", {})
    names = [n for n in table if table[n]["measured"] is not None]
    target_ax.barh(names, [table[n]["measured"] / table[n]["target"] for n in names],
                   color=["tab:green" if table[n]["met"] else "tab:red" for n in names])
    target_ax.axvline(1.0, color="k", linestyle="dashed")
    target_ax.set_xlabel("measured / target (left of the line: met)")
    target_ax.set_title("targets (incl. 5. launch overhead)")
    target_ax.invert_yaxis()
    fig.suptitle(f"{result['machine']['processor']}, {result['machine']['cpu_count']} CPUs, "
                 f"GPUs: {', '.join(result['machine']['gpus']) or 'none'}; {result['note']}", fontsize=10)
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
    p.add_argument("--steps", type=int, default=None, help="timed steps of MyModel measurements in fast mode")
    p.add_argument("--repeats", type=int, default=None, help="launches per side for the launch overhead")
    args = p.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    result = run(fast=args.fast, out=args.out, nproc=args.nproc, sections=sections, steps=args.steps,
                 repeats=args.repeats)
    for name, row in result["targets"].items():
        if row["measured"] is not None:
            log(f"{name:32s} {row['measured']:.2f} (target <= {row['target']}) {'met' if row['met'] else 'NOT met'}")
    return result


if __name__ == "__main__":
    main()
