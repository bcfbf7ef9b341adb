"""recipes/finetune/run.sh --unlabelled (stage 4, pseudo_label.py): self-training keeps only hypotheses at or
above the dev-chosen threshold, never a dev or test utterance, and finetuning goes on with them."""

import json
import os
import shutil

import pyarrow.parquet as pq

from tests.common.test_pseudo_labels import renamed_shards
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
