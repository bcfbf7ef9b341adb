"""Tests for common/decoding.py: greedy CTC on hand-made logits, and every beam-search mode
recovering the transcripts a tiny model memorised."""

import pathlib

import pytest
import sentencepiece as spm
import torch
from hyperpyyaml import load_hyperpyyaml

from common.decoding import beam_search, build_beam_searcher, ctc_greedy, ids_to_text
from common.objectives import joint_ctc_attention_loss

GRAPH_YAML = pathlib.Path(__file__).parents[2] / "recipes" / "hparams" / "model" / "conformer.yaml"
TARGETS = [[4, 5, 6], [7, 8], [6, 4, 9, 5]]
SECONDS = [0.5, 0.4, 0.6]


def one_hot_log_probs(frame_ids, vocab=6):
    """[1, frames, vocab] log-probabilities whose argmax per frame is ``frame_ids``."""
    return torch.nn.functional.one_hot(torch.tensor([frame_ids]), vocab).float().log_softmax(-1)


def test_ctc_greedy_collapses_repeats_and_drops_blanks():
    """0 4 4 0 4 5 5 0 → 4 4 5: repeats merge unless a blank separates them."""
    assert ctc_greedy(one_hot_log_probs([0, 4, 4, 0, 4, 5, 5, 0]), torch.ones(1)) == [[4, 4, 5]]


def test_ctc_greedy_ignores_frames_past_the_length():
    """With relative length 0.5 only the first 4 of 8 frames count."""
    log_probs = one_hot_log_probs([3, 3, 0, 5, 4, 4, 4, 4])
    assert ctc_greedy(log_probs, torch.tensor([0.5])) == [[3, 5]]


def padded_batch(rows):
    """Pads token lists with 0 and returns (tokens, relative lengths)."""
    longest = max(len(row) for row in rows)
    tokens = torch.tensor([row + [0] * (longest - len(row)) for row in rows])
    return tokens, torch.tensor([len(row) / longest for row in rows])


def train_memoriser(prefix=(), vocab_size=10):
    """A tiny conformer trained ~2 s to map three fixed noise clips to TARGETS (seeded); with
    ``prefix`` (e.g. a language tag), the decoder is fed it and trained not to predict it."""
    torch.manual_seed(0)
    with open(GRAPH_YAML) as f:
        graph = load_hyperpyyaml(f, {
            "vocab_size": vocab_size, "d_model": 32, "nhead": 2, "num_encoder_layers": 2,
            "num_decoder_layers": 1, "d_ffn": 64, "n_mels": 20, "frontend_channels": 8,
            "frontend_out_channels": 8, "dropout": 0.0, "spec_augment_prob": 0.0})
    model = graph["model"]
    samples = [int(s * 16000) for s in SECONDS]
    wavs = torch.zeros(3, max(samples))
    for i, n in enumerate(samples):
        wavs[i, :n] = torch.randn(n)
    wav_lens = torch.tensor([n / max(samples) for n in samples])
    targets = [list(prefix) + t for t in TARGETS]
    tokens, tokens_lens = padded_batch(targets)
    tokens_bos, _ = padded_batch([[1] + t for t in targets])
    tokens_eos, tokens_eos_lens = padded_batch([t + [2] for t in targets])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(80):
        out = model(wavs, wav_lens, tokens_bos)
        loss = joint_ctc_attention_loss(out.ctc_log_probs, out.seq_log_probs, wav_lens, tokens,
                                        tokens_lens, tokens_eos, tokens_eos_lens, dec_weight=0.5,
                                        ignore_prefix_tokens=len(prefix))
        optimizer.zero_grad()
        loss["loss"].backward()
        optimizer.step()
    model.eval()
    return model, wavs, wav_lens


@pytest.fixture(scope="module")
def memorised():
    """The memoriser without a prefix."""
    return train_memoriser()


@pytest.fixture(scope="module")
def tag_memorised():
    """The memoriser trained with the language tag 10 before every target."""
    return train_memoriser(prefix=[10], vocab_size=11)


def test_greedy_ctc_recovers_the_memorised_transcripts(memorised):
    """The CTC head alone decodes all three utterances exactly."""
    model, wavs, wav_lens = memorised
    with torch.no_grad():
        log_probs = model.ctc_log_probs(model.encode(wavs, wav_lens))
    assert ctc_greedy(log_probs, wav_lens) == TARGETS


@pytest.mark.parametrize("ctc_weight", [0.0, 0.5, 1.0])
def test_beam_search_recovers_the_memorised_transcripts(memorised, ctc_weight):
    """Attention only, joint, and CTC-prefix-only search all decode the three utterances."""
    model, wavs, wav_lens = memorised
    searcher = build_beam_searcher(model, beam_size=3, ctc_weight=ctc_weight)
    with torch.no_grad():
        assert beam_search(searcher, model.encode(wavs, wav_lens), wav_lens) == TARGETS


