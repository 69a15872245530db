"""Two tenants with members of every role, and real tokens for each, for the identity
tests: ``vision`` (alice admin, bob and dave members, carol viewer) and ``nlp`` (nina
admin, nick member, nora viewer), each with its own leaf queue, plus a platform admin
``root``. Tokens are issued straight into the store, as ``allot token create`` would."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from allotment.api.auth import new_token, token_digest
from allotment.client import AllotmentClient
from allotment.store.tokens import create_token

CLUSTER = """
pools: [{name: local}]
nodes: [{name: box, pool: local, capacity: {gpu: 4, cpu: 16, memory: 64Gi}}]
tenants:
  - name: vision
    members:
      - {user: alice, role: admin}
      - {user: bob, role: member}
      - {user: dave, role: member}
      - {user: carol, role: viewer}
  - name: nlp
    members:
      - {user: nina, role: admin}
      - {user: nick, role: member}
      - {user: nora, role: viewer}
queues:
  - name: root
    children:
      - {name: vision-q, tenant: vision, quota: {local: {gpu: 2}}}
      - {name: vision-solo, tenant: vision, submitters: [dave]}
      - {name: nlp-q, tenant: nlp, quota: {local: {gpu: 2}}}
"""

PEOPLE: dict[str, tuple[str | None, str]] = {
    "root": (None, "admin"),
    "alice": ("vision", "admin"),
    "bob": ("vision", "member"),
    "dave": ("vision", "member"),
    "carol": ("vision", "viewer"),
    "nina": ("nlp", "admin"),
    "nick": ("nlp", "member"),
    "nora": ("nlp", "viewer"),
}
QUEUE = {"vision": "vision-q", "nlp": "nlp-q"}


def job(queue: str, code: str = "print('hi')", *, gpus: int = 1, name: str = "t") -> str:
    return json.dumps(
        {
            "name": name,
            "queue": queue,
            "replicas": [{"count": 1, "resources": {"gpu": gpus, "cpu": 1, "memory": "1Gi"}}],
            "command": [sys.executable, "-c", code],
        }
    )


def issue(
    sessions: sessionmaker[Session],
    user: str,
    tenant: str | None,
    role: str,
    *,
    at: float = 0.0,
    expires_at: float | None = None,
) -> tuple[str, str]:
    """A new token in the store: ``(token id, token)``."""
    token = new_token()
    with sessions.begin() as db:
        row = create_token(
            db,
            digest=token_digest(token),
            user=user,
            tenant=tenant,
            role=role,
            created_by="test",
            at=at,
            expires_at=expires_at,
        )
        return row.id, token


@dataclass
class People:
    """A client per person, on the server at ``url``."""

    url: str
    tokens: dict[str, str] = field(default_factory=dict)
    clients: dict[str, AllotmentClient] = field(default_factory=dict)

    @classmethod
    def issued(cls, url: str, sessions: sessionmaker[Session]) -> People:
        people = cls(url=url)
        for user, (tenant, role) in PEOPLE.items():
            people.tokens[user] = issue(sessions, user, tenant, role)[1]
            people.clients[user] = AllotmentClient(url, people.tokens[user], timeout=10)
        return people

    def __getitem__(self, user: str) -> AllotmentClient:
        return self.clients[user]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
