"""The reliability campaigns, long: real ``allot up`` servers under faults.

Not a test (``tests/server/test_reliability_campaigns.py`` runs each for a few seconds).
For each campaign and store it prints acknowledged submissions, lost jobs, jobs stored
twice, jobs run twice at once and device-seconds held by two jobs (targets: all 0 but
the first), with the faults injected, then one ``BENCH {...}`` JSON line. It exits 1 when
any campaign is not clean.

Run ``PYTHONPATH=src:. python bench/bench_reliability.py --help``; see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.reliability.campaigns import CAMPAIGNS, STORES
from bench.reliability.runs import Figures

COLUMNS = (
    ("campaign", "campaign"),
    ("store", "store"),
    ("seconds", "s"),
    ("faults", "faults"),
    ("acknowledged", "acked"),
    ("unanswered", "resent"),
    ("lost", "lost"),
    ("duplicated", "dup"),
    ("double_run", "run 2x"),
    ("double_booked_device_s", "dbl-booked dev-s"),
    ("stuck", "stuck"),
    ("retried", "retried"),
    ("server_errors", "5xx"),
)


def plan(campaigns: list[str], stores: list[str]) -> list[tuple[str, str]]:
    """Each campaign on each store it runs on (failover: PostgreSQL only)."""
    return [
        (campaign, store)
        for campaign in campaigns
        for store in stores
        if campaign != "failover" or store == "postgresql"
    ]


def table(rows: list[Figures]) -> str:
    cells = [[str(getattr(f, key)) for key, _ in COLUMNS] for f in rows]
    widths = [
        max(len(title), *(len(row[i]) for row in cells)) for i, (_, title) in enumerate(COLUMNS)
    ]
    lines = ["  ".join(title.rjust(w) for (_, title), w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--campaign",
        action="append",
        choices=sorted(CAMPAIGNS),
        help="run only this campaign (repeatable; default: all)",
    )
    parser.add_argument(
        "--store", action="append", choices=STORES, help="only this store (default: both)"
    )
    parser.add_argument(
        "--seconds", type=float, default=120.0, help="faults injected for this long, per run"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep each run's directory (logs) under here")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    rows: list[Figures] = []
    for campaign, store in plan(args.campaign or list(CAMPAIGNS), args.store or list(STORES)):
        print(f"{campaign} on {store} for {args.seconds:g} s ...", flush=True)
        if args.keep is not None:
            root = args.keep / f"{campaign}-{store}"
            figures = CAMPAIGNS[campaign](root, store, args.seconds, args.seed)
        else:
            with tempfile.TemporaryDirectory(prefix=f"allot-{campaign}-") as tmp:
                figures = CAMPAIGNS[campaign](Path(tmp), store, args.seconds, args.seed)
        for note in figures.notes:
            print(f"  {note}")
        rows.append(figures)
    print(table(rows))
    print("BENCH " + json.dumps([f.to_dict() for f in rows]))
    return 0 if all(f.clean for f in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
