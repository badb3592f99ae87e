#!/usr/bin/env bash
# The Django tests under Django 6.x on Python 3.12 (Django 6 needs Python 3.12+).
#
# Usage: bash tests/django/run_django6.sh [pytest args]. Builds .venv/django6-py312 once (again when
# pyproject.toml changes) with the project's test extra and Django 6, then runs tests/django.
# Python 3.12 comes from $PYTHON312, else python3.12 on PATH, else pyenv's 3.12.x. Without it the
# script says so and exits 0, or 1 under CI=true (CI must never pass by skipping).
set -euo pipefail
cd "$(dirname "$0")/../.."

python312="${PYTHON312:-}"
if [ -z "$python312" ]; then
    for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python /root/.pyenv/versions/3.12*/bin/python; do
        # pyenv shims exist for versions that are not selected: check the interpreter runs.
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            python312="$candidate"
            break
        fi
    done
fi
if [ -z "$python312" ]; then
    echo "run_django6: no Python 3.12 found (set PYTHON312); Django 6 tests not run" >&2
    [ "${CI:-}" = "true" ] && exit 1
    exit 0
fi

venv=.venv/django6-py312
stamp="$venv/.installed-stamp"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    if [ -x .venv/bin/uv ]; then  # make test's venv has uv: seconds instead of half a minute
        .venv/bin/uv venv --quiet --clear --python "$python312" "$venv"
        .venv/bin/uv pip install --quiet --python "$venv/bin/python" -e '.[test]' 'Django>=6.0,<7'
    else
        "$python312" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet -e '.[test]' 'Django>=6.0,<7'
    fi
    touch "$stamp"
fi
"$venv/bin/python" -c 'import django, sys; print(f"Django {django.get_version()} on Python {sys.version.split()[0]}")'
exec "$venv/bin/python" -m pytest -p no:cacheprovider tests/django "$@"
