"""``srtscope run --model PATH`` on an HF checkpoint folder (built by transformers, with a
word-level tokenizer.json), ``--html`` / ``--markdown`` of the run, and the one-line refusals."""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from srtscope.cli.app import app
from srtscope.engine.workloads import SAMPLE_TEXT

runner = CliRunner()
SMALL = ["--requests", "3", "--max-new-tokens", "4", "--device", "cpu", "--cpu-threads", "1"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "100"})


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.engine.hf_helpers import tiny_hf_checkpoint, tiny_tokenizer

    path = tmp_path_factory.mktemp("qwen3")
    tiny_hf_checkpoint(path, "qwen3", head_dim=32, seed=5)
    tiny_tokenizer(path, words=SAMPLE_TEXT.split())
    return path


def test_run_model_serves_the_checkpoint_with_word_prompts(qwen3, tmp_path):
    out = tmp_path / "run"
    r = invoke("run", "--model", qwen3, *SMALL, "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["capture"]["format"] == "srtscope-probe"
    report = json.loads((out / "workload_report.json").read_text())
    assert report["engine"]["model"] == {
        "path": str(qwen3), "type": "qwen3", "layers": 2, "hidden_size": 64, "heads": 4, "kv_heads": 2,
        "head_dim": 32, "vocab_size": 320, "dtype": "float32", "tokenizer": "tokenizer.json"}
    assert report["num_requests"] == 3 and report["output_tokens"] == 12
    sample = report["sample"]         # what the checkpoint answered the first request, as text
    assert sample["request"] == "user0" and isinstance(sample["output"], str)
    assert sample["prompt_end"].split() and set(sample["prompt_end"].split()) <= set(SAMPLE_TEXT.split())
    # the prompts are the sample text's words through the checkpoint's tokenizer: none is unknown
    from srtscope.engine.tokenizer import HFTokenizer
    from srtscope.engine.workloads import text_vocab

    vocab = text_vocab(HFTokenizer(str(qwen3)))
    assert 0 not in vocab and len(vocab) == len(set(SAMPLE_TEXT.split()))     # 0 is <unk>


def test_run_model_prints_what_model_ran(qwen3, tmp_path):
    r = invoke("run", "--model", qwen3, *SMALL, "--out", tmp_path / "run")
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert f"model: {qwen3} (qwen3, 2 layers x 64, 4/2 heads of 32, float32, prompts: words" in text
    assert "sample (user0): ...'" in text


def test_run_html_and_markdown_reports(tmp_path):
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    r = invoke("run", *SMALL, "--inject", "prep=30000", "--out", tmp_path / "run", "--html", html,
               "--markdown", md, "--json")
    doc = json.loads(r.stdout)
    assert doc["verdict"]["bottleneck"] == "prep"
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "srtscope run: run" in page and "batch_prep" in page
    assert r.exit_code == 0, r.stderr
    assert md.read_text().startswith("# srtscope diagnosis") and "PREP / batch_prep" in md.read_text()


def test_one_failing_report_does_not_cost_the_other(tmp_path, monkeypatch):
    import srtscope.cli.markdown as markdown

    def broken(doc):
        raise KeyError("x")

    monkeypatch.setattr(markdown, "diagnosis_markdown", broken)
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    r = invoke("run", *SMALL, "--out", tmp_path / "run", "--markdown", md, "--html", html)
    assert r.exit_code == 1
    assert r.stderr == f"srtscope: error: --markdown: {md}: not written: internal error: KeyError: 'x'\n"
    assert html.read_text().startswith("<!DOCTYPE html>") and not md.exists()
    assert (tmp_path / "run" / "diagnosis.json").exists()


def _edited(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_run_model_refusals_are_one_line(qwen3, tmp_path):
    cases = {
        "nowhere": (tmp_path / "nope", "--model {p}: not a folder"),
        "empty": (tmp_path / "empty", "--model {p}: no config.json in the folder"),
        "gelu": (_edited(qwen3, tmp_path / "gelu", hidden_act="gelu"),
                 "--model {p}: config.json hidden_act='gelu' is not supported (silu only)"),
        "sliding": (_edited(qwen3, tmp_path / "sw", layer_types=["sliding_attention"] * 2, sliding_window=8),
                    "--model {p}: config.json sliding-window attention (sliding_window=8 in 2 layer(s)"),
        "head_dim": (_edited(qwen3, tmp_path / "hd", head_dim=16),
                     "--model {p}: weights: 'model.layers.0.self_attn.q_proj.weight' expected shape (64, 64), "
                     "got (128, 64)"),
    }
    (tmp_path / "empty").mkdir()
    for name, (path, want) in cases.items():
        r = invoke("run", "--model", path, *SMALL, "--out", tmp_path / f"out-{name}")
        assert r.exit_code == 2, (name, r.stdout, r.stderr)
        assert r.stderr.startswith("srtscope: error: " + want.format(p=path)), (name, r.stderr)
        assert r.stderr.count("\n") == 1, name


def test_run_model_sizes_checked_against_tp_before_any_rank_starts(qwen3, tmp_path):
    r = invoke("run", "--model", qwen3, *SMALL, "--tp", "4", "--out", tmp_path / "run")
    assert r.exit_code == 2
    assert r.stderr == f"srtscope: error: --model {qwen3}: tp_size: num_kv_heads=2 is not divisible by tp_size=4\n"
    assert not (tmp_path / "run").exists()
