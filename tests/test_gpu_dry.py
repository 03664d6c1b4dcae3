"""The GPU branch of every script the lessons write, run dry on a machine without GPUs.

A CPU run never executes a script's CUDA branch, and a bug can hide there: the Accelerate family's setup() once
called ``dist.is_nccl_available()`` without importing ``dist``, a NameError on any CUDA machine that every CPU test
passed. Here each script is imported as a module from its ``%%write_script`` cell (no notebook runs) and its
deciding code runs with CUDA made to look present (tests/gpu_dry.py says how), as local rank 1 of 2 on the second
of two nodes (RANK=3, WORLD_SIZE=4):

- 2 GPUs, a GPU for every local rank: CUDA + nccl on ``cuda:1``, ``set_device(cuda:1)``, ``device_id=cuda:1``,
  Accelerate ``cpu=False``, Trainer ``use_cpu=False``; ``device_ids=[1]`` and ``pin_memory=True`` where passed;
- 1 GPU, fewer than the local ranks: CPU + gloo, no ``set_device``, ``device_id=None``, ``cpu=True``,
  ``use_cpu=True``; ``device_ids=None``, ``pin_memory=False``.

Every script of notebooks/ and solutions/ is classified in FAMILY, so a new script fails until it is given a
family, and a script that mentions cuda or nccl cannot be classified as having no GPU branch. The exercises/
versions are dry-run too where their setup path is intact (their task regions lie elsewhere); those whose task IS
the device choice (EXERCISE_STUBS) stop with NotImplementedError there, which is checked, and their solutions are
covered. Also here: course_lib's own launchers with GPUs faked (torchrun's default process count and nccl check,
accelerate_launch's ACCELERATE_USE_CPU, the interactive ranks' nccl set-up).
"""
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from course_lib.scripts import script_cells, script_source
from course_lib.scripts import LESSON_GLOB

ROOT = Path(__file__).resolve().parent.parent
HELPER = Path(__file__).with_name("gpu_dry.py")
FOLDERS = ("notebooks", "solutions", "exercises")
LOCAL_RANK = 1  # tests/gpu_dry.py's ENV: RANK=3, LOCAL_RANK=1, WORLD_SIZE=4, LOCAL_WORLD_SIZE=2

