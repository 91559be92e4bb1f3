"""``specdec-course generate --model smollm2``: the real LLM answers a prompt, streamed.

The prompt goes through the model's chat template (one user turn); the answer is printed as
the loop commits it (``speculative_generate``'s ``on_iteration``) and ends at the model's
end of turn (``GGUFTokenizer.stop_ids``: ``<|im_end|>``, ``<|endoftext|>``), in plain and
speculative decoding alike. ``--compare`` times plain decoding (``decoding.generate``, the
baseline) against the method, round-robin, and checks the texts are the same.
"""

from __future__ import annotations

import sys
import time

from .generate import LLM_METHODS, k_auto_supported, threads_line

# The fixed k used for ``--k auto`` where ``speculative_generate`` has no automatic k: prompt
# lookup learns its own proposal length up to k, and a call of a few more tokens costs about
# one call with the kernels chosen at load, so a k of 4 rarely drafts past what pays
# (data/results/llm_cpu.json: the best k was 2 to 8 across prompt sets).
AUTO_K = 4
COMPARE_REPEATS = 3


class Stream:
    """``on_iteration`` for ``speculative_generate``: prints the answer's new text as it is
    committed, up to (not including) its first stop id. A character whose UTF-8 bytes span
    two tokens waits for its second."""

    def __init__(self, tok, n0: int, stop_ids, out=None):
        self.tok, self.n0, self.stop = tok, n0, set(stop_ids)
        self.out = out or sys.stdout
        self.shown = ""

    def __call__(self, ids, *_):
        self.show(ids)

    def show(self, ids, final: bool = False) -> None:
        new = ids[self.n0 :].tolist()
        cut = next((i for i, t in enumerate(new) if t in self.stop), None)
        text = self.tok.decode(new if cut is None else new[:cut])
        if not final:
            text = text.rstrip("\ufffd")
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.out.write(text[len(self.shown) :])
            self.out.flush()
            self.shown = text


def _load():
    try:
        from .. import llm

        model, tok = llm.load()
    except ImportError as e:
        raise ValueError(
            f"--model smollm2 needs the [llm] extra and the model's wheel: {e}"
        ) from None
    return llm, model, tok


def _k(args) -> tuple[object, str]:
    if args.method == "plain":
        return None, "" if args.k is None else "--k does not apply to plain decoding"
    if args.k is None or args.k == "auto":
        if k_auto_supported():
            return "auto", "k = auto: chosen as the run goes from the costs and acceptance it sees"
        return AUTO_K, (
            f"k = {AUTO_K}: a fixed k (this version's speculative_generate has no k = auto); "
            "--k sets it"
        )
    return args.k, f"k = {args.k}: as --k gives it"


def run_llm(args) -> int:
    """The ``generate --model smollm2`` command (after ``generate.resolve`` and its checks)."""
    from .generate import start_threads

    start_threads(args)
    import torch

    from ..decoding import generate, speculative_generate

    llm, model, tok = _load()
    prompt = torch.tensor(tok.apply_chat_template([{"role": "user", "content": args.prompt}]))
    n0, context = prompt.numel(), model.config.block_size
    if n0 + args.max_new_tokens > context:
        raise ValueError(
            f"the prompt is {n0} tokens with the chat template; with --max-new-tokens "
            f"{args.max_new_tokens} that makes {n0 + args.max_new_tokens}, more than the "
            f"model's context of {context}; shorten the prompt or lower --max-new-tokens"
        )
    name = LLM_METHODS[args.method][0]
    proposer = None if name is None else llm.proposers(model)[name]
    k, why = _k(args)
    opts = dict(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        stop_ids=tok.stop_ids,
    )

    def decode(method: str, on_iteration=None):
        g = torch.Generator().manual_seed(args.seed)
        if method == "plain":
            return generate(model, prompt, args.max_new_tokens, generator=g, **opts), None
        return speculative_generate(
            model,
            proposer,
            prompt,
            args.max_new_tokens,
            k=k,
            generator=g,
            on_iteration=on_iteration,
            **opts,
        )

    print(f"SmolLM2-135M-Instruct, {args.method}; {threads_line(args)}", flush=True)
    stream = Stream(tok, n0, tok.stop_ids)
    t0 = time.perf_counter()
    out, stats = decode(args.method, None if proposer is None else stream)
    dt = time.perf_counter() - t0
    stream.show(out, final=True)  # plain decoding prints its answer here, when it is done
    print()
    print("-" * 60)
    n = out.numel() - n0
    ended = "its end of turn" if n and out[-1].item() in tok.stop_ids else "--max-new-tokens"
    print(
        f"{args.method}: {n} tokens in {dt:.2f}s ({n / max(dt, 1e-9):.1f} tokens/s, one run, "
        f"its warm-up included), stopped at {ended}"
    )
    if why:
        print(why)
    if stats is not None:
        print(stats.summary())
    if args.compare:
        print(_compare(args, decode, out, tok, n0))
    return 0


def _compare(args, decode, out, tok, n0: int) -> str:
    from ..bench.compare import time_round_robin

    if args.method == "plain":
        return "--compare: --method plain is plain decoding; nothing to compare"
    results = {}

    def run(method):
        results[method] = decode(method)

    s = time_round_robin(
        {m: (lambda m=m: run(m)) for m in (args.method, "plain")}, repeats=COMPARE_REPEATS
    )
    plain, _ = results["plain"]
    spec, stats = results[args.method]
    n_plain, n_spec = plain.numel() - n0, spec.numel() - n0
    rate = {"plain": n_plain / s["plain"], args.method: n_spec / s[args.method]}
    ratio = rate[args.method] / rate["plain"]
    lines = [
        f"on this machine, {args.threads or 1} thread(s), median of {COMPARE_REPEATS} "
        "round-robin runs each (after the run above, so warm):",
        f"  {'':8s} {'tokens':>6s} {'tokens/s':>9s} {'tokens per call':>16s}",
        f"  {'plain':8s} {n_plain:6d} {rate['plain']:9.1f} {1.0:16.2f}",
        f"  {args.method:8s} {n_spec:6d} {rate[args.method]:9.1f} "
        f"{stats.tokens_per_target_call:16.2f}",
        f"  {args.method} runs at {ratio:.2f}x plain decoding's tokens/s",
    ]
    same = bool(plain.numel() == spec.numel() and (plain == spec).all())
    if args.temperature == 0:
        lines.append(
            "  exactness: identical text to plain decoding"
            if same
            else "  exactness: the texts DIFFER at temperature 0 (plain decoding's is below)"
        )
    else:
        lines.append(
            f"  exactness: at temperature {args.temperature:g} both sample the same law, so the "
            "texts may differ; --temperature 0 checks they are identical"
        )
    if not same:
        cut = plain[n0:].tolist()
        cut = cut[: next((i for i, t in enumerate(cut) if t in tok.stop_ids), len(cut))]
        lines.append("plain decoding's text:\n" + tok.decode(cut))
    return "\n".join(lines)
