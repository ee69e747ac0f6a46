"""Req / SamplingParams: validation naming the field, and every stop condition."""
from __future__ import annotations

import pytest

from srtscope.engine.request import FinishKind, Req, SamplingParams, SamplingParamsError, validate_prompt
from srtscope.engine.tokenizer import ByteTokenizer

EOS = 257


@pytest.mark.parametrize("kwargs, field", [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"seed": "x"}, "seed"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop": [""]}, "stop"),
])
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        SamplingParams(**kwargs)


def test_unknown_option_is_rejected_by_name():
    with pytest.raises(SamplingParamsError, match=r"^frequency_penalty: unknown sampling option"):
        SamplingParams.from_any({"max_new_tokens": 3, "frequency_penalty": 0.5})
    assert SamplingParams.from_any({"stop": "ab"}).stop == ("ab",)
    assert SamplingParams.from_any(None).is_greedy


@pytest.mark.parametrize("ids, msg", [
    ([], "empty prompt"),
    ([1] * 64, "leave no room"),
    ([1, 999], "token ids must be in"),
    ([1, "a"], "must be ints"),
])
def test_bad_prompts(ids, msg):
    with pytest.raises(ValueError, match=rf"^prompt: .*{msg}"):
        validate_prompt(ids, context_length=64, max_total_tokens=1000, vocab_size=320)


def _req(**sp) -> Req:
    return Req([1, 2, 3], SamplingParams(**sp), eos_token_id=EOS)


@pytest.mark.parametrize("sp, stream, kind, n_out", [
    ({"max_new_tokens": 3}, [5, 6, 7, 8], FinishKind.LENGTH, 3),
    ({"max_new_tokens": 9}, [5, EOS, 7], FinishKind.EOS, 2),
    ({"max_new_tokens": 9, "ignore_eos": True}, [5, EOS, 7], None, 3),
    ({"max_new_tokens": 9, "stop_token_ids": [7]}, [5, 6, 7, 8], FinishKind.STOP_TOKEN, 3),
    ({"max_new_tokens": 9, "stop": ["lo"]}, list(b"hello!"), FinishKind.STOP_STR, 5),
    ({"max_new_tokens": 9, "stop": ["zz"]}, list(b"hello!"), None, 6),
])
def test_stop_conditions(sp, stream, kind, n_out):
    req, tok = _req(**sp), ByteTokenizer()
    for t in stream:
        req.append_token(t, tok)
    assert len(req.output_ids) == n_out
    assert (req.finished_reason.kind if req.finished_reason else None) == kind


def test_finished_request_never_grows():
    req = _req(max_new_tokens=2)
    assert not req.append_token(4)
    assert req.append_token(5)
    assert not req.append_token(6)          # a one-step-late token is dropped
    assert req.output_ids == [4, 5]
    req.abort()
    assert req.finished_reason.kind is FinishKind.LENGTH   # first reason wins


def test_abort_and_retract_reset():
    req = _req(max_new_tokens=5)
    req.append_token(9)
    req.req_pool_idx, req.kv_len, req.prefix_len = 3, 4, 2
    req.reset_for_retract()
    assert (req.req_pool_idx, req.kv_len, req.prefix_len, req.num_retractions) == (None, 0, 0, 1)
    assert req.output_ids == [9] and req.fill_ids == [1, 2, 3, 9]
    req.abort("client went away")
    assert req.finished_reason.to_dict() == {"type": "abort", "matched": None,
                                             "message": "client went away"}