#: How each script decides its device (tests/gpu_dry.py runs the family's deciding code):
#: ddp: setup() returns (rank, world_size, device, backend) after set_device and init_process_group;
#: seed: lesson 03's seed_init.py, the seed's setup kept on purpose (cuda:LOCAL_RANK and nccl, whatever the machine);
#: main: main() decides and joins the group itself (stopped inside init_process_group);
#: accelerate: setup() builds Accelerator(cpu=not use_cuda); accelerate-pitfall: Accelerator() without cpu=, by design;
#: trainer: main() builds TrainingArguments(use_cpu=not use_cuda, ...); trainer-pitfall: without use_cpu=, by design;
#: none: no GPU branch at all (never imported: some run at import time, e.g. die.py exits);
#: module: a module the ranks import, no device decision of its own to run: its CUDA branches are dry-run by the
#: tests at the end of this file.
FAMILY = {
    "runs/00_setup/hello_ranks.py": "ddp",
    "runs/00_setup_exercises/hello.py": "none",
    "runs/00_setup_exercises/all_reduce.py": "main",
    "runs/01_collectives/hello.py": "ddp",
    "runs/01_collectives/collectives.py": "ddp",
    "runs/01_collectives/ddp_by_hand.py": "ddp",
    "runs/01_collectives/allreduce_bench.py": "ddp",
    "runs/01_collectives_exercises/average_gradients.py": "none",
    "runs/01_collectives_exercises/global_mean.py": "none",
    "runs/01_collectives_exercises/broadcast_model.py": "none",
    "runs/02_ddp/train.py": "ddp",
    "runs/02_ddp/evaluate.py": "ddp",
    "runs/02_ddp_exercises/train_evaluate.py": "ddp",
    "runs/02_ddp_exercises/train.py": "ddp",
    "runs/03_ddp_pitfalls/seed_init.py": "seed",
    "runs/03_ddp_pitfalls/train.py": "ddp",
    "runs/03_ddp_pitfalls/seed_loop.py": "ddp",
    "runs/03_ddp_pitfalls/eval_shards.py": "ddp",
    "runs/03_ddp_pitfalls/world_size.py": "none",
    "runs/03_ddp_pitfalls_exercises/train.py": "ddp",
    "runs/04_torchrun_elastic/env.py": "main",
    "runs/04_torchrun_elastic/train.py": "ddp",
    "runs/04_torchrun_elastic/die.py": "none",
    "runs/04_torchrun_elastic/hang.py": "main",
    "runs/04_torchrun_elastic_exercises/train.py": "ddp",
    "runs/05_accelerate/train.py": "accelerate",
    "runs/05_accelerate/evaluate.py": "accelerate",
    "runs/05_accelerate/evaluate_no_cpu.py": "accelerate-pitfall",
    "runs/05_accelerate/train_accum.py": "accelerate",
    "runs/05_accelerate_exercises/train.py": "accelerate",
    "runs/05_accelerate_exercises/evaluate.py": "accelerate",
    "runs/06_trainer/train.py": "trainer",
    "runs/06_trainer/world_check.py": "trainer-pitfall",
    "runs/06_trainer/level_ddp.py": "ddp",
    "runs/06_trainer/level_accelerate.py": "accelerate",
    "runs/06_trainer/level_trainer.py": "trainer",
    "runs/06_trainer_exercises/train.py": "trainer",
    "runs/07_performance/train.py": "ddp",
    "runs/08_inside_ddp/train_naive.py": "ddp",
    "runs/08_inside_ddp/train_flat.py": "ddp",
    "runs/08_inside_ddp/train_bucketed.py": "ddp",
    "runs/08_inside_ddp/checks.py": "none",
    "runs/08_inside_ddp/timing.py": "module",
    "runs/08_inside_ddp/wire.py": "none",
    "runs/08_inside_ddp_exercises/train_overlapped.py": "ddp",
    "runs/08_inside_ddp_exercises/train_hook.py": "ddp",
    "runs/09_sharding/train_fsdp.py": "ddp",
    "runs/09_sharding/train_accelerate.py": "accelerate",
    "runs/09_sharding/train_trainer.py": "trainer",
    "runs/09_sharding/memory.py": "module",
    "runs/09_sharding_exercises/memory.py": "none",
    "runs/09_sharding_exercises/train_shard.py": "ddp",
    "runs/10_tensor_parallel/megatron.py": "none",
    "runs/10_tensor_parallel/plans.py": "none",
    "runs/10_tensor_parallel_exercises/row_parallel.py": "none",
    "runs/10_tensor_parallel_exercises/plan.py": "none",
    "runs/11_pipeline_parallel/pipeline.py": "module",
    "runs/11_pipeline_parallel_exercises/schedule.py": "none",
    "runs/11_pipeline_parallel_exercises/bubble.py": "none",
    "runs/12_device_meshes/meshes.py": "none",
    "runs/12_device_meshes_exercises/choose.py": "none",
    "runs/12_device_meshes_exercises/groups.py": "none",
}

#: Exercise scripts whose task is the device choice itself: the student's stub raises where the choice is made.
EXERCISE_STUBS = {
    "runs/00_setup_exercises/all_reduce.py": "task 00.3 is joining the group by the rule (set_device, backend)",
    "runs/05_accelerate_exercises/train.py": "the task is the Accelerator(cpu=...) line in setup()",
    "runs/06_trainer_exercises/train.py": "the task is the TrainingArguments(use_cpu=...) call in main()",
}

CUDA_WORDS = re.compile(r"cuda|nccl", re.IGNORECASE)


def collect():
    found = []
    for folder in FOLDERS:
        for notebook in sorted((ROOT / folder).glob(LESSON_GLOB)):
            for target, _, text in script_cells(notebook):
                found.append((folder, notebook.name, target, text))
    return found


