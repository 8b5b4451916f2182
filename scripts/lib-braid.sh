# braid_up / braid_down for the benchmark scripts (sourced, not run): a braid
# cluster under $WORK/NAME, with its own mount, started and stopped by PID.
# Needs WORK and BRAID set by the caller.

# braid twice: `braid local --mount`, whose own mount reaches the servers in-process (as
# Lustre's 0@lo), and `braid local` serving alone with a separate `braid mount` process
# reaching it over loopback TCP, as a client on another node does.
braid_up() {  # braid_up NAME PORT in-process|tcp|tcp-sc [BINARY [LOCAL-ARGS...]]
    local d=$WORK/$1 port=$2 mode=$3 BRAID=${4:-$BRAID}
    shift 4 2>/dev/null || shift $#
    rm -rf "$d/data"; mkdir -p "$d/data" "$d/mnt"
    if [ "$mode" = in-process ]; then
        "$BRAID" local --data "$d/data" --osts 4 --listen 127.0.0.1:$port --mount "$d/mnt" "$@" \
            > "$d/local.log" 2>&1 &
        echo $! > "$d/pid"
    else
        "$BRAID" local --data "$d/data" --osts 4 --listen 127.0.0.1:$port "$@" > "$d/local.log" 2>&1 &
        echo $! > "$d/pid"
        for _ in $(seq 1 100); do grep -q "^MGS at" "$d/local.log" && break; sleep 0.2; done
        local opts=()
        [ "$mode" = tcp-sc ] && opts=(-o short_circuit)
        "$BRAID" mount "braid://127.0.0.1:$port/" "$d/mnt" --secret-file "$d/data/cluster.secret" \
            --log "$d/mount.log" "${opts[@]}" || { echo "braid mount ($1) failed" >&2; return 1; }
    fi
    for _ in $(seq 1 100); do mountpoint -q "$d/mnt" && return 0; sleep 0.2; done
    echo "braid ($1) did not mount" >&2; return 1
}
braid_down() {  # braid_down NAME
    local d=$WORK/$1
    mountpoint -q "$d/mnt" && "$BRAID" umount "$d/mnt"
    [ -f "$d/pid" ] && kill "$(cat "$d/pid")" 2>/dev/null
    rm -f "$d/pid"
    sleep 2
}
