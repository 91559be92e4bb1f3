"""Medusa decoding: the heads guess a tree of tokens, one target pass verifies all of them.

Each iteration of :func:`medusa_generate` is four steps: the heads guess the tree's tokens
from the last hidden state, one target pass scores every node (:func:`.tree._tree_pass`),
a walk from the root keeps the longest acceptable path (greedy at temperature 0, the
one-hot SpecInfer rule when sampling), and the accepted path is committed: its tokens to the
output, its keys and values to the cache (:func:`.tree.compact_cache`). The loop runs once
per generated token or two on a CPU, where every tensor op costs microseconds: the steps
read the tree's precomputed buffers and do their bookkeeping in Python ints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._validate import check_generator
from ..decoding import SpecStats, check_prompt
from ..devices import check_same_device, model_device, with_native_cpu_kernels
from ..fast import lean_step
from ..model import CharGPT, KVCache
from ..sampling import SamplingOptions, accepts, exp_noise, uniform_open_closed
from .candidates import DRAFTS, is_chain, sampled_chain_walk, sampler, top_guesser
from .heads import MedusaHeads, check_heads
from .hydra import HydraHeads
from .tree import TREE_SMALL, TreeBuffers, _as_tree, _tree_pass, compact_cache, tree_bias_buffer


@dataclass
class MedusaStats(SpecStats):
    """Counts from one ``medusa_generate`` call (a ``SpecStats``, the draft fields unused).

    One *iteration* is one tree verification pass; ``accepted_per_iteration[i]`` is the number
    of tree nodes (guessed tokens) it accepted, and every iteration also emits one token of the
    target's own. ``target_calls`` counts every target forward pass, the prefill included
    (the prefill emits the first new token, as in plain decoding, where ``m`` tokens cost
    ``m`` calls), so ``tokens_per_target_call`` is 1.0 for plain decoding. ``k`` is the tree
    depth and ``tree_size`` its node count (root included); ``drafted`` sums the nodes fed.
    """

    tree_size: int = 0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per tree pass: accepted guesses plus the target's own token."""
        return self.mean_accepted + 1.0

    def summary(self) -> str:
        return (
            f"tree of {self.tree_size} nodes, depth {self.k}: {self.emitted} tokens in "
            f"{self.iterations} tree passes, {self.target_calls} target calls; mean accepted "
            f"{self.mean_accepted:.3f}, mean accepted length {self.mean_accepted_length:.3f}, "
            f"tokens per target call {self.tokens_per_target_call:.3f}"
        )


def _checked_tree(model: CharGPT, heads: MedusaHeads, tree) -> TreeBuffers:
    # medusa_generate's checks of the heads against the model and of the tree against both.
    if not isinstance(heads, HydraHeads):
        check_heads(heads)
    check_same_device("the heads", model_device(heads), "the model", model_device(model))
    if (heads.n_embd, heads.vocab_size) != (model.config.n_embd, model.config.vocab_size):
        raise ValueError(
            f"heads were built for n_embd={heads.n_embd}, vocab={heads.vocab_size}; the model "
            f"has n_embd={model.config.n_embd}, vocab={model.config.vocab_size}"
        )
    tb = _as_tree(tree)
    if tb.top_r > heads.vocab_size:
        raise ValueError(
            f"the tree asks for rank {tb.top_r - 1} but the vocabulary has "
            f"{heads.vocab_size} tokens"
        )
    if tb.max_depth > heads.n_heads:
        raise ValueError(
            f"the tree is {tb.max_depth} deep but there are only {heads.n_heads} heads; "
            "use a shallower tree or more heads"
        )
    return tb


class _Laps:
    """Seconds per step of the loop for ``timings=True``; when off, every call does nothing."""

    __slots__ = ("on", "spent", "t")

    def __init__(self, on: bool):
        self.on = on
        self.spent = {"heads": 0.0, "target": 0.0, "walk": 0.0, "cache": 0.0}
        self.t = 0.0

    def start(self) -> None:
        if self.on:
            self.t = time.perf_counter()

    def lap(self, step: str) -> None:
        if self.on:
            now = time.perf_counter()
            self.spent[step] += now - self.t
            self.t = now


def _greedy_walk(
    logits: torch.Tensor, tl: list[int], children: tuple[tuple[int, ...], ...], T: int
) -> tuple[int, int]:
    """Temperature 0: from the root, follow the child that is the target's argmax.

    ``tl`` are the ``T`` fed tokens. Returns ``(node, token)``: the deepest accepted node and
    the target's argmax there, the token it emits itself.
    """
    am = logits.argmax(-1).tolist()
    node = 0
    while True:
        want = am[node]
        for c in children[node]:
            if c < T and tl[c] == want:
                node = c
                break
        else:
            return node, want


