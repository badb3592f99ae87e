"""The worker slot and registration admin pages on the test project's real admin site; their
slot summary is the "worker IDs" line of ``manage.py snowflake doctor`` and ``snowflake-db
doctor``."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from django.utils import formats, timezone

from snowflake_db.django.models import WorkerRegistration, WorkerSlot
from snowflake_db.django.worker import sqlalchemy_url
from snowflake_db.django.worker_admin import WorkerRegistrationAdmin, WorkerSlotAdmin
from tests.django.conftest import backends

SLOTS_URL = "/admin/snowflake_db/workerslot/"
REGISTRATIONS_URL = "/admin/snowflake_db/workerregistration/"
FAR_MS = 4_102_444_800_000  # 2100-01-01
BIN = Path(sys.executable).parent


def _slots() -> None:
    """Worker 1 live (web1), 2 expired (web2), 3 free, 4 reserved, as the allocator leaves them."""
    WorkerSlot.objects.create(worker_id=1, lease_token="a" * 32, registration_id=10,
                              hostname="web1", pid=11, acquired_at_ms=1, renewed_at_ms=1,
                              expires_at_ms=FAR_MS, high_water_ms=1_704_067_200_000)
    WorkerSlot.objects.create(worker_id=2, lease_token="b" * 32, registration_id=11,
                              hostname="web2", pid=12, acquired_at_ms=1, renewed_at_ms=1,
                              expires_at_ms=2, high_water_ms=7)
    WorkerSlot.objects.create(worker_id=3, high_water_ms=9)
    WorkerSlot.objects.create(worker_id=4, lease_token="c" * 32, label="orders id function")
    WorkerRegistration.objects.create(id=10, hostname="web1", pid=11,
                                      started_at_ms=1_704_067_200_000, worker_id=1)
    WorkerRegistration.objects.create(id=11, hostname="web2", pid=12, started_at_ms=2,
                                      worker_id=2)


def _admin_client() -> Client:
    User.objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    assert client.login(username="admin", password="pw")
    return client


def _rows(html: str) -> dict[str, str]:
    """Change-list rows by worker ID: the row's text with tags stripped."""
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", html, re.S):
        cells = [re.sub(r"<[^>]+>", "", cell).strip()
                 for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
        if len(cells) > 2 and cells[1].isdigit():
            rows[cells[1]] = " | ".join(cells[1:])
    return rows


def test_pages_are_registered_on_the_default_site() -> None:
    """By the app's admin.py, which autodiscovery (the test project's AdminConfig) imports."""
    assert isinstance(admin.site._registry[WorkerSlot], WorkerSlotAdmin)
    assert isinstance(admin.site._registry[WorkerRegistration], WorkerRegistrationAdmin)


def test_slot_list_explains_each_slot_by_the_database_clock(tx_backend: str) -> None:
    _slots()
    client = _admin_client()
    response = client.get(SLOTS_URL)
    assert response.status_code == 200
    html = response.content.decode()
    rows = _rows(html)
    assert set(rows) == {"1", "2", "3", "4"}
    assert rows["1"].startswith("1 | live | registration 10 | web1 | 11 |")
    assert "2024" in rows["1"]  # the high-water mark as a date (2024-01-01)
    assert re.search(r"^2 \| expired \| registration 11 \| web2 \| 12 \| -\d", rows["2"])
    assert rows["3"].startswith("3 | free | - |")
    assert rows["4"].startswith("4 | reserved | orders id function |") and "never" in rows["4"]
    # The summary is SlotCounts.describe(), as `doctor` prints it.
    assert (
        "worker IDs: 1024 in all: 1 live, 1 reserved, 1 expired, 1 free, 1020 never used; "
        "1022 available now, 0 parked (mark ahead)"
    ) in html
    assert f'href="{SLOTS_URL}add/"' not in html  # no "Add worker slot" button
    expired_only = _rows(client.get(SLOTS_URL, {"state": "expired"}).content.decode())
    assert set(expired_only) == {"2"}
    assert set(_rows(client.get(SLOTS_URL, {"state": "live"}).content.decode())) == {"1"}
    assert set(_rows(client.get(SLOTS_URL, {"state": "free"}).content.decode())) == {"3"}
    assert set(_rows(client.get(SLOTS_URL, {"q": "web2"}).content.decode())) == {"2"}


def test_slots_and_registrations_are_read_only(tx_backend: str) -> None:
    _slots()
    client = _admin_client()
    view = client.get(f"{SLOTS_URL}1/change/")
    assert view.status_code == 200 and "web1" in view.content.decode()
    assert client.get(f"{SLOTS_URL}add/").status_code == 403
    assert client.post(f"{SLOTS_URL}1/change/", {"hostname": "evil"}).status_code == 403
    assert client.get(f"{SLOTS_URL}1/delete/").status_code == 403
    assert WorkerSlot.objects.get(worker_id=1).hostname == "web1"
    registrations = client.get(REGISTRATIONS_URL)
    assert registrations.status_code == 200
    assert "web1" in registrations.content.decode() and "web2" in registrations.content.decode()
    assert client.get(f"{REGISTRATIONS_URL}add/").status_code == 403
    assert client.get(f"{REGISTRATIONS_URL}10/delete/").status_code == 403
    assert client.get(f"{REGISTRATIONS_URL}10/change/").status_code == 200


def test_reap_action_clears_only_expired_leases_of_the_selection(tx_backend: str) -> None:
    _slots()
    client = _admin_client()
    response = client.post(
        SLOTS_URL,
        {"action": "reap_expired", "_selected_action": ["1", "2", "4"]},
        follow=True,
    )
    assert response.status_code == 200
    text = response.content.decode()
    assert "Reaped 1 expired lease(s): 2." in text
    assert "left alone: 1, 4" in text
    reaped = WorkerSlot.objects.get(worker_id=2)
    assert reaped.lease_token is None and reaped.high_water_ms == 7  # the row and mark stay
    assert WorkerSlot.objects.get(worker_id=1).lease_token == "a" * 32
    assert WorkerSlot.objects.get(worker_id=4).lease_token == "c" * 32


def _grant(user: User, codename: str) -> None:
    user.user_permissions.add(Permission.objects.get(codename=codename))


# SQLite only: in this test project auth's many-to-many tables cannot be written on PostgreSQL
# and MariaDB (their "id" column was migrated without a default; see the report). The
# permission check itself does not depend on the backend.
@backends("sqlite", transaction=True)
def test_reap_action_needs_the_change_permission(tx_backend: str) -> None:
    _slots()
    staff = User.objects.create_user("viewer", password="pw", is_staff=True)
    _grant(staff, "view_workerslot")
    client = Client()
    assert client.login(username="viewer", password="pw")
    page = client.get(SLOTS_URL)
    assert page.status_code == 200 and "reap_expired" not in page.content.decode()
    client.post(SLOTS_URL, {"action": "reap_expired", "_selected_action": ["2"]})
    assert WorkerSlot.objects.get(worker_id=2).lease_token == "b" * 32  # not reaped
    _grant(staff, "change_workerslot")
    client.force_login(User.objects.get(pk=staff.pk))
    assert "reap_expired" in client.get(SLOTS_URL).content.decode()


def test_the_admin_summary_is_the_doctor_line_of_the_cli_and_manage_py(tx_backend: str) -> None:
    _slots()
    client = _admin_client()
    html = client.get(SLOTS_URL).content.decode()
    summary = re.search(r"<h2>(worker IDs: [^<]*)</h2>", html)
    assert summary is not None
    out = io.StringIO()
    call_command("snowflake", "doctor", "--database", tx_backend, stdout=out)
    doctor_line = next(line for line in out.getvalue().splitlines() if line.startswith("worker"))
    assert " ".join(doctor_line.split()) == summary.group(1)
    url = sqlalchemy_url(tx_backend).render_as_string(hide_password=False)
    cli = subprocess.run(
        [str(BIN / "snowflake-db"), "doctor", "--url", url],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    cli_line = next(line for line in cli.stdout.splitlines() if line.startswith("worker IDs"))
    assert " ".join(cli_line.split()) == summary.group(1)


def test_pages_need_django_contrib_admin() -> None:
    """Without django.contrib.admin in INSTALLED_APPS nothing imports the app's admin.py
    (and the app starts): run a fresh process with the admin removed."""
    code = (
        "import django, os\n"
        "from django.conf import settings\n"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'tests.django_project.settings'\n"
        "from tests.django_project import settings as s\n"
        "s.INSTALLED_APPS = [a for a in s.INSTALLED_APPS if a != 'django.contrib.admin']\n"
        "django.setup()\n"
        "from django.apps import apps\n"
        "assert not apps.is_installed('django.contrib.admin')\n"
        "import sys\n"
        "print('snowflake_db.django.worker_admin' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=False, cwd=root)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_change_forms_show_times_as_the_lists_do(tx_backend: str) -> None:
    """The list localises a datetime; a read-only field of the change form shows a method's
    value as it is, so the methods hand both the same localised text."""
    _slots()
    client = _admin_client()
    shown = formats.localize(timezone.template_localtime(datetime(2024, 1, 1, tzinfo=UTC)))
    assert "2024" in shown and "+00:00" not in shown
    assert shown in _rows(client.get(SLOTS_URL).content.decode())["1"]
    slot_form = client.get(f"{SLOTS_URL}1/change/").content.decode()
    assert shown in slot_form and "2024-01-01 00:00:00" not in slot_form
    assert "+00:00" not in slot_form
    free_form = client.get(f"{SLOTS_URL}3/change/").content.decode()  # never acquired
    assert "None" not in re.sub(r"<script.*?</script>", "", free_form, flags=re.S)
    assert shown in client.get(REGISTRATIONS_URL).content.decode()
    registration_form = client.get(f"{REGISTRATIONS_URL}10/change/").content.decode()
    assert shown in registration_form and "+00:00" not in registration_form
