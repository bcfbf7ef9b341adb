"""common/pseudo_labels.py: the dev-chosen threshold, the held-out guard, the pseudo-labelled parquet."""

import json
import math
import os

import numpy as np
import pyarrow.parquet as pq

from common.data.metadata import read_speech_metadata
from common.pseudo_labels import (
    HeldOut,
    Scored,
    audio_fingerprint,
    choose_threshold,
    decode_scored,
    keep_confident,
    keep_top_share,
    parquet_audio,
    write_pseudo_parquet,
)
from local import make_shards
from tests.conftest import tone_corpus, write_manifest


def ranked_dev():
    """Ten dev hypotheses: the five surest are right, the five least sure wrong in every word."""
    dev = [Scored(f"u{i}", "a b c d" if i < 5 else "x y z w", -0.1 * i) for i in range(10)]
    return dev, {f"u{i}": "a b c d" for i in range(10)}


def test_the_threshold_keeps_the_largest_top_share_of_dev_within_the_target():
    """Dev WER is 50 %: the default target (half of it, 25 %) is met by the top 6 (1 wrong in 6: 16.7 %)
    but not the top 7 (28.6 %), so the threshold is the 6th score; only pool hypotheses scoring at least
    that are kept, and an empty hypothesis never is."""
    dev, refs = ranked_dev()
    threshold = choose_threshold(dev, refs)
    assert math.isclose(threshold.dev_wer, 50.0) and math.isclose(threshold.target_wer, 25.0)
    assert math.isclose(threshold.score, -0.5) and math.isclose(threshold.kept_dev_share, 0.6)
    assert math.isclose(threshold.kept_dev_wer, 100 / 6)
    pool = [Scored("p1", "sure", -0.2), Scored("p2", "edge", -0.5), Scored("p3", "unsure", -0.51),
            Scored("p4", " ", 0.0)]
    assert keep_confident(pool, threshold.score) == {"p1": "sure", "p2": "edge"}
    assert math.isclose(choose_threshold(dev, refs, target_wer=0.0).score, -0.4)  # the five right ones


def test_no_pseudo_label_is_kept_when_no_dev_share_meets_the_target():
    """When even the surest tenth of dev misses the target, the threshold is infinite: nothing is kept."""
    dev = [Scored(f"u{i}", "wrong words", -0.1 * i) for i in range(10)]
    threshold = choose_threshold(dev, {f"u{i}": "right text" for i in range(10)}, target_wer=10.0)
    assert threshold.score == float("inf") and keep_confident(dev, threshold.score) == {}
    assert threshold.as_dict()["kept_dev_wer"] is None


def test_a_top_share_is_taken_within_the_pool_whatever_its_scores():
    """keep_top_share ranks a pool against itself: of ten hypotheses scoring far below any dev threshold,
    a 0.25 share keeps the top three (rounded up), less an empty one among them; a share of 0 keeps none."""
    pool = [Scored(f"p{i}", "" if i == 1 else f"words {i}", -9.0 - 0.1 * i) for i in range(10)]
    assert keep_top_share(pool, 0.25) == {"p0": "words 0", "p2": "words 2"}
    assert keep_top_share(pool, 0.0) == {} and keep_top_share([], 0.5) == {}
    assert len(keep_top_share(pool, 1.0)) == 9


def renamed_shards(folder, manifest, prefix):
    """Shards of ``manifest``'s audio under new keys (the same recordings, other names)."""
    records = [json.loads(line) for line in open(manifest)]
    renamed = [{**r, "id": f"{prefix}{i:03d}", "audio": os.path.join(os.path.dirname(manifest), r["audio"])}
               for i, r in enumerate(records)]
    out = folder / f"shards_{prefix}"
    make_shards.main([write_manifest(str(folder / f"{prefix}.jsonl"), renamed), str(out), "--jobs", "1",
                      "--prefix", prefix])
    return out


def test_held_out_utterances_never_reach_the_decoder_whatever_their_name(tmp_path, monkeypatch):
    """A pool holding a test recording under another key, and one under the test's key, loses both
    before decoding: the guard matches by key and by decoded audio content."""
    test_manifest = tone_corpus(tmp_path / "test", 3, seed=1)
    test_shards = tmp_path / "test_shards"
    make_shards.main([test_manifest, str(test_shards), "--jobs", "1", "--prefix", "test"])
    copies = renamed_shards(tmp_path, test_manifest, "copy")  # the same audio, new names
    guard = HeldOut.of([test_shards])
    assert len(guard.keys) == 3 and len(guard.fingerprints) == 3
    items = list(parquet_audio([copies])) + [("utt00000", np.zeros(1600, dtype=np.float32)),
                                             ("fresh", np.full(1600, 0.1, dtype=np.float32))]
    seen = []
    monkeypatch.setattr("common.pseudo_labels._decode_group",
                        lambda trained, group, *a: seen.extend(k for k, _ in group) or [])
    decode_scored(None, items, guard=guard)
    assert seen == ["fresh"]
    assert audio_fingerprint(items[0][1]) in guard.fingerprints


def test_the_pseudo_labelled_parquet_is_read_beside_the_labelled_one(make_shard_dir, tmp_path):
    """The rows kept get the hypotheses as transcripts and point at the pool's tars from wherever the
    parquet is written; a finetune's metadata reader reads them with the labelled parquet."""
    labelled = make_shard_dir(num_samples=4, seed=0, prefix="lab")
    pool = make_shard_dir(num_samples=6, seed=1, prefix="pool")
    out = tmp_path / "exp" / "st1" / "pseudo_labels" / "metadata_pool.parquet"
    rows = write_pseudo_parquet([pool], {"utt00001": "pseudo one", "utt00004": "pseudo four"}, str(out))
    assert [r["sample_key"] for r in rows] == ["utt00001", "utt00004"]
    assert not pq.read_schema(out).metadata or b"unlabelled" not in pq.read_schema(out).metadata
    metadata = read_speech_metadata([labelled / "metadata_pool.parquet", out])
    texts = dict(zip(metadata.keys, metadata.texts))
    assert len(metadata) == 6 and texts["utt00004"] == "pseudo four"
    assert all(os.path.isfile(path) for path in metadata.shard_paths)
    assert dict(parquet_audio([out])).keys() == {"utt00001", "utt00004"}
    nothing = tmp_path / "none" / "metadata_pool.parquet"  # no hypothesis passed the threshold
    assert write_pseudo_parquet([pool], {}, str(nothing)) == []
    assert len(read_speech_metadata([labelled / "metadata_pool.parquet", nothing])) == 4