def node_law(p: torch.Tensor, children) -> torch.Tensor:
    """The exact law of the token the sampled walk emits at one node (``_sampled_walk``'s rule).

    ``p`` ``[V]``: the target's distribution at the node; ``children``: the candidate tokens
    of its children, in the order they are tried. Child ``c`` is accepted with probability
    ``p(c)`` renormalised over what earlier rejections left; if none is, the token is drawn
    from what is left. Returns ``[V]``: the probability of emitting each token there, which
    equals ``p`` for any candidates (lesson 06 checks it; exercise 07 writes the walk).
    """
    out = torch.zeros_like(p)
    left, reach = p.clone(), 1.0  # mass not yet rejected; P(every earlier child rejected)
    for c in children:
        mass = float(left.sum())
        share = float(left[c]) / mass if mass > 0 else 0.0
        out[c] += reach * share
        reach *= 1.0 - share
        left[c] = 0.0
    mass = float(left.sum())
    return out + left * (reach / mass) if mass > 0 else out


def _sampled_walk(
    logits: torch.Tensor,
    process: Callable[[torch.Tensor], torch.Tensor] | None,
    tl: list[int],
    children: tuple[tuple[int, ...], ...],
    T: int,
    us: list[float],
) -> tuple[int, int]:
    """Sampling: try each child as a one-hot draft, renormalising after every rejection.

    ``process`` turns logits into the sampled distribution's (None: they already are); ``us``
    are this pass's uniforms in (0, 1], one per child tried and one for the token sampled
    from what is left. Returns ``(node, token)`` as :func:`_greedy_walk` does; the token is
    distributed as the target's at ``node`` (see the package docstring for the rule).
    """
    probs = (logits if process is None else process(logits)).softmax(-1)  # [T, V]
    node = ui = 0
    while True:
        # The walk reads a node's distribution as Python floats: the few visited nodes cost
        # one conversion each instead of several small tensor ops.
        prow = probs[node].tolist()
        rem = sum(prow)  # mass not yet rejected at this node
        for c in children[node]:
            if c >= T:  # outside a truncated tree (children come in index order)
                continue
            pc = prow[tl[c]]
            u = us[ui]
            ui += 1
            # The accept test with q(x) = rem (u <= pc / rem); a child holding all the
            # remaining mass is accepted outright (rounding could otherwise leave nothing).
            if accepts(u, rem, pc) or rem - pc <= 0.0:
                node = c
                break
            rem -= pc
            prow[tl[c]] = 0.0  # rejected: renormalising is implicit in rem
        else:
            return node, _sample_rest(prow, us[ui])


def _sample_rest(probs: list[float], u: float) -> int:
    """Index ``i`` with probability ``probs[i] / sum(probs)`` by inverse CDF, for ``u`` in (0, 1].

    Entries that are 0 (rejected guesses, filtered tokens) are never returned; 65 Python
    additions cost less than the tensor ops of a sample on the CPU.
    """
    target = u * sum(probs)
    acc, last = 0.0, 0
    for i, p in enumerate(probs):
        if p > 0.0:
            acc += p
            last = i
            if acc >= target:
                return i
    return last  # rounding left target a hair above the total


def _commit(
    seq: list[int],
    cache: KVCache,
    start: int,
    tb: TreeBuffers,
    node: int,
    tl: list[int],
    token: int,
    room: int,
) -> int:
    """Commit the path to ``node`` and ``token`` (while fewer than ``room`` tokens are left).

    The path's tokens and then ``token`` go to ``seq``; the cache keeps the root (written at
    ``start``) and the path, so ``token`` is pending. Returns the path's length.
    """
    path = tb.path_lists[node]
    seq.extend(tl[i] for i in path)
    if len(path) < room:  # else the accepted guesses completed the output
        seq.append(token)
    compact_cache(cache, start, path, tb.path_nodes[node])
    return len(path)


