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
from ..scripts import LESSON_GLOB

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


def _outside_regions(lines: list[str]) -> tuple[int, int]:
    """(anchor lines, repeated-base lines) of a ``%%write_script ... --base`` cell; (0, 0) for any other cell.

    Outside its regions a derived cell holds ``# ...`` (the base's lines there, not stored) and base lines. A base line
    right beside a region is its anchor: it says where the region goes, as ``splice`` finds it. Every other base
    line is a copy of the base stored again: repeated base.
    """
    if not (lines and lines[0].startswith("%%write_script") and "--base" in lines[0]):
        return 0, 0
    kinds = []  # per line after the magic: "region" (a marker or inside one), "kept" ('# ...') or "base"
    depth = 0
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("# >>>"):
            depth += 1
            kinds.append("region")
        elif stripped.startswith("# <<<"):
            depth = max(0, depth - 1)
            kinds.append("region")
        else:
            kinds.append("region" if depth else "kept" if stripped == "# ..." else "base")
    anchors = sum(1 for i, kind in enumerate(kinds) if kind == "base" and (
        (i > 0 and kinds[i - 1] == "region") or (i + 1 < len(kinds) and kinds[i + 1] == "region")))
    return anchors, kinds.count("base") - anchors


def measure(path: str | Path) -> LessonSize:
    """The sizes of one notebook, read from its file (outputs play no part)."""
    cells = json.loads(Path(path).read_text())["cells"]
    words = code = asserts = repeated = anchors = 0
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "markdown":
            words += len(source.split())
            continue
        if cell["cell_type"] != "code":
            continue
        lines = [line for line in source.splitlines() if line.strip()]
        anchored, copied = _outside_regions(lines)
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
