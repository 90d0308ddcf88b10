"""The Streamlit tuning dashboard: ``advisor dashboard`` runs ``ui/app.py``.

It reads only through ``db``'s query functions (``ui.data``) and starts work only through ``advisor``'s
public API and CLI (``ui.jobs``). Figures are built by pure functions in ``ui.plots``, so they can be
tested without a browser. Nothing here is imported by ``advisor``: the arrows point down (DESIGN.md).
"""
