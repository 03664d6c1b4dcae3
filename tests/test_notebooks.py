"""Every lesson notebook runs top to bottom in a fresh kernel, in fast settings (the solution notebooks run top to
bottom under nbgrader's autograde: tests/test_nbgrader.py)."""
import time
from pathlib import Path

import nbformat
import pytest

from course_lib.teaching.verify import verify
from notebook_runner import ROOT, execute_notebook, fast_parameters, has_outputs, inject_parameters, parameters_index
from course_lib.scripts import LESSON_GLOB

LESSONS = sorted((ROOT / "notebooks").glob(LESSON_GLOB))
SOLUTIONS = sorted((ROOT / "solutions").glob(LESSON_GLOB))
ALL = LESSONS + SOLUTIONS
EXECUTED = ROOT / "test-output" / "executed"  # the executed lessons, with their outputs


def _id(path):
    return f"{path.parent.name}/{path.stem}"


def test_the_workbook_has_lessons():
    assert LESSONS, "no notebooks found in notebooks/"
    assert set(TIMED) <= {p.stem for p in LESSONS}, "a lesson named in TIMED is not in notebooks/"


@pytest.mark.parametrize("path", ALL + sorted((ROOT / "exercises").glob("*.ipynb")), ids=_id)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert not has_outputs(nb), f"{path.name} is committed with outputs; clear them before committing"


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_notebook_has_one_parameters_cell(path):
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: expected exactly one cell tagged 'parameters', found {len(tagged)}"
    if fast_parameters(nb):  # the injected cell, right after the parameters cell, assigns exactly them
        assigned = {}
        exec(inject_parameters(nb, fast_parameters(nb)).cells[parameters_index(nb) + 1].source, {}, assigned)
        assert assigned == fast_parameters(nb), f"{path.name}: its fast settings are not injected as they are"
    for name in fast_parameters(nb):
        assert f"{name} =" in tagged[0].source, f"{path.name}: fast parameter {name} is not in its parameters cell"


#: Lessons whose claims compare timings taken in their run with a margin that a test beside them could eat: they run
#: in the serial pass (course_lib/testpasses.py), alone on the machine, as a learner's would. Two lessons compare
#: timings with margins no neighbour eats, and run in the parallel pass: 03b (tensors in memory read faster than
#: per-sample PIL decoding: about 14x, timed in interleaved rounds of one process, so a neighbour slows both alike)
#: and 04a (a 2 s monitor interval ends the job more than 0.5 s later than 0.1 s: about 1.9 s, the agent's sleep).
TIMED = {
    "04b_multinode_elastic_slurm_hangs": "the second node joins the elastic run while the first trains",
    "11_pipeline_parallel": "the measured bubble stays within 0.15 of (p-1)/(m+p-1)",
}


@pytest.mark.notebook
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.serial) if p.stem in TIMED else p
                                  for p in LESSONS], ids=_id)
def test_notebook_runs_top_to_bottom(path):
    start = time.monotonic()
    nb = execute_notebook(path)
    print(f"{_id(path)} executed in {time.monotonic() - start:.1f}s")
    # Kept for the book (tests/test_book.py builds it from these instead of running every lesson again).
    EXECUTED.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, EXECUTED / path.name)
    # The saved outputs travel (the book, a learner's copy): nothing printed names a folder of this machine (the
    # course's, the home folder), ranks' tracebacks included.
    here = (str(Path(__file__).resolve().parent.parent) + "/", str(Path.home()) + "/")
    leaks = [line for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
             for line in (out.get("text", "") + out.get("data", {}).get("text/plain", "")).splitlines()
             if any(folder in line for folder in here)]
    assert not leaks, f"{path.name} prints this machine's folders: {leaks[:3]}"
    # What the lesson says about its run, checked from what the run left (its asserts moved there).
    if path.parent.name == "notebooks":
        verify(path.stem, nb, path.parent)
