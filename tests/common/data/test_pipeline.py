"""common/data/pipeline.py: metadata filters, token fields, collation with worker-side features."""

import numpy as np
import pytest
import torch
from speechbrain.dataio.batch import PaddedBatch
from speechbrain.lobes.features import Fbank
from speechbrain.utils.data_utils import batch_pad_right

from common.data.pipeline import collate, keep_mask, pad_right, speech_sample, text_batch, token_fields
from common.tokens import BLANK


def test_filters_drop_by_duration_token_count_and_rate():
    """Rows outside 1-10 s, over 5 tokens, or over 2 tokens/s are dropped; the rest kept."""
    durations = np.array([0.5, 2.0, 12.0, 2.0, 1.0])
    tokens = np.array([1, 3, 3, 6, 3])
    keep = keep_mask(durations, tokens, {"min_duration": 1.0, "max_duration": 10.0, "max_tokens": 5,
                                         "max_tokens_per_second": 2.0})
    assert keep.tolist() == [False, True, False, False, False]


def test_unknown_filter_names_the_valid_ones():
    """A typo in the yaml filters block is refused with the list of valid names."""
    with pytest.raises(ValueError, match="max_duration"):
        keep_mask(np.ones(2), np.ones(2), {"max_durration": 3})


def test_token_fields_add_bos_and_eos():
    """tokens_bos = [1] + tokens, tokens_eos = tokens + [2]."""
    fields = token_fields([5, 6])
    assert fields["tokens_bos"].tolist() == [1, 5, 6] and fields["tokens_eos"].tolist() == [5, 6, 2]


def test_worker_features_match_per_utterance_features():
    """feats of the shorter utterance equal Fbank of that utterance alone (padding does not leak)."""
    rng = np.random.default_rng(0)
    waves = [torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for n in (16000, 8000)]
    batch = collate([speech_sample(f"k{i}", w, "a", [4]) for i, w in enumerate(waves)], Fbank(n_mels=20))
    alone = Fbank(n_mels=20)(waves[1][None])[0]
    frames = int(round(batch.feats.lengths[1].item() * batch.feats.data.shape[1]))
    assert frames == alone.shape[0]
    assert torch.allclose(batch.feats.data[1, :frames], alone, atol=1e-4)
    assert getattr(batch, "sig", None) is None  # the waveform is not handed over as well
    assert batch.duration.tolist() == [1.0, 0.5]


def test_the_token_rate_filter_holds_for_the_fastest_speed_perturbation():
    """At speed 1.1 a 2 s utterance lasts 1.82 s: 4 tokens there exceed 2 tokens/s, so speed
    perturbation's fastest factor drops it, while duration limits stay on the recording's length."""
    durations, tokens = np.array([2.0, 2.0]), np.array([4, 3])
    filters = {"max_tokens_per_second": 2.0, "min_duration": 1.9}
    assert keep_mask(durations, tokens, filters).tolist() == [True, True]
    assert keep_mask(durations, tokens, filters, fastest_speed=1.1).tolist() == [False, True]


def test_crop_cuts_waveform_and_units_over_the_same_stretch_of_time():
    """crop_sample: 16000 samples from sample 8000 of a 3 s waveform keep units 25..74 of units at 50 Hz
    (unit j = j): the first unit of the crop is the one at 0.5 s and 50 units cover its 1 s; shorter
    waveforms are untouched; crop_start stays inside the waveform."""
    import numpy as np
    import torch

    from common.data.pipeline import crop_sample, crop_start

    waveform, units = torch.arange(48000.0), np.arange(150)
    cropped, kept = crop_sample(waveform, units, 16000, 8000, 50.0)
    assert cropped[0] == 8000 and len(cropped) == 16000 and kept.tolist() == list(range(25, 75))
    assert crop_sample(waveform[:1000], units[:3], 16000, 0, 50.0)[1].tolist() == [0, 1, 2]
    rng = np.random.default_rng(0)
    assert all(0 <= crop_start(48000, 16000, rng) <= 32000 for _ in range(100))
    assert crop_start(48000, 16000) == 0 and crop_start(1000, 16000, rng) == 0


@pytest.mark.parametrize("lengths", [[3, 0, 7, 1], [5], [2, 2]])
def test_text_batches_equal_speechbrains_padding_of_per_sentence_tensors(lengths):
    """text_batch pads all token fields at once; every field (data, relative lengths, dtype) equals
    SpeechBrain's PaddedBatch of the per-sentence tensors token_fields makes (the loader's batches before),
    for mono text (source = target), noised sources of other lengths and ids as the text loader's cache
    keeps them (uint16 arrays), including empty sentences."""
    rng = np.random.default_rng(0)
    lists = [rng.integers(5, 60, size=n).tolist() for n in lengths]
    cached = [np.array(ids, dtype=np.uint16) for ids in lists]
    for sources, targets in ((lists, lists), ([rng.integers(5, 60, size=n + 2) for n in lengths], lists),
                             (cached, cached)):
        keys, texts = [f"k{i}" for i in range(len(lengths))], [f"text {i}" for i in range(len(lengths))]
        ours = text_batch(keys, texts, sources, targets)
        theirs = PaddedBatch([{"id": k, "text": t, "src_tokens": torch.as_tensor(s, dtype=torch.long),
                               **token_fields(y)} for k, t, s, y in zip(keys, texts, sources, targets)],
                             padding_kwargs={"value": BLANK})
        assert ours.id == theirs.id and ours.text == theirs.text
        for field in ("src_tokens", "tokens", "tokens_bos", "tokens_eos"):
            mine, reference = getattr(ours, field), getattr(theirs, field)
            assert torch.equal(mine.data, reference.data) and torch.equal(mine.lengths, reference.lengths), field
        moved = ours.to("cpu")
        assert moved.tokens_eos.data.dtype == torch.long


@pytest.mark.parametrize("shapes", [[(3,), (7,), (1,)], [(4,)], [(3, 2), (5, 2)]])
def test_pad_right_equals_speechbrains_batch_pad_right(shapes):
    """pad_right's one-call padding gives batch_pad_right's padded tensor and relative lengths for 1-D
    tensors; other shapes (and single tensors) are SpeechBrain's own path."""
    tensors = [torch.randn(*shape) for shape in shapes]
    (ours, our_lengths), (theirs, their_lengths) = pad_right(tensors, value=0), batch_pad_right(tensors, value=0)
    assert torch.equal(ours, theirs) and torch.equal(our_lengths, their_lengths)
