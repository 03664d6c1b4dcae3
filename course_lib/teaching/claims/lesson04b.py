"""What lesson 04's second part, 04b_multinode_elastic_slurm_hangs, says about its run, checked from its artifacts
(see course_lib.teaching.verify).

The part launches the scripts of 04a_torchrun_restarts (written again from 04a's cells) on several torchrun agents;
the claims read the tables it drew, what its cells printed and each run's metrics. Slurm's batch script is also
tested on its own, in tests/test_elastic.py.
"""
from __future__ import annotations

import math
import re

RUN = "runs/04_torchrun_elastic"


def _titled(run, title: str) -> list[list[dict]]:
    """The rows of every table whose title starts with ``title``, in the order the lesson drew them."""
    return [table["rows"] for table in run.tables() if (table["title"] or "").startswith(title)]


def check(run) -> None:
    p = run.parameters
    epochs = p["EPOCHS"]

    # 3. Multi-node on one machine.
    nodes = (_titled(run, "Two torchrun agents, one world") or [[]])[0]
    run.claim(sorted(r["RANK"] for r in nodes) == [0, 1] and {r["WORLD_SIZE"] for r in nodes} == {2}
              and sorted(r["GROUP_RANK"] for r in nodes) == [0, 1],
              "two agents of one process each formed one world of 2, ranks 0 and 1, group ranks 0 and 1")
    two = run.events(f"{RUN}/two_nodes")
    run.claim(bool(two) and two[0]["world_size"] == 2 and two[0]["val_count"] == 10_000,
              "the two nodes' epoch ran at world size 2 and evaluated 10,000 images")
    static = (_titled(run, "Static rendezvous") or [[]])[0]
    run.claim([(int(r["GROUP_RANK"]), int(r["RANK"])) for r in static] == [(0, 0), (1, 1)],
              "with the static rendezvous each node's GROUP_RANK and RANK are its --node-rank")
    elastic = run.events(f"{RUN}/elastic")
    sizes = [r["world_size"] for r in elastic]
    run.claim([r["epoch"] for r in elastic] == list(range(epochs + 1)),
              f"the elastic run recorded epochs 0..{epochs} once each")
    run.claim(bool(sizes) and sizes[0] == 1 and sizes[-1] == 2, f"its world size went from 1 to 2 (got {sizes})")
    run.claim(re.search(r"\[node1\].*resumed from", run.cell_text("5f40028d")) is not None,
              "the node that joined resumed from the newest checkpoint")
    rows = (_titled(run, "the elastic run, epoch by epoch") or [[]])[0]
    run.claim(bool(rows) and all(r["steps per rank"] == math.ceil(math.ceil(60_000 / r["world size"])
                                                                  / (r["global batch"] // r["world size"]))
                                 for r in rows),
              "every epoch took DistributedSampler's share of 60,000 at its world size, in batches")

    # 4. Slurm, dry.
    dry = run.cell_text("51cd9447")
    run.claim(all(words in dry for words in ("--rdzv-endpoint gpu-node-01:29742", "--nproc-per-node 4",
                                             "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "--max-restarts 3")),
              "the batch script's srun line: 4 processes per node, rendezvous on gpu-node-01:29742, restarts with "
              "a store per round")

    # 5. Hangs.
    hang = run.cell_text("88dfbee1")
    run.claim(("timed out" in hang.lower() or "timing out" in hang.lower()) and "Rank 0" in hang,
              "the stuck rank makes rank 0's all_reduce time out, and the error names rank 0")
    where = {r["rank"]: r["where faulthandler found it"] for r in (_titled(run, "every rank's stack") or [[]])[0]}
    run.claim("time.sleep" in where.get(1, ""), "faulthandler caught rank 1 in its time.sleep")
    run.claim("all_reduce" in where.get(0, "") or ".item()" in where.get(0, ""),
              "faulthandler caught rank 0 waiting in the all_reduce")
