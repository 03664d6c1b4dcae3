"""course_lib: the plumbing of the distributed-training workbook.

Small modules, one job each. The learner core: ``data`` (MNIST), ``model`` (the seed's MyModel),
``devices`` (GPUs, backends, doctor), ``scripts`` (write a cell to a file), ``launch`` (torchrun and
accelerate from a cell, described by a ``LaunchSpec``), ``metrics`` (JSON lines), ``display`` (tables, fresh
run folders), ``errors`` (every error a learner can cause) and ``processes`` (start a command, end its process
tree). Ranks and nodes on one machine, in ``course_lib.cluster``: ``ranks`` (a pool of ranks driven from cells)
and ``multinode`` (several torchrun agents as nodes). The live views, in ``course_lib.ui``: ``progress`` and
``panel``. The instructors' tools, in ``course_lib.teaching``: ``checks``
(one module per lesson), ``grading``, ``exercises`` and ``notebooks`` (the parameter injection shared by the
grader and the tests). What the lessons teach
(process groups, samplers, DDP, checkpoints) stays in the lessons' scripts.

Names are imported lazily so that ``python3 -m course_lib setup`` works before torch is installed.
"""
import importlib

_EXPORTS = {
    "prepare_mnist": "data", "mnist_tensors": "data", "mnist_datasets": "data", "mnist_is_ready": "data",
    "MIRROR_ENV": "data",
    "MyModel": "model", "RowTransformer": "model", "count_right": "model",
    "doctor": "devices", "gpu_count": "devices", "cpu_count": "devices", "available_backends": "devices",
    "default_nproc": "devices", "choose_backend": "devices", "machine_load": "devices",
    "write_script": "scripts", "write_scripts_of": "scripts", "positive_int": "scripts",
    "show_table": "display", "fresh_run_dir": "display",
    "torchrun": "launch", "accelerate_launch": "launch", "RunResult": "launch", "LaunchSpec": "launch",
    "DataError": "errors", "LaunchConfigError": "errors", "LaunchError": "errors", "LaunchTimeout": "errors",
    "log_metrics": "metrics", "read_metrics": "metrics", "plot_metrics": "metrics",
    "start_ranks": "cluster.ranks", "RankPool": "cluster.ranks",
    "time_side_by_side": "timing", "time_calls": "timing", "Timing": "timing",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    if not name.startswith("_"):  # a submodule: course_lib.data.DEFAULT_ROOT works without importing it first
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module 'course_lib' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """``%load_ext course_lib`` registers the ``%%write_script PATH`` cell magic."""
    from .scripts import load_ipython_extension as load

    load(ipython)
