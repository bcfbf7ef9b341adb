"""common/data/units.py: units resampled to encoder frames."""

import torch

from common.data.units import units_at_frames


def test_units_at_frames_picks_the_unit_at_each_frame_centre_and_pads_with_minus_one():
    """100 Hz units -> 25 Hz frames: frame i takes unit 4 i; frames past the units get -1."""
    units = torch.arange(10).unsqueeze(0).repeat(2, 1)
    units[1, 5:] = -1
    resampled = units_at_frames(units, torch.tensor([10, 5]), 3, frame_rate_hz=25.0, unit_rate_hz=100.0)
    assert resampled.tolist() == [[0, 4, 8], [0, 4, -1]]
