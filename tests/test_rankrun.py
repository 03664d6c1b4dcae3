"""course_lib/rankrun.py: one node's ranks started without torchrun's agent, for the exercise checks' harness."""
import ast
import socket
import sys
import time

import psutil

from course_lib import launch
from course_lib.launch import failure_message, launch_ranks
from course_lib.rankrun import reserve_port

RANK = """
import os, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_PORT")
print(" ".join(f"{n}={os.environ[n]}" for n in names), "pid", os.getpid(), flush=True)
if dist.get_rank() == int(sys.argv[1]):
    raise ValueError("deliberate failure")
time.sleep(float(sys.argv[2]))
dist.barrier()
dist.destroy_process_group()
"""


def test_the_ranks_get_torchruns_variables_and_prefixes_and_share_one_group(write):
    script = write("ranks.py", RANK)
    result = launch_ranks(script, nproc=3, script_args=["-1", "0"], quiet=True)
    assert result.ok and sorted(result.outputs) == [0, 1, 2]
    port = {line.split("MASTER_PORT=")[1].split()[0] for line in result.outputs.values()}
    assert len(port) == 1, result.outputs  # one store, one port for all
    for rank, line in result.outputs.items():
        assert f"RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 GROUP_RANK=0 ROLE_RANK={rank}" in line
    assert "rankrun.py --nproc 3" in result.command_line


def test_a_failing_rank_stops_the_others_at_once_and_is_named_with_its_traceback(write):
    script = write("ranks.py", RANK)
    started = time.monotonic()
    result = launch_ranks(script, nproc=2, script_args=["1", "120"], check=False, quiet=True)
    assert not result.ok and time.monotonic() - started < 60  # rank 0 would sleep 120 s
    message = failure_message(result)
    assert message.startswith("Rank 1 (local rank 1) exited with code 1") and "deliberate failure" in message
    assert "rank 0 was killed by signal SIGTERM" in message
    pids = [int(text.split("pid ")[1].split()[0]) for text in result.outputs.values()]
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_the_reserved_port_is_given_to_no_other_bind_but_rank_0s_store_can_take_it():
    with reserve_port() as reserved:
        port = reserved.getsockname()[1]
        handed_out = set()
        for _ in range(2000):
            with socket.socket() as other:
                other.bind(("127.0.0.1", 0))
                handed_out.add(other.getsockname()[1])
        assert port not in handed_out
        with socket.socket() as store:  # what TCPStore does: SO_REUSEADDR, bind, listen
            store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            store.bind(("", port))
            store.listen()


def test_the_launcher_imports_only_the_standard_library():
    """It runs before the ranks and beside them: no torch, no course_lib (it runs as a plain file)."""
    tree = ast.parse(launch.RANKRUN.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
