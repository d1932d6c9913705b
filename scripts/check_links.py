#!/usr/bin/env python3
"""Offline link check of the documentation.

Usage: scripts/check_links.py BOOK_HTML_DIR [MARKDOWN_FILE ...]

- In the built mdBook (BOOK_HTML_DIR, e.g. target/book), every relative href
  and src of every page must name a file that exists, and every #fragment an
  id in that file (or in the page itself).
- In each Markdown file given (README.md, CONTRIBUTING.md, ...), every
  relative link must name a file or directory that exists, and a #fragment
  into a Markdown file must name one of its headings (GitHub's anchors).

External links (with a scheme, or mailto:) are not fetched: the check is
offline. Exits 1 listing every broken link, 0 when there is none.
"""
import html.parser
import os
import re
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()
        self.links = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) is not None:
                self.links.append(a[key])


def external(link):
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", link)) or link.startswith("//")


def parse(path, cache={}):
    if path not in cache:
        p = Page()
        with open(path, encoding="utf-8") as f:
            p.feed(f.read())
        cache[path] = p
    return cache[path]


def check_book(root):
    broken = []
    pages = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".html"):
                continue
            pages += 1
            path = os.path.join(dirpath, name)
            page = parse(path)
            for link in page.links:
                if external(link) or link in ("", "#"):
                    continue
                target, _, frag = link.partition("#")
                target = urllib.parse.unquote(target.split("?")[0])
                if target.startswith("/"):
                    # Root-absolute (mdBook's 404 page): from the book's root.
                    dest = os.path.normpath(os.path.join(root, target.lstrip("/")))
                else:
                    dest = os.path.normpath(os.path.join(dirpath, target)) if target else path
                if os.path.isdir(dest):
                    dest = os.path.join(dest, "index.html")
                if not os.path.exists(dest):
                    broken.append(f"{os.path.relpath(path, root)}: {link}: no such file")
                    continue
                if frag and dest.endswith(".html") and urllib.parse.unquote(frag) not in parse(dest).ids:
                    broken.append(f"{os.path.relpath(path, root)}: {link}: no anchor #{frag}")
    if pages == 0:
        broken.append(f"{root}: no HTML page (was the book built?)")
    return broken


def github_slug(heading):
    """GitHub's anchor for a heading: lower case, link targets dropped,
    punctuation but '-' and '_' dropped, spaces to '-'."""
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def md_anchors(path):
    anchors, seen = set(), {}
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            if in_code:
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                slug = github_slug(m.group(1))
                n = seen.get(slug, 0)
                seen[slug] = n + 1
                anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def check_markdown(path):
    broken = []
    base = os.path.dirname(path)
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for link in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        if external(link):
            continue
        target, _, frag = link.partition("#")
        dest = os.path.normpath(os.path.join(base, urllib.parse.unquote(target))) if target else path
        if not os.path.exists(dest):
            broken.append(f"{path}: {link}: no such file")
        elif frag and dest.endswith(".md") and frag not in md_anchors(dest):
            broken.append(f"{path}: {link}: no heading #{frag}")
    return broken


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    broken = check_book(argv[1])
    for md in argv[2:]:
        broken += check_markdown(md)
    for b in broken:
        print(f"broken link: {b}")
    print(f"check_links: {len(broken)} broken link(s)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
