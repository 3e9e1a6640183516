"""Tests of the notebook display: `tree_html` (`_repr_html_`), treescope, and both in a
real browser.

The browser tests start headless Chromium (Debian's `chromium` package) when it is
installed and skip with a message when it is not. They speak the DevTools protocol over
`--remote-debugging-pipe` (NUL-separated JSON on file descriptors 3 and 4), so they need
no websocket client and no extra package.

`python tests/test_pprint_html.py docs/assets` writes the screenshots the Notebooks page
shows (the HTML display and treescope, of the page's model).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import os
import pathlib
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import pytest

import treeclass as tc
from treeclass._pprint_html import html_display, tree_html, treescope_repr

# -- models ---------------------------------------------------------------------------------


class Linear(tc.TreeClass):
    weight: jax.Array
    bias: jax.Array
    name: str = tc.field(default="linear", static=True)
    cache: int = tc.field(default=0, repr=False)


class Shown(Linear):
    """What TreeClass itself will do: `_repr_html_` seen by instances only."""

    _repr_html_ = html_display


class Stack(tc.TreeClass):
    _repr_html_ = html_display

    def __init__(self, count, size=8):
        self.layers = tuple(
            Shown(jnp.full((size, size), i / 10), jnp.zeros(size), name=f"layer{i}")
            for i in range(count)
        )
        self.activation = tc.freeze(jax.nn.relu)


# -- tree_html ------------------------------------------------------------------------------


def test_html_opens_a_small_model_whole():
    page = ET.fromstring(tree_html(Stack(2)))
    assert all(d.get("open") == "open" for d in page.iter("details"))


def test_html_opens_a_big_model_folded_below_a_depth():
    page = ET.fromstring(tree_html(Stack(40), repeats=None))
    details = list(page.iter("details"))  # 40 layers would not fit in the first view
    assert details[0].get("open") == "open"
    assert all(d.get("open") is None for d in details[1:])


def test_html_folds_a_long_run_into_a_closed_node_that_holds_it():
    page = ET.fromstring(tree_html(Stack(1000), open_levels=10))
    runs = [d for d in page.iter("details") if "more" in "".join(d.find("summary").itertext())]
    assert len(runs) == 1 and runs[0].get("open") is None
    label = "".join(runs[0].find("summary").itertext())
    assert label == "[3]…[996]: 994 more Shown(weight=f32[8,8], bias=f32[8], name=str)"
    inside = runs[0].find("div").findall("details")
    assert len(inside) == 994
    assert "".join(inside[0].find("summary").itertext()) == "[3]:Shown"
    assert tree_html(Stack(1000), repeats=None).count("more") == 0


def test_html_needs_no_network_no_script_and_no_fixed_text_colour():
    page = tree_html(Stack(20))
    for banned in ("<script", "<link", "<style", "http:", "https:", "url(", "<img"):
        assert banned not in page
    assert "color: inherit" in page
    assert "rgba(128, 128, 128" in page  # lines in translucent grey: light and dark themes


def test_html_escapes_untrusted_keys_and_values():
    page = tree_html({"<img src=x onerror=alert(1)>": "</div><script>alert(2)</script>"})
    assert "<img" not in page and "<script" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    ET.fromstring(page)


def test_html_display_is_a_method_of_instances_only():
    layer = Shown(jnp.ones(2), jnp.zeros(2))
    assert layer._repr_html_() == tree_html(layer)
    assert not callable(Shown._repr_html_)


# -- treescope ------------------------------------------------------------------------------

try:
    import treescope
except ImportError:  # an optional extra: the HTML tests above still run
    treescope = None

needs_treescope = pytest.mark.skipif(treescope is None, reason="treescope is not installed")


def _expanded(value):
    with treescope.using_expansion_strategy(target_width=0, max_height=None):
        return treescope.render_to_text(value)


@needs_treescope
def test_treescope_shows_no_stray_boxes_for_treeclasses_and_frozen_values():
    text = treescope.render_to_text(Stack(2))
    assert "Rich HTML representation" not in text
    assert "PyTree children" not in text and "_Frozen object" not in text
    assert "activation=#relu(x)" in text


@needs_treescope
def test_plain_treeclass_in_treescope_has_no_rich_html_box():
    assert "Rich HTML representation" not in treescope.render_to_text(
        Linear(jnp.ones(2), jnp.ones(2))
    )


@needs_treescope
def test_treescope_frozen_values_keep_the_value_rendering_with_a_marker():
    text = _expanded({"a": tc.freeze(jnp.ones(3)), "f": tc.freeze({"k": 1}), "n": tc.freeze(2)})
    assert "'a': #<jax.Array" in text and "'n': #2" in text
    assert "'f': #{\n" in text  # a frozen subtree folds like the subtree
    assert treescope.render_to_text(tc.freeze(2), roundtrip_mode=True) == "freeze(2)"


@needs_treescope
def test_treescope_marks_static_fields_and_hides_repr_false_ones():
    text = _expanded(Shown(jnp.ones(2), jnp.zeros(2), name="dense", cache=3))
    assert "name='dense',  # static" in text
    assert "cache" not in text
    assert "weight=<jax.Array([1., 1.], dtype=float32)>" in text  # treescope's own array


@needs_treescope
def test_treescope_array_visualization_reaches_fields_and_frozen_arrays():
    x = jnp.arange(64.0).reshape(8, 8)
    with treescope.active_autovisualizer.set_scoped(treescope.ArrayAutovisualizer()):
        assert "<Arrayviz rendering>" in treescope.render_to_text(Shown(x, x[0]))
        assert "<Arrayviz rendering>" in treescope.render_to_text(tc.freeze(x))


@needs_treescope
def test_treescope_folds_long_runs_like_repr():
    text = treescope.render_to_text(Stack(1000))
    assert "… 994 more Shown(weight=f32[8,8], bias=f32[8], name=str) …," in text
    assert text.count("Shown(") == 7


@needs_treescope
def test_treescope_children_carry_their_key_paths():
    from treescope import rendering_parts

    paths = []

    def renderer(value, path=None):
        paths.append(path)
        return rendering_parts.text(repr(value))

    treescope_repr(Stack(9), "model", renderer)
    assert "model.layers[0]" in paths and "model.layers[8]" in paths
    assert "model.layers[4]" not in paths  # folded, so never rendered
    assert "model.activation" in paths


def test_printing_never_imports_treescope():
    code = (
        "import sys, jax.numpy as jnp, treeclass as tc\n"
        "from treeclass._pprint_html import tree_html\n"
        "x = {'a': tc.freeze(jnp.ones(2)), 'b': [1]}\n"
        "repr(x['a']); tc.tree_repr(x); tree_html(x); tc.tree_summary(x)\n"
        "print('treescope' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "False", result.stderr


# -- in a real browser ------------------------------------------------------------------------

_TRAMPOLINE = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)


def _high_fd(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe."""

    def __init__(self, binary: str, timeout: float = 60):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="treeclass-chromium-")
        child_in, self._send_fd = os.pipe()
        self._recv_fd, child_out = os.pipe()
        # move the child's ends above 4, so that putting them on 3 and 4 cannot clobber one
        child_in, child_out = (_high_fd(fd) for fd in (child_in, child_out))
        # the protocol wants the pipe on fds 3 (commands in) and 4 (replies out); a small
        # Python trampoline puts it there (no `preexec_fn`: JAX's threads make it unsafe)
        command = [
            sys.executable,
            "-c",
            _TRAMPOLINE,
            str(child_in),
            str(child_out),
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--remote-debugging-pipe",
            f"--user-data-dir={self.profile}",
            "about:blank",
        ]
        self.process = subprocess.Popen(
            command,
            pass_fds=(child_in, child_out),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(child_in)
        os.close(child_out)
        self._buffer = b""
        self._last_id = 0
        self.events: list[dict] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=True)

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            ready, _, _ = select.select([self._recv_fd], [], [], left)
            if ready:
                chunk = os.read(self._recv_fd, 1 << 16)
                if not chunk:
                    raise EOFError("Chromium closed the DevTools pipe")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: bool = False) -> dict:
        self._last_id += 1
        message = {"id": self._last_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._send_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self._last_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + self.timeout
        while True:
            event = self._message(deadline)
            if event.get("method") == method:
                return event
            self.events.append(event)

    def open(self, page: pathlib.Path) -> None:
        self.send("Page.navigate", {"url": page.as_uri()}, session=True)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> object:
        reply = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True
        )
        if "exceptionDetails" in reply:
            raise RuntimeError(reply["exceptionDetails"])
        return reply["result"].get("value")

    def click(self, selector: str) -> None:
        box = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
                session=True,
            )

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and requests that left the machine."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append(f"console.error: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                found.append(f"exception: {params.get('exceptionDetails')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"log: {params['entry'].get('text')}")
            elif method == "Network.requestWillBeSent":
                url = params["request"]["url"]
                if not url.startswith(("file:", "data:", "about:")):
                    found.append(f"network request: {url}")
        return found

    def screenshot(self, selector: str, path: pathlib.Path, width: int = 900) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )
        box = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })()"
        )
        clip = {"x": 0, "y": 0, "width": width, "height": box[1] + box[3] + 16, "scale": 1}
        shot = self.send(
            "Page.captureScreenshot",
            {"format": "png", "clip": clip, "captureBeyondViewport": True},
            session=True,
        )
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._send_fd)
        os.close(self._recv_fd)
        shutil.rmtree(self.profile, ignore_errors=True)


