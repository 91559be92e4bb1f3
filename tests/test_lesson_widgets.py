"""The lessons' steppers (lesson 04's cache picture, lesson 06's tree builder), kernel-side:
move a slider, read the result the widget computed and check the picture changed."""

import pytest
import torch

from specdec_course import decoding, medusa
from specdec_course.model import load_pretrained
from specdec_course.widgets import CacheStepper, TreeBuilder


@pytest.fixture(scope="module")
def events():
    target, draft = load_pretrained("target"), load_pretrained("draft")
    prompt = torch.arange(10)
    seen = []
    decoding.speculative_generate(
        target,
        draft,
        prompt,
        30,
        k=4,
        generator=torch.Generator().manual_seed(0),
        on_iteration=lambda ids, tc, dc, a: seen.append((ids.numel(), a, tc.length, dc.length)),
    )
    return seen


def test_cache_stepper_shows_the_state_after_each_iteration(events):
    st = CacheStepper(events, prompt_len=10, k=4, end=40)
    first = st.image.value
    assert st.widget.result["iteration"] == 1 and first[:4] == b"\x89PNG"
    st.step.value = len(events)
    last = st.widget.result
    assert last["committed"] == 40 and last["target_cache"] == 39
    assert st.image.value != first
    for i, (n, a, tlen, dlen) in enumerate(events, start=1):
        st.step.value = i
        r = st.widget.result
        assert (r["committed"], r["accepted"], r["target_cache"], r["draft_cache"]) == (
            n,
            a,
            tlen,
            dlen,
        )
        assert tlen == n - 1  # the invariant the picture teaches


def test_cache_stepper_refuses_an_empty_run():
    with pytest.raises(ValueError, match="empty"):
        CacheStepper([], 10, 4, 40)


def test_tree_builder_grows_the_greedy_tree_and_its_expected_length():
    acc = torch.tensor([[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.05]])
    tb = TreeBuilder(acc, max_nodes=10, nodes=1)
    assert tb.widget.result["paths"] == [(0,)]
    assert tb.widget.result["expected_accepted"] == pytest.approx(0.5)
    first = tb.image.value
    tb.nodes.value = 3
    r = tb.widget.result
    assert r["paths"] == list(medusa.build_tree(medusa.greedy_tree(acc, 3)).paths)
    assert r["expected_accepted"] == pytest.approx(0.5 + 0.5 * 0.4 + 0.2)
    assert tb.image.value != first
    # More nodes never lower the expected accepted length (products are non-negative).
    lengths = []
    for n in range(1, 11):
        tb.nodes.value = n
        lengths.append(tb.widget.result["expected_accepted"])
    assert lengths == sorted(lengths)


def test_tree_picture_keeps_every_node_and_its_label_inside_the_axes():
    # Lesson 06's tree: the top and bottom nodes were clipped, and "root" spilled out of its
    # circle. Each node is now its label's own box, and the axes leave room for the boxes.
    import matplotlib.pyplot as plt

    from specdec_course import plots

    acc = torch.tensor([[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.05]])
    tree = medusa.build_tree(medusa.greedy_tree(acc, 10))
    labels = ["root"] + ["/".join(str(r) for r in p) for p in tree.paths]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    plots.tree_picture(tree, labels, axes=axes)
    fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = axes[0].get_window_extent(renderer)
    nodes = axes[0].texts
    assert len(nodes) == tree.size
    for t in nodes:
        patch = t.get_bbox_patch().get_window_extent(renderer)
        label = t.get_window_extent(renderer)
        assert box.x0 <= patch.x0 and patch.x1 <= box.x1, t.get_text()
        assert box.y0 <= patch.y0 and patch.y1 <= box.y1, t.get_text()
        assert patch.x0 <= label.x0 and label.x1 <= patch.x1, t.get_text()  # label in its node
    plt.close(fig)


def test_lesson_02_speedup_legend_sits_beside_the_curves():
    import matplotlib.pyplot as plt

    from specdec_course import plots

    ax = plots.speedup_curves(0.8, [0.02, 0.05, 0.1, 0.2, 0.5])
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(ax.get_window_extent(renderer))
    plt.close(ax.figure)
