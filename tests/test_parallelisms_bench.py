"""benchmarks/parallelisms.py: DDP, FSDP2, TP, TP + SP and PP on RowTransformer timed side by side on 2 processes;
the figures it prints are complete and consistent, and the bytes it counts are those of the formulas (lesson 10's for
TP; 4Ψ for DDP's all-reduce), PP's computed from its activations' shapes and said to be. On 4 processes, FSDP2 x TP on
a 2 x 2 mesh (lesson 12's shard_2d), its collectives counted on groups of 2."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import parallelisms  # noqa: E402


def test_the_strategies_are_timed_side_by_side_and_send_what_the_formulas_say(tmp_path, capsys):
    result = parallelisms.main(["--nproc", "2", "--rounds", "2", "--steps", "1", "--batch", "16", "--out",
                                str(tmp_path)])
    assert json.loads((tmp_path / "parallelisms.json").read_text()) == result
    shown = capsys.readouterr().out
    rows = result["strategies"]
    assert list(rows) == [k for k in parallelisms.STRATEGIES if k != "FSDP2 x TP"] and all(k in shown for k in rows)
    assert result["not run"] == {"FSDP2 x TP": "its 2 x 2 mesh (dp x tp) needs 4 processes, not 2"}
    assert "FSDP2 x TP: not run: its 2 x 2 mesh (dp x tp) needs 4 processes, not 2." in shown, shown
    for r in rows.values():
        for figure in (r["step_ms"], r["vs_ddp"]):
            assert 0 < figure["min"] <= figure["median"] <= figure["max"], r
    assert rows["DDP"]["vs_ddp"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    psi_bytes = rows["DDP"]["parameter bytes"]  # DDP keeps the whole model on each rank
    assert psi_bytes == 104_394 * 4
    activation = 16 * 28 * 64 * 4  # the whole batch's B x T x d numbers of 4 bytes
    assert rows["TP"]["whole bytes"] == 4 * 2 * activation  # 2 + 2 all-reduces in each of the 2 blocks
    assert rows["TP"]["sent bytes"] == 4 * 2 * 2 * (2 - 1) / 2 * activation
    assert rows["DDP"]["whole bytes"] >= psi_bytes  # its bucket all-reduces carry every gradient (and a tiny broadcast)
    assert rows["FSDP2"]["parameter bytes"] < psi_bytes * 0.51 and rows["TP"]["parameter bytes"] < psi_bytes
    # PP: 2 stages, 4 micro-batches of 4: each micro-batch's 4 x 28 x 64 x 4 bytes go forward and come back once
    pp, micro = rows["PP"], 16 // 4 * 28 * 64 * 4
    assert pp["whole bytes"] == 2 * 4 * micro == parallelisms.pp_bytes(2, 16)
    assert pp["sent bytes"] == 4 * micro  # the first stage sends the activations, the last their gradients
    assert pp["collectives"] == "8 send/recv" and "computed" in pp["bytes"] and "not counted" in pp["bytes"]
    assert all(r["bytes"] == "counted by CommDebugMode" for kind, r in rows.items() if kind != "PP")
    assert "PP: 4 micro-batches" in shown and "computed from the activation shapes" in shown, shown
    assert "not counted (CommDebugMode does not see send/recv)" in shown, shown
    first = 4 * (28 * 64 + 64 + 28 * 64 + 49_984)  # embedding, position, block 0
    assert pp["parameter bytes by rank"] == [first, psi_bytes - first] and pp["parameter bytes"] == first


def test_fsdp2_x_tp_on_a_2_by_2_mesh_sends_on_groups_of_2(tmp_path, capsys):
    result = parallelisms.main(["--nproc", "4", "--rounds", "1", "--steps", "1", "--batch", "16", "--out",
                                str(tmp_path), "--name", "four.json"])
    assert json.loads((tmp_path / "four.json").read_text()) == result
    shown = capsys.readouterr().out
    rows = result["strategies"]
    assert list(rows) == ["DDP", "FSDP2", "TP", "TP + SP", "FSDP2 x TP"] and "FSDP2 x TP" in shown, shown
    assert result["not run"] == {"PP": "the model's 2 blocks do not cut into 4 stages"} and "PP: not run" in shown
    two_d, psi_bytes = rows["FSDP2 x TP"], 104_394 * 4
    assert 0 < two_d["step_ms"]["min"] <= two_d["step_ms"]["max"] and two_d["bytes"] == "counted by CommDebugMode"
    # TP's 2 + 2 all-reduces in each of the 2 blocks, inside a row of 2; FSDP's per unit (2 blocks and the root)
    # along a column of 2: a reduce-scatter each, a gather each in the forward and again in the backward
    calls = two_d["collectives by group size"]
    assert calls == {"all_reduce on 2": 2 * 4, "_allgather_base_ on 2": 2 * 3, "_reduce_scatter_base_ on 2": 3}, calls
    assert two_d["collectives"] == 17
    sent = two_d["sent bytes by collective"]
    half = 16 // 2 * 28 * 64 * 4  # a row's half of the batch, B/2 x T x d numbers of 4 bytes
    assert sent["all_reduce on 2"] == 8 * 2 * (2 - 1) / 2 * half  # N = 2, not 4
    # a reduce-scatter over 2 sends half of the unit's gradient: this rank's parameter share of it
    assert sent["_reduce_scatter_base_ on 2"] == two_d["parameter bytes"]
    assert sent["_allgather_base_ on 2"] == 2 * two_d["parameter bytes"]
    assert two_d["sent bytes"] == sum(sent.values())
    # a quarter of the blocks' parameters, half of the rest (the embedding, the norm and the head: FSDP2 only)
    assert 0.24 < two_d["parameter bytes"] / psi_bytes < 0.27
    # the 1-D strategies' collectives on all 4
    assert all(k.endswith(" on 4") for kind in ("DDP", "FSDP2", "TP") for k in rows[kind]["collectives by group size"])
