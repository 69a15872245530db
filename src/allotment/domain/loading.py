"""Reading ``cluster.yaml`` and ``job.yaml`` safely, with errors that name the line.

YAML is parsed with the safe loader (no arbitrary tags), bounded in size, depth and
expanded size (aliases), and validated by the pydantic models; every problem becomes an
:class:`Issue` with its dotted path and, where the YAML gives it, its line number.

Scalars follow YAML 1.2 where 1.1 surprises people: only ``true``/``false`` are booleans
(``retry: {on: [...]}`` has a key ``on``, and a label ``yes`` stays a string), and
``20:00`` is a string, not the base-60 number 1200.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from allotment.domain.cluster import Cluster, ClusterFile, Queue
from allotment.domain.errors import ConfigError, InvalidInput, Issue
from allotment.domain.job import JobSpec

MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 32
MAX_NODES = 200_000
"""Most YAML nodes a file may hold once aliases are expanded (a "billion laughs" guard)."""

_M = TypeVar("_M", bound=BaseModel)
Lines = dict[tuple[str, ...], int]


_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"


class _Loader(yaml.SafeLoader):
    """The safe loader with YAML 1.2 booleans and without base-60 integers."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _INT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)

_FastBase: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _FastLoader(_FastBase):  # type: ignore[valid-type,misc]
    """:class:`_Loader`'s rules on libyaml's parser (several times faster) when PyYAML
    was built with it, else the same as :class:`_Loader`."""


_FastLoader.yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers


