"""The real LLM's speedups: every proposer on three prompt sets, and the race against
Hugging Face and llama.cpp on the same weights.

- :func:`proposer_speedups`: plain ``decoding.generate`` against ``speculative_generate``
  with each proposer and draft length ``k``, at temperature 0 and 1, on each prompt set
  (``llm.prompts.PROMPT_SETS``: grounded, chat, code), interleaved prompt by prompt (plain,
  then every proposer and k, on the same prompt before the next). A cell's speedup is the
  set's total plain time over its total speculative time; its tokens per call and
  ``accepted_share`` (drafts accepted over drafts proposed, not the acceptance rate alpha)
  are summed over the set's prompts.
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
) -> list[dict]:
    """One row per (set, temperature, proposer, k): ``speedup``, ``tokens_per_call``,
    ``accepted_share`` (drafts accepted over drafts proposed), ``plain_tok_s``,
    ``spec_tok_s`` and, at temperature 0, ``identical`` (every
    prompt's speculative text equal to its plain greedy text)."""
    rows = []
    for set_name, prompts in prompt_sets.items():
        for T in temperatures:
            cells: dict = {}
            plain_s = 0.0
            for i, text in enumerate(prompts):
                ids = _chat(tok, text)
                g = torch.Generator().manual_seed(seed + i)
                t0 = clock()
                ref = decoding.generate(model, ids, max_new_tokens, temperature=T, generator=g)
                plain_s += clock() - t0
                for name, prop in proposers.items():
                    for k in ks:
                        g = torch.Generator().manual_seed(seed + i)
                        t0 = clock()
                        out, st = decoding.speculative_generate(
                            model, prop, ids, max_new_tokens, k=k, temperature=T, generator=g
                        )
                        c = cells.setdefault(
                            (name, k), dict(s=0.0, calls=0, acc=0, drafted=0, same=True)
                        )
                        c["s"] += clock() - t0
                        c["calls"] += st.target_calls
                        c["acc"] += st.accepted
                        c["drafted"] += st.drafted
                        c["same"] &= bool(torch.equal(out, ref))
            n_tok = max_new_tokens * len(prompts)
            for (name, k), c in cells.items():
                row = dict(
                    set=set_name,
                    temperature=T,
                    proposer=name,
                    k=k,
                    speedup=plain_s / c["s"],
                    tokens_per_call=n_tok / c["calls"],
                    # accepted over drafted: not the acceptance rate alpha (a proposal's drafts
                    # after its first rejection count as drafted but were never tried)
                    accepted_share=c["acc"] / max(c["drafted"], 1),
                    plain_tok_s=n_tok / plain_s,
                    spec_tok_s=n_tok / c["s"],
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


def grounding(model, tok, prompts: list[str], *, max_new_tokens: int = 64, n: int = 4) -> list:
    """For each prompt, the share of the model's plain greedy answer (up to its end of turn,
    at most ``max_new_tokens`` tokens) that lies in runs of ``n`` tokens found in the prompt:
    how much of the answer the prompt grounds (``llm.prompts`` chose its grounded set by it)."""
    end = tok.encode("<|im_end|>")[0]
    shares = []
    for text in prompts:
        ids = _chat(tok, text)
        answer = decoding.generate(model, ids, max_new_tokens, temperature=0)[ids.numel() :]
        a = answer.tolist()
        a = a[: a.index(end)] if end in a else a
        p = ids.tolist()
        runs = {tuple(p[j : j + n]) for j in range(len(p) - n + 1)}
        covered = set()
        for j in range(len(a) - n + 1):
            if tuple(a[j : j + n]) in runs:
                covered.update(range(j, j + n))
        shares.append(round(len(covered) / max(len(a), 1), 3))
    return shares


def best_k(rows: list[dict]) -> list[dict]:
    """The fastest ``k`` of each (set, temperature, proposer), one row each."""
    best: dict = {}
    for r in rows:
        key = (r["set"], r["temperature"], r["proposer"])
        if key not in best or r["speedup"] > best[key]["speedup"]:
            best[key] = r
    return list(best.values())


def _hf_greedy(hf, ids, n, **kw):
    with torch.inference_mode():
        out = hf.generate(
            ids[None],
            attention_mask=torch.ones_like(ids[None]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
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
) -> dict:
    """``{"hf": {...}, "llama_cpp": {...}}``: each side's plain and prompt-lookup tokens/s on
    ``prompts`` (greedy, ``max_new_tokens`` each, interleaved prompt by prompt), its speedup
    over its own plain decoding and whether its speculative texts equal its plain ones. A
    side that is not installed is ``{"skipped": reason}``."""
    from ..llm import distill, gguf_path

    out: dict = {}
    try:
        hf = distill.hf_model(torch.float32) if model is None else model
    except ImportError as e:
        out["hf"] = {"skipped": f"transformers is not installed ({e}): pip install -e '.[hf]'"}
    else:
        plain = spec = 0.0
        same = True
        for text in prompts:
            ids = _chat(tok, text)
            t0 = clock()
            a = _hf_greedy(hf, ids, max_new_tokens)
            t1 = clock()
            b = _hf_greedy(hf, ids, max_new_tokens, prompt_lookup_num_tokens=k)
            spec += clock() - t1
            plain += t1 - t0
            same &= bool(torch.equal(a, b))
        n = max_new_tokens * len(prompts)
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
                if len(toks) == max_new_tokens:
                    break
            dt = clock() - t0
            texts.append(toks)
            if m is plain_m:
                plain += dt
            else:
                spec += dt
        same &= texts[0] == texts[1]
    n = max_new_tokens * len(prompts)
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
