"""Model graphs assembled from SpeechBrain lobes; see ``encoder_decoder`` for the weight names."""

from common.models.encoder_decoder import EncoderDecoderOutput, SpeechEncoderDecoder

__all__ = ["EncoderDecoderOutput", "SpeechEncoderDecoder"]
