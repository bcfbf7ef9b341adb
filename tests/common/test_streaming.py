"""common/streaming.py: chunk-by-chunk features and encoding equal their offline counterparts."""

import math

import pytest
import torch
from speechbrain.utils.dynamic_chunk_training import DynChunkTrainConfig

from common.decoding import ctc_greedy
from common.streaming import (
    Endpointer,
    StreamingBeamRecognizer,
    StreamingFrontEnd,
    StreamingRecognizer,
    check_streamable,
)
from common.tokens import BOS, EOS
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


@pytest.fixture(scope="module")
def causal_model():
    """The tiny streamable model with causal statistics (normalize_type: causal)."""
    graph = load_graph(attention_type="RelPosMHAXL", num_encoder_layers=2, conformer_kernel_size=5,
                       normalize_type="causal")
    return fit_normalization(graph["model"], torch.randn(2, 16000) * 0.1, torch.ones(2))


@pytest.mark.parametrize("piece", [1000, 4000, 10240, 50000])
@pytest.mark.parametrize("normalization", ["global", "causal"])
def test_streamed_front_end_frames_equal_the_offline_ones(model, causal_model, noise, piece, normalization):
    """Whatever the piece size, the front-end frames StreamingFrontEnd emits are the offline frames, each
    once and in order (the last ones when the recording ends); with causal statistics too, whose sums
    run over the whole recording across pieces (the noise grows louder, so they matter)."""
    if normalization == "causal":
        model, noise = causal_model, noise * torch.linspace(0.2, 3.0, len(noise))
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
    with pytest.raises(ValueError, match="attention_type: RelPosMHAXL.*normalize_type: causal, global or frame"):
        check_streamable(model, "--stream")


def sequence_log_likelihood(log_probs, ids):
    """Sum of ``log_probs`` [steps, vocab] at ``ids + [</s>]``, one step each."""
    return sum(float(log_probs[step, token]) for step, token in enumerate(ids + [EOS]))


@pytest.mark.parametrize("prefix", [[], [6]])
@torch.no_grad()
def test_rescoring_scores_each_hypothesis_by_its_teacher_forced_log_likelihoods(model, noise, prefix):
    """StreamingBeamRecognizer.rescore of hypotheses of different lengths, padded together: with CTC weight
    0 each score is the decoder's teacher-forced log-likelihood of the hypothesis and </s> after <s> and the
    prefix (model.forward, one hypothesis at a time); with CTC weight 1 and an LM, the CTC score given plus
    the LM's log-likelihood; length normalisation divides by the tokens scored."""
    from speechbrain.lobes.models.RNNLM import RNNLM

    torch.manual_seed(0)
    lm = RNNLM(output_neurons=11, embedding_dim=8, rnn_layers=1, rnn_neurons=8, dnn_blocks=1, dnn_neurons=8).eval()
    nbest, ctc = [[5, 6, 7], [8], [5, 5, 9, 10, 7]], torch.tensor([-1.0, -2.0, -3.0])
    recognizer = StreamingBeamRecognizer(model, 4, 2, ctc_weight=0.0, length_normalization=False, lm=lm,
                                         lm_weight=0.0, prefix_ids=prefix)
    recognizer.segment_states = [model.encode(noise[None], torch.ones(1))]
    attention = recognizer.rescore(nbest, ctc)
    for score, ids in zip(attention, nbest):
        tokens_bos = torch.tensor([[BOS] + prefix + ids])
        seq_log_probs = model(noise[None], torch.ones(1), tokens_bos).seq_log_probs[0, len(prefix):]
        assert abs(float(score) - sequence_log_likelihood(seq_log_probs, ids)) < 1e-4
    recognizer.ctc_weight, recognizer.lm_weight = 1.0, 1.0
    fused = recognizer.rescore(nbest, ctc)
    for score, ids, ctc_score in zip(fused, nbest, ctc):
        lm_log_probs = torch.log_softmax(lm(torch.tensor([[BOS] + ids])), dim=-1)[0]
        assert abs(float(score) - float(ctc_score) - sequence_log_likelihood(lm_log_probs, ids)) < 1e-4
    recognizer.length_normalization = True
    normalized = recognizer.rescore(nbest, ctc)
    assert torch.allclose(normalized, fused / torch.tensor([4.0, 2.0, 6.0]))


def test_the_endpointer_applies_wenets_three_rules():
    """At 40 ms frames: nothing decoded, 5 s of blank ends the segment (4.96 s does not); once something
    is decoded, 1 s of trailing blank does (a non-blank frame restarts the count); 20 s of speech does."""
    silent, voiced = torch.full((1,), -0.01), torch.full((1,), -3.0)
    endpointer = Endpointer(frame_ms=40.0)
    assert not endpointer.step(silent.repeat(124), decoded=False)
    assert endpointer.step(silent, decoded=False)
    endpointer.reset()
    assert not endpointer.step(torch.cat([silent.repeat(24), voiced, silent.repeat(24)]), decoded=True)
    assert endpointer.step(silent, decoded=True)
    endpointer.reset()
    assert not endpointer.step(voiced.repeat(499), decoded=True)
    assert endpointer.step(voiced, decoded=True)


@pytest.mark.parametrize("fires", [False, True])
@torch.no_grad()
def test_segments_close_at_endpoints_and_the_text_is_their_concatenation(model, noise, fires):
    """An endpointer that never fires leaves one segment, closed and rescored at the end; one that fires
    after every chunk closes a segment per chunk that decoded something. Either way the final ids are the
    segments' ids in order, and a segment is one of its CTC n-best (the rescoring picks, never invents)."""
    never, always = Endpointer(40.0, no_speech_ms=math.inf, trailing_silence_ms=math.inf, max_segment_ms=math.inf), \
        Endpointer(40.0, no_speech_ms=0.0, trailing_silence_ms=0.0)
    recognizer = StreamingBeamRecognizer(model, 8, 2, beam_size=4, endpointer=always if fires else never)
    picked, nbests = [], []
    rescore = recognizer.rescore

    def spy(nbest, ctc_scores):
        scores = rescore(nbest, ctc_scores)
        nbests.append(nbest)
        picked.append(nbest[int(scores.argmax())])
        return scores

    recognizer.rescore = spy
    for start in range(0, len(noise), 3000):
        recognizer.push(noise[start:start + 3000])
    recognizer.push(torch.zeros(0), final=True)
    chunks = -(-recognizer.frontend.emitted // 8)
    assert len(recognizer.finals) == (chunks if fires else 1) and recognizer.finals == picked
    assert recognizer.ids == [token for segment in recognizer.finals for token in segment] and recognizer.ids
    assert all(len(nbest) > 1 for nbest in nbests)
