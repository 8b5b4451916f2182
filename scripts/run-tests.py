#!/usr/bin/env python3
"""Runs braid's test binaries side by side, longest first, and prints each one's output
whole when it ends. cargo test runs them one after another; on this project's 2-core
machine most of a binary's time is spent waiting on server processes, fsyncs and round
trips, so three at a time shorten the suite by about a third (docs/benchmarks.md,
"The test command").

Usage: cargo test --workspace --no-run --message-format=json | run-tests.py [PASS...]

Each PASS is `NAME` (every test binary, as cargo test would run them) or
`NAME:VAR=VALUE,...:BIN,BIN...` (the named integration tests of the braid crate again,
with those environment variables). Environment: BRAID_TEST_JOBS (jobs at once, default
3), BRAID_TEST_THREADS (tests at once inside a binary, default 2), BRAID_TEST_JOB_TIMEOUT_S
(a job still running after it is killed, with its process group, and fails; default
1200).

Prints each binary's output with cargo's `test result:` line, then one line of totals,
`tests: N passed, N failed, N skipped`; exits 1 if any binary failed.
"""

import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

# Seconds each binary took in a full run (scripts/test.sh on the 2-core machine,
# three tests at a time): only the order of the queue, longest first, so that no long
# binary starts last. A binary not named here counts as short. The binaries in SPLIT
# hold a few long tests each (server processes killed at every step, whole POSIX
# suites): each of their tests is a job of its own, so they spread over the lanes.
WEIGHT_S = {
    "posix_suites": 185,
    "dne": 141,
    "mount_readdir": 22,
    "faults": 22,
    "leases": 18,
    "nbd": 13,
    "wire": 11,
    "cache": 10,
    "mount_cache": 10,
}
SPLIT = {"posix_suites", "dne"}

RESULT = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored")


def binaries(lines):
    """The test executables cargo built: (crate, target name, path, crate directory)."""
    found = []
    for line in lines:
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        crate = os.path.basename(os.path.dirname(msg["manifest_path"]))
        name = msg["target"]["name"]
        kind = msg["target"]["kind"][0]
        label = f"{crate} {'unittests' if kind in ('lib', 'bin') else 'tests'}/{name}"
        found.append((label, name, msg["executable"], os.path.dirname(msg["manifest_path"])))
    return found


def list_tests(exe, cwd):
    """The names of the tests in a test binary (libtest's terse list)."""
    out = subprocess.run([exe, "--list", "--format", "terse"], cwd=cwd, capture_output=True, text=True, check=True)
    return [line[: -len(": test")] for line in out.stdout.splitlines() if line.endswith(": test")]


def unmount_dead():
    """Lazily unmounts the braid FUSE mounts whose process is gone (a killed job's: their
    mount points answer ENOTCONN); the mounts of jobs still running answer and stay."""
    gone = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            source, point, fstype = line.split()[:3]
            if not (fstype.startswith("fuse") and source.startswith("braid")):
                continue
            point = point.replace("\\040", " ")
            try:
                os.stat(point)
            except OSError as e:
                if e.errno == errno.ENOTCONN and subprocess.run(["umount", "-l", point]).returncode == 0:
                    gone.append(point)
    return gone


def parse_pass(spec):
    parts = spec.split(":")
    env = {}
    only = None
    if len(parts) > 1 and parts[1]:
        env = dict(kv.split("=", 1) for kv in parts[1].split(","))
    if len(parts) > 2:
        only = set(parts[2].split(","))
    return parts[0], env, only


def main():
    built = binaries(sys.stdin.read().splitlines())
    if not built:
        print("run-tests: cargo built no test binary", file=sys.stderr)
        return 1
    passes = [parse_pass(p) for p in (sys.argv[1:] or ["main"])]
    threads = os.environ.get("BRAID_TEST_THREADS", "2")
    jobs = []
    for pass_name, env, only in passes:
        for label, name, exe, cwd in built:
            if only is not None and not (label.startswith("braid tests/") and name in only):
                continue
            weight = WEIGHT_S.get(name, 5)
            if name not in SPLIT:
                jobs.append((weight, pass_name, label, exe, cwd, env, [f"--test-threads={threads}"]))
                continue
            for test in list_tests(exe, cwd):
                args = ["--exact", test, "--test-threads=1"]
                jobs.append((weight, pass_name, f"{label} {test}", exe, cwd, env, args))
    missing = {n for _, _, only in passes if only for n in only} - {name for _, name, _, _ in built}
    if missing:
        print(f"run-tests: no test binary named {sorted(missing)}", file=sys.stderr)
        return 1
    jobs.sort(key=lambda j: -j[0])

    lanes = int(os.environ.get("BRAID_TEST_JOBS", "3"))
    timeout_s = int(os.environ.get("BRAID_TEST_JOB_TIMEOUT_S", "1200"))
    lock = threading.Lock()
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    failed_binaries = []
    queue = list(jobs)
    started = time.monotonic()

    def lane():
        while True:
            with lock:
                if not queue:
                    return
                _, pass_name, label, exe, cwd, env, args = queue.pop(0)
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [exe, *args],
                cwd=cwd,
                env={**os.environ, **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                raw, _ = proc.communicate(timeout=timeout_s)
                note = ""
            except subprocess.TimeoutExpired:
                # A hung job must not hold the whole run until CI's limit: its process
                # group (the test binary and the servers and mounts it started) goes.
                os.killpg(proc.pid, signal.SIGKILL)
                try:
                    raw, _ = proc.communicate(timeout=10)
                except subprocess.TimeoutExpired:  # a process of another session holds the pipe
                    raw = b""
                note = f"\nrun-tests: killed after {timeout_s} s (BRAID_TEST_JOB_TIMEOUT_S)\n"
                note += "".join(f"run-tests: unmounted {m}, left by the killed job\n" for m in unmount_dead())
            out = raw.decode("utf-8", "replace") + note
            took = time.monotonic() - t0
            with lock:
                tag = f" [{pass_name}: {','.join(f'{k}={v}' for k, v in env.items())}]" if env else ""
                print(f"\n     Running {label}{tag} ({took:.0f} s, at {time.monotonic() - started:.0f} s)")
                print(out, end="" if out.endswith("\n") else "\n")
                counted = False
                for line in out.splitlines():
                    m = RESULT.match(line)
                    if m:
                        counted = True
                        totals["passed"] += int(m.group(1))
                        totals["failed"] += int(m.group(2))
                        totals["skipped"] += int(m.group(3))
                if proc.returncode != 0 or not counted:
                    failed_binaries.append(f"{label}{tag} (exit {proc.returncode})")
                sys.stdout.flush()

    workers = [threading.Thread(target=lane) for _ in range(max(1, lanes))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for f in failed_binaries:
        print(f"FAILED: {f}")
    if failed_binaries and totals["failed"] == 0:
        totals["failed"] = len(failed_binaries)
    print(f"\n{len(jobs)} test binaries in {time.monotonic() - started:.0f} s")
    print(f"tests: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    return 1 if failed_binaries else 0


if __name__ == "__main__":
    sys.exit(main())
