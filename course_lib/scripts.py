"""Write a training script from a notebook cell, as a plain file that runs from a shell.

Defined for lesson 00: ``%%write_script PATH`` (after ``%load_ext course_lib``) or ``write_script(PATH, text)``.
Defined for lesson 02: ``%%write_script PATH --base BASE`` writes a script derived from BASE, another script of
the course, and shows the difference as a coloured diff. A derived script is its base plus marked regions::

    # >>> snapshot: resume from the newest checkpoint
    ...lines that are new, or replace the base's lines at this place...
    # <<< snapshot

Outside its regions it must equal its base line for line; ``write_script`` refuses it otherwise, so the
lessons' scripts cannot drift apart. The cell need not repeat the base: a line ``# ...`` stands for the base's
lines at that place, unchanged, and a few base lines next to each region say where it goes::

    p.add_argument("--seed", type=int, default=0)
    # >>> bucket-cap: the bucket size
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    # <<< bucket-cap
    return p.parse_args()
    # ...

``write_script`` splices the regions into the base and writes the complete file (see ``splice``). A base that is
derived in turn keeps its own markers, and they are base lines like any other: a cell anchors on them and never
repeats the base's regions (see ``cell_tokens``). BASE names the path another cell writes
(``runs/02_ddp/train.py``): its text is read from the lesson notebook that holds that cell, so a lesson never
needs an earlier one run first.
"""
from __future__ import annotations

import argparse
import difflib
import html
import json
import os
import re
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .display import in_notebook, shown_path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = re.compile(r"^\s*# >>> (?P<name>[\w.-]+)(:.*)?$")
END = re.compile(r"^\s*# <<< (?P<name>[\w.-]+)\s*$")
#: A lesson notebook: ``02_ddp.ipynb``, or one part of a lesson read in two or three sittings, ``04a_torchrun_restarts.ipynb``
#: then ``04b_...``. A lesson's parts write under one folder, ``runs/04_torchrun_elastic/``, named after the lesson.
LESSON_GLOB = "[0-9][0-9]*_*.ipynb"
KEPT = re.compile(r"^\s*# \.\.\.\s*$")  # in a derived cell: the base's lines at this place, unchanged


class LineageError(ValueError):
    """A derived script differs from its base outside its marked regions, or its markers do not pair up."""


def write_script(path: str | os.PathLike, text: str, quiet: bool = False, base: str | None = None) -> Path:
    """Write ``text`` to ``path`` atomically (parent folders created); return the path.

    With ``base`` (a script path another cell writes), first check that ``text`` is that base plus marked
    regions, and show the diff.
    """
    path = Path(path)
    if not text.endswith("\n"):
        text += "\n"
    if base is not None:
        base_text = script_source(base)
        text = splice(base_text, text, name=str(path), base_name=base)
        check_lineage(base_text, text, name=str(path), base_name=base)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private (0600); a script is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not quiet:
        lines = text.count("\n")
        where = shown_path(Path.cwd())
        where = f"this folder ({Path.cwd().name}/)" if where == "." else where
        if is_module(text):
            print(f"Wrote {shown_path(path)} ({lines} lines), a module: code that imports it puts "
                  f"{shown_path(path.parent)}/ on sys.path, then `import {path.stem}`.")
        else:
            print(f"Wrote {shown_path(path)} ({lines} lines). Run it from a shell in {where} with:\n"
                  f"  {launch_hint(path, text)}")
        if base is not None:
            show_diff(base_text, text, base, str(path))
    return path


def is_module(text: str) -> bool:
    """A file that declares what it exports (``__all__``) and has no ``if __name__ == "__main__":`` is a module that
    a lesson's ranks (and its tests and the benchmark) import, not a script to run: lesson 08's checks.py and
    timing.py."""
    return bool(re.search(r"^__all__ = ", text, flags=re.M)) and not re.search(r"^if __name__ == .__main__.:", text,
                                                                              flags=re.M)


def positive_int(text: str) -> int:
    """An argparse type for a count that must be 1 or more (``--max-steps 0`` would otherwise train whole epochs)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a number of steps: give 1 or more, or leave the flag out "
                                         "to train whole epochs")
    return value


def launch_hint(path: Path, text: str) -> str:
    """The command the script's docstring gives (its author knows best), else a plain torchrun line."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("torchrun ", "accelerate launch", "ACCELERATE_USE_CPU=", "python ")):
            return stripped
    return f"torchrun --standalone --nproc-per-node 2 {shown_path(path)}"


# ---------------------------------------------------------------- lineage: base + marked regions

