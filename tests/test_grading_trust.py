"""The grader trusts the release, not the submission's metadata: a cell the submission marks as a check, an
nbgrader test cell, a parameters cell or the grader's own injected settings still runs in the sandbox, and earns
nothing. Each attack below took 0/3 to 3/3 when the worker chose its cells from the submission's own marks."""
import copy

import nbformat
import pytest

from course_lib.teaching.grading import FAILED, NOT_ATTEMPTED, grade, prepare
from course_lib.teaching.notebooks import INJECTED_TAG, parameters_index
from notebook_runner import ROOT

EXERCISES = ROOT / "exercises"

# Run in the worker, this would make every check pass: it replaces them in the module the worker's checks come from.
TAKEOVER = '''
from course_lib.teaching import checks
for name in dir(checks):
    if name.startswith("check_"):
        setattr(checks, name, lambda *args, **kwargs: print("looks right"))
'''

MARKS = {
    "a task id the release does not have": {"course": {"task": "00.9"}},
    "a task id the release has, on a second cell": {"course": {"task": "00.2"}},
    "an nbgrader test cell": {"nbgrader": {"grade": True, "solution": False, "grade_id": "forged", "points": 3,
                                           "locked": True, "schema_version": 3, "task": False}},
    "a second parameters tag": {"tags": ["parameters"]},
    "the grader's injected-parameters tag": {"tags": [INJECTED_TAG]},
}


def _with_forged_cell(lesson: str, tmp_path, metadata: dict, cell_id: str | None = None):
    """The untouched release of ``lesson`` with one more cell, right after its parameters cell, marked by
    ``metadata`` (after it: the first cell tagged ``parameters`` is the one the grader replaces)."""
    nb = nbformat.read(EXERCISES / f"{lesson}_exercises.ipynb", as_version=4)
    forged = nbformat.v4.new_code_cell(TAKEOVER, metadata=copy.deepcopy(metadata))
    if cell_id:
        forged["id"] = cell_id
    nb.cells.insert(parameters_index(nb) + 1, forged)
    path = tmp_path / f"{lesson}_exercises.ipynb"
    path.write_text(nbformat.writes(nb, version=4))
    return path


@pytest.mark.parametrize("how", list(MARKS))
def test_a_cell_marked_as_trusted_by_the_submission_earns_nothing(how, tmp_path):
    result = grade(_with_forged_cell("00_setup", tmp_path, MARKS[how]), cell_timeout=120, quiet=True)
    assert {t.task: t.status for t in result.tasks} == {"00.1": NOT_ATTEMPTED, "00.2": NOT_ATTEMPTED,
                                                         "00.3": NOT_ATTEMPTED}, result.tasks
    assert result.points == 0


def test_a_harness_checked_lesson_is_not_taken_over_by_a_forged_parameters_cell(tmp_path):
    result = grade(_with_forged_cell("01_collectives", tmp_path, MARKS["a second parameters tag"]), cell_timeout=180,
                   quiet=True)
    assert result.points == 0 and {t.status for t in result.tasks} <= {NOT_ATTEMPTED, FAILED}, result.tasks


def test_a_copy_of_a_check_cells_id_is_run_once_and_as_the_release_wrote_it(tmp_path):
    """Two cells with the id of check 00.2 (nbformat renames the second on reading): the first becomes the release's
    check, the other keeps its source but no mark, so it is learner code run in the sandbox."""
    path = _with_forged_cell("00_setup", tmp_path, {}, cell_id="ex00-10")
    nb, tasks = prepare(path)
    released = nbformat.read(EXERCISES / "00_setup_exercises.ipynb", as_version=4)
    checks = [c for c in nb.cells if c.get("metadata", {}).get("course", {}).get("task")]
    assert sorted(c.source for c in checks) == sorted(c.source for c in released.cells
                                                      if c.metadata.get("course", {}).get("task"))
    assert set(tasks) == {"00.1", "00.2", "00.3"}
    assert not any(TAKEOVER in c.source for c in checks)
    pick = "checks.check_pick_backend(pick_backend)"
    assert [bool(c.metadata.get("course", {}).get("task")) for c in nb.cells if c.source == pick] in ([True, False],
                                                                                                    [False, True])


def test_what_prepare_keeps_of_a_submission_cell_marks_nothing_the_worker_runs(tmp_path):
    for how, metadata in MARKS.items():
        nb, _ = prepare(_with_forged_cell("00_setup", tmp_path, metadata))
        forged = next(c for c in nb.cells if c.source == TAKEOVER)
        meta = forged.get("metadata", {})
        assert "nbgrader" not in meta and "task" not in meta.get("course", {}), how
        assert not set(meta.get("tags", [])) & {"parameters", INJECTED_TAG}, how


def test_a_submission_without_a_release_of_its_name_is_not_graded_by_its_own_marks(tmp_path):
    path = _with_forged_cell("00_setup", tmp_path, MARKS["a task id the release does not have"])
    renamed = path.rename(tmp_path / "my_own_exercises.ipynb")
    result = grade(renamed, source_dir=EXERCISES, cell_timeout=60, quiet=True)
    assert result.tasks == [] and result.points == 0
    assert "no released exercise" in result.note and "--source" in result.note
