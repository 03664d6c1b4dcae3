"""How long each lesson is to read: ``python -m course_lib sizes [NOTEBOOK...]``.

Per notebook: words of prose (markdown cells), visible code lines (non-blank lines of code cells that are neither
collapsed in JupyterLab, ``source_hidden``, nor hidden in the book, ``hide-input``/``remove-input``/``remove-cell``/
``hide-cell``), visible ``assert`` lines, and the base lines a ``%%write_script ... --base`` cell stores outside its
marked regions: anchors (a line right beside a region, which says where it goes) and repeated base (any other: a copy
of the base stored again). The one-sitting bar is about 2,500 words and 400 visible
code lines, with no visible assert that is not itself the lesson and no repeated base. No torch here.
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from .exercises import ROOT
from ..scripts import BEGIN, END, LESSON_GLOB, cell_tokens, parse_magic_line, script_source

HIDDEN_TAGS = {"hide-input", "remove-input", "remove-cell", "hide-cell"}
WORDS_BAR, CODE_BAR = 2500, 400


@dataclass
class LessonSize:
    notebook: str
    prose_words: int
    visible_code_lines: int
    visible_asserts: int
    repeated_base_lines: int
    anchor_lines: int = 0  # base lines beside a region, saying where it goes (not counted as repeated)

    @property
    def within_bar(self) -> bool:
        return self.prose_words <= WORDS_BAR and self.visible_code_lines <= CODE_BAR and not self.repeated_base_lines


def _hidden(cell) -> bool:
    meta = cell.get("metadata", {})
    return bool(meta.get("jupyter", {}).get("source_hidden") or HIDDEN_TAGS & set(meta.get("tags", [])))


def _outside_regions(source: str, written: dict[str, str] | None = None) -> tuple[int, int]:
    """(anchor lines, repeated-base lines) of a ``%%write_script ... --base`` cell; (0, 0) for any other cell.

    The cell is read against its base as ``splice`` reads it: its own regions, ``# ...`` (the base's lines there,
    not stored) and base lines, a base's own markers included. The non-blank base lines right beside a region are
    its anchor, which says where it goes: the base's markers there, and the first other line past them. Every other base line is a copy of the base stored again: repeated base.
    """
    first, _, body = source.partition("\n")
    if not (first.startswith("%%write_script") and "--base" in first):
        return 0, 0
    _, base = parse_magic_line(first[len("%%write_script"):])
    base_text = (written or {}).get(base)  # a base that a cell of the same notebook writes, else the course's
    kinds = []  # per non-blank line: "region", "kept", "marker" (one of the base's) or "base"
    for kind, chunk in cell_tokens(script_source(base) if base_text is None else base_text, body):
        kinds += ["kept"] if kind == "kept" else [
            "region" if kind == "region" else "marker" if BEGIN.match(line) or END.match(line) else "base"
            for line in chunk if line.strip()]
    anchored = set()
    for i, kind in enumerate(kinds):
        if kind != "region":
            continue
        for step in (-1, 1):  # outwards: the base's markers, then the first other base line
            j = i + step
            while 0 <= j < len(kinds) and kinds[j] == "marker":
                anchored.add(j)
                j += step
            if 0 <= j < len(kinds) and kinds[j] == "base":
                anchored.add(j)
    stored = [i for i, kind in enumerate(kinds) if kind in ("base", "marker")]
    anchors = len(anchored)
    return anchors, len(stored) - anchors


def measure(path: str | Path) -> LessonSize:
    """The sizes of one notebook, read from its file (outputs play no part)."""
    cells = json.loads(Path(path).read_text())["cells"]
    words = code = asserts = repeated = anchors = 0
    written = {}  # the scripts this notebook's own cells write whole
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        first, _, body = source.partition("\n")
        if cell["cell_type"] == "code" and first.startswith("%%write_script") and "--base" not in first:
            written[parse_magic_line(first[len("%%write_script"):])[0]] = body
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "markdown":
            words += len(source.split())
            continue
        if cell["cell_type"] != "code":
            continue
        lines = [line for line in source.splitlines() if line.strip()]
        anchored, copied = _outside_regions(source, written)
        anchors, repeated = anchors + anchored, repeated + copied
        if _hidden(cell):
            continue
        code += len(lines)
        asserts += sum(1 for line in lines if re.match(r"\s*assert\b", line))
    return LessonSize(Path(path).name, words, code, asserts, repeated, anchors)


def table(sizes: list[LessonSize]) -> str:
    width = max([26] + [len(s.notebook) for s in sizes])
    header = (f"{'notebook':<{width}} {'words':>6} {'code':>5} {'asserts':>7} {'repeated':>8} {'anchors':>7}  "
              "within the bar")
    rows = [f"{s.notebook:<{width}} {s.prose_words:>6,} {s.visible_code_lines:>5,} {s.visible_asserts:>7} "
            f"{s.repeated_base_lines:>8,} {s.anchor_lines:>7,}  {'yes' if s.within_bar else 'no'}" for s in sizes]
    return "\n".join([header, "-" * len(header), *rows])


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib sizes", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="default: every lesson in notebooks/")
    parser.add_argument("--json", action="store_true", help="one JSON object per notebook instead of a table")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob(LESSON_GLOB))
    sizes = [measure(p) for p in paths]
    print("\n".join(json.dumps(asdict(s)) for s in sizes) if args.json else table(sizes))
    return 0
