# Multi-host harness: N "hosts", each a network namespace joined to the others by a bridge,
# each of whose processes also runs in its own UTS (host name), PID and mount namespace
# with a private /dev/shm and /etc/hosts, so that lockstep sees distinct machines:
#   - "same node" is decided by host name (src/comm/init.cpp hostname());
#   - same-machine liveness by boot id + pid namespace (comm/peer_watch.cpp machine_id());
#   - shm segments live in /dev/shm.
# Source it from a test script (bash); docs/multihost.md describes the setup.
#
#   mh_require                 exit 77 (ctest SKIP_RETURN_CODE) with the reason where the
#                              namespaces cannot be made (not root, no ip/unshare, no veth...)
#   mh_setup N                 hosts 1..N: namespace $MH_PREFIX-hI, address 10.77.0.I/24 on
#                              its interface $MH_IF, host name hostI; removed on exit (trap)
#   mh_shape RATE [DELAY]      tbf at RATE (e.g. 1gbit) on every host's link, both ways, plus
#                              netem DELAY (e.g. 0.2ms) where the kernel has sch_netem
#   mh_exec I CMD...           run CMD on host I (foreground; background it with &)
#   mh_kill_host I             SIGKILL every process of host I
#   mh_link I up|down          take host I's link up or down (a silent partition)
#   mh_ip I                    host I's address
#   mh_rx_bytes I              bytes host I's link has received so far
#   mh_crossed RX0 I NAME KIND PASS if host I's link received over 100 kB since mh_rx_bytes
#                              gave RX0 (the job spanned the KIND: "hosts", "pods"), else
#                              FAIL; NAME names host I ("host2", "pod 1"); needs pass and
#                              fail (tests/lib/checks.sh)
#   mh_mpirun PER_HOST ARGS... mpirun on host 1 over every host, PER_HOST ranks each: its
#                              rsh agent starts each host's orted inside that host
#   mh_mpirun_hostfile PER_HOST ARGS...  the same with --hostfile (host1 slots=PER_HOST ...)
# Names carry the shell's pid, so parallel runs never share a namespace, bridge or port
# space; leftovers of runs killed before their trap ran (ctest's timeout SIGKILLs) are
# removed by the next mh_setup.

MH_PREFIX="mh$$"
MH_IF=eth0  # inside each host's namespace, as on a real machine
MH_NET=10.77.0
MH_N=0
MH_DIR=""
MH_NETEM=0  # 1 once mh_shape added a delay

mh_skip() {
  echo "SKIP: $* (the multi-host tests need root and network namespaces: ip netns, veth, a" \
    "bridge, unshare --uts --pid --mount)"
  exit 77
}

mh_require() {
  [[ $(id -u) == 0 ]] || mh_skip "not root"
  local t
  for t in ip unshare mount timeout; do
    command -v "$t" >/dev/null || mh_skip "'$t' is not installed"
  done
  # Try everything once on a throwaway pair: namespace, veth, bridge, the unshares.
  local ns="${MH_PREFIX}-probe" br="${MH_PREFIX}p" why=""
  if ! ip netns add "$ns" 2>/dev/null; then
    why="'ip netns add' failed"
  elif ! ip link add "$br" type bridge 2>/dev/null; then
    why="cannot make a bridge"
  elif ! ip link add "${MH_PREFIX}q" type veth peer name "$MH_IF" netns "$ns" 2>/dev/null; then
    why="cannot make a veth pair"
  elif ! ip netns exec "$ns" unshare --uts --pid --fork --kill-child --mount-proc --mount \
    sh -c "hostname probe && mount -t tmpfs tmpfs /dev/shm" 2>/dev/null; then
    why="'unshare --uts --pid --mount' or a tmpfs mount failed"
  fi
  ip link del "$br" 2>/dev/null
  ip link del "${MH_PREFIX}q" 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  [[ -z $why ]] || mh_skip "$why"
}

mh_ns() { echo "${MH_PREFIX}-h$1"; }
mh_ip() { echo "$MH_NET.$1"; }
mh_veth() { echo "${MH_PREFIX}v$1"; }  # the root namespace's end of host I's link

