"""The workbook as a book: every lesson executed as a learner's Run All runs it (its own defaults), or with
``--fast`` in its fast settings, and rendered, outputs and plots included, into a static HTML site by Sphinx with
myst-nb. The lesson list is the index, each lesson links to its exercises (as
released to learners, not executed), and every page names the machine its outputs came from.

  python3 -m course_lib book [--out build/book] [--only 00,02] [--reuse DIR] [--timeout SECONDS] [--fast]

Each lesson it executes is then checked against what it claims about its run (``course_lib.teaching.verify``); a
claim that does not hold stops the build. So the default build is how a learner's defaults are checked outside CI;
``--fast`` (what the tests build) runs each lesson with the fast settings it names instead, and every page says
which settings produced it.

``--reuse DIR`` takes a lesson's executed copy from DIR when it was executed from the committed source (the same
sha256) with the settings this build asks for, for example the copies the notebook tests leave in ``test-output/executed``; every other lesson is
executed here, one after the other (they launch processes of their own). The site is ``OUT/html/index.html``;
``OUT/src`` holds what Sphinx read (the executed notebooks with their provenance cell, the index, ``conf.py``), and
``OUT/executed`` the lessons this build executed, as they came from the kernel.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from ..scripts import LESSON_GLOB

ROOT = Path(__file__).resolve().parents[2]
TITLE = "Distributed training in PyTorch, hands-on"

CONF = '''\
# Written by `python -m course_lib book`; the notebooks beside it were executed before Sphinx runs.
project = {title!r}
extensions = ["myst_nb"]
nb_execution_mode = "off"  # executed by course_lib's book command, with each lesson's fast settings
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
html_theme = "alabaster"
html_title = project
html_theme_options = {{"description": "Executed on {machine_short}", "show_relbars": True,
                      "page_width": "1280px", "body_max_width": "none"}}  # room for code and wide tables
html_show_sourcelink = False
html_show_copyright = False
nb_merge_streams = True  # a launch prints line by line: one block per cell and stream, as JupyterLab shows it
nb_ipywidgets_js = {{}}  # no widget JavaScript from a CDN: the pages work offline (widgets shown as text)
exclude_patterns = ["_build", "downloads"]  # downloads/: the released exercise notebooks, as files
'''


class BookError(RuntimeError):
    """A lesson did not run, or Sphinx failed; the message names the lesson or the log and what to do."""


@dataclass
class Book:
    index: Path  # the site's front page
    lessons: list[str]  # the lessons' stems, in order
    executed: list[str] = field(default_factory=list)  # executed by this build
    reused: list[str] = field(default_factory=list)  # taken from --reuse
    seconds: float = 0.0  # the whole build, execution included
    sphinx_seconds: float = 0.0


def lessons(only: list[str] | None = None, source: Path = ROOT / "notebooks") -> list[Path]:
    """The lesson notebooks in ``source``, in order; ``only``: those whose name starts with one of these ("02")."""
    every = sorted(Path(source).glob(LESSON_GLOB))
    found = [p for p in every if any(p.stem.startswith(prefix) for prefix in only)] if only else every
    if not found:
        raise BookError(f"no lesson in {source} starts with {', '.join(only)}; the lessons are "
                        + ", ".join(p.stem for p in every) if only else f"no lessons (NN_name.ipynb) in {source}")
    return found


def exercises_of(lesson: Path) -> Path | None:
    """The lesson's exercises (``exercises/NN_topic_exercises.ipynb``), after its last part where it has several."""
    number = lesson.stem[:2]
    later = [p for p in lesson.parent.glob(f"{number}*_*.ipynb") if p.stem > lesson.stem]
    found = sorted((ROOT / "exercises").glob(f"{number}_*_exercises.ipynb"))
    return found[0] if found and not later else None


