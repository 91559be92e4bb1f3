"""``specdec-course bench verifier|speedup``: benchmarks, reported as ratios in one run."""

from __future__ import annotations

import torch


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks, reported as ratios measured in one run",
        description="Benchmarks, reported as ratios measured in one run. "
        "Run `specdec-course bench speedup --help` or `bench verifier --help`.",
    )
    what = p.add_subparsers(dest="what", required=True, metavar="{speedup,verifier}")
    s = what.add_parser(
        "speedup",
        help="plain decoding against the draft model, the n-gram draft and Medusa, this CPU",
        description="Decode the same fixed validation prompts (200 new characters each) with "
        "plain decoding and with each method, round-robin, batch 1, one thread, at "
        "temperature 1 then 0; print every method's acceptance, tokens per target call, "
        "Theorem 3.8's predicted speedup and the measured one (a ratio of medians in this "
        "run), and the cost of one cached target forward over 1 to 16 new tokens. Writes "
        "speedup_cpu.json and speedup_cpu.png (the stored ones are in data/results/).\n\n"
        "Methods:\n"
        "  draft   the shipped 1-layer draft model, k = 1 ... 8 drafts per iteration\n"
        "  ngram   the counted character n-gram draft (lesson 07), k = 1 ... 8\n"
        "  medusa  Medusa heads on the target, chain, small and large trees (lesson 06)\n"
        "  all     all three",
    )
    s.add_argument(
        "--method",
        choices=["draft", "ngram", "medusa", "all"],
        default="all",
        help="which speculative methods to measure against plain decoding",
    )
    s.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="measure at this temperature only (default: 1, then 0)",
    )
    s.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="round-robin repeats; the median is kept (default: 5, or 2 with --quick)",
    )
    s.add_argument("--quick", action="store_true", help="k = 1 ... 4 only, fewer repeats")
    s.add_argument(
        "--out", default=None, help="folder for the JSON and PNG (default: data/results/)"
    )
    s.set_defaults(run=run)
    v = what.add_parser(
        "verifier",
        help="on a CUDA GPU: the Triton verifier against PyTorch and the memory roofline",
        description="On a CUDA GPU, time the Triton verifier kernels against the PyTorch "
        "reference over batch sizes, draft lengths and vocabularies, against the memory "
        "roofline, and write verifier-<gpu>-<date>.{json,csv,png}. Without a GPU, run a "
        "correctness sweep under the Triton interpreter instead (its speed says nothing "
        "about a GPU).",
    )
    v.add_argument("--quick", action="store_true", help="a small, fast sweep")
    v.add_argument(
        "--out", default=None, help="folder for JSON/CSV/PNG results (default: data/results/)"
    )
    v.set_defaults(run=run)


def run(args) -> int:
    if args.what == "verifier":
        return _verifier(args)
    return _speedup(args)


def _verifier(args) -> int:
    from .. import bench

    if not torch.cuda.is_available():
        print(
            "No CUDA device: the verifier benchmark needs a GPU (the Triton interpreter's "
            "speed says nothing about one).\nRunning a correctness sweep under the "
            "interpreter instead: Triton kernels against the PyTorch reference."
        )
        rows = bench.interpreter_sweep()
        for r in rows:
            print(
                f"  B={r['B']:2d} K={r['K']} V={r['V']:5d} {r['drafts']:11s} "
                f"identical tokens: {r['identical']}  accepted per row: {r['accepted']}"
            )
        if not all(r["identical"] for r in rows):
            raise ValueError("the Triton kernels disagree with the reference (see above)")
        print(
            "All identical. On a CUDA machine this command times the kernels and writes "
            "JSON/CSV/PNG results to data/results/."
        )
        return 0
    if args.quick:
        sweep = bench.QUICK
    else:
        sweep = {"batches": bench.BATCHES, "drafts": bench.DRAFTS, "vocabs": bench.VOCABS}
    cases, meta = bench.run_verifier_sweep(**sweep)
    paths = bench.save_verifier_results(cases, meta, args.out)
    print(f"peak bandwidth {meta['peak_gbps']} GB/s ({meta['peak_source']})")
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return 0


def _speedup(args) -> int:
    """Plain decoding against the draft model, the n-gram draft and Medusa on this CPU."""
    from .. import bench
    from ..data import CharTokenizer
    from ..model import load_pretrained

    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1; got {args.repeats}")
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 5)
    torch.set_num_threads(1)
    target = load_pretrained("target")
    prompts = bench.validation_prompts(CharTokenizer(target.vocab))
    wanted = {"all": ("draft", "ngram", "medusa")}.get(args.method, (args.method,))
    drafts = {}
    if "draft" in wanted:
        drafts["draft"] = load_pretrained("draft")
    if "ngram" in wanted:
        from ..ngram import NgramDraft

        drafts["ngram"] = NgramDraft()
    heads = None
    if "medusa" in wanted:
        from ..medusa import load_heads

        heads = load_heads(target=target)
    temps = [args.temperature] if args.temperature is not None else [1.0, 0.0]
    ks = (1, 2, 3, 4) if args.quick else bench.SPEEDUP_KS
    costs = bench.forward_costs(target, drafts.get("draft", target))
    print("cost of one cached forward (median):")
    for n, t, rel in zip(costs["sizes"], costs["target_s"], costs["target_rel"]):
        print(f"  target, {n:2d} new tokens: {t * 1e6:7.0f} us = {rel:.2f} x one token")
    results = []
    for temperature in temps:
        res = bench.measure_speedup(
            target,
            drafts,
            prompts,
            ks=ks,
            medusa_heads=heads,
            temperature=temperature,
            repeats=repeats,
            progress=True,
        )
        results.append(res)
        print(bench.format_speedup_table(res))
        if "medusa" in res:
            print(bench.format_medusa_table(res))
    command = f"specdec-course bench speedup --method {args.method}" + (
        " --quick" if args.quick else ""
    )
    for path in bench.save_speedup_results(costs, results, command, args.out):
        print(f"wrote {path}")
    return 0
