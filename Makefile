# Tandem: every target is idempotent. `make demo` runs the main job on the built-in demo corpus,
# `make test` runs the tests; both set up the environment first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= data/demo

.PHONY: setup system-packages demo demo-pretrain test bench clean-demo

setup: $(VENV)/.installed system-packages

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

# espeak-ng synthesizes the demo corpus and the tests' speech.
system-packages:
	@bash local/install_system_packages.sh espeak-ng

# The demo finetunes from scratch: it fits 15 minutes on 2 cores. Pretraining first adds ~8 minutes
# and does not pay on the demo yet (bench/pretrain_gain.py; README, Pretraining).
demo: setup
	bash recipes/finetune/run.sh --data $(DEMO_DIR)

# The whole chain: joint speech-text pretraining, then finetuning from it on every label.
demo-pretrain: setup
	bash recipes/pretrain/run.sh --data $(DEMO_DIR)
	bash recipes/finetune/run.sh --data $(DEMO_DIR) --pretrained exp/pretrain_demo --exp exp/finetune_demo_pretrained

test: setup
	$(PY) -m pytest

bench: setup
	$(PY) bench/encode.py
	$(PY) bench/batching.py
	$(PY) bench/loader.py

clean-demo:
	rm -rf $(DEMO_DIR)
