"""The rendered book (``python -m course_lib book``): every lesson with its outputs and plots, an index, links to the
exercises, the machine named on every page; and the pages render in a real browser.

The book is built from the executed lessons the notebook tests leave in ``test-output/executed`` (these tests run
after them, see conftest.py); a lesson without a matching copy there is executed here. The site goes to
``test-output/book/html`` so that it can be looked at after a run.
"""
from __future__ import annotations

import base64
import re
import struct
from html import unescape
from pathlib import Path

import nbformat
import pytest

from course_lib.devices import machine_summary
from course_lib.teaching import book
from notebook_runner import ROOT
from test_notebooks import EXECUTED, LESSONS

OUT = ROOT / "test-output" / "book"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def site(mirror) -> book.Book:
    return book.build(OUT, reuse=EXECUTED, fast=True)


def _pngs(nb) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for c in nb.cells for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]


@pytest.mark.notebook
def test_the_index_lists_every_lesson_in_order_with_its_exercises(site):
    index = _text(site.index)
    links = re.findall(r'href="lessons/(\d\d[a-z]?_\w+)\.html"', index)
    assert list(dict.fromkeys(links)) == [p.stem for p in LESSONS]
    for lesson in LESSONS:
        exercises = book.exercises_of(lesson)  # a lesson's, after its last part
        if exercises:
            assert f'href="exercises/{exercises.stem}.html"' in index, lesson.name
    every = sorted((ROOT / "exercises").glob("*_exercises.ipynb"))
    assert all(f'href="exercises/{e.stem}.html"' in index for e in every), "an exercise notebook is not in the index"
    assert machine_summary() in index


@pytest.mark.notebook
@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_a_lesson_page_shows_its_outputs_plots_machine_and_exercises(site, lesson):
    page = OUT / "html" / "lessons" / f"{lesson.stem}.html"
    html = _text(page)
    executed = nbformat.read(OUT / "src" / "lessons" / lesson.name, as_version=4)
    record = executed.metadata["course"]["executed"]
    assert record["source_sha256"] == book._sha256(lesson), "the page was not made from the committed lesson"
    assert f"<strong>{record['machine']}</strong>" in html and record["finished"] in html
    # every plot the run produced is on the page, as a PNG file beside it
    images = re.findall(r'<img[^>]+src="\.\./(_images/[^"]+\.png)"', html)
    pngs = _pngs(executed)
    assert len(images) == len(pngs), f"{len(pngs)} plots in the run, {len(images)} on the page"
    for name in images:
        data = (OUT / "html" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24])[0] > 100, name
    # the last printed line of each cell's output is on the page (escaped as HTML escapes it)
    streams = [o["text"].strip().splitlines()[-1] for c in executed.cells for o in c.get("outputs", [])
               if o.get("output_type") == "stream" and o["text"].strip()]
    assert streams, "the run printed nothing"
    plain = unescape(re.sub(r"<[^>]+>", "", html))
    missing = [line for line in streams if re.sub(r"\x1b\[[0-9;]*m", "", line).strip() not in plain]
    assert not missing, f"{len(missing)} of {len(streams)} outputs are not on the page, e.g. {missing[:2]}"
    # nothing is fetched from elsewhere to show the page (widgets are text), except MathJax where there is math
    scripts = re.findall(r'<script[^>]+src="(https?://[^"]+)"', html)
    assert all("mathjax" in s for s in scripts), scripts
    exercises = book.exercises_of(lesson)
    if exercises:
        assert f'href="../exercises/{exercises.stem}.html"' in html
        ex_html = _text(OUT / "html" / "exercises" / f"{exercises.stem}.html")
        download = re.search(r'class="reference download internal" download="" href="\.\./(_downloads/[^"]+)"', ex_html)
        assert download, "the exercises page offers no download of the notebook"
        assert (OUT / "html" / download.group(1)).read_bytes() == exercises.read_bytes(), "not the released notebook"


