"""What the CLI prints with: its two consoles, tables as Rich, CSV or JSON, and the lines every result command
adds (the simulated expert routing the levels ran with)."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections import Counter
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from search_spaces.workload import routing_label

console = Console(width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200")))
err = Console(stderr=True)


class RowFormat(StrEnum):
    """How a command prints rows; anything else is refused (one line, exit 2), not ignored."""

    TABLE = "table"
    CSV = "csv"
    JSON = "json"


RowFormatOpt = Annotated[RowFormat, typer.Option("--format", help="table|csv|json", show_choices=True)]


def fmt_cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def print_rows(title: str, columns: list[str], rows: list[list[Any]], fmt: str = "table") -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps([dict(zip(columns, r, strict=True)) for r in rows], indent=2, default=str) + "\n")
        return
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(columns)
        w.writerows(rows)
        sys.stdout.write(buf.getvalue())
        return
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*(fmt_cell(v) for v in r))
    console.print(t)


def routing_lines(url: str, study: str) -> list[str]:
    """"simulated routing: zipf 1.1 (12 of 12 levels)" for each simulated expert routing the study's levels were
    measured with (none for the real router, nor for levels without one: the performance model's, or stored
    before routing was recorded)."""
    import db
    from db import queries

    database = db.connect(url)
    try:
        _, rows = queries.level_table(database, study, ["expert_routing"])
    finally:
        database.close()
    stored = Counter(r.expert_routing for r in rows)
    total = sum(stored.values())
    return [f"{label} ({n} of {total} levels)" for value, n in stored.most_common()
            if (label := routing_label(value))]
