"""The one way text enters a report's HTML: every string rendered there passes through `escaped`.

A report renders strings it read from files somebody else wrote (audit.json, ledger.json, the
manifest), so none of them may reach the HTML as markup.
"""
from __future__ import annotations

import html


def escaped(value: object, quotes: bool = True) -> str:
    """`value` as HTML text: &, < and > replaced by their character references, and " and ' too
    unless `quotes` is False (text outside any attribute, e.g. a Markdown paragraph, where they are
    harmless and show as themselves in plain text). Safe in element content, and with quotes in
    quoted attribute values.

    Args:
        value: any value; it is converted with str().
        quotes: whether " and ' are replaced too (True for attribute values and element content).

    Returns:
        The escaped text.
    """
    return html.escape(str(value), quote=quotes)
