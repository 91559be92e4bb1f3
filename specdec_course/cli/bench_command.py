"""``specdec-course bench speedup|verifier|gpu|beyond|eagle``: benchmarks, ratios in one run
(``hf`` and ``roofline``, the GPU cost model, are in ``bench_models``)."""

from __future__ import annotations

from . import bench_llm, bench_models, set_threads
from .bench_models import add_out as _add_out
from .bench_models import checked

# The drafts that read the target's features (lesson 09b).
FEATURE_READERS = ("eagle", "fused", "recurrent")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks, reported as ratios measured in one run",
        description="Benchmarks, reported as ratios measured in one run. "
        "Run `specdec-course bench speedup --help` (or verifier, gpu, beyond, eagle, hf, "
        "roofline, llm) for each one.",
    )
    what = p.add_subparsers(
        dest="what", required=True, metavar="{speedup,verifier,gpu,beyond,eagle,hf,roofline,llm}"
    )
    s = what.add_parser(
        "speedup",
        help="plain decoding against the draft model, the n-gram drafts and Medusa, this CPU",
        description="Decode the same fixed validation prompts (200 new characters each) with "
        "each method, round-robin, batch 1, one thread, at temperature 1 then 0, every run "
        "beside a plain decoding run of the same prompt; print every method's acceptance, "
        "tokens per target call, Theorem 3.8's predicted speedup, the cost-aware one and the "
        "measured one (the median over repeats of the ratio to the plain runs beside it), "
        "and the cost of one cached target forward over 1 to 16 new tokens. Writes "
        "speedup_cpu.json and speedup_cpu.png to bench-results/, or with --record to "
        "data/results/, whose records `generate` and the lessons read.\n\n"
        "Methods:\n"
        "  draft   the shipped 1-layer draft model, k = 1 ... 8 drafts per iteration\n"
        "  ngram      the counted character n-gram draft (lesson 07), k = 1 ... 8\n"
        "  distilled  the n-gram table distilled from the target (lesson 07), k = 1 ... 8\n"
        "  medusa     Medusa heads on the target, chain, small and large trees (lesson 06b)\n"
        "  eagle      the EAGLE-style draft over the target's features (lesson 09b), k = 1 ... 8\n"
        "  fused      the draft model with a head reading the target's feature (lesson 09b)\n"
        "  recurrent  the recurrent EAGLE-style draft over the target's feature (lesson 09b)\n"
        "  all        all seven",
    )
    s.add_argument(
        "--method",
        choices=["draft", "ngram", "distilled", "medusa", "eagle", "fused", "recurrent", "all"],
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
        "--target-executor",
        choices=["torch", "numpy"],
        default="torch",
        help="run the target's steps as tensor ops (the loops' default) or in NumPy "
        "(fast.numpy_steps), in plain and speculative decoding alike; numpy writes "
        "speedup_cpu_numpy.{json,png}",
    )
    _add_out(s)
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
    _add_out(v)
    v.set_defaults(run=run)
    g = what.add_parser(
        "gpu",
        help="the one prepared GPU check: verifier sweep and speedups on a CUDA GPU",
        description="On a CUDA GPU: the verifier sweep (B, K, V) with do_bench, the byte "
        "model and the fraction of HBM peak, FlashInfer beside it when installed, and the "
        "speedup bench for the draft model, the n-gram draft and Medusa; writes "
        "{verifier,speedup,gpu_check}-<gpu>-<date>.* to bench-results/, or with --record to "
        "data/results/ (commit them there). With --dry the same "
        "steps run on the CPU at tiny sizes (the Triton interpreter), results to a "
        "temporary folder, so the check cannot rot. tools/gpu_check.sh wraps it.",
    )
    g.add_argument(
        "--dry",
        action="store_true",
        help="run the check on the CPU at tiny sizes (results to a temporary folder)",
    )
    _add_out(g)
    g.set_defaults(run=run)
    b = what.add_parser(
        "beyond",
        help="dynamic k, batch sizes and block verification on this CPU (lessons 08, 09)",
        description="Measure on this CPU, one thread: dynamic draft length (Hugging Face's "
        "heuristic, a confidence stop, an alpha/cost controller) against every fixed k; "
        "batched plain and speculative decoding for B = 1 ... 512 (the draft model and the "
        "distilled n-gram as drafts; a static batch and the steady state, decode phase) "
        "with the target's call costs and the ceiling they allow; block against token-wise "
        "verification. Writes "
        "beyond_cpu.json to bench-results/, or with --record to data/results/ (read by lessons "
        "08 and 09).",
    )
    b.add_argument("--quick", action="store_true", help="fewer batch sizes and repeats")
    b.add_argument(
        "--repeats", type=int, default=None, help="repeats (default: 5, or 2 with --quick)"
    )
    b.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (default: 1)"
    )
    _add_out(b)
    b.set_defaults(run=run)
    e = what.add_parser(
        "eagle",
        help="the EAGLE-style drafts against the draft model on this CPU (lesson 09b)",
        description="Decode the validation prompts with plain decoding, the 1-layer draft "
        "model and the three EAGLE-style drafts (eagle: one layer over the target's features; "
        "fused: the draft model corrected by the newest feature; recurrent: a cell started "
        "from it), k = 1 ... 16, one thread, round-robin; print each draft's best k, speedup "
        "and acceptance and write "
        "eagle_cpu.json to bench-results/, or with --record to data/results/ (read by lesson "
        "09).",
    )
    e.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="measure at this temperature only (default: 1, then 0)",
    )
    e.add_argument("--repeats", type=int, default=None, help="round-robin repeats (default: 5)")
    _add_out(e)
    e.set_defaults(run=run)
    bench_models.add_roofline(what, run)
    bench_models.add_hf(what)
    bench_llm.add_parser(what)  # the real LLM, in its own module


