#!/usr/bin/env bash
# Make a PostgreSQL server available to the tests of the shared ledger (tests/conftest.py starts
# a throw-away cluster from initdb/pg_ctl). When neither initdb nor pg_ctl is found, and we are
# root on a machine with apt-get, install Debian's `postgresql` package, quietly. Never fails:
# without a server those tests are skipped with a message saying how to install one.
found() {
  command -v initdb >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null 2>&1
}
found && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "dplang: no PostgreSQL server (initdb) found; its ledger tests will be skipped" \
       "(install one with: apt-get install postgresql)" >&2
  exit 0
fi
echo "dplang: installing Debian's postgresql package for the shared-ledger tests" \
     "(at most 10 minutes)" >&2
# One bound for the whole install (update included), so that a stuck mirror or lock costs at
# most 10 minutes of the test command, never a hang.
timeout 600 env DEBIAN_FRONTEND=noninteractive bash -c '
  apt=(apt-get -q -y -o DPkg::Lock::Timeout=60)
  "${apt[@]}" install --no-install-recommends postgresql \
    || { "${apt[@]}" update && "${apt[@]}" install --no-install-recommends postgresql; }
' >/dev/null 2>&1 || true
found || echo "dplang: could not install postgresql; its ledger tests will be skipped" >&2
exit 0
