#!/bin/bash
# bench/units_cost.py against the real systemd and dbus-daemon of booted Debian 12 and 13
# (../shared/tools/systemd-lab, the root file systems tests/system/ builds), with stand-ins
# for NVIDIA's units: the fabric manager running, persistenced stopped, DCGM not installed.
# As root, from the checkout; one lab at a time:
#   flock /tmp/gpuagent-lab.lock bench/units_lab.sh
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
lab=${SYSTEMD_LAB:-$repo/../shared/tools/systemd-lab}
unit='[Service]\nExecStart=/bin/sleep infinity\n'
for suite in bookworm trixie; do
  name=gpuagent-units-bench-$suite
  echo "=== $suite"
  "$lab" boot "$name" "/var/tmp/gpuagent-systemd-lab/$suite.tar.zst" >/dev/null || continue
  "$lab" exec "$name" sh -c 'apt-get update -qq >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-jeepney >/dev/null 2>&1'
  "$lab" copy "$name" "$repo/gpuagent" /root/src/gpuagent
  "$lab" copy "$name" "$repo/bench" /root/src/bench
  "$lab" exec "$name" sh -c "
    printf '$unit' > /etc/systemd/system/nvidia-fabricmanager.service
    printf '$unit' > /etc/systemd/system/nvidia-persistenced.service
    systemctl daemon-reload
    systemctl start nvidia-fabricmanager nvidia-persistenced
    systemctl stop nvidia-persistenced"
  "$lab" exec "$name" sh -c 'cd /root/src && timeout 300 python3 -m bench.units_cost --runs 5 --reads 200'
  "$lab" stop "$name" >/dev/null
done
