"""The quantisation search core with injected measurements: no onnxruntime, no timing, no host ISA."""

from __future__ import annotations

import math
from dataclasses import replace

from builder.optimise.quant_search import (DEFAULT, NOT_NEEDED, OVER_BUDGET, PASS, Candidate, Result, best, closest,
                                  DYNAMIC, dynamic_candidates, finalists, rerank, settle,
                                  default_candidates, fallback, format_table, rank_nodes, search, summary)


class FakeClock:
    """Advances by the seconds each evaluation 'costs'."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def evaluator(verdicts: dict[Candidate, Result], clock: FakeClock | None = None, cost: float = 1.0,
              otherwise: Result | None = None):
    seen = []

    def evaluate(candidate: Candidate) -> Result:
        seen.append(candidate)
        if clock is not None:
            clock.now += cost
        return verdicts.get(candidate, otherwise or Result(False, 0.5, failures=["logits: rel L2 5.0e-01 > 0.1"]))

    evaluate.seen = seen
    return evaluate


def test_avx2_outcome_default_recipe_fails_search_finds_reduce_range():
    """Simulates the AVX2-only EPYC: the default S8S8 recipe saturates (rel L2 0.15 > 0.1), reduce_range
    and U8U8 pass; the fastest passing one wins and the table says what changed."""
    candidates = default_candidates(128)
    rr = replace(DEFAULT, reduce_range=True)
    u8u8 = replace(DEFAULT, activation_type="U8", weight_type="U8")
    verdicts = {DEFAULT: Result(False, 0.15, 0.0, 2.4, ["logits: rel L2 1.5e-01 > 0.1"]),
                rr: Result(True, 0.03, 0.0, 1.8), u8u8: Result(True, 0.02, 0.0, 1.2)}
    rows = search(candidates, evaluator(verdicts), budget_seconds=1e9, clock=FakeClock())
    assert rows[0].verdict == "FAIL: logits: rel L2 1.5e-01 > 0.1"
    winner = best(rows)
    assert winner.candidate == rr and winner.verdict == PASS
    table = format_table(rows)
    assert "reduce_range False -> True" in table and "1.80x" in table and "0.15" in table
    assert summary(rows).startswith("search: QDQ, S8S8, per-channel, minmax, reduce_range chosen of 12 tried")


def test_default_recipe_passes_on_vnni_host_and_stop_when_skips_the_rest():
    ev = evaluator({DEFAULT: Result(True, 0.02, 0.0, 2.57)})
    rows = search(default_candidates(), ev, budget_seconds=1e9, clock=FakeClock(),
                  stop_when=lambda rows: best(rows) is not None)
    assert len(ev.seen) == 1 and best(rows).candidate == DEFAULT
    assert all(r.verdict == NOT_NEEDED for r in rows[1:])
    assert summary(rows).startswith("search: QDQ, S8S8, per-channel, minmax chosen of 1 tried (default recipe")


def test_best_is_fastest_passing_and_ties_go_to_smaller_error():
    a, b, c = DEFAULT, replace(DEFAULT, per_channel=False), replace(DEFAULT, calibration="entropy")
    rows = search([a, b, c], evaluator({a: Result(True, 0.05, speedup=1.5), b: Result(True, 0.01, speedup=1.5),
                                        c: Result(False, 0.01, speedup=3.0, failures=["drop"])}),
                  1e9, FakeClock())
    assert best(rows).candidate == b  # c is faster but failed
    d, e = replace(DEFAULT, reduce_range=True), replace(DEFAULT, per_channel=False)
    rows = search([d, e], evaluator({d: Result(True, 0.021, speedup=1.95), e: Result(True, 0.018, speedup=2.09)}),
                  1e9, FakeClock())
    assert best(rows).candidate == e  # within 10 % of each other: the smaller error
    rows = search([d, e], evaluator({d: Result(True, 0.010, speedup=1.95), e: Result(True, 0.018, speedup=1.2)}),
                  1e9, FakeClock())
    assert best(rows).candidate == d  # clearly faster and smaller error
    rows = search([a, e], evaluator({a: Result(True, 0.010, speedup=1.1), e: Result(True, 0.018, speedup=2.0)}),
                  1e9, FakeClock())
    assert best(rows).candidate == e  # clearly faster wins over a smaller error


def test_time_budget_stops_the_search_and_the_table_shows_what_was_not_tried():
    clock = FakeClock()
    ev = evaluator({}, clock, cost=30.0)
    rows = search(default_candidates(), ev, budget_seconds=60, clock=clock)
    assert len(ev.seen) == 2  # 0 s and 30 s start within the budget; at 60 s it is spent
    assert [r.verdict for r in rows[2:]] == [OVER_BUDGET] * (len(rows) - 2)
    assert "not tried (time budget spent: raise quantization.search_seconds)" in summary(rows)


def test_first_candidate_always_runs_even_with_zero_budget():
    ev = evaluator({}, FakeClock())
    rows = search(default_candidates(), ev, budget_seconds=0, clock=FakeClock())
    assert len(ev.seen) == 1 and rows[0].result is not None


def test_an_evaluation_that_raises_is_an_error_row_not_the_end_of_the_search():
    def evaluate(candidate):
        if candidate.quant_format == "QOperator":
            raise RuntimeError("ConvInteger not implemented")
        return Result(False, 0.3, failures=["x"])

    rows = search(default_candidates(), evaluate, 1e9, FakeClock())
    errors = [r for r in rows if r.verdict.startswith("ERROR")]
    assert len(errors) == 1 and "ConvInteger not implemented" in errors[0].verdict
    assert best(rows) is None


def test_nothing_passes_summary_names_smallest_error_and_the_fix():
    rows = search(default_candidates()[:3], evaluator({}, otherwise=Result(False, 0.4, failures=["f"])), 1e9,
                  FakeClock())
    text = summary(rows)
    assert text == ("search: none of 3 tried recipes passed verification; smallest rel L2 0.4 - keep FP32, "
                    "or relax verify.tolerance / verify.max_accuracy_drop")
    assert format_table(rows).count("FAIL: f") == 3


def test_sensitivities_rank_most_sensitive_first_and_fallback_excludes_them_in_that_order():
    sens = {"conv1": 0.02, "conv2": 0.30, "fc": 0.10, "conv3": 0.01}
    ranked = rank_nodes(list(sens), sens.__getitem__, deadline=1e9, clock=FakeClock())
    assert [n for n, _ in ranked] == ["conv2", "fc", "conv1", "conv3"]

    def evaluate(candidate):  # the budget holds once conv2 and fc are FP32
        ok = {"conv2", "fc"} <= set(candidate.exclude)
        return Result(ok, 0.05 if ok else 0.2, speedup=1.3, failures=[] if ok else ["rel L2 0.2 > 0.1"])

    start = replace(DEFAULT, reduce_range=True)
    rows = fallback(start, ranked, evaluate, deadline=1e9, clock=FakeClock())
    assert [r.candidate.exclude for r in rows] == [("conv2",), ("conv2", "fc")]
    assert rows[-1].verdict == PASS and rows[-1].stage == "fallback"
    assert best(rows).candidate.reduce_range  # the fallback starts from the given candidate
    assert "FP32 kept for conv2, fc" in format_table(rows)


def test_fallback_never_excludes_every_node_and_respects_the_deadline():
    ranked = [("a", 0.3), ("b", 0.2), ("c", 0.1)]
    rows = fallback(DEFAULT, ranked, lambda c: Result(False, 0.5, failures=["x"]), 1e9, FakeClock())
    assert [len(r.candidate.exclude) for r in rows] == [1, 2]  # all but one: an all-FP32 model is just onnx
    clock = FakeClock()
    ev = evaluator({}, clock, cost=10)
    rows = fallback(DEFAULT, ranked + [("d", 0.0)], ev, deadline=15, clock=clock)
    assert len(ev.seen) == 2 and rows[-1].verdict == OVER_BUDGET


def test_rank_nodes_unmeasured_after_deadline_go_last_in_graph_order():
    clock = FakeClock()

    def sensitivity(node):
        clock.now += 10
        return {"a": 0.1, "b": 0.5}[node]

    ranked = rank_nodes(["a", "b", "c", "d"], sensitivity, deadline=20, clock=clock)
    assert [n for n, _ in ranked] == ["b", "a", "c", "d"] and math.isnan(ranked[-1][1])


def test_closest_is_the_smallest_error_candidate():
    rr = replace(DEFAULT, reduce_range=True)
    rows = search([DEFAULT, rr], evaluator({DEFAULT: Result(False, 0.3, failures=["x"]),
                                            rr: Result(False, 0.12, failures=["x"])}), 1e9, FakeClock())
    assert closest(rows) == rr


def test_candidates_are_bounded_distinct_and_start_with_the_default_recipe():
    cands = default_candidates(128)
    assert cands[0] == DEFAULT and len(set(cands)) == len(cands) <= 16
    assert {c.types for c in cands} >= {"S8S8", "U8S8", "U8U8"}
    assert {c.calibration for c in cands} == {"minmax", "entropy", "percentile"}
    assert any(not c.per_channel for c in cands) and any(c.quant_format == "QOperator" for c in cands)
    assert any(c.samples == 32 for c in cands) and any(c.op_types for c in cands)


def test_noisy_speeds_are_settled_by_a_side_by_side_rerun_of_the_finalists():
    cands = default_candidates()[:5]
    speeds = [1.24, 1.49, 0.64, 1.53, 3.03]  # one lucky short measurement (3.03x) among equal graphs
    rows = search(cands, evaluator({c: Result(True, 0.02 + i / 100, speedup=s)
                                    for i, (c, s) in enumerate(zip(cands, speeds))}), 1e9, FakeClock())
    assert best(rows).candidate == cands[4]
    final = finalists(rows)
    assert [r.candidate for r in final] == [cands[4], cands[3]]  # none within 30 % of 3.03x: the runner-up
    speeds[4] = 1.9
    rows = search(cands, evaluator({c: Result(True, 0.02 + i / 100, speedup=s)
                                    for i, (c, s) in enumerate(zip(cands, speeds))}), 1e9, FakeClock())
    final = finalists(rows)
    assert [r.candidate for r in final] == [cands[4], cands[3], cands[1]]  # >= 1.9 / 1.3, fastest first
    rerank(rows, {4: 1.50, 3: 1.52, 1: 1.51})  # side by side they are equal: the smaller error wins
    assert best(rows).candidate == cands[1] and rows[1].remeasured
    assert "1.51x*" in format_table(rows) and format_table(rows).endswith("(the figure the choice used)")
    assert finalists(search(cands, evaluator({}), 1e9, FakeClock())) == []  # nothing passed


def test_settle_rounds_until_every_finalist_met_the_others():
    """A finalist that drops in the side-by-side run lets a stale lucky figure in: it is re-measured too."""
    cands = default_candidates()[:4]
    first = {cands[0]: 9.0, cands[1]: 6.8, cands[2]: 4.7, cands[3]: 1.0}
    side_by_side = {cands[0]: 4.3, cands[1]: 4.0, cands[2]: 3.6, cands[3]: 1.0}  # the truth, measured together
    rows = search(cands, evaluator({c: Result(True, 0.02 - i / 1000, speedup=v) for i, (c, v) in
                                    enumerate(first.items())}), 1e9, FakeClock())
    calls = []

    def remeasure(group):
        calls.append(list(group))
        return [side_by_side[c] for c in group]

    assert settle(rows, remeasure) == 2
    assert calls[0] == [cands[0], cands[1]]  # 6.8 is outside 30 % of 9.0: the runner-up joins anyway
    assert calls[1] == [cands[2], cands[0], cands[1]]  # the stale 4.7 leads now: all three meet, fastest first
    assert best(rows).candidate == cands[1]  # 4.0 within 10 % of 4.3, smaller error
    assert settle(rows, remeasure) == 0  # settled


def test_dynamic_candidates_where_dynamic_applies():
    cands = dynamic_candidates()
    assert cands[0] == DYNAMIC and cands[0].changes() == "default recipe"
    assert cands[0].label() == "dynamic, U8S8, per-tensor, ops MatMul+Gemm"  # no calibration: run-time scales
    assert [c.changes() for c in cands[1:]] == ["reduce_range False -> True", "types U8S8 -> U8U8",
                                                "per-channel weights"]


def _remeasurer(speeds: list[float]):
    """remeasure(candidates) returning the next injected speed on each call; records the calls."""
    queue = list(speeds)

    def remeasure(cands):
        remeasure.calls += 1
        return [queue.pop(0)] * len(cands)

    remeasure.calls = 0
    return remeasure


def test_a_default_recipe_slower_in_every_re_measurement_is_stably_slower():
    from builder.optimise.quant_search import Row, stably_slower

    row = Row(DEFAULT, Result(True, 0.02, 0.0, 0.55), PASS)
    remeasure = _remeasurer([0.60, 0.52, 0.58])
    assert stably_slower(row, remeasure) is True
    assert remeasure.calls == 3
    assert row.result.speedup == 0.58 and row.remeasured  # the median of the re-measurements


def test_one_slow_measurement_on_a_busy_host_is_noise_not_a_search_trigger():
    from builder.optimise.quant_search import Row, stably_slower

    row = Row(DEFAULT, Result(True, 0.02, 0.0, 0.55), PASS)
    remeasure = _remeasurer([1.04, 0.5, 0.5])
    assert stably_slower(row, remeasure) is False
    assert remeasure.calls == 1 and row.result.speedup == 1.04 and row.remeasured
    # within the noise band (0.9x > 1 / 1.15) or not measured at all: no re-measurement either
    for speed in (0.9, None, 2.57):
        quiet = _remeasurer([])
        assert stably_slower(Row(DEFAULT, Result(True, 0.02, 0.0, speed), PASS), quiet) is False
        assert quiet.calls == 0


def test_host_priors_follow_the_isa_and_come_right_after_the_default():
    from builder.optimise.quant_search import host_priors, with_priors

    u8s8_rr = replace(DEFAULT, activation_type="U8", weight_type="S8", reduce_range=True)
    assert host_priors(["avx2", "avx512f", "avx512_vnni"]) == [u8s8_rr]
    assert host_priors(["avx2"]) == [u8s8_rr]  # 7-bit weights: no VPMADDUBSW saturation without VNNI
    assert host_priors(["neon", "asimd"]) == [replace(DEFAULT, reduce_range=True),
                                              replace(DEFAULT, activation_type="U8", weight_type="U8")]
    assert host_priors(["avx2", "avx512_vnni"], dynamic=True) == [replace(DYNAMIC, per_channel=True)]
    ordered = with_priors(DEFAULT, [u8s8_rr], default_candidates())
    assert ordered[:2] == [DEFAULT, u8s8_rr] and len(ordered) == len(default_candidates())  # each recipe once


def _row(speed, passed=True, error=0.02, candidate=DEFAULT):
    from builder.optimise.quant_search import Row

    result = Result(passed, error, 0.0, speed, [] if passed else ["f"])
    return Row(candidate, result, PASS if passed else "FAIL: f")


def test_auto_settles_only_after_the_priors_and_only_on_a_clear_win_or_a_stable_slowdown():
    from builder.optimise.quant_search import auto_settled

    never = lambda cands: (_ for _ in ()).throw(AssertionError("no re-measurement expected"))  # noqa: E731
    prior = replace(DEFAULT, activation_type="U8", reduce_range=True)
    assert not auto_settled([_row(2.5)], 2, never)  # the prior is still to be tried
    assert auto_settled([_row(0.9), _row(2.9, candidate=prior)], 2, never)  # a clear win
    assert not auto_settled([_row(None, False), _row(None, False, candidate=prior)], 2, never)  # nothing passed
    # the noisy band: 0.90x is neither a win nor a slowdown: search on, nothing re-measured
    assert not auto_settled([_row(0.9), _row(0.88, candidate=prior)], 2, never)
    # 0.80x once, but at FP32 speed when re-measured side by side: noise, so search on
    rows = [_row(0.8), _row(0.82, candidate=prior)]
    assert not auto_settled(rows, 2, lambda cands: [1.0])
    assert rows[0].remeasured and not auto_settled(rows, 2, never)  # decided once, not re-measured again
    # stably slower in every re-measurement: INT8 loses on this host
    assert auto_settled([_row(0.6), _row(0.5, candidate=prior)], 2, lambda cands: [0.6])


def test_a_search_where_int8_stays_slower_than_fp32_skips_the_finalists_run_off():
    from builder.optimise.quant_search import auto_settled, loses_to_fp32

    prior = replace(DEFAULT, activation_type="U8", reduce_range=True)
    rows = [_row(0.6), _row(0.5, candidate=prior)]
    assert not loses_to_fp32(rows)  # one short measurement each: not decided yet
    assert auto_settled(rows, 2, lambda cands: [0.6])  # stably slower: re-measured 3 times
    assert rows[0].remeasured and loses_to_fp32(rows)
    noisy = [_row(0.8), _row(0.82, candidate=prior)]
    auto_settled(noisy, 2, lambda cands: [1.0])  # re-measured at FP32 speed: not a loss
    assert noisy[0].remeasured and not loses_to_fp32(noisy)
    assert not loses_to_fp32([_row(2.5)]) and not loses_to_fp32([_row(None, False)])
