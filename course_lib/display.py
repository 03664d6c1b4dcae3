"""What every lesson shows besides plots: a table of results, and an empty folder for a run."""
from __future__ import annotations

import functools
import html
import math
import re
import shutil
from pathlib import Path


COURSE = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def _site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def _roots() -> list[tuple[Path, str]]:
    """The folders a lesson never prints in full, most specific first, with what it writes instead."""
    return [(Path.cwd(), ""), (COURSE, "<course>/"), (Path.home(), "~/")]


def shown_path(path: str | Path) -> str:
    """A path as a lesson prints it: relative to the working folder when inside it, else to the course's folder
    (``<course>/...``) or the home folder (``~/...``); absolute only when it is elsewhere. A notebook's saved output
    then names no folder of the machine it ran on."""
    path = Path(path).absolute()
    for root, prefix in _roots():
        try:
            rest = path.relative_to(root).as_posix()
        except ValueError:
            continue
        return (prefix + rest if rest != "." else prefix or ".")
    return str(path)


def shown_text(text: str) -> str:
    """``text`` (a rank's line, a traceback) with the folders of this machine written as ``shown_path`` writes them,
    the Python environment's packages as ``<site-packages>/``, and without the C++ source locations gloo puts in
    front of its errors (``[/__w/pytorch/.../pair.cc:561] ``, a folder of the machine that built torch)."""
    for root, prefix in [(Path(_site_packages()), "<site-packages>/"), *_roots()]:
        folder = str(root)
        if len(folder) > 1:  # never "/" itself
            text = text.replace(folder.rstrip("/") + "/", prefix)
    return re.sub(r"\[/[^\]\s]*\.(?:cc|cpp|h):\d+\] ", "", text)


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where HTML shows), False in a shell, a terminal IPython or a test."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return type(get_ipython()).__name__ == "ZMQInteractiveShell"


def show_table(rows: list[dict], columns: list[str] | None = None, title: str | None = None,
               formats: dict[str, str] | None = None) -> None:
    """Show a list of dicts as a table: HTML in Jupyter, aligned text anywhere else.

    ``columns``: which keys, in order (default: the first row's); ``formats``: a format per column, e.g.
    ``{"val_acc": "{:.4f}"}``. A missing key shows as an empty cell.
    """
    columns = list(columns or (rows[0] if rows else []))
    formats = formats or {}

    def cell(row, column):
        value = row.get(column, "")
        return formats[column].format(value) if column in formats and value != "" else str(value)

    cells = [[cell(row, c) for c in columns] for row in rows]
    if in_notebook():
        from IPython.display import HTML, display

        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in cells)
        caption = f"<caption style='text-align:left'><b>{html.escape(title)}</b></caption>" if title else ""
        # The rows themselves travel in the output's metadata, so that what a lesson says about its tables can be
        # checked from the executed notebook (course_lib.teaching.verify) instead of by asserts in the lesson.
        data = {"title": title, "columns": columns, "rows": [{c: _plain(row.get(c)) for c in columns} for row in rows]}
        display(HTML(f"<table>{caption}<tr>{head}</tr>{body}</table>"), metadata={"course_table": data})
        return
    widths = [max(len(str(c)), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = [title] if title else []
    lines.append("  ".join(str(c).ljust(w) for c, w in zip(columns, widths)).rstrip())
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    print("\n".join(lines))


def _plain(value):
    """A table cell as JSON keeps it: numbers and strings as they are, anything else (a tensor, a path) as text.

    JSON has no NaN or infinity: a diverged loss travels as the text "nan", "inf" or "-inf" (course_lib.teaching.verify
    reads those back as floats), instead of a message Jupyter fails to serialize.
    """
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def fresh_run_dir(path: str | Path) -> Path:
    """``path`` as an empty folder: a checkpoint left there by an earlier execution would be resumed."""
    folder = Path(path)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder
