"""Item 11 of issue 14: ``compare`` holds a saved diagnosis to the JSON contract. NaN figures,
float or string ``_ns`` values, missing keys or a wrong version exit 2 with one line naming the
file — never exit 0 under ``--fail-on-regression``, never a traceback or exit 1."""
from __future__ import annotations

import copy
import json
import math

import pytest
from cli_proc import SAMPLES, Done, srtscope
from typer.testing import CliRunner

from srtscope.cli.app import app
from srtscope.cli.contract import ContractError, check, parse

runner = CliRunner()


@pytest.fixture(scope="module")
def saved() -> dict:
    r = runner.invoke(app, ["diagnose", str(SAMPLES / "healthy.sqlite"), "--json"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def _nan_everywhere(doc: dict) -> dict:
    def walk(x):
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return math.nan if isinstance(x, (int, float)) and not isinstance(x, bool) and x != 1 else x
    out = walk(doc)
    out["version"] = 1
    return out


def _set(path: str, value):
    def edit(doc: dict) -> dict:
        node = doc
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        if value is KeyError:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
        return doc
    return edit


MUTATIONS = {
    "all numbers NaN": (_nan_everywhere, "NaN"),
    "one figure NaN": (_set("bubbles.total_ns", math.nan), "bubbles.total_ns"),
    "Infinity": (_set("comm.exposed_ns", math.inf), "Infinity"),
    "float _ns": (_set("bubbles.total_ns", 1.5), "integer nanoseconds"),
    "string _ns": (_set("eager.extra_ns", "12"), "integer nanoseconds"),
    "negative count": (_set("bubbles.count", -4), "non-negative"),
    "bool count": (_set("steps.count", True), "steps.count"),
    "nested _ns map": (_set("bubbles.by_class", {"scheduler": 0.5}), "bubbles.by_class"),
    "missing verdict": (_set("verdict", KeyError), "verdict: missing"),
    "missing version": (_set("version", KeyError), "version"),
    "version 2": (_set("version", 2), "version: 2 is not supported"),
    "verdict a string": (_set("verdict", "kernel"), "verdict: must be a JSON object"),
    "unknown bottleneck": (_set("verdict.bottleneck", "gpu"), "verdict.bottleneck"),
    "confidence 7": (_set("verdict.confidence", 7), "verdict.confidence"),
    "bubbles a list": (_set("bubbles", []), "bubbles"),
}


@pytest.mark.parametrize("mutate, needle", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_malformed_saved_diagnosis_is_exit_2(tmp_path, saved, mutate, needle):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(saved))
    bad.write_text(json.dumps(mutate(copy.deepcopy(saved))))     # NaN written as the NaN literal
    for args in ([good, bad], [bad, good]):
        r = runner.invoke(app, ["compare", *map(str, args), "--fail-on-regression", "5"])
        line = Done(r.exit_code, r.stdout, r.stderr).one_error_line(2, str(bad), needle)
        assert "JSON contract" in line


def test_all_nan_file_through_the_installed_cli(tmp_path, saved):
    good, bad = tmp_path / "good.json", tmp_path / "nan.json"
    good.write_text(json.dumps(saved))
    bad.write_text(json.dumps(_nan_everywhere(copy.deepcopy(saved))))
    for extra in ([], ["--json"]):
        srtscope("compare", good, bad, "--fail-on-regression", "5", *extra, timeout=30).one_error_line(2, "NaN")


def test_valid_saved_diagnoses_still_compare(tmp_path, saved):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(saved))
    r = runner.invoke(app, ["compare", str(a), str(a), "--fail-on-regression", "0", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["regressions"] == []


def test_a_json_that_is_no_diagnosis_goes_to_the_trace_readers(tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"hello": [1, 2, NaN]}')
    r = runner.invoke(app, ["compare", str(other), str(other)])
    Done(r.exit_code, r.stdout, r.stderr).one_error_line(2, str(other))


def test_contract_check_names_the_path(saved):
    assert check(copy.deepcopy(saved)) is not None
    doc = parse(json.dumps(saved).replace('"window_ns": ', '"window_ns": NaN, "x": ', 1))
    with pytest.raises(ContractError, match=r"window_ns: NaN"):
        check(doc)
