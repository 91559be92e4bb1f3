"""The stored ``bench llm`` record as a labelled comparison (lesson 11, section 7).

A record made on another machine is never the claim: every table here opens with the machine,
its threads and its clock; each best row carries the spread of speedups across the k tried;
a row whose speedup exceeds its tokens per call is flagged as noise (a call cannot cost less
than nothing, so a gain above the tokens each call yields is the clock's error, not a result);
the race names the fastest side by tokens per second.
"""

from __future__ import annotations

__all__ = ["describe_record", "best_rows", "best_rows_table", "race_table", "fastest_side"]


def describe_record(record: dict) -> str:
    """One line: the command, date, machine, threads, clock and dtype of ``record``."""
    return (
        f"record: {record['command']} on {record['date']}; machine {record['cpu']}, "
        f"{record['threads']} thread(s), clock: {record.get('clock', 'not recorded')}, "
        f"{record['dtype']} weights; k tried {record['ks']}, {record['max_new_tokens']} new "
        f"tokens per prompt, prompts per set {record['prompts']}"
    )


def best_rows(record: dict) -> list[dict]:
    """Each (set, temperature, proposer) at its best k, with ``spread`` (lowest and highest
    speedup over the k tried) and ``noise`` (speedup above tokens per call)."""
    out = []
    for r in sorted(record["best"], key=lambda r: (r["set"], r["temperature"], r["proposer"])):
        same = [s["speedup"] for s in record["speedups"]
                if (s["set"], s["temperature"], s["proposer"]) ==
                (r["set"], r["temperature"], r["proposer"])]  # fmt: skip
        out.append(dict(r, spread=(min(same), max(same)),
                        noise=r["speedup"] > r["tokens_per_call"]))  # fmt: skip
    return out


def best_rows_table(record: dict) -> str:
    lines = ["set       T  draft          best k  speedup  (over k tried)  tokens/call"]
    for r in best_rows(record):
        lo, hi = r["spread"]
        flag = "  <- above tokens/call: noise" if r["noise"] else ""
        lines.append(
            f"{r['set']:8s} {r['temperature']:2g}  {r['proposer']:14s} {r['k']:5d}  "
            f"{r['speedup']:6.2f}x  ({lo:.2f}-{hi:.2f}x)  {r['tokens_per_call']:11.2f}{flag}"
        )
    return "\n".join(lines)


def fastest_side(record: dict) -> tuple[str, str, float]:
    """``(side, mode, tokens/s)`` of the fastest way to decode the grounded prompts, greedy,
    in the race: every side's plain and prompt-lookup tokens per second compared."""
    race = record["race"]
    k = max(record["ks"])
    ours = next(r for r in record["speedups"] if (r["set"], r["temperature"], r["proposer"],
                r["k"]) == ("grounded", 0.0, "prompt_lookup", k))  # fmt: skip
    rows = {("the package", "plain"): ours["plain_tok_s"],
            ("the package", "prompt lookup"): ours["spec_tok_s"]}  # fmt: skip
    for side, r in race.items():
        if "skipped" not in r:
            rows[side, "plain"] = r["plain_tok_s"]
            rows[side, "prompt lookup"] = r["lookup_tok_s"]
    (side, mode), tps = max(rows.items(), key=lambda kv: kv[1])
    return side, mode, tps


def race_table(record: dict) -> str:
    """The race on the grounded prompts, greedy, prompt lookup at the largest k: each side's
    plain and speculative tokens per second, and the fastest named."""
    k = max(record["ks"])
    ours = next(r for r in record["speedups"] if (r["set"], r["temperature"], r["proposer"],
                r["k"]) == ("grounded", 0.0, "prompt_lookup", k))  # fmt: skip
    lines = [f"the race, grounded prompts, greedy, prompt lookup at k = {k} (same machine, "
             f"{record['threads']} thread(s), {record.get('clock', 'clock not recorded')}):",
             f"  the package ({record['dtype']}): plain {ours['plain_tok_s']:.1f} tokens/s, "
             f"prompt lookup {ours['spec_tok_s']:.1f}"]  # fmt: skip
    names = {"hf": "Hugging Face", "llama_cpp": "llama.cpp"}
    for side, r in record["race"].items():
        name = names.get(side, side)
        if "skipped" in r:
            lines.append(f"  {name}: not run ({r['skipped']})")
        else:
            lines.append(f"  {name}: plain {r['plain_tok_s']:.1f} tokens/s, prompt lookup "
                         f"{r['lookup_tok_s']:.1f}; its speculative text = its plain text: "
                         f"{r['identical']}")  # fmt: skip
    side, mode, tps = fastest_side(record)
    lines.append(f"fastest: {names.get(side, side)}'s {mode}, {tps:.1f} tokens/s")
    return "\n".join(lines)
