"""One lineage: every training script of lessons 02+ is a family's base plus marked regions, and every script
the course writes also starts with plain ``python`` (a world of one) the way its docstring says."""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.scripts import (LineageError, _raw_script_cells, check_lineage, compact, is_module, regions,
                                script_cells, script_source, splice)
from course_lib.scripts import LESSON_GLOB

ROOT = Path(__file__).resolve().parent.parent
# The three families' bases: raw DDP (lesson 02), Accelerate (lesson 05's port), the Trainer (lesson 06).
FAMILY_BASES = {"runs/02_ddp/train.py", "runs/05_accelerate/train.py", "runs/06_trainer/train.py"}
TRAINS = re.compile(r"DistributedDataParallel|DDP\(|Accelerator\(|Trainer\(|fully_shard\(")


def _cells(folders=("notebooks", "solutions", "exercises")):
    found = []
    for folder in folders:
        for notebook in sorted((ROOT / folder).glob(LESSON_GLOB)):
            for target, base, text in script_cells(notebook):
                found.append(pytest.param(notebook, target, base, text, id=f"{notebook.stem}:{target}"))
    return found


CELLS = _cells()
DERIVED = [c for c in CELLS if c.values[2] is not None]


def test_every_script_that_wraps_a_model_and_takes_epochs_is_held_to_the_family_rule():
    """The rule below exempts scripts without --epochs: they are modules (lesson 08's timing.py), none trains."""
    exempt = sorted(c.values[1] for c in CELLS if int(c.values[0].name[:2]) >= 2 and TRAINS.search(c.values[3])
                    and '"--epochs"' not in c.values[3])
    assert exempt and all(is_module(script_source(target)) for target in exempt), exempt  # nothing to run


def test_every_family_base_is_written_by_a_lesson():
    written = {c.values[1] for c in _cells(("notebooks",))}
    assert FAMILY_BASES <= written, f"missing family bases: {sorted(FAMILY_BASES - written)}"


@pytest.mark.parametrize("notebook,target,base,text", DERIVED)
def test_derived_script_is_its_base_plus_marked_regions(notebook, target, base, text):
    check_lineage(script_source(base), text, name=target, base_name=base)
    assert regions(text), f"{target} declares --base {base} but marks no region: write the base itself instead"


@pytest.mark.parametrize("notebook,target,base,text", CELLS)
def test_training_scripts_from_lesson_02_on_belong_to_a_family(notebook, target, base, text):
    """A training script wraps a model (DDP, Accelerate, the Trainer, FSDP) and takes --epochs; a module of helpers
    that a lesson's ranks import (lesson 08's checks.py and timing.py) trains nothing of its own."""
    lesson = int(notebook.name[:2])
    if lesson < 2 or not TRAINS.search(text) or '"--epochs"' not in text or target in FAMILY_BASES:
        return
    assert base is not None, (f"{notebook.name}: {target} trains a model but is no family's base plus regions; "
                              f"write it with %%write_script {target} --base <the family base or a script derived from it>")


def test_a_stray_line_outside_the_regions_is_refused():
    base = script_source("runs/02_ddp/train.py")
    derived = base.replace("torch.manual_seed(args.seed)", "torch.manual_seed(1)", 1)
    with pytest.raises(LineageError, match="outside every marked region"):
        check_lineage(base, derived)


def test_a_region_may_replace_base_lines_and_an_empty_region_removes_them():
    base = "a\nb\nc\nd\n"
    assert check_lineage(base, "a\n# >>> x: new b\nB\n# <<< x\nc\nd\n") is None
    assert check_lineage(base, "a\n# >>> x: no b or c\n# <<< x\nd\n") is None
    with pytest.raises(LineageError, match="leaves out"):
        check_lineage(base, "a\nc\nd\n")
    with pytest.raises(LineageError, match="never closed"):
        check_lineage(base, "a\n# >>> x: open\nb\nc\nd\n")


BASE = "a\nb\nc\nd\ne\n"


