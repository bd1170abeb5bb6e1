#!/usr/bin/env bash
# The whole machine's busy CPU seconds (user, nice, system, irq, softirq of every core, from /proc/stat)
# since this script started, printed every 10 s until it is stopped: run it beside a command to see
# how much of the machine's CPU that command used (docs/results/2026-12-07-ci-fresh-clone.md).
#
#   tools/scripts/cpu_busy.sh > cpu.log & pid=$!; make test-unit; kill $pid
set -euo pipefail
hz=$(getconf CLK_TCK)
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
b0=$(busy); t0=$(date +%s)
while sleep 10; do
    echo "$(( $(date +%s) - t0 ))s busy_cpu_s=$(( ($(busy) - b0) / hz ))"
done
