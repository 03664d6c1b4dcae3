"""Start ``--nproc`` ranks of a script on this machine, as ``torchrun --standalone`` would, without torchrun's agent.

    python course_lib/rankrun.py --nproc 2 script.py [script args ...]

The exercise checks launch through this (``course_lib.launch.launch_ranks``): their own harness, and a learner's
whole script (all but lesson 04's). torchrun's agent, which imports torch before it starts the ranks, would add
about 4 s of a core to each launch (benchmarks/launchers.py). Each rank gets the variables torchrun gives a rank
of a one-node job (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``ROLE_RANK``,
``MASTER_ADDR``, ``MASTER_PORT`` ...), and its lines are printed with torchrun's prefix, ``[rankN]: ``. The first
rank that fails stops the others (SIGTERM, then SIGKILL), a summary in torchrun's own form names it, and the exit
code is 1, as torchrun's is.

No torch here, and nothing from course_lib: it runs as a plain file, in any environment that has the script's
packages.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

GRACE = 5.0  # seconds a stopped rank has to end after SIGTERM before SIGKILL


def rank_environment(rank: int, nproc: int, port: int) -> dict[str, str]:
    """The environment of rank ``rank`` of ``nproc`` on one node, with the store's port ``port``."""
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
               GROUP_RANK="0", GROUP_WORLD_SIZE="1", ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(nproc),
               ROLE_NAME="default", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


def reserve_port() -> socket.socket:
    """A socket bound to a free port, not listening, to hold while the ranks run.

    Rank 0's store binds the same port (with SO_REUSEADDR, as torch's TCPStore does), which a bound socket that does
    not listen allows; meanwhile no other ``bind`` to port 0 on this machine is given it. A port chosen, freed and
    passed on would be free for anyone else for the seconds the ranks take to import torch.
    """
    reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reserved.bind(("", 0))
    return reserved


def _relay(rank: int, stream, lock: threading.Lock) -> None:
    for line in iter(stream.readline, ""):
        with lock:
            sys.stdout.write(f"[rank{rank}]: {line}" if line.endswith("\n") else f"[rank{rank}]: {line}\n")
            sys.stdout.flush()


def _summary(failures: list[tuple[int, int]], root: tuple[int, int]) -> str:
    """torchrun's failure summary, in the form ``course_lib.launch.failure_message`` reads."""
    def entry(rank, code):
        return f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code}\n  error_file: <N/A>\n"

    others = "".join(entry(*f) for f in failures if f != root) or "  <NO_OTHER_FAILURES>\n"
    return f"Failures:\n{others}Root Cause (first observed failure):\n{entry(*root)}"


def run(script: str, args: list[str], nproc: int) -> int:
    lock = threading.Lock()
    with reserve_port() as reserved:
        port = reserved.getsockname()[1]
        procs = [subprocess.Popen([sys.executable, script, *args], env=rank_environment(rank, nproc, port),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                  errors="replace") for rank in range(nproc)]
        relays = [threading.Thread(target=_relay, args=(rank, p.stdout, lock), daemon=True)
                  for rank, p in enumerate(procs)]
        for thread in relays:
            thread.start()

        def stop(signum, _frame):
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signum)
            sys.exit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        root = None
        while root is None:
            codes = [p.poll() for p in procs]  # every rank's, each time (any() would stop at the first running)
            root = next(((r, code) for r, code in enumerate(codes) if code not in (None, 0)), None)
            if None not in codes:
                break
            time.sleep(0.05)
        if root is not None:  # stop the others, as torchrun's agent does
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            deadline = time.monotonic() + GRACE
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.05)
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for thread in relays:
            thread.join(timeout=2)
    if root is None:
        return 0
    failures = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    print(_summary(failures, root), end="", flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, required=True, help="how many ranks")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    if options.nproc < 1:
        parser.error("--nproc must be at least 1")
    return run(options.script, options.args, options.nproc)


if __name__ == "__main__":
    sys.exit(main())
