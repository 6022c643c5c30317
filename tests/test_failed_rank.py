"""Which rank a failover replaces: the one the hosts' evidence names, not the first exit a watcher saw."""

from __future__ import annotations

from testbed.engine.job import failed_rank


def exit_(rank: int, ns: int, kind: str = "process_exit") -> tuple[int, int, dict]:
    return rank, ns, {"detected": kind, "evidence": f"rank {rank}: {kind}"}


def test_a_lost_gpu_names_the_failed_rank_even_when_a_peers_exit_was_seen_first():
    # Rank 2's GPU fell off the bus; rank 3 exited when its ring broke, and its watcher saw that first.
    detections = [exit_(3, 100), exit_(2, 140, "gpu_lost"), exit_(1, 120)]
    assert failed_rank(detections)[0] == 2
    assert failed_rank([exit_(0, 90), exit_(1, 95, "xid"), exit_(2, 99, "gpu_lost")])[0] == 1


def test_without_evidence_the_first_exit_seen_is_the_failed_rank():
    assert failed_rank([exit_(1, 300), exit_(0, 200), exit_(3, 250)])[:2] == (0, 200)
    assert failed_rank([]) is None
