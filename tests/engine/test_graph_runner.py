"""Graph runner: capture list, can_run reasons, the padding replay uses (``prepare_replay``) on the CPU
with a stand-in graph; real capture on CUDA."""
from __future__ import annotations

import pytest
import torch

from srtscope.engine.config import EngineConfig
from srtscope.engine.forward_batch import ForwardMode
from srtscope.engine.runner.graph_runner import DEFAULT_CAPTURE_BS, GraphRunner, capture_bs_list
from srtscope.engine.runner.tp_worker import TpModelWorker
from tests.engine.worker_helpers import MiniBatcher


def test_capture_list_like_sglang_default():
    assert DEFAULT_CAPTURE_BS[:6] == [1, 2, 4, 8, 16, 24]
    assert DEFAULT_CAPTURE_BS[-1] == 256 and all(b % 8 == 0 for b in DEFAULT_CAPTURE_BS[3:])
    assert capture_bs_list(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_bs_list(3) == [1, 2]
    assert capture_bs_list(256, max_running_requests=20) == [1, 2, 4, 8, 16, 24]


def _runner(max_bs=64, disabled=False, on_cuda=True):
    return GraphRunner(None, capture_bs_list(max_bs), disabled=disabled, on_cuda=on_cuda, capture=False)


def test_padding_picks_the_next_bucket():
    gr = _runner(64)
    assert [gr.padded_size(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64)] == \
        [1, 2, 4, 4, 8, 8, 16, 16, 24, 40, 64]
    with pytest.raises(ValueError):
        gr.padded_size(65)


def test_reasons():
    gr = _runner(8)
    assert gr.classify(ForwardMode.DECODE, 5) == (True, None)
    assert gr.classify(ForwardMode.DECODE, 9) == (False, "bs_over_max")
    assert gr.classify(ForwardMode.EXTEND, 2) == (False, "extend")
    assert gr.classify(ForwardMode.MIXED, 2) == (False, "extend")
    assert _runner(8, disabled=True).classify(ForwardMode.DECODE, 2) == (False, "disabled")


@pytest.fixture(scope="module")
def worker():
    return TpModelWorker(EngineConfig(device="cpu", max_total_tokens=2048, cuda_graph_max_bs=16))


def test_cpu_is_always_eager_no_cuda(worker):
    mb = MiniBatcher(8, 2048)
    res = worker.forward_batch_generation(mb.extend({0: [1, 2, 3], 1: [4, 5]}))
    assert (res.graph_used, res.eager_reason, res.padded_bs) == (False, "no_cuda", 2)
    res = worker.forward_batch_generation(mb.decode({0: 7, 1: 8}))
    assert (res.graph_used, res.eager_reason, res.padded_bs) == (False, "no_cuda", 2)
    assert worker.graph_capture_bs == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend,dtype,tol", [("torch_native", "float32", 2e-3),
                                               ("auto", "bfloat16", 1e-1)])
def test_cuda_graph_replay_equals_eager(backend, dtype, tol):
    """Every captured size and sizes that pad; 'auto' in bf16 takes FlashInfer when importable."""
    from srtscope.engine.config import ModelConfig

    cfg = EngineConfig(device="cuda", max_total_tokens=8192, cuda_graph_max_bs=16,
                       attention_backend=backend, context_length=256, model=ModelConfig(dtype=dtype))
    w = TpModelWorker(cfg)
    assert w.graph_capture_bs == [1, 2, 4, 8, 16]
    for bs in (1, 2, 3, 4, 5, 8, 13, 16):
        mb = MiniBatcher(32, 256, device="cuda")
        prompts = {i: list(range(7 * i + 1, 7 * i + 1 + 3 + i)) for i in range(bs)}
        w.forward_batch_generation(mb.extend(prompts))
        fb = mb.decode({i: 5 + i for i in range(bs)})
        res = w.forward_batch_generation(fb)
        assert res.graph_used and res.eager_reason is None
        assert res.padded_bs == w.model_runner.graph_runner.padded_size(bs)
        eager = w.model_runner.forward_eager(fb)   # rewrites the same slots with the same K/V
        torch.testing.assert_close(res.logits, eager, atol=tol, rtol=tol)
    mb = MiniBatcher(32, 256, device="cuda")
    w.forward_batch_generation(mb.extend({i: [1, 2, 3] for i in range(17)}))
    res = w.forward_batch_generation(mb.decode({i: 4 for i in range(17)}))
    assert not res.graph_used and res.eager_reason == "bs_over_max"


class _FakeGraph:
    """Stands in for a CUDA graph on the CPU: replay re-runs the captured call on the same static
    inputs and writes the same static output, so buffer refills and in-place metadata are tested."""

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        self.out.copy_(self.fn())


class _SimulatedGraphRunner(GraphRunner):
    def _capture_one(self, fb):
        out = self.mr.run_model(fb)
        return _FakeGraph(lambda: self.mr.run_model(fb), out), out

    def _finish_capture(self):
        pass


