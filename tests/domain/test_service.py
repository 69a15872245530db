"""The pure rules of services: how many replicas the load asks for, restart back-off,
and the ``service:`` block's shape."""

from __future__ import annotations

import pytest

from allotment.domain.service import RestartPolicy, ServiceSettings, desired_replicas


@pytest.mark.parametrize(
    ("current", "in_flight", "idle_for", "wanted"),
    [
        (1, 0, 0, 1),  # never below min
        (1, 25, 0, 3),  # up at once, capped at max
        (1, 100, 0, 4),
        (3, 0, 10, 3),  # down only after the delay
        (3, 0, 60, 1),
        (3, 15, 60, 2),
        (5, 0, 0, 4),  # the spec's max fell: at once
    ],
)
def test_desired_replicas(current: int, in_flight: float, idle_for: float, wanted: int) -> None:
    settings = ServiceSettings.model_validate(
        {"replicas": {"min": 1, "max": 4}, "autoscaling": {"target": 10, "scale_down_delay": 60}}
    )
    got = desired_replicas(
        settings, current=current, in_flight=in_flight, now=100.0, last_needed_more=100.0 - idle_for
    )
    assert got == wanted


def test_restart_back_off() -> None:
    policy = RestartPolicy(backoff=1.0, max_backoff=60.0)
    assert [policy.delay(n) for n in range(8)] == [0, 1, 2, 4, 8, 16, 32, 60]
    assert policy.delay(10_000) == 60.0


def test_service_settings_read_both_spellings_of_the_replica_range() -> None:
    flat = ServiceSettings.model_validate({"min_replicas": 2, "max_replicas": 5})
    nested = ServiceSettings.model_validate({"replicas": {"min": 2, "max": 5}})
    assert flat == nested
    assert ServiceSettings().replicas.min == 1 and ServiceSettings().health.path == "/"
