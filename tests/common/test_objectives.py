"""Tests for common/objectives.py: the joint CTC / attention loss against hand computations."""

import pytest
import torch

from common.objectives import check_inter_ctc, drop_prefix, joint_ctc_attention_loss

VOCAB = 7


@pytest.fixture
def batch():
    """Two utterances of 12 and 9 frames, targets of 3 and 2 tokens (ids 3..6), seeded."""
    generator = torch.Generator().manual_seed(0)
    ctc_log_probs = torch.randn(2, 12, VOCAB, generator=generator).log_softmax(-1)
    seq_log_probs = torch.randn(2, 4, VOCAB, generator=generator).log_softmax(-1)
    tokens = torch.tensor([[4, 5, 6], [3, 5, 0]])
    tokens_eos = torch.tensor([[4, 5, 6, 2], [3, 5, 2, 0]])
    return {
        "ctc_log_probs": ctc_log_probs,
        "seq_log_probs": seq_log_probs,
        "wav_lens": torch.tensor([1.0, 0.75]),
        "tokens": tokens,
        "tokens_lens": torch.tensor([1.0, 2 / 3]),
        "tokens_eos": tokens_eos,
        "tokens_eos_lens": torch.tensor([1.0, 0.75]),
    }


def hand_ctc(batch):
    """Mean over utterances of CTC / target length (torch's 'mean'), on absolute lengths."""
    return torch.nn.functional.ctc_loss(
        batch["ctc_log_probs"].transpose(0, 1), batch["tokens"],
        torch.tensor([12, 9]), torch.tensor([3, 2]), blank=0, zero_infinity=True,
    )


def hand_nll(batch, smoothing=0.0):
    """Token-averaged NLL; smoothing moves ``smoothing`` of the mass to the vocabulary mean."""
    valid = [(0, t) for t in range(4)] + [(1, t) for t in range(3)]
    log_probs = batch["seq_log_probs"]
    nll = -sum(log_probs[b, t, batch["tokens_eos"][b, t]] for b, t in valid) / len(valid)
    uniform = -sum(log_probs[b, t].mean() for b, t in valid) / len(valid)
    return (1 - smoothing) * nll + smoothing * uniform


def test_loss_is_the_weighted_sum_of_hand_computed_ctc_and_nll(batch):
    """loss = (1 - w) * CTC + w * NLL, each term matching a direct computation."""
    out = joint_ctc_attention_loss(**batch, dec_weight=0.3, label_smoothing=0.0)
    assert torch.allclose(out["ctc_loss"], hand_ctc(batch), atol=1e-5)
    assert torch.allclose(out["nll_loss"], hand_nll(batch), atol=1e-5)
    assert torch.allclose(out["loss"], 0.7 * hand_ctc(batch) + 0.3 * hand_nll(batch), atol=1e-5)


def test_intermediate_ctc_takes_its_share_of_the_ctc_term(batch):
    """CTC term = (1 - v) * CTC(last) + v * mean CTC(intermediate); ctc_loss still reports the last layer."""
    generator = torch.Generator().manual_seed(1)
    inter = [torch.randn(2, 12, VOCAB, generator=generator).log_softmax(-1) for _ in range(2)]
    out = joint_ctc_attention_loss(**batch, dec_weight=0.3, label_smoothing=0.0,
                                   inter_ctc_log_probs=inter, inter_ctc_weight=0.4)
    inter_ctc = sum(hand_ctc({**batch, "ctc_log_probs": log_probs}) for log_probs in inter) / 2
    assert torch.allclose(out["inter_ctc_loss"], inter_ctc, atol=1e-5)
    assert torch.allclose(out["ctc_loss"], hand_ctc(batch), atol=1e-5)
    expected = 0.7 * (0.6 * hand_ctc(batch) + 0.4 * inter_ctc) + 0.3 * hand_nll(batch)
    assert torch.allclose(out["loss"], expected, atol=1e-5)


