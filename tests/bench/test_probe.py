"""bench/probe.py: a linear CTC probe finds a transcript planted linearly in one layer and not in noise."""

import torch

from bench.probe import greedy_ids, probe_layers, train_ctc_probe

LETTERS = "abcde"  # tokens 1-5; 0 is the CTC blank


def planted(count, seed, dim=12):
    """Utterances of random letter sequences: each letter held 2-3 frames with blank frames between.
    Layer 1 = one-hot(frame label) x a fixed random matrix + noise (linearly readable); layer 0 = noise."""
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(len(LETTERS) + 1, dim, generator=torch.Generator().manual_seed(99))
    noise_layer, signal_layer, tokens = [], [], []
    for _ in range(count):
        letters = torch.randint(1, len(LETTERS) + 1, (int(torch.randint(3, 7, (1,), generator=generator)),),
                                generator=generator)
        frames = torch.cat([torch.cat([torch.zeros(1, dtype=torch.long), letter.repeat(2 + i % 2)])
                            for i, letter in enumerate(letters)] + [torch.zeros(1, dtype=torch.long)])
        one_hot = torch.nn.functional.one_hot(frames, len(LETTERS) + 1).float()
        signal_layer.append(one_hot @ mixing + 0.1 * torch.randn(len(frames), dim, generator=generator))
        noise_layer.append(torch.randn(len(frames), dim, generator=generator))
        tokens.append(letters)
    return [noise_layer, signal_layer], tokens


def test_the_probe_recovers_a_planted_linear_signal_and_not_noise():
    """Trained 300 updates on 200 utterances, scored on 50 others: the planted layer's CER is under 5 %,
    the noise layer's over 50 % (the probe reads what is linearly there, nothing more)."""
    torch.manual_seed(0)
    train_layers, train_tokens = planted(200, seed=1)
    dev_layers, dev_tokens = planted(50, seed=2)
    decode = lambda ids: "".join(LETTERS[i - 1] for i in ids)  # noqa: E731
    refs = {f"utt{i}": decode(t.tolist()) for i, t in enumerate(dev_tokens)}
    noise, signal = probe_layers(train_layers, train_tokens, dev_layers, refs, decode, len(LETTERS) + 1,
                                 updates=300)
    assert signal.value < 5.0 and signal.low <= signal.value <= signal.high
    assert noise.value > 50.0


def test_a_probe_is_a_fixed_function_of_its_seed():
    """Same features, targets and seed: the same head, the same greedy output."""
    layers, tokens = planted(20, seed=3)
    heads = [train_ctc_probe(layers[1], tokens, len(LETTERS) + 1, updates=20, seed=5) for _ in range(2)]
    assert greedy_ids(heads[0], layers[1]) == greedy_ids(heads[1], layers[1])
