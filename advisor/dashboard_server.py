"""``advisor dashboard``: Streamlit serving ui/ in a process group of its own, stopped by its group on Ctrl-C or
SIGTERM; the storage URL travels in the environment (never on a command line ``ps`` shows)."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

import db
from advisor.errors import BadInput
from db import redact_url


def serve_dashboard(url: str, *, port: int, host: str, allow_new_studies: bool, console: Console,
                    err: Console) -> None:
    """Serve until Ctrl-C (lines to ``console``, warnings to ``err``); one-line ``BadInput`` for a bad storage URL,
    a port taken, or no dashboard installed."""
    try:
        db.normalize_url(url)
    except ValueError as e:
        raise BadInput(f"--storage: {e}") from None
    spec = importlib.util.find_spec("ui")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("streamlit") is None:
        raise BadInput("the dashboard is not installed (package ui and streamlit); run: pip install -e .")
    server_py = Path(next(iter(spec.submodule_search_locations))) / "server.py"  # st.App serving ui/app.py
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is no conflict
            s.bind((host, port))
    except OSError as e:
        raise BadInput(f"--port: cannot listen on {host}:{port} ({e.strerror or e}); pick another --port") from None
    argv = [sys.executable, "-m", "streamlit", "run", str(server_py), "--server.address", host,
            "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--", *(["--allow-new-studies"] if allow_new_studies else [])]
    # The URL travels in the environment, not on the command line, where `ps` would show a password.
    env = {**os.environ, "ADVISOR_STORAGE": url}
    env.pop("ADVISOR_ALLOW_NEW_STUDIES", None)  # only the flag decides
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    shown = f"[{host}]" if ":" in host else host
    console.print(f"dashboard on http://{shown}:{port} — storage {redact_url(url)}, "
                  f"{'may start studies' if allow_new_studies else 'read-only'}; process group {proc.pid}; "
                  "Ctrl-C stops it", highlight=False, soft_wrap=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"warning: listening on {host}: other machines can reach the dashboard", highlight=False,
                  soft_wrap=True)

    def on_term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    # Ctrl-C stops it even when started from a script's background job, which inherits SIGINT ignored.
    previous = signal.signal(signal.SIGTERM, on_term), signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        console.print("dashboard stopped")
        return
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    if rc != 0:
        raise BadInput(f"the dashboard (streamlit) exited with code {rc}")