def test_simulated_capture_and_replay_on_cpu():
    w = TpModelWorker(EngineConfig(device="cpu", max_total_tokens=4096, cuda_graph_max_bs=16,
                                   context_length=512))
    mr = w.model_runner
    mr.graph_runner = _SimulatedGraphRunner(mr, capture_bs_list(16), disabled=False, on_cuda=True)
    assert sorted(mr.graph_runner.graphs) == [1, 2, 4, 8, 16]
    for bs in (1, 3, 11):
        mb = MiniBatcher(32, 512)
        prompts = {i: list(range(3 * i + 1, 3 * i + 1 + 2 + 2 * i)) for i in range(bs)}
        res = w.forward_batch_generation(mb.extend(prompts))
        assert not res.graph_used and res.eager_reason == "extend"
        for _ in range(2):
            fb = mb.decode({i: int(t) for i, t in enumerate(res.next_token_ids.tolist())})
            res = w.forward_batch_generation(fb)
            assert res.graph_used and res.eager_reason is None
            assert res.padded_bs == mr.graph_runner.padded_size(bs)
            assert res.logits.shape[0] == bs
            eager = mr.forward_eager(fb)
            torch.testing.assert_close(res.logits, eager, atol=1e-4, rtol=0)
    mb = MiniBatcher(32, 512)
    w.forward_batch_generation(mb.extend({i: [1, 2] for i in range(17)}))
    res = w.forward_batch_generation(mb.decode({i: 3 for i in range(17)}))
    assert (res.graph_used, res.eager_reason, res.padded_bs) == (False, "bs_over_max", 17)
    # probes: run.graph_replay carries bs and padded_bs
    from srtscope.probes import ranges
    from srtscope.probes import recorder as rec

    rec._DEFAULT.clear()
    ranges.enable(nvtx=False)
    try:
        mb = MiniBatcher(32, 512)
        w.forward_batch_generation(mb.extend({i: [1, 2] for i in range(5)}))
        w.forward_batch_generation(mb.decode({i: 3 for i in range(5)}))
    finally:
        ranges.disable()
    spans = {s[0]: s[5] for s in rec._DEFAULT.raw_spans()}
    assert spans["run.graph_replay"] == {"bs": 5, "padded_bs": 8}
    assert spans["run.eager"]["reason"] == "extend"


def _simulated_worker(context_length=512):
    w = TpModelWorker(EngineConfig(device="cpu", max_total_tokens=4096, cuda_graph_max_bs=16,
                                   context_length=context_length))
    mr = w.model_runner
    mr.graph_runner = _SimulatedGraphRunner(mr, capture_bs_list(16), disabled=False, on_cuda=True)
    return w


def test_replay_padding_overwrites_a_larger_batch_and_writes_only_the_dummy_slot():
    """``prepare_replay`` — the padding replay uses: a 5-row decode after a 7-row one pads rows 5-7
    to (token 0, position 0, seq_len 1, request row 0, slot 0), whatever the 7-row batch left there;
    the replayed logits equal the unpadded eager ones and the padding writes only slot 0."""
    w = _simulated_worker()
    mr, gr = w.model_runner, w.model_runner.graph_runner
    mb = MiniBatcher(32, 512)
    prompts = {i: list(range(5 * i + 1, 5 * i + 4 + i)) for i in range(1, 8)}
    w.forward_batch_generation(mb.extend(prompts))
    big = mb.decode({i: 40 + i for i in prompts})            # 7 rows -> padded to 8
    pbig = gr.prepare_replay(big)
    assert pbig.batch_size == 8 and gr.out_cache_loc[:7].tolist() == big.out_cache_loc.tolist()
    k0 = [b[0].clone() for b in w.kv_pool.k_buffer]
    gr.replay(pbig, 7)
    assert all((b[0] != before).any() for b, before in zip(w.kv_pool.k_buffer, k0))  # padding wrote slot 0
    fb = mb.decode({i: 60 + i for i in range(1, 6)})        # 5 rows -> padded to 8
    k_before = [b.clone() for b in w.kv_pool.k_buffer]
    ref = mr.forward_eager(fb)
    pfb = gr.prepare_replay(fb)
    assert pfb.batch_size == 8 and pfb.seq_lens_cpu == fb.seq_lens_cpu + [1, 1, 1]
    assert gr.input_ids[5:8].tolist() == [0, 0, 0] and gr.positions[5:8].tolist() == [0, 0, 0]
    assert gr.seq_lens[5:8].tolist() == [1, 1, 1] and gr.req_pool_indices[5:8].tolist() == [0, 0, 0]
    assert gr.out_cache_loc[5:8].tolist() == [0, 0, 0]
    assert gr.out_cache_loc[:5].tolist() == fb.out_cache_loc.tolist()
    out = gr.replay(pfb, 5)
    assert out.shape[0] == 5
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=0)
    for before, after in zip(k_before, w.kv_pool.k_buffer):
        changed = (before != after).any(-1).any(-1).nonzero().flatten().tolist()
        assert set(changed) <= {0} | set(fb.out_cache_loc.tolist())


def test_replay_padding_rejects_extend_and_oversized_batches():
    w = _simulated_worker()
    gr = w.model_runner.graph_runner
    with pytest.raises(ValueError, match="forward_mode"):
        gr.prepare_replay(MiniBatcher(2, 512).extend({0: [1, 2]}))
    mb = MiniBatcher(32, 512)
    with pytest.raises(ValueError, match="bs"):
        gr.prepare_replay(mb.decode({i: 3 for i in range(17)}))
