#!/usr/bin/env bash
# Two placements of expert nodes under a memory budget, A/B interleaved: for each plan, start
# every node it names by hand on this machine (one thread each, `--cold-cache SIZE`, the size
# `nightshift-atlas plan --cold-cache` was given), drop the page cache, run
# `nightshift generate --placement PLAN` against them, and print decode tok/s and each node's
# staging cache hits and bytes read. Root: it drops the page cache and, with --cap, puts the
# nodes in a cgroup v1 blkio throttle on the model's disk (as a VM's network disk caps reads).
#
#   sudo bash benches/scripts/node-budget-ab.sh --model k2.gguf --plans split.toml,full.toml \
#       [--cap 200] [--rounds 3] [--tokens 128] [--cold-cache 256MiB] [--prompt TEXT]
#
# The plans come from `nightshift-atlas plan --nodes nodes.toml --memory-budget N% --cold-cache
# SIZE` (the replay's split) and the same with `--resident-share 100%`; every node's addr must
# be a free 127.0.0.1 port. Binaries: target/release (cargo build --release first).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$root/target/release"
model="" plans="" cap="" rounds=3 tokens=128 cold=256MiB
prompt="Review this pull request: the scheduler now batches prefill chunks with decode steps, and the KV cache evicts by block."
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --plans) plans=$2; shift 2 ;;
    --cap) cap=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --cold-cache) cold=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    *) echo "node-budget-ab: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] && [ -n "$plans" ] || { echo "node-budget-ab: --model and --plans A,B are required" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "node-budget-ab: run as root (drops the page cache)" >&2; exit 2; }
for b in nightshift nightshift-expert-node; do
  [ -x "$bin/$b" ] || { echo "node-budget-ab: $bin/$b missing: cargo build --release" >&2; exit 2; }
done
work=$(mktemp -d)
pids=()
cg=""
cleanup() {
  [ ${#pids[@]} -gt 0 ] && kill -INT "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  if [ -n "$cg" ]; then
    # back to the root cgroup, then remove ours
    echo $$ > /sys/fs/cgroup/blkio/cgroup.procs 2>/dev/null || true
    rmdir "$cg" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

if [ -n "$cap" ]; then
  disk=$(lsblk -no PKNAME "$(df --output=source "$model" | tail -1)" 2>/dev/null | head -1)
  [ -n "$disk" ] || disk=$(basename "$(df --output=source "$model" | tail -1)")
  majmin=$(lsblk -dno MAJ:MIN "/dev/$disk" | tr -d ' ')
  cg=/sys/fs/cgroup/blkio/node-budget-ab-$$
  mkdir -p "$cg"
  echo "$majmin $((cap * 1000000))" > "$cg/blkio.throttle.read_bps_device"
  echo $$ > "$cg/cgroup.procs"
  echo "reads from /dev/$disk ($majmin) capped at $cap MB/s"
fi

# node names and ports of a plan: its [[node]] tables' name and addr
nodes_of() {
  awk -F'"' '/^name *=/ {n=$2} /^addr *=/ {print n, $2}' "$1"
}

run_arm() {
  local plan=$1 tag=$2
  sync
  echo 1 > /proc/sys/vm/drop_caches
  pids=()
  while read -r name addr; do
    "$bin/nightshift-expert-node" --model "$model" --placement "$plan" --node "$name" \
      --listen "$addr" --threads 1 --cold-cache "$cold" --insecure-no-auth \
      > "$work/$tag-$name.log" 2>&1 &
    pids+=($!)
  done < <(nodes_of "$plan")
  while read -r name _; do
    for _ in $(seq 1 600); do
      grep -q "expert node ready" "$work/$tag-$name.log" && break
      sleep 0.2
    done
  done < <(nodes_of "$plan")
  "$bin/nightshift" generate --model "$model" --placement "$plan" --prompt "$prompt" \
    -n "$tokens" --threads 2 > /dev/null 2> "$work/$tag.err"
  kill -INT "${pids[@]}"
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
  printf '%-28s %s\n' "$tag" "$(grep -o 'decode: .*' "$work/$tag.err" | tail -1)"
  for f in "$work/$tag"-*.log; do
    printf '    %s %s\n' "$(basename "$f" .log | sed "s/^$tag-//")" \
      "$(sed 's/\x1b\[[0-9;]*m//g' "$f" | grep -o 'cold cache: [0-9]* hits, [0-9]* misses ([0-9.]*% hits)' | tail -1), $(sed 's/\x1b\[[0-9;]*m//g' "$f" | grep -o '[0-9.]* MiB read' | tail -1)"
  done
}

IFS=, read -r plan_a plan_b <<< "$plans"
for r in $(seq 1 "$rounds"); do
  run_arm "$plan_a" "round$r-$(basename "$plan_a" .toml)"
  run_arm "$plan_b" "round$r-$(basename "$plan_b" .toml)"
done
