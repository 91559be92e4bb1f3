"""Hugging Face ``generate`` against the package's loops on the same pair (``bench hf``).

One run, one thread, batch 1: the shipped target and draft, exported to ``GPT2LMHeadModel``
(``specdec_course.hf``), decode the same validation prompts (``bench.validation_prompts``)
for the same number of new characters with every method, in an order that rotates from
prompt to prompt and repeat to repeat, so that a shared machine's drift slows every method
alike. Methods:

- Hugging Face: plain ``generate``; assisted by the exported draft with a fixed ``k``
  (constant schedule, no confidence stop), with HF's heuristic schedule (+2 after a fully
  accepted proposal, else -1, from 5) and with HF's defaults untouched (its number of
  assistant tokens and its confidence stop); prompt lookup decoding.
- The package: plain ``decoding.generate``; ``speculative_generate`` with the draft model,
  the counted n-gram (``NgramDraft``) and the distilled n-gram, each at the ``k`` that was
  best for it in the stored ``bench speedup`` record at that temperature.

Both sides run under ``devices.native_cpu_kernels`` (oneDNN off), which the package's loops
set for themselves: the same kernels, so the race measures the loops. Speedups are medians
over repeats of each repeat's ratio (times summed over the prompts): over the side's own
plain decoding and over HF's plain ``generate``. At temperature 0 every method's tokens are
compared with the package's plain decoding (``identical`` in the record).

Where the per-token time goes: one more run of each plain decoder, of HF's assisted
generation with a fixed ``k`` and of each side's fastest speculative method under
``cProfile``, its self time split by where it was spent (torch's operators; the generation
loop, the cache, the masks and the modelling code of transformers; ``nn.Module`` calls; the
package's own Python), with calls and model forwards per new token. cProfile adds a cost to
every Python call, so its split is read as shares, beside the unprofiled time per token of
the race.

``save_hf_results`` writes ``data/results/hf_cpu.json`` and ``hf_cpu.png``;
``load_hf_results`` reads the record back (lesson 10).
"""

from __future__ import annotations

import cProfile
import importlib.util
import pstats
import statistics
import time
from pathlib import Path

import torch

from ..devices import native_cpu_kernels
from .records import load_record, save_figure, save_record
from .speedup import validation_prompts
from .speedup_record import best_row, load_speedup_results

__all__ = [
    "HF_METHODS",
    "PACKAGE_METHODS",
    "race_ks",
    "build_race",
    "measure_hf_race",
    "profile_methods",
    "measure_hf",
    "format_hf_table",
    "plot_hf",
    "save_hf_results",
    "load_hf_results",
]

RESULTS_FILE = "hf_cpu.json"
COMMAND = "specdec-course bench hf"
HF_METHODS = (
    "hf plain",
    "hf assisted, fixed k",
    "hf assisted, heuristic",
    "hf assisted, defaults",
    "hf prompt lookup",
)
PACKAGE_METHODS = ("plain", "draft model", "n-gram", "distilled n-gram")
HEURISTIC_START = 5  # HF's original num_assistant_tokens, where its heuristic starts


def race_ks(temperature: float, record: dict | None = None) -> dict:
    """Drafts per iteration for each speculative method at ``temperature``: the package's
    methods take the ``k`` best for them in the stored ``bench speedup`` record (the nearest
    temperature it holds); HF's fixed-``k`` assistant takes the draft model's, its prompt
    lookup the counted n-gram's (both are the same kind of draft)."""
    record = record or load_speedup_results()
    res = min(record["results"], key=lambda r: abs(r["temperature"] - temperature))
    k = {m: best_row(res, m)["k"] for m in ("draft", "ngram", "distilled")}
    return {
        "draft model": k["draft"],
        "n-gram": k["ngram"],
        "distilled n-gram": k["distilled"],
        "hf assisted, fixed k": k["draft"],
        "hf assisted, heuristic": HEURISTIC_START,
        "hf prompt lookup": k["ngram"],
    }