# Namespaces and bridges of earlier runs whose shell is gone.
mh_remove_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^mh[0-9]+-h[0-9]+$'); do
    pid=${ns%%-*}; pid=${pid#mh}
    [[ -d /proc/$pid ]] && continue
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  local dev dir
  for dir in "${TMPDIR:-/tmp}"/lockstep-multihost.*.*; do
    pid=${dir##*/lockstep-multihost.}; pid=${pid%%.*}
    [[ -d $dir && $pid =~ ^[0-9]+$ && ! -d /proc/$pid ]] && rm -rf "$dir"
  done
  for dev in $(ip -br link 2>/dev/null | awk '{print $1}' | sed 's/@.*//' | grep -E '^mh[0-9]+(br|v[0-9]+)$'); do
    pid=${dev#mh}; pid=${pid%%[bv]*}
    [[ -d /proc/$pid ]] || ip link del "$dev" 2>/dev/null
  done
}

mh_cleanup() {
  local i
  for ((i = 1; i <= MH_N; i++)); do
    ip netns pids "$(mh_ns "$i")" 2>/dev/null | xargs -r kill -9 2>/dev/null
  done
  for ((i = 1; i <= MH_N; i++)); do
    # The namespace itself may outlive its name for minutes: TCP sockets closed with data
    # unacknowledged (a partitioned host) hold it until they give up. Deleting the veth
    # pair leaves nothing of it visible in the root namespace meanwhile.
    ip link del "$(mh_veth "$i")" 2>/dev/null
    ip netns del "$(mh_ns "$i")" 2>/dev/null
  done
  ip link del "${MH_PREFIX}br" 2>/dev/null
  [[ -n $MH_DIR && -z ${KEEP:-} ]] && rm -rf "$MH_DIR"
  MH_N=0
}

mh_setup() {
  local n=$1 i ns br="${MH_PREFIX}br"
  mh_remove_stale
  MH_DIR=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-multihost.$$.XXXXXX")
  MH_N=$n
  trap 'mh_cleanup' EXIT
  trap 'mh_cleanup; exit 130' INT
  trap 'mh_cleanup; exit 143' TERM
  ip link add "$br" type bridge || mh_skip "cannot make a bridge"
  ip link set "$br" up
  : >"$MH_DIR/hosts"
  printf '127.0.0.1 localhost\n' >>"$MH_DIR/hosts"
  for ((i = 1; i <= n; i++)); do
    ns=$(mh_ns "$i")
    ip netns add "$ns" || mh_skip "'ip netns add $ns' failed"
    ip link add "$(mh_veth "$i")" type veth peer name "$MH_IF" netns "$ns"
    ip link set "$(mh_veth "$i")" master "$br" up
    ip -n "$ns" addr add "$(mh_ip "$i")/24" dev "$MH_IF"
    ip -n "$ns" link set "$MH_IF" up
    ip -n "$ns" link set lo up
    printf '%s host%d\n' "$(mh_ip "$i")" "$i" >>"$MH_DIR/hosts"
  done
  # The bridge takes a moment to forward (no STP: forward delay 0, but the ports start
  # in "listening" briefly): wait until host 1 reaches every other host.
  for ((i = 2; i <= n; i++)); do mh_wait_reachable 1 "$i" || return 1; done
}

# mh_wait_reachable FROM TO: a TCP connect from host FROM to a listener on host TO.
mh_wait_reachable() {
  local from=$1 to=$2
  ip netns exec "$(mh_ns "$to")" timeout 10 python3 -c '
import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9)); s.listen(); s.settimeout(10); s.accept()' 2>/dev/null &
  local listener=$!
  for _ in $(seq 100); do
    if ip netns exec "$(mh_ns "$from")" python3 -c "
import socket; socket.create_connection(('$(mh_ip "$to")', 9), timeout=0.2)" 2>/dev/null; then
      wait $listener 2>/dev/null
      return 0
    fi
    sleep 0.1
  done
  kill $listener 2>/dev/null
  echo "mh_setup: host $from cannot reach host $to ($(mh_ip "$to"))" >&2
  return 1
}

