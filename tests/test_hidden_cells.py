"""Visible code is lesson code: a plumbing cell (a table read from logs, a plot, a parsing helper) is collapsed in
JupyterLab and hidden in the book, the two together, and no cell that is the lesson itself is hidden in either."""
from pathlib import Path

import nbformat
import pytest
from course_lib.scripts import LESSON_GLOB

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").glob(LESSON_GLOB))
# What only lesson code does: write a script, set the parameters, run on the ranks, launch.
LESSON_CODE = ("%%px", "torchrun(", "accelerate_launch(", "LaunchPanel(", "start_ranks(")


def _code_cells(path: Path):
    return [cell for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


def _collapsed(cell) -> bool:
    return bool(cell.metadata.get("jupyter", {}).get("source_hidden"))


def _hidden_in_the_book(cell) -> bool:
    return "hide-input" in cell.metadata.get("tags", [])


def test_there_are_lessons():
    assert len(LESSONS) >= 10, [p.name for p in LESSONS]


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_a_cell_collapsed_in_jupyterlab_is_hidden_in_the_book_and_back(path):
    disagree = [(cell.get("id"), "collapsed" if _collapsed(cell) else "hide-input")
                for cell in _code_cells(path) if _collapsed(cell) != _hidden_in_the_book(cell)]
    assert not disagree, (f"{path.name}: these cells are hidden in one view only (set both "
                          f"metadata.jupyter.source_hidden and the tag hide-input, or neither): {disagree}")


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_no_hidden_cell_is_lesson_code(path):
    wrong = []
    for cell in _code_cells(path):
        if not (_collapsed(cell) or _hidden_in_the_book(cell)):
            continue
        if cell.source.lstrip().startswith("%%write_script"):
            wrong.append((cell.get("id"), "%%write_script"))
        if "parameters" in cell.metadata.get("tags", []):
            wrong.append((cell.get("id"), "the parameters tag"))
        wrong += [(cell.get("id"), marker) for marker in LESSON_CODE if marker in cell.source]
    assert not wrong, f"{path.name}: hidden cells that are lesson code (show them): {wrong}"
