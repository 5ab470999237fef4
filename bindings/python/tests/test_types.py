"""The type hints the package ships (py.typed) hold: mypy --strict over it finds nothing."""
import os
import subprocess
import sys

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src"))


def test_the_package_passes_mypy_strict(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports", "--cache-dir",
                           str(tmp_path / "mypy-cache"), "-p", "keychain"], cwd=SRC, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
