"""Reading CSV cells for the trace readers: rows with their line numbers, whole numbers,
names, and errors that name the file and the line."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from allotment.domain.cluster import Cluster, ClusterFile
from allotment.domain.fields import Name
from allotment.domain.loading import validate_model
from allotment.sim.trace import TraceError

_NAME = TypeAdapter(Name)


def read_lines(path: Path) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            return handle.readlines()
    except UnicodeDecodeError as exc:
        raise not_utf8(path, str(path)) from exc
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}", source=str(path)) from exc


def not_utf8(path: Path, source: str) -> TraceError:
    """The error for a file that is not UTF-8 text, naming the line of the first bad byte."""
    try:
        data = path.read_bytes()
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return TraceError(
            f"byte 0x{data[exc.start]:02x} is not UTF-8 text; save the file as UTF-8",
            source=source,
            line=line,
        )
    except OSError as exc:
        return TraceError(f"cannot read: {exc.strerror or exc}", source=source)
    return TraceError("cannot read: not UTF-8 text", source=source)


def table(
    lines: Iterable[str], source: str | None
) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """The header of a CSV (names stripped) and its other rows with the line each ends
    on, blank rows left out. A row of more or fewer cells than the header, or text that
    is not CSV, raises :class:`TraceError` naming the line."""
    reader = csv.reader(lines)
    try:
        header = [name.strip() for name in next(reader, [])]
    except csv.Error as exc:
        raise TraceError(f"not valid CSV: {exc}", source=source, line=1) from exc

    def rows() -> Iterator[tuple[int, list[str]]]:
        width = len(header)
        try:
            for row in reader:
                if not (row and row[0].strip()) and not any(c.strip() for c in row):
                    continue
                if len(row) != width:
                    many = f"{len(row)} cells" if len(row) > width else "too few cells"
                    raise TraceError(
                        f"{many}, the header has {width}", source=source, line=reader.line_num
                    )
                yield reader.line_num, row
        except csv.Error as exc:
            raise TraceError(f"not valid CSV: {exc}", source=source, line=reader.line_num) from exc

    return header, rows()


def cell(row: list[str], index: int, column: str) -> str:
    value = row[index].strip()
    if not value:
        raise ValueError(f"{column} is empty")
    return value


def whole(row: list[str], index: int, column: str) -> int:
    text = cell(row, index, column)
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not number.is_integer():
            raise ValueError(f"{column} must be a whole number, got {text!r}") from None
        value = int(number)
    if value < 0:
        raise ValueError(f"{column} must not be negative, got {text!r}")
    return value


def queue_name(text: str, column: str) -> str:
    try:
        return str(_NAME.validate_python(text))
    except ValidationError:
        raise ValueError(
            f"{column} {text!r} is not a valid queue name (lower-case letters, digits, "
            "'.', '_', '-'; at most 64 characters)"
        ) from None


def pool_name(model: str, column: str) -> str:
    try:
        return str(_NAME.validate_python(model.lower()))
    except ValidationError:
        raise ValueError(
            f"{column} {model!r} does not make a pool name (letters, digits, '.', '_', '-'; "
            "at most 64 characters)"
        ) from None


def build_cluster(data: dict[str, Any], source: str | None) -> Cluster:
    return Cluster.from_file(validate_model(ClusterFile, data, source=source), source=source)