SCRIPTS = collect()
DRY = [(f"{folder}/{target}", folder, notebook, target, text) for folder, notebook, target, text in SCRIPTS
       if FAMILY.get(target, "none") not in ("none", "module")]
RUN = [pytest.param(key, id=key) for key, folder, _, target, _ in DRY
       if not (folder == "exercises" and target in EXERCISE_STUBS)]
STUBBED = [pytest.param(key, id=key) for key, folder, _, target, _ in DRY
           if folder == "exercises" and target in EXERCISE_STUBS]


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """{key: {"2": record, "1": record}} for every dry-run script: two subprocesses, each taking every other
    notebook's scripts (each subprocess starts Python, torch, Accelerate and Transformers once for all of them)."""
    base = tmp_path_factory.mktemp("gpu_dry")
    batches: dict[tuple[str, str], list[dict]] = {}
    for key, folder, notebook, target, text in DRY:
        path = base / folder / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        batches.setdefault((folder, notebook), []).append({"key": key, "path": str(path), "family": FAMILY[target]})
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                                        os.environ.get("PYTHONPATH")])))
    notebooks = list(batches)
    halves = [notebooks[0::2], notebooks[1::2]]

    def run(which):
        half = halves[which]
        jobs_file, results_file = base / f"half{which}.jobs.json", base / f"half{which}.results.json"
        jobs_file.write_text(json.dumps([job for notebook in half for job in batches[notebook]]))
        done = subprocess.run([sys.executable, str(HELPER), str(jobs_file), str(results_file)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        names = ", ".join(f"{folder}/{notebook}" for folder, notebook in half)
        assert done.returncode == 0, f"the dry run of {names} failed:\n{done.stdout}\n{done.stderr}"
        return json.loads(results_file.read_text())

    results = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for part in pool.map(run, [i for i, half in enumerate(halves) if half]):
            results.update(part)
    return results


def family_of(key):
    return FAMILY[key.split("/", 1)[1]]


def ran_clean(key, record, gpus):
    error = record["error"]
    hint = ("\nAn exercise whose task is the device choice itself belongs in EXERCISE_STUBS."
            if error and key.startswith("exercises/") and error["type"] == "NotImplementedError" else "")
    assert error is None, (f"{key} with {gpus} GPU(s) for 2 local ranks raised {error['type']}: {error['message']}\n"
                           f"{error['traceback']}{hint}")


def check_expressions(key, record, cuda):
    """device_ids=, pin_memory=, init_device_mesh(...) and autocast(...) follow the device the script chose."""
    expected = {"device_ids": [LOCAL_RANK] if cuda else None, "pin_memory": cuda,
                "init_device_mesh": "cuda" if cuda else "cpu", "autocast": "cuda" if cuda else "cpu"}
    for entry in record["expressions"]:
        where = f"{key}, line {entry['line']}: {entry['kind']}={entry['source']}"
        assert "unevaluated" not in entry, (f"{where} depends on {entry['unevaluated']}, not only on `device`: "
                                            "teach tests/gpu_dry.py how to evaluate it")
        assert entry["value"] == expected[entry["kind"]], (
            f"{where} gives {entry['value']!r} on {'cuda:1' if cuda else 'cpu'}, expected {expected[entry['kind']]!r}")


# ------------------------------------------------------------------ the classification is complete and honest


def test_every_script_the_lessons_write_is_classified():
    targets = {target for _, _, target, _ in SCRIPTS}
    unclassified = sorted(targets - set(FAMILY))
    assert not unclassified, f"new scripts without a family in FAMILY (tests/test_gpu_dry.py): {unclassified}"
    gone = sorted(set(FAMILY) - targets)
    assert not gone, f"FAMILY names scripts no notebook writes any more: {gone}"
    assert len(targets) >= 40, f"only {len(targets)} scripts found: is script_cells broken?"


def test_every_script_that_mentions_cuda_or_nccl_gets_a_dry_run():
    for folder, notebook, target, text in SCRIPTS:
        if FAMILY.get(target, "none") == "none":  # unclassified too (the test above names those)
            match = CUDA_WORDS.search(text)
            assert match is None, (f"{folder}/{notebook} writes {target}, classified as having no GPU branch, but it "
                                   f"mentions {match.group()!r}: give it a family in FAMILY")
    assert len(RUN) >= 45, f"only {len(RUN)} dry runs"


def test_the_exercise_stubs_are_exactly_the_exercises_whose_device_choice_is_the_task(dry_runs):
    """An exercise in EXERCISE_STUBS must stop at its task; one whose setup path works must not be listed there."""
    for key, folder, _, target, _ in DRY:
        if folder != "exercises":
            continue
        errors = {gpus: (record["error"] or {}).get("type") for gpus, record in dry_runs[key].items()}
        if target in EXERCISE_STUBS:
            assert set(errors.values()) == {"NotImplementedError"}, (
                f"{key} is in EXERCISE_STUBS ({EXERCISE_STUBS[target]}) but its dry run gave {errors}: "
                "if its setup path is intact now, remove it from EXERCISE_STUBS")


# ------------------------------------------------------------------ each script, with a GPU per local rank and without


@pytest.mark.parametrize("key", RUN)
def test_with_a_gpu_for_every_local_rank_the_script_takes_cuda_and_nccl(dry_runs, key):
    record, family = dry_runs[key]["2"], family_of(key)
    ran_clean(key, record, 2)
    if family in ("ddp", "seed", "main"):
        assert record["set_device"] == ["cuda:1"], f"{key}: set_device calls {record['set_device']}, expected cuda:1"
        device_id = LOCAL_RANK if family == "seed" else "cuda:1"  # the seed passes the local rank as an int
        assert record["init"] == [{"backend": "nccl", "device_id": device_id}], (
            f"{key}: init_process_group calls {record['init']}, expected one with nccl and device_id={device_id!r}")
    if family in ("ddp", "seed"):
        assert record["returned"] == {"rank": 3, "world_size": 4, "device": "cuda:1", "backend": "nccl"}, (
            f"{key}: setup() returned {record['returned']}")
    if family == "main":
        assert record["stopped_at"] == "init_process_group" and record["locals"]["device"] == "cuda:1", (
            f"{key}: main() stopped at {record.get('stopped_at')} with {record.get('locals')}")
    if family.startswith("accelerate"):
        assert record["init"] == [] and record["set_device"] == [], f"{key}: the Accelerator joins, not the script"
        expected = {} if family == "accelerate-pitfall" else {"cpu": False}  # the pitfall leaves cpu= out, by design
        assert record["accelerator"] == expected, f"{key}: Accelerator{record['accelerator']}, expected {expected}"
        assert record["returned"]["device"] == "cuda:1"
    if family.startswith("trainer"):
        args = record["training_args"]
        assert record["locals"]["use_cuda"] is True, f"{key}: use_cuda is {record['locals']} with 2 GPUs"
        if family == "trainer":
            assert args.get("use_cpu") is False, f"{key}: TrainingArguments(use_cpu={args.get('use_cpu', '<absent>')})"
        else:
            assert "use_cpu" not in args, f"{key} is the pitfall without use_cpu=, yet passes use_cpu={args['use_cpu']}"
        if "dataloader_pin_memory" in args:  # the exercise's solution leaves it to the Trainer (default True)
            pinned = args["dataloader_pin_memory"]
            assert pinned is True, f"{key}: dataloader_pin_memory={pinned}"
    check_expressions(key, record, cuda=True)


@pytest.mark.parametrize("key", RUN)
def test_with_fewer_gpus_than_local_ranks_the_script_takes_cpu_and_gloo(dry_runs, key):
    record, family = dry_runs[key]["1"], family_of(key)
    if family == "seed":  # by design: the seed's hard-coded GPU, refused with one line naming the fix
        error = record["error"] or {}
        assert error.get("type") == "SystemExit", f"{key}: expected the seed's SystemExit, got {error}"
        assert "needs one NVIDIA GPU per process" in error["message"] and "runs/02_ddp/train.py" in error["message"]
        assert record["set_device"] == ["cuda:1"] and record["init"] == [], f"{key}: {record}"
        return
    ran_clean(key, record, 1)
    if family in ("ddp", "main"):
        assert record["set_device"] == [], f"{key}: set_device called ({record['set_device']}) without a GPU of its own"
        assert record["init"] == [{"backend": "gloo", "device_id": None}], (
            f"{key}: init_process_group calls {record['init']}, expected one with gloo and no device_id")
    if family == "ddp":
        assert record["returned"] == {"rank": 3, "world_size": 4, "device": "cpu", "backend": "gloo"}, (
            f"{key}: setup() returned {record['returned']}")
    if family == "main":
        assert record["stopped_at"] == "init_process_group" and record["locals"]["device"] == "cpu", (
            f"{key}: main() stopped at {record.get('stopped_at')} with {record.get('locals')}")
    if family.startswith("accelerate"):
        expected = {} if family == "accelerate-pitfall" else {"cpu": True}
        assert record["accelerator"] == expected, f"{key}: Accelerator{record['accelerator']}, expected {expected}"
        if family == "accelerate":
            assert record["returned"]["device"] == "cpu"
    if family.startswith("trainer"):
        args = record["training_args"]
        assert record["locals"]["use_cuda"] is False, f"{key}: use_cuda is {record['locals']} with 1 GPU for 2 ranks"
        if family == "trainer":
            assert args.get("use_cpu") is True, f"{key}: TrainingArguments(use_cpu={args.get('use_cpu', '<absent>')})"
        else:
            assert "use_cpu" not in args
        if "dataloader_pin_memory" in args:
            pinned = args["dataloader_pin_memory"]
            assert pinned is False, f"{key}: dataloader_pin_memory={pinned}"
    if family != "accelerate-pitfall":  # the pitfall's device is whatever Accelerate makes of no cpu= (not faked)
        check_expressions(key, record, cuda=False)


@pytest.mark.parametrize("key", STUBBED)
def test_an_exercise_whose_task_is_the_device_choice_stops_at_the_task(dry_runs, key):
    for gpus, record in dry_runs[key].items():
        error = record["error"] or {}
        assert error.get("type") == "NotImplementedError", f"{key} with {gpus} GPU(s): {error or record}"
        assert record["set_device"] == [] and record["init"] == [], f"{key}: the stub joined something: {record}"


# ------------------------------------------------------------------ course_lib's launchers, GPUs faked


@pytest.fixture
def captured_launch(monkeypatch):
    """GPUs faked for course_lib's launchers; each launch's LaunchSpec is captured instead of run."""
    from course_lib import devices, launch

    specs = []

    def fake(gpus):
        for module in (devices, launch):
            monkeypatch.setattr(module, "gpu_count", lambda: gpus)
        monkeypatch.setattr(devices.dist, "is_nccl_available", lambda: True)
        monkeypatch.setattr(launch, "run_command", lambda spec, **kwargs: specs.append(spec) or spec)
        return specs

    return fake


def test_torchrun_starts_one_process_per_gpu_and_accepts_nccl_with_a_gpu_each(captured_launch, write):
    import course_lib

    specs = captured_launch(4)
    course_lib.torchrun(write("w.py", "print(1)\n"), backend="nccl")
    assert specs[0].nproc == 4 and "--nproc-per-node" in specs[0].argv
    assert specs[0].argv[specs[0].argv.index("--nproc-per-node") + 1] == "4"


def test_accelerate_launch_asks_for_the_cpu_only_with_fewer_gpus_than_processes(captured_launch, write):
    import course_lib

    script = write("w.py", "print(1)\n")
    specs = captured_launch(2)
    course_lib.accelerate_launch(script, nproc=2)
    assert "ACCELERATE_USE_CPU" not in specs[-1].env, f"2 GPUs for 2 processes, yet {specs[-1].env}"
    assert "--multi_gpu" in specs[-1].argv
    specs = captured_launch(1)
    course_lib.accelerate_launch(script, nproc=2)
    assert specs[-1].env.get("ACCELERATE_USE_CPU") == "1", f"1 GPU for 2 processes, yet {specs[-1].env}"


def test_the_interactive_ranks_join_nccl_on_their_own_gpu(monkeypatch):
    """course_lib.start_ranks' engine boot code, nccl branch: cuda:RANK, set_device first, device_id passed."""
    import torch
    import torch.distributed as dist

    from course_lib.cluster import ranks

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", str(device))))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append(
        ("init", backend, str(kw.get("device_id")))))
    for name, value in (("get_rank", 1), ("get_world_size", 2), ("get_backend", "nccl")):
        monkeypatch.setattr(dist, name, lambda value=value: value)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        # The boot code sets them in this process. setenv first so that monkeypatch records each one's
        # previous state (absent included) and undoes the boot code's values after the test; a bare
        # delenv(raising=False) of an absent name records nothing, and every later kernel and launch
        # would inherit RANK=1 of a world of 2 at port 29500.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    namespace = {}
    exec(ranks._BOOT.format(rank=1, world=2, port=29500, backend="nccl", timeout=10), namespace)
    assert calls == [("set_device", "cuda:1"), ("init", "nccl", "cuda:1")], calls
    assert namespace["_course_rank_info"]["device"] == "cuda:1"


