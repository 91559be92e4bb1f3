"""The course's models in Hugging Face ``transformers`` (the optional extra ``[hf]``).

``CharGPT`` is GPT-2's architecture (Radford et al. 2019): learned positions, pre-LayerNorm
blocks, an exact-GELU MLP four times as wide, an output layer tied to the token embedding.
So the shipped pair maps onto ``transformers.GPT2LMHeadModel`` with no approximation
(``activation_function="gelu"``, not GPT-2's tanh ``"gelu_new"``); the one difference in
layout is that GPT-2's ``Conv1D`` stores a projection as ``[in, out]``, the transpose of a
``Linear``'s weight.

- :func:`to_hf` / :func:`from_hf`: a ``CharGPT`` to a ``GPT2LMHeadModel`` and back, weights
  bit for bit.
- :func:`char_tokenizer`: the 65-symbol character vocabulary as a ``PreTrainedTokenizerFast``
  (one token per character, no special tokens). The vocabulary has no end-of-text or
  padding symbol, so the exported models' generation config sets ``eos_token_id`` and
  ``pad_token_id`` to None: ``generate`` then produces exactly ``max_new_tokens``, as the
  package's loops do; at batch 1 nothing needs padding. :func:`hf_generate` passes plain id
  tensors with an all-ones attention mask, which is all ``generate`` needs.
- :func:`save_pretrained` / :func:`from_pretrained`: a local folder (``config.json``,
  ``model.safetensors``, ``generation_config.json``, the tokenizer's files) that
  ``GPT2LMHeadModel.from_pretrained(folder)`` and ``AutoTokenizer.from_pretrained(folder)``
  read too; nothing here talks to a hub (``local_files_only=True``).
- :func:`hf_generate`: Hugging Face's ``generate`` on a prompt of the package's ids, plain,
  assisted by a draft model (fixed ``k``, HF's heuristic schedule, or HF's defaults) or by
  prompt lookup, returning the 1-D ids ``decoding.generate`` returns.

Sampling: the exported generation config sets ``top_k=0`` (off): ``generate``'s default of
50 would cut the 65-symbol distribution. With ``do_sample=True`` HF's assisted generation
runs Leviathan et al.'s Algorithm 1 (``_speculative_sampling``), exact like the package's
loop; the tests check it by chi-square against the exact two-character law.

Nothing else in the package imports this module at import time; it needs ``pip install -e
'.[hf]'`` (``transformers``, ``safetensors``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .data import VOCAB
from .model import CharGPT, GPTConfig, check_model

__all__ = [
    "require_transformers",
    "to_hf",
    "from_hf",
    "char_tokenizer",
    "save_pretrained",
    "from_pretrained",
    "export_pair",
    "hf_generate",
    "ASSISTED_MODES",
]

_INSTALL = "pip install -e '.[hf]' (transformers, safetensors)"
# Our Linear weights are [out, in]; GPT-2's Conv1D stores [in, out].
_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def require_transformers():
    """The ``transformers`` module, or a ModuleNotFoundError that says how to install it."""
    try:
        import transformers
    except ImportError:
        raise ModuleNotFoundError(
            f"specdec_course.hf needs Hugging Face transformers: {_INSTALL}"
        ) from None
    return transformers


def _generation_config(transformers):
    # No special symbols in the vocabulary: no eos (generate runs to max_new_tokens), no pad
    # (batch 1), no bos. Sampling at temperature 1 over the whole distribution (top_k off),
    # the defaults of decoding.generate; pass do_sample=False for greedy decoding.
    return transformers.GenerationConfig(
        bos_token_id=None, eos_token_id=None, pad_token_id=None, do_sample=True, top_k=0
    )


def to_hf(model: CharGPT, *, attn_implementation: str = "sdpa"):
    """``model`` as a ``transformers.GPT2LMHeadModel`` in eval mode, with equal weights.

    The config is GPT-2's with this model's sizes, exact GELU, no dropout and no special
    tokens; ``config.char_vocab`` keeps the vocabulary (``model.vocab`` when the model has
    one, else ``data.VOCAB``). A model built with ``bias=False`` gets zero biases (GPT-2
    always has them: the same function). ``attn_implementation`` is HF's (``"sdpa"``, its
    default, or ``"eager"``). Raises ValueError for a model that is not a ``CharGPT``.
    """
    check_model(model)
    tr = require_transformers()
    c = model.config
    vocab = getattr(model, "vocab", None) or VOCAB
    if len(vocab) != c.vocab_size:
        raise ValueError(
            f"model.vocab has {len(vocab)} symbols but the model {c.vocab_size}; set "
            "model.vocab to its tokenizer's vocabulary"
        )
    cfg = tr.GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.block_size,
        n_embd=c.n_embd,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_inner=4 * c.n_embd,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        scale_attn_weights=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=True,
    )
    cfg.char_vocab = vocab
    hf = tr.GPT2LMHeadModel._from_config(cfg, attn_implementation=attn_implementation)
    hf.generation_config = _generation_config(tr)
    ours = {k: v for k, v in model.state_dict().items() if not k.startswith("_")}
    theirs = hf.state_dict()
    with torch.no_grad():
        for key, dst in theirs.items():
            if key in ours:
                src = ours[key]
                dst.copy_(src.t() if key.endswith(_TRANSPOSED) else src)
            elif key.endswith(".bias") and key[: -len("bias")] + "weight" in ours:
                dst.zero_()  # bias=False: zero biases compute the same function
            else:
                raise ValueError(f"GPT2LMHeadModel has a tensor {key!r} that CharGPT lacks")
    return hf.eval()


def from_hf(hf_model) -> CharGPT:
    """A ``GPT2LMHeadModel`` (from :func:`to_hf`, or one with the same design) as a
    ``CharGPT`` in eval mode, weights bit for bit; ``.vocab`` from ``config.char_vocab``
    when the config has one.

    Raises ValueError for another class or a GPT-2 that ``CharGPT`` cannot express: an
    activation other than exact ``"gelu"`` (GPT-2's own ``"gelu_new"`` is the tanh
    approximation), an MLP width other than ``4 * n_embd``, a LayerNorm epsilon other than
    1e-5, per-layer attention scaling, or an output layer not tied to the embedding.
    """
    tr = require_transformers()
    if not isinstance(hf_model, tr.GPT2LMHeadModel):
        raise ValueError(f"hf_model must be a GPT2LMHeadModel; got {type(hf_model).__name__}")
    cfg = hf_model.config
    problems = []
    if cfg.activation_function != "gelu":
        problems.append(f"activation_function={cfg.activation_function!r} (CharGPT: 'gelu')")
    if cfg.n_inner not in (None, 4 * cfg.n_embd):
        problems.append(f"n_inner={cfg.n_inner} (CharGPT: 4 * n_embd)")
    if cfg.layer_norm_epsilon != 1e-5:
        problems.append(f"layer_norm_epsilon={cfg.layer_norm_epsilon} (CharGPT: 1e-5)")
    if cfg.scale_attn_by_inverse_layer_idx or not cfg.scale_attn_weights:
        problems.append("attention scaled other than by 1/sqrt(head_dim)")
    head, wte = hf_model.lm_head.weight, hf_model.transformer.wte.weight
    if head.data_ptr() != wte.data_ptr() and not torch.equal(head, wte):
        problems.append("lm_head is not tied to the token embedding")
    if problems:
        raise ValueError("this GPT-2 is not a CharGPT: " + "; ".join(problems))
    config = GPTConfig(
        vocab_size=cfg.vocab_size,
        block_size=cfg.n_positions,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_embd=cfg.n_embd,
        dropout=0.0,
        bias=True,
    )
    model = CharGPT(config)
    theirs = hf_model.state_dict()
    state = {}
    for key in model.state_dict():
        src = theirs[key].detach().cpu()
        state[key] = src.t().contiguous() if key.endswith(_TRANSPOSED) else src.clone()
    model.load_state_dict(state)
    vocab = getattr(cfg, "char_vocab", None)
    if vocab is not None:
        model.vocab = vocab
    return model.eval()


def char_tokenizer(vocab: str = VOCAB):
    """The character vocabulary as a ``transformers.PreTrainedTokenizerFast``: token ``i`` is
    ``vocab[i]``, every character its own token (spaces and newlines too), no special tokens,
    decoding joins the characters as they are. Raises ValueError for a vocabulary with
    repeated characters; encoding a character outside it raises the tokenizer's error."""
    require_transformers()
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if not isinstance(vocab, str) or not vocab or len(set(vocab)) != len(vocab):
        raise ValueError("vocab must be a non-empty str of distinct characters")
    tok = Tokenizer(models.WordLevel({ch: i for i, ch in enumerate(vocab)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)


def save_pretrained(model, directory: str | Path) -> Path:
    """Write ``model`` (a ``CharGPT`` or a ``GPT2LMHeadModel`` from :func:`to_hf`) and its
    character tokenizer to the local folder ``directory`` (created), as safetensors. Returns
    the folder."""
    tr = require_transformers()
    hf = model if isinstance(model, tr.GPT2LMHeadModel) else to_hf(model)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    bars = tr.utils.logging.is_progress_bar_enabled()
    tr.utils.logging.disable_progress_bar()  # one small shard: no "Writing model shards" bar
    try:
        hf.save_pretrained(out)
    finally:
        if bars:
            tr.utils.logging.enable_progress_bar()
    char_tokenizer(getattr(hf.config, "char_vocab", None) or VOCAB).save_pretrained(out)
    return out


def from_pretrained(directory: str | Path, *, attn_implementation: str = "sdpa"):
    """``(GPT2LMHeadModel in eval mode, PreTrainedTokenizerFast)`` from a folder written by
    :func:`save_pretrained`, from local files only. Raises FileNotFoundError, with the
    command that writes one, when the folder holds no exported model."""
    tr = require_transformers()
    path = Path(directory)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} holds no exported model (config.json); write one with: "
            f"specdec-course export --format hf {path.parent if path.name else path}"
        )
    hf = tr.GPT2LMHeadModel.from_pretrained(
        path, local_files_only=True, attn_implementation=attn_implementation
    )
    tok = tr.PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return hf.eval(), tok


