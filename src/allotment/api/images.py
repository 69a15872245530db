"""Which container images the nodes hold (``GET /api/v1/images``).

The API does not own the executor: the composition root gives :func:`create_app
<allotment.api.app.create_app>` two callables, ``images`` (the executor's
:meth:`~allotment.executors.base.Executor.images`: image references by node, ``None``
when it cannot tell) and ``enforcement`` (what the runtime enforces, by aspect). Without
them the images are unknown.

A platform admin sees every image; anyone else only the images their tenant may run
(:meth:`~allotment.domain.cluster.Cluster.images_of`, matched with
:func:`~allotment.domain.isolation.image_allowed`), so the images of other tenants
never show. The enforcement is not secret: everyone sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from allotment.api import schemas
from allotment.domain.cluster import Cluster
from allotment.domain.isolation import image_allowed

ImagesSource = Callable[[], Mapping[str, Sequence[str]] | None]
"""Image references by node; ``None``: the executor cannot tell."""
EnforcementSource = Callable[[], Mapping[str, str]]
"""What the runtime enforces, by aspect, in words."""

PROCESS_MESSAGE = (
    "jobs run as plain processes on this cluster (executor.runtime.kind: process), "
    "so they run in no image"
)
NO_SOURCE_MESSAGE = "this server cannot ask its executor which images its nodes hold"
UNKNOWN_MESSAGE = (
    "the executor cannot tell which images its nodes hold (Slurm does not report them, "
    "or Podman did not answer)"
)


def images_view(
    cluster: Cluster,
    *,
    tenant: str | None,
    images: ImagesSource | None,
    enforcement: EnforcementSource | None,
) -> schemas.ImagesOut:
    """The images on each node that ``tenant`` may run (``None``: every image, for a
    platform admin), with the runtime's enforcement."""
    runtime = cluster.runtime
    enforced = dict(enforcement()) if enforcement is not None else {}
    if not runtime.containers:
        return schemas.ImagesOut(
            runtime=runtime.kind,
            known=False,
            message=PROCESS_MESSAGE,
            nodes=[],
            enforcement=enforced,
        )
    allowed = None if tenant is None else cluster.images_of(tenant)
    found = images() if images is not None else None
    if found is None:
        return schemas.ImagesOut(
            runtime=runtime.kind,
            known=False,
            message=UNKNOWN_MESSAGE if images is not None else NO_SOURCE_MESSAGE,
            nodes=[],
            allowed=allowed,
            enforcement=enforced,
        )
    nodes = [
        schemas.NodeImages(
            node=node,
            images=sorted(
                {name for name in names if allowed is None or image_allowed(name, allowed)}
            ),
        )
        for node, names in sorted(found.items())
    ]
    return schemas.ImagesOut(
        runtime=runtime.kind, known=True, nodes=nodes, allowed=allowed, enforcement=enforced
    )
