"""common/user_errors.py: a user error ends a command with its message and exit 2, no traceback;
TANDEM_DEBUG=1 shows the stack; a bug keeps its traceback."""

import pytest

from common.fingerprint import ChangedInputs
from common.recipe import ConfigError
from common.user_errors import DEBUG_VARIABLE, run_command


def failing(error):
    def main(argv=None):
        raise error
    return main


@pytest.mark.parametrize("error", [ConfigError('"x" is not a key'), ChangedInputs("tokenizer_file: a differs"),
                                   FileNotFoundError("data/x.parquet does not exist")])
def test_a_user_error_prints_its_message_and_exits_2_after_the_cleanup(error, capsys, monkeypatch):
    """Config errors, changed inputs and missing files: one ``error:`` line on stderr, status 2; the
    cleanup (leaving the DDP group) still runs."""
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    cleaned = []
    with pytest.raises(SystemExit) as exit_info:
        run_command(failing(error), ["x"], cleanup=lambda: cleaned.append(True))
    assert exit_info.value.code == 2 and cleaned == [True]
    assert capsys.readouterr().err == f"error: {error}\n"


def test_debug_shows_the_stack_and_a_bug_is_not_a_user_error(monkeypatch):
    monkeypatch.setenv(DEBUG_VARIABLE, "1")
    with pytest.raises(ConfigError):
        run_command(failing(ConfigError("bad")), ["x"])
    monkeypatch.delenv(DEBUG_VARIABLE)
    with pytest.raises(ZeroDivisionError):
        run_command(failing(ZeroDivisionError("a bug")))
    with pytest.raises(SystemExit) as exit_info:
        run_command(lambda argv: 3, [])
    assert exit_info.value.code == 3
