"""Grade submitted exercise notebooks: run each headlessly, record every task's check.

``python -m course_lib grade SUBMISSIONS... --out grades.csv``

Each submission is graded in its own temporary folder (a submission that deletes files deletes only its
copy) by a worker process, with a per-cell and a whole-notebook timeout; when time is up the worker and
everything it launched are killed. The check cells (tagged ``{"course": {"task": ...}}``) and the parameters
cell come from the released exercise of the same name; no other cell of the submission keeps a mark that would
make the worker run it (``prepare``). The submission's own cells then run
in a sandbox process (``sandbox.py``); cells that fail do not stop the run. Each check runs in the worker,
which the submission's code never runs in, and reaches the submission's functions and classes only through
``sandbox.Remote`` (plain data back); the worker reports to the grader through a pipe only it holds.

A task is ``passed`` when its check cell ran without error, ``not attempted`` when its code or its
check raised ``NotImplementedError`` (the exercise's placeholder), and ``failed`` otherwise, with the
check's message (or the error, or the timeout) recorded.
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .exercises import EXERCISES, ROOT
from .notebooks import INJECTED_TAG, fast_parameters, inject_parameters, parameters_index
from ..processes import start as start_process
from ..processes import release, stop_tree

PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"
NOT_ATTEMPTED_ERRORS = {"NotImplementedError", "NotAttempted"}
CELL_TIMEOUT = 300
NOTEBOOK_TIMEOUT = 1200
MESSAGE_LIMIT = 1500  # characters of a check's message kept (outputs of megabytes are cut)
CSV_FIELDS = ["submission", "notebook", "task", "status", "points", "message", "seconds"]


@dataclass
class TaskResult:
    task: str
    status: str
    message: str = ""
    max_points: float = 1.0  # the check cell's nbgrader points

    @property
    def points(self) -> float:
        return self.max_points if self.status == PASSED else 0.0


@dataclass
class Grade:
    """One submission's result: a row per task, its time, and a note when the run itself broke."""

    submission: str
    notebook: str
    tasks: list[TaskResult] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""

    @property
    def passed(self) -> int:
        return sum(t.status == PASSED for t in self.tasks)

    @property
    def points(self) -> float:
        return sum(t.points for t in self.tasks)

    @property
    def max_points(self) -> float:
        return sum(t.max_points for t in self.tasks)

    @property
    def score(self) -> float:
        """Points earned over points possible, each task weighted by its check cell's nbgrader points."""
        return self.points / self.max_points if self.max_points else 0.0


def task_of(cell) -> str | None:
    """The task a check cell grades: its ``course.task``, or the ``grade_id`` of an nbgrader test cell."""
    meta = cell.get("metadata", {})
    nbgrader = meta.get("nbgrader", {})
    autograded_test = nbgrader.get("grade") and not nbgrader.get("solution")
    return meta.get("course", {}).get("task") or (nbgrader.get("grade_id") if autograded_test else None)


def points_of(cell) -> float:
    """What a check cell is worth: its nbgrader ``points`` (the same number ``nbgrader autograde`` uses), else 1."""
    return float(cell.get("metadata", {}).get("nbgrader", {}).get("points", 1))


