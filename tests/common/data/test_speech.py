"""common/data/speech.py: the speech loader end to end on real Opus shards."""

import tarfile

import torch
from speechbrain.utils.checkpoints import Checkpointer

from common.data import SpeechLoaderConfig, make_speech_loader
from common.data.metadata import read_speech_metadata


def epoch_keys(loader):
    """Sample keys of each batch of one epoch, in order."""
    return [list(batch.id) for batch in loader]


def test_batches_follow_the_contract(tone_shards, tokenizer_model):
    """sig is [B, T] float32; tokens padded with 0; tokens_bos = [1]+tokens; tokens_eos = tokens+[2]."""
    batch = next(iter(make_speech_loader(tone_shards, tokenizer_model, SpeechLoaderConfig(6.0))))
    assert batch.sig.data.dtype == torch.float32 and batch.sig.data.ndim == 2
    first = batch.tokens.data[0][: int(round(batch.tokens.lengths[0].item() * batch.tokens.data.shape[1]))]
    assert batch.tokens_bos.data[0][0] == 1 and torch.equal(batch.tokens_bos.data[0][1 : len(first) + 1], first)
    assert batch.tokens_eos.data[0][len(first)] == 2
    assert len(batch.id) == len(batch.text) == batch.sig.data.shape[0]


def test_ranks_share_the_epoch_without_loss_or_repeat_and_within_budget(tone_shards, tokenizer_model):
    """3 ranks: same batch count each, every key exactly once, padded seconds <= budget."""
    durations = dict(zip(*(lambda m: (m.keys, m.durations))(read_speech_metadata(tone_shards))))
    keys, counts = [], set()
    for rank in range(3):
        loader = make_speech_loader(tone_shards, tokenizer_model, SpeechLoaderConfig(5.0), rank=rank, world_size=3)
        for batch in loader:
            keys += batch.id
            assert len(batch.id) * max(durations[k] for k in batch.id) <= 5.0
            assert batch.sig.data.shape[1] <= max(durations[k] for k in batch.id) * 16000 + 1
        counts.add(len(loader))
    assert len(counts) == 1 and sorted(keys) == sorted(durations)


def test_same_seed_same_batches_other_epoch_other_order(tone_shards, tokenizer_model):
    """Same seed and world size -> identical keys per batch; epoch 1 differs from epoch 0."""
    make = lambda: make_speech_loader(tone_shards, tokenizer_model, SpeechLoaderConfig(5.0), seed=3)  # noqa: E731
    first, second = make(), make()
    epoch0 = epoch_keys(first)
    assert epoch0 == epoch_keys(second) == first.planned_keys(0)
    assert epoch_keys(first) != epoch0 and first.epoch == 2


def test_resume_continues_with_exactly_the_next_batch(tone_shards, tokenizer_model, tmp_path):
    """Stop after k batches, save with a Checkpointer, restore into a new loader: the rest matches."""
    make = lambda: make_speech_loader(tone_shards, tokenizer_model, SpeechLoaderConfig(5.0), seed=5)  # noqa: E731
    full = epoch_keys(make())
    interrupted = make()
    checkpointer = Checkpointer(tmp_path, {"loader": interrupted})
    for k, _ in enumerate(interrupted, start=1):
        if k == 3:
            break
    checkpointer.save_checkpoint()
    restored = make()
    Checkpointer(tmp_path, {"loader": restored}).recover_if_possible()
    assert full[3:] == epoch_keys(restored)


def test_resume_at_an_odd_position_with_two_workers_keeps_the_plan_order(tone_shards, tokenizer_model):
    """Two worker processes, stopped after 3 batches (the next one is the second worker's): the restored
    loader yields exactly the rest of the planned epoch, in order (torch's DataLoader starts its
    round-robin at worker 0, so the workers serve rotated slots)."""
    make = lambda: make_speech_loader(tone_shards, tokenizer_model, SpeechLoaderConfig(5.0, num_workers=2),  # noqa: E731
                                      seed=5)
    planned = make().planned_keys(0)
    restored = make()
    restored.load_state_dict({"epoch": 0, "position": 3})
    assert epoch_keys(restored) == planned[3:]


