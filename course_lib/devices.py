"""What this machine can run: GPUs, cores, process-group backends, and the choices that follow.

Defined for lesson 00 (``doctor``); the launchers use ``resolve_nproc`` and ``choose_backend``.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import LaunchConfigError


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu_count() -> int:
    """Cores this process may use (respects CPU affinity, unlike ``os.cpu_count``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cpu_name() -> str:
    """The processor's model name (from /proc/cpuinfo on Linux), e.g. "AMD EPYC 7B13"."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_bf16_flags() -> list[str]:
    """The CPU's instruction-set flags that compute bfloat16 natively (``avx512_bf16``, ``amx_bf16``), from
    /proc/cpuinfo on Linux; empty where there are none, or where the flags cannot be read."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("flags"):
                return sorted(set(line.split(":", 1)[1].split()) & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return []


def machine_summary() -> str:
    """One line naming this machine, for results that depend on it: processor, cores, GPUs, OS, Python, torch."""
    gpus = [torch.cuda.get_device_name(i) for i in range(gpu_count())]
    return (f"{cpu_name()}, {cpu_count()} usable CPU cores, "
            + (f"{len(gpus)} GPU(s) ({', '.join(sorted(set(gpus)))})" if gpus else "no GPU")
            + f"; {platform.system()} {platform.release()}; Python {platform.python_version()}; torch {torch.__version__}")


BUSY_PERCENT = 25  # CPU time other programs used, in percent of all CPUs, above which a timing is disturbed


def machine_load(interval: float = 2.0) -> tuple[bool, str]:
    """Whether other programs are using the CPUs now (their share over ``interval`` seconds, while this
    process waits), and a few words saying so, for a lesson to print before it times something."""
    import psutil

    used = psutil.cpu_percent(interval=interval)
    if used > BUSY_PERCENT:
        return True, (f"BUSY: other programs used {used:.0f}% of the CPUs just before, so the times are slower and "
                      "noisier")
    return False, f"idle ({used:.0f}% of the CPUs in use just before)"


def gpu_problem() -> str | None:
    """Why CUDA cannot run here (None when it can): it must be available AND run a kernel on every GPU."""
    arches = ", ".join(torch.cuda.get_arch_list()) or "none"
    needs = (f"This PyTorch ({torch.__version__}, CUDA {torch.version.cuda}) runs on GPUs of the compute capabilities "
             f"it was built for ({arches}) with an NVIDIA driver that supports CUDA {torch.version.cuda}")
    if torch.version.cuda is None:
        return f"this PyTorch ({torch.__version__}) is a CPU-only build; install the CUDA build"
    if not torch.cuda.is_available():
        return f"torch.cuda.is_available() is False: no GPU visible, or the driver is too old. {needs}"
    for i in range(torch.cuda.device_count()):
        try:
            value = (torch.arange(4.0, device=f"cuda:{i}") * 2).sum().item()
        except Exception as exc:  # an unsupported card fails here ("no kernel image is available"), not earlier
            return f"GPU {i} ({torch.cuda.get_device_name(i)}) cannot run a kernel: {str(exc).splitlines()[0]}. {needs}"
        if value != 12.0:
            return f"GPU {i} computed {value} for a sum whose value is 12"
    return None


def available_backends() -> list[str]:
    checks = {"nccl": dist.is_nccl_available, "gloo": dist.is_gloo_available, "mpi": dist.is_mpi_available}
    return [name for name, check in checks.items() if check()]


def default_nproc() -> int:
    """One process per GPU; 2 CPU processes when there is no GPU (enough to see DDP at work)."""
    return gpu_count() or 2


def validate_nproc(nproc) -> int:
    """Return ``nproc`` as a positive int, or raise a LaunchConfigError that says what is allowed."""
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        if isinstance(nproc, str) and nproc.strip().isdigit():
            nproc = int(nproc)
        else:
            raise LaunchConfigError(
                f"nproc must be a whole number of processes such as 2, got {nproc!r}. "
                "Pass nproc=None to use the default (one per GPU, else 2 on CPU)."
            )
    if nproc < 1:
        raise LaunchConfigError(
            f"nproc must be at least 1, got {nproc}: a process group needs at least one process. "
            "Pass nproc=None to use the default (one per GPU, else 2 on CPU)."
        )
    return nproc


def resolve_nproc(nproc=None) -> int:
    return default_nproc() if nproc is None else validate_nproc(nproc)


def choose_backend(nproc_per_node: int | None = None, requested: str | None = None) -> str:
    """nccl when CUDA is there and every local rank gets its own GPU, else gloo.

    ``requested="nccl"`` with more ranks than GPUs raises with the reason and the fix.
    """
    nproc = resolve_nproc(nproc_per_node)
    gpus = gpu_count()
    if requested not in (None, "nccl", "gloo", "mpi"):
        raise LaunchConfigError(f"Unknown backend {requested!r}: use 'nccl' (GPUs) or 'gloo' (CPU or GPU).")
    if requested == "nccl":
        if not dist.is_nccl_available():
            raise LaunchConfigError(
                "backend 'nccl' is not in this PyTorch build (Windows and macOS builds have none). "
                "Use backend='gloo' (or leave it unset), which runs on CPU and on GPUs."
            )
        if not gpus:
            raise LaunchConfigError(
                "backend 'nccl' needs CUDA GPUs and this machine has none. "
                "Use backend='gloo' (or leave it unset), which runs on CPU."
            )
        if nproc > gpus:
            raise LaunchConfigError(
                f"backend 'nccl' with {nproc} processes per node needs {nproc} GPUs, this node has {gpus}. "
                "NCCL drives one GPU per rank (two ranks on one GPU fail with 'Duplicate GPU detected'). "
                f"Use nproc<={gpus}, or backend='gloo', which lets several CPU processes share the machine."
            )
        return "nccl"
    if requested is not None:
        return requested
    return "nccl" if gpus and nproc <= gpus and dist.is_nccl_available() else "gloo"


@dataclass
class Plan:
    """The backend and process count a default launch gets here, and why."""

    nproc: int
    backend: str
    device: str
    reason: str


def default_plan() -> Plan:
    gpus = gpu_count()
    if gpus:
        return Plan(gpus, choose_backend(gpus), "cuda",
                    f"{gpus} CUDA GPU(s): one process per GPU, NCCL between them")
    return Plan(2, "gloo", "cpu",
                "no CUDA GPU: 2 CPU processes talking over gloo (torchrun's `--nproc-per-node auto` "
                f"would start one per core, {cpu_count()} here)")


def environment_report() -> list[tuple[str, str]]:
    """(item, value) rows describing this machine for distributed training."""
    from .data import DEFAULT_ROOT, mnist_is_ready
    from .display import shown_path

    rows = [
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("CUDA (torch built with)", str(torch.version.cuda)),
        ("CUDA available", str(torch.cuda.is_available())),
    ]
    for i in range(gpu_count()):
        props = torch.cuda.get_device_properties(i)
        rows.append((f"GPU {i}", f"{props.name}, {props.total_memory / 2**30:.1f} GiB"))
    plan = default_plan()
    rows += [
        ("GPUs", str(gpu_count())),
        ("CPU cores (usable)", str(cpu_count())),
        ("process-group backends", ", ".join(available_backends()) or "none"),
        ("MNIST ready", f"{mnist_is_ready()} ({shown_path(DEFAULT_ROOT / 'MNIST' / 'raw')})"),
        ("default processes", str(plan.nproc)),
        ("default backend", plan.backend),
        ("why", plan.reason),
    ]
    return rows


def doctor() -> None:
    """Show what this machine offers for distributed training (HTML in Jupyter, text elsewhere)."""
    from .display import show_table

    show_table([{"item": k, "value": v} for k, v in environment_report()])
