"""Student notebooks generated from the solution notebooks: one source for every exercise.

``solutions/NN_topic_exercises.ipynb`` holds each task's answer between nbgrader's markers::

    ### BEGIN SOLUTION
    ### HINT: all_reduce the sum and the count, not the mean
    ...the answer...
    ### END SOLUTION

``python -m course_lib exercises build`` writes ``exercises/`` from it: each region becomes
``raise NotImplementedError("<hint>")`` at the region's indentation (inside a ``%%write_script``
cell that line ends up in the script, so the launched script fails and its check says
"not attempted"), outputs are cleared, and nothing else changes. ``--check`` only compares.
"""
from __future__ import annotations

import argparse
import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..errors import MarkerError

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"

BEGIN, END, HINT = "### BEGIN SOLUTION", "### END SOLUTION", "### HINT:"
DEFAULT_HINT = "Write your solution here (replace this line), then run the check below."
MARKDOWN_ANSWER = "YOUR ANSWER HERE"
_LINE = re.compile(r"^(?P<indent>[ \t]*)(?P<marker>### (?:BEGIN|END) SOLUTION)\s*$")


@dataclass
class Region:
    """One solution region: where it is and what it hides."""

    cell_index: int
    indent: str
    hint: str
    lines: list[str]  # the answer's lines, markers and hint line excluded


def _regions(source: str, where: str, cell_index: int) -> tuple[list[str], list[Region]]:
    """The cell's lines with each region replaced, and the regions found."""
    out: list[str] = []
    regions: list[Region] = []
    current: Region | None = None
    for number, line in enumerate(source.splitlines(), start=1):
        match = _LINE.match(line)
        if match and match["marker"] == BEGIN:
            if current is not None:
                raise MarkerError(f"{where}, cell {cell_index}, line {number}: `{BEGIN}` inside another region; "
                                  f"close the first one with `{END}`.")
            current = Region(cell_index, match["indent"], "", [])
        elif match and match["marker"] == END:
            if current is None:
                raise MarkerError(f"{where}, cell {cell_index}, line {number}: `{END}` without a `{BEGIN}` before it.")
            regions.append(current)
            out.append(current)  # placeholder, rendered by the caller (code and markdown differ)
            current = None
        elif current is not None:
            stripped = line.strip()
            if stripped.startswith(HINT) and not current.hint:
                current.hint = stripped[len(HINT):].strip()
            else:
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
            if cell_type == "code":
                hint = item.hint or DEFAULT_HINT
                rendered.append(f"{item.indent}# YOUR CODE HERE")
                rendered.append(f"{item.indent}raise NotImplementedError({hint!r})")
            else:
                rendered.append(MARKDOWN_ANSWER)
        else:
            rendered.append(item)
    return "\n".join(rendered)


def make_exercise(solution_nb, where: str = "notebook"):
    """The student version of ``solution_nb``: regions replaced, outputs cleared, all else identical."""
    nb = copy.deepcopy(solution_nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type in ("code", "markdown"):
            lines, regions = _regions(cell.source, where, index)
            if regions:
                cell.source = _render(lines, cell.cell_type)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


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
    """Write (or with ``check``, only compare) every exercise notebook; return the problems found.

    A problem is an exercise that differs from what its solution generates, or an exercise whose
    solution no longer exists (``build`` removes it).
    """
    solutions_dir, exercises_dir = Path(solutions_dir), Path(exercises_dir)
    problems = []
    wanted = set()
    for solution in solution_notebooks(solutions_dir):
        target = exercise_path(solution, exercises_dir)
        wanted.add(target.name)
        text = notebook_text(make_exercise(nbformat.read(solution, as_version=4), where=str(solution)))
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
    """``python -m course_lib exercises build [--check]``."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib exercises",
        description="Generate the student notebooks exercises/*.ipynb from solutions/*.ipynb.")
    parser.add_argument("action", choices=["build"])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if exercises/ is not what the solutions generate")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help="folder of solution notebooks")
    parser.add_argument("--exercises", type=Path, default=EXERCISES, help="folder of generated notebooks")
    args = parser.parse_args(argv)
    try:
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
        print(f"exercises/ is in sync with solutions/ ({len(solution_notebooks(args.solutions))} notebooks)")
        return 0
    print(f"{len(problems)} notebook(s) updated; exercises/ is in sync with solutions/")
    return 0
