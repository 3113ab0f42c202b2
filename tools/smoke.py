#!/usr/bin/env python3
"""Browser smoke test of a built site: serve it on 127.0.0.1 and open pages in headless Chromium.

    python tools/smoke.py _build/html                     # every page of _toc.yml
    python tools/smoke.py _build/html --screenshot shot.png --shot-page book/recorded/04-bugfix-gym.html

For each page, Chromium runs the page's JavaScript (``--dump-dom`` after a virtual-time budget)
and the resulting DOM is checked: a title and an ``<h1>``; every ``<img>`` loads (HTTP 200 from
the local server, or a ``data:`` URI); every script and stylesheet is served locally (the site
must work offline); every internal ``<a href>`` points to an existing file and its ``#anchor``
exists in the target page; pages with math have MathJax output (``mjx-container``) and no
MathJax error (``mjx-merror``); and the page's text outside code, math and cell outputs shows
no unrendered MyST markup (``raw_markup``: a role such as ``{numref}`` or ``{glue:text}``, or a
directive fence such as ```` ```{note} ````), which is what a role split so that its next line
starts with ``%`` (a MyST comment) leaves behind.

Layout (issue 14): every page is also opened at window widths of 1280 and 1600 px
(``WIDTHS``) with a measuring script injected by the local server (``?agentrl-smoke``). It
reports every ``<pre>`` (code cell, output, literal block) whose content is wider than its box
(``scrollWidth > clientWidth``: the reader would have to scroll), and whether a line of
``LINE_LIMIT`` (88) characters fits in the first code-cell and output box of the page (the
line-length rule; tests/test_line_length.py enforces it on the chapters themselves). The room
comes from _static/agentrl.css. Chromium runs with --hide-scrollbars; a classic 15-px scrollbar
still leaves room for 88 characters at 1280 px (the measured capacity is 90). A page without
notebook cells (the front page, the API page, the solutions) is opened at the narrowest width
only: its only layout check is clipping, and the content column only widens with the window.
That premise is itself checked on every page with cells: its first code box may not be
narrower at a wider window.

Search: ``search(site, term)`` runs the site's own search page in Chromium and returns the
pages it lists; ``smoke(..., searches={term: page})`` checks that each term finds its page.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, urldefrag, urljoin, urlparse

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                  "--hide-scrollbars", "--mute-audio"]
WIDTHS = (1280, 1600)          # window widths (px) at which nothing may be clipped
LINE_LIMIT = 88                # characters of code/output that must fit in a box
MEASURE_QUERY = "agentrl-smoke"

# Injected before </body> of pages requested with ?agentrl-smoke. After the page has loaded,
# its fonts are ready and MathJax has typeset, it writes a JSON report into
# <script type="application/json" id="agentrl-smoke-report"> for --dump-dom to carry out.
MEASURE_JS = r"""
<script>
(function () {
  var LIMIT = %(limit)d;
  function firstLine(pre) {
    var lines = pre.textContent.split('\n');
    var longest = lines.reduce(function (a, b) { return b.length > a.length ? b : a; }, '');
    return {first: lines[0].slice(0, 70), longest: longest.length};
  }
  function probe(pre) {            // does a LIMIT-character line fit in a box like this one?
    var clone = pre.cloneNode(false);
    clone.textContent = new Array(LIMIT + 1).join('0');
    pre.parentNode.insertBefore(clone, pre.nextSibling);
    var r = {scroll: clone.scrollWidth, client: clone.clientWidth};
    var cs = getComputedStyle(clone);
    var span = document.createElement('span');
    span.textContent = '0000000000';
    clone.textContent = '';
    clone.appendChild(span);
    var ch = span.getBoundingClientRect().width / 10;
    r.capacity = Math.floor((clone.clientWidth - parseFloat(cs.paddingLeft) -
                             parseFloat(cs.paddingRight)) / ch);
    r.font = cs.fontSize;
    clone.remove();
    return r;
  }
  function measure() {
    var out = {width: window.innerWidth, pres: 0, clipped: [], probes: {}};
    document.querySelectorAll('pre').forEach(function (pre, i) {
      if (!pre.clientWidth) return;                    // hidden
      out.pres += 1;
      if (pre.scrollWidth > pre.clientWidth) {
        var info = firstLine(pre);
        info.index = i; info.scroll = pre.scrollWidth; info.client = pre.clientWidth;
        var cell = pre.closest('.cell');
        info.where = cell ? (pre.closest('.cell_output') ? 'output' : 'code') : 'block';
        out.clipped.push(info);
      }
    });
    var code = document.querySelector('.cell .cell_input pre');
    var output = document.querySelector('.cell .cell_output pre');
    if (code) out.probes.code = probe(code);
    if (output) out.probes.output = probe(output);
    var s = document.createElement('script');
    s.type = 'application/json'; s.id = 'agentrl-smoke-report';
    s.textContent = JSON.stringify(out).replace(/</g, '\\u003c');
    document.body.appendChild(s);
  }
  window.addEventListener('load', function () {
    var ready = [document.fonts ? document.fonts.ready : null];
    if (window.MathJax && MathJax.startup && MathJax.startup.promise)
      ready.push(MathJax.startup.promise);
    Promise.all(ready).then(function () { setTimeout(measure, 200); });
  });
})();
</script>
""" % {"limit": LINE_LIMIT}


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


RAW_ROLE = re.compile(r"\{(?:numref|ref|eq|doc|term|download|abbr|math"
                      r"|glue(?::[a-z]+)?|cite(?::[a-z]+)?)\}`?")
RAW_FENCE = re.compile(r"(?:`{3,}|:{3,})\s*\{[\w-]+\}")
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
         "track", "wbr"}
_SKIP_TAGS = {"pre", "code", "script", "style", "mjx-container", "math", "textarea"}
_SKIP_CLASSES = {"math", "cell_output", "output", "highlight", "literal"}


class _ProseText(HTMLParser):
    """The text a reader sees outside code, math and cell outputs (for raw_markup)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[bool] = []      # per open element: is it (inside) a skipped element
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in _VOID:
            return
        classes = set((dict(attrs).get("class") or "").split())
        skip = tag in _SKIP_TAGS or bool(classes & _SKIP_CLASSES)
        self.stack.append(skip or (bool(self.stack) and self.stack[-1]))

    def handle_endtag(self, tag):
        if tag not in _VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data):
        if not (self.stack and self.stack[-1]):
            self.text.append(data)


