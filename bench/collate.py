#!/usr/bin/env python3
"""Padding a batch: SpeechBrain's ``batch_pad_right`` against ``common.data.pipeline.pad_right`` (one
``pad_sequence`` call), on the batches the loaders make, in one run on one machine.

    python bench/collate.py [--repeats 5] [--json]

Batches (seeded): text, 256 sentences of 5-40 tokens (the text loader's largest batches); speech, 32
waveforms of 2-20 s at 16 kHz. Each row: the best of ``--repeats`` timings of padding the batch's
tensors with each function, and whether both give the same padded tensor and relative lengths (they
must: the loaders' batches would change otherwise).
"""

import argparse
import json
import time

import torch
from speechbrain.utils.data_utils import batch_pad_right

from common.data.pipeline import pad_right


def batches():
    generator = torch.Generator().manual_seed(0)
    sizes = torch.randint(5, 41, (256,), generator=generator).tolist()
    text = [torch.randint(5, 500, (n,), generator=generator) for n in sizes]
    seconds = torch.randint(32000, 320001, (32,), generator=generator).tolist()
    speech = [torch.randn(n, generator=generator) for n in seconds]
    return {"text: 256 sentences of 5-40 tokens": text, "speech: 32 waveforms of 2-20 s": speech}


def best_seconds(function, tensors, repeats):
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        function(tensors, value=0)
        times.append(time.perf_counter() - began)
    return min(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the rows")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name, tensors in batches().items():
        (ours, our_lengths), (theirs, their_lengths) = pad_right(tensors, 0), batch_pad_right(tensors, value=0)
        same = torch.equal(ours, theirs) and torch.equal(our_lengths, their_lengths)
        speechbrain_s, pad_right_s = (best_seconds(f, tensors, args.repeats) for f in (batch_pad_right, pad_right))
        rows.append({"batch": name, "speechbrain_ms": round(1000 * speechbrain_s, 3),
                     "pad_right_ms": round(1000 * pad_right_s, 3), "speedup": round(speechbrain_s / pad_right_s, 2),
                     "identical": same})
        print(f"{name:36} batch_pad_right {rows[-1]['speechbrain_ms']:8.3f} ms  pad_right "
              f"{rows[-1]['pad_right_ms']:8.3f} ms  {rows[-1]['speedup']:5.2f}x  identical: {same}")
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0 if all(row["identical"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
