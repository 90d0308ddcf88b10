"""Where a deploy's seconds go, read from the run folders' vLLM server logs (issue 30: "deploys that reuse what
they can": cold, new-config and same-config deploy times, and what inside them a cache can save).

    python benchmarks/deploy_phases.py RUNS_DIR [RUNS_DIR ...] [--out benchmarks/results/NAME.json]

A run folder is one deployment (``executor.run_dir/<study>/<YYYYmmdd-HHMMSS-id>/``, named when the deploy began);
each ``<instance>.log`` in it is one vLLM server's output. Per server, from vLLM's own log lines: the seconds from
the deploy's start to the API server's first line (the Python process starting and importing vLLM), to the engine
core's first line (the API server building its config), the engine's init as vLLM reports it (model load,
Dynamo, inductor or a cache load, CUDA-graph capture) and the server's "Starting vLLM server" line. Timestamps in
vLLM's log have one-second resolution and no year; the deploy's start has one-second resolution too.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executors.vllm.executor import DEPLOYMENT_TIME  # noqa: E402
from executors.vllm.server_standby import ADOPTED  # noqa: E402

_TS = re.compile(r"\b(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")
#: vLLM log line → (field, the number it carries; None: the line's time is what is kept)
_LINES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("engine_first_s", re.compile(r"Initializing a V1 LLM engine")),
    ("model_load_s", re.compile(r"Model loading took .*? and ([\d.]+) seconds")),
    ("dynamo_s", re.compile(r"Dynamo bytecode transform time: ([\d.]+) s")),
    ("inductor_s", re.compile(r"Compiling a graph for compile range .* takes ([\d.]+) s")),
    ("graphs_loaded_s", re.compile(r"Directly load the compiled graph\(s\) .* took ([\d.]+) s")),
    ("torch_compile_s", re.compile(r"torch\.compile took ([\d.]+) s in total")),
    ("graph_capture_s", re.compile(r"Graph capturing finished in ([\d.]+) secs")),
    ("engine_init_s", re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")),
    ("server_up_s", re.compile(r"Starting vLLM server on")),
)
_AT = {"engine_first_s", "server_up_s"}  # fields measured from the deploy's start to the line


def _when(line: str, year: int) -> datetime | None:
    m = _TS.search(line)
    return datetime(year, *(int(x) for x in m.groups())) if m else None


def phases(log: Path, start: datetime) -> dict[str, float]:
    """One server's phases: seconds from ``start`` to its first line and to the lines in ``_AT``, and the
    durations vLLM reports. Values summed where vLLM logs several (one per compile range or graph mode).
    A server that was a standby (executors/vllm/server_standby.py: it imported vLLM while the last deployment was
    measured) is timed from the moment it was handed its flags; ``standby`` is 1 then."""
    out: dict[str, float] = {}
    lines = log.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if ADOPTED in line:
            start = datetime.strptime(line.split(ADOPTED, 1)[1].strip()[:15], DEPLOYMENT_TIME)
            lines, out = lines[i + 1:], {"standby": 1.0}
            break
    for line in lines:
        at = _when(line, start.year)
        if at is not None and "first_line_s" not in out:
            out["first_line_s"] = (at - start).total_seconds()
        for field, pattern in _LINES:
            m = pattern.search(line)
            if m is None or (field in _AT and field in out):
                continue
            if field in _AT:
                if at is not None:
                    out[field] = (at - start).total_seconds()
            else:
                out[field] = out.get(field, 0.0) + float(m.group(1))
    return out


def deployment(folder: Path) -> dict[str, Any] | None:
    try:
        start = datetime.strptime(folder.name[:15], DEPLOYMENT_TIME)
    except ValueError:
        return None
    servers = {log.stem: phases(log, start) for log in sorted(folder.glob("*.log")) if log.stem != "router"}
    return {"study": folder.parent.name, "deployment": folder.name, "servers": servers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = [d for root in a.runs for folder in sorted(p for p in root.rglob("*") if p.is_dir())
            if (d := deployment(folder)) is not None and d["servers"]]
    cols = ("standby", "first_line_s", "engine_first_s", "model_load_s", "dynamo_s", "inductor_s", "graphs_loaded_s",
            "graph_capture_s", "engine_init_s", "server_up_s")
    print("| study | deployment | server | " + " | ".join(cols) + " |")
    print("|---" * (3 + len(cols)) + "|")
    for d in rows:
        for name, ph in d["servers"].items():
            cells = " | ".join(("yes" if c == "standby" else f"{ph[c]:.1f}") if c in ph else "" for c in cols)
            print(f"| {d['study']} | {d['deployment']} | {name} | {cells} |")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
