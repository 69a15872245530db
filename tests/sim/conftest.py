"""Shared pieces for replay tests: a tiny cluster, written inline."""

from __future__ import annotations

import pytest

from allotment.domain.cluster import Cluster
from allotment.domain.loading import load_cluster_text

TINY_CLUSTER = """
pools:
  - {name: a100}
nodes:
  - {name_prefix: n, count: 2, pool: a100, capacity: {gpu: 4, cpu: 32, memory: 256Gi}}
queues:
  - name: org
    children:
      - {name: team-a, quota: {a100: {gpu: 4, cpu: 32, memory: 256Gi}}}
      - {name: team-b, quota: {a100: {gpu: 4, cpu: 32, memory: 256Gi}}}
"""
"""Two 4-GPU nodes, two teams guaranteed one node's worth each."""


@pytest.fixture
def tiny_cluster() -> Cluster:
    return load_cluster_text(TINY_CLUSTER, source="tiny")
