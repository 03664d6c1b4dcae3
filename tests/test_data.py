"""course_lib.data: verified MNIST from a mirror, refusal of bad files, the offline error, tensors."""
import gzip
import shutil

import pytest
import torch

from course_lib import data
from course_lib.display import shown_path
from course_lib.data import MIRROR_ENV, MNIST_FILES, DataError, md5, mnist_tensors, prepare_mnist


def test_prepare_copies_and_extracts_from_the_mirror(tmp_path, mirror, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    raw = prepare_mnist(tmp_path)
    for name, expected in MNIST_FILES.items():
        assert md5(raw / name) == expected
        assert (raw / name.removesuffix(".gz")).read_bytes() == gzip.decompress((raw / name).read_bytes())
    from torchvision.datasets import MNIST

    assert len(MNIST(str(tmp_path), train=True, download=False)) == 60000
    assert len(MNIST(str(tmp_path), train=False, download=False)) == 10000


def test_prepare_with_valid_files_prints_one_line_and_touches_nothing(tmp_path, mirror, monkeypatch, capsys):
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    raw = prepare_mnist(tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in raw.iterdir()}
    capsys.readouterr()
    monkeypatch.delenv(MIRROR_ENV)  # the second call needs no source at all
    assert prepare_mnist(tmp_path) == raw
    assert capsys.readouterr().out == f"MNIST ready in {shown_path(raw)}\n"
    assert {p.name: p.stat().st_mtime_ns for p in raw.iterdir()} == before, "nothing copied or extracted again"


def test_mirror_file_with_wrong_md5_is_refused_and_left_untouched(tmp_path, mirror, monkeypatch):
    bad_mirror = tmp_path / "mirror"
    shutil.copytree(mirror, bad_mirror)
    victim = bad_mirror / "t10k-labels-idx1-ubyte.gz"
    victim.write_bytes(gzip.compress(b"not mnist"))
    before = victim.read_bytes()
    monkeypatch.setenv(MIRROR_ENV, str(bad_mirror))
    with pytest.raises(DataError) as err:
        prepare_mnist(tmp_path / "data")
    message = str(err.value)
    assert "t10k-labels-idx1-ubyte.gz" in message
    assert MNIST_FILES["t10k-labels-idx1-ubyte.gz"] in message and md5(victim) in message
    assert "untouched" in message
    assert victim.read_bytes() == before
    assert not (tmp_path / "data" / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").exists()


def test_corrupt_local_file_is_moved_aside_and_replaced(tmp_path, mirror, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    raw = prepare_mnist(tmp_path)
    (raw / "train-labels-idx1-ubyte.gz").write_bytes(b"truncated")
    prepare_mnist(tmp_path)
    assert md5(raw / "train-labels-idx1-ubyte.gz") == MNIST_FILES["train-labels-idx1-ubyte.gz"]
    assert (raw / "train-labels-idx1-ubyte.gz.bad").read_bytes() == b"truncated"


def test_offline_without_mirror_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(MIRROR_ENV, raising=False)

    def offline(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr("torchvision.datasets.MNIST.download", offline)
    with pytest.raises(DataError) as err:
        prepare_mnist(tmp_path)
    assert MIRROR_ENV in str(err.value) and "train-images-idx3-ubyte.gz" in str(err.value)


def test_mirror_missing_a_file_says_which(tmp_path, mirror, monkeypatch):
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(mirror / "train-images-idx3-ubyte.gz", partial)
    monkeypatch.setenv(MIRROR_ENV, str(partial))
    with pytest.raises(DataError, match="has no file train-labels-idx1-ubyte.gz"):
        prepare_mnist(tmp_path / "data")


def test_tensors_are_the_whole_split_normalized(tmp_path, mirror, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    prepare_mnist(tmp_path)
    X, y = mnist_tensors(train=False, root=tmp_path)
    assert X.shape == (10000, 1, 28, 28) and X.dtype == torch.float32
    assert y.shape == (10000,) and y.dtype == torch.int64 and set(y.unique().tolist()) == set(range(10))
    Xtr, _ = mnist_tensors(train=True, root=tmp_path)
    assert Xtr.shape[0] == 60000
    assert abs(Xtr.mean().item()) < 0.01 and abs(Xtr.std().item() - 1) < 0.01


def test_tensors_match_torchvision_dataset(tmp_path, mirror, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    prepare_mnist(tmp_path)
    X, y = mnist_tensors(train=False, root=tmp_path)
    _, val = data.mnist_datasets(tmp_path)
    image, label = val[123]
    expected = (image - data.MNIST_MEAN) / data.MNIST_STD
    assert label == y[123].item()
    assert torch.allclose(X[123], expected, atol=1e-5)


def test_tensors_before_prepare_say_what_to_run(tmp_path):
    with pytest.raises(DataError, match="prepare-data"):
        mnist_tensors(train=True, root=tmp_path)