def export_pair(directory: str | Path) -> dict:
    """The shipped target and draft, exported to ``directory/target`` and ``directory/draft``
    (:func:`save_pretrained`). Returns ``{"target": path, "draft": path}``."""
    from .model import load_pretrained

    out = Path(directory)
    return {
        name: save_pretrained(load_pretrained(name), out / name) for name in ("target", "draft")
    }


# How the assistant drafts (set on its generation config before each call, where HF reads it):
#   "fixed"     exactly k drafts per iteration (constant schedule, no confidence stop): the
#               Leviathan loop, as speculative_generate(..., k=k)
#   "heuristic" HF's schedule: start at k, +2 after a fully accepted proposal, else -1
#   "default"   what this transformers version does untouched: its default number of
#               assistant tokens with a stop when the draft's top probability falls below
#               assistant_confidence_threshold (HF's defaults: 20 and 0.4)
ASSISTED_MODES = ("fixed", "heuristic", "default")


def _assistant_options(assistant, mode: str, k: int | None) -> None:
    gc = assistant.generation_config
    defaults = gc._get_default_generation_params()
    if mode == "default":
        gc.num_assistant_tokens = defaults["num_assistant_tokens"]
        gc.num_assistant_tokens_schedule = defaults["num_assistant_tokens_schedule"]
        gc.assistant_confidence_threshold = defaults["assistant_confidence_threshold"]
        return
    if k is None or k < 1:
        raise ValueError(f"assisted mode {mode!r} needs k >= 1 drafts; got {k!r}")
    gc.num_assistant_tokens = int(k)
    gc.num_assistant_tokens_schedule = "constant" if mode == "fixed" else "heuristic"
    gc.assistant_confidence_threshold = 0.0  # no confidence stop: the schedule alone