def title_of(nb) -> str:
    """The notebook's first heading, without its '#'."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return "(untitled)"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def executed_copy(lesson: Path, reuse: Path | None, fast: bool = False) -> nbformat.NotebookNode | None:
    """The executed copy of ``lesson`` in ``reuse`` if it ran from the lesson's committed source with the settings
    asked for (its fast ones, or a learner's defaults), else None."""
    if reuse is None or not (reuse / lesson.name).is_file():
        return None
    nb = nbformat.read(reuse / lesson.name, as_version=4)
    record = nb.metadata.get("course", {}).get("executed", {})
    from .notebooks import fast_parameters

    wanted = fast_parameters(nbformat.read(lesson, as_version=4)) if fast else {}
    return nb if record.get("source_sha256") == _sha256(lesson) and record.get("parameters") == wanted else None


def _execute(lesson: Path, timeout: int, defaults: bool = False) -> nbformat.NotebookNode:
    """Run a lesson (its fast settings, or with ``defaults`` a learner's Run All) and check what it claims."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    from .notebooks import execute
    from .verify import ClaimFailed, verify

    try:
        nb = execute(lesson, {} if defaults else None, timeout=timeout, by="the book's build")
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        first = str(exc).strip().splitlines()
        raise BookError(f"{lesson.name} did not run top to bottom, so the book was not built: "
                        f"{type(exc).__name__}: {' '.join(first[-3:])[:600]}\nRun it in JupyterLab to see where, "
                        f"or build the other lessons with --only.") from exc
    try:
        verify(lesson.stem, nb, lesson.parent)
    except ClaimFailed as failed:
        raise BookError(f"{failed}\nThe book was not built: its pages would say what this run did not show.") from None
    return nb


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_REPR = re.compile(r"^\s*[A-Z]\w*\(")  # a widget's repr, e.g. "VBox(children=(...": not worth showing


def static_widgets(nb) -> int:
    """Replace every widget output by its text form (a progress bar's says how far it got), or by a short note
    where that is only the widget's repr (the launch panel's); drop the saved widget state. A static page cannot
    run widgets without JavaScript from a CDN. Returns how many were replaced."""
    replaced = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data:
                text = data.get("text/plain", "")
                if WIDGET_REPR.match(text) or not text.strip():
                    text = "[an interactive widget: it runs in JupyterLab; a static page cannot show it]"
                output["data"] = {"text/plain": text}
                replaced += 1
    nb.metadata.pop("widgets", None)
    return replaced


def _provenance(record: dict, exercises: str | None) -> nbformat.NotebookNode:
    params = ", ".join(f"`{k} = {v!r}`" for k, v in record.get("parameters", {}).items())
    load = record.get("load_average_at_start")
    load_text = (f" (load average {load:.1f} on {record.get('cpu_count')} CPUs when it started: its timings are "
                 "those of that moment)") if load is not None else ""
    text = (f":::{{note}}\nThe outputs on this page were produced on **{record['machine']}**{load_text}, finished "
            f"{record['finished']}, in {record['seconds']:.0f} s, "
            + (f"with the lesson's **fast settings** injected after its parameters cell: {params}. A learner's Run "
               "All uses the lesson's own defaults: longer runs, other numbers." if params else
               "with the lesson's **own defaults**, as a learner's Run All runs it.")
            + " A run of your own prints other times and, on other hardware, other choices "
            "(GPUs and NCCL where there are GPUs). ")
    if exercises:
        text += f"This lesson's exercises: [{exercises.split('/')[-1]}]({exercises})."
    else:
        text += "This lesson has no exercises."
    return nbformat.v4.new_markdown_cell(text + "\n:::")


def _exercise_page(path: Path, lesson: Path, built_on: str) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    note = nbformat.v4.new_markdown_cell(
        f":::{{note}}\nThe exercises of [lesson {lesson.stem[:2]}](../lessons/{lesson.name}), as released to "
        "learners: not executed here, so there are no outputs. Download the notebook, "
        f"{{download}}`{path.name} <../downloads/{path.name}>`, and run it in JupyterLab beside the lesson; "
        "`python3 -m course_lib grade` or nbgrader grades it "
        f"(docs/instructors.md). The book was built on {built_on}.\n:::")
    nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0, note)
    return nb


def _index(pages: list[tuple[Path, nbformat.NotebookNode, Path | None]], built_on: str, built_at: str,
           fast: bool = False) -> str:
    settings = ("with the fast settings it names (a learner's Run All uses larger defaults: longer runs, other numbers)"
                if fast else "with its own defaults, as a learner's Run All runs it")
    rows = []
    for lesson, nb, exercises in pages:
        record = nb.metadata["course"]["executed"]
        rows.append(f"| [{title_of(nb)}](lessons/{lesson.name}) | {record['seconds']:.0f} s, {record['finished']} | "
                    + (f"[exercises](exercises/{exercises.name})" if exercises else "none") + " |")
    # each lesson's exercises right after it: the sidebar and the previous / next links go lesson, its exercises, ...
    toc = "\n".join(f"lessons/{lesson.stem}" + (f"\nexercises/{ex.stem}" if ex else "") for lesson, _, ex in pages)
    return f"""# {TITLE}

A hands-on course, from DDP's ideas to torchrun's elastic launcher, Hugging Face Accelerate and the Trainer, what
DDP does inside and what to do when a model does not fit. Each lesson writes real training scripts and launches
them on real processes; below, each one is shown as it ran, with its outputs and plots.

Built {built_at} on **{built_on}**. Every lesson ran top to bottom in a fresh kernel {settings}; each page says
with which settings, when it ran, how long it took and how busy the machine was. On a machine with GPUs the same lessons choose NCCL and one process per GPU. To run them yourself:
`python3 -m course_lib lab`.

| Lesson | Executed | Exercises |
|---|---|---|
{chr(10).join(rows)}

```{{toctree}}
:caption: Lessons and their exercises
:maxdepth: 1
:hidden:

{toc}
```
"""


def build(out: Path = ROOT / "build" / "book", only: list[str] | None = None, reuse: Path | None = None,
          timeout: int = 900, log=print, source: Path = ROOT / "notebooks", fast: bool = False) -> Book:
    """Execute the lessons in ``source`` (or take them from ``reuse``), check what each claims about its run
    (``verify``), write the Sphinx source into ``out/src`` and build ``out/html``. The lessons run with a learner's
    settings (their defaults), or with ``fast`` with the fast settings each names. The previous site is replaced only
    once the new one is built."""
    from ..devices import machine_summary

    start = time.monotonic()
    out = Path(out)
    chosen = lessons(only, source)
    book = Book(index=out / "html" / "index.html", lessons=[p.stem for p in chosen])
    pages = []
    for i, lesson in enumerate(chosen, 1):
        nb = executed_copy(lesson, reuse, fast)
        if nb is not None:
            book.reused.append(lesson.stem)
            log(f"[{i}/{len(chosen)}] {lesson.stem}: executed copy from {reuse} (same source)")
        else:
            log(f"[{i}/{len(chosen)}] {lesson.stem}: executing with its {'fast settings' if fast else 'own defaults'} ...")
            nb = _execute(lesson, timeout, defaults=not fast)
            (out / "executed").mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, out / "executed" / lesson.name)  # a later build can take it: --reuse OUT/executed
            book.executed.append(lesson.stem)
            log(f"[{i}/{len(chosen)}] {lesson.stem}: ran in {nb.metadata['course']['executed']['seconds']:.0f} s")
        pages.append((lesson, nb, exercises_of(lesson)))

    built_on = machine_summary()
    built_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    src = out / "src"
    if src.exists():
        shutil.rmtree(src)
    (src / "lessons").mkdir(parents=True)
    (src / "exercises").mkdir()
    (src / "downloads").mkdir()
    for lesson, nb, exercises in pages:
        nb = nbformat.from_dict(nb)
        record = nb.metadata["course"]["executed"]
        at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
        nb.cells.insert(at, _provenance(record, f"../exercises/{exercises.name}" if exercises else None))
        static_widgets(nb)
        nbformat.write(nb, src / "lessons" / lesson.name)
        if exercises:
            nbformat.write(_exercise_page(exercises, lesson, built_on), src / "exercises" / exercises.name)
            shutil.copyfile(exercises, src / "downloads" / exercises.name)  # exactly as released
    (src / "index.md").write_text(_index(pages, built_on, built_at, fast))
    (src / "conf.py").write_text(CONF.format(title=TITLE, machine_short=built_on.split(";")[0]))

    log("Sphinx: rendering the pages ...")
    sphinx_start = time.monotonic()
    html_new = out / "html.new"
    shutil.rmtree(html_new, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going",
                           "-d", str(out / "doctrees"), str(src), str(html_new)], capture_output=True, text=True)
    if done.returncode != 0:
        (out / "sphinx.log").write_text(done.stdout + done.stderr)
        raise BookError(f"Sphinx could not build the book (exit {done.returncode}); its messages are in "
                        f"{out / 'sphinx.log'}:\n{(done.stdout + done.stderr).strip()[-1500:]}")
    shutil.rmtree(out / "html", ignore_errors=True)
    html_new.rename(out / "html")
    book.sphinx_seconds = time.monotonic() - sphinx_start
    book.seconds = time.monotonic() - start
    log(f"The book is at {book.index} ({len(chosen)} lessons: {len(book.executed)} executed, {len(book.reused)} "
        f"reused; {book.seconds:.0f} s, Sphinx {book.sphinx_seconds:.0f} s).")
    return book


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib book", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book", help="where src/ and html/ go")
    parser.add_argument("--only", default="", help="comma-separated lesson prefixes, e.g. 00,02 (default: all)")
    parser.add_argument("--reuse", type=Path, help="a folder of executed lessons to take when their source matches")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a cell may run (default 900)")
    parser.add_argument("--fast", action="store_true",
                        help="run each lesson with the fast settings it names (what the tests run), not its defaults")
    args = parser.parse_args(argv)
    from ..data import prepare_mnist

    prepare_mnist()  # the lessons train on it
    try:
        build(args.out, only=[s for s in args.only.split(",") if s] or None, reuse=args.reuse, timeout=args.timeout,
              fast=args.fast)
    except BookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
