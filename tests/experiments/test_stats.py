"""Tests of experiments/stats.py: mean ± std cells and paired changes between rows."""

from __future__ import annotations

import pytest

from experiments.stats import cell, change, change_cell, interval, t_quantile


def test_stats_cells_and_paired_changes():
    assert cell([0.47, 0.48, 0.46]) == "0.470 ± 0.010" and cell([0.5]) == "0.500" and cell([]) == "–"
    row, parent = {0: 0.50, 1: 0.52, 2: 0.51, 3: 0.9}, {0: 0.40, 1: 0.43, 2: 0.41}
    delta, se, n = change(row, parent)  # seed 3 has no parent run: left out of the pairs
    assert n == 3 and delta == pytest.approx(0.0966667, abs=1e-6) and se == pytest.approx(0.0033333, abs=1e-6)
    assert change_cell(row, parent) == "+0.097 [+0.082, +0.111]*"  # Δ ± t(2) SE = ± 4.303 x 0.00333
    assert change_cell({0: 0.50, 1: 0.40}, {0: 0.45, 1: 0.44}) == "+0.005 [-0.567, +0.577]"  # includes 0: no star
    assert change_cell({0: 0.5}, {}) == "–" and change_cell({0: 0.5}, {0: 0.4}) == "+0.100"


def test_the_paired_interval_is_students_t_not_two_standard_errors():
    """The 95% interval of a mean paired difference over n seeds is Δ ± t(n − 1) · SE: 4.303 SE at 3 seeds
    (where ± 2 SE would cover about 82%), 2.365 SE at 8; a difference whose ± 2 SE excludes 0 can have a
    t interval that includes it."""
    assert t_quantile(0.95, 2) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(0.95, 7) == pytest.approx(2.3646, abs=1e-4)
    row, parent = {0: 0.7549, 1: 0.7525, 2: 0.7521}, {0: 0.7539, 1: 0.7493, 2: 0.7489}  # RESULTS.md's GLUE pair
    delta, low, high, n = interval(row, parent)
    _, se, _ = change(row, parent)
    assert n == 3 and delta - 2 * se > 0  # "over 2 SE"
    assert low == pytest.approx(delta - 4.3027 * se, abs=1e-6) and low < 0 < high  # yet the 95% interval holds 0
    assert interval({0: 0.5}, {0: 0.4})[1] != interval({0: 0.5}, {0: 0.4})[1]  # nan: one pair has no spread