@dataclass
class Region:
    name: str
    first: int  # line index of the BEGIN marker
    last: int   # line index of the END marker


def regions(text: str) -> list[Region]:
    """The marked regions of a script, in order; markers must pair up and not nest."""
    found, open_ = [], None
    for i, line in enumerate(text.splitlines()):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if open_ is not None:
                raise LineageError(f"line {i + 1}: region {begin['name']!r} starts inside region {open_.name!r} "
                                   f"(line {open_.first + 1}); close that one first with '# <<< {open_.name}'")
            open_ = Region(begin["name"], i, -1)
        elif end:
            if open_ is None or open_.name != end["name"]:
                raise LineageError(f"line {i + 1}: '# <<< {end['name']}' closes no open region "
                                   f"{'(open: ' + repr(open_.name) + ')' if open_ else ''}")
            open_.last = i
            found.append(open_)
            open_ = None
    if open_ is not None:
        raise LineageError(f"line {open_.first + 1}: region {open_.name!r} is never closed; "
                           f"add '# <<< {open_.name}' after its last line")
    return found


def outside_regions(text: str) -> list[list[str]]:
    """The script's lines outside its regions, as the runs between regions (one more run than regions)."""
    lines, runs, position = text.splitlines(), [], 0
    for region in regions(text):
        runs.append(lines[position:region.first])
        position = region.last + 1
    runs.append(lines[position:])
    return runs


def lineage_matches(base_text: str, derived_text: str) -> bool:
    """True when the derived script equals its base outside its regions (each region may stand for any base lines)."""
    base, runs = base_text.splitlines(), outside_regions(derived_text)
    if len(runs) == 1:
        return runs[0] == base
    first, *middle, last = runs
    if base[:len(first)] != first or (last and base[len(base) - len(last):] != last) or len(first) + len(last) > len(base):
        return False
    position, end = len(first), len(base) - len(last)
    for run in middle:  # leftmost match of each run is enough (glob matching with '*' between runs)
        found = next((i for i in range(position, end - len(run) + 1) if base[i:i + len(run)] == run), None)
        if found is None:
            return False
        position = found + len(run)
    return True


def cell_tokens(base_text: str, cell_text: str, name: str = "the script") -> list[tuple[str, list[str] | None]]:
    """A derived cell read against its base, in order: ``("context", lines)``, ``("kept", None)`` for ``# ...``,
    ``("region", lines)`` for one of the cell's own regions, markers included.

    A marker line that is one of the base's own lines (a base derived in turn, like lesson 05's train.py with its
    ``accelerate`` regions) is context like any other base line: a cell may anchor a region of its own next to the
    base's regions without repeating them. A region of the cell's own runs from a ``# >>> NAME: why`` line to its
    ``# <<< NAME`` and is not the base's word for word (it may replace a base region of the same name).
    """
    base, lines = base_text.splitlines(), cell_text.splitlines()

    def the_bases(block: list[str]) -> bool:
        return any(base[j:j + len(block)] == block for j in range(len(base) - len(block) + 1))

    tokens, i = [], 0
    while i < len(lines):
        begin = BEGIN.match(lines[i])
        last = begin and next((j for j in range(i + 1, len(lines))
                               if (end := END.match(lines[j])) and end["name"] == begin["name"]), None)
        if begin and lines[i] not in base and last is None:
            raise LineageError(f"{name}, line {i + 1}: region {begin['name']!r} is never closed; "
                               f"add '# <<< {begin['name']}' after its last line")
        # The cell's own region: a marked block the base does not hold (its first line may be the base's, when the
        # region replaces a base region of that name). A base marker with '# ...' before its end is an anchor.
        if begin and (lines[i] not in base or (
                last is not None and not any(KEPT.match(line) for line in lines[i:last])
                and not the_bases(lines[i:last + 1]))):
            tokens.append(("region", lines[i:last + 1]))
            i = last + 1
        elif KEPT.match(lines[i]):
            tokens.append(("kept", None))
            i += 1
        else:
            if not tokens or tokens[-1][0] != "context":
                tokens.append(("context", []))
            tokens[-1][1].append(lines[i])
            i += 1
    return tokens