def _cap(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit // 3] + "\n[...]\n" + text[-(2 * limit) // 3:]


# --- preparing a submission ----------------------------------------------------------------------


TRUST_TAGS = {"parameters", INJECTED_TAG}  # tags of the cells the worker itself runs


class NoRelease(ValueError):
    """A submission with no released exercise of its name: nothing says which of its cells are checks."""


def untrusted(cell):
    """A copy of a submission's cell without any mark that would make the worker run it: no task, no nbgrader
    grade, no ``parameters`` or injected-parameters tag. It then runs in the sandbox, as every learner cell does."""
    cell = copy.deepcopy(cell)
    meta = cell.setdefault("metadata", {})
    meta.pop("nbgrader", None)
    if isinstance(meta.get("course"), dict):
        meta["course"].pop("task", None)
    else:
        meta.pop("course", None)
    if "tags" in meta:
        meta["tags"] = [tag for tag in meta["tags"] if tag not in TRUST_TAGS]
    return cell


def _released_trusted(original) -> list:
    """The release's cells that the worker runs: its check cells and its parameters cell."""
    index = parameters_index(original)
    return [c for i, c in enumerate(original.cells)
            if c.cell_type == "code" and (task_of(c) or i == index)]


def prepare(submission: Path, source_dir: Path | None = EXERCISES):
    """The notebook to run and the tasks to grade with their points, taken from the released exercise.

    Every cell the worker runs (the checks, the parameters cell) is a copy of the release's, put where the
    submission has the cell of the same id (or, when ids changed, of the same task); each is used once. Every other
    cell of the submission loses its task, grade and parameter marks, whatever its metadata says, so extra,
    duplicated or re-tagged cells run in the sandbox and nowhere else. ``source_dir=None`` trusts the submission's
    own marks: only for notebooks one wrote oneself (the tests' tiny exercises), never for students' work.
    """
    nb = nbformat.read(submission, as_version=4)
    if source_dir is None:
        tasks = {task_of(c): points_of(c) for c in nb.cells if c.cell_type == "code" and task_of(c)}
    else:
        released = Path(source_dir) / submission.name
        if not released.is_file():
            raise NoRelease(f"no released exercise {released}: the grader takes the checks from it. Name the "
                            "folder of the released notebooks with --source, or keep the submission's file name.")
        original = nbformat.read(released, as_version=4)
        trusted = _released_trusted(original)
        by_id = {c.get("id"): c for c in trusted}
        by_task = {task_of(c): c for c in trusted if task_of(c)}
        params = original.cells[parameters_index(original)] if parameters_index(original) is not None else None
        chosen: dict[int, object] = {}  # submission cell index -> the release's cell that takes its place
        for i, cell in enumerate(nb.cells):  # by id first: where the released cell was handed out
            source = by_id.get(cell.get("id"))
            if source is not None and source not in chosen.values():
                chosen[i] = source
        for i, cell in enumerate(nb.cells):  # then by task or tag, for a release cell whose id the notebook lost
            if i in chosen or cell.cell_type != "code":
                continue
            tags = cell.get("metadata", {}).get("tags", [])
            source = by_task.get(task_of(cell)) or (params if "parameters" in tags else None)
            if source is not None and source.get("id") not in {c.get("id") for c in nb.cells} \
                    and source not in chosen.values():
                chosen[i] = source
        cells = [copy.deepcopy(chosen[i]) if i in chosen else untrusted(c) for i, c in enumerate(nb.cells)]
        placed = {id(c) for c in chosen.values()}
        if params is not None and id(params) not in placed:  # deleted by the learner: the checks need its values
            cells.insert(0, copy.deepcopy(params))
        nb.cells = cells
        tasks = {task: points_of(cell) for task, cell in by_task.items()}
        # The settings the checks launch with (processes, steps) are the release's too.
        nb.metadata.setdefault("course", {})["fast_parameters"] = \
            original.metadata.get("course", {}).get("fast_parameters", {})
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    # The notebook's own fast settings, injected the way the tests inject them.
    return inject_parameters(nb, fast_parameters(nb), by="the grader", missing_ok=True), tasks


# --- the worker: runs one notebook, reports each cell as it finishes -----------------------------


def _trusted_cells(nb) -> set[int]:
    """The cells the judge itself runs: the parameters cell and the injected fast settings (from the release)."""
    found = set()
    for i, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.cell_type == "code" and ("parameters" in tags or INJECTED_TAG in tags):
            found.add(i)
    return found


class _CheckNames(dict):
    """A check cell's names: the trusted ones, Python's builtins, and otherwise what the submission defined."""

    def __init__(self, sandbox, trusted: dict):
        super().__init__(trusted)
        self.sandbox = sandbox

    def __missing__(self, name):
        import builtins

        if hasattr(builtins, name):
            raise KeyError(name)  # lookup goes on to the builtins
        value = self.sandbox.remote(name)  # NameError (as a notebook would raise) when the submission has none
        self[name] = value
        return value


def run_worker(notebook: Path, results_fd: int, cell_timeout: float, jail: dict | None = None) -> int:
    """Judge every task of ``notebook``, writing one JSON line per cell to the pipe ``results_fd``.

    The submission's cells run in a sandbox process; each check cell runs here, in this process, with the
    trusted ``checks`` and the release's parameters, and reaches the submission's definitions only through
    ``sandbox.Remote`` (plain data back). Nothing the submission runs can write to ``results_fd``. With ``jail``
    (``user``, ``hide``, ``home``), the sandbox and every process this worker starts (the checks' launches of the
    learner's scripts) run as that user, with those folders hidden (``jail.py``).
    """
    import contextlib
    import io as _io

    import course_lib
    # Everything the checks import later is imported now, before any submission code runs.
    import course_lib.data  # noqa: F401
    import course_lib.launch  # noqa: F401
    import course_lib.metrics  # noqa: F401
    import course_lib.model  # noqa: F401

    from .. import processes
    from . import checks as trusted_checks
    from .sandbox import LearnerCodeError, Sandbox, SandboxGone

    if jail is not None:
        processes.WRAPPER = [sys.executable, "-I", "-m", "course_lib.teaching.jail", "--user", jail["user"],
                             "--home", jail["home"], *[a for folder in jail["hide"] for a in ("--hide", folder)], "--"]

    nb = nbformat.read(notebook, as_version=4)
    code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    check_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and task_of(c)]
    trusted = _trusted_cells(nb)
    sandbox = Sandbox([(i, src) for i, src in code if i not in check_cells], notebook.parent, cell_timeout,
                      log=notebook.parent.parent / "sandbox.log", jail=jail)
    names = _CheckNames(sandbox, {"checks": trusted_checks, "course_lib": course_lib})
    for i in sorted(trusted):
        exec(compile(nb.cells[i].source, f"<cell {i}>", "exec"), {"__builtins__": __builtins__}, names)
    out = os.fdopen(results_fd, "w", buffering=1)
    written = set()

    def emit(record: dict) -> None:
        out.write(json.dumps(record) + "\n")

    try:
        for index in check_cells:
            sandbox.run_until(index)
            for i, record in sorted(sandbox.records.items()):
                if i not in written:
                    emit(record)
                    written.add(i)
            start = time.monotonic()
            printed = _io.StringIO()
            ename = evalue = ""
            try:
                with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                    exec(compile(nb.cells[index].source, f"<check cell {index}>", "exec"),
                         {"__builtins__": __builtins__}, names)
            except SandboxGone as exc:
                ename = "CellTimeout" if "longer than" in str(exc) else "DeadKernel"
                evalue = str(exc)
            except LearnerCodeError as exc:
                ename, evalue = "LearnerCodeError", str(exc)
            except Exception as exc:  # the check's verdict (CheckFailed, NotAttempted) or the submission's error
                ename, evalue = type(exc).__name__, str(exc)
            emit({"index": index, "ename": ename, "evalue": _cap(evalue), "output": _cap(printed.getvalue(), 600),
                  "seconds": round(time.monotonic() - start, 1)})
    finally:
        sandbox.close()
        out.close()
    return 0


