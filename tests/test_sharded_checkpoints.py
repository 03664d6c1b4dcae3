"""Lesson 09's sharded checkpoints refuse damaged files by name, before a single tensor is loaded.

``torch.distributed.checkpoint`` (DCP) keeps no checksum: its ``.metadata`` gives each tensor's file, offset and
length, and a tensor is read back with ``torch.load``, which does not check the bytes either. A few bytes flipped
inside a tensor's data load silently as other weights. The lesson's ``save_checkpoint`` writes a manifest (size and
SHA-256 of every file, written last, atomically) and ``load_checkpoint`` checks every file against it first.

One checkpoint is saved by the script's own ``save_checkpoint`` on 2 processes; each test damages a copy of it as a
disk or a copy would (bytes flipped inside a tensor, a shard emptied, cut short or missing) and loads it with the
script's ``load_checkpoint`` in a world of one (plain ``python``).
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from course_lib.launch import rankrun_command
from course_lib.scripts import script_source

SCRIPT = "runs/09_sharding/train_fsdp.py"
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
ENV["OMP_NUM_THREADS"] = "1"

# The script's model, sharded as its main() shards it; run on 2 ranks (save) or plain python (load).
PROGRAM = textwrap.dedent('''
    import importlib.util, json, os, sys, warnings
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    warnings.filterwarnings("ignore")
    here, phase, folder = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    spec = importlib.util.spec_from_file_location("train_fsdp", here / "train_fsdp.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # main() does not run
    if "RANK" not in os.environ:  # plain python: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0 if phase == "save" else 1)  # the loading side starts from other weights
    model = script.MyModel()
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model.conv, model.head):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if phase == "save":
        model(torch.randn(8, 1, 28, 28)).logsumexp(1).mean().backward()
        optimizer.step()
        script.save_checkpoint(folder / "checkpoint-3.pt", model, optimizer, 3, rank)
    else:
        try:
            epoch = script.load_checkpoint(folder, model, optimizer)
        except BaseException as error:  # DCP's CheckpointException is a BaseException
            print(f"REFUSED {type(error).__name__}: {error}", flush=True)
            os._exit(3)
        full = {n: p.full_tensor().tolist() for n, p in model.named_parameters()}
        (here / "loaded.json").write_text(json.dumps({"epoch": epoch, "params": full}))
    dist.barrier()
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A dcp-3 folder saved by the script's save_checkpoint on 2 processes, and the model it holds (plain)."""
    here = tmp_path_factory.mktemp("sharded-checkpoints")
    (here / "train_fsdp.py").write_text(script_source(SCRIPT))
    (here / "program.py").write_text(PROGRAM)
    done = subprocess.run(rankrun_command(2, here / "program.py", here, "save", here / "checkpoints"),
                          cwd=here, capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    plain = torch.load(here / "checkpoints" / "checkpoint-3.pt", map_location="cpu", weights_only=True)["model"]
    return here / "checkpoints" / "dcp-3", plain


def _copy(saved, tmp_path):
    folder = tmp_path / "dcp-3"
    shutil.copytree(saved[0], folder)
    (tmp_path / "train_fsdp.py").write_text(script_source(SCRIPT))
    (tmp_path / "program.py").write_text(PROGRAM)
    return folder


def _load(tmp_path, folder):
    """The script's load_checkpoint on one process: (return code, what it printed)."""
    done = subprocess.run([sys.executable, str(tmp_path / "program.py"), str(tmp_path), "load", str(folder)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV)
    return done.returncode, done.stdout + done.stderr


def _biggest_tensor(folder, shard):
    """(name, offset, length) of the model's largest tensor record in one shard file, from DCP's own .metadata."""
    import torch.distributed.checkpoint as dcp

    storage = dcp.FileSystemReader(folder).read_metadata().storage_data
    index, info = max(((i, s) for i, s in storage.items() if s.relative_path == shard and i.fqn.startswith("model.")),
                      key=lambda kv: kv[1].length)  # a weight, not the optimizer's momentum of the same size
    return index.fqn, info.offset, info.length


def _flip_inside_a_tensor(folder, shard="__0_0.distcp"):
    """Invert 4 bytes in the middle of the largest tensor's record (its data, not the record's framing)."""
    name, offset, length = _biggest_tensor(folder, shard)
    data = bytearray((folder / shard).read_bytes())
    middle = offset + length // 2
    data[middle:middle + 4] = bytes(b ^ 0xFF for b in data[middle:middle + 4])
    (folder / shard).write_bytes(bytes(data))
    return name


def _assert_refused(code, output, shard):
    assert code == 3, f"load_checkpoint accepted the damaged checkpoint (exit {code}):\n{output[-3000:]}"
    refusal = next(line for line in output.splitlines() if line.startswith("REFUSED"))
    assert shard in refusal, f"the refusal does not name {shard}: {refusal}"
    assert "earlier checkpoint" in refusal, f"the refusal does not say what to do: {refusal}"


def test_dcp_alone_loads_flipped_bytes_inside_a_tensor_without_complaint(saved, tmp_path):
    # Why the manifest exists: DCP and torch.load check nothing. The day they do, this test says so.
    import torch.distributed.checkpoint as dcp

    from course_lib import MyModel

    folder = _copy(saved, tmp_path)
    name = _flip_inside_a_tensor(folder).removeprefix("model.")
    state = {"model": MyModel().state_dict()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
        dcp.load(state, checkpoint_id=folder)
    differs = [k for k, v in saved[1].items() if not torch.equal(state["model"][k], v)]
    assert differs == [name], differs


def test_saving_writes_a_manifest_with_the_size_and_sha256_of_every_file(saved):
    import hashlib

    folder = saved[0]
    manifest = json.loads((folder / "manifest.json").read_text())
    on_disk = sorted(p.name for p in folder.iterdir() if p.name != "manifest.json")
    assert on_disk == [".metadata", "__0_0.distcp", "__1_0.distcp"], on_disk
    assert sorted(manifest["files"]) == on_disk
    for name, entry in manifest["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert not list(folder.parent.glob("*.tmp")) and not list(folder.glob("*.tmp")), "a temporary file was left"


def test_an_intact_checkpoint_loads_exactly(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    code, output = _load(tmp_path, folder)
    assert code == 0, output[-3000:]
    loaded = json.loads((tmp_path / "loaded.json").read_text())
    assert loaded["epoch"] == 3
    assert loaded["params"] == {k: v.tolist() for k, v in saved[1].items() if k in loaded["params"]}
    assert set(loaded["params"]) == {"conv.weight", "conv.bias", "norm.weight", "norm.bias", "head.weight", "head.bias"}


def test_flipped_bytes_inside_a_tensor_are_refused_naming_the_file(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    _flip_inside_a_tensor(folder)
    _assert_refused(*_load(tmp_path, folder), "__0_0.distcp")


def test_an_emptied_shard_is_refused_naming_the_file(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    (folder / "__1_0.distcp").write_bytes(b"")
    _assert_refused(*_load(tmp_path, folder), "__1_0.distcp")


def test_a_truncated_shard_is_refused_naming_the_file(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    shard = folder / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    _assert_refused(*_load(tmp_path, folder), "__0_0.distcp")


def test_a_missing_shard_is_refused_naming_the_file(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    (folder / "__1_0.distcp").unlink()
    _assert_refused(*_load(tmp_path, folder), "__1_0.distcp")


def test_a_changed_metadata_file_is_refused_before_it_is_unpickled(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    (folder / ".metadata").write_bytes((folder / ".metadata").read_bytes() + b"\0")
    _assert_refused(*_load(tmp_path, folder), ".metadata")


def test_a_folder_without_its_manifest_is_not_a_complete_checkpoint(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    (folder / "manifest.json").unlink()
    code, output = _load(tmp_path, folder)
    assert code == 3, output[-3000:]
    refusal = next(line for line in output.splitlines() if line.startswith("REFUSED"))
    assert "manifest.json" in refusal and "not a complete sharded checkpoint" in refusal, refusal
