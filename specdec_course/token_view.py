"""Watch speculative decoding work: which drafted tokens the target kept, token by token.

:func:`watch` runs ``decoding.speculative_generate`` once with any proposer of either model (the
character pair's draft model, n-gram or feature drafts; the real model's prompt lookup or
feature draft), records every iteration (what was drafted, how many drafts were accepted, the
target's own token), and times it by the wall clock on this machine beside plain decoding
(``decoding.generate``) on the same prompt. The result, a :class:`Watched`, shows itself in a
notebook as coloured text, the picture of Hugging Face's assisted-generation post:

- **accepted** drafts in green (text marks ``[...]``): the draft guessed, one call checked;
- the **rejected** draft in red and struck through (``~...~``): the first draft the target
  refused (the drafts after it were never looked at, so they are not shown);
- the **target's own** token in blue (``{...}``): the bonus or the recovered token every
  iteration ends with.

The marks make the text output readable without colour (and by nbval). :class:`Explorer`
puts a text box, the proposer, ``k`` and the temperature in front of it: the learner's own
prompt, plain and speculative text side by side with their times (``k`` starts at ``"auto"``,
the loop's own live choice). Nothing here is asserted from a time: a timing is shown, the
token counts and the identity are what a cell can check.
"""

from __future__ import annotations

import functools
import html
import time
from dataclasses import dataclass, field

import torch

from . import decoding
from .devices import machine_label  # the label beside the watched run's timing

__all__ = ["Iteration", "Watched", "watch", "Explorer", "KINDS", "machine_label"]

# What each kind of piece looks like: (HTML colour, text mark open, text mark close).
KINDS = {
    "accepted": ("#1a7f37", "[", "]"),
    "rejected": ("#cf222e", "~", "~"),
    "target": ("#0550ae", "{", "}"),
}


@dataclass
class Iteration:
    """One iteration of the loop: ``drafted`` tokens proposed, the first ``accepted`` kept,
    then ``token``, the target's own (bonus if every draft was kept, else the recovered one)."""

    drafted: list[int]
    accepted: int
    token: int

    @property
    def rejected(self) -> int | None:
        """The first refused draft (the one ``token`` replaced), or None if all were kept."""
        return self.drafted[self.accepted] if self.accepted < len(self.drafted) else None


@dataclass
class Watched:
    """A run of ``speculative_generate`` as it happened, and plain decoding beside it."""

    prompt_len: int
    ids: torch.Tensor  # prompt + new tokens, speculative
    iterations: list[Iteration]
    decode: object = field(repr=False)
    spec_seconds: float = 0.0
    plain_ids: torch.Tensor | None = None
    plain_seconds: float | None = None
    stop_ids: tuple = ()
    label: str = ""
    temperature: float = 0.0
    threads: int = 1  # torch's threads when both sides were timed

    @property
    def new_tokens(self) -> int:
        return self.ids.numel() - self.prompt_len

    @property
    def tokens_per_call(self) -> float:
        """Tokens emitted per target call (one call per iteration)."""
        return self.new_tokens / max(1, len(self.iterations))

    @property
    def identical(self) -> bool | None:
        """Speculative ids equal to plain ids (the guarantee at temperature 0)."""
        return None if self.plain_ids is None else torch.equal(self.ids, self.plain_ids)

    @property
    def speedup(self) -> float | None:
        """Plain seconds over speculative seconds, measured just now on this machine."""
        if self.plain_seconds is None or self.spec_seconds <= 0:
            return None
        return self.plain_seconds / self.spec_seconds

    def pieces(self) -> list[tuple[str, str]]:
        """``[(kind, text)]`` in order: each iteration's accepted drafts (one piece), its
        rejected draft (if any) and the target's token; cut at the first stop token."""
        return list(self._pieces)

    @functools.cached_property
    def _pieces(self) -> list[tuple[str, str]]:
        # A token's text is what it adds to the decoded text so far (BPE tokens can merge);
        # a rejected draft is decoded the same way but not committed. Computed once: the
        # run does not change, and the text, its HTML and its repr all read it.
        out, seen, before = [], [], self.decode([])
        for it in self.iterations:
            run = [("accepted", t) for t in it.drafted[: it.accepted]]
            if it.rejected is not None:
                run.append(("rejected", it.rejected))
            run.append(("target", it.token))
            for kind, t in run:
                if kind != "rejected" and t in self.stop_ids:
                    return _merge(out)
                after = self.decode([*seen, t])
                piece = after[len(before) :] if after.startswith(before) else self.decode([t])
                out.append((kind, piece))
                if kind != "rejected":
                    seen.append(t)
                    before = after
        return _merge(out)

    def text(self) -> str:
        """The committed text (speculative), cut at the first stop token."""
        return "".join(t for kind, t in self.pieces() if kind != "rejected")

    def plain_text(self) -> str | None:
        if self.plain_ids is None:
            return None
        new = self.plain_ids[self.prompt_len :].tolist()
        for i, t in enumerate(new):
            if t in self.stop_ids:
                new = new[:i]
                break
        return self.decode(new)

    def summary(self) -> str:
        """One line: tokens, calls, tokens per call, and (live) both sides' tokens per second."""
        n, calls = self.new_tokens, len(self.iterations)
        line = f"{self.label + ': ' if self.label else ''}{n} tokens in {calls} target calls "
        line += f"({self.tokens_per_call:.2f} tokens per call)"
        if self.plain_seconds is not None:
            line += (
                f"; this machine, {self.threads} thread(s), wall clock: "
                f"plain {n / self.plain_seconds:.1f} tokens/s, "
                f"speculative {n / self.spec_seconds:.1f} tokens/s ({self.speedup:.2f}x); "
                + (f"identical to plain: {self.identical}" if self.temperature == 0 else
                   "sampled: the same law as plain decoding, other draws")
            )  # fmt: skip
        return line

    def legend(self) -> str:
        return "[accepted draft]  ~rejected draft~  {target's own token}"

    def __repr__(self) -> str:
        body = "".join(
            f"{KINDS[kind][1]}{t}{KINDS[kind][2]}" if kind in KINDS else t
            for kind, t in self.pieces()
        )
        return f"{self.summary()}\n{self.legend()}\n{body}"

    def _repr_html_(self) -> str:
        spans = "".join(_span(kind, t) for kind, t in self.pieces())
        legend = " ".join(_span(k, k.replace("target", "target's own")) for k in KINDS)
        return (
            f"<div class='specdec-watch'><div>{html.escape(self.summary())}</div>"
            f"<div style='font-size:85%'>{legend}</div>"
            f"<pre style='white-space:pre-wrap;line-height:1.5'>{spans}</pre></div>"
        )


