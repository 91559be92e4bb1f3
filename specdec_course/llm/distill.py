"""Self-distillation of the real model's feature draft (``llm.draft.FeatureDraft``).

The Medusa paper's self-distillation on a 2-core CPU: the target writes its own training
data. ``make_data`` answers chat and code prompts built from topics and task templates
(``llm.distill_prompts``; none in ``llm.prompts``' bench sets), half greedily and half
sampled at temperature 1, and keeps, for every position, the target's post-norm feature
(the input of its head). ``train`` then teaches the draft, unrolled ``depth`` drafts deep
as it drafts (EAGLE-3's training-time test: from the second draft on it reads its own
guessed feature), to make its ``q`` match the target's ``p``: loss = (1 - alpha) +
KL(p || q) per depth, weighted ``0.9 ** depth``, plus a small pull of each guessed feature
toward the true one.

Generation runs in Hugging Face's ``LlamaForCausalLM`` (the ``[hf]`` extra) built from the
same dequantized weights, for its batched ``generate`` with left padding: 32 answers at a
time are about four times the tokens per second of one (the course's ``Llama`` decodes one
sequence). ``tools/llm_distill.py`` runs both stages; ``data/checkpoints/README`` and the
checkpoint's record say what the shipped draft was trained on and for how long.
"""

from __future__ import annotations

import glob
import os
import time

import torch
import torch.nn.functional as F

from .distill_prompts import training_prompts
from .draft import FeatureDraft
from .gguf_load import read_gguf

__all__ = ["training_prompts", "hf_model", "make_data", "depth_loss", "train"]


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    # The GGUF stores each head's query/key rows pair-wise for its rotary; HF's Llama halves.
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .transpose(1, 2)
        .reshape(w.shape)
    )


