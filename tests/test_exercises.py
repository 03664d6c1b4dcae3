"""exercises/ is generated from solutions/: in sync, leaking nothing, and stopping at the first task."""
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from course_lib.teaching.exercises import (BEGIN, DEFAULT_HINT, END, EXERCISES, SOLUTIONS, MarkerError, build,
                                  make_exercise, solution_notebooks, solution_regions)
from course_lib.teaching.grading import NOT_ATTEMPTED_ERRORS, task_of
from notebook_runner import ROOT, fast_parameters, inject_parameters

SOLUTION_PATHS = solution_notebooks()


def _id(path):
    return path.stem


def _nb(*cells):
    nb = nbformat.v4.new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


# --- the generator ---------------------------------------------------------------------------------


def test_a_region_becomes_an_indented_raise_with_its_hint():
    source = ("def f(x):\n    y = 1\n    ### BEGIN SOLUTION\n    ### HINT: double it\n    return 2 * x\n"
              "    ### END SOLUTION\n\nprint(f(1))")
    exercise = make_exercise(_nb(nbformat.v4.new_code_cell(source)))
    assert exercise.cells[0].source == ("def f(x):\n    y = 1\n    # YOUR CODE HERE\n"
                                        "    raise NotImplementedError('double it')\n\nprint(f(1))")


def test_a_region_without_hint_gets_the_default_hint_at_its_indentation():
    cell = nbformat.v4.new_code_cell(f"if True:\n        {BEGIN}\n        x = 1\n        {END}")
    assert make_exercise(_nb(cell)).cells[0].source.endswith(f"        raise NotImplementedError({DEFAULT_HINT!r})")


def test_outputs_are_cleared_and_other_cells_are_unchanged():
    solved = nbformat.v4.new_code_cell(f"{BEGIN}\nx = 1\n{END}", execution_count=3,
                                       outputs=[nbformat.v4.new_output("stream", text="hi")])
    other = nbformat.v4.new_code_cell("print('keep me')", metadata={"course": {"task": "t"}})
    prose = nbformat.v4.new_markdown_cell(f"Explain:\n{BEGIN}\nthe answer\n{END}")
    exercise = make_exercise(_nb(solved, other, prose))
    assert exercise.cells[0].outputs == [] and exercise.cells[0].execution_count is None
    assert exercise.cells[1] == other
    assert exercise.cells[2].source == "Explain:\nYOUR ANSWER HERE"


@pytest.mark.parametrize("source", [f"{BEGIN}\nx = 1", f"x = 1\n{END}", f"{BEGIN}\n{BEGIN}\n{END}\n{END}"])
def test_unbalanced_markers_are_an_error_naming_the_cell(source):
    with pytest.raises(MarkerError, match="cell 0"):
        make_exercise(_nb(nbformat.v4.new_code_cell(source)))


def test_build_writes_missing_and_removes_stale_exercises(tmp_path):
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    solutions.mkdir(), exercises.mkdir()
    nbformat.write(_nb(nbformat.v4.new_code_cell(f"{BEGIN}\nx = 1\n{END}")), solutions / "01_a_exercises.ipynb")
    (exercises / "99_gone_exercises.ipynb").write_text("{}")
    assert len(build(solutions, exercises, check=True)) == 2
    build(solutions, exercises)
    assert [p.name for p in exercises.iterdir()] == ["01_a_exercises.ipynb"]
    assert build(solutions, exercises, check=True) == []


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


@pytest.mark.notebook
@pytest.mark.parametrize("path", SOLUTION_PATHS, ids=_id)
def test_exercise_runs_to_not_implemented_at_its_first_task(path):
    exercise = EXERCISES / path.name
    nb = inject_parameters(nbformat.read(exercise, as_version=4), fast_parameters(nbformat.read(exercise, as_version=4)))
    first_check = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and task_of(c))
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(EXERCISES)}})
    with pytest.raises(CellExecutionError) as caught:
        client.execute()
    failing = next(i for i, c in enumerate(nb.cells)
                   if any(o.get("output_type") == "error" for o in c.get("outputs", [])))
    assert caught.value.ename in NOT_ATTEMPTED_ERRORS, f"{exercise.name} stopped with {caught.value.ename}: {caught.value.evalue}"
    assert failing <= first_check, f"{exercise.name} failed in cell {failing}, after its first task's check (cell {first_check})"
