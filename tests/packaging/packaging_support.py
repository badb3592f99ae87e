"""The repository's root and running a command there that must succeed: shared by the packaging
and quick-start tests, which build and install the distribution.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*command: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, check=False,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result.stdout
