"""``specdec-course generate``: continue a prompt with the shipped models and print stats."""

from __future__ import annotations

import time

import torch

METHODS = {
    "autoregressive": "plain decoding: one target call per character (the baseline)",
    "speculative": "the 1-layer draft model proposes --k characters, the target verifies them",
    "ngram": "a counted character n-gram proposes --k characters (costs almost nothing)",
    "distilled": "the n-gram table distilled from the target proposes --k characters",
    "medusa": "Medusa heads on the target propose a tree of candidates",
}
COMPARE_REPEATS = 5


def _recommendation() -> str:
    # From the stored bench, so that the help never contradicts what was measured.
    from ..bench import describe_fastest, fastest_method, load_speedup_results

    try:
        return describe_fastest(fastest_method(load_speedup_results()))
    except (FileNotFoundError, ValueError, KeyError):
        return "no stored CPU bench: run `specdec-course bench speedup` to see which is fastest"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="continue a prompt with the shipped models",
        description="Continue PROMPT with the shipped 4-layer target, decoded by --method, and "
        "print the text, its speed and (for speculative methods) acceptance statistics. Every "
        "method samples exactly the target's distribution; at --temperature 0 all give the "
        "same text.\n\nMethods:\n"
        + "".join(f"  {name:15s} {what}\n" for name, what in METHODS.items())
        + f"\nWhich is fastest depends on the machine; {_recommendation()}. "
        "--compare measures it here.",
    )
    p.add_argument(
        "prompt", nargs="?", default="ROMEO:\n", help="text to continue (default: %(default)r)"
    )
    p.add_argument("--method", choices=list(METHODS), default="speculative", help="decoding method")
    p.add_argument(
        "--k",
        type=int,
        default=4,
        help="drafts per iteration (speculative, ngram, distilled); never more are drafted "
        "than the characters still to generate",
    )
    p.add_argument("--max-new-tokens", type=int, default=200, help="characters to generate")
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="0 is greedy; otherwise a finite number >= 1e-6",
    )
    p.add_argument("--top-k", type=int, default=None, help="keep the k likeliest characters")
    p.add_argument(
        "--top-p", type=float, default=None, help="keep the smallest set with this probability"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of the sampling")
    p.add_argument(
        "--compare",
        action="store_true",
        help=f"also time --method against plain decoding on this machine ({COMPARE_REPEATS} "
        "round-robin runs each, same options) and say which is faster",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    from ..data import CharTokenizer
    from ..decoding import generate, speculative_generate
    from ..model import load_pretrained

    torch.set_num_threads(1)
    target = load_pretrained("target")
    tok = CharTokenizer(target.vocab)
    prompt = tok.encode(args.prompt)
    opts = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    draft = heads = None  # built before the clock starts: the timing is of decoding alone
    if args.method == "ngram":
        from ..ngram import NgramDraft

        draft = NgramDraft()
    elif args.method == "distilled":
        from ..distilled import load_distilled

        draft = load_distilled()
    elif args.method == "speculative":
        draft = load_pretrained("draft")
        draft.draft_step()  # part of loading it: the first step would build it otherwise
    elif args.method == "medusa":
        from ..medusa import load_heads, medusa_generate

        heads = load_heads(target=target)

    def decode(method: str):
        g = torch.Generator().manual_seed(args.seed)
        if method == "autoregressive":
            return generate(target, prompt, args.max_new_tokens, generator=g, **opts), None
        if draft is not None:
            return speculative_generate(
                target, draft, prompt, args.max_new_tokens, k=args.k, generator=g, **opts
            )
        return medusa_generate(target, heads, prompt, args.max_new_tokens, generator=g, **opts)

    t0 = time.perf_counter()
    out, stats = decode(args.method)
    dt = time.perf_counter() - t0
    print(tok.decode(out))
    print("-" * 60)
    print(
        f"{args.method}: {args.max_new_tokens} new characters in {dt:.2f}s "
        f"({args.max_new_tokens / dt:.0f} chars/s)"
    )
    if stats is not None:
        print(stats.summary())
    if args.compare:
        print(_compare(args, decode))
    return 0


def _compare(args, decode) -> str:
    from ..bench import time_round_robin

    if args.method == "autoregressive":
        return "--compare: --method autoregressive is plain decoding; nothing to compare"
    runs = {m: (lambda m=m: decode(m)) for m in (args.method, "autoregressive")}
    s = time_round_robin(runs, repeats=COMPARE_REPEATS)
    n = args.max_new_tokens
    ratio = s["autoregressive"] / s[args.method]
    verdict = (
        f"{args.method} is {ratio:.2f}x as fast as plain decoding"
        if ratio >= 1
        else f"plain decoding is faster: {args.method} runs at {ratio:.2f}x its speed"
    )
    return (
        f"on this machine (median of {COMPARE_REPEATS} round-robin runs each): "
        f"{args.method} {n / s[args.method]:.0f} chars/s, autoregressive "
        f"{n / s['autoregressive']:.0f} chars/s; {verdict}"
    )
