"""Student notebooks generated from the solution notebooks: one source for every exercise, nbgrader's format.

``solutions/NN_topic_exercises.ipynb`` holds each task's answer between nbgrader's markers, with an optional
hint on the line above (it stays in the student's version)::

    # Hint: all_reduce the sum and the count, not the mean
    ### BEGIN SOLUTION
    ...the answer...
    ### END SOLUTION

and each task's check in a code cell tagged ``{"course": {"task": "02.1"}}`` (``"points"`` beside it: 1 when
absent). ``python -m course_lib exercises build`` first writes nbgrader's cell metadata into the solutions
(``annotate``: answer cells are solution cells, check cells autograded test cells with their points, every
other cell read-only; schema version 3), then writes ``exercises/`` exactly as ``nbgrader generate_assignment``
releases it with the configuration ``nbgrader_config()`` writes (``make_exercise``): each region becomes
``CODE_STUB`` at the region's indentation (inside a ``%%write_script`` cell that line ends up in the script,
so the launched script fails and its check says "not attempted"), outputs are cleared, read-only and check
cells are locked, and nbgrader's checksums are added. ``--check`` only compares.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..errors import MarkerError
from .placeholders import BEGIN, CODE_STUB, END, MARKDOWN_ANSWER

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"

SCHEMA_VERSION = 3
_LINE = re.compile(r"^(?P<indent>[ \t]*)(?P<marker>### (?:BEGIN|END) SOLUTION)\s*$")


@dataclass
class Region:
    """One solution region: where it is and what it hides."""

    cell_index: int
    indent: str
    lines: list[str]  # the answer's lines, markers excluded


def _regions(source: str, where: str, cell_index: int) -> tuple[list[str], list[Region]]:
    """The cell's lines with each region replaced, and the regions found."""
    out: list[str] = []
    regions: list[Region] = []
    current: Region | None = None
    for number, line in enumerate(source.split("\n"), start=1):
        match = _LINE.match(line)
        if not match and ("BEGIN SOLUTION" in line or "END SOLUTION" in line):
            # nbgrader takes any line containing the words for a marker: only whole marker lines are allowed
            raise MarkerError(f"{where}, cell {cell_index}, line {number}: a marker must be a line of its own, "
                              f"exactly `{BEGIN}` or `{END}` (indented like the code): {line.strip()!r}")
        if match and match["marker"] == BEGIN:
            if current is not None:
                raise MarkerError(f"{where}, cell {cell_index}, line {number}: `{BEGIN}` inside another region; "
                                  f"close the first one with `{END}`.")
            current = Region(cell_index, match["indent"], [])
        elif match and match["marker"] == END:
            if current is None:
                raise MarkerError(f"{where}, cell {cell_index}, line {number}: `{END}` without a `{BEGIN}` before it.")
            regions.append(current)
            out.append(current)  # placeholder, rendered by the caller
            current = None
        elif current is not None:
            if line.strip().startswith("### HINT:"):
                raise MarkerError(f"{where}, cell {cell_index}, line {number}: a hint inside a region is removed "
                                  f"with the answer; write it as `# Hint: ...` on the line above `{BEGIN}`.")
            current.lines.append(line)
        else:
            out.append(line)
    if current is not None:
        raise MarkerError(f"{where}, cell {cell_index}: `{BEGIN}` is never closed with `{END}`.")
    return out, regions


