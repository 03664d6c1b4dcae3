"""exercises/ is generated from solutions/ in nbgrader's format: in sync and leaking nothing (nbgrader runs them: test_nbgrader.py)."""
import subprocess
import sys

import nbformat
import pytest

from course_lib.teaching.exercises import (BEGIN, CODE_STUB, END, EXERCISES, SOLUTIONS, MarkerError, annotate,
                                           build, make_exercise, solution_notebooks, solution_regions)
from course_lib.teaching.grading import task_of
from notebook_runner import ROOT

SOLUTION_PATHS = solution_notebooks()


def _id(path):
    return path.stem


def _nb(*cells):
    nb = nbformat.v4.new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _check(task, **course):
    return nbformat.v4.new_code_cell("assert True", metadata={"course": {"task": task, **course}})


# --- the generator ---------------------------------------------------------------------------------


def test_a_region_becomes_the_stub_at_its_indentation_and_the_hint_above_it_stays():
    source = ("def f(x):\n    y = 1\n    # Hint: double it\n    ### BEGIN SOLUTION\n    return 2 * x\n"
              "    ### END SOLUTION\n\nprint(f(1))")
    exercise = make_exercise(_nb(nbformat.v4.new_code_cell(source), _check("t")))
    stub = "\n".join("    " + line for line in CODE_STUB.split("\n"))
    assert exercise.cells[0].source == f"def f(x):\n    y = 1\n    # Hint: double it\n{stub}\n\nprint(f(1))"
    assert stub.endswith("    raise NotImplementedError(\"replace these two lines with your answer, then run the check below\")")


@pytest.mark.parametrize("source,problem", [
    (f"{BEGIN}\n### HINT: double it\nx = 1\n{END}", "hint inside a region"),
    (f"x = 1  # {BEGIN}\ny = 2\n{END}", "a line of its own"),
])
def test_what_nbgrader_would_read_differently_is_an_error_naming_the_cell(source, problem):
    with pytest.raises(MarkerError, match=f"cell 0, line .*{problem}"):
        make_exercise(_nb(nbformat.v4.new_code_cell(source), _check("t")))


def test_cells_get_nbgrader_roles_outputs_are_cleared_and_nothing_else_changes():
    solved = nbformat.v4.new_code_cell(f"{BEGIN}\nx = 1\n{END}", execution_count=3,
                                       outputs=[nbformat.v4.new_output("stream", text="hi")])
    check = _check("02.1", points=2)
    prose = nbformat.v4.new_markdown_cell("Explain what the check does.")
    solution = annotate(_nb(solved, check, prose))
    roles = [{k: c.metadata.nbgrader[k] for k in ("solution", "grade", "locked", "grade_id")} for c in solution.cells]
    assert roles == [{"solution": True, "grade": False, "locked": False, "grade_id": "answer-02-1"},
                     {"solution": False, "grade": True, "locked": True, "grade_id": "check-02-1"},
                     {"solution": False, "grade": False, "locked": True, "grade_id": prose.id}]
    assert solution.cells[1].metadata.nbgrader["points"] == 2
    exercise = make_exercise(solution)
    assert exercise.cells[0].outputs == [] and exercise.cells[0].execution_count is None
    assert [c.metadata.get("editable", True) for c in exercise.cells] == [True, False, False]
    assert exercise.cells[1].source == check.source and exercise.cells[2].source == prose.source
    assert len({c.metadata.nbgrader["checksum"] for c in exercise.cells}) == 3


def test_a_written_answer_or_an_answer_after_the_last_check_is_an_error():
    prose = nbformat.v4.new_markdown_cell(f"Explain:\n{BEGIN}\nthe answer\n{END}")
    with pytest.raises(MarkerError, match="written answer"):
        annotate(_nb(prose, _check("t")))
    with pytest.raises(MarkerError, match="after the last check"):
        annotate(_nb(_check("t"), nbformat.v4.new_code_cell(f"{BEGIN}\nx = 1\n{END}")))


@pytest.mark.parametrize("source", [f"{BEGIN}\nx = 1", f"x = 1\n{END}", f"{BEGIN}\n{BEGIN}\n{END}\n{END}"])
def test_unbalanced_markers_are_an_error_naming_the_cell(source):
    with pytest.raises(MarkerError, match="cell 0"):
        make_exercise(_nb(nbformat.v4.new_code_cell(source)))