def build_race(target, draft, ngram, distilled, hf_target, hf_draft, ks: dict) -> dict:
    """``{method: fn(prompt, max_new_tokens, temperature, seed) -> ids}`` for every method
    (``HF_METHODS`` then ``PACKAGE_METHODS``), with the drafts per iteration ``ks``
    (:func:`race_ks`)."""
    from ..decoding import generate, speculative_generate
    from ..hf import hf_generate

    def hf_run(**opts):
        def run(prompt, n, temperature, seed):
            return hf_generate(hf_target, prompt, n, temperature=temperature, seed=seed, **opts)

        return run

    def spec(d, k):
        def run(prompt, n, temperature, seed):
            g = torch.Generator().manual_seed(seed)
            return speculative_generate(
                target, d, prompt, n, k=k, temperature=temperature, generator=g
            )[0]

        return run

    def plain(prompt, n, temperature, seed):
        return generate(target, prompt, n, temperature=temperature, generator=_gen(seed))

    return {
        "hf plain": hf_run(),
        "hf assisted, fixed k": hf_run(
            assistant=hf_draft, mode="fixed", k=ks["hf assisted, fixed k"]
        ),
        "hf assisted, heuristic": hf_run(
            assistant=hf_draft, mode="heuristic", k=ks["hf assisted, heuristic"]
        ),
        "hf assisted, defaults": hf_run(assistant=hf_draft, mode="default"),
        "hf prompt lookup": hf_run(prompt_lookup=ks["hf prompt lookup"]),
        "plain": plain,
        "draft model": spec(draft, ks["draft model"]),
        "n-gram": spec(ngram, ks["n-gram"]),
        "distilled n-gram": spec(distilled, ks["distilled n-gram"]),
    }


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _side(name: str) -> str:
    return "hf" if name.startswith("hf ") else "package"


