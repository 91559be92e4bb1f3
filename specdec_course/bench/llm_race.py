"""The real LLM's speedups: every proposer on three prompt sets, and the race against
Hugging Face and llama.cpp on the same weights.

- :func:`proposer_speedups`: plain ``decoding.generate`` against ``speculative_generate``
  with each proposer and draft length ``k``, at temperature 0 and 1, on each prompt set
  (``llm.prompts.PROMPT_SETS``: grounded, chat, code), interleaved prompt by prompt (plain,
  then every proposer and k, on the same prompt before the next). Each answer ends at the
  model's end of turn (``stop_ids``) or after ``max_new_tokens``; a cell's speedup is its
  tokens per second over plain decoding's on the set (the same tokens at temperature 0); its
  tokens per call and ``accepted_share`` (drafts accepted over drafts proposed, not the
  acceptance rate alpha) are summed over the set's prompts.
- :func:`hf_race`: Hugging Face ``generate`` on the same dequantized weights
  (``llm.distill.hf_model``), plain and with ``prompt_lookup_num_tokens``, greedy, and
  llama.cpp through ``llama-cpp-python`` (plain and its ``LlamaPromptLookupDecoding``) on
  the GGUF file itself, where it is installed; each side's speedup is over its own plain
  decoding, and each side's speculative text is compared with its own plain text.
- :func:`plot_call_costs`, :func:`plot_llm` / :func:`save_llm_plot`: the record drawn
  (``llm_cpu.png`` beside ``llm_cpu.json``): the call-cost curves of both models (lesson 11
  draws them too), and each proposer's best speedup.
"""

from __future__ import annotations

import time

import torch

from .. import decoding

__all__ = [
    "grounding",
    "proposer_speedups",
    "best_k",
    "hf_race",
    "load_llm_results",
    "plot_call_costs",
    "plot_llm",
    "save_llm_plot",
]


def _chat(tok, text):
    return torch.tensor(tok.apply_chat_template([{"role": "user", "content": text}]))


def proposer_speedups(
    model,
    tok,
    proposers: dict,
    prompt_sets: dict,
    *,
    temperatures=(0.0, 1.0),
    ks=(2, 4, 8),
    max_new_tokens: int = 64,
    seed: int = 0,
    clock=time.perf_counter,
    log=None,
    stop_ids=None,
    progress=None,
) -> list[dict]:
    """One row per (set, temperature, proposer, k): ``speedup``, ``tokens_per_call``,
    ``accepted_share`` (drafts accepted over drafts proposed), ``plain_tok_s``,
    ``spec_tok_s``, ``tokens`` and, at temperature 0, ``identical`` (every
    prompt's speculative text equal to its plain greedy text). ``stop_ids`` (the
    tokenizer's ``stop_ids``) end each answer at its end of turn; ``progress()``, if given,
    is called after every decoding run."""
    rows = []
    for set_name, prompts in prompt_sets.items():
        for T in temperatures:
            cells: dict = {}
            plain_s, plain_n = 0.0, 0
            for i, text in enumerate(prompts):
                ids = _chat(tok, text)
                g = torch.Generator().manual_seed(seed + i)
                t0 = clock()
                ref = decoding.generate(
                    model, ids, max_new_tokens, temperature=T, generator=g, stop_ids=stop_ids
                )
                plain_s += clock() - t0
                plain_n += ref.numel() - ids.numel()
                if progress is not None:
                    progress()
                for name, prop in proposers.items():
                    for k in ks:
                        g = torch.Generator().manual_seed(seed + i)
                        t0 = clock()
                        out, st = decoding.speculative_generate(
                            model,
                            prop,
                            ids,
                            max_new_tokens,
                            k=k,
                            temperature=T,
                            generator=g,
                            stop_ids=stop_ids,
                        )
                        c = cells.setdefault(
                            (name, k), dict(s=0.0, n=0, calls=0, acc=0, drafted=0, same=True)
                        )
                        c["s"] += clock() - t0
                        c["n"] += st.emitted
                        c["calls"] += st.target_calls
                        c["acc"] += st.accepted
                        c["drafted"] += st.drafted
                        c["same"] &= bool(torch.equal(out, ref))
                        if progress is not None:
                            progress()
            for (name, k), c in cells.items():
                row = dict(
                    set=set_name,
                    temperature=T,
                    proposer=name,
                    k=k,
                    speedup=(c["n"] / c["s"]) / (plain_n / plain_s),
                    tokens_per_call=c["n"] / max(c["calls"], 1),
                    # accepted over drafted: not the acceptance rate alpha (a proposal's drafts
                    # after its first rejection count as drafted but were never tried)
                    accepted_share=c["acc"] / max(c["drafted"], 1),
                    plain_tok_s=plain_n / plain_s,
                    spec_tok_s=c["n"] / c["s"],
                    tokens=c["n"],
                )
                if T == 0:
                    row["identical"] = c["same"]
                rows.append(row)
                if log:
                    log(
                        f"{set_name:8s} T={T:g} {name:13s} k={k}: {row['speedup']:.2f}x, "
                        f"{row['tokens_per_call']:.2f} tokens/call, "
                        f"{row['accepted_share']:.2f} of drafts accepted"
                    )
    return rows


