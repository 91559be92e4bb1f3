"""The roofline model of a GPU call (bench.roofline) and its per-method predictions."""

import json
import math
import shutil

import pytest

from specdec_course import bench, cli, theory
from specdec_course.bench import GPUSpec, ModelShape
from specdec_course.paths import results_dir

TINY = ModelShape("tiny", n_layer=2, d_model=8, n_head=2, n_kv_head=1, d_ff=16, vocab=10)
SLOW = GPUSpec("slow", bandwidth=1000.0, peak_flops=2000.0, source="made up")
LLAMA_8B, LLAMA_1B = bench.SHAPES["llama-3-8b"], bench.SHAPES["llama-3.2-1b"]


def test_tiny_shape_bytes_and_flops_by_hand():
    # head 8 / 2 = 4 wide, one KV head: kv = 4. A layer's products: q, o 8x8; k, v 8x4;
    # gate, up, down 8x16: 128 + 64 + 384 = 576. With the LM head 8 x 10: 2 * 576 + 80 = 1232.
    assert TINY.kv_dim == 4 and TINY.layer_matmul_params == 576 and TINY.matmul_params == 1232
    # Norm vectors: 2 per layer and the final one, 8 each: 40. bf16: (1232 + 40) * 2.
    assert TINY.weight_bytes == 2544
    # K and V, 2 layers, 4 values each, 2 bytes: 32 bytes a position.
    assert TINY.kv_bytes_per_token == 32
    # Per layer 9 * 8 + 2 * 4 + 3 * 16 = 128 values, 2 layers, + embedding row 8 + logits 10.
    assert TINY.activation_values_per_token == 274
    call = bench.modelled_call(TINY, SLOW, tokens=3, batch=2, context=5, overhead_s=0.5)
    # weights 2544 + KV 2 * (5 + 3) * 32 = 512 + activations 2 * 3 * 274 * 2 = 3288.
    assert call.bytes == 6344
    # 2 * 3 tokens * (2 * 1232 + attention 4 * 2 layers * 8 * (5 + 3) = 512) = 17856.
    assert call.flops == 17856
    assert call.memory_s == pytest.approx(6.344) and call.compute_s == pytest.approx(8.928)
    assert call.bound == "compute" and call.time_s == pytest.approx(8.928 + 0.5)
    one = bench.modelled_call(TINY, SLOW, tokens=1, batch=2, context=5, overhead_s=0.5)
    # weights 2544 + KV 2 * 6 * 32 = 384 + activations 2 * 274 * 2 = 1096: 4024 bytes;
    # 2 * (2464 + 4 * 2 * 8 * 6 = 384) = 5696 flops: memory bound, 4.024 s.
    assert (one.bytes, one.flops, one.bound) == (4024, 5696, "memory")
    assert bench.modelled_ratio(TINY, SLOW, 3, 2, 5, 0.5) == pytest.approx(9.428 / 4.524)
    # Resident: 1272 streamed weights + the 80-value embedding table, 2 bytes each, and the
    # KV cache after the call, 2 * (5 + 3) * 32: 2704 + 512. SLOW states no memory: it fits.
    assert call.resident_bytes == 3216 and call.fits
    small = GPUSpec("small", 1000.0, 2000.0, "made up", memory=3215)
    assert not bench.modelled_call(TINY, small, 3, 2, 5).fits
    assert bench.modelled_call(TINY, small, 2, 2, 5).fits  # 2704 + 2 * 7 * 32 = 3152


def test_named_shapes_have_their_published_parameter_counts():
    assert LLAMA_8B.parameters == 8_030_261_248  # "8B": 8.03 B with the untied LM head
    assert LLAMA_1B.parameters == 1_235_814_400  # "1B": 1.24 B, tied embeddings
    # A call streams everything but the embedding table (looked up, not read whole).
    assert LLAMA_8B.weight_bytes == 2 * (LLAMA_8B.parameters - 4096 * 128256)
    assert LLAMA_1B.weight_bytes == 2 * LLAMA_1B.parameters  # tied: the LM head is the table
    assert LLAMA_8B.kv_bytes_per_token == 128 * 1024  # 32 layers x K, V x 8 heads x 128 x 2 B
    h200 = bench.GPUS["h200"]
    assert (h200.bandwidth, h200.peak_flops, h200.memory) == (4.8e12, 989e12, 141e9)
    # 16 GB of bf16 weights and 64 rows x 1024 cached tokens x 128 KiB: not on a 24 GB card.
    assert bench.modelled_call(LLAMA_8B, "h200", 4, batch=64).fits
    assert not bench.modelled_call(LLAMA_8B, "rtx4090", 4, batch=64).fits
    assert bench.modelled_call(LLAMA_8B, "rtx4090", 4, batch=1).fits
    marked = "* does not fit in 24 GB"
    assert marked in bench.format_modelled_ratios(gpu="rtx4090", batches=(1, 64))
    assert marked not in bench.format_modelled_ratios(gpu="rtx4090", batches=(1,))


