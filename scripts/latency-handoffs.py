#!/usr/bin/env python3
"""Where one create, one setattr and one unlink through a braid mount spend their time,
handoff by handoff (issue 39's latency budget).

    scripts/latency-handoffs.py DIR MOUNT_PID SERVER_PID [COUNT]      (root)

DIR is an empty directory on the mount; MOUNT_PID the `braid mount` process, SERVER_PID
the process serving the MDS (`braid local`, or `braid mds`). COUNT files (default 200)
are created, chmodded and unlinked one at a time, each call waiting for the last, while
the kernel's tracepoints record, with the tracer's own clock (no strace in the way):

- `fuse:fuse_request_send` / `fuse:fuse_request_end`: the kernel queues the request and
  ends it (the application waits in between);
- the mount's `read` of `/dev/fuse` returning (a FUSE thread has the request), its
  first send on a socket, its first read of a socket after that (the MDS's answer), and
  its `writev` to `/dev/fuse` (the reply);
- the server's first read of a socket in that window (the request arrives), its writes
  to files (the redo log), and its first send on a socket (the answer).

For each request of the three kinds the time between consecutive marks is one stage;
the medians over COUNT requests are printed as a table, in microseconds, with how many
requests went to the MDS at all (in a directory this mount holds the lease on, creates,
unlinks and the setattrs of files it created are answered by the mount itself: then
only the first two stages and the last exist). A stage a request did not pass through
is left out of its median.
"""
import os
import re
import statistics
import sys
import time

TRACEFS = "/sys/kernel/tracing"
OPS = {35: "create", 4: "setattr", 10: "unlink"}  # FUSE opcodes
EVENTS = [
    "fuse/fuse_request_send",
    "fuse/fuse_request_end",
    "syscalls/sys_enter_read",
    "syscalls/sys_exit_read",
    "syscalls/sys_enter_readv",
    "syscalls/sys_exit_readv",
    "syscalls/sys_enter_recvfrom",
    "syscalls/sys_exit_recvfrom",
    "syscalls/sys_enter_recvmsg",
    "syscalls/sys_exit_recvmsg",
    "syscalls/sys_enter_write",
    "syscalls/sys_enter_writev",
    "syscalls/sys_enter_sendto",
    "syscalls/sys_enter_sendmsg",
    "syscalls/sys_enter_pwrite64",
]
STAGES = [
    ("kernel -> FUSE thread", "send", "fuse_read"),
    ("mount, to its request", "fuse_read", "m_send"),
    ("socket -> server", "m_send", "s_recv"),
    ("server, to its redo log", "s_recv", "s_log"),
    ("server, log -> answer", "s_log", "s_send"),
    ("server, no log: to answer", "s_recv", "s_send_nolog"),
    ("socket -> mount", "s_send", "m_recv"),
    ("mount, answer -> reply", "m_recv", "m_reply"),
    ("mount, answered here", "fuse_read", "m_reply_here"),
    ("reply -> kernel done", "m_reply", "end"),
    ("whole request", "send", "end"),
]
LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+):\s+(.*)$")
ENTER = re.compile(r"^sys_(\w+)\((.*)\)$")
EXIT = re.compile(r"^sys_(\w+) -> (0x[0-9a-f]+)$")


def write(path, value):
    with open(os.path.join(TRACEFS, path), "w") as f:
        f.write(value)


def fds(pid):
    """Each descriptor of `pid`: 'fuse', 'socket' or 'file'."""
    kinds = {}
    base = f"/proc/{pid}/fd"
    for fd in os.listdir(base):
        try:
            target = os.readlink(os.path.join(base, fd))
        except OSError:
            continue
        kinds[int(fd)] = "fuse" if target == "/dev/fuse" else "socket" if target.startswith("socket:") else "file"
    return kinds


def tasks(pid):
    return {int(t) for t in os.listdir(f"/proc/{pid}/task")}


