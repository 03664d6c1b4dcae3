"""Write a training script from a notebook cell, as a plain file that runs from a shell.

Defined for lesson 00: ``%%write_script PATH`` (after ``%load_ext course_lib``) or ``write_script(PATH, text)``.
Defined for lesson 02: ``%%write_script PATH --base BASE`` writes a script derived from BASE, another script of
the course, and shows the difference as a coloured diff. A derived script is its base plus marked regions::

    # >>> snapshot: resume from the newest checkpoint
    ...lines that are new, or replace the base's lines at this place...
    # <<< snapshot

Outside its regions it must equal its base line for line; ``write_script`` refuses it otherwise, so the
lessons' scripts cannot drift apart. BASE names the path another cell writes (``runs/02_ddp/train.py``): its
text is read from the lesson notebook that holds that cell, so a lesson never needs an earlier one run first.
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

from .display import in_notebook

ROOT = Path(__file__).resolve().parent.parent
BEGIN = re.compile(r"^\s*# >>> (?P<name>[\w.-]+)(:.*)?$")
END = re.compile(r"^\s*# <<< (?P<name>[\w.-]+)\s*$")


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
        print(f"Wrote {path} ({lines} lines). Run it from a shell in {Path.cwd()} with:\n  {launch_hint(path, text)}")
        if base is not None:
            show_diff(base_text, text, base, str(path))
    return path


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
    return f"torchrun --standalone --nproc-per-node 2 {path}"


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
        for notebook in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb")):
            for target, _, body in script_cells(notebook):
                if target == wanted:
                    return body
    path = Path(script)
    if path.is_file():
        return path.read_text()
    raise LineageError(f"no cell of the course writes {wanted} (looked in notebooks/ and solutions/ of {ROOT}), "
                       "and there is no such file. Pass the path as the base's own %%write_script line gives it.")


def script_cells(notebook: str | os.PathLike) -> list[tuple[str, str | None, str]]:
    """Each ``%%write_script`` cell of a notebook as (target path, base or None, script text)."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    found = []
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] != "code" or not source.startswith("%%write_script"):
            continue
        first, _, body = source.partition("\n")
        target, base = parse_magic_line(first[len("%%write_script"):])
        found.append((Path(target).as_posix(), base, body if body.endswith("\n") else body + "\n"))
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
    from IPython.display import HTML, display

    colours = {"+": "#e6ffec", "-": "#ffebe9", "@": "#ddf4ff"}
    rows = "".join(f'<div style="background:{colours.get(line[:1], "transparent")}">{html.escape(line) or " "}</div>'
                   for line in lines[2:])
    display(HTML(f"<details open><summary><b>{html.escape(summary)}</b></summary>"
                 f'<pre style="font-size:85%;line-height:1.25">{rows}</pre></details>'))


def write_script_magic(line: str, cell: str) -> None:
    """``%%write_script PATH [--base BASE]``: write the cell to PATH (the cell itself is not executed)."""
    if not line.strip():
        raise ValueError("Usage: %%write_script PATH, e.g. %%write_script runs/00_setup/hello.py")
    target, base = parse_magic_line(line)
    write_script(target, cell, base=base)


def load_ipython_extension(ipython) -> None:
    ipython.register_magic_function(write_script_magic, magic_kind="cell", magic_name="write_script")