def test_call_time_grows_with_tokens_batch_and_context():
    for gpu in bench.GPUS:
        times = [bench.modelled_call(LLAMA_8B, gpu, t).time_s for t in (1, 2, 8, 64, 512, 4096)]
        assert times == sorted(times) and times[-1] > 10 * times[0]
        by_batch = [bench.modelled_call(LLAMA_8B, gpu, 4, batch=b).time_s for b in (1, 8, 64)]
        assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
        by_ctx = [bench.modelled_call(LLAMA_8B, gpu, 4, context=L).time_s for L in (0, 512, 8192)]
        assert by_ctx == sorted(by_ctx) and by_ctx[0] < by_ctx[-1]
        assert bench.modelled_ratio(LLAMA_8B, gpu, 1) == 1.0


def test_ridge_separates_memory_from_compute_bound_calls():
    for gpu in bench.GPUS:
        for B in (1, 16, 64):
            ridge = bench.modelled_ridge(LLAMA_8B, gpu, batch=B)
            assert bench.modelled_call(LLAMA_8B, gpu, ridge, batch=B).bound == "compute"
            if ridge > 1:
                assert bench.modelled_call(LLAMA_8B, gpu, ridge - 1, batch=B).bound == "memory"
    # At B = 1 the ridge sits near peak / bandwidth (2 flops per 2-byte weight per token),
    # a little above it because the KV cache and activations add bytes: H200 989 / 4.8 = 206.
    h200 = bench.GPUS["h200"]
    ridge = bench.modelled_ridge(LLAMA_8B, h200)
    assert 206 <= ridge <= 1.1 * 206
    # A batch shares the weights: the ridge per sequence falls, per call it rises (KV reads).
    r16, r64 = (bench.modelled_ridge(LLAMA_8B, h200, batch=B) for B in (16, 64))
    assert ridge > r16 > r64 and ridge < 16 * r16 < 64 * r64
    assert bench.modelled_ridge(LLAMA_8B, h200, max_tokens=100) is None
    assert bench.modelled_ridge(TINY, GPUSpec("no flops", 1e15, 1.0, "made up")) == 1