def solution_regions(nb, where: str = "notebook") -> list[Region]:
    """Every solution region of ``nb`` (code and markdown cells), in order."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type in ("code", "markdown"):
            found += _regions(cell.source, where, index)[1]
    return found


def _render(lines, cell_type: str) -> str:
    rendered = []
    for item in lines:
        if isinstance(item, Region):
            stub = CODE_STUB if cell_type == "code" else MARKDOWN_ANSWER
            rendered += [item.indent + line for line in stub.split("\n")]
        else:
            rendered.append(item)
    return "\n".join(rendered)


# --- nbgrader's metadata ---------------------------------------------------------------------------


def _task(cell) -> str | None:
    return cell.get("metadata", {}).get("course", {}).get("task") if cell.cell_type == "code" else None


def _slug(task: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", task)  # nbgrader's ids allow letters, digits, - and _


def annotate(solution_nb, where: str = "notebook"):
    """A copy of ``solution_nb`` with nbgrader's metadata on every cell, derived from the course's own marks.

    A cell holding solution regions is a solution cell (``answer-<task>``, the task of the check after it);
    a check cell (``course.task``) is an autograded test cell worth ``course.points`` (1 when absent); every
    other cell is read-only (``grade_id`` = the cell's id). Written answers (regions in markdown) would need
    a person to grade them, which the course's grader cannot: they are an error.
    """
    nb = copy.deepcopy(solution_nb)
    upcoming, answers = {}, {}
    task = None
    for index in range(len(nb.cells) - 1, -1, -1):  # each cell's task is the next check's
        task = _task(nb.cells[index]) or task
        upcoming[index] = task
    for index, cell in enumerate(nb.cells):
        base = {"grade": False, "locked": False, "schema_version": SCHEMA_VERSION, "solution": False, "task": False}
        regions = _regions(cell.source, where, index)[1] if cell.cell_type in ("code", "markdown") else []
        if _task(cell):
            points = cell.metadata["course"].get("points", 1)
            meta = dict(base, grade=True, locked=True, points=points, grade_id=f"check-{_slug(_task(cell))}")
        elif regions:
            if cell.cell_type != "code":
                raise MarkerError(f"{where}, cell {index}: a solution region in a markdown cell is a written answer, "
                                  f"which no check can grade; ask for code, or put the question in the prose.")
            if upcoming[index] is None:
                raise MarkerError(f"{where}, cell {index}: a solution region after the last check cell.")
            grade_id = f"answer-{_slug(upcoming[index])}"
            answers[grade_id] = answers.get(grade_id, 0) + 1
            if answers[grade_id] > 1:
                grade_id += f"-{answers[grade_id]}"
            meta = dict(base, solution=True, grade_id=grade_id)
        else:
            if not cell.get("id"):
                raise MarkerError(f"{where}, cell {index} has no cell id (nbformat 4.5 gives every cell one); "
                                  f"open and save the notebook with JupyterLab, or run nbformat's normalize.")
            meta = dict(base, locked=True, grade_id=cell.id)
        cell.metadata["nbgrader"] = meta
    return nb


def checksum(cell) -> str:
    """nbgrader's checksum of a cell: MD5 of its source, type, grade/solution/locked flags, id and points."""
    meta = cell.metadata["nbgrader"]
    locked = not meta["solution"] and (meta["grade"] or meta["locked"])  # a check cell is always locked
    digest = hashlib.md5()
    for part in (cell.source, cell.cell_type, str(meta["grade"]), str(meta["solution"]), str(locked), meta["grade_id"]):
        digest.update(part.encode("utf-8"))
    if meta["grade"]:
        digest.update(str(float(meta["points"])).encode("utf-8"))
    return digest.hexdigest()


def make_exercise(solution_nb, where: str = "notebook"):
    """The student version of ``solution_nb``, as ``nbgrader generate_assignment`` releases it.

    Its steps, in nbgrader's order: lock (solution cells cannot be deleted; check and read-only cells can be
    neither deleted nor edited), replace each region with the stub, clear outputs, add checksums.
    """
    nb = annotate(solution_nb, where)
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata["nbgrader"]
        cell.metadata["deletable"] = False
        if not meta["solution"]:
            cell.metadata["editable"] = False
        if cell.cell_type in ("code", "markdown"):
            lines, regions = _regions(cell.source, where, index)
            if regions:
                cell.source = _render(lines, cell.cell_type)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            for field in ("collapsed", "scrolled"):
                cell.metadata.pop(field, None)
        meta["checksum"] = checksum(cell)
        meta["cell_type"] = cell.cell_type
    nb.metadata.pop("celltoolbar", None)
    return nb


def nbgrader_config() -> str:
    """The ``nbgrader_config.py`` whose ``generate_assignment`` releases what ``make_exercise`` writes."""
    return ("# nbgrader's configuration for this course (written by `python -m course_lib exercises nbgrader`).\n"
            "c = get_config()  # noqa: F821 (nbgrader provides it)\n"
            "# The placeholder every answer region becomes (the course's exercises/ use the same one).\n"
            f"c.ClearSolutions.code_stub = {{'python': {CODE_STUB!r}}}\n"
            f"c.ClearSolutions.text_stub = {MARKDOWN_ANSWER!r}\n"
            "# Checks launch real processes and train on MNIST: seconds per cell, as the course's grader allows.\n"
            "c.Execute.timeout = 300\n"
            "# Fail closed: a submission whose read-only cells lost their nbgrader metadata (nbgrader could not put\n"
            "# them back) is refused, not run as edited (course_lib/teaching/nbgrader_locks.py).\n"
            "from nbgrader.preprocessors import (CheckCellMetadata, ClearOutput, DeduplicateIds,  # noqa: E402\n"
            "                                    OverwriteCells, OverwriteKernelspec)\n"
            "from course_lib.teaching.nbgrader_locks import RequireLockedCells  # noqa: E402\n"
            "c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells,\n"
            "                                      RequireLockedCells, CheckCellMetadata]\n")


def assignment_name(solution: Path) -> str:
    """nbgrader's assignment for a solution notebook: ``00_setup`` for ``00_setup_exercises.ipynb``."""
    return Path(solution).stem.removesuffix("_exercises")


def nbgrader_course(folder: Path, solutions_dir: Path = SOLUTIONS, out=sys.stdout) -> list[str]:
    """An nbgrader course folder: its configuration and ``source/<assignment>/`` holding each solution."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nbgrader_config.py").write_text(nbgrader_config())
    names = []
    for solution in solution_notebooks(solutions_dir):
        target = folder / "source" / assignment_name(solution) / solution.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(notebook_text(annotate(nbformat.read(solution, as_version=4), str(solution))))
        names.append(assignment_name(solution))
    print(f"wrote {folder}/nbgrader_config.py and source/ with {len(names)} assignments: {', '.join(names)}", file=out)
    return names


def notebook_text(nb) -> str:
    """The exact text a notebook is stored as (what the in-sync comparison uses)."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def exercise_path(solution: Path, exercises_dir: Path = EXERCISES) -> Path:
    return Path(exercises_dir) / Path(solution).name


def solution_notebooks(solutions_dir: Path = SOLUTIONS) -> list[Path]:
    return sorted(Path(solutions_dir).glob("*.ipynb"))


def build(solutions_dir: Path = SOLUTIONS, exercises_dir: Path = EXERCISES, check: bool = False,
          out=sys.stdout) -> list[str]:
    """Write (or with ``check``, only compare) nbgrader's metadata into the solutions and every exercise.

    A problem is a solution whose nbgrader metadata is not what ``annotate`` writes, an exercise that differs
    from what its solution generates, or an exercise whose solution no longer exists (``build`` removes it).
    """
    solutions_dir, exercises_dir = Path(solutions_dir), Path(exercises_dir)
    problems = []
    wanted = set()
    for solution in solution_notebooks(solutions_dir):
        source = nbformat.read(solution, as_version=4)
        annotated = notebook_text(annotate(source, where=str(solution)))
        if solution.read_text() != annotated:
            problems.append(f"{solution} lacks nbgrader's metadata or has it out of date")
            if not check:
                solution.write_text(annotated)
                print(f"wrote nbgrader's metadata into {solution}", file=out)
        target = exercise_path(solution, exercises_dir)
        wanted.add(target.name)
        text = notebook_text(make_exercise(source, where=str(solution)))
        current = target.read_text() if target.exists() else None
        if current == text:
            continue
        problems.append(f"{target} is {'missing' if current is None else 'out of date'} (source: {solution})")
        if not check:
            exercises_dir.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {target}", file=out)
    for stale in sorted(exercises_dir.glob("*.ipynb")) if exercises_dir.exists() else []:
        if stale.name not in wanted:
            problems.append(f"{stale} has no source in {solutions_dir}")
            if not check:
                stale.unlink()
                print(f"removed {stale} (its solution notebook is gone)", file=out)
    return problems


def cli(argv: list[str]) -> int:
    """``python -m course_lib exercises build [--check]`` and ``python -m course_lib exercises nbgrader DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib exercises",
        description="Generate the student notebooks exercises/*.ipynb from solutions/*.ipynb (build), or lay "
                    "out an nbgrader course folder whose generate_assignment releases the same notebooks (nbgrader).")
    parser.add_argument("action", choices=["build", "nbgrader"])
    parser.add_argument("folder", nargs="?", type=Path, help="nbgrader: the course folder to write (e.g. ~/ddp-course)")
    parser.add_argument("--check", action="store_true",
                        help="build: write nothing; exit 1 if solutions/ or exercises/ is not what the tool writes")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help="folder of solution notebooks")
    parser.add_argument("--exercises", type=Path, default=EXERCISES, help="folder of generated notebooks")
    args = parser.parse_args(argv)
    try:
        if args.action == "nbgrader":
            if args.folder is None:
                parser.error("nbgrader needs the course folder to write, e.g. `exercises nbgrader ~/ddp-course`")
            names = nbgrader_course(args.folder, args.solutions)
            print(f"Next: cd {args.folder} && nbgrader generate_assignment {names[0]}  (one per assignment), "
                  f"then collect submissions into submitted/<student>/<assignment>/ and run nbgrader autograde.")
            return 0
        problems = build(args.solutions, args.exercises, check=args.check)
    except MarkerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        for problem in problems:
            print(problem)
        if problems:
            print("Run `python -m course_lib exercises build` to regenerate them.", file=sys.stderr)
            return 1
        print(f"solutions/ and exercises/ are in sync ({len(solution_notebooks(args.solutions))} notebooks)")
        return 0
    print(f"{len(problems)} notebook(s) updated; solutions/ and exercises/ are in sync")
    return 0
