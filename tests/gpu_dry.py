"""Run a course script's device choice "dry" on a machine without GPUs: CUDA made to look present, nothing joined.

Used by tests/test_gpu_dry.py, in a subprocess of its own so that no patch outlives the run::

    python tests/gpu_dry.py JOBS.json RESULTS.json

JOBS.json is a list of ``{"key": ..., "path": ..., "family": ...}``; each script is imported as a module (its
``main()`` sits behind ``if __name__ == "__main__"``), then, once with 2 GPUs and once with 1, with torchrun's
variables of a local rank 1 of 2 on the second of two nodes (RANK=3, WORLD_SIZE=4), its deciding code runs with:

- ``torch.cuda.is_available`` -> True, ``torch.cuda.device_count`` -> the count, ``dist.is_nccl_available`` -> True;
- ``torch.cuda.set_device`` recording its device, and raising as the real one does for an index with no GPU;
- ``dist.init_process_group`` recording its backend and ``device_id`` (checked against the real signature);
- family ``accelerate`` / ``accelerate-pitfall``: the module's ``Accelerator`` replaced by a fake that records its
  arguments and has the device Accelerate would give (``cuda:LOCAL_RANK``, or ``cpu`` with ``cpu=True``);
- family ``trainer`` / ``trainer-pitfall``: the module's ``TrainingArguments`` replaced by a recorder that stops
  ``main()`` right there.

Families ``ddp``, ``seed`` and ``accelerate`` (and its pitfall) call ``setup()``; ``main`` calls ``main()`` and stops
it inside ``init_process_group``; ``trainer`` (and its pitfall) calls ``main()``. The device-dependent arguments
the script passes elsewhere (``device_ids=``, ``pin_memory=``, the first argument of ``init_device_mesh`` and
``torch.autocast``) are read from its syntax tree and evaluated with the device the run chose. RESULTS.json maps
each key to ``{"2": record, "1": record}`` (the GPU count).
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import io
import json
import os
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

ENV = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
GPU_COUNTS = (2, 1)
SETUP_ARGS = {"timeout": 10.0, "pg_timeout": None}  # a value for each required parameter a setup() may take
DEVICE_KEYWORDS = ("device_ids", "pin_memory")  # keyword arguments whose value follows the device
DEVICE_FIRST_ARG = ("init_device_mesh", "autocast")  # calls whose first argument is the device type


class DryStop(BaseException):
    """Stops a script at its decision; a BaseException, so that no `except Exception` (or @record) swallows it."""


def device_text(value):
    import torch

    if isinstance(value, torch.device):
        return str(value)
    return value


def jsonable(value):
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return device_text(value) if type(value).__name__ == "device" else repr(value)


def device_expressions(text: str) -> list[tuple[str, int, str]]:
    """(kind, line, source) of each device-dependent argument in the script."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg in DEVICE_KEYWORDS:
                found.append((keyword.arg, keyword.value.lineno, ast.unparse(keyword.value)))
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name in DEVICE_FIRST_ARG and node.args:
            found.append((name, node.args[0].lineno, ast.unparse(node.args[0])))
    return found


def evaluate_expressions(text: str, device) -> list[dict]:
    """Each device-dependent argument's value for ``device``; one that needs other names is reported, not guessed."""
    out = []
    for kind, line, source in device_expressions(text):
        names = {n.id for n in ast.walk(ast.parse(source, mode="eval")) if isinstance(n, ast.Name)}
        entry = {"kind": kind, "line": line, "source": source}
        if device is None or not names <= {"device"}:
            entry["unevaluated"] = sorted(names - {"device"}) or ["device (none chosen)"]
        else:
            entry["value"] = jsonable(eval(source, {"__builtins__": {}}, {"device": device}))
        out.append(entry)
    return out


class FakeAccelerator:
    """What setup() reads from an Accelerator, as Accelerate sets it up under torchrun's variables."""

    calls: list = []

    def __init__(self, *args, **kwargs):
        import accelerate
        import torch

        inspect.signature(accelerate.Accelerator.__init__).bind(self, *args, **kwargs)  # a wrong keyword fails here
        FakeAccelerator.calls.append(kwargs)
        cpu = bool(kwargs.get("cpu", False))
        self.process_index, self.local_process_index = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        self.num_processes = int(os.environ["WORLD_SIZE"])
        self.device = torch.device("cpu") if cpu else torch.device("cuda", self.local_process_index)
        self.state = SimpleNamespace(backend="gloo" if cpu else "nccl")
        self.distributed_type = "MULTI_CPU" if cpu else "MULTI_GPU"
        self.mixed_precision = "no"
        self.is_main_process = self.process_index == 0

    def print(self, *args, **kwargs):
        print(*args, **kwargs)