def _check_depth(text: str) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` before composing (the composer
    recurses once per level, so a deep file would otherwise exhaust the stack)."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_FastLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else None
                    raise ConfigError(
                        [Issue(path="", message=f"nested deeper than {MAX_DEPTH}", line=line)]
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:  # libyaml stops far deeper nesting itself
        if "nesting depth" not in str(getattr(exc, "problem", "")):
            raise
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(
            [Issue(path="", message=f"nested deeper than {MAX_DEPTH}", line=line)]
        ) from exc


def _walk(
    node: yaml.Node, path: tuple[str, ...], lines: Lines, depth: int, seen: list[int]
) -> None:
    if depth > MAX_DEPTH:
        raise ConfigError([Issue(path=".".join(path), message=f"nested deeper than {MAX_DEPTH}")])
    seen[0] += 1
    if seen[0] > MAX_NODES:
        raise ConfigError(
            [Issue(path="", message=f"more than {MAX_NODES} values once aliases are expanded")]
        )
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = str(key.value)
            lines[(*path, name)] = key.start_mark.line + 1
            _refuse_nul(name, (*path, name), key)
            _walk(value, (*path, name), lines, depth + 1, seen)
    elif isinstance(node, yaml.ScalarNode):
        _refuse_nul(str(node.value), path, node)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, str(i)), lines, depth + 1, seen)


def _refuse_nul(value: str, path: tuple[str, ...], node: yaml.Node) -> None:
    """No NUL characters (``"\\0"``, ``"\\u0000"``): no store keeps them in text."""
    if "\x00" in value:
        raise ConfigError(
            [
                Issue(
                    path=".".join(path),
                    message="contains a NUL character (\\0), which no name or text may hold",
                    line=node.start_mark.line + 1,
                )
            ]
        )


def _yaml_error(exc: yaml.YAMLError, source: str | None) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = getattr(exc, "problem", None) or str(exc)
    return ConfigError(
        [Issue(path="", message=f"not valid YAML: {problem}", line=line)], source=source
    )


def parse_yaml(text: str, *, source: str | None = None) -> tuple[Any, Lines]:
    """Parse YAML text safely; return the data and a map from key paths to line numbers."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise ConfigError(
            [Issue(path="", message=f"file larger than {MAX_BYTES // 1024 // 1024} MiB")],
            source=source,
        )
    # One parse: the composed document is walked for line numbers and bounds, then
    # constructed by the same (safe) loader, as yaml.load would construct it.
    loader: _FastLoader | None = None
    try:
        try:
            _check_depth(text)
            loader = _FastLoader(text)
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            raise _yaml_error(exc, source) from exc
        except ConfigError as exc:
            raise ConfigError(exc.issues, source=source) from None
        lines: Lines = {}
        if node is None:
            return None, lines
        try:
            _walk(node, (), lines, 0, [0])
        except ConfigError as exc:
            raise ConfigError(exc.issues, source=source) from None
        try:
            data = loader.construct_document(node)
        except yaml.YAMLError as exc:  # e.g. an unhashable key, found only on construction
            raise _yaml_error(exc, source) from exc
    finally:
        if loader is not None:
            loader.dispose()
    return data, lines


def _line_for(loc: tuple[str, ...], lines: Lines) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _strip(annotation: Any) -> Any:
    """``X | None`` and ``Annotated[X, ...]`` → ``X``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, UnionType):
            rest = [a for a in get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation


def _keys_at(model: type[BaseModel], loc: tuple[str, ...]) -> list[str]:
    """The keys the model allows at the mapping that holds ``loc``'s last key."""
    current: Any = model
    for part in loc[:-1]:
        current = _strip(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            fields = current.model_fields
            name = next((n for n, f in fields.items() if part in (n, f.alias)), None)
            if name is None:
                return []
            current = fields[name].annotation
        elif get_origin(current) in (list, tuple):
            current = get_args(current)[0]
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        else:
            return []
    current = _strip(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(f.alias or n for n, f in current.model_fields.items())
    return []


def _unknown_key(model: type[BaseModel], loc: tuple[str, ...]) -> str:
    key = loc[-1]
    allowed = _keys_at(model, loc)
    if not allowed:
        return f"unknown key {key!r}"
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; allowed here: {', '.join(allowed)}"


def _issues_from(model: type[BaseModel], exc: ValidationError, lines: Lines) -> list[Issue]:
    issues = []
    for error in exc.errors():
        loc = tuple(str(part) for part in error["loc"] if not str(part).startswith("function-"))
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = _unknown_key(model, loc)
        elif error["type"] == "missing":
            message = f"missing required key {loc[-1]!r}"
        message = message.removeprefix("Value error, ")
        issues.append(Issue(path=".".join(loc), message=message, line=_line_for(loc, lines)))
    return issues


def validate_model(
    model: type[_M],
    data: Any,
    *,
    lines: Lines | Callable[[], Lines] | None = None,
    source: str | None = None,
) -> _M:
    """Validate ``data`` against ``model``; raise :class:`ConfigError` with every issue.
    ``lines`` (or what calling it gives, only when there are issues) places them."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [Issue(path="", message="expected a mapping at the top of the file", line=1)],
            source=source,
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        found = lines() if callable(lines) else lines
        raise ConfigError(_issues_from(model, exc, found or {}), source=source) from exc


def _read(path: str | Path) -> str:
    file = Path(path)
    try:
        if file.stat().st_size > MAX_BYTES:
            raise ConfigError([Issue(path="", message="file larger than 4 MiB")], source=str(path))
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}", fields={"path": str(path)}) from exc


def load_cluster_text(text: str, *, source: str | None = None) -> Cluster:
    """Parse and cross-check ``cluster.yaml`` text into a :class:`Cluster`."""
    data, lines = parse_yaml(text, source=source)
    file = validate_model(ClusterFile, data, lines=lines, source=source)
    try:
        return Cluster.from_file(file, source=source)
    except ConfigError as exc:
        issues = [
            Issue(
                path=i.path,
                message=i.message,
                line=i.line or _line_for(tuple(i.path.split(".")), lines),
            )
            for i in exc.issues
        ]
        raise ConfigError(issues, source=source) from None


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a cluster file."""
    return load_cluster_text(_read(path), source=str(path))


def _json_object(text: str) -> dict[str, Any] | None:
    """``text`` as a JSON object, or None when it is not one (then it is read as YAML).
    ``NaN`` and ``Infinity`` are not JSON numbers here."""
    if not text.lstrip().startswith("{"):
        return None

    def no_constant(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number")

    try:
        data = json.loads(text, parse_constant=no_constant)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _check_json(value: object, path: tuple[str, ...], depth: int, seen: list[int]) -> None:
    """The bounds YAML gets (depth, values), and no NUL or lone surrogate (``\ud83d``
    without its pair) in any key or text: no store keeps them."""
    where = ".".join(path)
    if depth > MAX_DEPTH:
        raise ConfigError([Issue(path=where, message=f"nested deeper than {MAX_DEPTH}")])
    seen[0] += 1
    if seen[0] > MAX_NODES:
        raise ConfigError([Issue(path="", message=f"more than {MAX_NODES} values")])
    if isinstance(value, str):
        if "\x00" in value:
            raise ConfigError(
                [
                    Issue(
                        path=where,
                        message="contains a NUL character (\\0), which no name or text may hold",
                    )
                ]
            )
        if _SURROGATE.search(value):
            raise ConfigError(
                [
                    Issue(
                        path=where,
                        message="contains an unpaired UTF-16 surrogate escape "
                        "(\\ud800-\\udfff); write the character itself or its escape pair",
                    )
                ]
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json(key, (*path, key), depth + 1, seen)
            _check_json(item, (*path, key), depth + 1, seen)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, (*path, str(i)), depth + 1, seen)


def _json_lines(text: str) -> Lines:
    """Line numbers for a JSON spec, where YAML can read it (not with escaped
    surrogate pairs); else none."""
    try:
        _check_depth(text)
        node = yaml.compose(text, Loader=_FastLoader)
        lines: Lines = {}
        if node is not None:
            _walk(node, (), lines, 0, [0])
        return lines
    except (yaml.YAMLError, ConfigError):
        return {}


def parse_spec(text: str, *, source: str | None = None) -> tuple[Any, Lines]:
    """A spec's text as data: a JSON object when the text is one (``json.dumps`` output,
    escaped emoji included), else YAML (:func:`parse_yaml`, with line numbers)."""
    data, lines = _spec_data(text, source)
    return data, lines()


def _spec_data(text: str, source: str | None) -> tuple[Any, Callable[[], Lines]]:
    """:func:`parse_spec`, with the line numbers as a function: a JSON spec's are
    found (by reading it again as YAML) only when asked, for its issues."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise ConfigError(
            [Issue(path="", message=f"file larger than {MAX_BYTES // 1024 // 1024} MiB")],
            source=source,
        )
    data = _json_object(text)
    if data is None:
        data, lines = parse_yaml(text, source=source)
        return data, lambda: lines
    try:
        _check_json(data, (), 0, [0])
    except ConfigError as exc:
        raise ConfigError(exc.issues, source=source) from None
    return data, lambda: _json_lines(text)


def load_job_text(text: str, *, source: str | None = None) -> JobSpec:
    """Parse ``job.yaml`` text (YAML, or a JSON object) into a :class:`JobSpec` (shape
    only; the queue, pools and priority class are checked against a cluster by
    :func:`check_job`)."""
    data, lines = _spec_data(text, source)
    return validate_model(JobSpec, data, lines=lines, source=source)


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file."""
    return load_job_text(_read(path), source=str(path))


def check_job(
    job: JobSpec, cluster: Cluster, *, usable: Callable[[Queue], bool] | None = None
) -> list[Issue]:
    """What is wrong with ``job`` on ``cluster``: unknown queue (listing the leaves the
    submitter may use: all, or those ``usable`` accepts), a non-leaf queue, disallowed
    priority class or pools. Empty when acceptable."""
    issues: list[Issue] = []
    queue = cluster.queues.get(job.queue)

    def leaves() -> str:  # only for an issue: it asks ``usable`` about every leaf
        return ", ".join(sorted(q.name for q in cluster.leaves if usable is None or usable(q)))

    if queue is None:
        issues.append(
            Issue(
                path="queue",
                message=(f"unknown queue {job.queue!r}; queues you can submit to: {leaves()}"),
            )
        )
        return issues
    if not queue.is_leaf:
        issues.append(
            Issue(
                path="queue",
                message=(f"{job.queue!r} has child queues; submit to a leaf: {leaves()}"),
            )
        )
    if cluster.priority_class_for(queue, job.priority_class) is None:
        allowed = queue.spec.priority_classes or sorted(cluster.priority_classes)
        issues.append(
            Issue(
                path="priority_class",
                message=(
                    f"priority class {job.priority_class!r} is not allowed in queue {queue.name}; "
                    f"allowed: {', '.join(allowed)}"
                ),
            )
        )
    open_pools = cluster.allowed_pools(queue)
    for i, pool in enumerate(job.pools):
        if pool not in open_pools:
            issues.append(
                Issue(
                    path=f"pools.{i}",
                    message=(
                        f"pool {pool!r} is not open to queue {queue.name}; "
                        f"open pools: {', '.join(open_pools) or 'none'}"
                    ),
                )
            )
    most = queue.max_job_replicas
    if job.replica_count > most:
        issues.append(
            Issue(
                path="replicas",
                message=(
                    f"queue {queue.name} accepts jobs of up to {most:,} replicas; this job "
                    f"has {job.replica_count:,}"
                ),
            )
        )
    limit = queue.spec.max_job
    if limit is not None:
        total = job.total_resources()
        over = [k for k in limit if total[k] > limit[k]]
        if over:
            shown = limit.display()
            issues.append(
                Issue(
                    path="replicas",
                    message=(
                        f"queue {queue.name} accepts jobs up to "
                        + ", ".join(f"{shown[k]} {k}" for k in over)
                        + "; this job asks for "
                        + ", ".join(f"{total.display()[k]} {k}" for k in over)
                        + " in all"
                    ),
                )
            )
    return issues
