"""The dashboard's pages: ``advisor dashboard`` runs ``streamlit run ui/server.py``, which serves this script.

Pages are files under ``ui/views`` — not ``pages/``: a folder of that name beside the main script puts
Streamlit into its old multipage mode, where a deep link runs the page without this script. This script
only sets the page up, names the pages and shows which database is open (password hidden) and whether
the dashboard may start studies.

Nothing leaves the machine: the page icon is a file of this package (a Material icon as page icon would be
fetched from fonts.gstatic.com), and ``ui/.streamlit/config.toml`` puts Streamlit's toolbar in viewer mode
(no "Deploy" button) and turns its usage statistics off.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from ui import data
from ui.settings import settings

ICON = Path(__file__).resolve().parent / "assets" / "icon.png"
st.set_option("client.toolbarMode", "viewer")  # also when started without the config file beside this script
st.set_page_config(page_title="deploy-advisor", page_icon=str(ICON) if ICON.exists() else None,  # None: Streamlit's own
                   layout="wide")

s = settings()
nav = st.navigation([
    st.Page("views/studies.py", title="Studies", icon=":material/table_rows:", default=True),
    st.Page("views/study.py", title="Study", icon=":material/insights:"),
    st.Page("views/trial.py", title="Trial", icon=":material/deployed_code:"),
    st.Page("views/compare.py", title="Compare trials", icon=":material/compare_arrows:"),
    st.Page("views/compare_studies.py", title="Compare studies", icon=":material/stacked_line_chart:"),
    st.Page("views/new_study.py", title="New study", icon=":material/add_circle:"),
])
with st.sidebar:
    st.caption(f"Storage: `{s.storage_for_display}`")
    st.caption("Read-only" if not s.allow_new_studies else "May start studies (--allow-new-studies)")
    if data.exists(s.storage):
        try:
            snapshot = data.database(s.storage).snapshot
        except data.Unavailable:
            snapshot = None  # the page says why
        if snapshot:
            st.caption(f"Showing {snapshot}: the file is left as it is, and later writes to it are not seen here. "
                       "Any advisor command on it migrates it.")
    if st.button("Refresh", icon=":material/refresh:", key="refresh"):
        data.clear()
nav.run()
