"""recipes/finetune/run.sh --unlabelled (stage 4, pseudo_label.py): self-training keeps only hypotheses at or
above the dev-chosen threshold, never a dev or test utterance, and finetuning goes on with them."""

import json
import os
import shutil

import pyarrow.parquet as pq

from common.pseudo_labels import Scored
from recipes.finetune import pseudo_label
from tests.common.test_pseudo_labels import renamed_shards
from tests.conftest import tone_corpus
from tests.recipes.finetune_args import TINY, data_options, run_sh


def test_run_sh_self_trains_on_the_pool_without_ever_labelling_a_test_utterance(trained, tokenizer_file, speech_corpus,
                                                                                speech_shards, tmp_path):
    """The pool is the training shards plus the test recordings under new names: stage 4 labels the pool
    with the finished experiment, keeps exactly the hypotheses scoring at least the threshold, none of
    them a test or dev utterance (by key or by audio), then trains round 1 from the labeller on labelled
    + pseudo-labelled speech and scores it."""
    data = tmp_path / "data"
    os.makedirs(data / "tokenizer")
    shutil.copy(tokenizer_file, data / "tokenizer" / "bpe_60.model")  # where run.sh looks for it
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    test_copies = renamed_shards(tmp_path, str(speech_corpus / "test.jsonl"), "copy")
    run_sh("--stage", "4", "--data", str(data), "--config", "hparams/demo.yaml", "--vocab_size", "60",
           "--token_type", "bpe", *data_options(speech_shards), "--exp", str(exp),
           "--unlabelled", f"{speech_shards['train']} {test_copies}",
           "--pseudo_label_args", "--wer_ratio 1.0 --beam 2", "--", *TINY, "--number_of_epochs=2")
    labels = tmp_path / "exp_st1" / "pseudo_labels"
    summary = json.loads((labels / "threshold.json").read_text())
    pool = [json.loads(line) for line in open(labels / "pool.jsonl")]
    assert len(pool) == 40  # the training shards; the 8 test copies were refused before decoding
    assert not {p["key"] for p in pool} & {f"copy{i:03d}" for i in range(8)}
    kept = {p["key"] for p in pool if p["kept"]}
    assert kept == {p["key"] for p in pool if p["score"] >= summary["score"] and p["text"].strip()}
    assert 0 < len(kept) < 40 or summary["score"] == min(p["score"] for p in pool)
    rows = pq.read_table(labels / "metadata_pool.parquet").to_pylist()
    assert {r["sample_key"] for r in rows} == kept and summary["kept"] == len(kept)
    test_keys = {json.loads(line)["id"] for line in open(speech_corpus / "test.jsonl")}
    assert not kept & test_keys
    results = json.loads((tmp_path / "exp_st1" / "results.json").read_text())
    assert "test" in results and (labels / "model" / "CKPT+averaged" / "model.ckpt").is_file()
    log = (tmp_path / "exp_st1" / "train_log.txt").read_text()
    assert "epoch: 2" in log


def test_keep_share_keeps_each_pools_own_top_share_where_one_score_keeps_none(monkeypatch, tmp_path):
    """Dev (10 utterances, the five surest right) sets the threshold at its top 6 (share 0.6, score -0.5).
    Pool a scores like dev, pool b far below it (a voice the labeller is unsure of). --keep score keeps a's
    five at or above -0.5 and none of b; --keep share keeps a's top 6 and b's top 3 (0.6 of 5, by b's own
    order); the record and parquet say the same, per source."""
    dev = renamed_shards(tmp_path, tone_corpus(tmp_path / "dev", 10, seed=1), "d")
    pools = {name: renamed_shards(tmp_path, tone_corpus(tmp_path / name, size, seed=seed), name)
             for name, size, seed in (("a", 10, 2), ("b", 5, 3))}
    made_up = {f"d{i:03d}": ("tone number %d" % i if i < 5 else "wrong words here", -0.1 * i) for i in range(10)}
    made_up |= {f"a{i:03d}": (f"a says {i}", -0.1 * i - 0.05) for i in range(10)}
    made_up |= {f"b{i:03d}": (f"b says {i}", -5.0 - 0.1 * i) for i in range(5)}

    def decode(trained, items, beam_size=None, guard=None):
        return [Scored(key, *made_up[key]) for key, _ in items]

    class Labeller:
        settings = {"max_duration": 30.0, "lm_dir": None, "lm_weight": 0.0}

    monkeypatch.setattr(pseudo_label, "load_trained", lambda *args, **kwargs: Labeller())
    monkeypatch.setattr(pseudo_label, "decode_scored", decode)
    monkeypatch.setattr(pseudo_label, "export_as_checkpoint", lambda *args: None)
    kept = {}
    for rule in pseudo_label.KEEP_RULES:
        out = tmp_path / rule
        summary = pseudo_label.label(pseudo_label.parse_args([
            "exp", "--unlabelled", str(pools["a"]), str(pools["b"]), "--valid", str(dev), "--output", str(out),
            "--keep", rule]))
        assert summary["score"] == -0.5 and summary["kept_dev_share"] == 0.6
        kept[rule] = {json.loads(line)["key"] for line in open(out / "pool.jsonl") if json.loads(line)["kept"]}
        rows = pq.read_table(out / "metadata_pool.parquet").to_pylist()
        assert {r["sample_key"]: r["text"] for r in rows} == {key: made_up[key][0] for key in kept[rule]}
        assert [summary["per_source"][str(pools[name])]["kept"] for name in "ab"] == \
            [sum(key.startswith(name) for key in kept[rule]) for name in "ab"]
    assert kept["score"] == {f"a{i:03d}" for i in range(5)}
    assert kept["share"] == {f"a{i:03d}" for i in range(6)} | {"b000", "b001", "b002"}
