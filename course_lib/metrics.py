"""Metrics as JSON lines: the scripts append them on rank 0, the notebook reads and plots them.

One object per line, e.g. ``{"event": "epoch", "epoch": 0, "train_loss": 0.31, "val_acc": 0.917}``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


def log_metrics(run_dir: str | os.PathLike, rank: int = 0, **record) -> None:
    """Append ``record`` as one JSON line to ``run_dir/metrics.jsonl``; only rank 0 writes."""
    if rank != 0:
        return
    path = Path(run_dir) / METRICS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def read_metrics(run_dir: str | os.PathLike, event: str | None = None) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` (those of one ``event`` if given); [] if none.

    A last line still being written (no newline yet) is skipped, so this is safe during a run.
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines(keepends=True):
        if not line.endswith("\n") or not line.strip():
            continue
        record = json.loads(line)
        if event is None or record.get("event") == event:
            records.append(record)
    return records


def plot_metrics(runs, keys=("train_loss", "val_acc"), event: str = "epoch", ax=None):
    """Plot ``keys`` per epoch for one run or several (``{label: records_or_run_dir}``)."""
    import matplotlib.pyplot as plt

    if not isinstance(runs, dict):
        runs = {"run": runs}
    series = {}
    for label, source in runs.items():
        records = source.metrics if hasattr(source, "metrics") else source
        if isinstance(records, (str, os.PathLike)):
            records = read_metrics(records)
        series[label] = [r for r in records if r.get("event") == event]
    if ax is None:
        fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.5), squeeze=False)
        axes = axes[0]
    else:
        axes = [ax] if len(keys) == 1 else ax
    for ax_, key in zip(axes, keys):
        for label, records in series.items():
            xs = [r["epoch"] + 1 for r in records if key in r]
            ys = [r[key] for r in records if key in r]
            ax_.plot(xs, ys, marker="o", label=label)
        ax_.set_xlabel("epoch")
        ax_.set_ylabel(key)
        ax_.grid(alpha=0.3)
        if len(series) > 1:
            ax_.legend()
    plt.tight_layout()
    return axes