def _chromium_binary() -> str | None:
    return next((path for name in _BROWSERS if (path := shutil.which(name))), None)


@pytest.fixture(scope="module")
def browser():
    binary = _chromium_binary()
    if binary is None:
        pytest.skip(
            "no Chromium found (install Debian's `chromium` package to run the "
            "browser tests of the notebook display)"
        )
    chromium = Chromium(binary)
    yield chromium
    chromium.close()


def _page(body: str, directory: pathlib.Path, dark: bool = False) -> pathlib.Path:
    colours = "background: #111; color: #eee" if dark else "background: #fff; color: #111"
    path = directory / ("dark.html" if dark else "light.html")
    path.write_text(
        f'<!doctype html><html><head><meta charset="utf-8"></head>'
        f'<body style="{colours}; font-size: 14px">{body}</body></html>'
    )
    return path


def test_html_in_chromium_loads_cleanly_and_a_click_opens_a_node(browser, tmp_path):
    tree = {"model": Stack(12), "<img src=x onerror=console.error(1)>": "</div>"}
    browser.events.clear()
    browser.open(_page(tree_html(tree, open_levels=2), tmp_path))
    assert browser.problems() == []
    assert browser.evaluate("document.querySelectorAll('img, script').length") == 0
    # mark the first closed node, click its summary as a user would, and measure it
    assert (
        browser.evaluate(
            "(() => { const node = document.querySelector('details:not([open])');"
            " node.id = 'target'; return node.open; })()"
        )
        is False
    )
    height = "document.getElementById('target').getBoundingClientRect().height"
    folded = browser.evaluate(height)
    browser.click("#target > summary")
    assert browser.evaluate("document.getElementById('target').open") is True
    assert browser.evaluate(height) > 2 * folded  # its children now take up room
    browser.click("#target > summary")
    assert browser.evaluate("document.getElementById('target').open") is False
    assert browser.problems() == []


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_html_in_chromium_takes_the_text_colour_of_the_theme(browser, tmp_path, dark):
    browser.open(_page(tree_html(Stack(2)), tmp_path, dark=dark))
    colours = browser.evaluate(
        "[...document.querySelectorAll('.treeclass-tree div, .treeclass-tree summary')]"
        ".map(e => getComputedStyle(e).color)"
    )
    assert set(colours) == {"rgb(238, 238, 238)" if dark else "rgb(17, 17, 17)"}


