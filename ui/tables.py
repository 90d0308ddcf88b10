"""The Study page's trial table after the reader's filters: a pure function of the table ``ui.data.trials``
returns, tested without a page."""

from __future__ import annotations

import pandas as pd


def filter_trials(df: pd.DataFrame, *, states: list[str] | None = None, text: str = "", feasible_only: bool = False,
                  gpus: tuple[int, int] | None = None, sort: str = "trial", descending: bool = False) -> pd.DataFrame:
    """The Study page's trial table after its filters: states, words in the deployment, SLO-feasible only,
    a GPU range, then sorted (missing values last)."""
    out = df
    if out.empty:
        return out
    if states:
        out = out[out["state"].isin(states)]
    if text:
        words = text.lower().split()
        hay = (out["deployment"].fillna("") + " " + out["config"].fillna("")).str.lower()
        for w in words:
            out = out[hay.loc[out.index].str.contains(w, regex=False)]
    if feasible_only:
        out = out[(out["state"] == "complete") & out["feasible"]]
    if gpus is not None and "gpus" in out:
        out = out[out["gpus"].between(gpus[0], gpus[1])]
    if sort in out.columns:
        out = out.sort_values(sort, ascending=not descending, na_position="last", kind="stable")
    return out


_MARKDOWN_SPECIALS = str.maketrans({c: f"\\{c}" for c in "\\|*_`[]<>#~"})


def markdown_table(df: pd.DataFrame) -> str:
    """A small table as Markdown text, every cell taken as plain text, numbers right-aligned. ``st.markdown``
    draws it with the renderer every page has loaded already, where ``st.table`` sends Arrow data and the
    browser loads and runs the Arrow table's code (a tenth of a second and more before the page's first chart)."""
    def row(values: list[object]) -> str:
        return "| " + " | ".join(str(v).translate(_MARKDOWN_SPECIALS).replace("\n", " ") for v in values) + " |"

    numeric = [bool(len(df)) and df[c].astype(str).str.fullmatch(r"[-–\d,.]+").all() for c in df.columns]
    lines = [row(list(df.columns)), "|" + "".join("---:|" if n else "---|" for n in numeric)]
    lines += [row(list(r)) for r in df.itertuples(index=False)]
    return "\n".join(lines)
