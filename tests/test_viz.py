"""The acceptance heatmap that ``specvis generate`` writes (``heatmap.png``): the maps on one colour
scale and a colour bar that says what the colours mean (vmax at the top, labelled)."""

from __future__ import annotations

import numpy as np
import torch

from specvis.viz import colormap, colour_bar, contact_sheet, heatmap_scale, heatmap_sheet, heatmaps


def test_the_sheet_is_the_heatmaps_with_a_colour_bar_on_the_right():
    maps = torch.tensor([[[1, 2], [3, 8]], [[1, 1], [5, 4]]])
    plain = np.asarray(contact_sheet(heatmaps(maps, cell=40)))
    sheet = np.asarray(heatmap_sheet(maps, cell=40))
    assert sheet.shape[1] > plain.shape[1] + 20 and sheet.shape[0] >= plain.shape[0]
    assert (sheet[: plain.shape[0], : plain.shape[1]] == plain).all()
    bar = sheet[2:, plain.shape[1] + 5]  # a column inside the bar, top to bottom
    assert (bar[0] == colormap(np.array(8.0), 1.0, 8.0)).all()  # the top is the largest value
    bottom = np.nonzero((bar == colormap(np.array(1.0), 1.0, 8.0)).all(-1))[0]
    assert len(bottom) and bottom.max() > 0.9 * plain.shape[0]  # the bottom is one token a forward


def test_the_bar_runs_along_the_ramp_from_vmax_down():
    bar = np.asarray(colour_bar(1.0, 5.0, height=200, label="tokens committed by the forward"))
    column = bar[:, 3].astype(int)
    expected = colormap(np.linspace(5.0, 1.0, bar.shape[0]), 1.0, 5.0).astype(int)
    assert np.abs(column - expected).max() <= 1
    assert bar.shape[1] > 30  # ticks and the label beside the colours


def test_the_scale_starts_at_one_token_a_forward():
    assert heatmap_scale(torch.tensor([[1, 3], [2, 7]])) == (1.0, 7.0)
    assert heatmap_scale(torch.ones(2, 2)) == (0.0, 1.0)
