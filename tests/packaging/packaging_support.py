"""The repository's root and running a command there that must succeed: shared by the packaging
and quick-start tests, which build and install the distribution.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*command: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, check=False,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def install(python: Path, *requirements: str | Path) -> None:
    """Install offline into the venv of ``python``: by uv when the test venv has it (make test's
    does; a tenth of pip's time and CPU), else by pip. Both resolve from the same metadata, so a
    requirement missing from an extra is missing either way."""
    uv = Path(sys.executable).parent / "uv"
    if uv.exists():
        run(uv, "pip", "install", "--quiet", "--python", python, *requirements)
    else:
        run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", *requirements)
