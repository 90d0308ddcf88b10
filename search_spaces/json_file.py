"""One JSON file read into Python, with every way it can be wrong as one ``ValueError`` line naming the file.

The model's ``config.json`` and ``advisor calibrate``'s parameter files are both read here, so both say the
same thing about the same fault (the fuzz tests feed them bytes, huge numbers and deep nesting).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_file(path: str | Path, what: str, *, hint: str, max_bytes: int | None = None) -> Any:
    """The parsed JSON of ``path``; ``what`` names the kind of file ("model config"), ``hint`` says what it
    should be ("a model config.json is JSON"). ``OSError`` passes as it is."""
    p = Path(path)
    with p.open("rb") as f:
        raw = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(raw) > max_bytes:
        raise ValueError(f"{p}: larger than {max_bytes >> 20} MiB: not a {what} ({hint})")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); {hint}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ValueError(f"{p}: not a {what}: JSON nested too deeply") from None
    except ValueError:  # past Python's digit limit for int()
        raise ValueError(f"{p}: not a {what}: a number of thousands of digits") from None
