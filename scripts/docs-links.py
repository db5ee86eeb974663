#!/usr/bin/env python3
"""Checks the links of the manual (docs/src, an mdBook) and of README.md.

Every relative link and image (markdown `[text](target)`, `![alt](target)`, reference definitions
`[id]: target`, and `href`/`src` of raw HTML) must name a file that exists, and every `#anchor` a
heading of the page it points into, with the ids mdBook gives headings (mdbook-html's
`id_from_content` and `unique_id`: the heading's text, trimmed and lowercased, keeping alphanumerics,
`_` and `-`, whitespace turned into `-`, everything else dropped; a repeated id gets `-1`, `-2`, ...;
`{#id}` sets one). A link from docs/src must stay inside docs/src, since the book holds nothing
else, and every page of docs/src must be in SUMMARY.md. Links inside code are not links; links with
a scheme (https:, mailto:) are not checked.

When the built book is there (docs/book, from `mdbook build docs`), the ids computed here are also
looked up in the built pages, so that a difference from mdBook's own rules fails here too.

    scripts/docs-links.py        check; exit status 1 and one line per broken link if any
"""

import html.parser
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BOOK_SRC = ROOT / "docs" / "src"
BOOK_OUT = ROOT / "docs" / "book"

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ID = re.compile(r"\s*\{#([^}\s]+)[^}]*\}\s*$")
# [text](target "title") and ![alt](target); the text may hold code spans and brackets one deep.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ATTR = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']*)["']""")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield number, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):].strip():
            fence = None


def without_code_spans(line):
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def heading_text(markdown):
    """The text a heading renders to: code spans as their content, links as their text, no
    emphasis markers or HTML tags."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), markdown)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)
    for entity, char in (("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&#39;", "'")):
        text = text.replace(entity, char)
    return text


def id_from_content(text):
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "_-":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def heading_ids(path):
    """The ids of a page's headings, as mdBook makes them."""
    used = set()
    ids = []
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        content = m.group(2)
        explicit = EXPLICIT_ID.search(content)
        if explicit:
            ident = explicit.group(1)
        else:
            ident = id_from_content(heading_text(content))
            base, counter = ident, 1
            while ident in used:
                ident = f"{base}-{counter}"
                counter += 1
        used.add(ident)
        ids.append(ident)
    return ids


class IdCollector(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)


def built_ids(page):
    """The ids in the built HTML of a docs/src page, or None when the book is not built."""
    built = BOOK_OUT / page.relative_to(BOOK_SRC).with_suffix(".html")
    if not built.is_file():
        return None
    collector = IdCollector()
    collector.feed(built.read_text(encoding="utf-8"))
    return collector.ids


def links(path):
    """(line number, target) of every link and image of a markdown file, outside code."""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        line = without_code_spans(line)
        m = REF_DEF.match(line)
        if m:
            yield number, m.group(1)
        for m in INLINE_LINK.finditer(line):
            yield number, m.group(1)
        for m in HTML_ATTR.finditer(line):
            yield number, m.group(1)


def main():
    pages = sorted(BOOK_SRC.rglob("*.md"))
    files = [ROOT / "README.md"] + pages
    problems = []
    ids_of = {}
    checked = 0

    def ids(target):
        if target not in ids_of:
            ids_of[target] = set(heading_ids(target))
        return ids_of[target]

    for source in files:
        in_book = BOOK_SRC in source.parents
        for number, target in links(source):
            where = f"{source.relative_to(ROOT)}:{number}"
            if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                continue
            checked += 1
            path_part, _, anchor = target.partition("#")
            resolved = source if not path_part else (source.parent / path_part).resolve()
            if in_book and BOOK_SRC not in resolved.parents and resolved != BOOK_SRC:
                problems.append(f"{where}: {target} leaves docs/src, which is all the book holds")
                continue
            if not resolved.exists():
                problems.append(f"{where}: {target}: no such file")
                continue
            if anchor:
                if resolved.suffix != ".md":
                    problems.append(f"{where}: {target}: an anchor into a file that is not a page")
                elif anchor not in ids(resolved):
                    known = ", ".join(sorted(ids(resolved))) or "none"
                    problems.append(f"{where}: {target}: no heading with that id (the page has: {known})")

    summary = (BOOK_SRC / "SUMMARY.md").read_text(encoding="utf-8")
    listed = {(BOOK_SRC / t).resolve() for _, t in ((n, t) for n, t in links(BOOK_SRC / "SUMMARY.md"))}
    for page in pages:
        if page.name != "SUMMARY.md" and page.resolve() not in listed:
            problems.append(f"{page.relative_to(ROOT)}: not in docs/src/SUMMARY.md, so not in the book")
    if not summary.strip():
        problems.append("docs/src/SUMMARY.md is empty")

    compared = 0
    for page in pages:
        if page.name == "SUMMARY.md":
            continue
        built = built_ids(page)
        if built is None:
            continue
        compared += 1
        for ident in heading_ids(page):
            if ident not in built:
                problems.append(
                    f"{page.relative_to(ROOT)}: heading id {ident!r} computed here is not in the built "
                    f"page (mdBook's rules differ from this script's)"
                )

    for problem in problems:
        print(problem, file=sys.stderr)
    print(
        f"docs-links: {checked} relative links in {len(files)} files, "
        f"heading ids compared with {compared} built pages: {len(problems)} problems"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