def raw_markup(html: str) -> list[str]:
    """Unrendered MyST roles and directive fences in a page's prose -> short excerpts."""
    p = _ProseText()
    p.feed(html)
    text = " ".join(" ".join(p.text).split())
    found = []
    for m in list(RAW_ROLE.finditer(text)) + list(RAW_FENCE.finditer(text)):
        found.append(text[max(0, m.start() - 30):m.end() + 30])
    return found


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

    def send_head(self):
        """Files as they are, except that ``page.html?agentrl-smoke`` gets MEASURE_JS."""
        path = self.translate_path(self.path)
        if MEASURE_QUERY not in urlparse(self.path).query or not path.endswith(".html") \
                or not os.path.isfile(path):
            return super().send_head()
        text = Path(path).read_text(encoding="utf-8")
        data = text.replace("</body>", MEASURE_JS + "</body>", 1).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return io.BytesIO(data)


def chromium(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="agentrl-chromium-") as profile:
        cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def dump_dom(url: str, budget_ms: int = 10000, width: int | None = None) -> str:
    size = [f"--window-size={width},1000"] if width else []
    r = chromium([*size, f"--virtual-time-budget={budget_ms}", "--dump-dom", url])
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


def measured(dom_html: str) -> dict | None:
    """The report MEASURE_JS left in a dumped DOM (None: the script did not run)."""
    m = re.search(r'<script type="application/json" id="agentrl-smoke-report">(.*?)</script>',
                  dom_html, re.S)
    return json.loads(m.group(1)) if m else None


def layout_problems(report: dict | None, width: int) -> list[str]:
    """Clipped <pre> boxes and a too-narrow code/output box, from one MEASURE_JS report."""
    if report is None:
        return [f"at {width} px: the layout measurement did not run"]
    problems = []
    if report["width"] != width:
        problems.append(f"at {width} px: the window was {report['width']} px wide")
    for c in report["clipped"]:
        problems.append(f"at {width} px: {c['where']} <pre> #{c['index']} clipped "
                        f"({c['scroll']} px of content in a {c['client']} px box; longest line "
                        f"{c['longest']} chars): {c['first']!r}")
    for kind, p in sorted(report["probes"].items()):
        if p["scroll"] > p["client"]:
            problems.append(f"at {width} px: a {LINE_LIMIT}-character line does not fit in a "
                            f"{kind} box ({p['client']} px holds {p['capacity']} characters "
                            f"at {p['font']})")
    return problems