# treescope draws its HTML with a script into shadow roots: wait (in the page, for at most
# 20 s) until the text is there, then read every text node outside <style> and <script>
_TREESCOPE_TEXT = """new Promise((resolve, reject) => {
  const text = (node) => [...node.childNodes].map(child =>
      child.nodeType === Node.TEXT_NODE ? child.data
      : ["STYLE", "SCRIPT"].includes(child.tagName) ? ""
      : text(child) + (child.shadowRoot ? text(child.shadowRoot) : "")).join("");
  const start = performance.now();
  const poll = () => {
    const shown = text(document.body);
    if (shown.trim() && !shown.includes("Loading")) resolve(shown);
    else if (performance.now() - start > 20000) reject(new Error("not drawn: " + shown));
    else requestAnimationFrame(poll);
  };
  poll();
})"""


@needs_treescope
def test_treescope_html_in_chromium_loads_without_errors(browser, tmp_path):
    browser.events.clear()
    browser.open(_page(treescope.render_to_html(Stack(12)), tmp_path))
    reply = browser.send(
        "Runtime.evaluate",
        {"expression": _TREESCOPE_TEXT, "awaitPromise": True, "returnByValue": True},
        session=True,
    )
    text = reply["result"]["value"]
    assert "Stack(" in text and "… 6 more Shown(weight=f32[8,8], bias=f32[8], name=str) …" in text
    assert "Rich HTML representation" not in text
    assert browser.problems() == []


