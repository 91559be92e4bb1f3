"""``specdec-course generate``: continue a prompt with the shipped models and print stats.

``--model char`` (the default) is the character pair and its drafts, here;
``--model smollm2`` is the real LLM (``cli.generate_llm``). Nothing heavy is imported until
the command runs: ``--help`` reads the stored bench's JSON itself (:func:`_recommendation`).
"""

from __future__ import annotations

import json
import math
import sys
import time

from . import set_threads

METHODS = {
    "autoregressive": "plain decoding: one target call per character (the baseline)",
    "speculative": "the 1-layer draft model proposes --k characters, the target verifies them",
    "ngram": "a counted character n-gram proposes --k characters (costs almost nothing)",
    "distilled": "the n-gram table distilled from the target proposes --k characters",
    "eagle": "an EAGLE-style layer over the target's features proposes --k characters",
    "fused": "the draft model, corrected by a head reading the target's feature, proposes --k",
    "recurrent": "a recurrent cell started from the target's feature proposes --k characters",
    "medusa": "Medusa heads on the target propose a tree of candidates",
}
# The real model's methods (``--model smollm2``), its proposers as ``llm.proposers`` names them.
LLM_METHODS = {
    "plain": (None, "plain decoding: one call of the model per token (the baseline)"),
    "lookup": ("prompt_lookup", "prompt lookup: copies what followed the text's last words"),
    "draft": ("feature_draft", "the small draft trained on the model's own outputs"),
}
# ``--method plain`` and ``--method draft`` for the character model too.
CHAR_ALIASES = {"plain": "autoregressive", "draft": "speculative"}
# The methods --k applies to.
DRAFTING = ("speculative", "ngram", "distilled", "eagle", "fused", "recurrent")
DEFAULT_K = 4  # speculative_generate's default: used when no stored bench says better
COMPARE_REPEATS = 5


def _recommendation() -> str:
    # From the stored bench, so that the help never contradicts what was measured. Read here
    # from the JSON (bench.compare.fastest_method's rule; tests/test_cli_fast.py checks that
    # both give the same sentence), since importing bench imports torch: seconds, for a help.
    from ..paths import results_dir

    names = {"draft": "speculative"}  # the record's method names, as --method spells them
    try:
        record = json.loads((results_dir() / "speedup_cpu.json").read_text())
        res = next(r for r in record["results"] if r.get("temperature") == 1.0)
        rows = [
            (r["measured_speedup"], f"--method {names.get(m, m)} --k {r['k']}")
            for m, rs in res["methods"].items()
            for r in rs
        ]
        rows += [
            (r["measured_speedup"], f"--method medusa tree {r['tree']}")
            for r in res.get("medusa", [])
        ]
        speedup, how = max(rows, key=lambda r: r[0])
    except (OSError, ValueError, KeyError, StopIteration):
        return "no stored CPU bench: run `specdec-course bench speedup` to see which is fastest"
    machine = record.get("machine", "unknown machine")
    if speedup <= 1.0:
        return (
            f"in the stored CPU bench ({machine}) no method beat plain decoding at "
            "temperature 1: use --method autoregressive"
        )
    return (
        f"fastest in the stored CPU bench ({machine}) at temperature 1: {how}, "
        f"{speedup:.2f}x plain decoding"
    )


def k_auto_supported() -> bool:
    """Whether ``speculative_generate`` takes ``k="auto"`` (``decoding.auto_k``: k chosen as
    the run goes from the costs and acceptance it measures). Imports the decoding package."""
    import importlib.util

    return importlib.util.find_spec("specdec_course.decoding.auto_k") is not None