def _notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 00 · A small lesson")]
                                  + [nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.mark.parallel  # a book of its own small lesson, not of the executed lessons
def test_widgets_become_text_and_a_lesson_that_fails_leaves_the_previous_book(tmp_path):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    _notebook(lessons / "00_small.ipynb", "import ipywidgets as w\ndisplay(w.VBox([w.IntProgress(3, max=5)]))",
              "print('printed by the small lesson')")
    first = book.build(tmp_path / "out", source=lessons, log=lambda *_: None)
    assert first.executed == ["00_small"] and first.reused == []
    html = _text(first.index.parent / "lessons" / "00_small.html")
    assert "printed by the small lesson" in html and "an interactive widget: it runs in JupyterLab" in html
    assert "widget-state" not in html and "embed-amd" not in html
    # the copy it executed is taken again while the source is unchanged, and not once it changes
    again = book.build(tmp_path / "out", source=lessons, reuse=tmp_path / "out" / "executed", log=lambda *_: None)
    assert again.reused == ["00_small"] and again.executed == []
    _notebook(lessons / "00_small.ipynb", "print('changed')", "1 / 0")
    with pytest.raises(book.BookError, match=r"00_small\.ipynb did not run top to bottom.*ZeroDivisionError"):
        book.build(tmp_path / "out", source=lessons, reuse=tmp_path / "out" / "executed", log=lambda *_: None)
    assert "printed by the small lesson" in _text(first.index.parent / "lessons" / "00_small.html")


@pytest.mark.parallel
def test_the_book_runs_a_learners_defaults_unless_fast_and_each_page_says_which(tmp_path):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    path = _notebook(lessons / "00_small.ipynb", "STEPS = 1000", "print(f'trained {STEPS} steps')")
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].metadata["tags"] = ["parameters"]
    nb.metadata["course"] = {"fast_parameters": {"STEPS": 3}}
    nbformat.write(nb, path)
    quiet = {"source": lessons, "log": lambda *_: None}

    learner = book.build(tmp_path / "out", **quiet)
    def page(built):  # as a reader sees it, with Sphinx's typographic apostrophes written plainly
        return unescape(re.sub(r"<[^>]+>", "", _text(built.index.parent / "lessons" / "00_small.html"))).replace("\u2019", "'")

    html = page(learner)
    assert "trained 1000 steps" in html and "own defaults, as a learner's Run All runs it" in html
    assert "with its own defaults, as a learner's Run All runs it" in _text(learner.index).replace("\u2019", "'")

    # a copy executed with the other settings is not taken: the fast build runs the lesson again
    fast = book.build(tmp_path / "out", reuse=tmp_path / "out" / "executed", fast=True, **quiet)
    assert fast.executed == ["00_small"] and fast.reused == []
    html = page(fast)
    assert "trained 3 steps" in html and "fast settings injected after its parameters cell: STEPS = 3" in html
    assert "with the fast settings it names" in _text(fast.index).replace("\u2019", "'")
    again = book.build(tmp_path / "out", reuse=tmp_path / "out" / "executed", fast=True, **quiet)
    assert again.reused == ["00_small"]


@pytest.mark.parallel
def test_only_names_lessons_that_exist(tmp_path):
    with pytest.raises(book.BookError, match="no lesson in .* starts with 42; the lessons are 00_setup"):
        book.build(tmp_path, only=["42"])


@pytest.mark.browser
@pytest.mark.notebook
def test_a_lesson_page_renders_its_plots_in_a_browser(site):
    from test_browser import SHOTS, require_browser

    executable = require_browser()
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    lesson = "02b_ddp_results"  # plots, the launch panel's text form, and (its lesson's last part) exercises
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable)
        page = chromium.new_page(viewport={"width": 1200, "height": 1000})
        page.goto((OUT / "html" / "index.html").as_uri())
        page.get_by_role("link", name=re.compile(r"^02b · ")).first.click()
        page.wait_for_load_state("load")
        assert page.url.endswith(f"lessons/{lesson}.html")
        images = page.locator("img")
        assert images.count() >= 1
        for i in reversed(range(images.count())):  # the screenshot below shows the first
            image = images.nth(i)
            image.scroll_into_view_if_needed()
            assert image.evaluate("i => i.complete && i.naturalWidth > 100 && i.getBoundingClientRect().width > 100"), \
                f"plot {i} did not render"
        page.screenshot(path=str(SHOTS / "book_02_ddp.png"), full_page=False)
        page.get_by_role("link", name=re.compile(r"_exercises\.ipynb$")).first.click()
        page.wait_for_load_state("load")
        assert page.url.endswith("exercises/02_ddp_exercises.html")
        assert page.get_by_text("Task 02.1").first.is_visible()
        page.screenshot(path=str(SHOTS / "book_02_exercises.png"))
        chromium.close()