@pytest.mark.parametrize("ctc_weight", [0.0, 0.4])
def test_beam_search_feeds_the_prefix_and_leaves_it_out_of_the_hypotheses(tag_memorised, ctc_weight):
    """A model trained with a language tag (id 10) before every target, ignored by the loss,
    decodes the three utterances when the searcher feeds it the tag; hypotheses hold no tag."""
    model, wavs, wav_lens = tag_memorised
    searcher = build_beam_searcher(model, beam_size=3, ctc_weight=ctc_weight, prefix_tokens=[10])
    with torch.no_grad():
        assert beam_search(searcher, model.encode(wavs, wav_lens), wav_lens) == TARGETS


def test_batched_beam_search_equals_one_utterance_at_a_time(memorised):
    """Padding a batch does not change any utterance's result (padded frames are masked)."""
    model, wavs, wav_lens = memorised
    searcher = build_beam_searcher(model, beam_size=3, ctc_weight=0.3)
    with torch.no_grad():
        batched = beam_search(searcher, model.encode(wavs, wav_lens), wav_lens)
        single = []
        for wav, rel_len in zip(wavs, wav_lens):
            wav = wav[: int(round(rel_len.item() * wavs.shape[1]))].unsqueeze(0)
            single += beam_search(searcher, model.encode(wav, torch.ones(1)), torch.ones(1))
    assert batched == single


def test_length_bonus_without_disabling_normalization_is_explained(memorised):
    """SpeechBrain forbids both together; the error says which option to change."""
    with pytest.raises(ValueError, match="length_normalization: False"):
        build_beam_searcher(memorised[0], length_bonus=0.5)


def test_ids_to_text_round_trips_through_sentencepiece(tmp_path):
    """Ids from the contract tokenizer decode back to the text; bos / eos / blank vanish."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("go left now\nturn right\ngo right now\nstop\n" * 20)
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "word_10"), model_type="word",
        vocab_size=10, pad_id=0, bos_id=1, eos_id=2, unk_id=3, minloglevel=2)
    tokenizer = spm.SentencePieceProcessor(model_file=str(tmp_path / "word_10.model"))
    ids = tokenizer.encode("turn right now")
    assert ids_to_text(tokenizer, [[1] + ids + [2], [0] + ids]) == ["turn right now"] * 2


def random_model(attention_type, vocab_size=12):
    """An untrained (seeded) tiny model of the graph with ``attention_type``: its scores are spread,
    so any difference between two ways of computing them shows."""
    torch.manual_seed(1)
    with open(GRAPH_YAML) as f:
        graph = load_hyperpyyaml(f, {
            "vocab_size": vocab_size, "d_model": 32, "nhead": 4, "num_encoder_layers": 1,
            "num_decoder_layers": 2, "d_ffn": 64, "n_mels": 20, "frontend_channels": 8,
            "frontend_out_channels": 8, "dropout": 0.0, "spec_augment_prob": 0.0,
            "attention_type": attention_type})
    return graph["model"].eval()


@pytest.mark.parametrize("attention_type", ["RelPosMHAXL", "regularMHA"])
@pytest.mark.parametrize("prefix", [(), (10, 11)])
def test_incremental_decoder_steps_equal_the_whole_prefix_recomputed(attention_type, prefix):
    """The cached step (encoder keys/values projected once, only the new position run) gives the
    scores SpeechBrain's step gives by running the decoder over the whole prefix, at every step of a
    search whose beams are reordered between steps, prefix tokens and padded encoder states included;
    and both searches return the same hypotheses and scores."""
    model = random_model(attention_type)
    enc = torch.randn(2, 9, 32).repeat_interleave(2, dim=0)  # 2 utterances x 2 beams, as the search holds them
    enc_lens = torch.tensor([9, 9, 4, 4])
    searchers = [build_beam_searcher(model, beam_size=2, ctc_weight=0.0, prefix_tokens=prefix) for _ in range(2)]
    searchers[1].cached = False
    assert searchers[0].cached
    memories = [s.reset_mem(4, "cpu") for s in searchers]
    tokens = torch.full((4,), prefix[-1] if prefix else 1)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(6):
            steps = [s.forward_step(tokens, m, enc, enc_lens) for s, m in zip(searchers, memories)]
            torch.testing.assert_close(steps[0][0], steps[1][0], atol=1e-5, rtol=1e-5)
            # an utterance's beams die and duplicate
            order = torch.randint(0, 2, (4,), generator=generator) + torch.tensor([0, 0, 2, 2])
            memories = [s.permute_mem(step[1], order) for s, step in zip(searchers, steps)]
            tokens = torch.randint(3, 10, (4,), generator=generator)
        enc, wav_lens = torch.randn(3, 9, 32), torch.tensor([1.0, 0.7, 0.5])
        results = [s(enc, wav_lens) for s in searchers]
    assert [list(map(int, h)) for h in results[0][0]] == [list(map(int, h)) for h in results[1][0]]
    torch.testing.assert_close(torch.as_tensor(results[0][2]), torch.as_tensor(results[1][2]), atol=1e-4, rtol=1e-4)
