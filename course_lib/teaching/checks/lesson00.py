"""Checks of lesson 00 (setup): a rank's print, the backend rule, a first all_reduce (joined by a rank of the check's)."""
from __future__ import annotations

import re
from pathlib import Path

from .harness import (CheckFailed, InputServer, Report, call, has_placeholder, launch_script, not_attempted,
                      rank_outputs)


def check_hello_ranks(script, nproc: int = 2) -> None:
    """Task 00.1: every rank prints one line ``rank R of W`` with its own rank and the world size.

    Launched twice, on ``nproc`` and on ``nproc + 1`` processes: lines written in advance fit only one of the two.
    """
    report = Report("00.1", f"each process prints its own `rank R of W`, on {nproc} and on {nproc + 1} processes")
    pattern = re.compile(r"\brank (\d+) of (\d+)\b")
    for world in (nproc, nproc + 1):
        outputs = rank_outputs(launch_script("00.1", script, nproc=world))
        for rank in range(world):
            said = pattern.findall(outputs.get(rank, ""))
            if not said:
                report.fail(f"rank {rank} of {world} printed no line like `rank {rank} of {world}`",
                            "torchrun gives every process its rank and the world size in environment variables.")
            elif said == [(str(rank), str(world))]:
                report.ok(f"rank {rank} printed `rank {rank} of {world}`")
            elif len(said) > 1:
                report.fail(f"rank {rank} of {world} printed {len(said)} lines like `rank R of W`: "
                            f"{', '.join(f'rank {r} of {w}' for r, w in said)}",
                            "Print one line, with the values torchrun set for this process.")
            else:
                r, w = said[0]
                report.fail(f"rank {rank} printed `rank {r} of {w}`; it should say `rank {rank} of {world}`",
                            "Read the values torchrun set for this process (not a constant, not LOCAL_RANK only).")
    report.done()


def check_pick_backend(pick_backend) -> None:
    """Task 00.2: nccl only when CUDA works and every local rank has its own GPU, else gloo."""
    report = Report("00.2", "pick_backend(cuda_available, gpu_count, local_world_size)")
    cases = [
        ((False, 0, 2), "gloo", "a laptop without GPUs"),
        ((True, 4, 4), "nccl", "4 GPUs for 4 local processes"),
        ((True, 8, 2), "nccl", "8 GPUs for 2 local processes"),
        ((True, 1, 2), "gloo", "1 GPU for 2 local processes (NCCL would need one GPU per rank)"),
        ((False, 2, 2), "gloo", "a CUDA build that cannot use its GPUs (cuda_available=False)"),
    ]
    for args, expected, story in cases:
        got = call("00.2", pick_backend, *args)
        report.expect(got == expected, f"{story}: {got!r}",
                      f"{story}: returned {got!r}, expected {expected!r}",
                      "nccl needs CUDA *and* one GPU per local rank; everything else runs on gloo.")
    report.done()


#: Seconds the check's rank waits for the learner's ranks to join its process group.
WITNESS_WAIT = 30

WITNESS = '''\
"""Written by course_lib.teaching.checks for task 00.3: ranks 0..{last} run {learner}; rank {witness} is the check's.

The check launches it on {world} ranks (each with the variables torchrun gives it); it does not run on its own.
"""
import os
import sys

# Nothing from this folder (where the learner's files are) may stand in for a module the witness imports.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

if int(os.environ["RANK"]) < {witness}:
    import runpy

    sys.argv = [{script!r}]
    runpy.run_path({script!r}, run_name="__main__")
else:
    import datetime
    import io
    import socket

    import torch
    import torch.distributed as dist

    def receive(conn, size):
        data = b""
        while len(data) < size:
            chunk = conn.recv(min(size - len(data), 1 << 20))
            if not chunk:
                raise RuntimeError("the check refused this rank its secret: another process had asked for it first")
            data += chunk
        return data

    conn = socket.create_connection(("127.0.0.1", {port}), timeout=120)
    conn.sendall(b"{witness}\\n")
    secret = torch.load(io.BytesIO(receive(conn, int.from_bytes(receive(conn, 8), "big"))), weights_only=True)
    conn.settimeout(None)
    # The learner's rule for the backend (task 00.2), so that both sides of the all_reduce use the same one.
    use_cuda = (torch.cuda.is_available() and dist.is_nccl_available()
                and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]))
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds={wait}),
                            device_id=device if use_cuda else None)
    value = torch.tensor([float(secret)], device=device)
    dist.all_reduce(value)
    buffer = io.BytesIO()
    torch.save({{"total": value.item(), "backend": dist.get_backend()}}, buffer)
    conn.sendall(len(buffer.getvalue()).to_bytes(8, "big") + buffer.getvalue())
    dist.destroy_process_group()
'''