@with_native_cpu_kernels
@torch.inference_mode()
def medusa_generate(
    model: CharGPT,
    heads: MedusaHeads,
    prompt_ids,
    max_new_tokens: int,
    *,
    tree=TREE_SMALL,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    timings: bool = False,
    draft: str = "top",
) -> tuple[torch.Tensor, MedusaStats]:
    """Medusa decoding: heads guess a tree of tokens, one target pass verifies all of them.

    ``model`` is the target, ``heads`` a ``MedusaHeads`` trained on it; ``prompt_ids`` 1-D ids
    (non-empty). ``tree``: a list of paths (see :func:`build_tree`), a name from ``TREES``
    (``"chain"``, ``"small"``, ``"large"``) or prebuilt ``TreeBuffers``; its depth may not
    exceed ``heads.n_heads``. Sampling options as in ``decoding.generate``: at
    ``temperature=0`` the output is ``decoding.generate(model, prompt, n, temperature=0)``
    token for token; otherwise every token is distributed exactly as the target's after the
    same temperature / top-k / top-p processing (see the module docstring for the rule).
    ``timings=True`` fills ``stats.seconds`` (heads, target, walk, cache). ``heads`` may be
    ``MedusaHeads`` or ``HydraHeads`` (which also read the path's tokens, see ``hydra``).
    ``draft="top"`` fills the tree with the heads' ranked guesses; ``draft="sample"`` (a
    chain tree, temperature > 0) samples each node's token from its head and verifies the
    chain by the speculative sampling rule (``guess``), exact as well.

    Returns ``(ids, MedusaStats)``: ``ids`` is the 1-D prompt followed by exactly
    ``max_new_tokens`` new ids. Raises ValueError for bad prompts or options, heads of another
    width or vocabulary, or a tree deeper than the number of heads.
    """
    ids = check_prompt(model, prompt_ids, max_new_tokens)
    dev = model.lm_head.weight.device
    tb = _checked_tree(model, heads, tree).to(dev)
    process = SamplingOptions(temperature, top_k, top_p).logits  # checks the options
    check_generator(generator)
    greedy = temperature == 0
    if draft not in DRAFTS:
        raise ValueError(f"draft must be one of {DRAFTS}; got {draft!r}")
    sample = draft == "sample"
    if sample and (greedy or not is_chain(tb)):
        raise ValueError(
            "draft='sample' needs temperature > 0 and a chain tree ((0,), (0, 0), ...); "
            "use draft='top' for trees and for greedy decoding"
        )
    identity = temperature == 1.0 and top_k is None and top_p is None
    n = ids.numel()
    end = n + max_new_tokens
    out = torch.empty(end, dtype=torch.long, device=dev)
    out[:n] = ids
    stats = MedusaStats(k=tb.max_depth, tree_size=tb.size)
    if max_new_tokens == 0:
        return out, stats
    laps = _Laps(timings)
    guess = top_guesser(heads, tb) if not sample else sampler(heads, tb, temperature)
    children, block = tb.children, model.config.block_size

    if not greedy:
        # Random numbers drawn in bulk, once per call: per pass a row of float64 uniforms in
        # (0, 1], one per child tried plus one for the token sampled from what is left;
        # Gumbel noise for the prefill's token (Gumbel-max: argmax(logits + G) is a sample
        # of softmax(logits)).
        width = 2 * tb.max_depth + 1 if sample else tb.size
        uniforms = uniform_open_closed((max_new_tokens, width), generator=generator).tolist()
        V = model.config.vocab_size
        gumbel = exp_noise((V,), generator=generator, device=dev).log_().neg_()
    cache = model.new_cache(1)
    lean = lean_step(model)  # the tree passes' step, looked up once per run (fast.lean)
    # Prefill: the whole prompt; its last position gives the first new token and the hidden
    # state the heads read.
    logits, hid = model(out[None, :n], cache, return_hidden=True)
    if greedy:
        first = logits[0, -1].argmax()
    else:
        first = (process(logits[0, -1]) + gumbel).argmax()
    # The committed text as Python ints: the walk reads and extends it without tensor ops.
    seq = ids.tolist() + [int(first)]
    h = hid[0, -1]
    n += 1
    stats.target_calls = 1
    tokens = torch.empty(tb.size, dtype=torch.long, device=dev)
    # A chain is a run of positions under the causal mask: the lean step's own path. A tree's
    # bias for each pass is a view of one buffer (zeros for the prefix, then the tree's).
    wide = None if is_chain(tb) else tree_bias_buffer(tb, block)
    sampled = None if identity else process

    while n < end:
        laps.start()
        L = cache.length  # == n - 1: the newest token out[n - 1] is pending
        # Tree size: no deeper than the tokens still needed, and within the context.
        T = min(tb.upto[min(tb.max_depth, end - n)], block - L)
        root = seq[-1]
        if sample:
            us = uniforms[stats.iterations]  # this pass's row: D draws, then the walk's
            drawn, qs = guess(h, root, us)
        elif T > 1:
            drawn = guess(h, root)
        laps.lap("heads")
        if T > 1 and isinstance(drawn, list):  # a chain's tokens: fed as they are
            tl = [root] + drawn[: T - 1]
            feed = torch.tensor(tl, device=dev)
        else:
            tokens[0] = root
            if T > 1:
                tokens[1:] = drawn
            feed = tokens[:T]
            tl = feed.tolist()
        bias = None if wide is None else wide[:T, block - L : block + T]
        logits, hid = _tree_pass(model, feed, cache, tb, bias, lean)
        laps.lap("target")
        if greedy:
            node, token = _greedy_walk(logits, tl, children, T)
        elif sample:
            probs = (logits if sampled is None else sampled(logits)).softmax(-1)
            node, token = sampled_chain_walk(probs, tl, qs, T, us[tb.max_depth :])
        else:
            us = uniforms[stats.iterations]  # this pass's row
            node, token = _sampled_walk(logits, sampled, tl, children, T, us)
        laps.lap("walk")
        a = _commit(seq, cache, L, tb, node, tl, token, end - n)
        h = hid[node]
        n = min(n + a + 1, end)
        stats.iterations += 1
        stats.drafted += T - 1
        stats.accepted_per_iteration.append(a)
        stats.rejections += any(c < T for c in children[node])  # stopped at a rejection
        laps.lap("cache")
    stats.target_calls += stats.iterations
    stats.emitted = max_new_tokens
    if timings:
        stats.seconds = laps.spent
    out[ids.numel() :] = torch.tensor(seq[ids.numel() : end], dtype=torch.long)
    return out, stats
