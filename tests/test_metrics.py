"""JSON-lines metrics: rank 0 writes, the reader tolerates a line being written, plotting works."""
import matplotlib

from course_lib.metrics import log_metrics, plot_metrics, read_metrics

matplotlib.use("Agg")


def test_only_rank_zero_writes(tmp_path):
    log_metrics(tmp_path, rank=1, event="epoch", epoch=0)
    assert read_metrics(tmp_path) == []
    log_metrics(tmp_path, rank=0, event="epoch", epoch=0, val_acc=0.9)
    assert read_metrics(tmp_path) == [{"event": "epoch", "epoch": 0, "val_acc": 0.9}]


def test_filter_by_event_and_skip_partial_last_line(tmp_path):
    log_metrics(tmp_path, event="epoch", epoch=0)
    log_metrics(tmp_path, event="step", step=1)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"event": "epo')  # a writer in the middle of a line
    assert [r["event"] for r in read_metrics(tmp_path)] == ["epoch", "step"]
    assert read_metrics(tmp_path, event="step") == [{"event": "step", "step": 1}]


def test_missing_file_reads_as_no_records(tmp_path):
    assert read_metrics(tmp_path / "nothing") == []


def test_plot_draws_one_line_per_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for run, acc in ((a, 0.8), (b, 0.9)):
        for epoch in range(3):
            log_metrics(run, event="epoch", epoch=epoch, train_loss=1 / (epoch + 1), val_acc=acc)
    axes = plot_metrics({"a": a, "b": read_metrics(b)})
    assert len(axes) == 2 and len(axes[1].get_lines()) == 2
    assert list(axes[0].get_lines()[0].get_xdata()) == [1, 2, 3]
