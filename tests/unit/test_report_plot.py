"""The build report's plot (builder/report/build_report.py): drawn from report rows, so tested with made-up rows."""

from __future__ import annotations

from builder.report.build_report import REL_L2_FLOOR, plot_figure, plot_png


def _row(name: str, speedup: float, rel_l2: float, drop: float | None = None, selected: bool = False,
         eligible: bool = True) -> dict:
    return {"variant": name, "throughput_by_batch": {1: 100.0 * speedup, 8: 600.0 * speedup}, "x onnx": speedup,
            "rel L2": rel_l2, "acc drop": drop, "selected": selected, "eligible": eligible}


ROWS = [_row("onnx", 1.0, 2.6e-7, selected=True), _row("torchscript", 0.97, 0.0),
        _row("onnx_opt", 1.01, 2.7e-7), _row("onnx_int8_static", 0.55, 0.15, eligible=False),
        _row("onnx_int8_dynamic", 0.2, 3e-3)]


def test_relative_error_is_on_a_log_axis_with_no_negative_range():
    right = plot_figure(ROWS).axes[1]
    assert right.get_yscale() == "log"
    low, high = right.get_ylim()
    assert 0 < low <= REL_L2_FLOOR and high >= 0.15  # the exact match (0) sits on the floor, drawn
    ys = [y for collection in right.collections for _, y in collection.get_offsets()]
    assert min(ys) == REL_L2_FLOOR and len(ys) == len(ROWS)


def test_variants_are_named_once_in_a_legend_not_in_annotations():
    figure = plot_figure(ROWS)
    assert all(not axis.texts for axis in figure.axes)  # no annotation can overlap a title or another one
    names = [text.get_text() for text in figure.legends[0].get_texts()]
    assert names[:5] == ["onnx (selected)", "torchscript", "onnx_opt", "onnx_int8_static (not eligible)",
                     "onnx_int8_dynamic"]
    assert [axis.get_title() for axis in figure.axes] == ["throughput vs batch size", "accuracy vs speed"]


def test_the_pareto_front_joins_the_eligible_variants_no_other_beats():
    figure = plot_figure(ROWS)
    lines = [line for line in figure.axes[1].get_lines() if line.get_linestyle() == "--"]
    assert len(lines) == 1, lines
    assert list(lines[0].get_xdata()) == [0.97, 1.0, 1.01]  # torchscript, onnx, onnx_opt; not int8 (slower, worse)
    assert "Pareto front (eligible variants)" in [t.get_text() for t in figure.legends[0].get_texts()]


def test_with_labels_the_drop_is_linear_and_the_limit_is_in_the_legend():
    rows = [dict(r, **{"acc drop": d}) for r, d in zip(ROWS, (0.0, 0.0, 0.0, 1.5, -0.2))]
    figure = plot_figure(rows, max_accuracy_drop=1.0)
    assert figure.axes[1].get_yscale() == "linear"
    assert "max accuracy drop (1)" in [t.get_text() for t in figure.legends[0].get_texts()]


def test_nothing_measured_draws_nothing():
    assert plot_png([dict(r, throughput_by_batch={}) for r in ROWS]) is None
    assert plot_png(ROWS)[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_long_not_made_reason_is_shortened_at_a_word_with_a_mark():
    from builder.report.build_report import _not_made_row

    why = "onnxruntime cannot run the dynamo export at batch 1 " + "because the exporter may have fixed that size " * 5
    status = _not_made_row("onnx", "failed", why)["status"]
    assert status.startswith("FAILED to make: onnxruntime cannot run") and status.endswith(" ...")
    assert len(status) <= len("FAILED to make: ") + 160 and " fix ..." not in status.replace("fixed", "")
