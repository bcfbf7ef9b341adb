"""Every command ends on a user error with one ``error:`` message and exit status 2, no traceback
(common.user_errors.run_command); TANDEM_DEBUG=1 shows the stack."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def command(*args, debug=False):
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("TANDEM_DEBUG", None)
    if debug:
        env["TANDEM_DEBUG"] = "1"
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)


def test_a_mistyped_key_prints_one_error_line_with_the_hint_and_no_traceback():
    """train.py small.yaml --lr_peek=0.1: exit 2, stderr is the one line naming the key and the closest one."""
    result = command("recipes/finetune/train.py", "recipes/finetune/hparams/small.yaml", "--lr_peek=0.1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        'error: "lr_peek" is not a key of recipes/finetune/hparams/conformer.yaml (the base of '
        'recipes/finetune/hparams/small.yaml). Did you mean "lr_peak"?']
    assert "Traceback" not in result.stdout + result.stderr
    debug = command("recipes/finetune/train.py", "recipes/finetune/hparams/small.yaml", "--lr_peek=0.1", debug=True)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ConfigError" in debug.stderr


@pytest.mark.parametrize("args, message", [
    (["recipes/pretrain/train.py", "recipes/pretrain/hparams/small.yaml", "--mask_prop=0.5"], "mask_prob"),
    (["recipes/lm/train.py", "recipes/lm/hparams/rnnlm.yaml", "--lr_peak=fast"], "pass a float"),
    (["recipes/finetune/transcribe.py", "no/such/exp", "a.wav"], "no/such/exp/hyperparams.yaml is missing"),
    (["recipes/finetune/export.py", "no/such/exp", "out"], "no/such/exp/hyperparams.yaml is missing"),
    (["local/config_value.py", "recipes/finetune/hparams/small.yaml", "no_such_key"], "has no key 'no_such_key'"),
])
def test_every_command_ends_a_user_error_with_its_message_and_exit_2(args, message):
    result = command(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stdout + result.stderr
