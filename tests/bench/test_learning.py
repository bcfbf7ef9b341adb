"""bench/learning.py end to end on the tiny espeak corpus: every leg trains, chooses its decoding on dev,
decodes the tests once and is reported with intervals; a second run reuses the finished legs."""

import json
import os

import numpy as np
import pytest

from bench import learning
from local import train_tokenizer

# Tiny model in every leg (small.yaml keys), one short epoch each, a two-setting dev grid; the LM trains
# until its 0.01-minute budget is spent (its history keeps minutes to 0.01), so a leg charged with it
# shows it.
TINY = ("--d_model=32 --nhead=2 --num_encoder_layers=1 --num_decoder_layers=1 --d_ffn=64 --n_mels=40 "
        "--frontend_channels=8 --frontend_out_channels=8 --max_batch_seconds=20.0 --warmup_steps=4 --lr_peak=0.003 "
        "--inter_ctc_layers=[] --inter_ctc_weight=0.0")  # one encoder layer: none below it for intermediate CTC
TINY_LM = "--embedding_dim=16 --rnn_layers=1 --rnn_neurons=32 --dnn_neurons=32 --warmup_steps=2"


@pytest.fixture(scope="module")
def bench_data(speech_corpus, speech_shards, tmp_path_factory):
    """An open-corpus layout of the session's tiny corpus: corpus/ manifests (its test split as both
    test_seen and test_unseen, its training text as lm_text.txt), shards and a character tokenizer."""
    data = tmp_path_factory.mktemp("bench_data")
    corpus = data / "corpus"
    corpus.mkdir()
    for name in os.listdir(speech_corpus):
        if os.path.isdir(speech_corpus / name):
            os.symlink(speech_corpus / name, corpus / name)  # the audio, relative to the manifests
    for name, source in (("train", "train"), ("dev", "dev"), ("test_seen", "test"), ("test_unseen", "test")):
        os.symlink(speech_corpus / f"{source}.jsonl", corpus / f"{name}.jsonl")
        os.makedirs(data / "shards", exist_ok=True)
        os.symlink(speech_shards[source], data / "shards" / {"dev": "valid"}.get(name, name))
    texts = [json.loads(line)["text"] for line in open(speech_corpus / "train.jsonl")]
    (corpus / "lm_text.txt").write_text("\n".join(texts) + "\n")
    train_tokenizer.train_tokenizer(texts, str(data / "tokenizer"), None, "char")
    return data


def run_bench(data, out, capsys):
    argv = ["--data", str(data), "--out", str(out), "--minutes", "0.01", "--lm-minutes", "0.01",
            f"--overrides={TINY}", f"--lm-overrides={TINY_LM}", "--librispeech-tokens", "40",
            "--beams", "2", "--ctc-weights", "0.3", "0.5", "--lm-weights", "0.5", "--json"]
    learning.main(argv)
    return capsys.readouterr().out


def test_every_leg_is_reported_with_intervals_and_a_second_run_reuses_them(bench_data, tmp_path, capsys,
                                                                             monkeypatch):
    """The JSON line names the five legs with a WER inside its interval for each test split, the +lm
    legs charged with the LM's training minutes, and the differences of Tandem against each other leg;
    each leg decoded dev with the whole grid and chose its lowest WER. A second invocation trains and
    decodes nothing: every leg and the LM are reused, their folders untouched."""
    out = tmp_path / "bench"
    printed = run_bench(bench_data, out, capsys)
    figures = json.loads(printed.strip().splitlines()[-1])
    rows = {(row["leg"], row["split"]): row for row in figures["legs"]}
    assert set(rows) == {(leg, split) for leg in learning.LEGS for split in learning.TESTS}
    for row in rows.values():
        assert {"leg", "split", "wer", "wer_ci", "updates_per_minute", "minutes"} <= set(row)
        assert row["wer_ci"][0] <= row["wer"] <= row["wer_ci"][1]
        assert row["updates_per_minute"] > 0 and row["minutes"] > 0
    lm_minutes = learning.last_history(out / "lm")["minutes"]
    assert lm_minutes > 0
    for leg in ("tandem+lm", "speechbrain_same_model+lm"):  # the LM's minutes are charged to the leg
        acoustic = rows[leg.removesuffix("+lm"), "test_seen"]["minutes"]
        assert rows[leg, "test_seen"]["minutes"] == pytest.approx(acoustic + lm_minutes)
    against = {(d["tandem_leg"], d["leg"], d["split"]) for d in figures["difference"]}
    assert ("tandem", "speechbrain_same_model", "test_unseen") in against
    assert ("tandem+lm", "speechbrain_same_model+lm", "test_seen") in against
    for d in figures["difference"]:
        assert d["ci"][0] <= d["difference"] <= d["ci"][1] and d["verdict"]
    for leg in learning.LEGS:
        choice = figures["dev_choices"][leg]["1234"]
        assert len(choice["dev"]) == 2 and choice["chosen"] == min(choice["dev"], key=lambda r: r["wer"])["setting"]
    assert "Dev WER % of each decoding setting" in printed

    def snapshot():  # log.txt left out: the last recipe's log handler stays on in this process
        return {os.path.join(root, name): os.stat(os.path.join(root, name)).st_mtime_ns
                for root, _, names in os.walk(out) for name in names if name != "log.txt"}
    def trains_or_decodes(*args):
        raise AssertionError(f"a finished leg or LM was run again: {args}")
    before = snapshot()
    monkeypatch.setattr(learning.Bench, "run_leg", trains_or_decodes)
    monkeypatch.setattr("recipes.lm.train.main", trains_or_decodes)
    again = run_bench(bench_data, out, capsys)
    assert snapshot() == before
    assert json.loads(again.strip().splitlines()[-1])["legs"] == figures["legs"]


def test_several_seeds_report_the_median_seed_interval_beside_the_pooled_one():
    """With three seeds, one far from the other two (as a seed stuck on the CTC plateau), the median WER
    lies outside the pooled seeds' interval: the row's interval must be the median seed's own, so the
    printed WER sits inside it, and the pooled WER is reported with its own interval."""
    from bench import stats
    keys = [f"u{i}" for i in range(200)]
    lengths = np.full(200, 10)
    rng = np.random.default_rng(0)

    def scored(share):  # each utterance's edits drawn around share x its 10 words
        return stats.Scored(keys, rng.binomial(20, share, 200) // 2, lengths)
    run = {"updates": 10, "epochs": 1, "audio_hours": 0.1, "data_wait": 0.0, "updates_per_minute": 5.0,
           "minutes": 2.0}
    per_seed = [scored(0.4), scored(1.0), scored(0.3)]  # WER about 40, 100, 30 %
    wers = sorted(stats.error_rate(s).value for s in per_seed)
    rows = learning.leg_rows(["tandem"], {"tandem": [run] * 3},
                             {"tandem": {split: per_seed for split in learning.TESTS}})
    for row in rows:
        assert row["wer"] == pytest.approx(wers[1], abs=0.01)
        assert row["wer_spread"] == pytest.approx(wers[2] - wers[0], abs=0.01)
        assert row["wer_ci"][0] < row["wer"] < row["wer_ci"][1]
        assert row["wer_pooled"] == pytest.approx(sum(wers) / 3, abs=0.01)
        assert row["wer_pooled_ci"][0] <= row["wer_pooled"] <= row["wer_pooled_ci"][1]
        assert not row["wer_pooled_ci"][0] <= row["wer"] <= row["wer_pooled_ci"][1]
