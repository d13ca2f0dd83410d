"""``report.html``: the report's markdown as a self-contained page a browser shows well.

It renders the markdown ``report.md`` is written in (headings, paragraphs, lists, tables,
images, inline ``code`` and ``**bold**``), inlines the PNG plots, and keeps every table in a
box of its own that scrolls sideways when it is wider than the page, so the page itself
never does.
"""
from __future__ import annotations

import base64
import html
import re
from typing import Mapping

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)]+)\)\s*$")
#: a cell that is a number, with or without a unit: right-aligned
_NUMERIC = re.compile(r"^[+-]?[\d,.]+\s*(%|s|ms|µs|tok/s|GiB)?$")
#: a cell longer than this is prose (an error, a reason): it wraps instead of widening its table
TEXT_CELL = 40

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; line-height: 1.45;
       max-width: 1200px; margin: 2em auto; padding: 0 1.5em; }
h1 { font-size: 1.6em; margin-bottom: 0.4em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.92em; background: #f3f3f3;
       padding: 0.05em 0.3em; border-radius: 3px; overflow-wrap: anywhere; }
ul { padding-left: 1.3em; }
li { margin: 0.2em 0; }
.table { overflow-x: auto; width: fit-content; max-width: 100%; margin: 0.6em 0 1em; border: 1px solid #e3e3e3;
         border-radius: 4px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 4px 9px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
th { background: #f7f7f7; font-weight: 600; white-space: nowrap; }
td { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.text { white-space: normal; min-width: 24em; max-width: 48em; overflow-wrap: break-word; }
img { max-width: 100%; height: auto; display: block; margin: 0.5em 0; }
.note { color: #555; font-size: 0.92em; }
"""


def inline(text: str) -> str:
    """One line of markdown text as HTML: escaped, with ``code`` and **bold**."""
    out = []
    for i, part in enumerate(_CODE.split(text)):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
        else:
            out.append(_BOLD.sub(r"<strong>\1</strong>", html.escape(part)))
    return "".join(out)


_PIPE = re.compile(r"(?<!\\)\|")


def _cells(row: str) -> list[str]:
    """The cells of a table row (``\\|`` is a pipe inside a cell)."""
    inner = row.strip().removeprefix("|").removesuffix("|")
    return [c.strip().replace("\\|", "|") for c in _PIPE.split(inner)]


def _kind(cell: str) -> str:
    return "num" if _NUMERIC.match(cell) else "text" if len(cell) > TEXT_CELL else "word"


def _table(rows: list[str]) -> str:
    head, *rest = rows
    body = [r for r in rest if not set(r.replace("|", "").strip()) <= set("-: ")]
    h = "".join(f"<th>{inline(c)}</th>" for c in _cells(head))
    b = "".join("<tr>" + "".join(f'<td class="{_kind(c)}">{inline(c)}</td>' for c in _cells(r)) + "</tr>" for r in body)
    return f'<div class="table"><table><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table></div>'


def page(md: str, pngs: Mapping[str, bytes], title: str) -> str:
    """The whole page for markdown ``md``; images named in it are taken from ``pngs``."""
    body: list[str] = []
    rows: list[str] = []
    items: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if rows:
            body.append(_table(rows))
            rows.clear()
        if items:
            body.append("<ul>" + "".join(f"<li>{inline(t)}</li>" for t in items) + "</ul>")
            items.clear()
        if para:
            body.append(f"<p>{inline(' '.join(para))}</p>")
            para.clear()

    for line in md.splitlines():
        s = line.strip()
        if s.startswith("|"):
            kind = "table"
        elif s.startswith("- "):
            kind = "item"
        elif not s:
            kind = "blank"
        elif s.startswith("#") or _IMAGE.match(s) or (s.startswith("_") and s.endswith("_") and len(s) > 2):
            kind = "block"
        else:
            kind = "text"
        if not ((kind == "table" and rows) or (kind == "item" and items) or (kind == "text" and para)):
            flush()  # anything but more of what is being gathered ends it
        if kind == "table":
            rows.append(s)
        elif kind == "item":
            items.append(s[2:])
        elif s.startswith("#"):
            level = len(s) - len(s.lstrip("#"))
            body.append(f"<h{level}>{inline(s[level:].strip())}</h{level}>")
        elif _IMAGE.match(s):
            alt, name = _IMAGE.match(s).groups()
            if name in pngs:
                data = base64.b64encode(pngs[name]).decode()
                body.append(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">')
        elif s.startswith("_") and s.endswith("_") and len(s) > 2:
            body.append(f'<p class="note">{inline(s[1:-1])}</p>')
        elif kind == "text":
            para.append(s)
    flush()
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n" + "\n".join(body)
            + "\n</body></html>\n")
