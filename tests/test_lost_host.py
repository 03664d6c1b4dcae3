"""A host lost for real, and back: lesson 04's elastic job across two network namespaces.

Two "hosts", each a Linux network namespace with an address of its own, are joined by a virtual Ethernet pair
(10.213.0.1 and 10.213.0.2 here; nothing is routed outside the pair). One torchrun agent runs in each, as on two
machines: `--nnodes 1:2`, the c10d rendezvous on host A's address (A hosts its store: `is_host=true`), each agent
advertising its own address (`--local-addr`) and gloo told which interface to use (`GLOO_SOCKET_IFNAME`), the
three settings a real cluster needs too. Then host B's link is taken down in the middle of an epoch: nothing
tells A's worker, so its next all-reduce waits until lesson 04's `--pg-timeout` ends it; A's agent restarts
it, the rendezvous drops B once its heartbeats stop, and A goes on alone. Then B comes back (its link up, a new
agent, as after a reboot) and joins: A's agent sees it waiting and restarts its workers at world size 2.

The namespaces and the link are created by the test and always removed. Creating them needs root and iproute2's
`ip netns`; elsewhere the test is skipped with the reason.
"""
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass

import pytest
import torch

import course_lib
from course_lib import MyModel
from course_lib.launch import launch_env, torchrun_command
from course_lib.processes import release, start, stop_tree
from test_elastic import LAUNCH_TIMEOUT, script_from_notebook

EPOCHS, MAX_STEPS, SNAPSHOT_EVERY = 7, 100, 5  # the cut comes right after a step-5 snapshot; B is back within 2-3 epochs, and trains 2 or more of the 7 again
PG_TIMEOUT = 10  # seconds A's all-reduce waits for the silent host B
PORT = 29400  # a fresh namespace has every port free


@dataclass
class Host:
    namespace: str
    device: str
    address: str

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.namespace, *args], check=True, capture_output=True, text=True)

    def link(self, up: bool) -> None:
        self.ip("link", "set", self.device, "up" if up else "down")


def _cannot_make_namespaces() -> str | None:
    if os.name != "posix" or not shutil.which("ip"):
        return "needs Linux and iproute2's `ip` (network namespaces)"
    if os.geteuid() != 0:
        return "needs root to create network namespaces and a veth pair"
    name = f"course-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


@pytest.fixture
def two_hosts():
    problem = _cannot_make_namespaces()
    if problem:
        pytest.skip(problem)
    tag = os.getpid() % 100000
    a = Host(f"course-a-{tag}", f"cla{tag}", "10.213.0.1")
    b = Host(f"course-b-{tag}", f"clb{tag}", "10.213.0.2")
    try:
        for host in (a, b):
            subprocess.run(["ip", "netns", "add", host.namespace], check=True, capture_output=True)
        subprocess.run(["ip", "link", "add", a.device, "type", "veth", "peer", "name", b.device], check=True,
                       capture_output=True)
        for host in (a, b):
            subprocess.run(["ip", "link", "set", host.device, "netns", host.namespace], check=True,
                           capture_output=True)
            host.ip("addr", "add", f"{host.address}/24", "dev", host.device)
            host.ip("link", "set", "lo", "up")
            host.link(True)
        yield a, b
    finally:  # deleting a namespace also deletes its end of the pair, and with it the other end
        for host in (a, b):
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)


def _agent(host: Host, store_host: Host, script, run_dir, log_name: str, is_host: bool):
    conf = "last_call_timeout=1" + (",is_host=true" if is_host else "")
    argv = torchrun_command(script, 1, "1:2", ["--epochs", EPOCHS, "--max-steps", MAX_STEPS,
                                               "--snapshot-every", SNAPSHOT_EVERY, "--pg-timeout", PG_TIMEOUT,
                                               "--run-dir", run_dir],
                            max_restarts=3, rdzv_endpoint=f"{store_host.address}:{PORT}", rdzv_id="lost-host",
                            extra_args=["--rdzv-conf", conf, "--local-addr", host.address])
    # 2 processes share this machine's cores; gloo uses the namespace's own interface
    env = launch_env(2, {"GLOO_SOCKET_IFNAME": host.device}, max_restarts=3)
    log = open(run_dir / log_name, "w")
    return start(["ip", "netns", "exec", host.namespace, *argv], env=env, log=log), log