def k_value(text: str):
    """``--k``: ``auto`` or an int (checked >= 1 when the command runs)."""
    import argparse

    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or auto; got {text!r}") from None


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="continue a prompt with the shipped models (the character pair, or SmolLM2)",
        description="Continue PROMPT with the shipped 4-layer character target (--model char), "
        "or answer it with SmolLM2-135M-Instruct, the chat template applied (--model smollm2, "
        "needs the [llm] extra), decoded by --method, and print the text (SmolLM2's streamed "
        "as it is committed, ending at its end of turn), its speed and (for speculative "
        "methods) acceptance statistics. Every method samples exactly the target's "
        "distribution; at --temperature 0 all give the same text. Timing runs on one thread "
        "unless --threads says otherwise, and the output says which.\n\n"
        "Methods of --model char:\n"
        + "".join(f"  {name:15s} {what}\n" for name, what in METHODS.items())
        + "  (plain and draft are other names of autoregressive and speculative)\n\n"
        "Methods of --model smollm2:\n"
        + "".join(f"  {name:15s} {what}\n" for name, (_, what) in LLM_METHODS.items())
        + f"\nWhich is fastest depends on the machine; for the character pair, "
        f"{_recommendation()}. --compare measures it here.",
    )
    p.add_argument(
        "prompt",
        nargs="?",
        default=None,
        help="text to continue; - reads it from stdin (default: 'ROMEO:\\n' for char; "
        "smollm2 reads stdin when it is not a terminal)",
    )
    p.add_argument(
        "--prompt",
        dest="prompt_option",
        metavar="TEXT",
        default=None,
        help="the prompt, as an option",
    )
    p.add_argument(
        "--model",
        choices=("char", "smollm2"),
        default="char",
        help="the shipped character pair, or SmolLM2-135M-Instruct (needs the [llm] extra)",
    )
    p.add_argument(
        "--method",
        choices=[*METHODS, *LLM_METHODS],
        default=None,
        help="decoding method (default: speculative for char, lookup for smollm2)",
    )
    p.add_argument(
        "--k",
        type=k_value,
        metavar="N|auto",
        default=None,
        help="drafts per iteration, an integer >= 1 or auto (speculative, ngram, distilled, "
        "the EAGLE-style drafts; lookup and draft for smollm2); never more are drafted than "
        "the tokens still to generate. Unset: for char, the k that the stored CPU bench "
        "measured fastest for the method at this temperature (data/results/); for smollm2, "
        "auto. The output says which k it used and why",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="tokens to generate, at most (default: 200 characters for char, 128 tokens for "
        "smollm2, which stops sooner at its end of turn)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 is greedy; otherwise a finite number >= 1e-6 (default: 1 for char, 0 for "
        "smollm2, so that --compare can check the text is identical)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads while decoding (default: 1, so that a busy machine's other work "
        "does not oversubscribe the timing)",
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
        "round-robin runs each for char, 3 for smollm2; same options), print both, say which "
        "is faster and whether the texts are identical",
    )
    p.set_defaults(run=run)


def resolve(args) -> None:
    """Fill in what the command line left to the model: the prompt (``--prompt``, the
    positional one, or stdin), the method, ``--max-new-tokens``, ``--temperature`` and the
    threads; ValueError for two prompts, an empty one or a method of the other model."""
    llm = args.model == "smollm2"
    if args.prompt is not None and args.prompt_option is not None:
        raise ValueError("give the prompt once: as PROMPT or as --prompt, not both")
    prompt = args.prompt if args.prompt_option is None else args.prompt_option
    if prompt == "-" or (prompt is None and llm and not sys.stdin.isatty()):
        prompt = sys.stdin.read()
    if prompt is None:
        if llm:
            raise ValueError("no prompt: give --prompt TEXT, or pipe the text on stdin")
        prompt = "ROMEO:\n"
    if prompt == "" or (llm and not prompt.strip()):  # a newline is a character prompt
        raise ValueError("the prompt is empty; give some text to continue, e.g. 'ROMEO:'")
    args.prompt = prompt
    if args.method is None:
        args.method = "lookup" if llm else "speculative"
    elif llm and args.method not in LLM_METHODS:
        raise ValueError(
            f"--method {args.method} is a method of the character model; --model smollm2 "
            f"takes {', '.join(LLM_METHODS)}"
        )
    elif not llm:
        if args.method == "lookup":
            raise ValueError(
                "--method lookup is SmolLM2's prompt lookup (--model smollm2); the character "
                "model's nearest is --method ngram"
            )
        args.method = CHAR_ALIASES.get(args.method, args.method)
    if args.max_new_tokens is None:
        args.max_new_tokens = 128 if llm else 200
    if args.temperature is None:
        args.temperature = 0.0 if llm else 1.0
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1; got {args.threads}")