def run(args) -> int:
    checked(args)
    if args.what == "verifier":
        return _verifier(args)
    if args.what == "gpu":
        return _gpu(args)
    if args.what == "beyond":
        return _beyond(args)
    if args.what == "eagle":
        return _eagle(args)
    if args.what == "roofline":
        return bench_models.roofline(args)
    return _speedup(args)


def _gpu(args) -> int:
    """The GPU check (bench.gpu). A goal not met is a measured result, printed and stored,
    not an error: the exit status is 0 whenever the check ran."""
    from .. import bench

    summary = bench.run_gpu_check(dry=args.dry, out=args.out)
    print(bench.format_gpu_check(summary))
    for path in summary["files"]:
        print(f"wrote {path}")
    return 0


def _verifier(args) -> int:
    import torch

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
            "JSON/CSV/PNG results to bench-results/ (data/results/ with --record)."
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
    """Plain decoding against the draft model, the n-gram drafts and Medusa on this CPU."""
    from .. import bench
    from ..data import CharTokenizer
    from ..model import load_pretrained

    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1; got {args.repeats}")
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 5)
    set_threads(1)
    target = load_pretrained("target")
    prompts = bench.validation_prompts(CharTokenizer(target.vocab))
    wanted = {"all": ("draft", "ngram", "distilled", "medusa", *FEATURE_READERS)}.get(
        args.method, (args.method,)
    )
    if args.target_executor == "numpy" and {"medusa", *FEATURE_READERS} & set(wanted):
        # They read the target's hidden states (LeanStep.hidden), which are tensor ops.
        if args.method in ("medusa", *FEATURE_READERS):
            raise ValueError(
                f"--target-executor numpy times chain drafts only: {args.method}'s target "
                "calls read hidden states as tensor ops (LeanStep.hidden); measure it with "
                "the torch executor"
            )
        wanted = tuple(m for m in wanted if m not in ("medusa", *FEATURE_READERS))
        print("--target-executor numpy: Medusa and the EAGLE-style drafts left out (their")
        print("  target calls read hidden states as tensor ops)")
    drafts = bench.load_drafts(target, [m for m in wanted if m != "medusa"])
    heads = None
    if "medusa" in wanted:
        from ..medusa import load_heads

        heads = load_heads(target=target, kind="hydra")  # the shipped file's Hydra heads
    temps = [args.temperature] if args.temperature is not None else [1.0, 0.0]
    ks = (1, 2, 3, 4) if args.quick else bench.SPEEDUP_KS
    # Every target step in both arms (plain and speculative decoding) runs on this executor.
    costs = bench.forward_costs(target, drafts.get("draft", target), executor=args.target_executor)
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
            executor=args.target_executor,
        )
        results.append(res)
        print(bench.format_speedup_table(res))
        if "medusa" in res:
            print(bench.format_medusa_table(res))
    command = f"specdec-course bench speedup --method {args.method}" + (
        " --quick" if args.quick else ""
    )
    if args.repeats is not None:
        command += f" --repeats {args.repeats}"
    numpy_target = args.target_executor == "numpy"
    if numpy_target:
        command += " --target-executor numpy"
    name = "speedup_cpu_numpy" if numpy_target else None
    for path in bench.save_speedup_results(costs, results, command, args.out, name=name):
        print(f"wrote {path}")
    return 0


def _eagle(args) -> int:
    """The EAGLE-style drafts against the draft model at temperature 1 and 0 (lesson 09b)."""
    from .. import bench

    set_threads(1)
    temps = (args.temperature,) if args.temperature is not None else (1.0, 0.0)
    record = bench.measure_eagle(temperatures=temps, repeats=args.repeats or 5)
    print(f"load average {record['load_before']:.1f} before, {record['load_after']:.1f} after")
    for run in record["runs"]:
        for name, m in run["methods"].items():
            print(
                f"  T={run['temperature']:g} {name:6s} best k={m['best_k']} "
                f"{m['best_speedup']:.2f}x, alpha {m['alpha_at_best']:.3f}"
            )
    print(f"wrote {bench.save_eagle_results(record, args.out)}")
    return 0