def grounding(
    model, tok, prompts: list[str], *, max_new_tokens: int = 64, n: int = 4, progress=None
) -> list:
    """For each prompt, the share of the model's plain greedy answer (up to its end of turn,
    at most ``max_new_tokens`` tokens) that lies in runs of ``n`` tokens found in the prompt:
    how much of the answer the prompt grounds (``llm.prompts`` chose its grounded set by it).
    ``progress()``, if given, is called after each prompt."""
    shares = []
    for text in prompts:
        ids = _chat(tok, text)
        answer = decoding.generate(
            model, ids, max_new_tokens, temperature=0, stop_ids=tok.stop_ids
        )[ids.numel() :]
        a = [t for t in answer.tolist() if t not in tok.stop_ids]
        p = ids.tolist()
        runs = {tuple(p[j : j + n]) for j in range(len(p) - n + 1)}
        covered = set()
        for j in range(len(a) - n + 1):
            if tuple(a[j : j + n]) in runs:
                covered.update(range(j, j + n))
        shares.append(round(len(covered) / max(len(a), 1), 3))
        if progress is not None:
            progress()
    return shares


def best_k(rows: list[dict]) -> list[dict]:
    """The fastest ``k`` of each (set, temperature, proposer), one row each."""
    best: dict = {}
    for r in rows:
        key = (r["set"], r["temperature"], r["proposer"])
        if key not in best or r["speedup"] > best[key]["speedup"]:
            best[key] = r
    return list(best.values())


