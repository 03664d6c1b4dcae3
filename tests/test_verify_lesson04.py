"""Lesson 04's claims hold in the runs of its two parts, and a false one is named: 04a_torchrun_restarts
(course_lib/teaching/claims/lesson04a.py) and 04b_multinode_elastic_slurm_hangs (claims/lesson04b.py). The facts
about the repository's Slurm script that do not depend on the run are tested in tests/test_elastic.py."""
import pytest

from course_lib.teaching.verify import ROOT, ClaimFailed, verify

from notebook_runner import executed as _executed, table_in as _table


def test_lesson_04as_claims_hold_in_its_run_and_a_restart_that_did_not_resume_at_the_snapshot_is_found():
    """Every claim of part 04a holds; then the table of attempts says the restarted workers started at step 0 of the
    failed epoch instead of at the snapshot, and that claim alone fails."""
    nb = _executed("04a_torchrun_restarts")
    assert verify("04a_torchrun_restarts", nb, ROOT / "notebooks") == 24
    for row in _table(nb, "58575aa3", "Attempts of each rank")["rows"]:
        row["at step"] = 0
    with pytest.raises(ClaimFailed, match="the restart resumed at the last snapshot before rank 1's failure") as failed:
        verify("04a_torchrun_restarts", nb, ROOT / "notebooks")
    assert "1 of" in str(failed.value), failed.value  # only that claim


def test_lesson_04bs_claims_hold_in_its_run_and_a_rank_not_caught_sleeping_is_found():
    """Every claim of part 04b holds; then the table of where faulthandler found each rank says rank 1 was somewhere
    else than its time.sleep, and that claim alone fails."""
    nb = _executed("04b_multinode_elastic_slurm_hangs")
    assert verify("04b_multinode_elastic_slurm_hangs", nb, ROOT / "notebooks") == 11
    row = next(r for r in _table(nb, "88dfbee1", "every rank's stack")["rows"] if r["rank"] == 1)
    row["where faulthandler found it"] = "hang.py line 49: rank = dist.get_rank()"
    with pytest.raises(ClaimFailed, match="faulthandler caught rank 1 in its time.sleep") as failed:
        verify("04b_multinode_elastic_slurm_hangs", nb, ROOT / "notebooks")
    assert "1 of" in str(failed.value), failed.value  # only that claim
