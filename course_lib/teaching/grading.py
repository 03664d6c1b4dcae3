"""Grade submitted exercise notebooks: run each headlessly, record every task's check.

``python -m course_lib grade SUBMISSIONS... --out grades.csv``

Each submission runs in a fresh kernel, in its own temporary folder (a submission that deletes
files deletes only its copy), in a separate worker process with a per-cell and a whole-notebook
timeout; when time is up the worker, the kernel and everything they launched are killed. Cells that
fail do not stop the run. The check cells (tagged ``{"course": {"task": ...}}``) are first restored
from the released exercise of the same name, so a check edited by a learner counts for nothing.

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
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .exercises import EXERCISES
from .notebooks import fast_parameters, inject_parameters
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
    def score(self) -> float:
        return self.passed / len(self.tasks) if self.tasks else 0.0


def task_of(cell) -> str | None:
    """The task id a check cell is tagged with (``course.task``, or nbgrader's ``grade_id``)."""
    meta = cell.get("metadata", {})
    return meta.get("course", {}).get("task") or meta.get("nbgrader", {}).get("grade_id")


def _cap(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit // 3] + "\n[...]\n" + text[-(2 * limit) // 3:]


# --- preparing a submission ----------------------------------------------------------------------


def prepare(submission: Path, source_dir: Path | None = EXERCISES):
    """The notebook to run and the task ids to grade (the released exercise's, when there is one)."""
    nb = nbformat.read(submission, as_version=4)
    released = Path(source_dir) / submission.name if source_dir else None
    if released is not None and released.is_file():
        original = nbformat.read(released, as_version=4)
        checks = {task_of(c): c for c in original.cells if c.cell_type == "code" and task_of(c)}
        tasks = list(checks)
        for i, cell in enumerate(nb.cells):
            task = task_of(cell)
            if cell.cell_type == "code" and task in checks:
                nb.cells[i] = copy.deepcopy(checks[task])
        nb.metadata.setdefault("course", {})["fast_parameters"] = \
            original.metadata.get("course", {}).get("fast_parameters", {})
    else:
        tasks = [task_of(c) for c in nb.cells if c.cell_type == "code" and task_of(c)]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    # The notebook's own fast settings, injected the way the tests inject them.
    return inject_parameters(nb, fast_parameters(nb), by="the grader", missing_ok=True), tasks


# --- the worker: runs one notebook, reports each cell as it finishes -----------------------------


def _cell_record(index: int, cell, reply: dict | None, seconds: float, cell_timeout: float) -> dict:
    content = (reply or {}).get("content", {})
    ename = evalue = ""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            ename, evalue = out.get("ename", ""), out.get("evalue", "")
    if not ename and content.get("status") == "error":
        ename, evalue = content.get("ename", "Error"), content.get("evalue", "")
    if seconds >= cell_timeout and ename in ("", "KeyboardInterrupt", "CellTimeout"):
        # the interrupt nbclient sends at the timeout surfaces as a KeyboardInterrupt (or nothing at all)
        ename, evalue = "CellTimeout", f"the cell ran longer than {cell_timeout:.0f}s and was interrupted"
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    return {"index": index, "ename": ename, "evalue": _cap(evalue), "output": _cap(text, 600),
            "seconds": round(seconds, 1)}


def run_worker(notebook: Path, results: Path, cell_timeout: float) -> int:
    """Execute ``notebook`` cell by cell in a fresh kernel, appending one JSON line per cell to ``results``."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(
        nb, timeout=int(cell_timeout), kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
        error_on_timeout={"ename": "CellTimeout",
                          "evalue": f"the cell ran longer than {cell_timeout:.0f}s and was interrupted"},
        resources={"metadata": {"path": str(notebook.parent)}})
    replies = {}
    client.on_cell_executed = lambda cell, cell_index, execute_reply: replies.__setitem__(cell_index, execute_reply)
    with open(results, "a") as out, client.setup_kernel():
        kernel_pid = getattr(getattr(client.km, "provisioner", None), "process", None)
        kernel_pid = getattr(kernel_pid, "pid", None)
        try:
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code" or not cell.source.strip():
                    continue
                start = time.monotonic()
                try:
                    client.execute_cell(cell, index)
                except DeadKernelError:
                    out.write(json.dumps({"index": index, "ename": "DeadKernel",
                                          "evalue": "the kernel died while running this cell"}) + "\n")
                    break
                out.write(json.dumps(_cell_record(index, cell, replies.get(index), time.monotonic() - start,
                                                  cell_timeout)) + "\n")
                out.flush()
                cell.outputs = []  # megabytes of prints need not stay in memory
        finally:
            if kernel_pid:  # anything the kernel launched (torchrun and its workers) goes with it
                import psutil

                try:
                    for child in psutil.Process(kernel_pid).children(recursive=True):
                        stop_tree(child.pid, grace=1.0)
                except psutil.NoSuchProcess:
                    pass
    return 0


# --- grading -------------------------------------------------------------------------------------


def _read_records(path: Path) -> dict[int, dict]:
    records = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short when the worker was killed
            records[record["index"]] = record
    return records


def classify(nb, tasks: list[str], records: dict[int, dict], why_stopped: str = "") -> list[TaskResult]:
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
    return [results.get(t) or TaskResult(t, FAILED, "its check cell is missing from the submission") for t in tasks]


def grade(submission, source_dir: Path | None = EXERCISES, cell_timeout: float = CELL_TIMEOUT,
          timeout: float = NOTEBOOK_TIMEOUT, quiet: bool = False) -> Grade:
    """Run one submitted notebook and grade its tasks."""
    submission = Path(submission)
    result = Grade(str(submission), submission.name)
    start = time.monotonic()
    try:
        nb, tasks = prepare(submission, source_dir)
    except Exception as exc:  # not a notebook, unreadable JSON, ...
        result.note = f"could not read the notebook: {type(exc).__name__}: {exc}"
        released = Path(source_dir) / submission.name if source_dir else None
        if released is not None and released.is_file():
            tasks = [task_of(c) for c in nbformat.read(released, as_version=4).cells if task_of(c)]
            result.tasks = [TaskResult(t, FAILED, result.note) for t in tasks]
        if not quiet:
            print(f"{submission}: {result.note}", flush=True)
        return result
    # The submission runs in base/submission/; what the grader keeps lies beside it, out of its reach.
    base = Path(tempfile.mkdtemp(prefix="course-grade-"))
    workdir = base / "submission"
    workdir.mkdir()
    try:
        notebook = workdir / submission.name
        nbformat.write(nb, notebook)
        records_path = base / "results.jsonl"
        log = open(base / "worker.log", "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
        # Its own session, and a guard that ends it, its kernel and their runs if the grader is killed.
        worker = start_process(
            [sys.executable, "-m", "course_lib.teaching.grading", "--worker", str(notebook), str(records_path),
             "--cell-timeout", str(cell_timeout)], env=env, cwd=workdir, log=log)
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
        records = _read_records(records_path)
        if not records and worker.returncode:
            tail = (base / "worker.log").read_text(errors="replace")[-MESSAGE_LIMIT:]
            why = f"{why}: {tail}"
        died = [r for r in records.values() if r.get("ename") == "DeadKernel"]
        if died and not why:
            why = f"the kernel died in cell {died[0]['index']}"
        result.tasks = classify(nb, tasks, records, why)
        result.note = why
    finally:
        result.seconds = time.monotonic() - start
        shutil.rmtree(base, ignore_errors=True)
    if not quiet:
        print(f"{submission}: {result.passed}/{len(result.tasks)} tasks passed in {result.seconds:.0f}s"
              + (f" ({result.note})" if result.note else ""), flush=True)
    return result


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
                                 "status": t.status, "points": int(t.status == PASSED),
                                 "message": t.message, "seconds": f"{g.seconds:.1f}"})


def summary_table(grades: list[Grade]) -> str:
    """One line per submission: score, time, and every task's status."""
    short = {PASSED: "ok", FAILED: "FAIL", NOT_ATTEMPTED: "--"}
    rows = [("submission", "score", "seconds", "tasks (ok passed, FAIL failed, -- not attempted)")]
    for g in grades:
        rows.append((g.submission, f"{g.passed}/{len(g.tasks)} ({100 * g.score:.0f}%)", f"{g.seconds:.0f}",
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
    args = parser.parse_args(argv)
    submissions = find_submissions(args.submissions)
    missing = [p for p in submissions if not p.is_file()]
    if missing or not submissions:
        print(f"No such notebook(s): {', '.join(map(str, missing)) or 'none given'}", file=sys.stderr)
        return 2
    grades = [grade(p, args.source, args.cell_timeout, args.timeout) for p in submissions]
    print()
    print(summary_table(grades))
    write_csv(grades, args.out)
    print(f"\nWrote {args.out} ({sum(len(g.tasks) for g in grades)} rows: one per submission and task).")
    return 0


def _worker_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.teaching.grading --worker")
    parser.add_argument("--worker", nargs=2, metavar=("NOTEBOOK", "RESULTS"), required=True)
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT)
    args = parser.parse_args(argv)
    return run_worker(Path(args.worker[0]), Path(args.worker[1]), args.cell_timeout)


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