def _hf_greedy(hf, ids, n, stop_ids, **kw):
    with torch.inference_mode():
        out = hf.generate(
            ids[None],
            attention_mask=torch.ones_like(ids[None]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=list(stop_ids),
            pad_token_id=2,
            **kw,
        )
    return out[0, ids.numel() :]


def hf_race(
    tok,
    prompts: list[str],
    *,
    max_new_tokens: int = 64,
    k: int = 8,
    clock=time.perf_counter,
    model=None,
    progress=None,
) -> dict:
    """``{"hf": {...}, "llama_cpp": {...}}``: each side's plain and prompt-lookup tokens/s on
    ``prompts`` (greedy, at most ``max_new_tokens`` each, ending at the end of turn,
    ``tok.stop_ids``; interleaved prompt by prompt), its speedup over its own plain decoding
    and whether its speculative texts equal its plain ones. A side that is not installed is
    ``{"skipped": reason}``. ``progress()``, if given, is called after each prompt of each."""
    stop = tok.stop_ids
    from ..llm import distill, gguf_path

    out: dict = {}
    try:
        hf = distill.hf_model(torch.float32) if model is None else model
    except ImportError as e:
        out["hf"] = {"skipped": f"transformers is not installed ({e}): pip install -e '.[hf]'"}
    else:
        plain = spec = 0.0
        n = 0
        same = True
        for text in prompts:
            ids = _chat(tok, text)
            t0 = clock()
            a = _hf_greedy(hf, ids, max_new_tokens, stop)
            t1 = clock()
            b = _hf_greedy(hf, ids, max_new_tokens, stop, prompt_lookup_num_tokens=k)
            spec += clock() - t1
            plain += t1 - t0
            n += a.numel()
            same &= bool(torch.equal(a, b))
            if progress is not None:
                progress()
        # the same tokens in both when identical (greedy): a ratio of times
        out["hf"] = dict(
            plain_tok_s=n / plain, lookup_tok_s=n / spec, speedup=plain / spec, identical=same
        )
    try:
        from llama_cpp import Llama as LlamaCpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        out["llama_cpp"] = {
            "skipped": "llama-cpp-python is not installed (pip install "
            "llama-cpp-python builds llama.cpp from source, about 10 minutes)"
        }
        return out
    path = str(gguf_path())
    threads = torch.get_num_threads()
    plain_m = LlamaCpp(path, n_ctx=2048, n_threads=threads, verbose=False)
    spec_m = LlamaCpp(
        path,
        n_ctx=2048,
        n_threads=threads,
        verbose=False,
        logits_all=True,
        draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k),
    )
    plain = spec = 0.0
    n = 0
    same = True
    for text in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": text}])
        texts = []
        for m in (plain_m, spec_m):
            m.reset()
            t0 = clock()
            toks = []
            for t in m.generate(ids, top_k=1, temp=0.0, reset=True):
                toks.append(t)
                if len(toks) == max_new_tokens or t in stop:
                    break
            dt = clock() - t0
            texts.append(toks)
            if m is plain_m:
                plain += dt
            else:
                spec += dt
        same &= texts[0] == texts[1]
        n += len(texts[0])
        if progress is not None:
            progress()
    out["llama_cpp"] = dict(
        plain_tok_s=n / plain, lookup_tok_s=n / spec, speedup=plain / spec, identical=same
    )
    return out


def load_llm_results() -> dict:
    """The committed record of ``specdec-course bench llm --record``
    (``data/results/llm_cpu.json``), which lesson 11 reads."""
    import json

    from ..paths import results_dir

    path = results_dir() / "llm_cpu.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: restore it with git checkout, or measure it with "
            "specdec-course bench llm --record (about 20 minutes)"
        )
    return json.loads(path.read_text())


def plot_call_costs(costs: dict, ax, labels=("SmolLM2-135M", "character target")) -> None:
    """Draw the record's ``call_costs`` on ``ax``: cost(n)/cost(1) of SmolLM2 and of the
    character target against n (lesson 11 adds its own marks)."""
    for name, label in zip(("smollm2", "char_target"), labels):
        ax.plot(costs["sizes"], costs[name]["ratio"], "o-", ms=3, label=label)
    ax.set(xlabel="tokens scored in one call, n", ylabel="cost(n) / cost(1)", ylim=(0, None))


def plot_llm(record: dict):
    """A figure of ``bench llm``'s record: the call costs (:func:`plot_call_costs`, left), and
    each proposer's speedup at its best k on each prompt set and temperature (right, with 1x
    marked)."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    plot_call_costs(record["call_costs"], ax1)
    ax1.legend(fontsize=8)
    best = sorted(record["best"], key=lambda r: (r["proposer"], r["set"], r["temperature"]))
    labels = [f"{r['proposer']}, {r['set']}, T={r['temperature']:g}" for r in best]
    ax2.barh(range(len(best)), [r["speedup"] for r in best], color="C2")
    ax2.set_yticks(range(len(best)), labels, fontsize=7)
    ax2.axvline(1.0, color="0.4", lw=1)
    ax2.set(xlabel="speedup over plain decoding (best k)")
    fig.suptitle(f"{record['command']}, {record['date']}", fontsize=9)
    fig.tight_layout()
    return fig


def save_llm_plot(record: dict, json_path) -> str:
    """Draw :func:`plot_llm` to ``json_path`` with the suffix ``.png``; returns that path."""
    from pathlib import Path

    from .records import save_figure

    return str(save_figure(lambda: plot_llm(record), Path(json_path).with_suffix(".png")))
