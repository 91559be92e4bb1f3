"""``specdec-course generate``: continue a prompt with the shipped models and print stats."""

from __future__ import annotations

import time

import torch


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt with the shipped pair")
    p.add_argument("prompt", nargs="?", default="ROMEO:\n")
    p.add_argument(
        "--method",
        choices=["autoregressive", "speculative", "ngram", "medusa"],
        default="speculative",
    )
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..data import CharTokenizer
    from ..decoding import generate, speculative_generate
    from ..model import load_pretrained

    torch.set_num_threads(1)
    target = load_pretrained("target")
    tok = CharTokenizer(target.vocab)
    prompt = tok.encode(args.prompt)
    g = torch.Generator().manual_seed(args.seed)
    opts = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=g)
    draft = heads = None  # built before the clock starts: the timing is of decoding alone
    if args.method == "ngram":
        from ..ngram import NgramDraft

        draft = NgramDraft()
    elif args.method == "speculative":
        draft = load_pretrained("draft")
        draft.input_table()  # part of loading it: the first step would build it otherwise
    elif args.method == "medusa":
        from ..medusa import load_heads, medusa_generate

        heads = load_heads(target=target)
    t0 = time.perf_counter()
    if args.method == "autoregressive":
        out = generate(target, prompt, args.max_new_tokens, **opts)
        stats = None
    elif draft is not None:
        out, stats = speculative_generate(
            target, draft, prompt, args.max_new_tokens, k=args.k, **opts
        )
    else:
        out, stats = medusa_generate(target, heads, prompt, args.max_new_tokens, **opts)
    dt = time.perf_counter() - t0
    print(tok.decode(out))
    print("-" * 60)
    print(
        f"{args.method}: {args.max_new_tokens} new characters in {dt:.2f}s "
        f"({args.max_new_tokens / dt:.0f} chars/s)"
    )
    if stats is not None:
        print(stats.summary())
    return 0
