"""The deployment recipes of the README and docs/ under the real servers: the FastAPI app of
the quick start under ``uvicorn --workers 2`` and ``SNOWFLAKE_WORKER_ID`` under ``uvicorn
--reload``, gunicorn's and Celery's recipes, and the /metrics endpoint.

The apps are the pages' own blocks (the one headed ``# app.py``, ``# gunicorn.conf.py``, ...),
written to files, so a recipe cannot drift from what is tested.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from example_project.local_servers import free_port
from snowflake_db import Layout

from ..plugins.scheduler_delay import (
    communicate_patiently,
    kill_and_collect,
    run_patiently,
    wait_patiently,
)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _readme_block(first_line: str) -> str:
    """The block of README.md or of a documentation page (docs/) that starts with that line."""
    for document in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for token in MarkdownIt("commonmark").parse(document.read_text()):
            if token.type == "fence" and token.content.startswith(first_line + "\n"):
                return token.content
    raise AssertionError(f"no block of README.md or docs/ starts with {first_line!r}")


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text(_readme_block("# app.py"))
    # Tables first: two workers running create_all at once could race (use migrations in
    # production; create_all in the lifespan is the example's shortcut).
    subprocess.run([sys.executable, "-c", "import app; app.SQLModel.metadata.create_all("
                    "app.engine)"], cwd=tmp_path, check=True, timeout=60)
    return tmp_path


def _environment(**variables: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("SNOWFLAKE_WORKER") and key != "DATABASE_URL"}
    environment.update(variables)
    return environment


def _stop(server: subprocess.Popen[str]) -> str:
    """Stop the server as Ctrl+C does and wait for its own shutdown (killed only past a patient
    30 s: a killed server's children release nothing, which the tests would see as parked)."""
    server.send_signal(signal.SIGINT)
    output = communicate_patiently(server, 30)
    if output is None:
        output = kill_and_collect(server)
    return output[0]


def test_uvicorn_workers_each_lease_their_own_worker_id(app_dir: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [str(BIN / "uvicorn"), "app:app", "--workers", "2", "--port", str(port)],
        cwd=app_dir, env=_environment(SNOWFLAKE_WORKER_URL=f"sqlite:///{app_dir}/control.db"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        ids: list[int] = []
        deadline = time.monotonic() + 60
        while len(ids) < 40 and time.monotonic() < deadline:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/orders?total_cents=100", method="POST")
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    body = json.load(response)
            except OSError:
                time.sleep(0.2)  # still starting
                continue
            assert isinstance(body["id"], str)  # JSON-safe
            ids.append(int(body["id"]))
        # The second worker may start after the first served every request (a loaded machine).
        live = _wait_for_live_slots(app_dir / "control.db", 2, server)
    finally:
        output = _stop(server)
    assert len(ids) == 40, output
    assert len(set(ids)) == 40
    # Both workers leased at start-up (the lifespan), each its own worker ID.
    assert len(live) == 2 and len({slot["pid"] for slot in live}) == 2, live
    assert {Layout().decode(i).worker_id for i in ids} <= {slot["worker_id"] for slot in live}


def test_static_worker_id_under_uvicorn_reload_stops_start_up_saying_what_to_do(
    app_dir: Path,
) -> None:
    port = free_port()
    log = app_dir / "server.log"
    with log.open("w") as sink:
        server = subprocess.Popen(
            [str(BIN / "uvicorn"), "app:app", "--reload", "--port", str(port)],
            cwd=app_dir, env=_environment(SNOWFLAKE_WORKER_ID="5"),
            stdout=sink, stderr=subprocess.STDOUT, text=True,
        )
    try:
        # The reloader spawns the server process, whose lifespan fails.
        deadline = time.monotonic() + 60
        while "Application startup failed" not in log.read_text() and (
                time.monotonic() < deadline):
            time.sleep(0.2)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/orders?total_cents=1",
                                         method="POST")
        with pytest.raises(OSError):  # never served a request: it did not start
            urllib.request.urlopen(request, timeout=5)
    finally:
        _stop(server)
        output = log.read_text()
    assert "ForkedWorkerIdError: SNOWFLAKE_WORKER_ID=5 was inherited from pid" in output, output
    assert "Use a table allocator (SNOWFLAKE_WORKER_URL" in output
    assert "Application startup failed" in output


def _wait_for_live_slots(control: Path, count: int, server: subprocess.Popen[str]) -> list[dict]:
    """The live slots of the control database once ``count`` processes hold one."""
    live: list[dict] = []

    def counted(pause: float) -> bool:
        listing = run_patiently(
            [str(BIN / "snowflake-db"), "workers", "list", "--json", "--url", f"sqlite:///{control}"],
            60,
        )
        if listing.returncode == 0:
            live[:] = [slot for slot in json.loads(listing.stdout) if slot["state"] == "live"]
        if len(live) >= count or server.poll() is not None:
            return True
        time.sleep(min(pause, 0.5))
        return False

    wait_patiently(counted, 60)
    return live


WSGI_APP = '''
import snowflake_db

generator = snowflake_db.get_generator()   # configured in the parent, before gunicorn forks


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(snowflake_db.snowflake_default()).encode()]
'''


def test_gunicorn_preload_post_fork_leases_one_worker_id_per_worker(tmp_path: Path) -> None:
    (tmp_path / "gunicorn.conf.py").write_text(_readme_block("# gunicorn.conf.py  (run: "
                                                             "SNOWFLAKE_WORKER_URL=… gunicorn -c "
                                                             "gunicorn.conf.py myshop.wsgi)"))
    (tmp_path / "wsgiapp.py").write_text(WSGI_APP)
    control = tmp_path / "control.db"
    server = subprocess.Popen(
        [str(BIN / "gunicorn"), "-c", "gunicorn.conf.py", "--bind", f"127.0.0.1:{free_port()}",
         "wsgiapp:app"],
        cwd=tmp_path, env=_environment(SNOWFLAKE_WORKER_URL=f"sqlite:///{control}"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        live = _wait_for_live_slots(control, 4, server)
    finally:
        output = _stop(server)
    # post_fork leased one worker ID in each of the 4 workers; the preloaded parent none.
    assert len(live) == 4 and len({slot["pid"] for slot in live}) == 4, (live, output)
    assert server.pid not in {slot["pid"] for slot in live}


#: The README's /metrics endpoint next to an app that issues one ID per request.
METRICS_WSGI_APP = '''
import snowflake_db
from metrics import metrics_app


def app(environ, start_response):
    if environ["PATH_INFO"] == "/metrics":
        return metrics_app(environ, start_response)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(snowflake_db.snowflake_default()).encode()]
'''


def _scrape(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        sample.name + "".join(f"{{{key}={value}}}" for key, value in sample.labels.items()): (
            sample.value
        )
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("snowflake_db_")
    }


#: Appended to the README's gunicorn.conf.py: each worker starts 2 s late (a slow import or
#: control database), as a loaded machine makes it.
_SLOW_START = """

import time

_readme_post_fork = post_fork


def post_fork(server, worker):
    time.sleep(2)
    _readme_post_fork(server, worker)
"""


def _start_metrics_server(tmp_path: Path, conf_tail: str = "") -> tuple[subprocess.Popen[str], int]:
    """gunicorn, 2 workers, with the README's gunicorn.conf.py and /metrics endpoint."""
    (tmp_path / "gunicorn.conf.py").write_text(
        _readme_block("# gunicorn.conf.py  (run: PROMETHEUS_MULTIPROC_DIR=/run/prom "
                      "SNOWFLAKE_WORKER_URL=… gunicorn -c gunicorn.conf.py myshop.wsgi)")
        + conf_tail)
    (tmp_path / "metrics.py").write_text(
        _readme_block("# metrics.py: the /metrics endpoint, served by any worker"))
    (tmp_path / "wsgiapp.py").write_text(METRICS_WSGI_APP)
    (tmp_path / "prom").mkdir()
    port = free_port()
    server = subprocess.Popen(
        [str(BIN / "gunicorn"), "-c", "gunicorn.conf.py", "--workers", "2",
         "--bind", f"127.0.0.1:{port}", "wsgiapp:app"],
        cwd=tmp_path,
        env=_environment(SNOWFLAKE_WORKER_URL=f"sqlite:///{tmp_path}/control.db",
                         PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom")),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    return server, port


def _wait_until_serving(port: int, server: subprocess.Popen[str]) -> None:
    """Poll /metrics (which issues no ID) until a worker answers.

    Only this request is retried: an ID request that timed out while the workers were starting
    is not lost but queued by the kernel, and a worker serves it (and counts its ID) later.
    """
    deadline = time.monotonic() + 60
    while True:
        try:
            _scrape(port)
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _issue_ids(port: int, count: int) -> int:
    """``count`` ID requests, none retried (see :func:`_wait_until_serving`)."""
    for _ in range(count):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as response:
            int(response.read())
    return count


def _scrape_when_counted(port: int, issued: int) -> list[dict[str, float]]:
    """Nine scrapes, once the copies (every 5 s) of both workers, each with its lease, reach
    ``issued``: whichever worker answers each one, it must show the whole server's count."""
    deadline = time.monotonic() + 30
    scrape = _scrape(port)
    while (scrape["snowflake_db_ids_issued_total"] < issued
           or scrape["snowflake_db_lease_acquisitions_total"] < 2) and (
            time.monotonic() < deadline):
        time.sleep(0.5)
        scrape = _scrape(port)
    return [scrape] + [_scrape(port) for _ in range(8)]


def test_gunicorn_workers_figures_are_summed_by_prometheus_multiprocess(tmp_path: Path) -> None:
    server, port = _start_metrics_server(tmp_path)
    try:
        _wait_until_serving(port, server)
        issued = _issue_ids(port, 40)
        scrapes = _scrape_when_counted(port, issued)
    finally:
        output = _stop(server)
        print(output)  # gunicorn's log, shown if the test fails
    assert [s["snowflake_db_ids_issued_total"] for s in scrapes] == [40] * 9, output
    for each in scrapes:
        assert each["snowflake_db_control_database_up"] == 1, (each, output)
        # post_fork leased one slot in each worker, whether it served an ID or not.
        assert each["snowflake_db_worker_slots{state=live}"] == 2
        assert each["snowflake_db_lease_acquisitions_total"] == 2
        assert each["snowflake_db_fenced_generators"] == 0
        assert each["snowflake_db_worker_slot_capacity"] == Layout().max_worker_id + 1


def test_an_id_request_the_client_gave_up_on_during_start_up_is_served_and_counted(
    tmp_path: Path,
) -> None:
    """Why the test above retries no ID request: this one, sent while the workers start and
    abandoned after 0.5 s, is still served once a worker is up, and its ID counted (41, not 40).
    The test once counted its retried requests and expected 40 where the server issued 41."""
    server, port = _start_metrics_server(tmp_path, _SLOW_START)
    try:
        deadline = time.monotonic() + 60
        while True:  # the master listens (it binds before it forks the workers)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        with pytest.raises(TimeoutError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=0.5)
        _wait_until_serving(port, server)
        issued = _issue_ids(port, 40)
        scrapes = _scrape_when_counted(port, issued + 1)
    finally:
        output = _stop(server)
        print(output)  # gunicorn's log, shown if the test fails
    assert [s["snowflake_db_ids_issued_total"] for s in scrapes] == [41] * 9, output


CELERY_RECIPE = (
    "# tasks.py  (run: SNOWFLAKE_WORKER_URL=… celery -A tasks worker --concurrency 4 "
    "--max-tasks-per-child 100)"
)


def test_celery_prefork_worker_process_init_leases_one_worker_id_per_process(
    tmp_path: Path,
) -> None:
    (tmp_path / "tasks.py").write_text(_readme_block(CELERY_RECIPE))
    control = tmp_path / "control.db"
    server = subprocess.Popen(
        [str(BIN / "celery"), "-A", "tasks", "-b", "memory://", "worker", "--concurrency", "2",
         "--pool", "prefork", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=tmp_path, env=_environment(SNOWFLAKE_WORKER_URL=f"sqlite:///{control}"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        live = _wait_for_live_slots(control, 2, server)
    finally:
        output = _stop(server)
    assert len(live) == 2 and len({slot["pid"] for slot in live}) == 2, (live, output)


#: Appended to the Celery recipe: 8 worker slots, a broker in files (tasks are sent from this
#: test process), and a task that issues IDs and writes them down.
_CELERY_RECYCLING = """

# -- added by the test ---------------------------------------------------------------------------
import json
import os
from pathlib import Path

from snowflake_db import Layout
from snowflake_db.worker import TableWorkerAllocator

app.conf.broker_url = "filesystem://"
broker_dir = os.environ["TEST_BROKER_DIR"]
app.conf.broker_transport_options = {
    "data_folder_in": broker_dir, "data_folder_out": broker_dir, "control_folder": broker_dir
}
snowflake_db.configure(
    allocator=TableWorkerAllocator(os.environ["SNOWFLAKE_WORKER_URL"], lease_seconds=30),
    layout=Layout(worker_bits=3),
)


@app.task
def issue(task):
    ids = [snowflake_db.snowflake_default() for _ in range(100)]
    worker = snowflake_db.get_generator().worker_id
    report = {"worker": worker, "pid": os.getpid(), "ids": ids}
    Path(os.environ["TEST_RESULTS_DIR"], f"{task}.json").write_text(json.dumps(report))
"""


def test_celery_max_tasks_per_child_recycles_processes_without_parking_slots(
    tmp_path: Path,
) -> None:
    """One task per pool process over 8 worker slots with 30 s leases: 24 tasks need 24
    processes, so every retired process must release its slot as billiard ends it."""
    from celery import Celery

    tasks, broker, results = 24, tmp_path / "broker", tmp_path / "results"
    broker.mkdir()
    results.mkdir()
    (tmp_path / "tasks.py").write_text(_readme_block(CELERY_RECIPE) + _CELERY_RECYCLING)
    control = tmp_path / "control.db"
    server = subprocess.Popen(
        [str(BIN / "celery"), "-A", "tasks", "worker", "--concurrency", "2",
         "--max-tasks-per-child", "1", "--pool", "prefork", "--without-gossip",
         "--without-mingle", "--without-heartbeat"],
        cwd=tmp_path, env=_environment(
            SNOWFLAKE_WORKER_URL=f"sqlite:///{control}", TEST_BROKER_DIR=str(broker),
            TEST_RESULTS_DIR=str(results)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    producer = Celery("tasks", broker="filesystem://")
    producer.conf.broker_transport_options = {
        "data_folder_in": str(broker), "data_folder_out": str(broker),
        "control_folder": str(broker)}
    try:
        for task in range(tasks):
            producer.send_task("tasks.issue", args=(task,))
        def all_reported(pause: float) -> bool:
            if len(list(results.glob("*.json"))) >= tasks or server.poll() is not None:
                return True
            time.sleep(min(pause, 0.2))
            return False

        wait_patiently(all_reported, 180)
    finally:
        output = _stop(server)
    reports = [json.loads(path.read_text()) for path in results.glob("*.json")]
    assert len(reports) == tasks, output[-3000:]
    assert "WorkerIdExhaustedError" not in output, output[-3000:]
    assert len({report["pid"] for report in reports}) == tasks  # a new process for every task
    assert {report["worker"] for report in reports} <= set(range(8))
    ids = [i for report in reports for i in report["ids"]]
    assert len(ids) == len(set(ids)) == tasks * 100
    listing = subprocess.run(
        [str(BIN / "snowflake-db"), "workers", "list", "--json", "--url", f"sqlite:///{control}"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    # Stopped cleanly: every slot is free again, none parked for the lease length.
    assert all(slot["state"] == "free" for slot in json.loads(listing.stdout)), (
        f"{listing.stdout}\n{output[-3000:]}")