@pytest.mark.parametrize("cell,written", [
    ("# ...\n", BASE),  # everything kept
    ("a\n# ...\ne\n", BASE),
    ("# ...\nb\n# >>> x: new c\nC\n# <<< x\nd\n# ...\n", None),  # a region replaces the lines between its neighbours
    ("# ...\nb\n# >>> x: after b\nX\n# <<< x\n# ...\n", "a\nb\n# >>> x: after b\nX\n# <<< x\nc\nd\ne\n"),
    ("# ...\n# >>> x: before d\nX\n# <<< x\nd\n# ...\n", "a\nb\nc\n# >>> x: before d\nX\n# <<< x\nd\ne\n"),
    ("# ...\nd\n# >>> x: no e\n# <<< x\n", "a\nb\nc\nd\n# >>> x: no e\n# <<< x\n"),
])
def test_a_cell_holds_its_regions_and_the_base_fills_in_the_rest(cell, written):
    written = written or "a\nb\n# >>> x: new c\nC\n# <<< x\nd\ne\n"
    assert splice(BASE, cell) == written
    check_lineage(BASE, written)


@pytest.mark.parametrize("cell,message", [
    ("# ...\nz\n# ...\n", "not in its base"),  # a line outside the regions that the base does not have
    ("a\nc\n# ...\n", "not in its base right after"),  # the base's b is neither kept nor replaced
    ("# ...\n# >>> x: where?\nX\n# <<< x\n# ...\n", "nothing says where"),
    ("a\n# ...\nd\n", "leaves out lines 5-5"),  # the end of the base, dropped without a region
])
def test_a_cell_that_does_not_say_where_its_lines_go_is_refused_with_the_fix(cell, message):
    with pytest.raises(LineageError, match=message):
        splice(BASE, cell)


def test_a_complete_script_in_a_cell_is_written_as_it_is():
    assert splice(BASE, "a\n# >>> x: new b\nB\n# <<< x\nc\nd\ne\n") == "a\n# >>> x: new b\nB\n# <<< x\nc\nd\ne\n"


@pytest.mark.parametrize("notebook,target,base,text", DERIVED)
def test_every_derived_script_of_the_course_can_be_held_as_its_regions(notebook, target, base, text):
    """compact() then splice() gives back the complete script, for every derived script the course writes."""
    base_text = script_source(base)
    cell = compact(base_text, text)
    assert splice(base_text, cell) == text
    assert cell.count("\n") < text.count("\n"), f"{target}: holding only its regions saves nothing"


LESSON_DERIVED = [c for c in DERIVED if c.values[0].parent.name == "notebooks"]


@pytest.mark.parametrize("notebook,target,base,text", [c for c in DERIVED if c.values[0].parent.name != "exercises"])
def test_a_derived_cell_holds_its_regions_not_its_base(notebook, target, base, text):
    """The cell a learner reads is the compact form: regions, a base line beside each, and '# ...' (the lessons and
    the solutions; the exercises are made from the solutions)."""
    own = dict((t, body) for t, _, body in _raw_script_cells(notebook))[target]
    assert own == compact(script_source(base), text), (
        f"{notebook.name}: the cell writing {target} repeats lines of {base}; hold only the regions "
        "(course_lib.scripts.compact gives the cell's text)")


