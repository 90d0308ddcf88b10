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
