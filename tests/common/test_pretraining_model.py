"""common/models/pretraining.py: the pretraining passes over the shared graph keep its weight names."""

import math

import numpy as np
import pytest
import torch

from common.masking import mask_spans
from common.models.pretraining import JointPretrainModel, PretrainHeads, decode_teacher_forced, encode_embedded
from tests.common.test_models import fit_normalization, load_graph

N_UNITS = 9


def pretrain_model():
    graph = load_graph(spec_augment_prob=0.0, dropout=0.0)
    return JointPretrainModel(graph["model"], PretrainHeads(16, N_UNITS))


def test_encode_embedded_equals_the_transformer_encoder_after_its_input_projection():
    """The text/masked path reuses the encoder exactly: same states as TransformerASR.encode."""
    joint = pretrain_model()
    wavs, wav_lens = torch.randn(2, 16000), torch.tensor([1.0, 0.6])
    model = fit_normalization(joint.model, wavs, wav_lens)
    src = model.frontend(model.extract_features(wavs, wav_lens))
    projected = model.transformer.custom_src_module(src.flatten(start_dim=2))
    assert torch.allclose(encode_embedded(model.transformer, projected, wav_lens)[0],
                          model.encode(wavs, wav_lens), atol=1e-5)


def test_teacher_forced_decoding_equals_the_graph_forward():
    """Speech through encode_embedded + decode_teacher_forced = SpeechEncoderDecoder.forward."""
    joint = pretrain_model()
    wavs, wav_lens = torch.randn(2, 16000), torch.tensor([1.0, 0.6])
    model = fit_normalization(joint.model, wavs, wav_lens)
    tokens_bos = torch.tensor([[1, 4, 5], [1, 6, 0]])
    src = model.frontend(model.extract_features(wavs, wav_lens))
    states, padding = encode_embedded(model.transformer,
                                      model.transformer.custom_src_module(src.flatten(start_dim=2)), wav_lens)
    dec = decode_teacher_forced(model.transformer, tokens_bos, states, padding)
    expected = model(wavs, wav_lens, tokens_bos).seq_log_probs
    assert torch.allclose(torch.log_softmax(model.seq_lin(dec), -1), expected, atol=1e-5)


def test_fully_masked_speech_does_not_depend_on_the_audio():
    """With every frame masked the encoder sees only mask embeddings: two different inputs give the
    same unit logits; with spans masked they differ. Shapes: [batch, 26 frames, n_units]."""
    joint = pretrain_model()
    wav_lens = torch.ones(2)
    fit_normalization(joint.model, torch.randn(2, 16000), wav_lens)
    everything = lambda lengths, frames: torch.ones(len(lengths), frames, dtype=torch.bool)  # noqa: E731
    a, b = torch.randn(2, 16000), torch.randn(2, 16000)
    out_a, out_b = (joint("speech", w, wav_lens, everything) for w in (a, b))
    assert out_a.unit_logits.shape == (2, 26, N_UNITS)
    assert torch.allclose(out_a.unit_logits, out_b.unit_logits, atol=1e-5)
    spans = lambda lengths, frames: mask_spans(lengths, frames, 0.3, 3, np.random.default_rng(0))  # noqa: E731
    assert not torch.allclose(joint("speech", a, wav_lens, spans).unit_logits,
                              joint("speech", b, wav_lens, spans).unit_logits)


