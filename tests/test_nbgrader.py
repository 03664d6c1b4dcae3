"""nbgrader, run for real on every lesson's exercises.

An nbgrader course folder made by ``python -m course_lib exercises nbgrader``: ``generate_assignment`` releases
exactly the committed ``exercises/``; ``autograde`` gives every solution full marks (with no cell failing, so
this also runs each solution top to bottom) and every untouched release zero (stopping first at a placeholder);
``generate_feedback`` writes feedback; and the course's own grader gives the same points as nbgrader.

The solutions and the untouched releases run top to bottom under nbgrader for the lessons of ``SOLVED_IN_EVERY_RUN``
(checks that launch the learner's script, and checks that run the learner's code in a harness of their own), and
for every lesson with ``COURSE_NBGRADER_ALL=1`` set: that full run (about 8 minutes on 2 cores) is the command to
run when an exercise or a check changes; it stays out of CI's time budget. An untouched release costs a kernel that
imports torch and the checks, then says "not attempted" at every check without launching anything; every release
is generated, and compared with the committed one, in every run. The solutions of lessons 03, 04, 06 and 10-12 pass
in every run through the course's checks too (``tests/test_grading.py``, ``tests/test_checks_lessonNN.py``).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_lib.teaching.exercises import (CODE_STUB, EXERCISES, assignment_name, nbgrader_course,
                                           solution_notebooks)
from course_lib.teaching.grading import grade, task_of
from notebook_runner import ROOT
from test_grading import _forged

SOLUTIONS = solution_notebooks()
LESSONS = [assignment_name(p) for p in SOLUTIONS]
STUDENTS = ("solution", "untouched")  # the solution notebook as submitted, and the release as handed out
ALL_ENV = "COURSE_NBGRADER_ALL"
SOLVED_IN_EVERY_RUN = ("00_setup", "01_collectives", "08_inside_ddp")
SOLVED = [lesson for lesson in LESSONS
          if os.environ.get(ALL_ENV, "") not in ("", "0") or lesson in SOLVED_IN_EVERY_RUN]
PARTIAL = "partial"  # lesson 00's release with task 00.2 answered, and nothing else
FORGED = "forged"  # lesson 00's release with test_grading's forgery in task 00.2's cell


def nbgrader(folder: Path, *args: str) -> str:
    """``nbgrader ARGS`` in the course folder, with this environment's tools on PATH (nbgrader runs alembic)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=3600)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout + done.stderr


def _partial(release: Path, target: Path) -> None:
    """Task 00.2 answered in the released notebook (the solution's function), every other task untouched."""
    nb = nbformat.read(release, as_version=4)
    solution = nbformat.read(ROOT / "solutions" / release.name, as_version=4)
    for mine, theirs in zip(nb.cells, solution.cells):
        if mine.metadata.get("nbgrader", {}).get("grade_id") == "answer-00-2":
            mine.source = "\n".join(line for line in theirs.source.splitlines() if "SOLUTION" not in line)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The course folder after ``generate_assignment`` and ``autograde`` of every lesson and student."""
    folder = tmp_path_factory.mktemp("nbgrader-course")
    nbgrader_course(folder)
    nbgrader(folder, "generate_assignment", "*", "--force")
    for lesson, solution in zip(LESSONS, SOLUTIONS):
        for student, source in zip(STUDENTS, (folder / "source", folder / "release")):
            if lesson not in SOLVED:  # a solution and its release, or neither
                continue
            target = folder / "submitted" / student / lesson
            target.mkdir(parents=True)
            shutil.copy(source / lesson / solution.name, target / solution.name)
    _partial(folder / "release" / LESSONS[0] / SOLUTIONS[0].name,
             folder / "submitted" / PARTIAL / LESSONS[0] / SOLUTIONS[0].name)
    forged = _forged(folder, "")  # no exit at its end: the kernel goes on to the checks
    (folder / "submitted" / FORGED / LESSONS[0]).mkdir(parents=True)
    shutil.move(forged, folder / "submitted" / FORGED / LESSONS[0] / forged.name)
    nbgrader(folder, "autograde", "*", "--create", "--force")
    return folder


def scores(folder: Path, lesson: str, student: str) -> dict[str, float]:
    """nbgrader's points per check cell (grade_id) for one student's submission, from its gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{folder / 'gradebook.db'}") as gradebook:
        notebook = gradebook.find_submission_notebook(f"{lesson}_exercises", lesson, student)
        return {g.name: g.score for g in notebook.grades}


