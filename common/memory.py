"""How much memory a training step will take, measured on the model before training starts.

Activations: one training-mode forward pass of a single utterance of the largest batch's padded
length (and its longest target) with ``torch.autograd.graph.saved_tensors_hooks`` counting every tensor
saved for the backward pass (each storage once, parameters excluded), times the batch's utterance count:
activation memory grows linearly with the batch at a fixed padded length. The pass runs on a copy of
the model with the random state restored after it, so neither the model's statistics nor the run's
randomness change; the figure is for fp32 (bf16 autocast roughly halves it). Weights, gradients and
Adam's two moments add 16 bytes per trainable parameter.
"""

import copy

import torch

SAMPLE_RATE = 16000


def saved_activation_bytes(model, seconds, target_tokens):
    """Bytes saved for backward by ``model``'s teacher-forced pass of one utterance of ``seconds``
    with ``target_tokens`` tokens (``model(wavs, wav_lens, tokens_bos)``), measured on a copy."""
    replica = copy.deepcopy(model).train()  # dropout masks and statistics updates happen on the copy
    parameters = {p.untyped_storage().data_ptr() for p in replica.parameters()}
    seen, total = set(), 0

    def pack(tensor):
        nonlocal total
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return tensor

    generator = torch.Generator().manual_seed(0)
    wavs = 0.05 * torch.randn(1, max(1, int(seconds * SAMPLE_RATE)), generator=generator)
    tokens_bos = torch.ones(1, max(1, int(target_tokens)) + 1, dtype=torch.long)
    with torch.random.fork_rng(devices=[]), torch.enable_grad(), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        replica(wavs, torch.ones(1), tokens_bos)
    return total


def training_memory(model, padded_seconds, utterances, target_tokens):
    """``{"activations_gib", "states_gib", "total_gib"}`` of a training step on a batch of
    ``utterances`` padded to ``padded_seconds / utterances`` each, targets of ``target_tokens``."""
    per_utterance = saved_activation_bytes(model, padded_seconds / utterances, target_tokens)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    activations, states = per_utterance * utterances / 2**30, 16 * trainable / 2**30
    return {"activations_gib": activations, "states_gib": states, "total_gib": activations + states}