def threads_line(args) -> str:
    """Which threads decode, and why (set by :func:`start_threads`)."""
    if args.threads is None:
        return "threads: 1 (timing runs on one thread unless --threads N says otherwise)"
    return f"threads: {args.threads} (--threads)"


def start_threads(args) -> None:
    set_threads(args.threads or 1)


def check_options(args) -> None:
    """The options both models share, in the words of the command line: the API's own errors
    would name its parameters (prompt_ids, max_new_tokens) instead."""
    from ..sampling import MIN_TEMPERATURE

    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0; got {args.max_new_tokens}")
    if isinstance(args.k, int) and args.k < 1:
        raise ValueError(f"--k must be >= 1; got {args.k}")
    t = args.temperature
    if not (math.isfinite(t) and (t == 0 or t >= MIN_TEMPERATURE)):
        raise ValueError(
            f"--temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}; got {t}"
        )
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1; got {args.top_k}")
    if args.top_p is not None and not (math.isfinite(args.top_p) and 0 < args.top_p <= 1):
        raise ValueError(f"--top-p must be in (0, 1]; got {args.top_p}")


def _check_args(args, block_size: int) -> None:
    check_options(args)
    total = len(args.prompt) + args.max_new_tokens
    if total > block_size:
        raise ValueError(
            f"the prompt ({len(args.prompt)} characters) and --max-new-tokens "
            f"({args.max_new_tokens}) make {total} characters, more than the {block_size} the "
            "models were trained on; shorten the prompt or lower --max-new-tokens"
        )


def _encode(tok, text: str):
    try:
        return tok.encode(text)
    except ValueError as e:
        raise ValueError(f"the prompt cannot be encoded: {e}") from None


def choose_setting(method: str, k: int | None, temperature: float) -> tuple[dict, str]:
    """The k (or Medusa tree) ``generate`` decodes with, and the sentence saying why.

    ``k`` is ``--k`` (None: unset). Returns ``({"k": int | None, "tree": str | None,
    "stored": stored_best's answer or None}, why)``."""
    from ..bench import stored_best

    if method == "autoregressive":
        why = "" if k is None else "--k does not apply to plain decoding"
        return {"k": None, "tree": None, "stored": None}, why
    try:
        best = stored_best(method, temperature)
    except (FileNotFoundError, ValueError, KeyError) as e:
        best, missing = None, str(e)
    if best is not None:
        at = f"temperature {best['temperature']:g}"
        if not best["exact"]:
            at += f", the stored temperature nearest to {temperature:g}"
        where = f"{best['record']} ({best['machine']}), {at}"
    if method == "medusa":
        unused = "" if k is None else " (--k does not apply: Medusa's tree sets its drafts)"
        if best is None:
            return {"k": None, "tree": "top4", "stored": None}, (
                f"tree top4: the default; no stored bench to choose from ({missing}){unused}"
            )
        return {"k": None, "tree": best["tree"], "stored": best}, (
            f"tree {best['tree']}: the fastest tree in the stored CPU bench, {where}: "
            f"{best['speedup']:.2f}x plain decoding there{unused}"
        )
    if k is not None:
        why = f"k = {k}: as --k gives it"
        if best is not None:
            why += f" (the stored CPU bench's best is k = {best['k']}, "
            why += f"{best['speedup']:.2f}x, {where})"
        return {"k": k, "tree": None, "stored": best}, why
    if best is None:
        return {"k": DEFAULT_K, "tree": None, "stored": None}, (
            f"k = {DEFAULT_K}: the default, since no stored bench says better ({missing}); "
            "--k sets it"
        )
    return {"k": best["k"], "tree": None, "stored": best}, (
        f"k = {best['k']}: the fastest k for --method {method} in the stored CPU bench, "
        f"{where}: {best['speedup']:.2f}x plain decoding there; --k overrides it"
    )