def test_build_annotates_solutions_writes_missing_and_removes_stale_exercises(tmp_path):
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    solutions.mkdir(), exercises.mkdir()
    nbformat.write(_nb(nbformat.v4.new_code_cell(f"{BEGIN}\nx = 1\n{END}"), _check("t")),
                   solutions / "01_a_exercises.ipynb")
    (exercises / "99_gone_exercises.ipynb").write_text("{}")
    problems = build(solutions, exercises, check=True)
    assert len(problems) == 3 and "nbgrader's metadata" in problems[0]
    build(solutions, exercises)
    assert [p.name for p in exercises.iterdir()] == ["01_a_exercises.ipynb"]
    assert build(solutions, exercises, check=True) == []
    assert nbformat.read(solutions / "01_a_exercises.ipynb", as_version=4).cells[1].metadata.nbgrader["grade"]


# --- the committed notebooks -------------------------------------------------------------------------


def test_there_are_solution_notebooks():
    assert SOLUTION_PATHS, "no notebooks in solutions/"


def test_exercises_are_in_sync_with_solutions():
    problems = build(SOLUTIONS, EXERCISES, check=True)
    assert not problems, "\n".join(problems) + "\nRun `python -m course_lib exercises build` and commit exercises/."


def test_exercises_build_check_command_passes():
    done = subprocess.run([sys.executable, "-m", "course_lib", "exercises", "build", "--check"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", SOLUTION_PATHS, ids=_id)
def test_no_solution_text_leaks_into_the_exercise(path):
    """Every line of an answer that appears nowhere else in the solution must be absent from the exercise."""
    solution = nbformat.read(path, as_version=4)
    exercise_text = "\n".join(c.source for c in nbformat.read(EXERCISES / path.name, as_version=4).cells)
    outside = "\n".join(c.source for c in make_exercise(solution).cells)  # the solution minus its answers
    regions = solution_regions(solution, str(path))
    assert regions, f"{path.name} has no solution region"
    for region in regions:
        for line in region.lines:
            text = line.strip()
            if len(text) < 8 or text.startswith("#") or text in outside:
                continue  # blank, a comment, or a line that is also given outside the answers
            assert text not in exercise_text, f"{path.name}: solution line leaks into the exercise: {text!r}"


@pytest.mark.parametrize("path", SOLUTION_PATHS, ids=_id)
def test_every_task_has_an_answer_region_and_a_tagged_check(path):
    nb = nbformat.read(path, as_version=4)
    tasks, since_check = [], []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and task_of(cell):
            assert any(BEGIN in c.source for c in since_check), \
                f"{path.name}: task {task_of(cell)}'s check (cell {index}) follows no solution region"
            tasks.append(task_of(cell))
            since_check = []
        else:
            since_check.append(cell)
    assert 2 <= len(tasks) <= 4, f"{path.name}: {len(tasks)} tasks, expected 2 to 4"
    assert len(set(tasks)) == len(tasks), f"{path.name}: task ids repeat: {tasks}"
    assert not any(BEGIN in c.source for c in since_check), f"{path.name}: a solution region after the last check"


def test_a_check_says_not_attempted_without_launching_while_the_placeholder_is_there(tmp_path, monkeypatch):
    from course_lib import launch
    from course_lib.teaching.checks.harness import NotAttempted, launch_script, run_harness

    for launcher in ("torchrun", "launch_ranks"):
        monkeypatch.setattr(launch, launcher, lambda *a, **k: pytest.fail("launched a script that holds the placeholder"))
    script = tmp_path / "task.py"
    script.write_text("def main():\n" + "\n".join("    " + line for line in CODE_STUB.splitlines()) + "\n")
    with pytest.raises(NotAttempted, match="not attempted"):
        launch_script("t", script)
    with pytest.raises(NotAttempted, match="not attempted"):
        run_harness("t", script, "pass")


def test_a_checks_launch_gives_each_rank_torchruns_variables_and_only_lesson_04s_gets_the_agent(tmp_path):
    """A learner's whole script is launched as torchrun would start its ranks, without the agent that imports torch
    first; task 04.2's script reads the restart count only torchrun's agent sets, so ``agent=True`` keeps it."""
    from course_lib.teaching.checks.harness import launch_script, rank_outputs

    script = tmp_path / "env.py"
    script.write_text("import os\nnames = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', "
                      "'MASTER_PORT', 'TORCHELASTIC_RESTART_COUNT')\n"
                      "print(' '.join(f'{n}={os.environ.get(n)}' for n in names))\n")
    for agent in (False, True):
        outputs = rank_outputs(launch_script("t", script, nproc=3, agent=agent))
        assert sorted(outputs) == [0, 1, 2], outputs
        for rank, text in outputs.items():
            seen = dict(pair.split("=", 1) for pair in text.split())
            assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"], seen["LOCAL_WORLD_SIZE"]) == \
                (str(rank), str(rank), "3", "3"), text
            assert seen["MASTER_ADDR"] != "None" and seen["MASTER_PORT"].isdigit(), text
            assert seen["TORCHELASTIC_RESTART_COUNT"] == ("0" if agent else "None"), text
