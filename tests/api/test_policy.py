"""The policy function alone: named cases of principal, action and object."""

from __future__ import annotations

import pytest

from allotment.api.auth import ANONYMOUS, Principal
from allotment.api.policy import RULES, Action, Owned, Verdict, decide, may, visible_tenant
from allotment.domain.tenancy import Role


def who(role: Role, tenant: str | None = "vision", user: str = "bob") -> Principal:
    return Principal(user=user, tenant=tenant, role=role)


JOB = Owned(kind="job", name="j-1", tenant="vision", user="bob")
OTHERS_JOB = Owned(kind="job", name="j-2", tenant="vision", user="dave")
NLP_JOB = Owned(kind="job", name="j-3", tenant="nlp", user="nick")
SOLO = Owned(kind="queue", name="solo", tenant="vision", submitters=("dave",))
PLATFORM_QUEUE = Owned(kind="queue", name="shared", tenant=None)

CASES = [
    (
        "platform admin does anything",
        who(Role.ADMIN, None),
        Action.CLUSTER_APPLY,
        None,
        Verdict.ALLOW,
    ),
    ("anonymous is a platform admin", ANONYMOUS, Action.JOB_CANCEL, NLP_JOB, Verdict.ALLOW),
    ("member cancels own", who(Role.MEMBER), Action.JOB_CANCEL, JOB, Verdict.ALLOW),
    (
        "member cannot cancel another's",
        who(Role.MEMBER),
        Action.JOB_CANCEL,
        OTHERS_JOB,
        Verdict.FORBIDDEN,
    ),
    (
        "tenant admin cancels another's",
        who(Role.ADMIN),
        Action.JOB_CANCEL,
        OTHERS_JOB,
        Verdict.ALLOW,
    ),
    ("another tenant's job is hidden", who(Role.ADMIN), Action.JOB_READ, NLP_JOB, Verdict.HIDDEN),
    ("viewer reads", who(Role.VIEWER), Action.JOB_READ, OTHERS_JOB, Verdict.ALLOW),
    ("viewer cannot submit", who(Role.VIEWER), Action.JOB_SUBMIT, None, Verdict.FORBIDDEN),
    ("submitters narrow", who(Role.MEMBER), Action.JOB_SUBMIT, SOLO, Verdict.FORBIDDEN),
    ("a listed submitter", who(Role.MEMBER, user="dave"), Action.JOB_SUBMIT, SOLO, Verdict.ALLOW),
    (
        "platform queue needs platform",
        who(Role.ADMIN),
        Action.JOB_SUBMIT,
        PLATFORM_QUEUE,
        Verdict.FORBIDDEN,
    ),
    ("tenant admin cannot apply", who(Role.ADMIN), Action.CLUSTER_APPLY, None, Verdict.FORBIDDEN),
    ("member cannot list tokens", who(Role.MEMBER), Action.TOKEN_READ, None, Verdict.FORBIDDEN),
]


@pytest.mark.parametrize(
    ("principal", "action", "obj", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_decide(principal: Principal, action: Action, obj: Owned | None, expected: Verdict) -> None:
    verdict, needed = decide(principal, action, obj)
    assert verdict is expected
    assert (needed != "") == (verdict is Verdict.FORBIDDEN)
    assert may(principal, action, obj) == (verdict is Verdict.ALLOW)


def test_every_action_has_a_rule_and_listings_are_narrowed() -> None:
    assert set(RULES) == set(Action)
    assert visible_tenant(who(Role.ADMIN, None)) is None
    assert visible_tenant(who(Role.VIEWER, "nlp")) == "nlp"