def run(args) -> int:
    resolve(args)
    check_options(args)  # before a model is loaded
    if args.model == "smollm2":
        from .generate_llm import run_llm

        return run_llm(args)
    import torch

    from ..data import CharTokenizer
    from ..decoding import generate, speculative_generate
    from ..model import load_pretrained

    auto_note = ""
    if args.k == "auto" and not k_auto_supported():
        args.k = None  # the stored bench's best (below) stands in for it
        auto_note = "--k auto: this version's speculative_generate has no k = auto; "
    start_threads(args)
    target = load_pretrained("target")
    _check_args(args, target.config.block_size)
    tok = CharTokenizer(target.vocab)
    prompt = _encode(tok, args.prompt)
    setting, why = choose_setting(args.method, args.k, args.temperature)
    k = setting["k"]
    opts = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    draft = heads = None  # built before the clock starts: the timing is of decoding alone
    if args.method in DRAFTING:  # the shipped chain drafts (bench.load_drafts)
        from ..bench import load_drafts
        from ..fast import draft_step

        name = "draft" if args.method == "speculative" else args.method
        draft = load_drafts(target, [name])[name]
        if name == "draft":
            draft_step(draft)  # part of loading it: the first step would build it otherwise
    elif args.method == "medusa":
        from ..bench import bench_trees
        from ..medusa import load_heads, medusa_generate

        # The heads and trees the stored bench measured: Hydra heads, trees built from their
        # measured acceptance (names such as top4, sample3), each with its kind of draft.
        heads = load_heads(target=target, kind="hydra")
        tree, tree_draft = bench_trees(heads, args.temperature)[setting["tree"]]

    def decode(method: str):
        g = torch.Generator().manual_seed(args.seed)
        if method == "autoregressive":
            return generate(target, prompt, args.max_new_tokens, generator=g, **opts), None
        if draft is not None:
            return speculative_generate(
                target, draft, prompt, args.max_new_tokens, k=k, generator=g, **opts
            )
        return medusa_generate(
            target,
            heads,
            prompt,
            args.max_new_tokens,
            tree=tree,
            draft=tree_draft,
            generator=g,
            **opts,
        )

    t0 = time.perf_counter()
    out, stats = decode(args.method)
    dt = time.perf_counter() - t0
    print(tok.decode(out))
    print("-" * 60)
    if args.compare:  # one speed figure per run: the warm round-robin one, below
        print(f"{args.method}: {args.max_new_tokens} new characters")
    else:
        print(
            f"{args.method}: {args.max_new_tokens} new characters in {dt:.2f}s "
            f"({args.max_new_tokens / max(dt, 1e-9):.0f} chars/s, one run, its warm-up "
            "included; --compare times warm runs against plain decoding)"
        )
    if why:
        print(auto_note + why)
    print(threads_line(args))
    if stats is not None:
        print(stats.summary())
    if args.compare:
        print(_compare(args, decode, setting))
    return 0


def _compare(args, decode, setting: dict) -> str:
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
    best = setting["stored"]
    stored = ""
    if best is not None:
        how = f"tree {setting['tree']}" if setting["k"] is None else f"k = {setting['k']}"
        at_best = setting["k"] == best["k"] and setting["tree"] == best["tree"]
        stored = (
            f" (the stored CPU bench measured {best['speedup']:.2f}x at {how})"
            if at_best
            else f" (the stored CPU bench's best, at k = {best['k']}, was {best['speedup']:.2f}x)"
        )
    return (
        f"on this machine (median of {COMPARE_REPEATS} round-robin runs each, after the run "
        "above: warm-up excluded): "
        f"{args.method} {n / s[args.method]:.0f} chars/s, autoregressive "
        f"{n / s['autoregressive']:.0f} chars/s; {verdict}{stored}"
    )
