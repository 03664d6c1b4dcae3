"""A lesson read in several sittings comes as parts (04a_..., 04b_...): each part runs on its own, has its own claims,
and the lesson's exercises follow its last part."""
import json

import pytest

from course_lib.scripts import LESSON_GLOB, script_cells, write_scripts_of
from course_lib.teaching import book
from course_lib.teaching.verify import claims_of
from notebook_runner import ROOT

LESSONS = sorted((ROOT / "notebooks").glob(LESSON_GLOB))


def test_write_scripts_of_writes_an_earlier_parts_scripts_as_its_cells_do(tmp_path, monkeypatch, capsys):
    """A later part launches what an earlier one wrote: the files are the earlier notebook's scripts, bases spliced."""
    notebook = next(p for p in LESSONS if any(base for _, base, _ in script_cells(p)))  # one with a derived script
    monkeypatch.chdir(tmp_path)
    written = write_scripts_of(notebook.stem)
    expected = {target: text for target, _, text in script_cells(notebook)}
    assert {p.as_posix() for p in written} == set(expected)
    for target, text in expected.items():
        assert (tmp_path / target).read_text() == text, target
    assert f"Wrote the {len(expected)} scripts of {notebook.name}" in capsys.readouterr().out


def test_write_scripts_of_names_a_notebook_that_is_not_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no notebook 99z_nothing.ipynb"):
        write_scripts_of("99z_nothing")
    assert not list(tmp_path.iterdir()), "nothing is written when the notebook is not found"


def test_every_lesson_and_part_has_claims_of_its_own():
    """Claims belong to a notebook by its full name: a part's module is claims/lessonNNa.py, not its lesson's."""
    for lesson in LESSONS:
        check = claims_of(lesson.stem)
        assert check is not None, f"{lesson.name} has no claims module (course_lib/teaching/claims/lesson" \
                                  f"{lesson.stem.split('_')[0]}.py)"
        assert check.__module__.endswith(f"lesson{lesson.stem.split('_')[0]}"), (lesson.name, check.__module__)


def test_a_lessons_parts_are_numbered_in_order_and_its_exercises_follow_the_last_one():
    numbers = {}
    for lesson in LESSONS:
        numbers.setdefault(lesson.stem[:2], []).append(lesson.stem.split("_")[0])
    for number, stems in numbers.items():
        if len(stems) > 1:  # parts a, b, c, ... with no gap
            assert stems == [f"{number}{chr(ord('a') + i)}" for i in range(len(stems))], stems
        exercises = sorted((ROOT / "exercises").glob(f"{number}_*_exercises.ipynb"))
        attached = [lesson.stem for lesson in LESSONS if lesson.stem[:2] == number and book.exercises_of(lesson)]
        assert attached == ([max(p.stem for p in LESSONS if p.stem[:2] == number)] if exercises else []), number


def test_each_part_says_which_part_it_is_and_names_the_others():
    """A reader who opens 04b first learns there is a 04a, and what it holds."""
    by_number = {}
    for lesson in LESSONS:
        by_number.setdefault(lesson.stem[:2], []).append(lesson)
    for parts in by_number.values():
        if len(parts) < 2:
            continue
        for part in parts:
            first = json.loads(part.read_text())["cells"][0]
            text = "".join(first["source"])
            assert text.startswith(f"# {part.stem.split('_')[0]} · "), f"{part.name}: title {text[:40]!r}"
            others = [p.stem for p in parts if p != part]
            missing = [o for o in others if o not in text]
            assert not missing, f"{part.name}'s introduction does not name {missing}"