def training_arguments_recorder(record):
    def fake(*args, **kwargs):
        import transformers

        inspect.signature(transformers.TrainingArguments).bind(*args, **kwargs)  # a wrong keyword fails here
        record["training_args"] = {k: jsonable(v) for k, v in kwargs.items()}
        raise DryStop("TrainingArguments")

    return fake


def import_script(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def frame_locals(tb, path: Path, function: str) -> dict:
    """The locals of ``function`` in the script at ``path``, from the traceback of the exception that stopped it."""
    found = {}
    for frame, _ in traceback.walk_tb(tb):
        if frame.f_code.co_filename == str(path) and frame.f_code.co_name == function:
            found = dict(frame.f_locals)
    return found


def dry_run(path: Path, family: str, gpus: int, index: int) -> dict:
    import torch
    import torch.distributed as dist

    record: dict = {"set_device": [], "init": [], "error": None}
    real_init, real_set_device = dist.init_process_group, torch.cuda.set_device

    def set_device(device):
        inspect.signature(real_set_device).bind(device)
        index_ = device if isinstance(device, int) else torch.device(device).index
        record["set_device"].append(f"cuda:{index_}")
        if index_ is None or not 0 <= index_ < gpus:  # the real one: "CUDA error: invalid device ordinal"
            raise RuntimeError(f"CUDA error: invalid device ordinal (device {index_}, {gpus} GPU(s))")

    def init_process_group(*args, **kwargs):
        bound = inspect.signature(real_init).bind(*args, **kwargs)
        call = {"backend": bound.arguments.get("backend"), "device_id": device_text(bound.arguments.get("device_id"))}
        record["init"].append(call)
        if family == "main":
            raise DryStop("init_process_group")

    saved_env, saved_argv = dict(os.environ), sys.argv
    module_name = f"gpu_dry_{index}_{gpus}"
    with contextlib.ExitStack() as stack:
        try:
            module = import_script(path, module_name)
            originals = {real_init: init_process_group, real_set_device: set_device}
            for name, value in list(vars(module).items()):  # names a script bound with `from ... import`
                for real, fake in originals.items():
                    if value is real:
                        stack.enter_context(mock.patch.object(module, name, fake))
            stack.enter_context(mock.patch.object(torch.cuda, "is_available", lambda: True))
            stack.enter_context(mock.patch.object(torch.cuda, "device_count", lambda: gpus))
            stack.enter_context(mock.patch.object(torch.cuda, "set_device", set_device))
            stack.enter_context(mock.patch.object(dist, "is_nccl_available", lambda: True))
            stack.enter_context(mock.patch.object(dist, "init_process_group", init_process_group))
            if family.startswith("accelerate"):
                FakeAccelerator.calls = []
                stack.enter_context(mock.patch.object(module, "Accelerator", FakeAccelerator))
            if family.startswith("trainer"):
                stack.enter_context(mock.patch.object(module, "TrainingArguments", training_arguments_recorder(record)))
            os.environ.update(ENV)
            sys.argv = [str(path)]
            device = None
            with contextlib.redirect_stdout(io.StringIO()):
                if family in ("ddp", "seed"):
                    parameters = inspect.signature(module.setup).parameters.values()
                    required = [p.name for p in parameters if p.default is p.empty]
                    returned = module.setup(*[SETUP_ARGS[name] for name in required])
                    rank, world_size, device, backend = returned
                    record["returned"] = {"rank": rank, "world_size": world_size, "device": str(device),
                                          "backend": backend}
                elif family.startswith("accelerate"):
                    accelerator = module.setup()
                    device = accelerator.device
                    record["accelerator"] = {k: jsonable(v) for call in FakeAccelerator.calls for k, v in call.items()}
                    record["returned"] = {"device": str(device), "backend": accelerator.state.backend}
                elif family in ("main", "trainer", "trainer-pitfall"):
                    module.main()
                    raise AssertionError("main() ran to its end: the dry run expected it to stop at its decision")
                else:
                    raise ValueError(f"unknown family {family!r}")
        except DryStop as stop:
            names = frame_locals(stop.__traceback__, path, "main")
            device = names.get("device")
            record["stopped_at"] = str(stop)
            record["locals"] = {k: jsonable(names[k]) for k in ("use_cuda", "device") if k in names}
        except BaseException as exc:  # SystemExit included: the seed's setup exits with a message
            record["error"] = {"type": type(exc).__name__, "message": str(exc),
                               "traceback": "".join(traceback.format_exception(exc))[-3000:]}
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
            sys.argv = saved_argv
            sys.modules.pop(module_name, None)
    record["expressions"] = evaluate_expressions(path.read_text(), device)
    return record


def main(jobs_file: str, results_file: str) -> None:
    jobs = json.loads(Path(jobs_file).read_text())
    results = {}
    for index, job in enumerate(jobs):
        path = Path(job["path"]).resolve()
        results[job["key"]] = {str(gpus): dry_run(path, job["family"], gpus, index) for gpus in GPU_COUNTS}
    Path(results_file).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