def _errors(nb) -> list[tuple[int, str]]:
    return [(i, o.get("ename", "")) for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


def _error_texts(nb) -> str:
    """Each failing cell's error with the end of its message, for a failure that says why."""
    return "\n".join(f"cell {i}: {o.get('ename', '')}: {o.get('evalue', '')[-1500:]}"
                     for i, c in enumerate(nb.cells) if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.get("output_type") == "error")


@pytest.mark.notebook
@pytest.mark.parametrize("lesson", LESSONS)
def test_generate_assignment_releases_exactly_the_committed_exercise(course, lesson):
    name = f"{lesson}_exercises.ipynb"
    released = json.loads((course / "release" / lesson / name).read_text())
    assert released == json.loads((EXERCISES / name).read_text()), (
        f"nbgrader's release of {name} differs from exercises/{name}; run `python -m course_lib exercises build`")


def test_the_solutions_autograded_in_every_run_are_lessons_of_the_course():
    assert set(SOLVED_IN_EVERY_RUN) <= set(LESSONS), set(SOLVED_IN_EVERY_RUN) - set(LESSONS)


@pytest.mark.notebook
@pytest.mark.parametrize("lesson", SOLVED)
def test_autograde_gives_the_solution_full_marks_with_no_cell_failing(course, lesson):
    got = scores(course, lesson, "solution")
    checks = [c for c in nbformat.read(EXERCISES / f"{lesson}_exercises.ipynb", as_version=4).cells if task_of(c)]
    graded = nbformat.read(course / "autograded" / "solution" / lesson / f"{lesson}_exercises.ipynb", as_version=4)
    assert _errors(graded) == [], f"cells of the solution failed under nbgrader:\n{_error_texts(graded)}"
    assert set(got) == {c.metadata.nbgrader["grade_id"] for c in checks}
    assert got == {c.metadata.nbgrader["grade_id"]: float(c.metadata.nbgrader["points"]) for c in checks}


@pytest.mark.notebook
@pytest.mark.parametrize("lesson", SOLVED)
def test_autograde_gives_the_untouched_release_zero_first_failing_at_a_placeholder(course, lesson):
    got = scores(course, lesson, "untouched")
    assert got and set(got.values()) == {0.0}, f"the untouched release of {lesson} earned points: {got}"
    graded = nbformat.read(course / "autograded" / "untouched" / lesson / f"{lesson}_exercises.ipynb", as_version=4)
    first_check = next(i for i, c in enumerate(graded.cells) if task_of(c))
    index, ename = _errors(graded)[0]
    assert ename in ("NotImplementedError", "NotAttempted") and index <= first_check, (
        f"{lesson}: the first failing cell is {index} ({ename}), not a placeholder at or before the first check "
        f"(cell {first_check})")
    stub = CODE_STUB.splitlines()[-1]
    assert any(stub in c.source for c in graded.cells), f"{lesson}: no placeholder `{stub}` in the release"


@pytest.mark.notebook
def test_generate_feedback_writes_each_students_report_with_their_score(course):
    lesson = LESSONS[0]
    nbgrader(course, "generate_feedback", lesson, "--force")
    for student, points in (("solution", 3), ("untouched", 0), (PARTIAL, 1)):
        html = (course / "feedback" / student / lesson / f"{lesson}_exercises.html").read_text()
        expected = f"{lesson}_exercises (Score: {points:.1f} / 3.0)"
        assert expected in html, f"{student}'s feedback does not show {expected!r}"


@pytest.mark.notebook
def test_the_course_grader_gives_the_same_points_as_nbgrader(course):
    """Solution, untouched release and one task done: the two graders agree task by task."""
    lesson = LESSONS[0]
    for student in (*STUDENTS, PARTIAL):
        submission = course / "submitted" / student / lesson / f"{lesson}_exercises.ipynb"
        ours = grade(submission, cell_timeout=300, quiet=True)
        theirs = scores(course, lesson, student)
        assert {f"check-{t.task.replace('.', '-')}": t.points for t in ours.tasks} == theirs, (student, ours.tasks)
    assert ours.points == 1 and ours.max_points == 3  # the partial submission: 00.2 only


@pytest.mark.notebook
def test_nbgrader_runs_checks_in_the_submissions_kernel_so_a_forgery_passes_what_follows_it(course):
    """What instructors.md says of nbgrader: the forgery the course's grader scores 0/3 (test_grading.py) gets the
    points of every check that runs after the forging cell (00.2's and 00.3's), though neither task is done."""
    assert scores(course, LESSONS[0], FORGED) == {"check-00-1": 0.0, "check-00-2": 1.0, "check-00-3": 1.0}


@pytest.mark.notebook
def test_autograde_refuses_a_notebook_whose_read_only_cell_lost_its_metadata(tmp_path):
    """nbgrader puts read-only cells back by grade_id; one whose metadata was removed would run as edited (the
    setup cell below replaces every check: 3/3 with nbgrader's own steps). The course's configuration refuses it."""
    lesson = LESSONS[0]
    nbgrader_course(tmp_path, out=open(os.devnull, "w"))
    for other in (tmp_path / "source").iterdir():
        if other.name != lesson:
            shutil.rmtree(other)
    nbgrader(tmp_path, "generate_assignment", lesson, "--force")
    nb = nbformat.read(tmp_path / "release" / lesson / SOLUTIONS[0].name, as_version=4)
    setup = next(c for c in nb.cells if "from course_lib.teaching import checks" in c.source)
    setup.metadata.pop("nbgrader")
    setup.source += ("\nfor name in dir(checks):\n    if name.startswith('check_'):\n"
                     "        setattr(checks, name, lambda *args, **kwargs: None)\n")
    target = tmp_path / "submitted" / "stripped" / lesson / SOLUTIONS[0].name
    target.parent.mkdir(parents=True)
    nbformat.write(nb, target)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run([sys.executable, "-m", "nbgrader", "autograde", lesson, "--create", "--force"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "LockedCellsMissing" in done.stderr and "lost their nbgrader metadata" in done.stderr, done.stderr[-3000:]
    got = scores(tmp_path, lesson, "stripped")
    assert set(got) == {"check-00-1", "check-00-2", "check-00-3"} and not any(got.values()), got
