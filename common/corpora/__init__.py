"""Corpus layout readers: what a corpus on disk holds, as entries for local/make_shards.py."""
