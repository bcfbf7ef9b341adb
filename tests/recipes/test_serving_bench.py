"""Smoke test of bench/serving.py on the tiny chunk-trained model and the tiny corpus' test split."""

import itertools
import json

from bench import serving, stats


def test_serving_bench_measures_every_row_on_each_thread_count(chunk_trained, speech_corpus, capsys, tmp_path):
    """One thread count, two chunk sizes: the offline greedy / beam, streaming (greedy and beam + rescoring)
    and onnxruntime rows (offline and streaming) are all there with WER inside its interval, CER and a
    positive real-time factor; the streaming greedy row with a chunk covering every recording scores as
    offline greedy (WER ratio 1) and gives its first word only at the end of the audio (first-partial
    latency past the word's end), onnxruntime's greedy scores as torch's (same hypotheses), and so do its
    streaming rows (greedy, and prefix beam rescored at endpoints) torch's streaming ones, and 320 ms
    streaming has a positive final latency and a WER ratio to offline; the hypotheses written by --hyps_dir
    score as the row."""
    exp, _ = chunk_trained
    assert serving.main([str(exp), str(speech_corpus / "test.jsonl"), "--threads", "1",
                         "--chunks_ms", "60000", "320", "--json", "--hyps_dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    result = json.loads(printed[-1])
    rows = {r["row"]: r for r in result["rows"]}
    assert set(rows) == {"torch offline ctc_greedy", "torch offline beam", "onnxruntime offline ctc_greedy",
                         "onnxruntime offline prefix beam + rescoring",
                         *(f"{runtime} streaming {search} {chunk} ms" for runtime in ("torch", "onnxruntime")
                           for search in ("ctc_greedy", "beam") for chunk in (60000, 320))}
    assert all(r["rtf"] > 0 and 0 <= r["cer"] and r["threads"] == 1 for r in rows.values())
    assert all(r["wer_interval"][0] <= r["wer"] <= r["wer_interval"][1] for r in rows.values())
    greedy, whole = rows["torch offline ctc_greedy"], rows["torch streaming ctc_greedy 60000 ms"]
    assert 0 < greedy["cer"] < 100  # neither all right nor all wrong: equal rows below would prove little
    assert (whole["wer"], whole["cer"], whole["wer_interval"]) == (greedy["wer"], greedy["cer"], greedy["wer_interval"])
    assert whole["wer_vs_offline"] in ([1.0, 1.0, 1.0], None)  # None: offline greedy made no error
    assert whole["first_partial_utterances"] > 0 and whole["first_partial_latency_ms"] > 0
    onnx = rows["onnxruntime offline ctc_greedy"]
    assert (onnx["wer"], onnx["cer"]) == (greedy["wer"], greedy["cer"])
    for search, chunk in itertools.product(("ctc_greedy", "beam"), (60000, 320)):  # ONNX decodes as torch
        torch_row = rows[f"torch streaming {search} {chunk} ms"]
        onnx_row = rows[f"onnxruntime streaming {search} {chunk} ms"]
        assert (onnx_row["wer"], onnx_row["cer"]) == (torch_row["wer"], torch_row["cer"])
        assert onnx_row["final_latency_ms"] > 0 and onnx_row["chunk_compute_ms"] > 0
    onnx_greedy = rows["onnxruntime streaming ctc_greedy 320 ms"]
    assert onnx_greedy["wer_vs_offline"] == rows["torch streaming ctc_greedy 320 ms"]["wer_vs_offline"]
    for search in ("ctc_greedy", "beam"):
        streamed = rows[f"torch streaming {search} 320 ms"]
        assert streamed["final_latency_ms"] > 0 and len(streamed["wer_vs_offline"]) == 3
    assert result["audio_s"] > 5
    written = stats.read_scored(tmp_path / "torch_streaming_beam_320_ms_1t.jsonl")  # --hyps_dir, as stats reads it
    assert round(stats.error_rate(written).value, 2) == rows["torch streaming beam 320 ms"]["wer"]
    assert any(line.startswith("torch streaming beam 320 ms") for line in printed[:-1])  # the table
