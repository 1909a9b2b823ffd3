#!/usr/bin/env bash
# The multi-host network of the cluster harness, on one machine: a hub namespace holding a bridge,
# a coordinator namespace and one namespace per expert node, each joined to the bridge by a veth
# pair, with private addresses (10.77.0.0/24) that exist only inside those namespaces (the root
# namespace gets no address and no route). Each node's link is capped both ways with a `tc tbf`
# qdisc (the node's egress and the hub port's egress). Latency is not added here (this kernel has
# no netem): the harness puts a delay relay on each link (coordinator/src/cluster/netns/relay.rs).
#
# Usage (root, or CAP_NET_ADMIN + CAP_SYS_ADMIN):
#   netns-cluster.sh up PREFIX NODES RATE      make PREFIX-hub, PREFIX-coord, PREFIX-node0..N-1;
#                                              on any failure everything made so far is removed
#   netns-cluster.sh down PREFIX               kill every process in them and delete them
#   netns-cluster.sh link PREFIX NODE up|down  set node NODE's link (inside its namespace)
#   netns-cluster.sh rate PREFIX NODE RATE     change node NODE's cap (RATE as tc takes it: 10gbit)
#   netns-cluster.sh addr PREFIX coord|NODE    print an address
#   netns-cluster.sh run NODES RATE -- CMD...  up, run CMD with NIGHTSHIFT_NETNS_PREFIX set, then
#                                              down, also when CMD fails or the script is killed
set -eEuo pipefail

die() { echo "netns-cluster: $*" >&2; exit 2; }
need() { command -v "$1" >/dev/null || die "$1 not found (iproute2: bash scripts/setup.sh)"; }

coord_addr() { echo 10.77.0.1; }
node_addr() { echo "10.77.0.$((10 + $1))"; }

# The token-bucket burst for RATE: 1 ms of traffic, at least 4 KiB (tbf splits larger GSO
# packets into MTU segments, so a low cap really holds small messages back).
burst_of() {
  local r=$1 bits
  case "$r" in
    *gbit) bits=$(( ${r%gbit} * 1000000000 )) ;;
    *mbit) bits=$(( ${r%mbit} * 1000000 )) ;;
    *kbit) bits=$(( ${r%kbit} * 1000 )) ;;
    *) die "rate must end in gbit, mbit or kbit, found $r" ;;
  esac
  local b=$(( bits / 8 / 1000 ))
  [ "$b" -ge 4096 ] || b=4096
  echo "$b"
}

cap() { # cap NS DEV RATE
  local burst
  burst=$(burst_of "$3")
  tc -n "$1" qdisc replace dev "$2" root tbf rate "$3" burst "$burst" latency 200ms
}

# Host-side veth names must be unique in the root namespace while being created (15 chars max).
vname() { echo "ns$(echo -n "$1" | cksum | cut -c1-6)$2"; }

down() {
  local p=$1 ns pids
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${p}-(hub|coord|node[0-9]+)$" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  done
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${p}-(hub|coord|node[0-9]+)$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
}

join() { # join PREFIX NS IDX ADDR: a veth from NS (eth0) to the hub's bridge
  local p=$1 ns=$2 i=$3 addr=$4 a b
  a=$(vname "$p" "a$i")
  b=$(vname "$p" "b$i")
  ip link add "$a" type veth peer name "$b"
  ip link set "$a" netns "$ns"
  ip link set "$b" netns "$p-hub"
  ip -n "$ns" link set "$a" name eth0
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip -n "$p-hub" link set "$b" name "port$i"
  ip -n "$p-hub" link set "port$i" master br0
  ip -n "$p-hub" link set "port$i" up
}

up() {
  local p=$1 n=$2 rate=$3 i
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "NODES must be a positive number, found $n"
  burst_of "$rate" >/dev/null
  if ip netns list | awk '{print $1}' | grep -qE "^${p}-(hub|coord|node[0-9]+)$"; then
    die "namespaces named ${p}-* exist already (netns-cluster.sh down ${p} removes them)"
  fi
  trap 'down "$p"' ERR
  ip netns add "$p-hub"
  ip -n "$p-hub" link add br0 type bridge
  ip -n "$p-hub" link set br0 up
  ip netns add "$p-coord"
  join "$p" "$p-coord" c "$(coord_addr)"
  for ((i = 0; i < n; i++)); do
    ip netns add "$p-node$i"
    join "$p" "$p-node$i" "$i" "$(node_addr "$i")"
    cap "$p-node$i" eth0 "$rate"
    cap "$p-hub" "port$i" "$rate"
  done
  trap - ERR
}

[ $# -ge 1 ] || die "usage: netns-cluster.sh up|down|link|rate|addr|run ... (see the header)"
need ip
need tc
cmd=$1
shift
case "$cmd" in
  up)
    [ $# -eq 3 ] || die "usage: up PREFIX NODES RATE"
    up "$1" "$2" "$3"
    ;;
  down)
    [ $# -eq 1 ] || die "usage: down PREFIX"
    down "$1"
    ;;
  link)
    [ $# -eq 3 ] || die "usage: link PREFIX NODE up|down"
    case "$3" in up | down) ;; *) die "link state must be up or down, found $3" ;; esac
    ip -n "$1-node$2" link set eth0 "$3"
    ;;
  rate)
    [ $# -eq 3 ] || die "usage: rate PREFIX NODE RATE"
    cap "$1-node$2" eth0 "$3"
    cap "$1-hub" "port$2" "$3"
    ;;
  addr)
    [ $# -eq 2 ] || die "usage: addr PREFIX coord|NODE"
    if [ "$2" = coord ]; then coord_addr; else node_addr "$2"; fi
    ;;
  run)
    [ $# -ge 4 ] && [ "$3" = "--" ] || die "usage: run NODES RATE -- CMD..."
    n=$1 rate=$2
    shift 3
    prefix="nsc$$"
    trap 'down "$prefix"' EXIT
    trap 'exit 130' INT TERM
    up "$prefix" "$n" "$rate"
    NIGHTSHIFT_NETNS_PREFIX="$prefix" "$@"
    ;;
  *) die "unknown command $cmd" ;;
esac
