"""local/train_tokenizer.py: fixed special ids, determinism, clear errors for impossible sizes."""

import os

import pytest
import sentencepiece as spm

from local.train_tokenizer import main, read_texts, train_tokenizer

TEXTS = [f"the {a} {n} sees {b} {m}" for a in ("red", "blue", "old", "green") for b in ("a", "one")
         for n in ("cat", "dog", "bird") for m in ("tree", "house", "river")]


def test_special_ids_are_fixed(tmp_path):
    """0 <blank>, 1 <s>, 2 </s>, 3 <unk>, then the user symbols: the recipes rely on these ids."""
    model = train_tokenizer(TEXTS, tmp_path, 28, "unigram", user_symbols=["<en>", "<mask>"])
    sp = spm.SentencePieceProcessor(model_file=model)
    assert [sp.id_to_piece(i) for i in range(6)] == ["<blank>", "<s>", "</s>", "<unk>", "<en>", "<mask>"]
    assert sp.decode(sp.encode("the red cat sees a tree")) == "the red cat sees a tree"


@pytest.mark.parametrize("model_type,size", [("unigram", 28), ("bpe", 28), ("char", 21)])
def test_training_is_deterministic(tmp_path, model_type, size):
    """The same texts and options give the same pieces with the same scores (the model file differs
    only in the temporary paths SentencePiece records)."""
    models = [spm.SentencePieceProcessor(model_file=train_tokenizer(TEXTS, tmp_path / d, size,
                                                                    model_type)) for d in "ab"]
    pieces = [[(m.id_to_piece(i), m.get_score(i)) for i in range(m.vocab_size())] for m in models]
    assert pieces[0] == pieces[1] and len(pieces[0]) == size


def test_vocab_larger_than_the_text_supports_is_a_clear_error(tmp_path):
    """Asking for more pieces than the text holds fails with the size and what to do."""
    with pytest.raises(ValueError, match="Lower --vocab-size"):
        train_tokenizer(TEXTS, tmp_path, 5000, "unigram")
    with pytest.raises(ValueError, match="21; leave --vocab-size out"):
        train_tokenizer(TEXTS, tmp_path, 40, "char")
    with pytest.raises(ValueError, match="needs --vocab-size"):
        train_tokenizer(TEXTS, tmp_path, None, "unigram")


def test_a_character_model_sizes_itself(tmp_path):
    """Without a size, a char model holds every character of the text plus the special pieces, in
    char.model (run.sh names it without knowing the text)."""
    model = train_tokenizer(TEXTS, tmp_path, None, "char", user_symbols=["<en>"])
    assert model.endswith("char.model")
    assert spm.SentencePieceProcessor(model_file=model).vocab_size() == 21 + 1


def test_trains_from_a_shard_folder(make_shard_dir, tmp_path):
    """The command reads the parquet's texts; a missing folder is exit 2 with the reason."""
    out = make_shard_dir(num_samples=6)
    assert len(read_texts([str(out)])) == 6
    main([str(out), str(tmp_path / "tok"), "--vocab-size", "19", "--model-type", "char"])
    assert (tmp_path / "tok" / "char.model").is_file()
    with pytest.raises(SystemExit) as raised:
        main([str(tmp_path / "nowhere"), str(tmp_path / "tok"), "--vocab-size", "16"])
    assert raised.value.code == 2


def test_every_source_reaches_the_vocabulary_with_its_language_tags(make_shard_dir, tmp_path):
    """Mono text and both sides of paired text (make_text_shards.py parquets) join the transcripts:
    characters only the mono text (q, z) or only the pairs' target (j, k) hold become pieces, their
    languages become <lang> user symbols; an untranscribed shard folder adds nothing and fails nothing."""
    from local import make_shards, make_text_shards
    from tests.conftest import write_tone

    shards = make_shard_dir(num_samples=6)
    (tmp_path / "mono.txt").write_text("zyxwv quorum zyxwv\n" * 40)
    (tmp_path / "pairs.tsv").write_text("hello there\tjklmn bonjour jklmn\n" * 40)
    make_text_shards.main([str(tmp_path / "mono.txt"), str(tmp_path / "mono.parquet"), "--lang", "en"])
    make_text_shards.main([str(tmp_path / "pairs.tsv"), str(tmp_path / "pairs.parquet"), "--paired",
                           "--lang", "en", "--tgt-lang", "fr"])
    (tmp_path / "audio").mkdir()
    write_tone(tmp_path / "audio" / "a.wav", 1.0)
    make_shards.main([str(tmp_path / "audio"), str(tmp_path / "unlabelled"), "--jobs", "1", "--unlabelled"])
    main([str(shards), str(tmp_path / "mono.parquet"), str(tmp_path / "pairs.parquet:2"),
          str(tmp_path / "unlabelled"), str(tmp_path / "tok"), "--model-type", "char", "--user-symbols", "<mask>"])
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "tok" / "char.model"))
    pieces = [processor.id_to_piece(i) for i in range(processor.vocab_size())]
    assert pieces[4:7] == ["<mask>", "<en>", "<fr>"]
    assert {"q", "z", "j", "k"} <= set(pieces)
    assert processor.unk_id() not in processor.encode("zyxwv quorum jklmn bonjour hello there")


def test_a_weight_scales_a_source_share_deterministically():
    from local.train_tokenizer import parse_source, weighted

    texts = [f"t{i}" for i in range(10)]
    assert parse_source("a/b.parquet:0.5") == ("a/b.parquet", 0.5)
    assert parse_source("shards/train") == ("shards/train", 1.0)
    assert len(weighted(texts, 2.0)) == 20 and len(weighted(texts, 0.5)) == 5
    assert weighted(texts, 1.3) == weighted(texts, 1.3) and len(weighted(texts, 1.3)) == 13


def test_a_rerun_keeps_an_up_to_date_model_and_retrains_on_changed_text(tmp_path):
    """Same texts and options: the model file is not rewritten; one changed text: it is, and differs."""
    model = train_tokenizer(TEXTS, tmp_path, None, "char")
    first = os.stat(model).st_mtime_ns
    assert train_tokenizer(TEXTS, tmp_path, None, "char") == model and os.stat(model).st_mtime_ns == first
    changed = TEXTS[:-1] + [TEXTS[-1] + " q"]
    train_tokenizer(changed, tmp_path, None, "char")
    assert os.stat(model).st_mtime_ns != first
    processor = spm.SentencePieceProcessor(model_file=model)
    assert "q" in [processor.id_to_piece(i) for i in range(processor.vocab_size())]