def check_all_reduce_script(script, nproc: int = 2) -> None:
    """Task 00.3: each rank joins the group, all-reduces ``rank + 1`` and prints the sum.

    The check adds a rank of its own (rank ``nproc``) that joins the same all_reduce with a secret number in place
    of ``rank + 1``. The sum the learner's ranks print, and the one the check's rank receives, are right only if
    every rank really took part in one all_reduce: a script that computes the sum from WORLD_SIZE cannot know it.
    """
    import secrets

    script = Path(script)
    world = nproc + 1
    report = Report("00.3", f"all_reduce of rank + 1 over {nproc} processes, with the check's own process as "
                            f"rank {nproc}")
    if not script.is_file():
        raise CheckFailed(f"Task 00.3: there is no script at {script}. Run the cell that writes it "
                          "(the one starting with %%write_script) first, then this check.")
    if has_placeholder(script):
        raise not_attempted("00.3", f"the script {script}")
    secret = 10 + secrets.randbelow(990)
    expected = nproc * (nproc + 1) // 2 + secret
    server = InputServer([None] * nproc + [secret])
    witness = script.with_name(f"_check_{script.stem}.py")
    witness.write_text(WITNESS.format(last=nproc - 1, witness=nproc, world=world, learner=script.name,
                                      script=str(script.resolve()), port=server.port, wait=WITNESS_WAIT))
    print(f"Rank {nproc} is the check's: it joins your ranks' all_reduce with a secret number instead of "
          f"{nproc + 1}, so the sum shows whether every rank took part.")
    try:
        result = launch_script("00.3", witness, nproc=world, allow_failure=True)
    finally:
        server.close()
    outputs = rank_outputs(result)
    if server.refused:
        report.stop("a process other than the check's rank asked for the check's secret, and was refused",
                    "Your script should only join the process group and call all_reduce.")
    got = server.reports.get(nproc)
    if got is None:
        report.stop(f"your ranks never completed an all_reduce with the check's rank {nproc} (it waited {WITNESS_WAIT} s)",
                    "Every rank must call init_process_group (with no explicit world size or rank: torchrun sets "
                    "them) and then all_reduce one tensor.")
    pattern = re.compile(r"\bsum = (-?\d+(?:\.\d+)?)")
    report.expect(abs(got["total"] - expected) < 1e-6,
                  f"the check's rank received the sum {expected} ({nproc * (nproc + 1) // 2} from your ranks + "
                  f"its secret {secret})",
                  f"the check's rank received {got['total']:g}, expected {expected} (your ranks' rank + 1 summed, "
                  f"plus its secret {secret})",
                  "Each rank contributes rank + 1 (a one-element tensor); the default reduction is a sum.")
    for rank in range(nproc):
        said = pattern.findall(outputs.get(rank, ""))
        if not said:
            report.fail(f"rank {rank} printed no `sum = ...` line",
                        "Print the tensor's value after the all_reduce, e.g. `sum = 3`.")
            continue
        value = float(said[-1])
        if value == expected:
            report.ok(f"rank {rank} printed sum = {expected}")
        elif value == rank + 1:
            report.fail(f"rank {rank} printed its own value {value:g}, not the sum {expected}",
                        "all_reduce changes the tensor in place on every rank; print it after the call.")
        else:
            report.fail(f"rank {rank} printed sum = {value:g}, expected {expected}",
                        "Print the tensor that all_reduce filled, not a number computed from the world size.")
    backends = [m for r in range(nproc) for m in re.findall(r"backend[ =:]+(\w+)", outputs.get(r, ""))]
    report.expect(bool(backends) and set(backends) <= {"gloo", "nccl"},
                  f"the backend was printed: {sorted(set(backends))}",
                  "no rank printed `backend = gloo` (or nccl)",
                  "Print dist.get_backend() after init_process_group, so the reader knows which was used.")
    report.done()
