#!/usr/bin/env python3
"""Browser smoke test of a built site: serve it on 127.0.0.1 and open pages in headless Chromium.

    python tools/smoke.py _build/html                     # every page of _toc.yml
    python tools/smoke.py _build/html --screenshot shot.png --shot-page book/recorded/04-bugfix-gym.html

For each page, Chromium runs the page's JavaScript (``--dump-dom`` after a virtual-time budget)
and the resulting DOM is checked: a title and an ``<h1>``; every ``<img>`` loads (HTTP 200 from
the local server, or a ``data:`` URI); every script and stylesheet is served locally (the site
must work offline); every internal ``<a href>`` points to an existing file and its ``#anchor``
exists in the target page; pages with math have MathJax output (``mjx-container``) and no
MathJax error (``mjx-merror``).
"""
from __future__ import annotations

import argparse
import functools
import http.server
import os
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                  "--hide-scrollbars", "--mute-audio"]


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.title, self._in_title = "", False
        self.ids: set[str] = set()
        self.imgs: list[str] = []
        self.links: list[str] = []
        self.assets: list[str] = []
        self.h1 = 0
        self.math = 0
        self.mjx = 0
        self.mjx_errors = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        if tag == "title":
            self._in_title = True
        elif tag == "h1":
            self.h1 += 1
        elif tag == "img" and a.get("src") is not None:
            self.imgs.append(a["src"])
        elif tag == "a" and a.get("href") is not None:
            self.links.append(a["href"])
        elif tag == "script" and a.get("src"):
            self.assets.append(a["src"])
        elif tag == "link" and a.get("rel") in ("stylesheet", "preload") and a.get("href"):
            self.assets.append(a["href"])
        elif tag == "mjx-container":
            self.mjx += 1
        elif tag == "mjx-merror":
            self.mjx_errors += 1
        classes = (a.get("class") or "").split()
        if "math" in classes and tag in ("span", "div"):
            self.math += 1

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data


def parse(html: str) -> _Page:
    p = _Page()
    p.feed(html)
    return p


class Server:
    """``python -m http.server`` for a directory, in a thread, on a free port of 127.0.0.1."""

    def __init__(self, directory: Path):
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError)):
            return                      # the browser closed a connection early: harmless
        super().handle_error(request, client_address)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def chromium(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="agentrl-chromium-") as profile:
        cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def dump_dom(url: str, budget_ms: int = 10000) -> str:
    r = chromium([f"--virtual-time-budget={budget_ms}", "--dump-dom", url])
    if r.returncode != 0 or "<html" not in r.stdout:
        raise RuntimeError(f"chromium could not load {url}: rc={r.returncode}\n{r.stderr[-2000:]}")
    return r.stdout


def screenshot(url: str, out: Path, size: str = "1280,2000", budget_ms: int = 10000) -> Path:
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    r = chromium([f"--virtual-time-budget={budget_ms}", f"--window-size={size}",
                  f"--screenshot={out}", url])
    if r.returncode != 0 or not out.exists():
        raise RuntimeError(f"chromium screenshot of {url} failed: {r.stderr[-2000:]}")
    return out


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def toc_pages(root: Path) -> list[str]:
    """Site-relative HTML paths of the root page and every toc entry."""
    import yaml
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for key in ("parts", "chapters", "sections"):
                for child in node.get(key) or []:
                    walk(child)
    walk(toc)
    return [f.rsplit(".", 1)[0] + ".html" if f.endswith((".md", ".ipynb")) else f + ".html"
            for f in files]


def check_page(server_url: str, html_dir: Path, page: str,
               _id_cache: dict | None = None) -> tuple[list[str], _Page]:
    """Problems found on one page (empty list: fine) and its parsed DOM."""
    ids = _id_cache if _id_cache is not None else {}
    url = urljoin(server_url, page)
    problems: list[str] = []
    dom = parse(dump_dom(url))
    static = parse((html_dir / page).read_text(encoding="utf-8"))
    if not dom.title.strip():
        problems.append("no <title>")
    if dom.h1 == 0:
        problems.append("no <h1>")
    for src in dom.imgs:
        if src.startswith("data:"):
            continue
        target = urljoin(url, src)
        if not target.startswith(server_url):
            problems.append(f"image from another host: {src}")
        elif http_status(target) != 200:
            problems.append(f"image does not load: {src}")
    for src in dom.assets:
        target = urljoin(url, src)
        if not target.startswith(server_url):
            problems.append(f"script/stylesheet from another host (site must work offline): {src}")
        elif http_status(target) != 200:
            problems.append(f"script/stylesheet does not load: {src}")
    for href in dom.links:
        if href.startswith(("mailto:", "javascript:")) or href in ("", "#"):
            continue
        target = urljoin(url, href)
        if not target.startswith(server_url):
            continue                                   # external link: not checked offline
        base, frag = urldefrag(target)
        rel = urlparse(base).path.lstrip("/")
        path = html_dir / rel
        if path.is_dir():
            path = path / "index.html"
        if not path.is_file():
            problems.append(f"broken link: {href}")
            continue
        if frag and path.suffix == ".html":
            if path == html_dir / page:
                known = dom.ids | static.ids
            else:
                if path not in ids:
                    ids[path] = parse(path.read_text(encoding="utf-8")).ids
                known = ids[path]
            if frag not in known:
                problems.append(f"broken anchor: {href}")
    if static.math and dom.mjx == 0:
        problems.append(f"{static.math} math elements but MathJax typeset none")
    if dom.mjx_errors:
        problems.append(f"{dom.mjx_errors} MathJax errors (mjx-merror)")
    return problems, dom


def smoke(html_dir: Path, pages: list[str], screenshot_page: str | None = None,
          screenshot_out: Path | None = None) -> dict[str, list[str]]:
    html_dir = Path(html_dir).resolve()
    report: dict[str, list[str]] = {}
    with Server(html_dir) as srv:
        cache: dict = {}
        for page in pages:
            if not (html_dir / page).is_file():
                report[page] = ["page was not built"]
                continue
            report[page], _ = check_page(srv.url, html_dir, page, cache)
        if screenshot_page and screenshot_out:
            screenshot(urljoin(srv.url, screenshot_page), screenshot_out)
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Headless-Chromium smoke test of the built site")
    ap.add_argument("html_dir", type=Path, nargs="?", default=Path("_build/html"))
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="book root whose _toc.yml lists the pages")
    ap.add_argument("--screenshot", type=Path)
    ap.add_argument("--shot-page", help="page to screenshot (default: the last toc page)")
    args = ap.parse_args(argv)
    pages = toc_pages(args.root)
    report = smoke(args.html_dir, pages, args.shot_page or pages[-1], args.screenshot)
    bad = 0
    for page, problems in report.items():
        print(f"smoke: {page}: {'ok' if not problems else 'FAIL'}")
        for p in problems:
            print(f"    {p}")
        bad += bool(problems)
    print(f"smoke: {len(report) - bad} pages ok, {bad} failing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
