import subprocess
import sys

import bootseer
from bootseer.cli.main import main


def test_version(capsys):
    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    assert bootseer.__version__ in capsys.readouterr().out


def test_console_script_help():
    r = subprocess.run([sys.executable, "-m", "bootseer", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "usage: bootseer" in r.stdout
