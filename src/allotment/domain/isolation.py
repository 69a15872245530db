"""Where a job may run and what it may see: images, runtime, network.

Pure rules, checked when a job is submitted and again when it is launched (the
configuration may have changed in between). The data scopes of mounts are checked by
:mod:`allotment.domain.scopes`.

- With ``runtime: process`` a job runs as a plain process: one that names an ``image``
  or ``mounts`` is refused, never run without them.
- With a container runtime every job runs in an image: its own ``image`` or the
  runtime's ``default_image``; the image must match one of its tenant's patterns
  (:meth:`~allotment.domain.cluster.Cluster.images_of`).
- ``network: true`` needs a queue that allows the network.
- With a container runtime no ``env`` value may hold a line break: the environment
  file cannot carry one, and Podman (run as root) must not be given job values in its
  own environment, where ``LD_PRELOAD`` or ``CONTAINERS_CONF`` would change Podman.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from allotment.domain.cluster import Cluster, Queue
from allotment.domain.errors import ConfigError, Issue
from allotment.domain.job import JobSpec


def repository(image: str) -> str:
    """``image`` without its tag and digest: ``registry:5000/team/train`` of
    ``registry:5000/team/train:1.4@sha256:…`` (a tag is a ``:`` after the last ``/``;
    one before it is a registry's port)."""
    name = image.split("@", 1)[0]
    head, slash, last = name.rpartition("/")
    return head + slash + last.split(":", 1)[0]


def image_matches(image: str, pattern: str) -> bool:
    """Whether ``image`` is ``pattern`` (``*`` and ``?`` as in file names; ``*`` also
    crosses ``/``). A pattern without a tag or digest admits every tag and digest of
    what it names: ``registry/team/train`` admits ``registry/team/train:1.4``, but
    ``pytorch`` does not admit ``pytorch:5000/other/image`` (a registry's port)."""
    if fnmatchcase(image, pattern):
        return True
    last = pattern.rsplit("/", 1)[-1]
    if ":" in last or "@" in pattern:
        return False
    name = repository(image)
    return name != image and fnmatchcase(name, pattern)


def image_allowed(image: str, patterns: Sequence[str]) -> bool:
    return any(image_matches(image, p) for p in patterns)


def job_image(spec: JobSpec, cluster: Cluster) -> str | None:
    """The image the job runs in (its own, else the runtime's default), or ``None``."""
    return spec.image or cluster.runtime.default_image


class ImageNotAllowed(ConfigError):
    """A job names an image outside its tenant's allow-list."""

    code = "image_not_allowed"

    def __init__(self, issue: Issue, *, tenant: str, allowed: list[str], source: str | None):
        super().__init__([issue], source=source)
        self.fields["tenant"] = tenant
        self.fields["allowed"] = list(allowed)


def check_execution(
    spec: JobSpec, cluster: Cluster, queue: Queue, tenant: str, *, source: str | None = None
) -> None:
    """Raise :class:`ImageNotAllowed` (the tenant's allow-list in the message) or
    :class:`ConfigError` when ``spec`` cannot run as written on ``cluster``'s runtime."""
    runtime = cluster.runtime
    issues: list[Issue] = []
    if not runtime.containers:
        if spec.image is not None:
            issues.append(
                Issue(
                    path="image",
                    message=(
                        "this cluster runs jobs as plain processes (executor.runtime.kind: "
                        "process), so an image would be ignored; remove image, or ask the "
                        "platform team to turn containers on (runtime kind: podman)"
                    ),
                )
            )
        if spec.mounts:
            issues.append(
                Issue(
                    path="mounts",
                    message=(
                        "this cluster runs jobs as plain processes (executor.runtime.kind: "
                        "process), which cannot mount anything; remove mounts, or ask the "
                        "platform team to turn containers on (runtime kind: podman)"
                    ),
                )
            )
    if runtime.containers:
        for i, mount in enumerate(spec.mounts):
            if "://" in mount.source:
                issues.append(
                    Issue(
                        path=f"mounts.{i}.source",
                        message=(
                            f"{mount.source!r} is an object-store location, which the podman "
                            "runtime cannot mount; read it from the job with the store's "
                            "client, or mount a path"
                        ),
                    )
                )
        for name, value in spec.env.items():
            if "\n" in value or "\r" in value:
                issues.append(
                    Issue(
                        path=f"env.{name}",
                        message=(
                            "holds a line break, which a container's environment file cannot "
                            "carry (and Podman's own environment must not); encode the value "
                            "(e.g. base64) or put it in a file under a mount"
                        ),
                    )
                )
    if spec.network and not queue.spec.network:
        issues.append(
            Issue(
                path="network",
                message=(
                    f"queue {queue.name!r} does not allow the network; remove network: true "
                    "or use a queue with network: true"
                ),
            )
        )
    if issues:
        raise ConfigError(issues, source=source)
    if not runtime.containers:
        return
    image = job_image(spec, cluster)
    allowed = cluster.images_of(tenant)
    shown = ", ".join(allowed) if allowed else "none"
    if image is None:
        raise ConfigError(
            [
                Issue(
                    path="image",
                    message=(
                        "jobs run in containers on this cluster and it has no default image; "
                        f"name one with image: (tenant {tenant!r} may use: {shown})"
                    ),
                )
            ],
            source=source,
        )
    if not image_allowed(image, allowed):
        raise ImageNotAllowed(
            Issue(
                path="image",
                message=f"tenant {tenant!r} may not run image {image!r}; allowed: {shown}",
            ),
            tenant=tenant,
            allowed=allowed,
            source=source,
        )
