"""Tests of the schematic figures: they draw, return their axes, and every label is
legible (at least 8 pt, inside the axes, inside its box, overlapping no other label)."""
import io
import itertools
from pathlib import Path

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt
import pytest
from matplotlib.patches import FancyBboxPatch

from agentrl import schematics

# the fewest labels each schematic must carry (it draws a few more)
MIN_LABELS = dict(grpo_step=12, token_layout=60, three_policies=14, kl_estimators=13,
                  turn_credit=60, sweep_layout=20)
NAMES = sorted(schematics.FIGSIZE)
TOLERANCE = 0.5                 # pixels


def test_every_schematic_is_tested():
    assert set(MIN_LABELS) == set(NAMES)
    assert all(callable(getattr(schematics, name)) for name in NAMES)


def fresh_axes(name):
    """Axes filling a new figure of the schematic's size, as a chapter cell makes it."""
    return plt.figure(figsize=schematics.FIGSIZE[name]).add_axes((0, 0, 1, 1))


def labels(ax):
    """The axes' texts that show something (arrows are annotations without text)."""
    return [t for t in ax.texts if t.get_text().strip()]


def draw(name, how):
    """Draw schematic `name` on fresh axes ('fresh') or on its own ('none') -> axes,
    with the figure's canvas drawn so that text extents are known."""
    function = getattr(schematics, name)
    if how == 'fresh':
        ax = fresh_axes(name)
        assert function(ax) is ax
    else:
        ax = function()
        assert ax is not None and ax.figure is not None
    assert isinstance(ax, matplotlib.axes.Axes)
    ax.figure.canvas.draw()
    return ax


def inside(inner, outer, tol=TOLERANCE):
    return (inner.x0 >= outer.x0 - tol and inner.x1 <= outer.x1 + tol
            and inner.y0 >= outer.y0 - tol and inner.y1 <= outer.y1 + tol)


def overlap(a, b, tol=TOLERANCE):
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > tol
            and min(a.y1, b.y1) - max(a.y0, b.y0) > tol)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close('all')


@pytest.mark.parametrize('how', ['fresh', 'none'])
@pytest.mark.parametrize('name', NAMES)
def test_labels_are_legible(name, how):
    ax = draw(name, how)
    texts = labels(ax)
    assert len(texts) >= MIN_LABELS[name]
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    extents = [t.get_window_extent(renderer) for t in texts]
    for text, extent in zip(texts, extents):
        assert text.get_fontsize() >= 8, text.get_text()
        assert inside(extent, frame), f'outside the axes: {text.get_text()!r}'
    for (a, ea), (b, eb) in itertools.combinations(zip(texts, extents), 2):
        assert not overlap(ea, eb), f'{a.get_text()!r} overlaps {b.get_text()!r}'


@pytest.mark.parametrize('name', NAMES)
def test_text_stays_inside_its_box(name):
    ax = draw(name, 'fresh')
    renderer = ax.figure.canvas.get_renderer()
    boxes = [p.get_window_extent(renderer) for p in ax.patches
             if isinstance(p, FancyBboxPatch)]
    assert boxes
    for text in labels(ax):
        anchor = ax.transData.transform(text.get_position())
        extent = text.get_window_extent(renderer)
        for box in boxes:
            if box.contains(*anchor):
                assert inside(extent, box), f'out of its box: {text.get_text()!r}'


@pytest.mark.parametrize('name', NAMES)
def test_on_axes_of_a_subplot_grid(name):
    """Any axes will do, at the cost of the layout: it draws and returns them."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    assert getattr(schematics, name)(axes[1]) is axes[1]
    fig.canvas.draw()


@pytest.mark.parametrize('name', NAMES)
def test_deterministic(name):
    images = []
    for _ in range(2):
        ax = getattr(schematics, name)()
        buffer = io.BytesIO()
        ax.figure.savefig(buffer, format='png', dpi=50)
        images.append(buffer.getvalue())
        plt.close(ax.figure)
    assert images[0] == images[1]


def test_lines_at_most_88_characters():
    for path in (Path(schematics.__file__), Path(__file__)):
        long = [i + 1 for i, line in enumerate(path.read_text().splitlines())
                if len(line) > 88]
        assert not long, f'{path.name}: lines {long} are longer than 88 characters'
