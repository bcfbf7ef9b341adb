"""common/streaming.py: chunk-by-chunk features and encoding equal their offline counterparts."""

import pytest
import torch
from speechbrain.utils.dynamic_chunk_training import DynChunkTrainConfig

from common.decoding import ctc_greedy
from common.streaming import StreamingFrontEnd, StreamingRecognizer, check_streamable
from tests.common.test_models import fit_normalization, load_graph


@pytest.fixture(scope="module")
def model():
    """A tiny untrained streamable model (relative positions, global statistics fitted once)."""
    graph = load_graph(attention_type="RelPosMHAXL", num_encoder_layers=2, conformer_kernel_size=5)
    return fit_normalization(graph["model"], torch.randn(2, 16000) * 0.1, torch.ones(2))


@pytest.fixture(scope="module")
def noise():
    """2.3 s of noise: no frame is 80 dB under the loudest, so the Fbank's floor never differs per window."""
    return torch.randn(37123, generator=torch.Generator().manual_seed(0)) * 0.1


@pytest.mark.parametrize("piece", [1000, 4000, 10240, 50000])
def test_streamed_front_end_frames_equal_the_offline_ones(model, noise, piece):
    """Whatever the piece size, the front-end frames StreamingFrontEnd emits are the offline frames, each
    once and in order (the last ones when the recording ends)."""
    with torch.no_grad():
        offline = model.frontend(model.extract_features(noise[None], torch.ones(1)))
    front_end, frames = StreamingFrontEnd(model), []
    for start in range(0, len(noise), piece):
        out = front_end.push(noise[start:start + piece], final=start + piece >= len(noise))
        frames += [out] if out is not None else []
    streamed = torch.cat(frames, dim=1)
    assert streamed.shape == offline.shape and (streamed - offline).abs().max() < 1e-5


@pytest.mark.parametrize("chunk,left", [(4, 100), (4, 1), (7, 2)])
@torch.no_grad()
def test_chunk_by_chunk_encoding_equals_the_chunk_masked_full_encoding(model, noise, chunk, left):
    """encode_streaming over consecutive chunks, state carried, equals encoding the whole sequence under
    the same chunk mask, the mask dynamic chunk training trains with; with a left context longer than the
    recording this is full left context."""
    src = model.frontend(model.extract_features(noise[None], torch.ones(1)))
    config = DynChunkTrainConfig(chunk, left)
    full = model.transformer.encode(src, None, dynchunktrain_config=config)
    context = model.transformer.make_streaming_context(config)
    parts = [model.transformer.encode_streaming(src[:, s:s + chunk], context) for s in range(0, src.shape[1], chunk)]
    assert (torch.cat(parts, dim=1) - full).abs().max() < 1e-5


@pytest.mark.parametrize("left", [1, 100])
@torch.no_grad()
def test_one_chunk_covering_the_sequence_encodes_as_full_context(model, noise, left):
    """encode_streaming given the whole sequence as its one chunk equals the encoder without any chunk
    mask (full context), whatever the left context; a smaller chunk does not (the test can tell)."""
    src = model.frontend(model.extract_features(noise[None], torch.ones(1)))
    full = model.transformer.encode(src, None)
    whole = model.transformer.encode_streaming(src, model.transformer.make_streaming_context(
        DynChunkTrainConfig(src.shape[1], left)))
    assert (whole - full).abs().max() < 1e-5
    context = model.transformer.make_streaming_context(DynChunkTrainConfig(4, left))
    parts = [model.transformer.encode_streaming(src[:, s:s + 4], context) for s in range(0, src.shape[1], 4)]
    assert (torch.cat(parts, dim=1) - full).abs().max() > 1e-3


@torch.no_grad()
def test_a_chunk_covering_the_recording_decodes_as_offline_greedy_ctc(model, noise):
    """One chunk longer than the recording: the streamed greedy CTC ids are offline greedy CTC's, because
    the features and the encoder see exactly what they see offline."""
    recognizer = StreamingRecognizer(model, chunk_frames=1000, left_chunks=1)
    for start in range(0, len(noise), 5000):
        recognizer.push(noise[start:start + 5000])
    recognizer.push(torch.zeros(0), final=True)
    log_probs = model.ctc_log_probs(model.encode(noise[None], torch.ones(1)))
    assert recognizer.ids == ctc_greedy(log_probs, torch.ones(1))[0] and len(recognizer.ids) > 3


def test_a_model_that_cannot_stream_is_refused_naming_the_keys():
    """Absolute positions and sentence statistics cannot be computed chunk by chunk: both are named."""
    model = load_graph(attention_type="regularMHA", normalize_type="sentence")["model"]
    with pytest.raises(ValueError, match="attention_type: RelPosMHAXL.*normalize_type: global"):
        check_streamable(model, "--stream")
