"""bench/dev_choice.py: the decoding setting is the one of lowest dev WER, and each test split is
decoded once, with it alone."""

import json

import pytest

from bench import dev_choice


def test_the_lowest_dev_wer_is_chosen_and_each_test_is_decoded_once_with_it(tmp_path):
    """A fake decoder whose dev errors fall with the beam and rise with the CTC weight: beam 16 at CTC
    0.2 must win, and the two tests must be decoded after every dev decoding, once each, with it."""
    calls = []

    def decode(setting, split):
        calls.append((split, setting))
        wrong = 0 if split != "dev" else (16 - setting["beam_size"]) // 4 + int(10 * setting["ctc_weight"])
        path = tmp_path / f"hyp_{split}_{len(calls)}.jsonl"
        words = ["w"] * 10
        hyp = ["x"] * wrong + words[wrong:]
        path.write_text(json.dumps({"key": "u1", "hyp": " ".join(hyp), "ref": " ".join(words)}) + "\n")
        return str(path)

    grid = dev_choice.decoding_grid([8, 16], [0.4, 0.2])
    choice = dev_choice.choose_on_dev(grid, decode, "dev", ["test_seen", "test_unseen"])
    best = {"beam_size": 16, "ctc_weight": 0.2, "lm_weight": 0.0}
    assert choice["chosen"] == best
    assert [row["wer"] for row in choice["dev"]] == [60.0, 40.0, 40.0, 20.0]
    assert calls[:4] == [("dev", setting) for setting in grid]
    assert calls[4:] == [("test_seen", best), ("test_unseen", best)]
    assert set(choice["tests"]) == {"test_seen", "test_unseen"}


def test_a_ctc_weight_of_one_is_refused():
    """SpeechBrain's searcher drops the attention decoder at CTC weight 1: the grid refuses it."""
    with pytest.raises(ValueError):
        dev_choice.decoding_grid([8], [1.0])
