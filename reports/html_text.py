"""The one way text enters a report's HTML: every string rendered there passes through `escaped`.

A report renders strings it read from files somebody else wrote (audit.json, ledger.json, the
manifest), so none of them may reach the HTML as markup.
"""
from __future__ import annotations

import html


def escaped(value) -> str:
    """`value` as HTML text: &, <, >, " and ' replaced by their character references (html.escape
    with quote=True), safe in element content and in quoted attribute values."""
    return html.escape(str(value), quote=True)
