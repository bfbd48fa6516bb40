#!/bin/sh
# System packages the code sandbox needs (agentic_grpo/sandbox): bubblewrap for layer 1,
# util-linux for setpriv/prlimit (per-slot uid, rlimits) and procps for kill(1); the cleanup
# tests also use chattr (e2fsprogs) and mount --bind (mount), and skip without them.
# Run as root; .ci/run calls it. Idempotent.
set -eu
if [ "$(id -u)" -ne 0 ]; then
    echo "install_sandbox.sh: run as root" >&2
    exit 1
fi
missing=""
command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"
command -v setpriv >/dev/null 2>&1 || missing="$missing util-linux"
command -v prlimit >/dev/null 2>&1 || missing="$missing util-linux"
[ -x /usr/bin/kill ] || [ -x /bin/kill ] || missing="$missing procps"
command -v chattr >/dev/null 2>&1 || missing="$missing e2fsprogs"
command -v mount >/dev/null 2>&1 || missing="$missing mount"
if [ -n "$missing" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    # shellcheck disable=SC2086 # word splitting wanted: one package per word
    apt-get install -y --no-install-recommends $missing
fi
bwrap --version
