"""Checks the built docs (docs/book): every relative link of every page resolves to a file, and every #anchor to an
element with that id in its page. Links to the web are not followed (the docs are checked offline). Exits 1 and names
each broken link, with the page it is on."""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name == "href" and value and tag == "a":
                self.links.append(value)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def main(book: Path) -> int:
    pages = {p.resolve(): parse(p) for p in book.rglob("*.html")}
    if not pages:
        print(f"no pages in {book}: build the docs first (mdbook build docs)")
        return 1
    broken = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("mailto:"):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if not target.exists():
                broken.append(f"{path.relative_to(book.resolve())}: {link}: no such file")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{path.relative_to(book.resolve())}: {link}: no such anchor")
    for line in sorted(set(broken)):
        print(line)
    print(f"{len(pages)} pages, {sum(len(p.links) for p in pages.values())} links, {len(set(broken))} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/book")))
