#!/usr/bin/env bash
# Fetch MariaDB's Spider plugin (ha_spider.so) matching the local mariadbd into .venv/spider,
# for the tests that start their own throwaway mariadbd with Spider. The package is never
# installed: installing it drops a plugin-load-add file into the shared server's configuration.
# Under CI=true a failure to fetch it fails; elsewhere the Spider tests skip and say why.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.venv/spider
plugin="$dest/usr/lib/mysql/plugin/ha_spider.so"
[ -f "$plugin" ] && exit 0

fail() {
    echo "fetch_spider_plugin: $*" >&2
    [ "${CI:-}" = "true" ] && exit 1
    exit 0
}
command -v mariadbd >/dev/null || fail "no mariadbd on this machine"
version=$(dpkg-query -W -f='${Version}' mariadb-server 2>/dev/null) \
    || fail "mariadb-server is not a Debian package here: set SNOWFLAKE_TEST_SPIDER_PLUGIN"
mkdir -p "$dest/deb"
(
    cd "$dest/deb"
    rm -f mariadb-plugin-spider_*.deb
    apt-get download -q "mariadb-plugin-spider=$version" >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null 2>&1 || true
        apt-get download -q "mariadb-plugin-spider=$version" >/dev/null
    }
) || fail "apt-get download mariadb-plugin-spider=$version failed"
dpkg-deb -x "$dest"/deb/mariadb-plugin-spider_*.deb "$dest"
[ -f "$plugin" ] || fail "the package holds no $plugin"
echo "fetch_spider_plugin: $plugin (mariadb-plugin-spider $version)"
