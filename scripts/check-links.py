#!/usr/bin/env python3
"""Checks the relative links of markdown files: every `[text](path)` and
`[text](path#anchor)` that is not a URL must name a file or folder that
exists, and an anchor must match a heading of the target (GitHub's slugs).
Usage: python3 scripts/check-links.py [FILE.md ...] (default: README.md).
Exits non-zero and lists the broken links if any."""
import os
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


def check(md):
    bad = []
    with open(md, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    base = os.path.dirname(md)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(base, path)) if path else md
        if not os.path.exists(full):
            bad.append(f"{md}: {target} (no such file)")
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            bad.append(f"{md}: {target} (no heading #{anchor})")
    return bad


def main():
    files = sys.argv[1:] or ["README.md"]
    bad = [b for md in files for b in check(md)]
    for b in bad:
        print(b)
    print(f"{len(files)} file(s), {len(bad)} broken link(s)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
