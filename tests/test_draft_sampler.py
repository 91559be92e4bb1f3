"""The draft's honesty rule, written once (``drafts.noise``): every proposer draws its tokens
and reports its ``q`` through ``DraftSampler``; the confidence stops are one ``ConfidenceStop``."""

from __future__ import annotations

import pytest
import torch

from specdec_course.drafts.noise import ConfidenceStop, DraftSampler
from specdec_course.sampling import SamplingOptions

OPTIONS = [(0.0, None, None), (1.0, None, None), (0.7, 5, 0.9)]


def _filled(smp: SamplingOptions, host: bool, k: int = 4, V: int = 11) -> DraftSampler:
    s = DraftSampler(
        smp, torch.Generator().manual_seed(7), 8, k, V, dtype=torch.float32, device="cpu", host=host
    )
    s.begin(k)
    return s


@pytest.mark.parametrize("opts", OPTIONS)
def test_the_tensor_and_numpy_draws_agree_and_q_is_the_softmax_they_drew_from(opts):
    smp = SamplingOptions(*opts)
    raw = torch.randn(4, 11, generator=torch.Generator().manual_seed(1)) * 3
    runs = []
    for host in (False, True):
        s = _filled(smp, host)
        toks = []
        for j in range(4):
            s.row(j).copy_(raw[j : j + 1])
            if host:
                toks.append(s.draw_host(j))
            else:
                slot = torch.empty(1, dtype=torch.long)
                s.draw(j, slot)
                toks.append(int(slot))
        q = s.q_host(4) if host else s.q(4)
        runs.append((toks, None if q is None else q.clone()))
        # The rows were processed in place: q is the softmax of what the tokens came from.
        torch.testing.assert_close(s.logits, smp.logits(raw))
    (t1, q1), (t2, q2) = runs
    assert t1 == t2
    if smp.greedy:
        assert q1 is None and q2 is None and t1 == raw.argmax(-1).tolist()
    else:
        torch.testing.assert_close(q1, smp.probs(raw), atol=1e-6, rtol=0)
        torch.testing.assert_close(q2, q1, atol=1e-6, rtol=0)
        assert all(float(q1[j, t]) > 0 for j, t in enumerate(t1))  # drawn where q has mass


def test_the_draws_follow_the_reported_q():
    # Gumbel-max over the processed row: the histogram of many draws matches q.
    smp = SamplingOptions(0.8, 4)
    row = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 3.0]])
    s = DraftSampler(
        smp, torch.Generator().manual_seed(0), 4000, 1, 6, dtype=torch.float32, device="cpu"
    )
    counts = torch.zeros(6)
    slot = torch.empty(1, dtype=torch.long)
    for _ in range(4000):
        s.begin(1)
        s.row(0).copy_(row)
        s.draw(0, slot)
        counts[slot] += 1
    q = s.q(1)[0]
    assert float(q[3]) == 0.0 and counts[3] == 0 and counts[4] == 0  # filtered by top-k
    assert torch.allclose(counts / 4000, q, atol=0.03)


def test_a_confidence_stop_per_draft_keeps_the_unsure_draft():
    stop = ConfidenceStop(0.5)  # ModelProposer's p_min
    stop.start()
    assert [stop.cut(j, t) for j, t in enumerate([0.9, 0.5, 0.49])] == [None, None, 3]


def test_a_chain_stop_drops_the_draft_that_takes_the_product_below():
    stop = ConfidenceStop(0.5, chain=True, keep=False)  # FeatureDraftProposer's stop_below
    stop.start()
    assert [stop.cut(j, t) for j, t in enumerate([0.9, 0.8, 0.6])] == [None, None, 2]
    stop.start()  # a new proposal starts from confidence 1
    assert stop.cut(0, 0.4) == 0