# ------------------------------------------------------------------ the modules' CUDA branches, with CUDA faked


def _import_module_of(tmp_path, folder, stems, module):
    """Write the lesson's files that ``module`` imports into tmp_path and import it from there."""
    import importlib
    import sys

    for stem in stems:
        (tmp_path / f"{stem}.py").write_text(script_source(f"{folder}/{stem}.py"))
    sys.path.insert(0, str(tmp_path))
    try:
        for stem in stems:
            sys.modules.pop(stem, None)
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(tmp_path))


def test_lesson_08s_timing_runs_on_the_ranks_gpu_under_nccl_and_on_the_cpu_under_gloo(tmp_path, monkeypatch):
    import torch

    timing = _import_module_of(tmp_path, "runs/08_inside_ddp",
                               ["train_naive", "train_flat", "train_bucketed", "checks", "timing"], "timing")
    monkeypatch.setattr(timing.dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(timing.torch.cuda, "current_device", lambda: LOCAL_RANK)
    assert timing.rank_device() == torch.device("cuda", LOCAL_RANK)
    monkeypatch.setattr(timing.dist, "get_backend", lambda *a: "gloo")
    assert timing.rank_device() == torch.device("cpu")


def test_lesson_09s_cuda_peak_reads_the_allocators_peak_less_what_was_there_before(tmp_path, monkeypatch):
    import torch

    memory = _import_module_of(tmp_path, "runs/09_sharding", ["memory"], "memory")
    calls = []
    cuda = memory.torch.cuda
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: calls.append("synchronize"))
    monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: 1_000)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: 51_000)
    assert memory.cuda_peak_of_one_step("MyModel", "Adam", torch.device("cpu")) == 50_000
    assert calls == ["synchronize", "reset", "synchronize"]


def test_lesson_11s_actions_are_timed_once_the_gpu_has_computed_them(tmp_path, monkeypatch):
    import torch

    pipeline = _import_module_of(tmp_path, "runs/11_pipeline_parallel", ["pipeline"], "pipeline")
    waited = []

    class Stream:
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            waited.append(self.device)

    monkeypatch.setattr(pipeline.torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(pipeline.torch.cuda, "synchronize", lambda device=None: waited.append("the whole device"))
    gpu = torch.device("cuda", LOCAL_RANK)
    assert pipeline._now(gpu) > 0 and waited == [gpu], "the compute stream, not the transfers' streams, is waited for"
    pipeline._now(torch.device("cpu"))
    assert waited == [gpu], "a CPU is not synchronized"
