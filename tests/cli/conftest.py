"""Files for CLI tests, written into a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

CLUSTER = """\
pools:
  - name: a100
    labels: {gpu_model: A100-80GB}
nodes:
  - {name_prefix: n, count: 2, pool: a100, capacity: {gpu: 4, cpu: 32, memory: 256Gi}}
tenants:
  - {name: vision}
queues:
  - name: org
    children:
      - {name: team-a, tenant: vision, quota: {a100: {gpu: 4}}}
      - {name: team-b, quota: {a100: {gpu: 4}}}
"""

JOB = """\
name: resnet
queue: team-a
replicas:
  - {name: worker, count: 2, resources: {gpu: 2, cpu: 8}}
"""

TRACE = """\
job_id,submit_time,duration,queue,gpus
j1,0,100,team-a,2
j2,10,50,team-b,1
j3,20,30,team-a,1
"""


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "trace.csv").write_text(TRACE)
    return tmp_path
