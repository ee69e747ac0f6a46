"""Eager fallback: decode steps run eagerly where graphs were used elsewhere; reason and cost."""
import pandas as pd

from srtscope.analyzers.analyses.eager import eager_fallback, eager_reasons

US = 1000


def steps(rows):
    cols = ["step", "mode", "bs", "padded_bs", "exec", "reason", "wall_ns", "launches"]
    return pd.DataFrame(rows, columns=cols)


def test_reasons_given_and_inferred():
    t = steps([
        (0, "decode", 16, 16, "graph", "", 1000 * US, 0),       # graphs were used
        (1, "decode", 64, 64, "graph", "", 1200 * US, 0),       # largest captured size 64
        (2, "decode", 96, -1, "eager", "", 3000 * US, 300),     # inferred: bs above 64
        (3, "extend", 8, -1, "eager", "", 2000 * US, 300),      # inferred: extend batch
        (4, "decode", 32, -1, "eager", "disabled", 2500 * US, 300),   # the engine said so
    ])
    assert eager_reasons(t).tolist() == ["", "", "bs_over_max", "extend", "disabled"]
    r = eager_fallback(t)
    assert r.graph_steps == 2 and r.eager_decode_steps == 2     # the prefill step is not a fallback
    assert r.reasons == {"bs_over_max": 1, "disabled": 1}
    assert r.max_captured_bs == 64
    assert r.eager_mean_launches == 300 and r.graph_mean_launches == 0
    # cost vs graph steps of the nearest size: step 2 (bs 96) vs bs 64 (1200), step 4 (bs 32) vs 16 (1000)
    assert r.extra_ns == (3000 - 1200) * US + (2500 - 1000) * US
    assert r.example_steps == (2, 4) and r.batch_sizes == (32, 96)


def test_no_graphs_anywhere_means_disabled_not_fallback():
    t = steps([(0, "decode", 8, -1, "eager", "", 100, 10), (1, "decode", 8, -1, "eager", "", 100, 10)])
    assert eager_reasons(t).tolist() == ["disabled", "disabled"]
    r = eager_fallback(t)
    assert r.eager_decode_steps == 0 and r.extra_ns == 0 and r.graph_mean_wall_ns is None


def test_empty():
    r = eager_fallback(steps([]))
    assert r.graph_steps == 0 and r.reasons == {}