def _merge(pieces):
    out = []
    for kind, t in pieces:
        if out and out[-1][0] == kind and kind == "accepted":
            out[-1] = (kind, out[-1][1] + t)
        else:
            out.append((kind, t))
    return out


def _span(kind: str, text: str) -> str:
    colour = KINDS[kind][0]
    style = f"color:{colour};font-weight:bold"
    if kind == "rejected":
        style += ";text-decoration:line-through"
    elif kind == "accepted":
        style += f";background:{colour}22"
    return f"<span class='sv-{kind}' style='{style}'>{html.escape(text)}</span>"


class _Watching:
    """The proposer, seen from outside: every proposal's tokens are copied as it is made."""

    def __init__(self, proposer):
        self._inner = proposer
        self.proposals: list[list[int]] = []

    def propose(self, ids, n, k, out):
        kk, q = self._inner.propose(ids, n, k, out)
        self.proposals.append(out[:kk].tolist())
        return kk, q

    def __getattr__(self, name):  # start, commit, observe_target, vocab_size, target, ...
        return getattr(self._inner, name)


def watch(
    target,
    draft,
    prompt_ids,
    max_new_tokens: int,
    *,
    decode,
    k=4,
    temperature: float = 0.0,
    seed: int = 0,
    plain: bool = True,
    stop_ids=(),
    label: str = "",
) -> Watched:
    """Run ``speculative_generate(target, draft, prompt_ids, ...)`` once, recording each
    iteration, and (``plain=True``) ``decoding.generate`` on the same prompt; both timed by
    the wall clock here, plain first. ``decode`` turns ids into text (a tokenizer's
    ``decode``); ``stop_ids`` (e.g. ``tok.stop_ids``) end both runs at the end of a turn.
    ``draft`` is a ``CharGPT`` or any proposer; ``seed`` seeds both runs' generators (at
    temperature 1 the two texts then differ in general: the same law, other random numbers)."""
    from .drafts import as_proposer

    prompt = torch.as_tensor(prompt_ids).reshape(-1)
    proposer = _Watching(as_proposer(draft))
    iterations: list[Iteration] = []

    def seen(ids, target_cache, draft_cache, accepted):
        drafted = proposer.proposals[-1] if len(proposer.proposals) > len(iterations) else []
        proposer.proposals[len(iterations) :] = [drafted]
        iterations.append(Iteration(drafted, accepted, int(ids[-1])))

    # One short untimed run of each first: the first call of a process pays for lazy setup
    # (kernel selection, allocations) that is not the method's cost.
    stop = tuple(stop_ids) or None
    g = torch.Generator().manual_seed(seed)
    decoding.generate(target, prompt, 2, temperature=temperature, generator=g)
    decoding.speculative_generate(target, as_proposer(draft), prompt, 2, k=1,
                                  temperature=temperature, generator=g)  # fmt: skip
    plain_ids = plain_s = None
    if plain:
        t0 = time.perf_counter()
        plain_ids = decoding.generate(
            target, prompt, max_new_tokens, temperature=temperature,
            generator=torch.Generator().manual_seed(seed), stop_ids=stop,
        )  # fmt: skip
        plain_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids, _ = decoding.speculative_generate(
        target, proposer, prompt, max_new_tokens, k=k, temperature=temperature,
        generator=torch.Generator().manual_seed(seed), on_iteration=seen, stop_ids=stop,
    )  # fmt: skip
    spec_s = time.perf_counter() - t0
    return Watched(
        prompt.numel(), ids.cpu(), iterations, decode, spec_s,
        None if plain_ids is None else plain_ids.cpu(), plain_s, tuple(stop_ids), label,
        float(temperature), torch.get_num_threads(),
    )  # fmt: skip