@pytest.mark.parametrize("base_name, comment, least, anchor", [
    ("runs/02_ddp/train.py", "# a reader sees the old file or the new one", 5, True),  # lesson 02's atomic save
    ("runs/05_accelerate/train.py", "# DDP all-reduces (averages) the gradients here", 2, False),  # in a region
], ids=["02-base", "05-base-derived-in-turn"])
def test_a_comment_edited_once_in_a_base_reaches_every_script_derived_from_it(base_name, comment, least, anchor):
    """A comment edited in the base's cell only: every lesson script derived from that base has the edited line.
    Lesson 05's train.py is itself derived (from 02's), and its comment sits inside one of its own `accelerate`
    regions, which no cell holds; 02's line is one a cell may hold as the anchor of a region placed after it (04a's
    `fail`), where its comment need not match."""
    base = script_source(base_name)
    line = next(text for text in base.splitlines() if comment in text)
    edited = base.replace(line, line + " (edited)")
    followers = 0
    for param in LESSON_DERIVED:
        notebook, target, of, text = param.values
        if of == base_name and line in text.splitlines():
            own = dict((t, body) for t, _, body in _raw_script_cells(notebook))[target]
            assert anchor or line not in own.splitlines(), f"{notebook.name}: the cell writing {target} repeats it"
            written = splice(edited, own, name=target)  # the cell itself is not edited
            check_lineage(edited, written, name=target)
            assert line + " (edited)" in written.splitlines(), target
            followers += 1
    assert followers >= least, f"only {followers} lesson scripts keep {base_name}'s line {comment!r}"


def test_a_line_of_code_changed_in_the_base_is_named_where_a_cell_holds_it():
    """Code (not a comment) is matched exactly: a cell holding the old line is refused, naming it."""
    base = "a = 1  # one\nb = 2\nc = 3\n"
    cell = "a = 1  # one\n# >>> x: new b\nb = 20\n# <<< x\nc = 3\n# ...\n"
    assert splice(base, cell).startswith("a = 1  # one\n")
    assert splice(base.replace("# one", "# the first"), cell).startswith("a = 1  # the first\n")
    with pytest.raises(LineageError, match="a = 1"):
        splice(base.replace("a = 1", "a = 10"), cell)


# A base that is itself derived: it carries regions of its own (lesson 05's train.py and its `accelerate` regions).
DERIVED_BASE = "a\n# >>> acc: the base's region\nB\n# <<< acc\nc\n# >>> acc: another\nD\n# <<< acc\ne\n"


def test_a_cell_anchors_its_region_on_a_marker_of_its_base_without_repeating_the_bases_region():
    cell = "# ...\n# <<< acc\n# >>> mine: after the base's first region\nX\n# <<< mine\nc\n# ...\n"
    written = splice(DERIVED_BASE, cell)
    assert written == DERIVED_BASE.replace("# <<< acc\nc\n", "# <<< acc\n# >>> mine: after the base's first region\nX\n"
                                                         "# <<< mine\nc\n", 1)
    check_lineage(DERIVED_BASE, written)
    held = compact(DERIVED_BASE, written)
    assert splice(DERIVED_BASE, held) == written and "B" not in held.splitlines(), held


def test_a_region_of_the_cell_replaces_the_bases_region_of_that_name_even_with_the_same_first_line():
    """A marked block that is not the base's word for word is the cell's own, whatever its first line."""
    cell = "a\n# >>> acc: the base's region\nB2\n# <<< acc\nc\n# ...\n"
    assert splice(DERIVED_BASE, cell) == DERIVED_BASE.replace("\nB\n", "\nB2\n")
    with pytest.raises(LineageError, match="never closed"):
        splice(DERIVED_BASE, "a\n# >>> own: opened\nB2\n# ...\n")


def _plain_command(text: str) -> list[str] | None:
    for line in text.splitlines():
        if line.strip().startswith("python "):
            return shlex.split(line.strip())[1:]
    return None


PLAIN = [c for c in _cells(("notebooks", "solutions"))]