def workload(d, count):
    names = [os.path.join(d, f"h{i}") for i in range(count)]
    for n in names:
        os.close(os.open(n, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    for n in names:
        os.chmod(n, 0o600)
    for n in names:
        os.unlink(n)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    d, mount_pid, server_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    if not os.path.isdir(os.path.join(TRACEFS, "events")):
        sys.exit(f"no tracefs at {TRACEFS} (mount -t tracefs nodev {TRACEFS})")
    mount_fds, server_fds = fds(mount_pid), fds(server_pid)
    mount_tids, server_tids = tasks(mount_pid), tasks(server_pid)
    write("tracing_on", "0")
    write("trace", "")
    write("buffer_size_kb", "65536")
    write("set_event", "")
    write("options/event-fork", "1")
    write("set_event_pid", " ".join(str(t) for t in mount_tids | server_tids | {os.getpid()}))
    for e in EVENTS:
        write(f"events/{e}/enable", "1")
    write("tracing_on", "1")
    try:
        workload(d, count)
        time.sleep(0.2)
    finally:
        write("tracing_on", "0")
        for e in EVENTS:
            write(f"events/{e}/enable", "0")
        write("set_event_pid", "")
        write("options/event-fork", "0")
    # Threads the runtimes started meanwhile were traced too (event-fork).
    mount_tids |= tasks(mount_pid)
    server_tids |= tasks(server_pid)
    with open(os.path.join(TRACEFS, "trace")) as f:
        lines = f.readlines()
    write("trace", "")
    write("buffer_size_kb", "1408")
    budget(lines, mount_tids, server_tids, mount_fds, server_fds, count)


def budget(lines, mount_tids, server_tids, mount_fds, server_fds, count):
    """Cuts the trace into requests and their stages, and prints the medians."""
    entered = {}  # tid -> fd of the read/write call it is in
    requests = []  # [opcode, unique, marks]
    open_req = None
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        tid, ts, rest = int(m.group(2)), float(m.group(3)) * 1e6, m.group(4)
        if rest.startswith("fuse_request_send:"):
            op = re.search(r"opcode (\d+)", rest)
            uniq = re.search(r"req (\d+)", rest)
            open_req = [int(op.group(1)) if op else -1, uniq.group(1) if uniq else "", {"send": ts}]
            continue
        if rest.startswith("fuse_request_end:"):
            uniq = re.search(r"req (\d+)", rest)
            if open_req and uniq and uniq.group(1) == open_req[1]:
                open_req[2]["end"] = ts
                requests.append(open_req)
                open_req = None
            continue
        in_mount, in_server = tid in mount_tids, tid in server_tids
        if not (in_mount or in_server):
            continue  # the workload itself, or a thread gone before the end
        kinds = mount_fds if in_mount else server_fds
        enter, exit_ = ENTER.match(rest), EXIT.match(rest)
        if enter:
            # Kept outside a request's window too: a FUSE thread enters its read of
            # /dev/fuse before the request it returns with is sent.
            fd = re.search(r"fd: (0x[0-9a-f]+|\d+)", enter.group(2))
            fd = int(fd.group(1), 0) if fd else -1
            call = enter.group(1)
            kind = kinds.get(fd, "socket" if call in ("sendto", "sendmsg", "recvfrom", "recvmsg") else "file")
            entered[tid] = (call, kind)
        if open_req is None:
            if exit_:
                entered.pop(tid, None)
            continue
        marks = open_req[2]
        if enter:
            if call in ("write", "writev", "sendto", "sendmsg", "pwrite64"):
                if in_mount and kind == "fuse" and "m_reply" not in marks:
                    key = "m_reply" if "m_recv" in marks else "m_reply_here"
                    marks.setdefault(key, ts)
                    if key == "m_reply_here":
                        marks["m_reply"] = ts
                elif in_mount and kind == "socket" and "fuse_read" in marks:
                    marks.setdefault("m_send", ts)
                elif in_server and kind == "socket" and "s_recv" in marks:
                    marks.setdefault("s_send", ts)
                elif in_server and kind == "file" and "s_recv" in marks and "s_send" not in marks:
                    marks.setdefault("s_log", ts)
        elif exit_:
            call, kind = entered.pop(tid, ("", ""))
            ret = int(exit_.group(2), 16)
            if call not in ("read", "readv", "recvfrom", "recvmsg") or ret == 0 or ret > 1 << 62:
                continue  # not a read, nothing read, or an error
            if in_mount and kind == "fuse":
                marks.setdefault("fuse_read", ts)
            elif in_mount and kind == "socket" and "m_send" in marks:
                marks.setdefault("m_recv", ts)
            elif in_server and kind == "socket" and "m_send" in marks:
                marks.setdefault("s_recv", ts)
    print(f"{'stage':<28}" + "".join(f"{n:>10}" for n in OPS.values()))
    by_op = {code: [r[2] for r in requests if r[0] == code] for code in OPS}
    for code, reqs in by_op.items():
        for marks in reqs:
            if "m_reply_here" in marks:
                # Answered before any answer of the MDS came: what the mount sent
                # meanwhile (a create sent behind) is not this request's wait.
                for k in ("m_send", "s_recv", "s_log", "s_send", "m_recv"):
                    marks.pop(k, None)
            if "s_send" in marks and "s_log" not in marks:
                marks["s_send_nolog"] = marks["s_send"]
    for name, a, b in STAGES:
        cells = []
        for code in OPS:
            spans = [m[b] - m[a] for m in by_op[code] if a in m and b in m and m[b] >= m[a]]
            cells.append(f"{statistics.median(spans):>10.1f}" if spans else f"{'-':>10}")
        print(f"{name:<28}" + "".join(cells))
    went = [sum(1 for m in by_op[code] if "m_send" in m) for code in OPS]
    print(f"{'requests / to the MDS':<28}" + "".join(f"{f'{len(by_op[c])}/{w}':>10}" for c, w in zip(OPS, went)))
    print(f"(medians in microseconds over {count} calls of each kind)")


if __name__ == "__main__":
    main()
