"""The README's FastAPI quick start, run as written in a fresh venv holding only the wheel and
its ``fastapi`` extra: ``uvicorn app:app`` serves an order, and the TestClient block passes.

Offline: the extra's requirements are resolved by the installer itself (``--no-index``) from a local
wheelhouse holding the distributions of the whole dependency closure, repacked from this test
venv. A requirement missing from the extra is then missing from the fresh venv too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from email.parser import Parser
from importlib.metadata import Distribution, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from example_project.local_servers import free_port

from .packaging_support import REPO, install, run

# One group: the fresh venv is built once, not once per pytest-xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("quickstart_fastapi")]

SECTION = "### FastAPI + SQLModel quick start"
EXTRA = "fastapi"


def _quick_start() -> tuple[str, str, str]:
    """The section's app block, its console command and its TestClient block."""
    text = (REPO / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)([^\n]*)\n(.*?)```", section, re.S)
    [app] = [code for lang, info, code in blocks if lang == "python" and not info.strip()]
    [console] = [code for lang, _, code in blocks if lang == "console"]
    [client] = [code for lang, info, code in blocks if "continuation" in info]
    [command] = [line[2:] for line in console.splitlines() if line.startswith("$ ")]
    return app, command, client


def _requires(metadata: str, extras: set[str]) -> list[Requirement]:
    requirements = []
    for line in Parser().parsestr(metadata).get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in extras or {""}):
            requirements.append(requirement)
    return requirements


def _repack(dist: Distribution, out: Path) -> Path:
    """An installed distribution as the wheel it came from (files under site-packages only:
    pip writes scripts, RECORD, INSTALLER again)."""
    wheel_meta = Parser().parsestr(dist.read_text("WHEEL") or "")
    tag = wheel_meta["Tag"]
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    path = out / f"{name}-{dist.version}-{tag}.whl"
    records = []
    dist_info = ""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in dist.files or []:
            text = str(file)
            if text.startswith("..") or "__pycache__" in text or text.endswith(".pyc"):
                continue
            if text.endswith(".dist-info/RECORD"):
                dist_info = text.rsplit("/", 1)[0]
                continue
            if text.rsplit("/", 1)[-1] in ("INSTALLER", "REQUESTED", "direct_url.json"):
                continue
            data = Path(str(dist.locate_file(file))).read_bytes()
            archive.writestr(text, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            records.append(f"{text},sha256={digest.decode()},{len(data)}")
        records.append(f"{dist_info}/RECORD,,")
        archive.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return path


def _wheelhouse(own_wheel: Path, out: Path) -> None:
    """The distributions the extra pulls in, repacked from this venv (pip resolves again)."""
    with zipfile.ZipFile(own_wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        own_metadata = archive.read(name).decode()
    wanted = _requires(own_metadata, {EXTRA})
    seen: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        key = canonicalize_name(requirement.name)
        own = key == "snowflake-db"
        if own:
            key += str(sorted(requirement.extras))  # a self-reference: its extras
        if key in seen:
            continue
        seen.add(key)
        metadata = own_metadata
        if not own:
            dist = distribution(requirement.name)
            _repack(dist, out)
            metadata = dist.read_text("METADATA") or ""
        wanted += _requires(metadata, set(requirement.extras))


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("quickstart")
    dist, wheelhouse = root / "dist", root / "wheelhouse"
    wheelhouse.mkdir()
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", dist, REPO)
    [wheel] = dist.glob("snowflake_db-*.whl")
    _wheelhouse(wheel, wheelhouse)
    venv = root / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    install(venv / "bin" / "python", "--no-index", "--find-links", wheelhouse, f"{wheel}[{EXTRA}]")
    return venv


def _env(venv: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SNOWFLAKE_", "DATABASE_URL", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_testclient_block_runs_without_a_warning(venv: Path, tmp_path: Path) -> None:
    """Every warning is an error here: with only the extra installed, Starlette's test client
    must find the library it wants (httpx2), not warn that httpx is deprecated."""
    app, _, client = _quick_start()
    (tmp_path / "app.py").write_text(app)
    (tmp_path / "client.py").write_text(f"from app import *  # noqa\n{client}\nprint('ok')\n")
    python = venv / "bin" / "python"
    assert run(python, "-W", "error", "client.py", cwd=tmp_path, env=_env(venv)) == "ok\n"


def test_uvicorn_serves_the_app_as_written(venv: Path, tmp_path: Path) -> None:
    app, command, _ = _quick_start()
    (tmp_path / "app.py").write_text(app)
    *assignments, program, target = command.split()
    assert program == "uvicorn" and target == "app:app", command
    env = _env(venv) | dict(a.split("=", 1) for a in assignments)
    port = free_port()  # the command as written, on a port nobody else uses
    server = subprocess.Popen([program, target, "--port", str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/orders?total_cents=1250", method="POST"
                )
                with urllib.request.urlopen(request, timeout=5) as response:
                    created = json.loads(response.read())
                break
            except OSError:
                assert server.poll() is None, server.communicate(timeout=10)[0]
                assert time.monotonic() < deadline, "uvicorn did not answer within 60 s"
                time.sleep(0.2)
        assert isinstance(created["id"], str) and int(created["id"]) > 2**53
        assert created["total_cents"] == 1250
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/orders", timeout=5) as response:
            assert json.loads(response.read())[0] == created  # GET, newest first
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    # uvicorn shuts down gracefully, then ends as SIGTERM would (or with status 0).
    assert server.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output
