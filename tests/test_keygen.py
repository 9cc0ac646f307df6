"""``toolnexus keygen NAME [--dir DIR]``: a private key only its owner can read, a public
line to trust it by, and never a key replaced."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from toolnexus import Request
from toolnexus.cli import main
from toolnexus.security import Keyring, SigningKey
from toolnexus.security._signing import sign_request, verify_request


def test_keygen_writes_a_loadable_key_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "keys"
    assert main(["keygen", "ops-bot", "--dir", str(folder)]) == 0
    key_path, pub_path = folder / "ops-bot.key", folder / "ops-bot.pub"
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"private key: {key_path.resolve()}")
    assert out[1] == f"public key:  {pub_path.resolve()}"
    key = SigningKey.load(key_path)
    assert out[-1] == key.public_line() == pub_path.read_text().strip()
    trusted = tmp_path / "trusted"
    trusted.write_text(out[-1] + "\n")  # the printed line, pasted into a trusted-keys file
    signed = sign_request(Request(id="req-1", kind="approval"), key)
    assert verify_request(signed, Keyring.load(trusted)) == "ops-bot"
    assert verify_request(signed, Keyring.load(folder)) == "ops-bot"


def test_keygen_refuses_to_replace_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keygen", "agent-7", "--dir", str(tmp_path)]) == 0
    before = (tmp_path / "agent-7.key").read_bytes()
    capsys.readouterr()
    assert main(["keygen", "agent-7", "--dir", str(tmp_path)]) == 2
    assert "agent-7.key exists already: not replacing a key" in capsys.readouterr().err
    assert (tmp_path / "agent-7.key").read_bytes() == before


def test_keygen_refuses_a_name_that_is_no_file_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keygen", "../escape", "--dir", str(tmp_path)]) == 2
    assert "key name '../escape' must start with a letter or digit" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_installed_command_runs_keygen_in_the_current_directory(tmp_path: Path) -> None:
    toolnexus = Path(sys.executable).with_name("toolnexus")
    done = subprocess.run(
        [str(toolnexus), "keygen", "web"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1] == SigningKey.load(tmp_path / "web.key").public_line()