def _wait_for(condition, what: str, procs, deadline: float) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if procs[0].poll() is not None:
            raise AssertionError(f"host A's agent ended (exit {procs[0].returncode}) before {what}")
        time.sleep(0.05)


def test_a_host_whose_link_is_cut_is_dropped_and_the_host_that_comes_back_joins_again(two_hosts, tmp_path):
    a, b = two_hosts
    course_lib.prepare_mnist(verbose=False)
    script = tmp_path / "train.py"
    script.write_text(script_from_notebook("train.py"))
    checkpoints = tmp_path / "checkpoints"
    deadline = time.monotonic() + LAUNCH_TIMEOUT

    def epochs():
        return course_lib.read_metrics(tmp_path, "epoch")

    def inside_an_epoch_after_one_at_world_size_2():
        done = [r["epoch"] for r in epochs() if r["world_size"] == 2]
        if not done or not (checkpoints / "snapshot.pt").exists():
            return False
        snapshot = torch.load(checkpoints / "snapshot.pt", map_location="cpu", weights_only=True)
        return snapshot["epoch"] == max(done) + 1 and snapshot["world_size"] == 2

    procs, logs = [], []
    try:
        for host, log_name, is_host in ((a, "hostA.log", True), (b, "hostB.log", False)):
            proc, log = _agent(host, a, script, tmp_path, log_name, is_host)
            procs.append(proc), logs.append(log)
            time.sleep(1.0)  # A first, so that its agent hosts the store before B looks for it
        _wait_for(inside_an_epoch_after_one_at_world_size_2, "an epoch at world size 2 and a snapshot after it",
                  procs, deadline)
        cut_in_epoch = torch.load(checkpoints / "snapshot.pt", map_location="cpu", weights_only=True)["epoch"]
        b.link(False)
        _wait_for(lambda: any(r["world_size"] == 1 for r in epochs()), "host A to train alone", procs, deadline)

        # B comes back as after a reboot: the old agent (cut off, still waiting) is gone, the link is up, a new
        # agent starts with the same command
        stop_tree(procs[1].pid)
        b.link(True)
        proc, log = _agent(b, a, script, tmp_path, "hostB-again.log", False)
        procs.append(proc), logs.append(log)
        for proc in (procs[0], procs[2]):
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            stop_tree(proc.pid)
            release(proc)
        for log in logs:
            log.close()

    log_a = (tmp_path / "hostA.log").read_text()
    assert procs[0].returncode == 0 and procs[2].returncode == 0, \
        f"host A and the returned host B finished the job:\n{log_a[-3000:]}"
    records = epochs()
    sizes = [r["world_size"] for r in records]
    assert {r["epoch"] for r in records} == set(range(EPOCHS)), "every epoch was finished"
    assert all(r["val_count"] == 10000 for r in records), "each evaluation counted every validation sample once"
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2, f"2 hosts, then A alone, then 2 again: {sizes}"
    alone = [r for r in records if r["world_size"] == 1]
    assert alone[0]["epoch"] == cut_in_epoch, "A redid the epoch the cut interrupted"
    assert all(r["restart"] >= 1 for r in alone), "losing B cost A's agent a restart"
    assert records[-1]["restart"] == alone[-1]["restart"], "B joining again is a membership change, not a failure"
    # the evidence that the cut was felt on the wire: A's all-reduce gave up after --pg-timeout. gloo words it by
    # where the timeout fired: in the buffer a recv waits on, or in the connection (pair) to the silent peer
    assert re.search(r"Timed out waiting \d+ms|Application timeout caused pair closure", log_a), \
        "A's worker failed by the process group's timeout"
    assert "snapshot.pt is from step" in log_a and "at world size 2, not 1" in log_a, \
        "the snapshot taken at world size 2 was set aside, and the epoch redone from its checkpoint"
    final = torch.load(checkpoints / f"checkpoint-{EPOCHS - 1}.pt", map_location="cpu", weights_only=True)
    MyModel().load_state_dict(final["model"])