def hf_model(dtype=torch.float32):
    """Hugging Face's ``LlamaForCausalLM`` with the GGUF's dequantized weights (dense: the
    ``gguf_file=`` loader keeps them quantized, and its kernels are slower here)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg, t, _ = read_gguf()
    hf = LlamaConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["n_embd"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["n_layer"],
        num_attention_heads=cfg["n_head"],
        num_key_value_heads=cfg["n_kv_head"],
        max_position_embeddings=cfg["block_size"],
        rms_norm_eps=cfg["norm_eps"],
        rope_theta=cfg["rope_theta"],
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    sd = {
        "model.embed_tokens.weight": t["tok_embeddings.weight"],
        "model.norm.weight": t["norm.weight"],
    }
    names = {
        "attention.wq": "self_attn.q_proj.weight",
        "attention.wk": "self_attn.k_proj.weight",
        "attention.wv": "self_attn.v_proj.weight",
        "attention.wo.weight": "self_attn.o_proj.weight",
        "feed_forward.w1": "mlp.gate_proj.weight",
        "feed_forward.w3": "mlp.up_proj.weight",
        "feed_forward.w2.weight": "mlp.down_proj.weight",
        "attention_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
    }
    for i in range(cfg["n_layer"]):
        for ours, theirs in names.items():
            w = t[f"layers.{i}.{ours}"]
            if ours == "attention.wq":
                w = _unpermute(w, cfg["n_head"])
            elif ours == "attention.wk":
                w = _unpermute(w, cfg["n_kv_head"])
            sd[f"model.layers.{i}.{theirs}"] = w
    model = LlamaForCausalLM(hf)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if set(missing) - {"lm_head.weight"} or unexpected:
        raise ValueError(f"GGUF tensors do not fit LlamaForCausalLM: {missing}, {unexpected}")
    model.tie_weights()
    return model.to(dtype).eval()


def make_data(
    out_dir,
    *,
    batch: int = 32,
    new_tokens: int = 160,
    n_batches: int | None = None,
    chat_template=None,
    log=print,
) -> None:
    """Answer ``training_prompts()`` in batches, saving ``out_dir/batchNNNN.pt`` each with
    ``ids`` [B, L] (left-padded), ``mask`` [B, L] (1 on real tokens up to the first end of
    turn), ``feats`` [B, L - 1, d] bfloat16 (the feature at each position, which predicts the
    next token) and ``prompt_len``. Odd batches are sampled at temperature 1, even ones
    greedy. Resumes: existing batch files are kept (each is written whole, then renamed)."""
    from .loading import load

    _, tok = load(torch.float32)
    model = hf_model(torch.float32)
    prompts = training_prompts()
    os.makedirs(out_dir, exist_ok=True)
    total = len(prompts) // batch if n_batches is None else n_batches
    for b in range(total):
        path = os.path.join(out_dir, f"batch{b:04d}.pt")
        if os.path.exists(path):
            continue
        t0 = time.perf_counter()
        rows = [
            tok.apply_chat_template([{"role": "user", "content": p}])
            for p in prompts[b * batch : (b + 1) * batch]
        ]
        width = max(map(len, rows))
        ids = torch.tensor([[2] * (width - len(r)) + r for r in rows])
        attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        sample = b % 2 == 1
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=attn,
                max_new_tokens=new_tokens,
                do_sample=sample,
                temperature=1.0 if sample else None,
                top_k=0 if sample else None,
                top_p=None,
                pad_token_id=2,
                output_hidden_states=True,
                return_dict_in_generate=True,
            )
        seq = out.sequences
        feats = torch.cat([out.hidden_states[0][-1]] + [h[-1] for h in out.hidden_states[1:]], 1)
        resp = seq[:, width:]
        ended = torch.cumsum((resp == 2).long(), 1)
        ended = torch.cat([torch.zeros_like(ended[:, :1]), ended[:, :-1]], 1) > 0
        mask = torch.cat([attn, (~ended).long()], 1)
        torch.save(
            {
                "ids": seq,
                "mask": mask,
                "feats": feats.to(torch.bfloat16),
                "prompt_len": width,
                "sampled": sample,
            },
            path + ".tmp",
        )
        os.replace(path + ".tmp", path)  # whole or absent: a run stopped mid-save resumes cleanly
        log(
            f"batch {b + 1}/{total}: {int((~ended).sum())} answer tokens, "
            f"{time.perf_counter() - t0:.0f}s"
        )


def _load_sequences_of(path):
    # One batch file's answers: (ids, float32 features, prompt length), padding cut off.
    b, seqs = torch.load(path, weights_only=True), []
    for i in range(b["ids"].shape[0]):
        where = b["mask"][i].bool().nonzero().flatten()
        lo, hi = int(where[0]), int(where[-1]) + 1
        seqs.append(
            (b["ids"][i, lo:hi], b["feats"][i, lo : hi - 1].float(), int(b["prompt_len"]) - lo)
        )
    return seqs


def _load_sequences(data_dir):
    paths = sorted(glob.glob(os.path.join(data_dir, "batch*.pt")))
    return [seq for path in paths for seq in _load_sequences_of(path)]


def _windows(seqs, depth):
    # Flattened: feature at each position, the token after it, and the starts t whose next
    # ``depth`` positions lie in the same sequence.
    f = torch.cat([s[1] for s in seqs])
    nxt = torch.cat([s[0][1:] for s in seqs])
    ok = torch.cat([torch.arange(len(s[0]) - 1) < len(s[0]) - 1 - depth for s in seqs])
    return f, nxt, ok.nonzero().flatten()


def _teacher(f, embed, vocab_ids, chunk=4096):
    # The target's log p over the reduced vocabulary (normalised over the full one), float16.
    out = []
    with torch.no_grad():
        for i in range(0, len(f), chunk):
            x = f[i : i + chunk]
            lse = torch.logsumexp(x @ embed.T, -1, keepdim=True)
            out.append((x @ embed[vocab_ids].T - lse).half())
    return torch.cat(out)


def unrolled_loss(draft, f_all, nxt, logp, starts, depth, decay=0.9):
    """The training loss and the mean acceptance ``alpha = sum(min(p, q))`` at each depth."""
    f, loss, alphas = f_all[starts], 0.0, []
    for d in range(depth):
        h, logits = draft(f, nxt[starts + d])
        term, alpha = depth_loss(h, logits, logp[starts + d + 1].float(), f_all[starts + d + 1])
        loss = loss + decay**d * term
        alphas.append(alpha)
        f = h
    return loss, alphas


def depth_loss(h, logits, lp, f_next):
    """One depth's loss, mean ``(1 - alpha) + KL(p || q)`` plus ``0.1 *`` a smooth-L1 pull of
    the guessed feature ``h`` toward ``f_next``, and mean ``alpha = sum(min(p, q))``."""
    p, lq = lp.exp(), F.log_softmax(logits, -1)
    alpha = torch.minimum(p, lq.exp()).sum(-1)
    kl = (p * (lp - lq)).sum(-1)
    pull = F.smooth_l1_loss(h, f_next)
    return (1 - alpha).mean() + kl.mean() + 0.1 * pull, alpha.mean().item()


def train(
    data_dir,
    *,
    vocab: int = 4096,
    hidden: int = 1024,
    depth: int = 4,
    steps: int = 3000,
    batch: int = 256,
    lr: float = 1e-3,
    n_val: int = 64,
    seed: int = 0,
    log=print,
    checkpoint=None,
):
    """Train a ``FeatureDraft`` on ``make_data``'s files. Returns ``(draft, record)``; the
    record holds the settings, the reduced vocabulary's share of answer tokens, the
    validation alpha per depth, steps and seconds. ``checkpoint(draft, record)`` is called
    every 100 steps (to save)."""
    from .loading import load

    torch.manual_seed(seed)
    model, _ = load(torch.float32)
    embed = model.tok_embeddings.weight.detach()
    seqs = _load_sequences(data_dir)
    val, tr = seqs[:n_val], seqs[n_val:]
    counts = torch.zeros(embed.shape[0])
    for ids, _, pl in tr:
        counts += torch.bincount(ids[pl:], minlength=embed.shape[0]).float()
    vocab_ids = torch.sort(torch.topk(counts, vocab).indices).values
    tf, tn, ts = _windows(tr, depth)
    vf, vn, vs = _windows(val, depth)
    tlogp, vlogp = _teacher(tf, embed, vocab_ids), _teacher(vf, embed, vocab_ids)
    draft = FeatureDraft(embed, vocab_ids, hidden)
    draft.init_from_target()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    record = dict(
        vocab=vocab,
        hidden=hidden,
        depth=depth,
        steps=steps,
        batch=batch,
        lr=lr,
        train_tokens=int(counts.sum()),
        sequences=len(tr),
        vocab_share=round(float(counts[vocab_ids].sum() / counts.sum()), 4),
    )
    g = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        sel = ts[torch.randint(len(ts), (batch,), generator=g)]
        loss, _ = unrolled_loss(draft, tf, tn, tlogp, sel, depth)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps:
            with torch.no_grad():
                _, va = unrolled_loss(draft, vf, vn, vlogp, vs[:4096], depth)
            record.update(
                steps_done=step,
                train_seconds=round(time.perf_counter() - t0),
                val_alpha=[round(a, 4) for a in va],
            )
            alpha, secs = record["val_alpha"], record["train_seconds"]
            log(f"step {step}: val alpha by depth {alpha} ({secs}s)")
            if checkpoint is not None:
                checkpoint(draft, record)
    return draft, record
