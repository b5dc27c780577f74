"""How formed batch sizes are printed (builder/tuning/stats.py): the most frequent ones in size order,
and what was left out - a size missing from the line must not read as one Triton never formed."""

from builder.tuning.stats import format_batch_sizes


def test_left_out_sizes_are_counted():
    formed = {"1": 12392, "2": 451, "3": 236, "4": 40, "5": 12, "6": 389, "7": 3}
    assert format_batch_sizes(formed, 4) == "1x12392 2x451 3x236 6x389 (+3 sizes: 55 executions)"
    assert format_batch_sizes(formed, 6) == "1x12392 2x451 3x236 4x40 5x12 6x389 (+1 size: 3 executions)"
    assert format_batch_sizes({"8": 2, "1": 5}) == "1x5 8x2"
    assert format_batch_sizes({}) == "-"
