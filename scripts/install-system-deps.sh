#!/usr/bin/env bash
# Installs the Debian packages the edge lab (`hppctl lab`, tests marked `lab`) needs, and only
# those that are missing: iproute2 (ip, tc), openssh-server (sshd), openssh-client (ssh-keygen),
# iptables (NFQUEUE rules of the delay line, used where the kernel has no netem), util-linux
# (unshare) and procps (ps, for people debugging a lab). Idempotent and quiet: a machine that has
# everything runs no apt-get at all. Without root or apt-get it says so and exits 0 (the lab tests
# then skip with the reason), so the rest of the test suite still runs.
set -euo pipefail

have() {  # a command on PATH or in the sbin directories a non-login PATH may lack
  command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]
}

missing=()
want() {  # want COMMAND PACKAGE: queue PACKAGE when COMMAND is absent (once per package)
  if ! have "$1" && [[ " ${missing[*]-} " != *" $2 "* ]]; then missing+=("$2"); fi
}
want ip iproute2
want tc iproute2
want sshd openssh-server
want ssh-keygen openssh-client
want iptables iptables
want unshare util-linux
want ps procps

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! have apt-get; then
  echo "install-system-deps: not installing ${missing[*]} (needs root and apt-get); lab tests will skip" >&2
  exit 0
fi

# Installing openssh-server must not start a system-wide sshd on this machine: the lab runs its
# own sshd per namespace. policy-rc.d (exit 101) tells Debian's maintainer scripts not to start
# services; we add one only if the machine has none, and remove it again.
added_policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  added_policy=1
fi
cleanup() { if [ -n "$added_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT

echo "install-system-deps: apt-get install ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