def splice(base_text: str, cell_text: str, name: str = "the script", base_name: str = "its base") -> str:
    """The complete derived script of a cell that holds its regions, base lines around them, and ``# ...`` lines.

    Base lines in the cell (context) are found in the base in order. Between two of them (or the file's start or
    end) the cell may hold: nothing (the base continues right there); ``# ...`` (the base's lines there, kept);
    regions (they replace the base's lines there); ``# ...`` then a region (kept, then the region is inserted just
    before the next context); a region then ``# ...`` (inserted right after the previous context, then kept). A
    cell without ``# ...`` is the complete script already, and comes back unchanged.
    """
    if not any(KEPT.match(line) for line in cell_text.splitlines()):
        return cell_text
    base = base_text.splitlines()
    tokens = cell_tokens(base_text, cell_text, name)
    out, position, between = [], 0, []
    for kind, chunk in tokens + [("end", None)]:
        if kind in ("kept", "region"):
            between.append((kind, chunk))
            continue
        if kind == "end":
            found = len(base)
        elif not between:
            found = position if _same(base[position:position + len(chunk)], chunk) else None
        else:
            found = next((j for j in range(position, len(base) - len(chunk) + 1)
                          if _same(base[j:j + len(chunk)], chunk)), None)
        if found is None:
            where = "right after the previous one" if not between else "after the previous one"
            raise LineageError(f"{name}: these lines are not in {base_name} {where}:\n    {chunk[0].strip()}\n"
                               "Lines outside the marked regions must be the base's own, in order; put '# ...' "
                               "between two of them to keep the base's lines in between.")
        if not between and found != position:
            raise LineageError(f"{name} leaves out lines {position + 1}-{found} of {base_name} outside any region:"
                               f"\n    {base[position].strip()}\nPut '# ...' there to keep them, or an empty region "
                               "to say they are left out on purpose.")
        kinds = [k for k, _ in between]
        kept = base[position:found]
        regions_text = [line for k, chunk_ in between if k == "region" for line in chunk_]
        if kinds == ["kept"]:
            out += kept
        elif kinds and set(kinds) == {"region"}:
            out += regions_text  # the regions replace the base's lines here
        elif kinds and kinds[0] == "kept" and set(kinds[1:]) == {"region"}:
            out += kept + regions_text
        elif kinds and kinds[-1] == "kept" and set(kinds[:-1]) == {"region"}:
            out += regions_text + kept
        elif kinds:
            first = next(chunk_[0].strip() for k, chunk_ in between if k == "region") if "region" in kinds else "# ..."
            raise LineageError(f"{name}: nothing says where this goes in {base_name}:\n    {first}\nPut a line of "
                               "the base right before or right after each region, between it and any '# ...'.")
        if kind == "context":
            out += base[found:found + len(chunk)]  # the base's own lines, comments included
            position = found + len(chunk)
        between = []
    return "\n".join(out) + "\n"


def _code(line: str) -> str:
    """A line without its inline comment (PEP 8's two spaces then '#'), for lines that have code before it."""
    code, mark, _ = line.partition("  # ")
    return code.rstrip() if mark and code.strip() else line


def _same(base_lines: list[str], cell_lines: list[str]) -> bool:
    """Context lines of a cell match the base's line for line, except that inline comments may differ: a comment
    edited in the base then reaches every derived script, and the cells that hold that line as context need no edit."""
    return len(base_lines) == len(cell_lines) and all(
        b == c or _code(b) == _code(c) != b for b, c in zip(base_lines, cell_lines))


def compact(base_text: str, derived_text: str, context: int = 1) -> str:
    """A cell for ``derived_text``: its own regions, ``context`` non-blank base lines beside each, and ``# ...``.

    A region the base already holds, word for word (lesson 05's ``accelerate`` regions in a script derived from
    lesson 05's train.py), is the base's: ``# ...`` keeps it like any other base line. The inverse of ``splice``:
    ``splice(base_text, compact(base_text, derived_text))`` is ``derived_text`` (more context is taken where one
    line would be found at an earlier place of the base).
    """
    base_lines, lines = base_text.splitlines(), derived_text.splitlines()

    def inherited(region: Region) -> bool:
        block = lines[region.first:region.last + 1]
        return any(base_lines[i:i + len(block)] == block for i in range(len(base_lines) - len(block) + 1))

    every = regions(derived_text)
    own = [region for region in every if not inherited(region)]
    cells = []
    readings = [(found, anchors) for found in ([own, every] if own != every else [every]) for anchors in (False, True)]
    for found, marker_anchors in readings:  # the shortest cell of the readings
        tails = [context] * len(found)  # base lines before each region, grown only where one is found too early
        while max(tails, default=context) < 40:
            text = _compact(derived_text, context, found, marker_anchors, tails)
            try:
                written = splice(base_text, text)
            except LineageError:
                written = None
            if written == derived_text:
                cells.append(text)
                break
            if written is None:
                tails = [t + 1 for t in tails]
                continue
            written_lines = written.splitlines()  # the first line where they part: the next region came too early
            parted = next((i for i, (a, b) in enumerate(zip(written_lines, lines)) if a != b), len(written_lines))
            late = [i for i, region in enumerate(found) if region.first >= parted]
            tails = [t + 1 for t in tails] if not late else [t + (i == late[0]) for i, t in enumerate(tails)]
    return min(cells, key=lambda text: text.count("\n"), default=derived_text)