def _beyond(args) -> int:
    """Dynamic k, the batch-size regime and block verification on this CPU (lessons 08, 09)."""
    import torch

    from .. import bench
    from ..data import CharTokenizer
    from ..drafts.distilled import load_distilled
    from ..model import load_pretrained

    set_threads(1)
    target, draft = load_pretrained("target"), load_pretrained("draft")
    tok = CharTokenizer(target.vocab)
    prompts = bench.validation_prompts(tok)
    repeats = args.repeats or (2 if args.quick else 5)
    temperature = 1.0 if args.temperature is None else args.temperature
    costs = bench.forward_costs(target, draft)
    c = bench.marginal_cost(costs)
    print(f"one more draft costs c = {c:.3f} target steps")
    dyn = bench.measure_dynamic(
        target, draft, prompts, c=c, temperature=temperature, repeats=2 * repeats
    )
    for r in dyn["rows"]:
        print(f"  {r['name']:22s} mean k {r['mean_k']:.2f}  speedup {r['speedup']:.2f}x")
    sizes = bench.BATCH_SIZES[:4] if args.quick else bench.BATCH_SIZES
    min_tokens = 0 if args.quick else 4096  # small B: cheap rounds, the noisiest: more of them
    calls = bench.batch_call_costs(target, draft, sizes)
    batch_prompts = torch.stack(bench.validation_prompts(tok, n=max(sizes)))
    batch = bench.measure_batch(
        target,
        draft,
        batch_prompts,
        batch_sizes=sizes,
        temperature=temperature,
        repeats=max(2, repeats - 2),
        min_tokens=min_tokens,
    )
    ceiling = bench.batch_ceiling(batch, calls)
    _print_batch("draft model", batch, ceiling, calls)
    # The same loop with the distilled n-gram as its draft: drafting is a table look-up per
    # row, so the target call's growth with B is all that is left to price.
    ngram = load_distilled()
    ng_calls = bench.batch_call_costs(target, ngram, sizes, sizes=(1, 2, 3, 5, 7))
    ng_batch = bench.measure_batch(
        target,
        ngram,
        batch_prompts,
        batch_sizes=sizes,
        ks=(1, 2, 4, 6),
        temperature=temperature,
        repeats=max(2, repeats - 2),
        min_tokens=min_tokens,
    )
    ng_ceiling = bench.batch_ceiling(ng_batch, ng_calls)
    _print_batch("distilled n-gram", ng_batch, ng_ceiling, ng_calls)
    block = bench.measure_block(target, draft, prompts, runs=2 if args.quick else 5)
    for r in block["rows"]:
        print(
            f"  k={r['k']} accepted per call: token-wise {r['token_accepted']:.3f}, "
            f"block {r['block_accepted']:.3f} ({r['gain']:.3f}x)"
        )
    command = "specdec-course bench beyond" + (" --quick" if args.quick else "")
    record = {
        "forward_costs": costs,
        "dynamic": dyn,
        "batch_call_costs": calls,
        "batch": batch,
        "batch_ceiling": ceiling,
        "batch_ngram_call_costs": ng_calls,
        "batch_ngram": ng_batch,
        "batch_ngram_ceiling": ng_ceiling,
        "block": block,
    }
    print(f"wrote {bench.save_beyond_results(record, command, args.out)}")
    return 0


def _print_batch(name: str, batch: dict, ceiling: dict, calls: dict) -> None:
    print(f"batched speculation, {name} as the draft (best k of each kind of run):")
    for r, c_row, ratio in zip(batch["rows"], ceiling["rows"], calls["ratio"]):
        k = str(r["best_steady_k"])
        lo, hi = r["steady_spread"][k]
        print(
            f"  B={r['B']:3d} plain {r['plain_tok_s']:8.0f} tok/s | static batch "
            f"{r['best_speedup']:.2f}x (k={r['best_k']}) | steady state "
            f"{r['best_steady_speedup']:.2f}x (k={k}; rounds {lo:.2f}..{hi:.2f} over "
            f"{r['rounds']}; a static batch's rows busy "
            f"{r['utilization'][k]:.2f}) | ceiling "
            f"{c_row['best_ceiling']:.2f}x (k={c_row['best_k']}) | measured/ceiling "
            f"{r['best_steady_speedup'] / c_row['best_ceiling']:.2f} | in-loop ceiling "
            f"{c_row['best_ceiling_in_loop']:.2f}x, measured/in-loop "
            f"{r['best_steady_speedup'] / c_row['best_ceiling_in_loop']:.2f} | largest call = "
            f"{ratio:.2f} x one token"
        )
    print(
        f"  speculation stops paying at B = {batch['crossover_B']} (static batch), "
        f"{batch['steady_crossover_B']} (steady state), {ceiling['crossover_B']} (ceiling); "
        "None: it pays at every B measured"
    )