def test_text_pass_trains_the_shared_embedding_encoder_and_decoder():
    """A text batch yields decoder log-probs [batch, target + 1, vocab] and gradients in the token
    embedding, the encoder, the decoder and seq_lin (none in the speech front-end)."""
    joint = pretrain_model()
    src, src_lens = torch.tensor([[4, 5, 6, 7], [8, 9, 0, 0]]), torch.tensor([1.0, 0.5])
    log_probs = joint("text", src, src_lens, torch.tensor([[1, 4, 5], [1, 8, 0]]))
    assert log_probs.shape == (2, 3, 11)
    log_probs.sum().backward()
    grads = {name for name, p in joint.model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    for prefix in ("transformer.custom_tgt_module", "transformer.encoder", "transformer.decoder", "seq_lin"):
        assert any(name.startswith(prefix) for name in grads), prefix
    assert not any(name.startswith("frontend") for name in grads)


def test_the_language_model_pass_trains_the_decoder_alone_and_is_causal():
    """text_lm: log-probs [batch, length, vocab] of the tokens with no source; gradients reach the
    token embedding, decoder and seq_lin but not the encoder; a later token does not change an
    earlier position's prediction (a language model, not a copy)."""
    joint = pretrain_model()
    tokens = torch.tensor([[1, 4, 5, 6], [1, 8, 9, 0]])
    log_probs = joint("text_lm", tokens)
    assert log_probs.shape == (2, 4, 11)
    log_probs.sum().backward()
    grads = {name for name, p in joint.model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    for prefix in ("transformer.custom_tgt_module", "transformer.decoder", "seq_lin"):
        assert any(name.startswith(prefix) for name in grads), prefix
    assert not any(name.startswith(("transformer.encoder", "frontend")) for name in grads)
    changed = tokens.clone()
    changed[0, 3] = 7
    with torch.no_grad():
        assert torch.allclose(joint("text_lm", tokens)[0, :3], joint("text_lm", changed)[0, :3], atol=1e-5)
        assert not torch.allclose(joint("text_lm", tokens)[0, 3], joint("text_lm", changed)[0, 3])


def test_the_graph_inside_the_pretrain_model_loads_strictly_into_a_finetune_build():
    """Pretraining adds weights only under heads: model.* loads into a plain graph by name."""
    joint = pretrain_model()
    target = load_graph()["model"]
    target.load_state_dict(joint.model.state_dict(), strict=True)
    assert all(not name.startswith("model.") for name in joint.heads.state_dict())


def test_bestrq_targets_are_deterministic_for_a_seed_and_at_the_encoder_frame_rate():
    """Same seed → same projection, codebook and codes; another seed → other codes; one code per encoder
    frame (stacked Fbank frames), within the codebook; padding does not change an utterance's codes."""
    from common.models.pretraining import BestRqTargets

    torch.manual_seed(0)
    feats = torch.randn(2, 37, 20) * 3 + 1
    lens = torch.tensor([1.0, 24 / 37])
    first, again, other = (BestRqTargets(20, 4, 64, 8, seed=s) for s in (7, 7, 8))
    codes = first(feats, lens, 10)
    assert codes.shape == (2, 10) and codes.dtype == torch.long
    assert int(codes.min()) >= 0 and int(codes.max()) < 64
    assert torch.equal(codes, again(feats, lens, 10))
    assert not torch.equal(codes, other(feats, lens, 10))
    alone = first(feats[1:, :24], torch.tensor([1.0]), 6)
    assert torch.equal(alone, codes[1:, :6])
    assert len(set(codes[0].tolist())) > 1  # not a constant target


def test_unit_sequences_merge_repeats_row_by_row_within_each_length():
    """deduplicated_unit_sequences: each row's units up to its length with runs merged, offset past
    pad / BOS / EOS; tokens_bos = [BOS] + them, tokens_eos = them + [EOS]; row i stays row i."""
    from common.data.units import UNIT_TOKEN_OFFSET, deduplicated_unit_sequences

    units = torch.tensor([[3, 3, 3, 1, 1, 3, 0, 0], [2, 2, 2, 2, 2, 2, 2, 5], [4, 0, 0, 4, 4, 7, 7, 7]])
    bos, eos, lens = deduplicated_unit_sequences(units, torch.tensor([6, 7, 8]))
    expected = [[3, 1, 3], [2], [4, 0, 4, 7]]
    for row, units_of_row in enumerate(expected):
        n = len(units_of_row)
        assert (eos[row, :n] - UNIT_TOKEN_OFFSET).tolist() == units_of_row and eos[row, n] == 2
        assert bos[row, 0] == 1 and torch.equal(bos[row, 1:n + 1], eos[row, :n])
        assert eos[row, n + 1:].eq(0).all() and bos[row, n + 1:].eq(0).all()
        assert float(lens[row]) == pytest.approx((n + 1) / eos.shape[1])


def test_the_unit_decoder_predicts_the_deduplicated_targets_of_its_own_utterance():
    """add_decoder: a speech pass also yields unit-decoder log-probs [batch, units + 1, n_units + 3] whose
    targets are each utterance's frame targets (within its frames, -1 excluded) with repeats merged;
    its loss trains the shared decoder layers and the unit embedding, not the text embedding."""
    from common.data.units import UNIT_TOKEN_OFFSET
    from common.objectives import sequence_loss

    graph = load_graph(spec_augment_prob=0.0, dropout=0.0)
    joint = JointPretrainModel(graph["model"], PretrainHeads(16, N_UNITS, add_decoder=True))
    wavs, wav_lens = torch.randn(2, 16000), torch.tensor([1.0, 0.5])
    fit_normalization(joint.model, wavs, wav_lens).train()
    frame_units = torch.tensor([[1, 1, 2, 2, 2, 5] * 5, [7, 7, 7, 3, 3, 8] * 5])[:, :26]
    frame_units[1, 13:] = -1  # the second utterance has 13 frames
    spans = lambda lengths, frames: mask_spans(lengths, frames, 0.3, 3, np.random.default_rng(0))  # noqa: E731
    out = joint("speech", wavs, wav_lens, spans, frame_targets=lambda frames: frame_units[:, :frames])
    assert torch.equal(out.targets, frame_units)
    first = (out.unit_tokens_eos[0] - UNIT_TOKEN_OFFSET).tolist()
    assert first[:first.index(2 - UNIT_TOKEN_OFFSET)] == [1, 2, 5] * 4 + [1]  # 26 frames: 4 x 6 + [1, 1]
    n_second = int(round(float(out.unit_tokens_lens[1]) * out.unit_tokens_eos.shape[1])) - 1
    assert (out.unit_tokens_eos[1, :n_second] - UNIT_TOKEN_OFFSET).tolist() == [7, 3, 8, 7, 3, 8, 7]
    assert out.unit_decoder_log_probs.shape == (2, out.unit_tokens_eos.shape[1], N_UNITS + UNIT_TOKEN_OFFSET)
    sequence_loss(out.unit_decoder_log_probs, out.unit_tokens_eos, out.unit_tokens_lens)["loss"].backward()
    grads = {name for name, p in joint.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    for prefix in ("heads.unit_embedding", "heads.unit_decoder_head", "model.transformer.decoder",
                   "model.transformer.encoder"):
        assert any(name.startswith(prefix) for name in grads), prefix
    assert not any(name.startswith(("model.transformer.custom_tgt_module", "model.seq_lin")) for name in grads)
    without = JointPretrainModel(load_graph(spec_augment_prob=0.0)["model"], PretrainHeads(16, N_UNITS))
    assert "unit_embedding.emb.Embedding.weight" not in without.heads.state_dict()  # old checkpoints still load


def test_voiced_frames_are_the_loud_ones_within_each_length():
    """voiced_frames: a tone in the first half of silence is voiced there, silent after it; padding is
    never voiced; at the encoder frame count asked for."""
    from speechbrain.lobes.features import Fbank

    from common.models.pretraining import voiced_frames

    wav = torch.zeros(2, 16000)
    wav[:, :8000] = 0.5 * torch.sin(torch.arange(8000) * 2 * math.pi * 440 / 16000)
    wav[:, 8000:] = 1e-5 * torch.randn(2, 8000)
    fbank = Fbank(n_mels=20)(wav)
    voiced = voiced_frames(fbank, torch.tensor([1.0, 0.25]), 26, silence_db=30.0)
    assert voiced.shape == (2, 26)
    assert voiced[0, 1:12].all() and not voiced[0, 14:].any()
    assert voiced[1, :5].any() and not voiced[1, 7:].any()
