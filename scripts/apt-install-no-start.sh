#!/usr/bin/env bash
# apt-get install PACKAGE... without starting the services the packages ship.
#
# Debian's maintainer scripts start a packaged daemon at install time (invoke-rc.d): on a
# user's host that is an nginx or a registry started behind their back, and stopping it
# afterwards by name would stop theirs too. So a policy-rc.d that denies every start
# (exit 101) is in place only while this apt-get runs and is removed after it. It is only
# ever ours: an administrator's own policy-rc.d is neither replaced nor removed (the
# services then start as it decides). One left by a killed run is recognised by its marker
# line and removed by the next.
set -euo pipefail
POLICY=${POLICY_RC_D:-/usr/sbin/policy-rc.d}
MARK="# bootseer setup: deny service starts while its apt-get runs (removed after)"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo

ours=""
remove_ours() {
    if [ -n "$ours" ] && [ ! -L "$POLICY" ] && grep -qxF "$MARK" "$POLICY" 2>/dev/null; then
        $SUDO rm -f "$POLICY"
    fi
}
trap remove_ours EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ ! -L "$POLICY" ] && { [ ! -e "$POLICY" ] || grep -qxF "$MARK" "$POLICY" 2>/dev/null; }; then
    ours=1
    printf '#!/bin/sh\n%s\nexit 101\n' "$MARK" | $SUDO tee "$POLICY.bootseer-new" >/dev/null
    $SUDO chmod 755 "$POLICY.bootseer-new"
    $SUDO mv -f "$POLICY.bootseer-new" "$POLICY"
else
    echo "setup: $POLICY is not ours: left as it is (it decides which services start)" >&2
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