# -- the docs' screenshots ---------------------------------------------------------------------


def _notebooks_model() -> tc.TreeClass:
    """The model of the Notebooks page, built by running the page's code."""
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import test_examples

    namespace: dict = {}
    page = test_examples.ROOT / "docs" / "guides" / "notebooks.md"
    with contextlib.redirect_stdout(io.StringIO()):
        for _info, code, _expected, _line in test_examples._blocks(page.read_text()):
            exec(code, namespace)
    return namespace["model"]


def test_the_notebooks_graph_picture_shows_the_current_labels():
    model = _notebooks_model()
    assets = pathlib.Path(__file__).parents[1] / "docs" / "assets"
    svg = ET.parse(assets / "notebook-graph.svg")
    drawn = [node.text for node in svg.iter("{http://www.w3.org/2000/svg}text")]
    labels = re.findall(r'\[label="(.*)"\];', tc.tree_graph(model, depth=2))
    assert sorted(drawn) == sorted(label.replace('\\"', '"') for label in labels)
    assert (assets / "notebook-html.png").exists() and (assets / "notebook-treescope.png").exists()


def _write_screenshots(directory: pathlib.Path) -> None:
    """The Notebooks page's pictures of its model: HTML, treescope, graphviz."""
    binary = _chromium_binary()
    if binary is None or treescope is None or shutil.which("dot") is None:
        raise SystemExit("needs Chromium, treescope and graphviz's dot")
    model = _notebooks_model()
    graph = subprocess.run(
        ["dot", "-Tsvg", "-Grankdir=LR"],
        input=tc.tree_graph(model, depth=2),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (directory / "notebook-graph.svg").write_text(graph)
    chromium = Chromium(binary)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            chromium.open(_page(tree_html(model), pathlib.Path(scratch)))
            chromium.screenshot(".treeclass-tree", directory / "notebook-html.png", width=640)
            chromium.open(_page(treescope.render_to_html(model), pathlib.Path(scratch)))
            chromium.send(
                "Runtime.evaluate",
                {"expression": _TREESCOPE_TEXT, "awaitPromise": True},
                session=True,
            )
            chromium.screenshot(
                "treescope-container", directory / "notebook-treescope.png", width=960
            )
    finally:
        chromium.close()


if __name__ == "__main__":
    _write_screenshots(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs/assets"))


@needs_treescope
def test_treescope_shows_a_treeclass_through_its_children_rule():
    # a `children` rule is how every printer opens the class, treescope too; a text rule
    # is for the text printers, so treescope keeps the fields
    class Hidden(tc.TreeClass):
        weight: jax.Array
        size: int = tc.field(static=True, default=3)

    class Texted(Hidden):
        pass

    tc.register_printer(Hidden, children=lambda v: [(jax.tree_util.GetAttrKey("size"), v.size)])
    tc.register_printer(Texted, repr=lambda v: "<texted>")
    try:
        assert treescope.render_to_text(Hidden(jnp.ones(2))) == "Hidden(size=3)"
        assert "weight=" in treescope.render_to_text(Texted(jnp.ones(2)))
    finally:
        tc.register_printer(Texted)
        tc.register_printer(Hidden)
    assert "weight=" in treescope.render_to_text(Hidden(jnp.ones(2)))
