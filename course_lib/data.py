"""MNIST on disk, verified, and as whole tensors.

Defined for lesson 00 (setup); every training script of the workbook reads its data through here.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
from pathlib import Path

import torch

from .display import shown_path
from .errors import DataError  # lives in errors (no torch) so the command line can catch it by type

#: Environment variable naming a folder that holds the four official MNIST ``.gz`` files.
MIRROR_ENV = "COURSE_MNIST_MIRROR"

#: The official files and their md5 sums (the values torchvision's ``MNIST.resources`` lists).
MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}

#: Mean and standard deviation of the training pixels (after scaling to [0, 1]).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081

#: The repository's own ``data/`` folder (git-ignored); scripts take ``--data-dir`` to change it.
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "data"


def md5(path: str | os.PathLike) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _raw_dir(root) -> Path:
    return Path(root) / "MNIST" / "raw"


def _is_valid(path: Path, expected: str) -> bool:
    return path.is_file() and md5(path) == expected


def _extract(gz_path: Path) -> None:
    """Write the uncompressed file beside the ``.gz`` (what torchvision's MNIST reads)."""
    target = gz_path.with_suffix("")
    if target.exists():
        return
    tmp = target.with_name(target.name + ".part")
    with gzip.open(gz_path, "rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.replace(tmp, target)


def _copy_from_mirror(name: str, expected: str, mirror: Path, dest: Path) -> None:
    source = mirror / name
    if not source.is_file():
        raise DataError(
            f"The MNIST mirror folder {mirror} (from ${MIRROR_ENV}) has no file {name}. "
            f"Put the four official files there ({', '.join(MNIST_FILES)}) or unset {MIRROR_ENV} "
            "to download them with torchvision."
        )
    actual = md5(source)
    if actual != expected:
        raise DataError(
            f"Checksum mismatch for {source}: expected md5 {expected}, got {actual}. "
            "The file was left untouched and NOT used. Replace it with the official MNIST file "
            "(or delete it and download again)."
        )
    tmp = dest.with_name(dest.name + ".part")
    shutil.copyfile(source, tmp)
    os.replace(tmp, dest)


def _download(raw: Path) -> None:
    from torchvision.datasets import MNIST

    try:
        MNIST(str(raw.parent.parent), train=True, download=True)
        MNIST(str(raw.parent.parent), train=False, download=True)
    except Exception as exc:  # offline: URLError, socket errors, RuntimeError from torchvision
        raise DataError(
            "MNIST is not on disk and could not be downloaded "
            f"({type(exc).__name__}: {exc}). If this machine is offline, put the four official "
            f"files ({', '.join(MNIST_FILES)}) in a folder and point the environment variable "
            f"{MIRROR_ENV} at it, e.g. `export {MIRROR_ENV}=/path/to/mnist/raw`, then run again."
        ) from None


def prepare_mnist(root: str | os.PathLike = DEFAULT_ROOT, verbose: bool = True) -> Path:
    """Make ``root/MNIST/raw`` hold the four verified MNIST files; return that folder.

    Sources, in order: files already there with the right md5; the folder named by
    ``$COURSE_MNIST_MIRROR``; torchvision's download. A file with a wrong checksum is never used:
    one found in ``root`` is moved aside to ``<name>.bad`` and fetched again.
    """
    raw = _raw_dir(root)
    raw.mkdir(parents=True, exist_ok=True)
    missing = []
    for name, expected in MNIST_FILES.items():
        path = raw / name
        if path.exists() and not _is_valid(path, expected):
            aside = path.with_name(path.name + ".bad")
            os.replace(path, aside)
            path.with_suffix("").unlink(missing_ok=True)  # its extracted copy is suspect too
            if verbose:
                print(f"{path} had md5 {md5(aside)}, expected {expected}: moved aside to {aside.name}")
        if not path.exists():
            missing.append(name)

    if missing:
        mirror = os.environ.get(MIRROR_ENV)
        if mirror:
            for name in missing:
                _copy_from_mirror(name, MNIST_FILES[name], Path(mirror), raw / name)
            if verbose:
                print(f"Copied {len(missing)} MNIST file(s) from the mirror {mirror}")
        else:
            _download(raw)
        for name in missing:
            path = raw / name
            if not _is_valid(path, MNIST_FILES[name]):
                raise DataError(
                    f"{path} does not match the official md5 {MNIST_FILES[name]} after fetching it; "
                    "it was not used. Delete it and run prepare_mnist() again."
                )
    for name in MNIST_FILES:
        _extract(raw / name)
    if verbose and not missing:
        print(f"MNIST ready in {shown_path(raw)}")
    return raw


def mnist_is_ready(root: str | os.PathLike = DEFAULT_ROOT) -> bool:
    """True when all four files are in ``root/MNIST/raw`` with the right checksums."""
    raw = _raw_dir(root)
    return all(_is_valid(raw / name, expected) for name, expected in MNIST_FILES.items())


def _read_idx(path: Path) -> torch.Tensor:
    data = path.read_bytes()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(shape)


def mnist_tensors(train: bool, root: str | os.PathLike = DEFAULT_ROOT) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole split as tensors: images ``(N, 1, 28, 28)`` float32 normalized, labels int64.

    No per-sample PIL work: one read, one normalization. Call ``prepare_mnist`` first.
    """
    raw = _raw_dir(root)
    prefix = "train" if train else "t10k"
    images_path, labels_path = raw / f"{prefix}-images-idx3-ubyte", raw / f"{prefix}-labels-idx1-ubyte"
    if not (images_path.exists() and labels_path.exists()):
        raise DataError(
            f"MNIST is not prepared in {raw}. Run `python -m course_lib prepare-data` "
            "(or course_lib.prepare_mnist()) first."
        )
    images = _read_idx(images_path).unsqueeze(1).float().div_(255).sub_(MNIST_MEAN).div_(MNIST_STD)
    labels = _read_idx(labels_path).long()
    return images, labels


def mnist_datasets(root: str | os.PathLike = DEFAULT_ROOT):
    """The seed's way: torchvision ``MNIST`` datasets with a per-sample ``ToTensor`` (train, val)."""
    from torchvision.datasets import MNIST
    from torchvision.transforms import ToTensor

    _ = prepare_mnist(root, verbose=False)
    return (MNIST(str(root), train=True, transform=ToTensor(), download=False),
            MNIST(str(root), train=False, transform=ToTensor(), download=False))
