"""Recipe smoke tests: each train.py and run.sh for a few steps on generated speech, on the CPU."""
