"""bench/open_corpus.py: the text the LM and text pretraining read."""

import json

from bench.open_corpus import text_without_train


def test_the_lm_text_holds_no_training_transcript(tmp_path):
    """The LM and text pretraining read lm_text.txt less every training transcript (the pool's would
    flatter self-training); other sentences are kept in order, and the file is written once."""
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ["a b c", "d e"]))
    (tmp_path / "lm_text.txt").write_text("x y\na b c\nd e f\nd e\nz\n")
    out = text_without_train(tmp_path, tmp_path / "text" / "lm.txt")
    assert open(out).read().splitlines() == ["x y", "d e f", "z"]
    (tmp_path / "lm_text.txt").write_text("changed\n")
    assert open(text_without_train(tmp_path, out)).read().splitlines() == ["x y", "d e f", "z"]