def test_real_dataloader_with_two_workers_over_make_shards_output(make_shard_dir, tokenizer_model):
    """Shards from local/make_shards.py through a 2-worker DataLoader: the planned keys, in plan order,
    features computed in the workers."""
    from speechbrain.lobes.features import Fbank

    shard_dir = make_shard_dir(num_samples=16, min_s=0.4, max_s=1.5, shard_size_mb=0.03)
    loader = make_speech_loader(shard_dir / "metadata_pool.parquet", tokenizer_model,
                                SpeechLoaderConfig(4.0, num_workers=2, fbank_in_loader=True), fbank=Fbank(n_mels=40))
    planned = loader.planned_keys(0)
    batches = list(loader)
    assert [list(b.id) for b in batches] == planned
    assert batches[0].feats.data.shape[-1] == 40


def test_bad_data_is_skipped_counted_and_the_epoch_goes_on(tone_shards, tokenizer_model, tmp_path):
    """A truncated tar and an undecodable member: same batch count, fewer keys, counts reported."""
    import shutil

    copy = tmp_path / "shards"
    shutil.copytree(tone_shards.parent, copy)
    metadata = read_speech_metadata(copy / "metadata_pool.parquet")
    damaged = sorted(metadata.shard_paths)
    with open(damaged[1], "r+b") as tar:  # cut shard 1 (12 utterances) in the middle
        tar.truncate(tar.seek(0, 2) // 2)
    with tarfile.open(damaged[3]) as tar:  # overwrite the first opus member's data of shard 3
        member = next(m for m in tar.getmembers() if m.name.endswith(".opus"))
    with open(damaged[3], "r+b") as tar:
        tar.seek(member.offset_data)
        tar.write(b"\x00" * 64)
    clean = make_speech_loader(tone_shards, tokenizer_model, SpeechLoaderConfig(5.0))
    loader = make_speech_loader(copy / "metadata_pool.parquet", tokenizer_model, SpeechLoaderConfig(5.0))
    keys = [k for batch in loader for k in batch.id]
    assert len(loader) == len(clean)
    assert loader.bad_data["truncated_shard"] == 1 and loader.bad_data["undecodable"] == 1
    assert 42 - 12 - 1 <= len(set(keys)) < 42


def reversed_translation(text):
    """A stand-in translation: the words in reverse order."""
    return {"translation": " ".join(reversed(text.split()))}


def test_text_field_reads_a_key_of_the_extra_json_and_the_prefix_token_leads_the_targets(
        tmp_path, tokenizer_model):
    """text_field="translation" makes the batch text and tokens the translation; prefix_tokens=["<fr>"]
    puts the tag's id first in tokens (so tokens_bos = [1, tag, ...]); the plain text stays untagged."""
    from common.data import Tokenizer
    from common.data.synthetic import write_shards

    parquet = write_shards(tmp_path, [5, 4], carried=reversed_translation)
    tokenizer = Tokenizer(tokenizer_model)
    batches = make_speech_loader(parquet, tokenizer, SpeechLoaderConfig(5.0))
    plain = {k: t for b in batches for k, t in zip(b.id, b.text)}
    loader = make_speech_loader(parquet, tokenizer, SpeechLoaderConfig(5.0), text_field="translation",
                                prefix_tokens=["<fr>"])
    tag = tokenizer.piece_id("<fr>")
    for batch in loader:
        for i, (key, text) in enumerate(zip(batch.id, batch.text)):
            assert text == reversed_translation(plain[key])["translation"]
            length = int(round(batch.tokens.lengths[i].item() * batch.tokens.data.shape[1]))
            assert batch.tokens.data[i, :length].tolist() == [tag] + tokenizer.encode(text)
            assert batch.tokens_bos.data[i, :2].tolist() == [1, tag]


def test_samples_without_the_text_field_are_left_out_and_an_unknown_field_names_the_known_ones(
        tmp_path, tokenizer_model):
    """Rows lacking the chosen field are not batched; a field no row has is an error listing fields."""
    import pytest

    from common.data.synthetic import write_shards

    parquet = write_shards(tmp_path, [6], carried=lambda text: reversed_translation(text) if "a" in text else {})
    loader = make_speech_loader(parquet, tokenizer_model, SpeechLoaderConfig(5.0), text_field="translation")
    texts = [t for batch in loader for t in batch.text]
    expected = [t for t in read_speech_metadata(parquet, "translation").texts if t is not None]
    assert sorted(texts) == sorted(expected) and 0 < len(texts) < 6
    with pytest.raises(ValueError, match="translaton.*'translation'"):
        make_speech_loader(parquet, tokenizer_model, SpeechLoaderConfig(5.0), text_field="translaton")


def test_cached_audio_gives_the_same_batches_and_later_epochs_read_no_shard(tone_shards, tokenizer_model,
                                                                           monkeypatch):
    """cache_audio=True: epoch 0 equals the uncached loader's (keys and waveforms); epoch 1 opens no
    shard yet yields every planned batch; with workers it is refused."""
    import pytest

    from common.data import speech

    make = lambda **kw: make_speech_loader(tone_shards, tokenizer_model, SpeechLoaderConfig(5.0, **kw), seed=2)  # noqa: E731
    plain, cached = make(), make(cache_audio=True)
    for a, b in zip(list(plain), list(cached)):
        assert a.id == b.id and torch.equal(a.sig.data, b.sig.data)
    monkeypatch.setattr(speech, "wanted_members", lambda *args: (_ for _ in ()).throw(AssertionError("read")))
    assert epoch_keys(cached) == cached.planned_keys(1)
    with pytest.raises(ValueError, match="num_workers is 2"):
        SpeechLoaderConfig(5.0, num_workers=2, cache_audio=True)


def test_members_read_ahead_are_held_encoded_and_decoded_when_asked(tone_shards, tokenizer_model):
    """Read-ahead members stay Opus bytes (over 5 x smaller than their float32 waveforms) until ``get``
    decodes one for its batch and releases its bytes."""
    from common.data.shard_audio import BadDataCounts
    from common.data.speech import WaveformStream

    loader = make_speech_loader(tone_shards, tokenizer_model, SpeechLoaderConfig(5.0))
    slot = loader.plan(0)[0][0]
    stream = WaveformStream(loader.metadata, slot, set(slot.stream_rows.tolist()), BadDataCounts())
    last = int(slot.stream_rows[-1])
    assert stream.has(last)
    held = stream.encoded
    assert len(held) == len(slot.stream_rows) and all(isinstance(data, bytes) for data in held.values())
    decoded_bytes = loader.metadata.durations[list(held)].sum() * 16000 * 4
    assert 5 * sum(map(len, held.values())) < decoded_bytes
    waveform = stream.get(last)
    assert waveform.dtype == torch.float32 and last not in stream.encoded
    assert abs(len(waveform) / 16000 - loader.metadata.durations[last]) <= 0.02


def test_units_are_a_batch_field_and_a_sample_without_units_is_named(tone_shards, tokenizer_model):
    """With a UnitTable, each batch carries every sample's units (padded, with their lengths); a table
    that lacks some used sample is refused before any batch."""
    import numpy as np
    import pytest

    from common.data.units import UnitTable

    keys = read_speech_metadata(tone_shards).keys.tolist()
    units = {key: np.arange(3 + index % 5, dtype=np.int16) for index, key in enumerate(keys)}
    table = UnitTable(units, n_units=8, frame_rate_hz=50.0, kmeans_hash="h")
    loader = make_speech_loader(tone_shards, tokenizer_model, SpeechLoaderConfig(10.0), units=table)
    for batch in loader:
        padded, rel_lens = batch.units
        for row, key, rel in zip(padded, batch.id, rel_lens):
            length = int(round(float(rel) * padded.shape[1]))
            assert row[:length].tolist() == units[key].tolist()
    del units[keys[0]]
    with pytest.raises(ValueError, match="have no units"):
        make_speech_loader(tone_shards, tokenizer_model, SpeechLoaderConfig(10.0), units=table)


def test_the_token_rate_filter_counts_speed_perturbation(tone_shards, tokenizer_model):
    """With speeds up to 1.1 the loader keeps exactly the utterances whose tokens fit the rate limit
    in their audio shortened by 1.1: fewer than at speed 1.0 when the limit sits between the two."""
    from common.data.pipeline import Tokenizer, count_tokens
    metadata = read_speech_metadata(tone_shards)
    counts = count_tokens(Tokenizer(tokenizer_model), list(metadata.texts))
    rates = counts / metadata.durations
    limit = float(sorted(rates)[len(rates) // 2]) * 1.05  # half the utterances near it on both sides

    def kept(speeds):
        config = SpeechLoaderConfig(12.0, speed_perturb=speeds, filters={"max_tokens_per_second": limit})
        return set(make_speech_loader(tone_shards, tokenizer_model, config).used_keys())

    at_one = {k for k, rate in zip(metadata.keys, rates) if rate <= limit}
    at_fastest = {k for k, rate in zip(metadata.keys, rates) if rate * 1.1 <= limit}
    assert kept(None) == at_one and kept([0.9, 1.0, 1.1]) == at_fastest
    assert at_fastest < at_one


def test_long_utterances_are_cropped_not_dropped_with_their_units_at_the_same_rate(tone_shards, tokenizer_model):
    """max_sample_size 1 s: every utterance stays (none dropped), none is longer than 16000 samples, and
    each carries the units of the stretch it kept: with unit j = j at 50 Hz, a crop starting at sample s
    starts at unit round(s / 320) and holds 50 units per second of audio kept (the rate of the targets is
    unchanged); the same seed and epoch crop the same way, random_crop False keeps the start."""
    import numpy as np

    from common.data.units import UnitTable

    metadata = read_speech_metadata(tone_shards)
    units = {key: np.arange(int(round(d * 50)), dtype=np.int16) for key, d in zip(metadata.keys, metadata.durations)}
    table = UnitTable(units, n_units=200, frame_rate_hz=50.0, kmeans_hash="h")
    config = SpeechLoaderConfig(1.5, max_sample_size=16000)  # a budget below the longest utterance (2 s)
    loader = make_speech_loader(tone_shards, tokenizer_model, config, units=table, seed=3)
    seen, starts = [], {}
    for batch in loader:
        padded, rel_lens = batch.units
        for i, key in enumerate(batch.id):
            samples = int(round(float(batch.sig.lengths[i]) * batch.sig.data.shape[1]))
            kept = padded[i, :int(round(float(rel_lens[i]) * padded.shape[1]))]
            assert samples <= 16000
            assert abs(len(kept) - samples / 320) <= 1  # 50 units per second of the cropped audio
            assert kept.tolist() == list(range(int(kept[0]), int(kept[0]) + len(kept)))  # one stretch
            starts[key] = int(kept[0])
            seen.append(key)
    assert sorted(seen) == sorted(metadata.keys.tolist())
    assert any(start > 0 for start in starts.values())  # long ones cropped somewhere inside
    again = {key: int(row[0]) for batch in make_speech_loader(tone_shards, tokenizer_model, config, units=table,
                                                              seed=3) for key, row in zip(batch.id, batch.units.data)}
    assert again == starts
    first = SpeechLoaderConfig(1.5, max_sample_size=16000, random_crop=False)
    assert all(int(row[0]) == 0 for batch in make_speech_loader(tone_shards, tokenizer_model, first, units=table)
               for row in batch.units.data)
