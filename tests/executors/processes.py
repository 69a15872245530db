"""Killing every process a local executor started under a state root (test teardown):
the campaigns' own :func:`~bench.reliability.deploy.kill_replicas`."""

from __future__ import annotations

from bench.reliability.deploy import kill_replicas as kill_everything

__all__ = ["kill_everything"]