def hf_generate(
    hf_model,
    prompt_ids,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    assistant=None,
    mode: str = "fixed",
    k: int | None = None,
    prompt_lookup: int | None = None,
    seed: int | None = None,
) -> torch.Tensor:
    """HF ``generate`` at batch 1 on the package's ids: the 1-D ``prompt + max_new_tokens``
    ids, as ``decoding.generate`` returns them.

    ``temperature=0`` is greedy (``do_sample=False``); otherwise sampling at that temperature
    with top-k and top-p off. ``assistant`` (a ``GPT2LMHeadModel``, e.g. ``to_hf(draft)``)
    turns on assisted generation, drafting as ``mode`` says (``ASSISTED_MODES``: ``"fixed"``
    k, HF's ``"heuristic"`` schedule from k, or HF's ``"default"``s); ``prompt_lookup=n``
    turns on prompt lookup decoding with ``n`` candidate tokens (HF's
    ``prompt_lookup_num_tokens``). ``seed`` seeds torch's global generator first (HF samples
    from it). Raises ValueError for both an assistant and prompt lookup, an unknown mode, or
    a prompt that is not 1-D ids.
    """
    tr = require_transformers()
    if not isinstance(hf_model, tr.GPT2LMHeadModel):
        raise ValueError(f"hf_model must be a GPT2LMHeadModel; got {type(hf_model).__name__}")
    if assistant is not None and prompt_lookup is not None:
        raise ValueError("give an assistant model or prompt_lookup, not both")
    if mode not in ASSISTED_MODES:
        raise ValueError(f"mode must be one of {ASSISTED_MODES}; got {mode!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0; got {temperature!r}")
    ids = torch.as_tensor(prompt_ids, dtype=torch.long)
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"prompt_ids must be 1-D and non-empty; got shape {tuple(ids.shape)}")
    dev = hf_model.device
    x = ids.to(dev)[None]
    kw = {
        "max_new_tokens": max_new_tokens,
        "attention_mask": torch.ones_like(x),
    }
    if temperature == 0:
        kw["do_sample"] = False
    else:
        kw.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
    if assistant is not None:
        _assistant_options(assistant, mode, k)
        kw["assistant_model"] = assistant
    if prompt_lookup is not None:
        kw["prompt_lookup_num_tokens"] = int(prompt_lookup)
    if seed is not None:
        torch.manual_seed(seed)
    # HF logs advice about its own internal arguments on every assisted call; keep it quiet.
    level = tr.logging.get_verbosity()
    tr.logging.set_verbosity_error()
    try:
        with torch.inference_mode():
            out = hf_model.generate(x, **kw)
    finally:
        tr.logging.set_verbosity(level)
    return out[0]
