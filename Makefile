# Tandem: every target is idempotent. `make demo` runs the main job on the built-in demo corpus,
# `make test` runs the tests; both set up the environment first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= data/demo

.PHONY: setup system-packages demo demo-pretrain open-corpus open test bench clean-demo

setup: $(VENV)/.installed system-packages

# The pinned dependencies, then the project itself (editable): scripts import common, local, recipes.
$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# espeak-ng synthesizes the demo corpus and the tests' speech; flite, festival and its voices add the
# open corpus's other voices, bible-kjv its sentences.
system-packages:
	@bash local/install_system_packages.sh espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k \
		festvox-us-slt-hts bible-kjv

# The demo finetunes from scratch: it fits 15 minutes on 2 cores. Pretraining first adds ~8 minutes
# and does not pay on the demo yet (README, Pretraining; bench/pretrain_gain.py measures it on the open corpus).
demo: setup
	bash recipes/finetune/run.sh --data $(DEMO_DIR)

# The whole chain: joint speech-text pretraining, then finetuning from it on every label.
demo-pretrain: setup
	bash recipes/pretrain/run.sh --data $(DEMO_DIR)
	bash recipes/finetune/run.sh --data $(DEMO_DIR) --pretrained exp/pretrain_demo --exp exp/finetune_demo_pretrained

# The open-vocabulary corpus (2 h of Bible sentences, 29 voices; bench/learning.py trains on it) and
# the default recipe for a user's corpus run on it: shards, tokenizer, training, an LM on the corpus's
# text (lm_text.txt), test on seen and new voices with the LM fused.
OPEN_DIR ?= data/open
open-corpus: setup
	$(PY) local/synth_corpus.py $(OPEN_DIR)/corpus --profile open

open: open-corpus
	bash recipes/finetune/run.sh --data $(OPEN_DIR) --train $(OPEN_DIR)/corpus/train.jsonl \
		--valid $(OPEN_DIR)/corpus/dev.jsonl --test "$(OPEN_DIR)/corpus/test_seen.jsonl $(OPEN_DIR)/corpus/test_unseen.jsonl" \
		--lm_text $(OPEN_DIR)/corpus/lm_text.txt

# ruff first (pyproject.toml: the rules and the 120-character lines the code keeps), then the tests.
test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest

bench: setup
	$(PY) bench/encode.py
	$(PY) bench/batching.py
	$(PY) bench/loader.py

clean-demo:
	rm -rf $(DEMO_DIR)
