#!/usr/bin/env bash
# A braid cluster of separate "nodes" on one machine: the MGS, each MDS, each OSS and
# each client in a Linux network namespace of its own with its own address, all on a
# private /24 behind a bridge that lives in a namespace of its own (the host's network
# is never touched), optionally with latency and bandwidth on every node's link (tc
# netem). Servers run detached (setsid), started and stopped by recorded PID; `down`
# stops only what this script started and deletes only the namespaces it created.
# Used by the tests (crates/braid/tests/netns.rs) and benchmarks; docs/netns-cluster.md
# is the guide. Needs root, iproute2 (ip, tc), util-linux (nsenter, setsid, flock) and,
# for mounts, FUSE 3.
#
#   scripts/netns-cluster.sh up --state DIR [--bin PATH] [--mdss N | --mdt-replicas N]
#       [--osss N] [--osts-per-oss N] [--clients N] [--delay MS] [--rate RATE]
#       [--subnet A.B.C] [--mgs-args "..."] [--mds-args "..."] [--oss-args "..."]
#       [--timeout S] [--tied-to PID]
#   scripts/netns-cluster.sh mount --state DIR NODE MNT [-o OPTS]
#   scripts/netns-cluster.sh umount --state DIR MNT
#   scripts/netns-cluster.sh exec --state DIR NODE [--] CMD...
#   scripts/netns-cluster.sh kill --state DIR NODE [SIGNAL]
#   scripts/netns-cluster.sh start --state DIR NODE
#   scripts/netns-cluster.sh cut --state DIR NODE
#   scripts/netns-cluster.sh heal --state DIR NODE
#   scripts/netns-cluster.sh status --state DIR
#   scripts/netns-cluster.sh leader --state DIR [--timeout S]
#   scripts/netns-cluster.sh down --state DIR [--purge] [--grace S]
#   scripts/netns-cluster.sh check
#
# `cut` takes a node off the network (its port on the switch goes down, so every
# packet to or from it is dropped, as with a pulled cable) without touching its
# processes; `heal` puts it back.
#
# Run with --help for what each command and option does.
set -euo pipefail

SELF=$(realpath "$0")
PROG=netns-cluster.sh
MGS_PORT=9400
MDS_PORT=9401
OSS_PORT=9402

usage() {
  cat <<'EOF'
Usage: netns-cluster.sh COMMAND [OPTIONS]

A braid cluster of separate nodes on one machine, each node in its own network
namespace with its own address (run as root).

Commands:
  up --state DIR [OPTIONS]    create the nodes and the switch, start the MGS, the MDSs
                              and the OSSs, and wait until every MDT and OST is up
      --bin PATH              the braid binary (default: braid on PATH, else
                              target/release/braid, else target/debug/braid)
      --mdss N                MDS nodes, one MDT each (default 1)
      --mdt-replicas N        MDT 0 alone, replicated by N MDS nodes mds0..mds{N-1}
                              (`braid mds --replicas`, 2 to 7; default 1: not
                              replicated); not with --mdss
      --osss N                OSS nodes (default 2)
      --osts-per-oss N        OSTs per OSS (default 2)
      --clients N             client nodes, nothing started on them (default 2)
      --delay MS              every packet a node sends waits MS ms (netem): a round
                              trip between two nodes takes 2*MS ms more
      --rate RATE             every node's link carries RATE each way (e.g. 1gbit,
                              100mbit, 50mbps; netem, or tbf without netem)
      --subnet A.B.C          use A.B.C.0/24 (default: 10.201.X.0/24, X from DIR)
      --mgs-args "ARGS"       more arguments for the MGS, split on blanks; {NODE}
      --mds-args "ARGS"       is replaced by NODE's address (e.g. --nosquash-nids
      --oss-args "ARGS"       {client0}) and {subnet} by the subnet (A.B.C.0/24)
      --timeout S             how long to wait for the cluster (default 90)
      --tied-to PID           tear the cluster down by itself once process PID ends
                              (tests pass their own PID)
  mount --state DIR NODE MNT [-o OPTS] [--timeout S]
                              run `braid mount -f` on NODE (a client) at MNT
  umount --state DIR MNT      unmount a mount made with `mount`, stop its process
  exec --state DIR NODE [--] CMD...
                              run CMD in NODE's network namespace (also `switch`),
                              with BRAID_SECRET_FILE and BRAID_URL set and the
                              cluster's braid binary first on PATH
  kill --state DIR NODE [SIGNAL]
                              send SIGNAL (default TERM) to NODE's server (a client's
                              mounts); waits for TERM, INT, QUIT and KILL to end it
  start --state DIR NODE [--timeout S]
                              start NODE's stopped server again, with the same args
  cut --state DIR NODE        take NODE off the network: its port on the switch goes
                              down, so everything it sends or is sent is dropped (a
                              pulled cable); its processes run on and notice nothing
                              but silence (TCP retransmits, timeouts)
  heal --state DIR NODE [--timeout S]
                              put a cut NODE back on the network; returns once its
                              link has carrier again
  status --state DIR          nodes, addresses, namespaces, processes, cut links;
                              exit status 0 if every recorded process runs, 1 if
                              not, 3 if down
  leader --state DIR [--timeout S]
                              the MDS node serving a replicated MDT now (of the
                              running replicas, the one whose log, since it last
                              started, says it serves in the highest term); waits
                              up to S seconds (default 90) for one
  down --state DIR [--purge] [--grace S]
                              unmount the mounts made here, stop (TERM, then KILL
                              after S seconds, default 10) every process started
                              here, delete the namespaces created here; --purge also
                              deletes the data, logs and secret. Safe to run twice.
  check                       what this machine supports (namespaces, bridge, netem,
                              tbf, FUSE)

State directory: nodes (NAME ADDRESS per line), url (braid://MGS), cluster.secret,
logs/, data/, pids/, cmd/ (each server's command), mounts, namespaces,
mdt-replicas (the replicas of MDT 0; 1: not replicated).
EOF
}

die() {
  echo "$PROG: $*" >&2
  exit 1
}

note() {
  echo "$PROG: $*" >&2
}

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, mounts)"
}

need_cmd() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || die "missing $c (install iproute2 for ip and tc, util-linux for nsenter, setsid and flock, fuse3 for fusermount3)"
  done
}

is_uint() {
  [[ $1 =~ ^[0-9]+$ ]]
}

# --- processes ---------------------------------------------------------------------

# proc_start PID: the start time of a running (not zombie) process, from
# /proc/PID/stat field 22; fails if there is no such process.
proc_start() {
  local stat rest f
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  rest=${stat##*) }
  read -ra f <<<"$rest"
  [ "${f[0]}" != Z ] || return 1
  echo "${f[19]}"
}

# proc_state PID: the state letter of a process (R, S, D, T, Z, ...).
proc_state() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  echo "${stat%% *}"
}

# pid_alive PIDFILE: whether the process recorded there (PID and start time, so a
# reused PID is not taken for ours) still runs.
pid_alive() {
  local pid start now
  [ -f "$1" ] || return 1
  read -r pid start <"$1" || return 1
  now=$(proc_start "$pid") || return 1
  [ "$now" = "$start" ]
}

pid_of() {
  local pid _rest
  read -r pid _rest <"$1"
  echo "$pid"
}