def _compact(derived_text: str, context: int, found: list[Region], marker_anchors: bool = True,
             tails: list[int] | None = None) -> str:
    """``derived_text`` as its regions ``found``, ``context`` lines beside each and ``# ...``. Without
    ``marker_anchors`` a marker line of the base's regions is never taken as an anchor: a region next to one is
    placed by ``# ...`` and the context on its other side (shorter where the base repeats its ``# <<< NAME`` lines).
    ``tails[i]``, where given, is the number of base lines before region ``i`` instead of ``context``."""
    lines = derived_text.splitlines()
    if not found:
        return derived_text

    def marker(line: str) -> bool:
        return not marker_anchors and bool(BEGIN.match(line) or END.match(line))

    def reach(run, from_end, wanted):
        """How many lines of a run hold ``wanted`` non-blank lines, counted from its start (or end)."""
        seen, taken = 0, 0
        for line in (reversed(run) if from_end else run):
            if seen >= wanted or marker(line):
                break
            taken += 1
            seen += bool(line.strip())
        return taken

    out, position = [], 0
    for index, region in enumerate(found + [None]):
        run = lines[position:region.first if region else len(lines)]
        head = reach(run, False, context) if index > 0 else 0  # after the previous region
        tail = reach(run, True, tails[index] if tails else context) if region else 0  # before this region
        if head + tail < len(run) or any(marker(line) for line in run[head:len(run) - tail]):
            indent = next((line[:len(line) - len(line.lstrip())] for line in run[len(run) - tail:] + run[head:]
                           if line.strip()), "")
            out += run[:head] + [indent + "# ..."] + run[len(run) - tail:]
        else:
            out += run
        if region:
            out += lines[region.first:region.last + 1]
            position = region.last + 1
    return "\n".join(out) + "\n"