def test_intermediate_ctc_weight_and_layers_come_together():
    """A weight without layers (or layers without a weight, or a weight of 1) is refused, saying what to set."""
    check_inter_ctc(0.0, 0)
    check_inter_ctc(0.3, 1)
    with pytest.raises(ValueError, match="set both"):
        check_inter_ctc(0.3, 0)
    with pytest.raises(ValueError, match="set both"):
        check_inter_ctc(0.0, 2)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        check_inter_ctc(1.0, 1)


def test_dec_weight_zero_is_pure_ctc_and_one_is_pure_nll(batch):
    """The endpoints of dec_weight select one term alone."""
    ctc_only = joint_ctc_attention_loss(**batch, dec_weight=0.0, label_smoothing=0.0)
    nll_only = joint_ctc_attention_loss(**batch, dec_weight=1.0, label_smoothing=0.0)
    assert torch.allclose(ctc_only["loss"], hand_ctc(batch), atol=1e-5)
    assert torch.allclose(nll_only["loss"], hand_nll(batch), atol=1e-5)


def test_label_smoothing_mixes_in_the_vocabulary_mean(batch):
    """With smoothing e, NLL = (1 - e) * NLL + e * mean over the vocabulary of -log p."""
    out = joint_ctc_attention_loss(**batch, dec_weight=1.0, label_smoothing=0.1)
    assert torch.allclose(out["nll_loss"], hand_nll(batch, smoothing=0.1), atol=1e-5)
    assert not torch.allclose(out["nll_loss"], hand_nll(batch), atol=1e-3)


def test_accuracy_counts_argmax_hits_on_unpadded_targets(batch):
    """Accuracy is the share of the 7 real decoder targets whose argmax is right."""
    batch["seq_log_probs"] = torch.nn.functional.one_hot(batch["tokens_eos"], VOCAB).float().log()
    batch["seq_log_probs"][0, 0] = torch.nn.functional.one_hot(torch.tensor(3), VOCAB).float()
    out = joint_ctc_attention_loss(**batch)
    assert out["accuracy"] == pytest.approx(6 / 7)


def test_language_tag_prefix_is_ignored_by_both_terms(batch):
    """With ignore_prefix_tokens=1 the loss is that of the targets without their first token,
    and what the model predicts at the tag position does not matter."""
    out = joint_ctc_attention_loss(**batch, ignore_prefix_tokens=1)
    stripped = dict(batch, tokens=batch["tokens"][:, 1:], tokens_lens=torch.tensor([1.0, 0.5]),
                    tokens_eos=batch["tokens_eos"][:, 1:],
                    tokens_eos_lens=torch.tensor([1.0, 2 / 3]),
                    seq_log_probs=batch["seq_log_probs"][:, 1:])
    expected = joint_ctc_attention_loss(**stripped)
    assert torch.allclose(out["loss"], expected["loss"], atol=1e-5)
    batch["seq_log_probs"][:, 0] = torch.randn(2, VOCAB).log_softmax(-1)
    assert torch.allclose(joint_ctc_attention_loss(**batch, ignore_prefix_tokens=1)["loss"],
                          out["loss"], atol=1e-6)


def test_drop_prefix_rescales_relative_lengths():
    """Dropping 1 of 4 positions turns lengths 4 and 2 into 3/3 and 1/3."""
    tokens, lens = drop_prefix(torch.zeros(2, 4), torch.tensor([1.0, 0.5]), 1)
    assert tokens.shape == (2, 3)
    assert torch.allclose(lens, torch.tensor([1.0, 1 / 3]))


def test_bad_dec_weight_is_rejected_with_its_value(batch):
    """A weight outside [0, 1] names itself in the error."""
    with pytest.raises(ValueError, match="dec_weight=1.5"):
        joint_ctc_attention_loss(**batch, dec_weight=1.5)