class Explorer:
    """Your own prompt through plain and speculative decoding, side by side, coloured.

    ``Explorer(target, proposers, encode, decode)``: ``proposers`` is ``{name: proposer}``
    (``llm.proposers(model)``, or the character pair's); ``encode(text) -> ids`` builds the
    prompt (for a chat model, the chat template). Widgets: the prompt, the proposer, k, the
    temperature, the number of new tokens, and a button; :meth:`run` is what the button
    does (callable without a browser: it returns the :class:`Watched`).
    """

    def __init__(self, target, proposers: dict, encode, decode, *, prompt: str = "",
                 max_new_tokens: int = 48, stop_ids=()):  # fmt: skip
        import ipywidgets as w

        if not proposers:
            raise ValueError("Explorer needs at least one proposer: {name: proposer}")
        self.target, self.proposers = target, dict(proposers)
        self.encode, self.decode, self.stop_ids = encode, decode, tuple(stop_ids)
        self.prompt = w.Textarea(value=prompt, description="prompt",
                                 layout=w.Layout(width="95%", height="5em"))  # fmt: skip
        self.proposer = w.Dropdown(options=list(self.proposers), description="proposer")
        self.k = w.Dropdown(options=["auto", 1, 2, 3, 4, 6, 8], value="auto", description="k")
        self.temperature = w.Dropdown(options=[0.0, 1.0], value=0.0, description="temperature")
        self.tokens = w.IntSlider(value=max_new_tokens, min=8, max=128, step=8,
                                  description="new tokens")  # fmt: skip
        self.button = w.Button(description="Generate", button_style="primary")
        self.status = w.HTML()
        self.plain_out, self.spec_out = w.HTML(), w.HTML()
        self.button.on_click(lambda _: self._clicked())
        panes = w.HBox([
            w.VBox([w.HTML("<b>plain decoding</b>"), self.plain_out],
                   layout=w.Layout(width="48%")),
            w.VBox([w.HTML("<b>speculative decoding</b>"), self.spec_out],
                   layout=w.Layout(width="48%")),
        ])  # fmt: skip
        controls = w.HBox([self.proposer, self.k, self.temperature, self.tokens])
        self.widget = w.VBox([self.prompt, controls, self.button, self.status, panes])
        self.result: Watched | None = None

    def run(self) -> Watched:
        """Generate with the widgets' settings; fill both panes; return the run."""
        text = self.prompt.value.strip()
        if not text:
            raise ValueError("the prompt is empty: type a question or a passage to work on")
        ids = torch.as_tensor(self.encode(text))
        name = self.proposer.value
        res = watch(
            self.target, self.proposers[name], ids, self.tokens.value, decode=self.decode,
            k=self.k.value, temperature=self.temperature.value, stop_ids=self.stop_ids,
            label=name,
        )  # fmt: skip
        n = res.new_tokens
        self.plain_out.value = (
            f"<div>{n / res.plain_seconds:.1f} tokens/s, 1 token per call</div>"
            f"<pre style='white-space:pre-wrap'>{html.escape(res.plain_text())}</pre>"
        )
        self.spec_out.value = res._repr_html_()
        same = "identical to plain" if res.identical else "differs from plain"
        note = " (temperature 1: same law, other draws)" if self.temperature.value else ""
        self.status.value = f"<span class='sv-status'>done: speculative text {same}{note}</span>"
        self.result = res
        return res

    def _clicked(self) -> None:
        self.status.value = "<span class='sv-status'>generating...</span>"
        try:
            self.run()
        except ValueError as e:
            self.status.value = f"<span class='sv-status'>{html.escape(str(e))}</span>"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