mh_shape() {
  local rate=$1 delay=${2:-} i ns
  for ((i = 1; i <= MH_N; i++)); do
    # Each host's egress (inside its namespace) and its ingress (the bridge end, egress
    # towards the host): RATE each way, as a full-duplex link.
    for dev in "-n $(mh_ns "$i") $MH_IF" "$(mh_veth "$i")"; do
      # shellcheck disable=SC2086
      set -- ${dev}
      local where=("${@:1:$#-1}") d=${!#}
      if [[ -n $delay ]] &&
        tc "${where[@]}" qdisc add dev "$d" root handle 1: netem delay "$delay" 2>/dev/null; then
        MH_NETEM=1
        tc "${where[@]}" qdisc add dev "$d" parent 1: handle 2: tbf rate "$rate" burst 256kb \
          latency 50ms || return 1
      else
        tc "${where[@]}" qdisc add dev "$d" root handle 2: tbf rate "$rate" burst 256kb \
          latency 50ms || return 1
      fi
    done
  done
  if [[ -n $delay && $MH_NETEM == 0 ]]; then
    echo "mh_shape: note: this kernel has no sch_netem (CONFIG_NET_SCH_NETEM): links shaped" \
      "to $rate without the $delay delay"
  fi
}

# mh_exec I CMD...: CMD as a process of host I. --kill-child: killing the unshare (or the
# test) kills the host's whole pid namespace.
mh_exec() {
  local i=$1
  shift
  ip netns exec "$(mh_ns "$i")" unshare --uts --pid --fork --kill-child --mount-proc --mount \
    sh -c 'hostname "$1" && mount -t tmpfs tmpfs /dev/shm && mount --bind "$2" /etc/hosts &&
      shift 2 && exec "$@"' sh "host$i" "$MH_DIR/hosts" "$@"
}

mh_kill_host() { ip netns pids "$(mh_ns "$1")" | xargs -r kill -9; }

mh_link() { ip link set "$(mh_veth "$1")" "$2"; }

mh_rx_bytes() { ip -n "$(mh_ns "$1")" -s link show "$MH_IF" | awk '/RX:/ {getline; print $1; exit}'; }
mh_crossed() {
  local rx=$(($(mh_rx_bytes "$2") - $1))
  if ((rx > 100000)); then pass "$3 received $rx bytes over its link"
  else fail "only $rx bytes crossed $3's link: the job did not span the $4"; fi
}

# OpenMPI's launch agent (plm_rsh_agent), called as `AGENT HOST COMMAND...` where ssh would
# be: runs the orted command line on host I, named by its address (10.77.0.I, from --host) or
# its name (hostI, from a hostfile), as mh_exec does.
mh_mpi_agent() {
  local agent=$MH_DIR/rsh-agent
  {
    echo '#!/usr/bin/env bash'
    echo "prefix=$MH_PREFIX hosts=$MH_DIR/hosts"
    cat <<'AGENT'
i=${1##*.}  # 10.77.0.I -> host I
i=${i#host}  # hostI -> host I
[[ $i =~ ^[0-9]+$ ]] || { echo "rsh-agent: unknown host '$1'" >&2; exit 255; }
shift
exec ip netns exec "$prefix-h$i" unshare --uts --pid --fork --kill-child --mount-proc --mount \
  sh -c 'hostname "host$1" && mount -t tmpfs tmpfs /dev/shm && mount --bind "$2" /etc/hosts &&
    exec sh -c "$3"' sh "$i" "$hosts" "$*"
AGENT
  } >"$agent"
  chmod +x "$agent"
  echo "$agent"
}

# mh_mpi ARGS...: mpirun on host 1 with the options every launch here shares: the rsh agent
# above, the TCP BTL and the runtime's own (oob) connections on the hosts' eth0.
mh_mpi() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mh_exec 1 \
    timeout -s KILL "${MH_MPI_TIMEOUT:-300}" "${MPIRUN:-mpirun}" \
    --mca plm_rsh_agent "$(mh_mpi_agent)" --mca btl self,vader,tcp --mca pml ob1 \
    --mca btl_tcp_if_include "$MH_IF" --mca oob_tcp_if_include "$MH_IF" "$@"
}

# mh_mpirun PER_HOST ARGS...: mpirun (on host 1) with PER_HOST slots on every host given by
# address (--host 10.77.0.1:PER_HOST,...).
mh_mpirun() {
  local per=$1 hostlist="" i
  shift
  for ((i = 1; i <= MH_N; i++)); do hostlist+="${hostlist:+,}$(mh_ip "$i"):$per"; done
  mh_mpi --host "$hostlist" -np $((per * MH_N)) "$@"
}

# mh_hostfile PER_HOST: writes $MH_DIR/hostfile as the MPI Operator writes its own, a line
# "NAME slots=PER_HOST" per host, by name (host1, host2, ...: each host's /etc/hosts has
# them), and prints its path.
mh_hostfile() {
  local i
  for ((i = 1; i <= MH_N; i++)); do echo "host$i slots=$1"; done >"$MH_DIR/hostfile"
  echo "$MH_DIR/hostfile"
}

# mh_mpirun_hostfile PER_HOST ARGS...: mpirun --hostfile (mh_hostfile) on host 1.
mh_mpirun_hostfile() {
  local per=$1
  shift
  mh_mpi --hostfile "$(mh_hostfile "$per")" -np $((per * MH_N)) "$@"
}