def test_masked_unit_loss_is_cross_entropy_on_masked_frames_plus_weighted_unmasked():
    """Masked CE = mean CE over masked frames with a unit; -1 frames count nowhere; the unmasked
    term is added with its weight; accuracies count argmax hits per frame group."""
    from common.objectives import masked_unit_loss
    logits = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(1))
    units = torch.tensor([[0, 1, 2, 3, -1], [3, 2, 1, -1, -1]])
    mask = torch.tensor([[True, True, False, False, True], [False, True, True, False, False]])
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), units.clamp(min=0), reduction="none")
    masked = (units >= 0) & mask
    unmasked = (units >= 0) & ~mask
    out = masked_unit_loss(logits, units, mask, unmasked_weight=0.5)
    assert torch.isclose(out["masked_loss"], ce[masked].mean())
    assert torch.isclose(out["loss"], ce[masked].mean() + 0.5 * ce[unmasked].mean())
    hits = logits.argmax(-1) == units
    assert out["masked_accuracy"] == float(hits[masked].float().mean())


def test_masked_voiced_accuracy_counts_masked_voiced_frames_only():
    """masked_voiced_accuracy: hits among frames masked and voiced (silence and unmasked frames left out);
    the loss is unchanged by the voiced mask."""
    from common.objectives import masked_unit_loss

    units = torch.tensor([[0, 1, 2, 3, 4, 5]])
    logits = torch.nn.functional.one_hot(torch.tensor([[0, 1, 0, 0, 4, 0]]), 6).float()
    mask = torch.tensor([[True, True, True, True, True, False]])
    voiced = torch.tensor([[False, True, True, False, True, True]])
    out = masked_unit_loss(logits, units, mask, voiced=voiced)
    assert out["masked_accuracy"] == pytest.approx(3 / 5)  # 0, 1, 4 of the masked 0-4
    assert out["masked_voiced_accuracy"] == pytest.approx(2 / 3)  # 1, 4 of the masked voiced 1, 2, 4
    assert torch.equal(out["loss"], masked_unit_loss(logits, units, mask)["loss"])


def test_utterance_reduction_is_speechbrains_batchmean_and_logs_the_same_figures(batch):
    """loss_reduction=utterance back-propagates each utterance's summed CTC and NLL over the batch
    (SpeechBrain's batchmean, different from the token mean on utterances of unequal length) while the
    logged ctc_loss / nll_loss stay the token means, equal under both reductions."""
    from speechbrain.nnet.losses import ctc_loss, nll_loss
    token = joint_ctc_attention_loss(**batch, dec_weight=0.3, label_smoothing=0.1)
    utterance = joint_ctc_attention_loss(**batch, dec_weight=0.3, label_smoothing=0.1, loss_reduction="utterance")
    ctc = ctc_loss(batch["ctc_log_probs"], batch["tokens"], batch["wav_lens"], batch["tokens_lens"], 0,
                   reduction="batchmean")
    nll = nll_loss(batch["seq_log_probs"], batch["tokens_eos"], batch["tokens_eos_lens"], label_smoothing=0.1,
                   reduction="batchmean")
    assert torch.allclose(utterance["loss"], 0.7 * ctc + 0.3 * nll, atol=1e-5)
    assert not torch.allclose(utterance["loss"], token["loss"], atol=1e-3)
    for term in ("ctc_loss", "nll_loss"):
        assert torch.allclose(utterance[term], token[term])
    assert torch.allclose(token["ctc_loss"], hand_ctc(batch), atol=1e-5)
    assert torch.allclose(token["nll_loss"], hand_nll(batch, 0.1), atol=1e-5)


def test_unknown_loss_reduction_is_rejected_with_the_choices(batch):
    """A misspelt reduction names itself and the two choices."""
    with pytest.raises(ValueError, match="loss_reduction='sum'.*token, utterance"):
        joint_ctc_attention_loss(**batch, loss_reduction="sum")
