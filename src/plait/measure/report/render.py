"""Render report sections as one self-contained HTML page (inline style; PNGs referenced by
name, next to the page) or as Markdown; ``with_relative_paths`` writes the input files' paths
relative to the report's directory, so that the report reads the same wherever it is moved with them."""

from __future__ import annotations

import dataclasses
import html
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1em;font-size:0.85em}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f2f2f2}td.text,th.text{text-align:left}
img{max-width:100%;border:1px solid #eee}.note{color:#666;font-size:0.9em}"""


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    text_columns: tuple[int, ...] = (0,)  # left-aligned columns


@dataclass(frozen=True)
class Section:
    title: str
    paragraphs: list[str]
    table: Table | None = None
    image: Path | None = None
    missing: str = ""  # why there is no image/table, said instead of drawing an empty one
    notes: list[str] = field(default_factory=list)


def path_forms(paths, directory: Path) -> dict[str, str]:
    """{a way the report's text may write one of ``paths`` (as given, absolute, resolved): that path
    relative to ``directory``}; forms without a directory part (a bare file name) are left alone."""
    forms: dict[str, str] = {}
    base = Path(directory).resolve()
    for path in paths:
        if not path:
            continue
        relative = os.path.relpath(Path(path).resolve(), base)
        for form in (str(path), str(Path(path).absolute()), str(Path(path).resolve())):
            if os.sep in form and form != relative:
                forms[form] = relative
    return forms


def with_relative_paths(title: str, sections: list[Section], paths, directory: Path
                        ) -> tuple[str, list[Section]]:
    """``title`` and ``sections`` with each of ``paths`` written relative to ``directory`` (the report's)."""
    forms = path_forms(paths, directory)
    # one pass, the longest form first (/a/b/c.csv before b/c.csv): a replacement is never replaced again
    pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))) if forms else None

    def fix(text: str) -> str:
        return pattern.sub(lambda m: forms[m.group(0)], text) if pattern and text else text

    def fix_section(s: Section) -> Section:
        table = s.table if s.table is None else dataclasses.replace(
            s.table, rows=tuple(tuple(fix(c) for c in row) for row in s.table.rows))
        return dataclasses.replace(s, title=fix(s.title), paragraphs=[fix(p) for p in s.paragraphs], table=table,
                                   missing=fix(s.missing), notes=[fix(n) for n in s.notes])

    return fix(title), [fix_section(s) for s in sections]


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def render_html(title: str, sections: list[Section]) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>", f'<p class="note">written {_stamp()} by plait report</p>']
    for section in sections:
        out.append(f"<h2>{html.escape(section.title)}</h2>")
        out += [f"<p>{html.escape(p)}</p>" for p in section.paragraphs]
        if section.table is not None:
            out.append(_html_table(section.table))
        if section.image is not None:
            out.append(f'<img src="{html.escape(section.image.name)}" alt="{html.escape(section.title)}">')
        if section.missing:
            out.append(f'<p class="note">{html.escape(section.missing)}</p>')
        out += [f'<p class="note">{html.escape(n)}</p>' for n in section.notes]
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _html_table(table: Table) -> str:
    def cell(tag: str, index: int, text: str) -> str:
        cls = ' class="text"' if index in table.text_columns else ""
        return f"<{tag}{cls}>{html.escape(text)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(table.header))
    body = "".join("<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in table.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(title: str, sections: list[Section]) -> str:
    out = [f"# {title}", "", f"_written {_stamp()} by plait report_", ""]
    for section in sections:
        out += [f"## {section.title}", ""]
        for paragraph in section.paragraphs:
            out += [paragraph, ""]
        if section.table is not None:
            t = section.table
            out.append("| " + " | ".join(_md_cell(h) for h in t.header) + " |")
            out.append("|" + "|".join(":---" if i in t.text_columns else "---:" for i in range(len(t.header))) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
            out.append("")
        if section.image is not None:
            out += [f"![{section.title}]({section.image.name})", ""]
        if section.missing:
            out += [f"_{section.missing}_", ""]
        for note in section.notes:
            out += [f"_{note}_", ""]
    return "\n".join(out)