def search(server_url: str, term: str) -> list[str]:
    """Pages (site-relative, without query) that the site's search page lists for a term."""
    dom = dump_dom(urljoin(server_url, "search.html?q=" + quote(term)))
    m = re.search(r'<ul class="search">(.*?)</ul>', dom, re.S)
    if not m:
        raise RuntimeError(f"the search page produced no result list for {term!r}")
    hrefs = re.findall(r'<a href="([^"]*)"', m.group(1))
    return list(dict.fromkeys(urlparse(h).path for h in hrefs))


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


def check_page(server_url: str, html_dir: Path, page: str, _id_cache: dict | None = None,
               widths: tuple[int, ...] = WIDTHS) -> tuple[list[str], _Page]:
    """Problems found on one page (empty list: fine) and its parsed DOM.

    The page is loaded once per window width with MEASURE_JS; the first load also gives the DOM
    whose links, images, assets and math are checked.
    """
    ids = _id_cache if _id_cache is not None else {}
    url = urljoin(server_url, page)
    problems: list[str] = []
    dom = None
    code_box = {}                                   # width -> client width of the code box
    for width in widths:
        raw = dump_dom(url + "?" + MEASURE_QUERY, width=width)
        report = measured(raw)
        problems += layout_problems(report, width)
        if report and "code" in report["probes"]:
            code_box[width] = report["probes"]["code"]["client"]
        if dom is None:
            dom = parse(raw)
    boxes = [code_box[w] for w in sorted(code_box)]
    if any(b < a for a, b in zip(boxes, boxes[1:])):
        problems.append(f"the code box is narrower at a wider window ({code_box}): pages "
                        f"without cells must then be checked at every width")
    if dom is None:
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
    for excerpt in raw_markup((html_dir / page).read_text(encoding="utf-8")):
        problems.append(f"raw MyST markup in the text: ...{excerpt}...")
    if static.math and dom.mjx == 0:
        problems.append(f"{static.math} math elements but MathJax typeset none")
    if dom.mjx_errors:
        problems.append(f"{dom.mjx_errors} MathJax errors (mjx-merror)")
    return problems, dom


def has_cells(html_file: Path) -> bool:
    """Whether a built page holds notebook cells (myst-nb's ``cell`` containers)."""
    return 'class="cell ' in html_file.read_text(encoding="utf-8")


def page_widths(html_file: Path, widths: tuple[int, ...] = WIDTHS) -> tuple[int, ...]:
    """The window widths to open a page at: all of them for a page with notebook cells, the
    narrowest for one without (clipping is its only layout check, and the content column
    widens with the window; check_page tests that premise on the pages with cells)."""
    return tuple(widths) if has_cells(html_file) else (min(widths),)


def smoke(html_dir: Path, pages: list[str], screenshot_page: str | None = None,
          screenshot_out: Path | None = None, searches: dict[str, str] | None = None,
          widths: tuple[int, ...] = WIDTHS, workers: int = 2) -> dict[str, list[str]]:
    """Problems per page (an empty list: fine). ``searches`` maps a term to the page that the
    site's search must list for it; its problems are reported under ``search.html``.

    Pages and searches are checked ``workers`` at a time, each in its own Chromium process (its
    own profile folder), so a second CPU shortens the run; the report keeps the pages' order."""
    html_dir = Path(html_dir).resolve()
    with Server(html_dir) as srv, ThreadPoolExecutor(max(1, workers)) as pool:
        cache: dict = {}

        def one(page: str) -> list[str]:
            if not (html_dir / page).is_file():
                return ["page was not built"]
            return check_page(srv.url, html_dir, page, cache,
                              page_widths(html_dir / page, widths))[0]

        report: dict[str, list[str]] = dict(zip(pages, pool.map(one, pages)))
        if searches:
            terms = list(searches)
            hits = dict(zip(terms, pool.map(lambda term: search(srv.url, term), terms)))
            report["search.html"] = [
                f"search for {term!r} does not list {searches[term]} (it lists {hits[term]})"
                for term in terms if searches[term] not in hits[term]]
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
    ap.add_argument("--search", nargs=2, action="append", metavar=("TERM", "PAGE"), default=[],
                    help="check that the site's search lists PAGE for TERM (repeatable)")
    ap.add_argument("--pages", nargs="+", help="pages to check (default: every toc page)")
    args = ap.parse_args(argv)
    pages = args.pages or toc_pages(args.root)
    report = smoke(args.html_dir, pages, args.shot_page or pages[-1], args.screenshot,
                   searches=dict(args.search))
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