def _plain_env(mirror: Path) -> dict[str, str]:
    """A shell's environment, not a launcher's: no rank variables, one thread, the MNIST mirror, course_lib importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", COURSE_MNIST_MIRROR=str(mirror), PYTHONPATH=str(ROOT))
    return env


def _plain_job(tree: Path, notebook: Path, target: str, text: str) -> tuple[list[str] | None, dict | None]:
    """The docstring's ``python`` command of a script, and how to run it: in its notebook's folder, as ``python``
    would (the script's folder first on sys.path); for a module (no ``__main__``), ``import`` in its own folder."""
    if is_module(text):
        command = [target, "-c", f"import {Path(target).stem}"]
        return command, {"cwd": str(tree / notebook.parent.name / Path(target).parent), "import": Path(target).stem,
                         "argv": ["-c"], "path": ""}
    command = _plain_command(text)
    if not command or command[0] != target:
        return command, None
    script = tree / notebook.parent.name / target
    return command, {"cwd": str(tree / notebook.parent.name), "script": str(script), "argv": command,
                     "path": str(script.parent)}


#: Runs every job of ``plain_runs`` as ``python SCRIPT ARGS`` would, in a child forked from one process that has
#: already imported torch, torchvision, Accelerate and Transformers: each child starts where a fresh interpreter
#: would be after those imports (each script's own imports still run; the launches in the notebooks' tests start
#: every script in a fresh interpreter). A lesson's jobs run in order, two lessons' at a time; each child's exit
#: code is what ``python`` gives (an uncaught exception prints its traceback and gives 1; ``sys.exit("...")``
#: prints the message and gives 1). Prints {key: exit code} as JSON.
PLAIN_RUNNER = """
import atexit, importlib, json, os, runpy, signal, sys, time, traceback
import torch, torchvision  # noqa: F401  the start every script pays, paid once
try:
    import accelerate, transformers, transformers.trainer  # noqa: F401
except ImportError:
    pass
lessons, slots = json.loads(sys.argv[1]), int(sys.argv[2])


def child(job):
    os.chdir(job["cwd"])
    for fd, name in ((1, "out"), (2, "err")):
        os.dup2(os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv, sys.path[0] = job["argv"], job["path"]
    importlib.invalidate_caches()
    code = 0
    try:
        if "import" in job:
            importlib.import_module(job["import"])
        else:
            runpy.run_path(job["script"], run_name="__main__")
    except SystemExit as exit:
        if isinstance(exit.code, int) or exit.code is None:
            code = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)


found, running, queues = {}, {}, [list(jobs) for jobs in lessons]
while any(queues) or running:
    for queue in queues:
        busy = {lesson for lesson, _, _ in running.values()}
        if queue and len(running) < slots and id(queue) not in busy:
            job = queue.pop(0)
            pid = os.fork()
            if pid == 0:
                try:
                    child(job)
                finally:  # a child never returns into this loop, whatever failed before its script ran
                    os._exit(1)
            running[pid] = (id(queue), job["key"], time.monotonic())
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid:
        _, key, _ = running.pop(pid)
        found[key] = os.waitstatus_to_exitcode(status)
        continue
    for pid, (_, key, began) in running.items():
        if time.monotonic() - began > 600:
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.02)
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory, mirror):
    """Every script the lessons and solutions write, laid out as the notebooks' folders hold them, each run once
    with plain python (``PLAIN_RUNNER``). A notebook's scripts run in its order (an evaluation reads the checkpoint
    its training wrote, and a lesson's later part may evaluate what its first part trained: a lesson's parts run in
    order); two lessons at a time, on the machine's cores."""
    tree = tmp_path_factory.mktemp("course")
    logs = tmp_path_factory.mktemp("plain-logs")
    by_lesson: dict[tuple[str, str], list] = {}
    commands = {}
    for index, param in enumerate(PLAIN):
        notebook, target, _, text = param.values
        path = tree / notebook.parent.name / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        command, job = _plain_job(tree, notebook, target, text)
        commands[(notebook, target)] = command
        if job is not None:
            key = str(index)
            job.update(key=key, out=str(logs / f"{key}.out"), err=str(logs / f"{key}.err"))
            by_lesson.setdefault((notebook.parent.name, notebook.stem[:2]), []).append(job)
    done = subprocess.run([sys.executable, "-c", PLAIN_RUNNER, json.dumps(list(by_lesson.values())),
                           str(max(1, min(2, os.cpu_count() or 1)))], cwd=tree, env=_plain_env(mirror),
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    runs = {}
    for index, param in enumerate(PLAIN):
        notebook, target = param.values[:2]
        key = str(index)
        ran = None
        if key in codes:
            ran = subprocess.CompletedProcess(commands[(notebook, target)], codes[key],
                                              (logs / f"{key}.out").read_text(), (logs / f"{key}.err").read_text())
        runs[(notebook, target)] = commands[(notebook, target)], ran
    return runs


@pytest.mark.parametrize("notebook,target,base,text", PLAIN)
def test_script_starts_with_plain_python_as_its_docstring_says(notebook, target, base, text, plain_runs):
    command, done = plain_runs[(notebook, target)]
    assert command, f"{target}: its docstring names no `python {target} ...` command (a world of one process)"
    assert command[0] == target, f"{target}: the docstring's python command runs {command[0]}, not this script"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        assert "torchrun" in last and "Traceback" not in done.stderr, (
            f"{target} failed under plain python with no one-line reason naming torchrun:\n{done.stderr[-3000:]}")


MAX_STEPS = [c for c in PLAIN if '"--max-steps"' in c.values[3]]


def test_every_training_script_with_max_steps_is_checked_for_zero():
    assert len(MAX_STEPS) >= 30, f"only {len(MAX_STEPS)} scripts take --max-steps; the parametrized test below lost some"


#: Runs each script given on its command line in this one process, as ``python SCRIPT --max-steps 0 ...`` would
#: (its folder first on sys.path, its ``__main__`` part run), and prints {target: [exit code, stderr]} as JSON: one
#: start of Python and torch for all of them instead of one each.
ZERO_STEPS_RUNNER = """
import contextlib, io, json, runpy, sys
found = {}
for target, path, run_dir, checkpoint in json.loads(sys.argv[1]):
    sys.argv = [path, *([checkpoint] if checkpoint else []), "--max-steps", "0", "--run-dir", run_dir]
    sys.path.insert(0, path.rsplit("/", 1)[0])
    err, code = io.StringIO(), 0
    try:
        with contextlib.redirect_stderr(err):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException as error:
        code, err = 1, io.StringIO(err.getvalue() + f"{type(error).__name__}: {error}")
    sys.path.pop(0)
    found[target] = [code, err.getvalue()]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def zero_steps(tmp_path_factory, mirror):
    """Every script that takes --max-steps, run with ``--max-steps 0`` (each with a run folder of its own)."""
    tree = tmp_path_factory.mktemp("zero-steps")
    jobs = []
    for index, param in enumerate(MAX_STEPS):
        _, target, _, text = param.values
        path = tree / str(index) / target
        path.parent.mkdir(parents=True)
        path.write_text(text)
        checkpoint = str(tree / "missing.pt") if "checkpoint\", type=Path" in text else None  # evaluation scripts
        jobs.append((f"{index}:{target}", str(path), str(tree / str(index) / "run"), checkpoint))
    env = _plain_env(mirror)
    done = subprocess.run([sys.executable, "-c", ZERO_STEPS_RUNNER, json.dumps(jobs)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {(param.values[1], index): found[f"{index}:{param.values[1]}"] + [tree / str(index) / "run"]
            for index, param in enumerate(MAX_STEPS)}


@pytest.mark.parametrize("index,notebook,target,base,text",
                         [pytest.param(i, *c.values, id=c.id) for i, c in enumerate(MAX_STEPS)])
def test_max_steps_zero_is_refused_before_any_training(index, notebook, target, base, text, zero_steps):
    """``--max-steps 0`` once trained whole epochs (the check ``steps == max_steps`` never held); now argparse
    refuses it, with the fix, before a process group or the data is touched."""
    code, stderr, run_dir = zero_steps[(target, index)]
    assert code == 2, f"{target} --max-steps 0 exited {code}:\n{stderr[-2000:]}"
    assert "--max-steps: 0 is not a number of steps: give 1 or more" in stderr, stderr[-2000:]
    assert not (run_dir / "metrics.jsonl").exists()
