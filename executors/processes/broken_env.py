"""Signs that a helper process failed for its environment, not for the configuration it served.

A failed trial teaches the sampler that its configuration does not work; a helper that failed because the
machine broke under it teaches it a falsehood and spends a trial of the budget. The helpers here are the load
generator (``vllm bench serve``, a fresh command or a level forked from the bench zygote) and the processes our
own launcher module starts. Their environment broke when this tuner's code folder is gone (removed or moved
while the tuner runs: every helper started after that fails to import ``executors``), or when the client's last
error says a module does not import (the client's code is the same for every configuration, so that error is
the installation's). Such failures are ``FailureKind.ENVIRONMENT``: retried on a fresh deployment, never told
to the sampler as infeasible, never counted in the budget (``advisor.tune``).
"""

from __future__ import annotations

import re
from pathlib import Path

from executors.processes import procs

#: The ``executors`` package's folder: the code every helper we launch imports (``-m executors.…``).
CODE_DIR = Path(__file__).resolve().parents[1]

#: An error line saying a module does not import (what ``error_line`` picks from a traceback's last line).
_IMPORT_FAILED = re.compile(r"^\s*(?:\([^)]*\)\s*)?(?:ModuleNotFoundError|ImportError)\b|No module named ")


def code_gone() -> str | None:
    """Why helpers started from now on cannot import this tuner's code, or None while the code is there."""
    if (CODE_DIR / "__init__.py").is_file():
        return None
    return (f"this tuner's code folder {CODE_DIR.parent} is gone (removed or moved while the tuner ran): "
            "helpers started from now on cannot import it; run the tuner again from a folder that stays")


def import_failure(log_text: str) -> str | None:
    """The log's error line when it says a module does not import, else None."""
    line = procs.error_line(log_text)
    return line if line is not None and _IMPORT_FAILED.search(line) else None