# launch NAMESPACE LOG PIDFILE ARGV...: starts ARGV detached (its own session), in
# NAMESPACE's network namespace only (nsenter --net: a FUSE mount it makes is seen by
# everyone, unlike under `ip netns exec`), stdout and stderr appended to LOG, and
# records its PID and start time. setsid and nsenter exec in place: the PID is braid's.
launch() {
  local ns=$1 log=$2 pidfile=$3 pid start
  shift 3
  (
    exec 9>&-
    exec setsid nsenter --net="/run/netns/$ns" -- "$@" </dev/null >>"$log" 2>&1
  ) &
  pid=$!
  if start=$(proc_start "$pid"); then
    echo "$pid $start" >"$pidfile"
  else
    return 1
  fi
}

# stop_pids GRACE PIDFILE...: SIGTERM to every recorded process still running, SIGKILL
# to those still running after GRACE seconds; removes the PID files. Never this
# process itself (the watcher's record, once the watcher has become `down`).
stop_pids() {
  local grace=$1 f left i pid
  shift
  local files=()
  for f in "$@"; do
    [ -f "$f" ] || continue
    if pid_alive "$f" && [ "$(pid_of "$f")" != "$$" ]; then
      kill -TERM "$(pid_of "$f")" 2>/dev/null || true
      # One stopped by `kill NODE STOP` gets the TERM once it runs again.
      kill -CONT "$(pid_of "$f")" 2>/dev/null || true
      files+=("$f")
    elif [ "$(pid_of "$f" 2>/dev/null || true)" != "$$" ]; then
      rm -f "$f"
    fi
  done
  [ ${#files[@]} -gt 0 ] || return 0
  wait_gone $((grace * 10)) "${files[@]}"
  for f in "${files[@]}"; do
    if pid_alive "$f"; then
      pid=$(pid_of "$f")
      note "$(basename "$f" .pid) (pid $pid) still running after ${grace}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  wait_gone 50 "${files[@]}"
  rm -f "${files[@]}"
}

# wait_gone TENTHS PIDFILE...: waits up to TENTHS tenths of a second until none of
# the recorded processes is alive.
wait_gone() {
  local tenths=$1 i f left
  shift
  for ((i = 0; i < tenths; i++)); do
    left=0
    for f in "$@"; do
      pid_alive "$f" && left=1
    done
    [ $left = 1 ] || return 0
    sleep 0.1
  done
}

# --- state ---------------------------------------------------------------------------

# set_state DIR [create]: the absolute state directory, its namespace prefix and lock.
set_state() {
  [ -n "$1" ] || die "missing --state DIR"
  [[ $1 != *$'\n'* && $1 != *$'\t'* ]] || die "--state must not contain tabs or newlines"
  if [ "${2:-}" = create ]; then
    mkdir -p "$1" || die "cannot create $1"
  fi
  STATE=$(realpath -m "$1")
  ID=$(printf %s "$STATE" | sha256sum | cut -c1-8)
  PREFIX=braid-$ID
  SWITCH=$PREFIX-sw
}

lock_state() {
  exec 9>>"$STATE/lock"
  flock -w 300 9 || die "another $PROG command holds $STATE/lock"
}

# read_nodes: NODES (names, in order) and IP_OF (name -> address) from DIR/nodes.
declare -a NODES=()
declare -A IP_OF=()
read_nodes() {
  NODES=()
  IP_OF=()
  [ -f "$STATE/nodes" ] || return 1
  local name ip
  while read -r name ip; do
    [ -n "$name" ] || continue
    NODES+=("$name")
    IP_OF[$name]=$ip
  done <"$STATE/nodes"
}

role_of() {
  case $1 in
    mgs) echo mgs ;;
    mds*) echo mds ;;
    oss*) echo oss ;;
    client*) echo client ;;
    *) echo unknown ;;
  esac
}

need_node() {
  read_nodes || die "$STATE is not a cluster (no nodes file): run up first"
  [ -n "${IP_OF[$1]+x}" ] || die "no node '$1' in $STATE (nodes: ${NODES[*]})"
}

ns_exists() {
  [ -e "/run/netns/$1" ]
}

url() {
  cat "$STATE/url"
}

# A node to run the CLI from: the first client, or the MGS's node.
cli_node() {
  local n
  for n in "${NODES[@]}"; do
    [ "$(role_of "$n")" = client ] && { echo "$n"; return; }
  done
  echo mgs
}

# in_node NODE ARGV...: runs ARGV in NODE's network namespace with the cluster's secret.
in_node() {
  local ns=$PREFIX-$1
  shift
  BRAID_SECRET_FILE=${BRAID_SECRET_FILE:-$STATE/cluster.secret} BRAID_URL=$(url) \
    nsenter --net="/run/netns/$ns" -- "$@"
}

