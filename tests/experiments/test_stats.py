"""Tests of experiments/stats.py: mean ± std cells and paired changes between rows."""

from __future__ import annotations

import pytest

from experiments.stats import cell, change, change_cell


def test_stats_cells_and_paired_changes():
    assert cell([0.47, 0.48, 0.46]) == "0.470 ± 0.010" and cell([0.5]) == "0.500" and cell([]) == "–"
    row, parent = {0: 0.50, 1: 0.52, 2: 0.51, 3: 0.9}, {0: 0.40, 1: 0.43, 2: 0.41}
    delta, se, n = change(row, parent)  # seed 3 has no parent run: left out of the pairs
    assert n == 3 and delta == pytest.approx(0.0966667, abs=1e-6) and se == pytest.approx(0.0033333, abs=1e-6)
    assert change_cell(row, parent) == "+0.097 ± 0.003*"
    assert change_cell({0: 0.50, 1: 0.40}, {0: 0.45, 1: 0.44}).endswith("± 0.045")  # |Δ| < 2 SE: no star
    assert change_cell({0: 0.5}, {}) == "–"