# --- grading -------------------------------------------------------------------------------------


def _read_all(fd: int, into: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as stream:
        for chunk in iter(lambda: stream.read(65536), b""):
            into.append(chunk)


def _parse_records(text: str) -> dict[int, dict]:
    records = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short when the worker was killed
        records[record["index"]] = record
    return records


def classify(nb, tasks: dict[str, float], records: dict[int, dict], why_stopped: str = "") -> list[TaskResult]:
    """Each task's status from the cells' records: its own cells (since the previous check) and its check."""
    results = {}
    first = 0
    for index, cell in enumerate(nb.cells):
        task = task_of(cell) if cell.cell_type == "code" else None
        if task is None:
            continue
        own = [records[i] for i in range(first, index) if i in records and records[i].get("ename")]
        check = records.get(index)
        first = index + 1
        if task not in tasks or task in results:
            continue
        if any(r["ename"] in NOT_ATTEMPTED_ERRORS for r in own) or (check and check.get("ename") in NOT_ATTEMPTED_ERRORS):
            results[task] = TaskResult(task, NOT_ATTEMPTED, _cap((check or {}).get("evalue", "")) or "NotImplementedError")
        elif check is None:
            results[task] = TaskResult(task, FAILED, f"its check did not run: {why_stopped or 'an earlier cell stopped the run'}")
        elif not check.get("ename"):
            results[task] = TaskResult(task, PASSED, "")
        else:
            timeouts = [r for r in own if r["ename"] == "CellTimeout"]
            if check["ename"] == "CellTimeout" or timeouts:
                message = f"timed out: {(timeouts or [check])[0]['evalue']}"
            else:
                message = f"{check['ename']}: {check['evalue']}"
            results[task] = TaskResult(task, FAILED, _cap(message))
    graded = [results.get(t) or TaskResult(t, FAILED, "its check cell is missing from the submission") for t in tasks]
    for result in graded:
        result.max_points = tasks[result.task]
    return graded


def default_sandbox_user() -> str | None:
    """The user submissions run as: ``nobody`` when the grader runs as root on Linux, else None (the grader's own)."""
    from .jail import unavailable

    return None if unavailable("nobody") else "nobody"


def _hidden_folders(submissions, keep) -> list[str]:
    """What a submission may not see: ``solutions/`` and the folders the graded submissions lie in, except folders
    that hold something it needs (the repository, the Python environment, its own working folder)."""
    needed = [Path(p).resolve() for p in keep]
    folders = {ROOT / "solutions", *(Path(s).resolve().parent for s in submissions)}
    return sorted(str(f) for f in folders
                  if f.is_dir() and not any(f == n or f in n.parents for n in needed))


def _end_processes_of(uid: int, since: float) -> int:
    """End every process of ``uid`` started since ``since`` (epoch seconds): whatever a submission left running,
    detached or not. The sandbox's user should be one that runs nothing else (see docs/instructors.md)."""
    import psutil

    left = []
    for proc in psutil.process_iter(["uids", "create_time"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real == uid and proc.info["create_time"] >= since - 1:
                left.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=5)
    return len(left)


def grade(submission, source_dir: Path | None = EXERCISES, cell_timeout: float = CELL_TIMEOUT,
          timeout: float = NOTEBOOK_TIMEOUT, quiet: bool = False, sandbox_user: str | None = "default",
          others=()) -> Grade:
    """Run one submitted notebook and grade its tasks.

    ``sandbox_user``: the user the submission's code runs as (``"default"``: ``nobody`` when the grader is root,
    else the grader's own user, unprotected); ``others``: the other submissions of this grading, hidden from it.
    """
    import pwd

    from .jail import unavailable

    if sandbox_user == "default":
        sandbox_user = default_sandbox_user()
    if sandbox_user is not None and unavailable(sandbox_user):
        raise ValueError(f"cannot run submissions as {sandbox_user!r}: {unavailable(sandbox_user)}")
    submission = Path(submission)
    result = Grade(str(submission), submission.name)
    start = time.monotonic()
    try:
        nb, tasks = prepare(submission, source_dir)
    except Exception as exc:  # no release to grade it by, not a notebook, unreadable JSON, ...
        result.note = str(exc) if isinstance(exc, NoRelease) else \
            f"could not read the notebook: {type(exc).__name__}: {exc}"
        released = Path(source_dir) / submission.name if source_dir else None
        if released is not None and released.is_file():
            cells = [c for c in nbformat.read(released, as_version=4).cells if task_of(c)]
            result.tasks = [TaskResult(task_of(c), FAILED, result.note, points_of(c)) for c in cells]
        if not quiet:
            print(f"{submission}: {result.note}", flush=True)
        return result
    # The submission runs in base/submission/; what the grader keeps lies beside it, out of its reach.
    base = Path(tempfile.mkdtemp(prefix="course-grade-"))
    workdir = base / "submission"
    workdir.mkdir()
    jail_args = []
    began = time.time()
    try:
        notebook = workdir / submission.name
        nbformat.write(nb, notebook)
        if sandbox_user is not None:  # its folder is its own; the grader's files beside it are not readable
            entry = pwd.getpwnam(sandbox_user)
            for path in (workdir, notebook):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            os.chmod(base, 0o711)
            hidden = _hidden_folders([submission, *others], keep=[ROOT, sys.prefix, base, EXERCISES])
            jail_args = ["--jail-user", sandbox_user, "--jail-home", str(workdir),
                         *[a for folder in hidden for a in ("--jail-hide", folder)]]
        read_end, write_end = os.pipe()  # only the worker holds the write end: no file a submission could forge
        log = open(base / "worker.log", "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
        # Its own session, and a guard that ends it, its kernel and their runs if the grader is killed. -I: no
        # PYTHONPATH, no user site, and not the working folder on sys.path, where a submission could plant modules.
        worker = start_process(
            [sys.executable, "-I", "-m", "course_lib.teaching.grading", "--worker", str(notebook), str(write_end),
             "--cell-timeout", str(cell_timeout), *jail_args], env=env, cwd=workdir, log=log, pass_fds=(write_end,))
        os.close(write_end)
        received: list[bytes] = []
        reader = threading.Thread(target=_read_all, args=(read_end, received), daemon=True)
        reader.start()
        why = ""
        try:
            worker.wait(timeout=timeout)
            if worker.returncode != 0:
                why = f"the grading worker exited with code {worker.returncode}"
        except subprocess.TimeoutExpired:
            why = f"the notebook ran longer than {timeout:.0f}s in total and was stopped"
        finally:  # also on Ctrl-C: nothing of the submission's run is left
            if worker.poll() is None:
                stop_tree(worker.pid, grace=3.0)
                worker.wait()
            release(worker)
            log.close()
            if sandbox_user is not None:  # detached or not, nothing the submission started outlives its grading
                _end_processes_of(pwd.getpwnam(sandbox_user).pw_uid, began)
        reader.join(timeout=10)
        records = _parse_records(b"".join(received).decode(errors="replace"))
        if not records and worker.returncode:
            tail = (base / "worker.log").read_text(errors="replace")[-MESSAGE_LIMIT:]
            why = f"{why}: {tail}"
        died = [r for r in records.values() if r.get("ename") == "DeadKernel"]
        if died and not why:
            why = f"the submission's process ended in cell {died[0]['index']}"
        result.tasks = classify(nb, tasks, records, why)
        result.note = why
    finally:
        result.seconds = time.monotonic() - start
        shutil.rmtree(base, ignore_errors=True)
    if not quiet:
        print(f"{submission}: {result.passed}/{len(result.tasks)} tasks passed in {result.seconds:.0f}s"
              + (f" ({result.note})" if result.note else ""), flush=True)
    return result


def snapshot(folders) -> dict[str, str]:
    """SHA-256 of every Python file and notebook under ``folders`` (the grader's package, the releases)."""
    import hashlib

    found = {}
    for folder in map(Path, folders):
        for path in sorted([*folder.rglob("*.py"), *folder.rglob("*.ipynb")]):
            if "__pycache__" not in path.parts and ".ipynb_checkpoints" not in path.parts:
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def changed_files(before: dict[str, str], folders) -> list[str]:
    """The files of the snapshot ``before`` of ``folders`` that are now different, gone, or new."""
    after = snapshot(folders)
    return sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))


def find_submissions(paths) -> list[Path]:
    """Notebooks named directly, and every ``*.ipynb`` under folders named (checkpoints skipped)."""
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        else:
            found.append(path)
    return found


def write_csv(grades: list[Grade], out) -> None:
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for g in grades:
            for t in g.tasks:
                writer.writerow({"submission": g.submission, "notebook": g.notebook, "task": t.task,
                                 "status": t.status, "points": f"{t.points:g}",
                                 "message": t.message, "seconds": f"{g.seconds:.1f}"})


def summary_table(grades: list[Grade]) -> str:
    """One line per submission: score, time, and every task's status."""
    short = {PASSED: "ok", FAILED: "FAIL", NOT_ATTEMPTED: "--"}
    rows = [("submission", "points", "seconds", "tasks (ok passed, FAIL failed, -- not attempted)")]
    for g in grades:
        rows.append((g.submission, f"{g.points:g}/{g.max_points:g} ({100 * g.score:.0f}%)", f"{g.seconds:.0f}",
                     "  ".join(f"{t.task} {short[t.status]}" for t in g.tasks) or g.note))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def cli(argv: list[str]) -> int:
    """``python -m course_lib grade SUBMISSIONS... --out grades.csv``."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib grade",
        description="Run submitted exercise notebooks headlessly and grade each task (passed / failed / not attempted).")
    parser.add_argument("submissions", nargs="+", help="notebooks, or folders searched for *.ipynb")
    parser.add_argument("--out", default="grades.csv", help="CSV file to write, one row per task (default grades.csv)")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT, help="seconds per cell (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=NOTEBOOK_TIMEOUT,
                        help="seconds per notebook in total (default %(default)s)")
    parser.add_argument("--source", type=Path, default=EXERCISES,
                        help="released exercise notebooks whose check cells and task lists are authoritative "
                             "(default: the repository's exercises/)")
    parser.add_argument("--sandbox-user", default="default",
                        help="the user the submissions' code runs as (default: nobody, when run as root on Linux; "
                             "better, a user of its own: useradd --system --no-create-home course-sandbox)")
    args = parser.parse_args(argv)
    submissions = find_submissions(args.submissions)
    missing = [p for p in submissions if not p.is_file()]
    if missing or not submissions:
        print(f"No such notebook(s): {', '.join(map(str, missing)) or 'none given'}", file=sys.stderr)
        return 2
    from .jail import unavailable

    chosen = {"default": default_sandbox_user(), "none": None}
    user = chosen.get(args.sandbox_user, args.sandbox_user)
    if user is not None and unavailable(user):
        print(f"error: cannot run the submissions as {user!r}: {unavailable(user)}", file=sys.stderr)
        return 2
    if user is None:
        why = "--sandbox-user none was given" if args.sandbox_user == "none" else unavailable("nobody")
        print(f"warning: {why}. The submissions' code runs as this user: it can read solutions/ and the other "
              "submissions, and write what this user can write. Run the grader as root (sudo) so that it runs them "
              "as an unprivileged user (docs/instructors.md).", file=sys.stderr)
    else:
        print(f"The submissions' code runs as {user!r}, without solutions/ or the other submissions in sight.")
    # The grader's own code and the releases, as they were before any submission ran: checked again after each one.
    watched = [Path(__file__).resolve().parent.parent, args.source]  # course_lib/ and the releases
    trusted = snapshot(watched)
    grades = []
    for path in submissions:
        grades.append(grade(path, args.source, args.cell_timeout, args.timeout, sandbox_user=user,
                            others=submissions))
        changed = changed_files(trusted, watched)
        if changed:
            print(f"error: while {path} was graded, the grader's own files changed: {', '.join(changed[:5])}"
                  f"{' ...' if len(changed) > 5 else ''}. Grades from here on could not be trusted, so none are "
                  "written. Restore those files (git checkout, or a fresh copy of the release), then grade again, "
                  "as root so that the submissions cannot write them.", file=sys.stderr)
            return 3
    print()
    print(summary_table(grades))
    write_csv(grades, args.out)
    print(f"\nWrote {args.out} ({sum(len(g.tasks) for g in grades)} rows: one per submission and task).")
    return 0


def _worker_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.teaching.grading --worker")
    parser.add_argument("--worker", nargs=2, metavar=("NOTEBOOK", "RESULTS_FD"), required=True)
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT)
    parser.add_argument("--jail-user")
    parser.add_argument("--jail-home")
    parser.add_argument("--jail-hide", action="append", default=[])
    args = parser.parse_args(argv)
    jail = None if args.jail_user is None else {"user": args.jail_user, "home": args.jail_home, "hide": args.jail_hide}
    return run_worker(Path(args.worker[0]), int(args.worker[1]), args.cell_timeout, jail)


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
