"""The token contract: the ids every tokenizer (``local/train_tokenizer.py``), loader, model and
decoder of Tandem relies on, defined here once.

    0 = <blank>  the CTC blank, also the padding index of every token tensor
    1 = <s>      begin of sequence: the decoder's first input
    2 = </s>     end of sequence: the decoder's last target
    3 = <unk>    a piece the tokenizer does not know

User symbols (language tags, ``<mask>``) come next, then the learned pieces.
"""

BLANK = 0
BOS = 1
EOS = 2
UNK = 3
SENTENCEPIECE_IDS = {"pad_id": BLANK, "bos_id": BOS, "eos_id": EOS, "unk_id": UNK}  # SentencePiece's names