def test_ratio_is_near_one_below_the_ridge_and_grows_above_it():
    for gpu in bench.GPUS:
        ridge = bench.modelled_ridge(LLAMA_8B, gpu)
        for t in range(2, 9):  # k + 1 <= 8 at B = 1: what Theorem 3.8 assumes
            assert 1.0 < bench.modelled_ratio(LLAMA_8B, gpu, t) < 1.01
        assert bench.modelled_ratio(LLAMA_8B, gpu, ridge // 2) < 1.1
        assert bench.modelled_ratio(LLAMA_8B, gpu, 4 * ridge) > 3  # now in proportion to T
    # At B = 64 on an H200 eight tokens per sequence is past the ridge: no longer free.
    assert bench.modelled_ratio(LLAMA_8B, "h200", 8, batch=64) > 1.5


def test_bad_inputs_raise_value_errors_that_say_what_to_pass():
    for kw, msg in (
        ({"tokens": 0}, "tokens"),
        ({"tokens": 2.5}, "tokens"),
        ({"tokens": 1, "batch": 0}, "batch"),
        ({"tokens": 1, "context": -1}, "context"),
        ({"tokens": 1, "overhead_s": -1e-6}, "overhead_s"),
        ({"tokens": 1, "overhead_s": math.inf}, "overhead_s"),
        ({"tokens": 1, "overhead_s": "none"}, "overhead_s"),
    ):
        with pytest.raises(ValueError, match=msg):
            bench.modelled_call(LLAMA_8B, "h200", **kw)
    with pytest.raises(ValueError, match="unknown GPU 'a100'; use one of"):
        bench.modelled_call(LLAMA_8B, "a100", 1)
    with pytest.raises(ValueError, match="unknown model shape"):
        bench.modelled_ratio("llama-2-7b", "h200", 2)
    with pytest.raises(ValueError, match="divisible by n_head"):
        ModelShape("bad", 1, 10, 3, 1, 8, 5)
    with pytest.raises(ValueError, match="multiple of n_kv_head"):
        ModelShape("bad", 1, 12, 4, 3, 8, 5)
    with pytest.raises(ValueError, match="bandwidth"):
        GPUSpec("bad", 0.0, 1e12, "made up")
    with pytest.raises(ValueError, match="memory"):
        GPUSpec("bad", 1e12, 1e12, "made up", memory=-1.0)
    with pytest.raises(ValueError, match="max_tokens"):
        bench.modelled_ridge(LLAMA_8B, "h200", max_tokens=0)
    with pytest.raises(ValueError, match="n_heads"):
        bench.medusa_heads_shape(LLAMA_8B, 0)


def test_predictions_follow_theorem_3_8_with_the_modelled_costs():
    acc = {"ngram": [(4, 0.75)], "draft": [(3, 0.8), (5, 0.8)], "medusa": [("t", 6, 2.0)]}
    preds = {p["method"]: p for p in bench.modelled_speedups(acc, "h200", batch=1)}
    ng = preds["ngram"]["rows"][0]
    assert ng["c"] == 0.0 and ng["thm38"] == theory.expected_tokens(0.75, 4)
    assert ng["ratio"] == bench.modelled_ratio(LLAMA_8B, "h200", 5)
    assert ng["priced"] == pytest.approx(ng["tokens"] / ng["ratio"])
    d = preds["draft"]["best"]
    # Memory bound at B = 1: c is about the draft's weight bytes over the target's.
    assert d["c"] == pytest.approx(LLAMA_1B.weight_bytes / LLAMA_8B.weight_bytes, rel=0.05)
    assert d["thm38"] == theory.speedup(0.8, d["k"], d["c"])
    assert d["priced"] == pytest.approx(d["tokens"] / (d["k"] * d["c"] + d["ratio"]))
    m = preds["medusa"]["best"]
    assert m["ratio"] == bench.modelled_ratio(LLAMA_8B, "h200", 6)
    assert m["priced"] == pytest.approx(2.0 / (m["ratio"] + m["c"])) and m["c"] > 0
    for p in preds.values():
        assert all(r["priced"] <= r["thm38"] for r in p["rows"])  # a call is never cheaper
    # A batch of 64 makes the (k + 1)-token call dearer: every prediction falls.
    wide = {p["method"]: p for p in bench.modelled_speedups(acc, "h200", batch=64)}
    assert all(wide[m]["best"]["priced"] < preds[m]["best"]["priced"] for m in preds)
    # Rows that do not fit the GPU are marked, and the best is chosen among those that do.
    on_4090 = bench.modelled_speedups(acc, "rtx4090", batch=64)
    assert not any(r["fits"] for p in on_4090 for r in p["rows"])
    assert all(r["fits"] for p in preds.values() for r in p["rows"])
    eagle = bench.modelled_speedups({"eagle": [(3, 0.8)]}, "h200")[0]["best"]
    assert 0 < eagle["c"] < d["c"]  # one layer and the LM head against a 16-layer model


def test_stored_acceptance_and_the_report(tmp_path):
    acc = bench.measured_acceptance(1.0)
    assert {"draft", "ngram", "eagle"} <= set(acc)
    assert all(0 < a < 1 for k, a in acc["draft"])
    with pytest.raises(ValueError, match="temperature"):
        bench.measured_acceptance(0.5)
    text = bench.format_roofline_report(batches=(1,))
    assert text.startswith("ROOFLINE MODEL (not a measurement)")
    assert "No GPU record is stored" in text
    # With a GPU record stored beside the CPU ones, the report points to it.
    for name in ("speedup_cpu.json", "eagle_cpu.json"):
        shutil.copy(results_dir() / name, tmp_path / name)
    record = {"machine": "NVIDIA H200", "date": "2026-12-01", "command": "c", "results": []}
    (tmp_path / "speedup-nvidia-h200-2026-12-01.json").write_text(json.dumps(record))
    text = bench.format_roofline_report(batches=(1,), directory=tmp_path)
    assert "A GPU record is stored (NVIDIA H200, 2026-12-01)" in text


def test_cli_prints_the_model_table(capsys):
    assert cli.main(["bench", "roofline", "--batch", "1", "64", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert out.count("ROOFLINE MODEL (not a measurement)") == 3
    ridge = bench.modelled_ridge(LLAMA_8B, "h100")
    assert f"| {ridge} (= {ridge} per call)" in out


def test_each_draft_is_priced_by_its_own_shape_and_an_unknown_one_raises():
    acc = {"draft": [(4, 0.8)], "fused": [(4, 0.8)], "recurrent": [(4, 0.8)]}
    preds = {p["method"]: p["best"] for p in bench.modelled_speedups(acc, "h200")}
    assert preds["fused"]["c"] == preds["draft"]["c"]  # the draft model's step, a small head
    # The recurrent draft reads most of what a target step reads per drafted token: its c is
    # its measured share of the course's target, not the 1B draft's.
    frac = bench.recurrent_token_fraction()
    assert 0.5 < frac < 1.0
    assert preds["recurrent"]["c"] == pytest.approx(frac, rel=0.02)
    assert preds["recurrent"]["c"] > 3 * preds["draft"]["c"]
    assert preds["recurrent"]["priced"] < preds["draft"]["priced"]
    with pytest.raises(ValueError, match="no price for method 'mystery'"):
        bench.modelled_speedups({"mystery": [(4, 0.8)]}, "h200")
    with pytest.raises(ValueError, match="fraction"):
        bench.scaled_draft_shape(LLAMA_8B, 0.0, "none")