def measure_hf_race(
    methods: dict,
    prompts,
    *,
    temperature: float,
    repeats: int = 3,
    max_new_tokens: int = 200,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """Every method in ``methods`` (:func:`build_race`) on every prompt, ``repeats`` times,
    in rotating order; returns ``{"temperature", "rows": [...], "identical"}``.

    A row: ``method``, ``side``, ``tokens_s`` (new tokens per second, from the median over
    repeats of the seconds summed over the prompts), ``token_us`` (its inverse),
    ``speedup_own_plain`` and ``speedup_hf_plain`` (medians over repeats of the ratio to
    the plain runs of the same repeat). ``identical`` (temperature 0): each method's tokens
    equal the package's plain decoding on every prompt."""
    names = list(methods)
    secs = {m: [0.0] * repeats for m in names}
    identical = {m: True for m in names}
    bar = range(repeats)
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(bar, desc=f"bench hf T={temperature}")
    with native_cpu_kernels():
        for m in names:  # untimed: first calls build what later ones reuse
            methods[m](prompts[0], min(max_new_tokens, 16), temperature, seed)
        for rep in bar:
            for i, prompt in enumerate(prompts):
                shift = (rep * len(prompts) + i) % len(names)
                order = names[shift:] + names[:shift]
                run_seed = seed + 1000 * rep + i
                outs = {}
                for m in order:
                    t0 = time.perf_counter()
                    outs[m] = methods[m](prompt, max_new_tokens, temperature, run_seed)
                    secs[m][rep] += time.perf_counter() - t0
                if temperature == 0 and "plain" in outs:
                    for m in names:
                        identical[m] &= torch.equal(outs[m].cpu(), outs["plain"].cpu())
    n_new = len(prompts) * max_new_tokens
    med = statistics.median
    rows = []
    for m in names:
        own = "hf plain" if _side(m) == "hf" else "plain"
        s = med(secs[m])
        rows.append(
            {
                "method": m,
                "side": _side(m),
                "tokens_s": n_new / s,
                "token_us": 1e6 * s / n_new,
                "speedup_own_plain": med(b / t for b, t in zip(secs[own], secs[m])),
                "speedup_hf_plain": med(b / t for b, t in zip(secs["hf plain"], secs[m])),
                "seconds": secs[m],
            }
        )
    out = {
        "temperature": temperature,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "rows": rows,
    }
    if temperature == 0:
        out["identical"] = identical
    return out


def _best(rows: list[dict], side: str) -> dict:
    """The fastest speculative method of ``side``."""
    spec = [r for r in rows if r["side"] == side and r["method"] not in ("plain", "hf plain")]
    return max(spec, key=lambda r: r["tokens_s"])


# Where cProfile's self time goes, by the file that spent it (first match wins).
_PLACES = (
    ("transformers/generation/", "HF generation loop (generation/)"),
    ("transformers/cache_utils", "HF KV cache (cache_utils)"),
    ("transformers/masking_utils", "HF attention masks (masking_utils)"),
    ("transformers/", "HF modelling code (models/, modeling_utils, utils)"),
    ("torch/nn/modules", "nn.Module calls"),
    ("specdec_course/", "package Python"),
    ("torch/", "torch Python (other)"),
)
TORCH_OPS = "torch operators (C++)"


def _place(key) -> str:
    file, _, func = key
    if file == "~":
        return TORCH_OPS if "torch" in func else "Python builtins"
    path = file.replace("\\", "/")
    for needle, name in _PLACES:
        if needle in path:
            return name
    return "other Python"


def _count_forwards(model):
    calls = [0]

    def hook(*_):
        calls[0] += 1

    return calls, model.register_forward_hook(hook)


def profile_methods(
    methods: dict, names, prompt, *, temperature, max_new_tokens=200, seed=0, forwards=None
) -> dict:
    """One run of each method in ``names`` under cProfile (after one unprofiled warm-up
    run): ``{method: {"profiled_token_us", "seconds_per_token": {place: s}, "share":
    {place: fraction}, "python_calls_per_token", "torch_op_calls_per_token",
    "forwards_per_token": {model: calls}}}``. ``forwards`` maps a name to a module whose
    forward calls are counted (e.g. the HF target and draft)."""
    out = {}
    with native_cpu_kernels():
        for m in names:
            fn = methods[m]
            fn(prompt, max_new_tokens, temperature, seed)  # warm-up
            counters = {k: _count_forwards(v) for k, v in (forwards or {}).items()}
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            fn(prompt, max_new_tokens, temperature, seed)
            prof.disable()
            wall = time.perf_counter() - t0
            for _, handle in counters.values():
                handle.remove()
            st = pstats.Stats(prof).stats  # key -> (cc, ncalls, tottime, cumtime, callers)
            per = {}
            py_calls = op_calls = 0
            for key, (_, ncalls, tottime, _, _) in st.items():
                place = _place(key)
                per[place] = per.get(place, 0.0) + tottime
                if place == TORCH_OPS:
                    op_calls += ncalls
                elif key[0] != "~":
                    py_calls += ncalls
            total = sum(per.values())
            n = max_new_tokens
            out[m] = {
                "profiled_token_us": 1e6 * wall / n,
                "seconds_per_token": {
                    p: s / n for p, s in sorted(per.items(), key=lambda x: -x[1])
                },
                "share": {p: s / total for p, s in sorted(per.items(), key=lambda x: -x[1])},
                "python_calls_per_token": py_calls / n,
                "torch_op_calls_per_token": op_calls / n,
                "forwards_per_token": {k: c[0] / n for k, (c, _) in counters.items()},
            }
    return out


def measure_hf(
    *,
    temperatures=(0.0, 1.0),
    repeats: int = 5,
    max_new_tokens: int = 200,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """The whole ``bench hf`` record on the shipped pair (see the module docstring):
    ``{"versions", "runs": [race per temperature, with "ks", "best_package", "best_hf",
    "package_over_hf" and "profile"]}``."""
    import transformers

    from .. import hf
    from ..data import CharTokenizer
    from ..drafts.distilled import load_distilled
    from ..drafts.ngram import NgramDraft
    from ..model import load_pretrained

    target, draft = load_pretrained("target"), load_pretrained("draft")
    ngram, distilled = NgramDraft(), load_distilled()
    hf_target, hf_draft = hf.to_hf(target), hf.to_hf(draft)
    prompts = validation_prompts(CharTokenizer(target.vocab))
    speedup_record = load_speedup_results()
    runs = []
    for temperature in temperatures:
        ks = race_ks(temperature, speedup_record)
        methods = build_race(target, draft, ngram, distilled, hf_target, hf_draft, ks)
        race = measure_hf_race(
            methods,
            prompts,
            temperature=temperature,
            repeats=repeats,
            max_new_tokens=max_new_tokens,
            seed=seed,
            progress=progress,
        )
        best_pkg, best_hf = _best(race["rows"], "package"), _best(race["rows"], "hf")
        race["ks"] = ks
        race["best_package"] = best_pkg["method"]
        race["best_hf"] = best_hf["method"]
        race["package_over_hf"] = best_pkg["tokens_s"] / best_hf["tokens_s"]
        # HF's plain and assisted (fixed k) decoding, its fastest speculative method, and
        # the package's plain decoding and fastest method.
        profiled = ["hf plain", "hf assisted, fixed k", best_hf["method"], "plain"]
        profiled = list(dict.fromkeys(profiled + [best_pkg["method"]]))
        race["profile"] = profile_methods(
            methods,
            profiled,
            prompts[0],
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            seed=seed,
            forwards={"hf target": hf_target, "hf draft": hf_draft},
        )
        runs.append(race)
    return {
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        # With scikit-learn installed, HF retunes the assistant's confidence threshold as it
        # goes (its "defaults" row); without it the threshold stays at its default.
        "scikit_learn": importlib.util.find_spec("sklearn") is not None,
        "threads": torch.get_num_threads(),
        "runs": runs,
    }


def format_hf_table(race: dict) -> str:
    """One temperature's race as a text table, fastest first within each side."""
    lines = [
        f"temperature {race['temperature']:g}: {race['prompts']} prompts x "
        f"{race['max_new_tokens']} characters, median of {race['repeats']}",
        f"{'method':24s} | {'k':>2s} | tokens/s | us/token | vs own plain | vs HF plain",
        "-" * 25 + "+----+----------+----------+--------------+------------",
    ]
    ks = race.get("ks", {})
    for r in race["rows"]:
        k = ks.get(r["method"])
        lines.append(
            f"{r['method']:24s} | {'' if k is None else k:>2} | {r['tokens_s']:8.0f} | "
            f"{r['token_us']:8.0f} | {r['speedup_own_plain']:11.2f}x | "
            f"{r['speedup_hf_plain']:9.2f}x"
        )
    if "package_over_hf" in race:
        lines.append(
            f"best package method ({race['best_package']}) over best HF speculative method "
            f"({race['best_hf']}): {race['package_over_hf']:.1f}x the tokens per second"
        )
    return "\n".join(lines)


def plot_hf(record: dict):
    """Tokens per second of every method, one panel per temperature (log scale)."""
    import matplotlib.pyplot as plt

    runs = record["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 3.6), squeeze=False)
    for ax, race in zip(axes[0], runs):
        rows = race["rows"]
        colors = ["tab:orange" if r["side"] == "hf" else "tab:blue" for r in rows]
        ax.barh([r["method"] for r in rows], [r["tokens_s"] for r in rows], color=colors)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set(
            xlabel="new characters per second (one thread)",
            title=f"temperature {race['temperature']:g}: HF (orange), package (blue)",
        )
    fig.tight_layout()
    return fig


def save_hf_results(record: dict, command: str = COMMAND, out: str | Path | None = None):
    """Write ``hf_cpu.json`` (with the command, machine and date) and ``hf_cpu.png`` to
    ``out`` (default data/results/). Returns the two paths."""
    path = save_record(RESULTS_FILE, command, record, out)
    return [path, save_figure(lambda: plot_hf(record), path.with_suffix(".png"))]


def load_hf_results(directory: str | Path | None = None) -> dict:
    """The stored ``bench hf`` record (``data/results/hf_cpu.json``)."""
    return load_record(RESULTS_FILE, COMMAND, directory)
