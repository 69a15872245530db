"""The what-if bench on a tiny history: a store written from a replay is replayed, under
the same configuration, almost exactly (the round trip of recording and replay: only
jobs that never completed a run in the window, whose run times the replay must estimate,
can start or end elsewhere); doubling one queue's quota lowers its mean wait (behaviour
only; no time is checked)."""

from __future__ import annotations

from bench.bench_whatif import main


def test_a_recorded_replay_is_replayed_again_and_a_bigger_quota_helps() -> None:
    summary = main(["--jobs", "400", "--days", "0.05", "--nodes", "4", "--queues", "4"])
    assert summary["fidelity_wait_error"] <= 0.01
    assert summary["worst_queue_error"] <= 0.02
    recorded, current, proposed = summary["q0_wait_avg_s"]
    assert abs(current - recorded) <= 0.02 * recorded and proposed < current