tail_logs() {
  local f
  for f in "$STATE"/logs/*.log; do
    [ -s "$f" ] || continue
    echo "---- ${f#"$STATE"/} (last lines) ----" >&2
    tail -n 20 "$f" >&2
  done
}

# is_mounted MNT: whether MNT is a mount point now (per /proc/self/mountinfo, which
# escapes blanks and backslashes as octal).
is_mounted() {
  local esc=${1//\\/\\134}
  esc=${esc// /\\040}
  M=$esc awk '$5 == ENVIRON["M"] { found = 1 } END { exit !found }' /proc/self/mountinfo
}

# wait_listening NAME LOG OFFSET PIDFILE TIMEOUT: until the server prints
# "listening on" in LOG after byte OFFSET; fails (with its log) if it exits or stays
# silent.
wait_listening() {
  local name=$1 log=$2 off=$3 pidfile=$4 timeout=$5 i
  for ((i = 0; i < timeout * 10; i++)); do
    if tail -c +"$((off + 1))" "$log" 2>/dev/null | grep -q "listening on"; then
      return 0
    fi
    if ! pid_alive "$pidfile"; then
      note "$name exited before it was listening; its log:"
      tail -n 30 "$log" >&2 || true
      LOG_SHOWN=1
      return 1
    fi
    sleep 0.1
  done
  note "$name did not say 'listening on' within ${timeout}s; its log:"
  tail -n 30 "$log" >&2 || true
  LOG_SHOWN=1
  return 1
}

# start_server NODE TIMEOUT: starts NODE's server with its recorded command. Where
# its log stood when it started goes to pids/NODE.logstart (for `leader`).
start_server() {
  local node=$1 timeout=$2 log off
  local -a argv
  mapfile -d '' -t argv <"$STATE/cmd/$node"
  log=$STATE/logs/$node.log
  touch "$log"
  off=$(stat -c %s "$log")
  echo "$off" >"$STATE/pids/$node.logstart"
  launch "$PREFIX-$node" "$log" "$STATE/pids/$node.pid" "${argv[@]}" || {
    note "$node did not start; its log:"
    tail -n 30 "$log" >&2 || true
    LOG_SHOWN=1
    return 1
  }
  wait_listening "$node" "$log" "$off" "$STATE/pids/$node.pid" "$timeout"
}

# --- shaping --------------------------------------------------------------------------

# qdisc_works NS KIND ARGS...: whether the kernel takes qdisc KIND (tried on NS's lo).
qdisc_works() {
  local ns=$1
  shift
  if tc -n "$ns" qdisc add dev lo root "$@" >/dev/null 2>&1; then
    tc -n "$ns" qdisc del dev lo root >/dev/null 2>&1 || true
    return 0
  fi
  return 1
}

# rate_bits RATE: RATE (tc syntax) in bits per second.
rate_bits() {
  [[ $1 =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$ ]] || return 1
  local n=${BASH_REMATCH[1]} mult
  case ${BASH_REMATCH[3]} in
    bit) mult=1 ;; kbit) mult=1e3 ;; mbit) mult=1e6 ;; gbit) mult=1e9 ;; tbit) mult=1e12 ;;
    bps) mult=8 ;; kbps) mult=8e3 ;; mbps) mult=8e6 ;; gbps) mult=8e9 ;; tbps) mult=8e12 ;;
  esac
  awk -v n="$n" -v m="$mult" 'BEGIN { printf "%.0f\n", n * m }'
}

# shape NS DEV WITH_DELAY: the qdisc on one end of a node's link. The node's end
# delays (netem) what the node sends; both ends limit the rate, so a node's link
# carries RATE each way.
shape() {
  local ns=$1 dev=$2 with_delay=$3 burst
  local -a args=()
  if [ "$SHAPER" = netem ]; then
    [ "$with_delay" = 1 ] && [ -n "$DELAY" ] && args+=(delay "${DELAY}ms")
    [ -n "$RATE" ] && args+=(rate "$RATE")
    [ ${#args[@]} -gt 0 ] || return 0
    tc -n "$ns" qdisc add dev "$dev" root netem limit 10000 "${args[@]}"
  elif [ "$SHAPER" = tbf ]; then
    # A burst of 4 ms at the rate (at least 16 KiB): tbf's bucket.
    burst=$(awk -v b="$(rate_bits "$RATE")" 'BEGIN { x = b / 8 / 250; if (x < 16384) x = 16384; printf "%.0f\n", x }')
    tc -n "$ns" qdisc add dev "$dev" root tbf rate "$RATE" burst "$burst" latency 50ms
  fi
}

# --- subnet -------------------------------------------------------------------------

# The A.B.C of every IPv4 address in another braid namespace.
used_subnets() {
  local ns
  ip netns list 2>/dev/null | awk '{ print $1 }' | while read -r ns; do
    case $ns in
      braid-*) ip -n "$ns" -4 -o addr show 2>/dev/null | awk '{ split($4, a, "."); print a[1] "." a[2] "." a[3] }' ;;
    esac
  done | sort -u
}

valid_subnet() {
  [[ $1 =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || return 1
  local i
  for i in 1 2 3; do
    [ "${BASH_REMATCH[$i]}" -le 255 ] || return 1
  done
}

choose_subnet() {
  local used x i cand
  used=$(used_subnets)
  if [ -n "$OPT_SUBNET" ]; then
    valid_subnet "$OPT_SUBNET" || die "--subnet wants A.B.C (the first three octets of a /24), not '$OPT_SUBNET'"
    grep -qxF "$OPT_SUBNET" <<<"$used" && die "subnet $OPT_SUBNET.0/24 is used by another braid namespace"
    echo "$OPT_SUBNET"
    return
  fi
  # The subnet of this state directory's last run, if no one took it since.
  if [ -f "$STATE/subnet" ]; then
    cand=$(cat "$STATE/subnet")
    if valid_subnet "$cand" && ! grep -qxF "$cand" <<<"$used"; then
      echo "$cand"
      return
    fi
  fi
  x=$((16#${ID:0:2}))
  for ((i = 0; i < 256; i++)); do
    cand=10.201.$(((x + i) % 256))
    grep -qxF "$cand" <<<"$used" || { echo "$cand"; return; }
  done
  die "every 10.201.X.0/24 is used by other braid namespaces"
}

# --- up -----------------------------------------------------------------------------

find_bin() {
  local repo
  repo=$(dirname "$(dirname "$SELF")")
  if [ -n "$OPT_BIN" ]; then
    [ -x "$OPT_BIN" ] || die "--bin $OPT_BIN is not an executable file"
    realpath "$OPT_BIN"
  elif command -v braid >/dev/null 2>&1; then
    realpath "$(command -v braid)"
  elif [ -x "$repo/target/release/braid" ]; then
    echo "$repo/target/release/braid"
  elif [ -x "$repo/target/debug/braid" ]; then
    echo "$repo/target/debug/braid"
  else
    die "no braid binary: pass --bin PATH (or cargo build --release)"
  fi
}

# expand_args STRING: STRING split on blanks, each {NODE} replaced by NODE's address
# and {subnet} by A.B.C.0/24; one argument per line in EXPANDED.
declare -a EXPANDED=()
expand_args() {
  local -a words
  local w n
  EXPANDED=()
  read -ra words <<<"$1"
  for w in "${words[@]}"; do
    w=${w//\{subnet\}/$SUBNET.0\/24}
    for n in "${NODES[@]}"; do
      w=${w//\{$n\}/${IP_OF[$n]}}
    done
    [[ $w =~ \{[A-Za-z0-9_-]+\} ]] && die "'${BASH_REMATCH[0]}' in '$1' names no node (nodes: ${NODES[*]})"
    EXPANDED+=("$w")
  done
}

# The cluster is up once `braid df` (from a client) shows every MDT and OST answering.
wait_df() {
  local mdts=$1 osts=$2 timeout=$3 node out up_m up_o start=$SECONDS
  node=$(cli_node)
  while :; do
    if out=$(in_node "$node" "$BIN" df "$(url)/" --timeout-s 5 2>&1); then
      up_m=$(grep -F '[MDT:' <<<"$out" | grep -cvF ' : ' || true)
      up_o=$(grep -F '[OST:' <<<"$out" | grep -cvF ' : ' || true)
      [ "$up_m" -ge "$mdts" ] && [ "$up_o" -ge "$osts" ] && return 0
    else
      up_m=0 up_o=0
    fi
    if ((SECONDS - start > timeout)); then
      note "only $up_m of $mdts MDTs and $up_o of $osts OSTs up after ${timeout}s; braid df from $node said:"
      echo "$out" >&2
      return 1
    fi
    sleep 0.5
  done
}

# The MDS learns the OSTs from the MGS a heartbeat after they register: wait until a
# new file is placed on every OST (the probe file is removed again). Where root may
# not create files (root squashed on the probing node), wait two heartbeats instead.
wait_placement() {
  local osts=$1 timeout=$2 node probe out layout placed=0 start=$SECONDS hb=1000 i
  node=$(cli_node)
  probe="$(url)/.netns-cluster-probe"
  while :; do
    in_node "$node" "$BIN" rm "$probe" >/dev/null 2>&1 || true
    if out=$(in_node "$node" "$BIN" setstripe -c -1 --timeout-s 2 "$probe" 2>&1); then
      layout=$(in_node "$node" "$BIN" getstripe "$probe" 2>&1) || true
      in_node "$node" "$BIN" rm "$probe" >/dev/null 2>&1 || true
      placed=$(awk '/obdidx/ { t = 1; next } t && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { n++; next } { t = 0 } END { print n + 0 }' <<<"$layout")
      [ "$placed" -ge "$osts" ] && return 0
    elif grep -qiE 'permission|not permitted|EACCES|EPERM' <<<"$out"; then
      for ((i = 0; i < ${#MDS_ARGS_EXPANDED[@]}; i++)); do
        [ "${MDS_ARGS_EXPANDED[$i]}" = --heartbeat-ms ] && hb=${MDS_ARGS_EXPANDED[$((i + 1))]:-1000}
      done
      note "root may not create files from $node (root squash?): waiting two MDS heartbeats instead of a placement probe"
      sleep "$(awk -v h="$hb" 'BEGIN { printf "%.1f\n", 2 * h / 1000 }')"
      return 0
    fi
    if ((SECONDS - start > timeout)); then
      note "the MDS placed a new file on $placed of $osts OSTs after ${timeout}s: $out"
      return 1
    fi
    sleep 0.3
  done
}

UP_DONE=0
LOG_SHOWN=0
up_exit() {
  local rc=$?
  [ "$UP_DONE" = 1 ] && return
  [ "$rc" != 0 ] || rc=1
  if [ "$LOG_SHOWN" = 0 ] && compgen -G "$STATE/logs/*.log" >/dev/null; then
    note "up failed; the logs end:"
    tail_logs
  fi
  note "tearing down what was started (logs kept in $STATE/logs)"
  do_down 5 || true
  exit "$rc"
}

cmd_up() {
  need_root
  need_cmd ip tc nsenter setsid flock sha256sum realpath
  local n
  for n in "$OPT_MDSS" "$OPT_OSSS" "$OPT_OSTS_PER_OSS" "$OPT_CLIENTS" "$OPT_TIMEOUT"; do
    is_uint "$n" || die "counts and timeouts are whole numbers, not '$n'"
  done
  # Base 10 (a leading 0 is not octal).
  OPT_MDSS=$((10#$OPT_MDSS)) OPT_OSSS=$((10#$OPT_OSSS)) OPT_OSTS_PER_OSS=$((10#$OPT_OSTS_PER_OSS))
  OPT_CLIENTS=$((10#$OPT_CLIENTS)) OPT_TIMEOUT=$((10#$OPT_TIMEOUT))
  ((OPT_MDSS >= 1 && OPT_MDSS <= 40)) || die "--mdss: 1 to 40"
  is_uint "$OPT_MDT_REPLICAS" || die "--mdt-replicas wants a whole number, not '$OPT_MDT_REPLICAS'"
  OPT_MDT_REPLICAS=$((10#$OPT_MDT_REPLICAS))
  ((OPT_MDT_REPLICAS >= 1 && OPT_MDT_REPLICAS <= 7)) || die "--mdt-replicas: 1 to 7"
  if ((OPT_MDT_REPLICAS > 1)); then
    [ "$OPT_MDSS_SET" = 0 ] || die "--mdss and --mdt-replicas $OPT_MDT_REPLICAS do not go together: a replicated MDT is MDT 0 alone, served by the MDS nodes mds0..mds$((OPT_MDT_REPLICAS - 1)) (drop --mdss)"
    # One MDS node per replica, all serving MDT 0.
    OPT_MDSS=$OPT_MDT_REPLICAS
  fi
  ((OPT_OSSS >= 1 && OPT_OSSS <= 100)) || die "--osss: 1 to 100"
  ((OPT_OSTS_PER_OSS >= 1 && OPT_OSTS_PER_OSS <= 32)) || die "--osts-per-oss: 1 to 32"
  ((OPT_CLIENTS <= 100)) || die "--clients: 0 to 100"
  DELAY=$OPT_DELAY
  RATE=$OPT_RATE
  if [ -n "$DELAY" ]; then
    [[ $DELAY =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--delay wants milliseconds (e.g. 1 or 0.5), not '$DELAY'"
  fi
  if [ -n "$RATE" ]; then
    rate_bits "$RATE" >/dev/null || die "--rate wants a number and one of bit, kbit, mbit, gbit, tbit, bps, kbps, mbps, gbps, tbps (e.g. 1gbit), not '$RATE'"
  fi
  if [ -n "$OPT_TIED_TO" ]; then
    if ! is_uint "$OPT_TIED_TO" || ! proc_start "$OPT_TIED_TO" >/dev/null; then
      die "--tied-to $OPT_TIED_TO: no such process"
    fi
  fi
  BIN=$(find_bin)
  set_state "$OPT_STATE" create
  lock_state

  # Refuse a state directory that is up (or half up: run down first).
  if [ -f "$STATE/namespaces" ]; then
    while read -r n; do
      [ -n "$n" ] && ns_exists "$n" && die "$STATE is already up (namespace $n exists): run down --state $STATE first"
    done <"$STATE/namespaces"
  fi
  for n in "$STATE"/pids/*.pid; do
    [ -f "$n" ] && pid_alive "$n" && die "$STATE is already up ($(basename "$n" .pid) runs): run down --state $STATE first"
  done
  # Namespaces with this directory's names that it did not record: another run's
  # (the same path hashed alike) or left over.
  for n in $(ip netns list | awk '{ print $1 }'); do
    [[ $n == "$PREFIX"-* ]] && die "namespace $n exists but $STATE did not create it (left over? if nothing uses it: ip netns del $n)"
  done
  # The data kept from the last up: an MDT replicated or not, by so many replicas.
  # A replica group starts from empty directories and keeps its members.
  local had=1
  [ -f "$STATE/mdt-replicas" ] && had=$(cat "$STATE/mdt-replicas")
  if [ "$had" != "$OPT_MDT_REPLICAS" ] && [ -d "$STATE/data/mgs" ]; then
    die "$STATE holds a file system whose MDT 0 has $had replica(s), not $OPT_MDT_REPLICAS: use another --state, or down --state $STATE --purge first"
  fi

  SUBNET=$(choose_subnet)

  # The nodes and their addresses.
  NODES=(mgs)
  IP_OF=([mgs]=$SUBNET.1)
  for ((n = 0; n < OPT_MDSS; n++)); do NODES+=("mds$n"); IP_OF[mds$n]=$SUBNET.$((10 + n)); done
  for ((n = 0; n < OPT_OSSS; n++)); do NODES+=("oss$n"); IP_OF[oss$n]=$SUBNET.$((50 + n)); done
  for ((n = 0; n < OPT_CLIENTS; n++)); do NODES+=("client$n"); IP_OF[client$n]=$SUBNET.$((150 + n)); done
  expand_args "$OPT_MGS_ARGS"
  local -a mgs_args=("${EXPANDED[@]}")
  expand_args "$OPT_MDS_ARGS"
  MDS_ARGS_EXPANDED=("${EXPANDED[@]}")
  expand_args "$OPT_OSS_ARGS"
  local -a oss_args=("${EXPANDED[@]}")

  # The last run's logs go to logs.prev/, so what fails now is not mixed with them.
  if [ -d "$STATE/logs" ]; then
    rm -rf "$STATE/logs.prev"
    mv "$STATE/logs" "$STATE/logs.prev"
  fi
  mkdir -p "$STATE/logs" "$STATE/data" "$STATE/pids" "$STATE/cmd"
  rm -f "$STATE/namespaces" "$STATE/mounts" "$STATE/up" "$STATE"/cmd/*
  : >"$STATE/namespaces"
  echo "$SUBNET" >"$STATE/subnet"
  echo "$BIN" >"$STATE/bin"
  echo "$OPT_MDT_REPLICAS" >"$STATE/mdt-replicas"
  for n in "${NODES[@]}"; do echo "$n ${IP_OF[$n]}"; done >"$STATE/nodes"
  echo "braid://${IP_OF[mgs]}:$MGS_PORT" >"$STATE/url"
  trap up_exit EXIT

  if [ -n "$OPT_TIED_TO" ]; then
    local owner_start
    owner_start=$(proc_start "$OPT_TIED_TO")
    launch_watcher "$OPT_TIED_TO" "$owner_start"
  fi

  # The switch: a bridge in a namespace of its own.
  ip netns add "$SWITCH"
  echo "$SWITCH" >>"$STATE/namespaces"
  ip -n "$SWITCH" link set lo up
  ip -n "$SWITCH" link add br0 type bridge
  ip -n "$SWITCH" link set br0 up

  SHAPER=none
  if [ -n "$DELAY" ]; then
    qdisc_works "$SWITCH" netem delay 1ms || die "--delay needs tc netem, and this kernel has no sch_netem (try: modprobe sch_netem; on Ubuntu it is in linux-modules-extra-\$(uname -r))"
    SHAPER=netem
  elif [ -n "$RATE" ]; then
    if qdisc_works "$SWITCH" netem rate 1gbit; then
      SHAPER=netem
    elif qdisc_works "$SWITCH" tbf rate 1gbit burst 16384 latency 50ms; then
      SHAPER=tbf
      note "no netem in this kernel: --rate uses tbf"
    else
      die "--rate needs tc netem or tbf, and this kernel has neither"
    fi
  fi
  local links=none
  if [ "$SHAPER" != none ]; then
    links="${DELAY:+delay ${DELAY} ms}${DELAY:+${RATE:+, }}${RATE:+rate $RATE}, $SHAPER"
  fi
  echo "$links" >"$STATE/links"

  # A namespace per node, linked to the switch by a veth pair: eth0 in the node, the
  # node's name in the switch.
  local ns
  for n in "${NODES[@]}"; do
    ns=$PREFIX-$n
    ip netns add "$ns"
    echo "$ns" >>"$STATE/namespaces"
    ip -n "$ns" link set lo up
    ip -n "$SWITCH" link add "$n" type veth peer name eth0 netns "$ns"
    ip -n "$SWITCH" link set "$n" master br0
    ip -n "$SWITCH" link set "$n" up
    ip -n "$ns" addr add "${IP_OF[$n]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    shape "$ns" eth0 1
    shape "$SWITCH" "$n" 0
  done

  # The servers.
  local secret=$STATE/cluster.secret
  [ -s "$secret" ] || "$BIN" gen-secret "$secret" >/dev/null
  local mgs=${IP_OF[mgs]}:$MGS_PORT
  local -a argv replicas=()
  local k
  # A replicated MDT: every replica is given the same list, in the node order.
  if ((OPT_MDT_REPLICAS > 1)); then
    local list=
    for ((k = 0; k < OPT_MDT_REPLICAS; k++)); do list="${list:+$list,}${IP_OF[mds$k]}:$MDS_PORT"; done
    replicas=(--replicas "$list")
  fi
  for n in "${NODES[@]}"; do
    case $(role_of "$n") in
      mgs) argv=("$BIN" mgs --listen "$mgs" --data "$STATE/data/mgs" --secret-file "$secret" "${mgs_args[@]}") ;;
      mds)
        mkdir -p "$STATE/data/$n"
        argv=("$BIN" mds --listen "${IP_OF[$n]}:$MDS_PORT" --mgs "$mgs" --mdt "$STATE/data/$n/mdt"
          "${replicas[@]}" --secret-file "$secret" "${MDS_ARGS_EXPANDED[@]}")
        ;;
      oss)
        mkdir -p "$STATE/data/$n"
        argv=("$BIN" oss --listen "${IP_OF[$n]}:$OSS_PORT" --mgs "$mgs")
        for ((k = 0; k < OPT_OSTS_PER_OSS; k++)); do argv+=(--ost "$STATE/data/$n/ost$k"); done
        argv+=(--secret-file "$secret" "${oss_args[@]}")
        ;;
      *) continue ;;
    esac
    printf '%s\0' "${argv[@]}" >"$STATE/cmd/$n"
    start_server "$n" "$OPT_TIMEOUT"
  done

  local mdts=$OPT_MDSS mdss="$OPT_MDSS MDS"
  if ((OPT_MDT_REPLICAS > 1)); then
    mdts=1
    mdss="1 MDT x $OPT_MDT_REPLICAS replicas"
  fi
  wait_df "$mdts" $((OPT_OSSS * OPT_OSTS_PER_OSS)) "$OPT_TIMEOUT"
  wait_placement $((OPT_OSSS * OPT_OSTS_PER_OSS)) "$OPT_TIMEOUT"
  : >"$STATE/up"
  UP_DONE=1
  trap - EXIT
  echo "up: $(url)/ ($mdss, $OPT_OSSS OSS x $OPT_OSTS_PER_OSS OSTs, $OPT_CLIENTS clients; links: $links)"
  cat "$STATE/nodes"
}

# --- the owner watcher --------------------------------------------------------------

launch_watcher() {
  local log=$STATE/logs/watch.log
  (
    exec 9>&-
    exec setsid "$SELF" watch --state "$STATE" --pid "$1" --start "$2" </dev/null >>"$log" 2>&1
  ) &
  local pid=$! start
  start=$(proc_start "$pid") || die "the watcher of process $1 did not start"
  echo "$pid $start" >"$STATE/pids/watch.pid"
}

cmd_watch() {
  set_state "$OPT_STATE"
  local fifo=$STATE/pids/watch.fifo
  rm -f "$fifo"
  mkfifo "$fifo"
  # A read from a FIFO no one writes: a sleep without a child process.
  exec 8<>"$fifo"
  rm -f "$fifo"
  while [ "$(proc_start "$OPT_PID" || true)" = "$OPT_START" ]; do
    read -r -t 1 -u 8 _ || true
  done
  echo "$(date '+%F %T') process $OPT_PID ended: down"
  exec "$SELF" down --state "$STATE"
}

# --- mounts ---------------------------------------------------------------------------

# Records of DIR/mounts: K<TAB>NODE<TAB>MNT<TAB>CREATED (1 if mount made MNT).
umount_one() {
  local k=$1 mnt=$2 created=$3 bin
  bin=$(cat "$STATE/bin" 2>/dev/null || true)
  if is_mounted "$mnt"; then
    if [ -x "$bin" ]; then
      timeout 40 "$bin" umount "$mnt" >/dev/null 2>&1 || true
    else
      fusermount3 -u "$mnt" >/dev/null 2>&1 || true
    fi
  fi
  if is_mounted "$mnt"; then
    note "$mnt did not unmount: detaching it (lazy unmount)"
    fusermount3 -uz "$mnt" >/dev/null 2>&1 || umount -l "$mnt" >/dev/null 2>&1 || true
  fi
  stop_pids 5 "$STATE/pids/mount-$k.pid"
  if [ "$created" = 1 ]; then
    rmdir "$mnt" 2>/dev/null || true
  fi
}

drop_mount_record() {
  local k=$1
  [ -f "$STATE/mounts" ] || return 0
  awk -F '\t' -v k="$k" '$1 != k' "$STATE/mounts" >"$STATE/mounts.new"
  mv "$STATE/mounts.new" "$STATE/mounts"
}

cmd_mount() {
  need_root
  need_cmd nsenter setsid flock fusermount3
  set_state "$OPT_STATE"
  [ ${#POS[@]} = 2 ] || die "mount wants NODE MNT (and -o OPTS)"
  local node=${POS[0]} mnt=${POS[1]} created=0 k log i
  lock_state
  need_node "$node"
  [ -f "$STATE/up" ] || die "$STATE is not up"
  ns_exists "$PREFIX-$node" || die "the namespace of $node is gone: run down, then up"
  [[ $mnt != *$'\t'* && $mnt != *$'\n'* ]] || die "the mount point must not contain tabs or newlines"
  if [ ! -d "$mnt" ]; then
    mkdir -p "$mnt"
    created=1
  fi
  mnt=$(realpath "$mnt")
  is_mounted "$mnt" && die "$mnt is already a mount point"
  BIN=$(cat "$STATE/bin")
  k=0
  while [ -e "$STATE/pids/mount-$k.pid" ] || grep -q "^$k"$'\t' "$STATE/mounts" 2>/dev/null; do k=$((k + 1)); done
  log=$STATE/logs/mount-$k-$node.log
  local -a argv=("$BIN" mount -f "$(url)/" "$mnt" --secret-file "$STATE/cluster.secret")
  [ -n "$OPT_O" ] && argv+=(-o "$OPT_O")
  printf '%s\t%s\t%s\t%s\n' "$k" "$node" "$mnt" "$created" >>"$STATE/mounts"
  launch "$PREFIX-$node" "$log" "$STATE/pids/mount-$k.pid" "${argv[@]}" || true
  for ((i = 0; i < OPT_TIMEOUT * 10; i++)); do
    if is_mounted "$mnt"; then
      echo "mounted $(url)/ on $mnt from $node (${IP_OF[$node]})"
      return 0
    fi
    pid_alive "$STATE/pids/mount-$k.pid" || break
    sleep 0.1
  done
  note "braid mount on $node did not mount $mnt; its log:"
  tail -n 30 "$log" >&2 || true
  umount_one "$k" "$mnt" "$created"
  drop_mount_record "$k"
  exit 1
}

cmd_umount() {
  need_root
  set_state "$OPT_STATE"
  [ ${#POS[@]} = 1 ] || die "umount wants MNT"
  lock_state
  local mnt k node m created found=0
  mnt=$(realpath -m "${POS[0]}")
  if [ -f "$STATE/mounts" ]; then
    while IFS=$'\t' read -r k node m created; do
      if [ "$m" = "$mnt" ]; then
        umount_one "$k" "$m" "$created"
        drop_mount_record "$k"
        found=1
      fi
    done < <(cat "$STATE/mounts")
  fi
  [ $found = 1 ] || die "$mnt is not a mount made by $PROG mount --state $STATE"
}

# --- exec, kill, start ---------------------------------------------------------------

cmd_exec() {
  need_root
  need_cmd nsenter
  set_state "$OPT_STATE"
  [ ${#POS[@]} = 1 ] || die "exec wants NODE -- CMD..."
  [ ${#REST[@]} -gt 0 ] || die "exec wants a command after NODE (exec --state DIR NODE -- CMD...)"
  local node=${POS[0]} ns
  if [ "$node" = switch ]; then
    ns=$SWITCH
  else
    need_node "$node"
    ns=$PREFIX-$node
  fi
  ns_exists "$ns" || die "$node has no namespace ($ns): is $STATE up?"
  export BRAID_SECRET_FILE=${BRAID_SECRET_FILE:-$STATE/cluster.secret}
  BRAID_URL=$(url)
  export BRAID_URL
  # `braid` is the cluster's own binary.
  [ -f "$STATE/bin" ] && PATH=$(dirname "$(cat "$STATE/bin")"):$PATH
  exec nsenter --net="/run/netns/$ns" -- "${REST[@]}"
}

cmd_kill() {
  need_root
  set_state "$OPT_STATE"
  ((${#POS[@]} >= 1 && ${#POS[@]} <= 2)) || die "kill wants NODE [SIGNAL]"
  local node=${POS[0]} sig=${POS[1]:-TERM} num f i
  lock_state
  need_node "$node"
  sig=${sig#-}
  sig=${sig#SIG}
  num=$(kill -l "$sig" 2>/dev/null) || die "unknown signal '$sig'"
  is_uint "$num" || num=$(kill -l "$num" 2>/dev/null) || die "unknown signal '$sig'"
  local -a files=()
  if [ "$(role_of "$node")" = client ]; then
    local k n m c
    if [ -f "$STATE/mounts" ]; then
      while IFS=$'\t' read -r k n m c; do
        [ "$n" = "$node" ] && pid_alive "$STATE/pids/mount-$k.pid" && files+=("$STATE/pids/mount-$k.pid")
      done <"$STATE/mounts"
    fi
    [ ${#files[@]} -gt 0 ] || die "$node runs no mount"
  else
    pid_alive "$STATE/pids/$node.pid" || die "$node is not running"
    files=("$STATE/pids/$node.pid")
  fi
  for f in "${files[@]}"; do
    kill -s "$num" "$(pid_of "$f")"
  done
  case $num in
    2 | 3 | 9 | 15) ;;
    *)
      echo "$node: sent SIG$(kill -l "$num")"
      return 0
      ;;
  esac
  for ((i = 0; i < 150; i++)); do
    local left=0
    for f in "${files[@]}"; do pid_alive "$f" && left=1; done
    if [ $left = 0 ]; then
      echo "$node: stopped (SIG$(kill -l "$num"))"
      return 0
    fi
    sleep 0.1
  done
  die "$node still runs 15 s after SIG$(kill -l "$num")"
}

cmd_start() {
  need_root
  set_state "$OPT_STATE"
  [ ${#POS[@]} = 1 ] || die "start wants NODE"
  local node=${POS[0]}
  lock_state
  need_node "$node"
  [ -f "$STATE/cmd/$node" ] || die "$node runs no server (a client: use mount)"
  ns_exists "$PREFIX-$node" || die "the namespace of $node is gone: run down, then up"
  pid_alive "$STATE/pids/$node.pid" && die "$node is already running (pid $(pid_of "$STATE/pids/$node.pid"))"
  start_server "$node" "$OPT_TIMEOUT" || exit 1
  echo "$node started (pid $(pid_of "$STATE/pids/$node.pid"))"
}

# --- cut, heal -----------------------------------------------------------------------

# link_up NS DEV: whether DEV in NS is administratively up (exit 0), down (1), or
# not there (2).
link_up() {
  local line flags
  line=$(ip -n "$1" -o link show dev "$2" 2>/dev/null) || return 2
  flags=${line#*<}
  flags=${flags%%>*}
  [[ ,$flags, == *,UP,* ]]
}

# has_carrier NS DEV: whether DEV in NS is up with its peer up too (a veth whose
# other end is down says NO-CARRIER and state DOWN).
has_carrier() {
  local line
  line=$(ip -n "$1" -o link show dev "$2" 2>/dev/null) || return 1
  [[ $line != *NO-CARRIER* && $line == *" state UP "* ]]
}

# need_port NODE: NODE's port on the switch (the veth end named after it) exists.
need_port() {
  need_node "$1"
  [ -f "$STATE/up" ] || die "$STATE is not up"
  ns_exists "$SWITCH" || die "the switch's namespace $SWITCH is gone: run down, then up"
  ns_exists "$PREFIX-$1" || die "the namespace of $1 is gone: run down, then up"
  ip -n "$SWITCH" link show dev "$1" >/dev/null 2>&1 || die "the switch has no port for $1"
}

# The switch's end of the node's link goes down: the bridge forwards nothing to it,
# and the node's eth0 loses carrier, so what the node sends is dropped too. Nothing
# in the node changes (addresses, routes, processes): like a cable pulled at the
# switch.
cmd_cut() {
  need_root
  need_cmd ip
  set_state "$OPT_STATE"
  [ ${#POS[@]} = 1 ] || die "cut wants NODE"
  local node=${POS[0]}
  lock_state
  need_port "$node"
  link_up "$SWITCH" "$node" || die "$node is already cut (heal it first)"
  ip -n "$SWITCH" link set dev "$node" down
  echo "$node: cut off the network"
}

cmd_heal() {
  need_root
  need_cmd ip
  set_state "$OPT_STATE"
  [ ${#POS[@]} = 1 ] || die "heal wants NODE"
  local node=${POS[0]} i
  lock_state
  need_port "$node"
  link_up "$SWITCH" "$node" && die "$node is not cut"
  ip -n "$SWITCH" link set dev "$node" up
  for ((i = 0; i < OPT_TIMEOUT * 20; i++)); do
    if has_carrier "$SWITCH" "$node" && has_carrier "$PREFIX-$node" eth0; then
      echo "$node: back on the network"
      return 0
    fi
    sleep 0.05
  done
  die "$node's link has no carrier ${OPT_TIMEOUT}s after it was put back up"
}

# --- leader -------------------------------------------------------------------------

# replicas: how many MDS nodes replicate MDT 0 (1: it is not replicated).
replicas() {
  local n=1
  [ -f "$STATE/mdt-replicas" ] && n=$(cat "$STATE/mdt-replicas")
  is_uint "$n" || n=1
  echo "$n"
}

# serving_term NODE: the term in which NODE's replica last said it serves the MDT
# ("MDT0000 served by this replica term=N") since it last started: since `up` or
# `start` launched it (pids/NODE.logstart), or it restarted itself in place (a
# leader that lost its term execs itself anew, same PID). Fails if it has not said
# so since then.
serving_term() {
  local log=$STATE/logs/$1.log off=0
  [ -f "$log" ] || return 1
  [ -f "$STATE/pids/$1.logstart" ] && off=$(cat "$STATE/pids/$1.logstart")
  is_uint "$off" || off=0
  tail -c +"$((off + 1))" "$log" | awk '
    /restarting (this MDS )?in place/ { term = "" }
    /served by this replica/ && match($0, /term=[0-9]+/) { term = substr($0, RSTART + 5, RLENGTH - 5) }
    END { if (term == "") exit 1; print term }'
}

# find_leader: "NODE TERM" of the running replica that serves in the highest term;
# fails if none does.
find_leader() {
  local k n term best='' best_term=-1 r
  r=$(replicas)
  for ((k = 0; k < r; k++)); do
    n=mds$k
    pid_alive "$STATE/pids/$n.pid" || continue
    term=$(serving_term "$n") || continue
    if ((term > best_term)); then
      best=$n best_term=$term
    fi
  done
  [ -n "$best" ] || return 1
  echo "$best $best_term"
}

cmd_leader() {
  set_state "$OPT_STATE"
  read_nodes || die "$STATE is not a cluster (no nodes file): run up first"
  [ -f "$STATE/up" ] || die "$STATE is not up"
  (($(replicas) > 1)) || die "$STATE has no replicated MDT (up --mdt-replicas N)"
  local i found
  for ((i = 0; i <= OPT_TIMEOUT * 10; i++)); do
    if found=$(find_leader); then
      echo "${found% *}"
      return 0
    fi
    sleep 0.1
  done
  die "no replica of MDT 0 serves it after ${OPT_TIMEOUT}s (no running mds node logged 'served by this replica' since it started)"
}

# --- status -------------------------------------------------------------------------

cmd_status() {
  set_state "$OPT_STATE"
  [ -d "$STATE" ] || die "no state directory $STATE"
  if ! read_nodes; then
    echo "$STATE: down (no nodes)"
    exit 3
  fi
  local up=1 bad=0 n ns proc k node m c rc
  [ -f "$STATE/up" ] && [ -s "$STATE/namespaces" ] || up=0
  echo "cluster $PREFIX ($STATE): $([ $up = 1 ] && echo up || echo down)"
  echo "url $(url)/  subnet $(cat "$STATE/subnet" 2>/dev/null).0/24  switch $SWITCH  links: $(cat "$STATE/links" 2>/dev/null || echo none)"
  printf '%-9s %-15s %-30s %s\n' NODE ADDRESS NAMESPACE PROCESS
  for n in "${NODES[@]}"; do
    ns=$PREFIX-$n
    ns_exists "$ns" || { ns="$ns (gone)"; [ $up = 1 ] && bad=1; }
    proc=
    if [ -f "$STATE/pids/$n.pid" ]; then
      if pid_alive "$STATE/pids/$n.pid"; then
        proc="$(role_of "$n") pid $(pid_of "$STATE/pids/$n.pid") alive"
        [ "$(proc_state "$(pid_of "$STATE/pids/$n.pid")")" = T ] && proc="$proc (stopped by a signal)"
      else
        proc="$(role_of "$n") pid $(pid_of "$STATE/pids/$n.pid") dead"
        bad=1
      fi
    elif [ -f "$STATE/cmd/$n" ]; then
      proc="$(role_of "$n") stopped"
      [ $up = 1 ] && bad=1
    fi
    if [ -f "$STATE/mounts" ]; then
      while IFS=$'\t' read -r k node m c; do
        [ "$node" = "$n" ] || continue
        if pid_alive "$STATE/pids/mount-$k.pid"; then
          proc="${proc:+$proc; }mount $m pid $(pid_of "$STATE/pids/mount-$k.pid") alive"
        else
          proc="${proc:+$proc; }mount $m dead"
          bad=1
        fi
      done <"$STATE/mounts"
    fi
    if ns_exists "$SWITCH"; then
      rc=0
      link_up "$SWITCH" "$n" || rc=$?
      [ $rc = 1 ] && proc="${proc:+$proc; }link cut"
    fi
    printf '%-9s %-15s %-30s %s\n' "$n" "${IP_OF[$n]}" "$ns" "${proc:--}"
  done
  if (($(replicas) > 1)); then
    local lead
    if lead=$(find_leader); then
      echo "MDT 0 replicated by $(replicas) MDS nodes: ${lead% *} serves it (term ${lead#* })"
    else
      echo "MDT 0 replicated by $(replicas) MDS nodes: none serves it now"
    fi
  fi
  if [ -f "$STATE/pids/watch.pid" ]; then
    if pid_alive "$STATE/pids/watch.pid"; then
      echo "watcher pid $(pid_of "$STATE/pids/watch.pid") alive (down when its owner ends)"
    else
      echo "watcher dead"
    fi
  fi
  [ $up = 1 ] || exit 3
  [ $bad = 0 ] || exit 1
}

# --- down ---------------------------------------------------------------------------

do_down() {
  local grace=$1 k node m c ns f
  # Mounts first, while their servers still answer.
  if [ -f "$STATE/mounts" ]; then
    while IFS=$'\t' read -r k node m c; do
      [ -n "$k" ] || continue
      umount_one "$k" "$m" "$c"
      drop_mount_record "$k"
    done < <(cat "$STATE/mounts")
    rm -f "$STATE/mounts"
  fi
  local -a files=()
  for f in "$STATE"/pids/*.pid; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} = 0 ] || stop_pids "$grace" "${files[@]}"
  # The watcher's record, when the watcher itself (exec'd into this down) runs us.
  rm -f "$STATE/pids/watch.pid"
  # Only the namespaces this directory recorded, only with its prefix.
  if [ -f "$STATE/namespaces" ]; then
    while read -r ns; do
      [ -n "$ns" ] || continue
      if [[ $ns != "$PREFIX"-* ]]; then
        note "not deleting namespace $ns: not one of $STATE's"
        continue
      fi
      if ns_exists "$ns"; then
        ip netns del "$ns" || note "cannot delete namespace $ns"
      fi
    done <"$STATE/namespaces"
    rm -f "$STATE/namespaces"
  fi
  rm -f "$STATE/up"
}

cmd_down() {
  need_root
  set_state "$OPT_STATE"
  is_uint "$OPT_GRACE" || die "--grace wants seconds, not '$OPT_GRACE'"
  if [ ! -d "$STATE" ]; then
    echo "$STATE does not exist: nothing to do"
    return 0
  fi
  lock_state
  do_down "$OPT_GRACE"
  if [ "$OPT_PURGE" = 1 ]; then
    rm -rf "$STATE/data" "$STATE/logs" "$STATE/logs.prev" "$STATE/pids" "$STATE/cmd"
    rm -f "$STATE/cluster.secret" "$STATE/nodes" "$STATE/url" "$STATE/subnet" "$STATE/bin" "$STATE/links"
    rm -f "$STATE/mdt-replicas"
    rm -f "$STATE/lock"
    rmdir "$STATE" 2>/dev/null || true
  fi
  echo "down: $STATE"
}

# --- check --------------------------------------------------------------------------

cmd_check() {
  need_root
  need_cmd ip tc nsenter setsid flock
  local ok=1
  CHECK_NS=braid-check-$$
  local ns=$CHECK_NS
  ip netns add "$ns" || die "cannot create a network namespace"
  trap 'ip netns del "$CHECK_NS" 2>/dev/null || true' EXIT
  echo "namespaces: yes"
  if ip -n "$ns" link add br0 type bridge 2>/dev/null && ip -n "$ns" link add v0 type veth peer name v1 2>/dev/null; then
    echo "bridge and veth: yes"
  else
    echo "bridge and veth: no"
    ok=0
  fi
  ip -n "$ns" link set lo up
  if qdisc_works "$ns" netem delay 1ms; then
    echo "netem: yes (--delay and --rate)"
  else
    echo "netem: no (the kernel has no sch_netem: --delay is not available)"
  fi
  if qdisc_works "$ns" tbf rate 1gbit burst 16384 latency 50ms; then
    echo "tbf: yes (--rate without netem)"
  else
    echo "tbf: no"
  fi
  if [ -e /dev/fuse ] && command -v fusermount3 >/dev/null 2>&1; then
    echo "fuse: yes"
  else
    echo "fuse: no (mount needs /dev/fuse and fusermount3, package fuse3)"
  fi
  [ $ok = 1 ]
}

# --- arguments ----------------------------------------------------------------------

OPT_STATE=
OPT_BIN=
OPT_MDSS=1
OPT_MDSS_SET=0
OPT_MDT_REPLICAS=1
OPT_OSSS=2
OPT_OSTS_PER_OSS=2
OPT_CLIENTS=2
OPT_DELAY=
OPT_RATE=
OPT_SUBNET=
OPT_MGS_ARGS=
OPT_MDS_ARGS=
OPT_OSS_ARGS=
OPT_TIMEOUT=90
OPT_TIED_TO=
OPT_O=
OPT_PURGE=0
OPT_GRACE=10
OPT_PID=
OPT_START=
declare -a POS=() REST=() MDS_ARGS_EXPANDED=()

# Which options each command takes.
allowed() {
  case "$1 $2" in
    "up --state" | "up --bin" | "up --mdss" | "up --osss" | "up --osts-per-oss" | "up --clients") ;;
    "up --delay" | "up --rate" | "up --subnet" | "up --mgs-args" | "up --mds-args" | "up --oss-args") ;;
    "up --timeout" | "up --tied-to" | "up --mdt-replicas") ;;
    "down --state" | "down --purge" | "down --grace") ;;
    "status --state" | "exec --state" | "kill --state" | "umount --state") ;;
    "cut --state" | "heal --state" | "heal --timeout" | "leader --state" | "leader --timeout") ;;
    "mount --state" | "mount -o" | "mount --timeout" | "start --state" | "start --timeout") ;;
    "watch --state" | "watch --pid" | "watch --start") ;;
    *) return 1 ;;
  esac
}

parse() {
  local cmd=$1 opt val
  shift
  while [ $# -gt 0 ]; do
    opt=$1
    case $opt in
      -h | --help)
        usage
        exit 0
        ;;
      --)
        shift
        if [ "$cmd" = exec ]; then
          REST=("$@")
          return
        fi
        POS+=("$@")
        return
        ;;
      --*=*)
        val=${opt#*=}
        opt=${opt%%=*}
        allowed "$cmd" "$opt" || die "$cmd: unknown option $opt (see --help)"
        set -- "$opt" "$val" "${@:2}"
        continue
        ;;
      -*)
        # kill NODE -9 / -KILL: a signal, not an option.
        if [ "$cmd" = kill ] && [ ${#POS[@]} = 1 ] && [[ $opt =~ ^-[A-Za-z0-9]+$ ]]; then
          POS+=("$opt")
          shift
          continue
        fi
        allowed "$cmd" "$opt" || die "$cmd: unknown option $opt (see --help)"
        if [ "$opt" = --purge ]; then
          OPT_PURGE=1
          shift
          continue
        fi
        [ $# -ge 2 ] || die "$cmd: $opt needs a value"
        val=$2
        shift 2
        case $opt in
          --state) OPT_STATE=$val ;;
          --bin) OPT_BIN=$val ;;
          --mdss) OPT_MDSS=$val OPT_MDSS_SET=1 ;;
          --mdt-replicas) OPT_MDT_REPLICAS=$val ;;
          --osss) OPT_OSSS=$val ;;
          --osts-per-oss) OPT_OSTS_PER_OSS=$val ;;
          --clients) OPT_CLIENTS=$val ;;
          --delay) OPT_DELAY=$val ;;
          --rate) OPT_RATE=$val ;;
          --subnet) OPT_SUBNET=$val ;;
          --mgs-args) OPT_MGS_ARGS=$val ;;
          --mds-args) OPT_MDS_ARGS=$val ;;
          --oss-args) OPT_OSS_ARGS=$val ;;
          --timeout) OPT_TIMEOUT=$val ;;
          --tied-to) OPT_TIED_TO=$val ;;
          -o) OPT_O=$val ;;
          --grace) OPT_GRACE=$val ;;
          --pid) OPT_PID=$val ;;
          --start) OPT_START=$val ;;
        esac
        ;;
      *)
        POS+=("$opt")
        shift
        # exec: everything after NODE is the command.
        if [ "$cmd" = exec ]; then
          [ "${1:-}" = -- ] && shift
          REST=("$@")
          return
        fi
        ;;
    esac
  done
}

main() {
  [ $# -ge 1 ] || {
    usage >&2
    exit 2
  }
  local cmd=$1
  shift
  case $cmd in
    up | down | status | mount | umount | exec | kill | start | cut | heal | leader | check | watch) ;;
    -h | --help | help)
      usage
      exit 0
      ;;
    *) die "unknown command '$cmd' (up, down, status, leader, mount, umount, exec, kill, start, cut, heal, check; see --help)" ;;
  esac
  parse "$cmd" "$@"
  case $cmd in
    up | down | status | leader | exec | kill | start | cut | heal | mount | umount | watch)
      [ -n "$OPT_STATE" ] || die "$cmd: missing --state DIR"
      ;;
  esac
  case $cmd in
    up | down | status | leader | check) [ ${#POS[@]} = 0 ] || die "$cmd: unexpected argument '${POS[0]}'" ;;
  esac
  is_uint "$OPT_TIMEOUT" || die "--timeout wants seconds, not '$OPT_TIMEOUT'"
  "cmd_$cmd"
}

main "$@"