def check_lineage(base_text: str, derived_text: str, name: str = "the script", base_name: str = "its base") -> None:
    """Raise LineageError, naming the first stray line, unless ``derived_text`` is ``base_text`` plus regions."""
    if lineage_matches(base_text, derived_text):
        return
    derived = derived_text.splitlines()
    inside = {i for r in regions(derived_text) for i in range(r.first, r.last + 1)}
    matcher = difflib.SequenceMatcher(None, base_text.splitlines(), derived, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        stray = [j for j in range(j1, j2) if j not in inside]
        if tag != "equal" and stray:
            j = stray[0]
            raise LineageError(f"{name}, line {j + 1}, is outside every marked region but not in {base_name}:\n"
                               f"    {derived[j].strip()}\nPut changed lines between '# >>> NAME: why' and "
                               "'# <<< NAME', or change them back to the base's.")
        if tag == "delete" and not ({j1 - 1, j1} & inside):
            raise LineageError(f"{name} leaves out lines {i1 + 1}-{i2} of {base_name} outside any marked region:\n"
                               f"    {base_text.splitlines()[i1].strip()}\nMark the place with an empty region "
                               "('# >>> NAME: why' then '# <<< NAME') to say the lines are left out on purpose.")
    raise LineageError(f"{name} is not {base_name} plus marked regions (the lines outside regions are out of order)")


def script_source(script: str | os.PathLike) -> str:
    """The text of the course script that a ``%%write_script SCRIPT`` cell writes (read from its notebook)."""
    wanted = Path(script).as_posix()
    for folder in ("notebooks", "solutions"):
        for notebook in sorted((ROOT / folder).glob(LESSON_GLOB)):
            for target, base, body in _raw_script_cells(notebook):
                if target == wanted:
                    return body if base is None else splice(script_source(base), body, name=target, base_name=base)
    path = Path(script)
    if path.is_file():
        return path.read_text()
    raise LineageError(f"no cell of the course writes {wanted} (looked in notebooks/ and solutions/ of {ROOT}), "
                       "and there is no such file. Pass the path as the base's own %%write_script line gives it.")


def write_scripts_of(notebook: str, quiet: bool = False) -> list[Path]:
    """Write every script that another notebook's cells write, as they write it (read from that notebook).

    A lesson's second part launches scripts its first part wrote: this writes them again from the first part's cells,
    so the part runs on its own in a fresh kernel, whether or not the first part ran. ``notebook``: its name, with
    or without ``.ipynb`` (``"04a_torchrun_restarts"``), in notebooks/ or solutions/.
    """
    name = notebook if notebook.endswith(".ipynb") else f"{notebook}.ipynb"
    found = [ROOT / folder / name for folder in ("notebooks", "solutions") if (ROOT / folder / name).is_file()]
    if not found:
        raise FileNotFoundError(f"no notebook {name} in notebooks/ or solutions/ of the course")
    written = [write_script(target, text, quiet=True) for target, _, text in script_cells(found[0])]
    if not quiet:
        print(f"Wrote the {len(written)} scripts of {name}: " + ", ".join(Path(t).as_posix() for t, _, _ in
                                                                        script_cells(found[0])))
    return written


def script_cells(notebook: str | os.PathLike, as_written: bool = True) -> list[tuple[str, str | None, str]]:
    """Each ``%%write_script`` cell of a notebook as (target path, base or None, script text).

    The text is the complete script the cell writes (its base spliced in); ``as_written=False`` gives the cell's
    own text instead.
    """
    found = []
    for target, base, body in _raw_script_cells(Path(notebook)):
        if as_written and base is not None:
            body = splice(script_source(base), body, name=target, base_name=base)
        found.append((target, base, body))
    return found


_RAW_CELLS: dict[Path, tuple[float, list]] = {}


def _raw_script_cells(notebook: Path) -> list[tuple[str, str | None, str]]:
    stamp = notebook.stat().st_mtime_ns
    if notebook in _RAW_CELLS and _RAW_CELLS[notebook][0] == stamp:
        return _RAW_CELLS[notebook][1]
    found = []
    for cell in json.loads(notebook.read_text())["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] != "code" or not source.startswith("%%write_script"):
            continue
        first, _, body = source.partition("\n")
        target, base = parse_magic_line(first[len("%%write_script"):])
        found.append((Path(target).as_posix(), base, body if body.endswith("\n") else body + "\n"))
    _RAW_CELLS[notebook] = (stamp, found)
    return found


def parse_magic_line(line: str) -> tuple[str, str | None]:
    words = shlex.split(line)
    base = None
    if "--base" in words:
        at = words.index("--base")
        if at + 1 >= len(words):
            raise ValueError("Usage: %%write_script PATH --base BASE (BASE: the path of the script this one extends)")
        base = words[at + 1]
        del words[at:at + 2]
    if len(words) != 1:
        raise ValueError("Usage: %%write_script PATH [--base BASE], e.g. %%write_script runs/00_setup/hello.py")
    return words[0], base


def diff_lines(base_text: str, derived_text: str, base_name: str, name: str) -> list[str]:
    return list(difflib.unified_diff(base_text.splitlines(), derived_text.splitlines(), base_name, name,
                                     n=2, lineterm=""))


def show_diff(base_text: str, derived_text: str, base_name: str = "base", name: str = "derived") -> None:
    """Show what a derived script adds to its base: coloured in a notebook, as a unified diff elsewhere."""
    lines = diff_lines(base_text, derived_text, base_name, name)
    added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("---"))
    summary = f"{name} = {base_name} + {added} lines, - {removed} lines"
    if not in_notebook():
        print(summary + "\n" + "\n".join(lines))
        return
    from IPython.display import display

    colours = {"+": "#e6ffec", "-": "#ffebe9", "@": "#ddf4ff"}
    rows = "".join(f'<div style="background:{colours.get(line[:1], "transparent")}">{html.escape(line) or " "}</div>'
                   for line in lines[2:])
    # HTML for JupyterLab and the book; the same diff as text for a text-only viewer of the saved notebook.
    display({"text/html": f"<details open><summary><b>{html.escape(summary)}</b></summary>"
                          f'<pre style="font-size:85%;line-height:1.25">{rows}</pre></details>',
             "text/plain": summary + "\n" + "\n".join(lines)}, raw=True)


def write_script_magic(line: str, cell: str) -> None:
    """``%%write_script PATH [--base BASE]``: write the cell to PATH (the cell itself is not executed)."""
    if not line.strip():
        raise ValueError("Usage: %%write_script PATH, e.g. %%write_script runs/00_setup/hello.py")
    target, base = parse_magic_line(line)
    write_script(target, cell, base=base)


def load_ipython_extension(ipython) -> None:
    ipython.register_magic_function(write_script_magic, magic_kind="cell", magic_name="write_script")
