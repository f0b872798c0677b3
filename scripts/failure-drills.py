#!/usr/bin/env python3
"""What tidemark says while things go wrong: each failure a new user meets, run for real.

    python3 scripts/failure-drills.py [BINARY]

For each drill it prints the time to the first line on standard error and to the end, the exit
status and the last line, and checks that the run ended in under 30 s with a non-zero exit, naming
the cause in plain words and the setting to check (and, for an interrupted apply, how to resume):

  closed-port     FCM_EMULATOR_HOST at a port nothing listens on
  unknown-host    FCM_EMULATOR_HOST at a host name that does not resolve
  silent          FCM_EMULATOR_HOST at a port that accepts and never answers
  html-200        FCM_EMULATOR_HOST at a web server that answers HTML pages
  html-502        FCM_EMULATOR_HOST at a proxy that answers 502 error pages
  state-stopped   the PostgreSQL state server stopped in the middle of an apply

Exit 0 when every drill passes. Needs the built binary, the demo project, and PostgreSQL
(scripts/postgres.sh installs it when missing).
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, ".build/debug/tidemark")
LIMIT = 30.0


class Server(threading.Thread):
    """A loopback server: `silent` accepts and never answers; otherwise answers `status` with HTML."""

    def __init__(self, status=None):
        super().__init__(daemon=True)
        self.status = status
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.held = []

    def run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.status is None:
                self.held.append(conn)  # accepted, never answered
                continue
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn):
        try:
            conn.recv(65536)
            body = b"<html><head><title>Error</title></head><body>Bad gateway</body></html>"
            conn.sendall(
                b"HTTP/1.1 %s\r\nContent-Type: text/html; charset=UTF-8\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (self.status.encode(), len(body), body))
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(args, env, cwd, on_line=None):
    """Runs tidemark; returns (status, seconds to first stderr line, seconds to end, stderr lines)."""
    started = time.monotonic()
    proc = subprocess.Popen([BINARY] + args, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    first = None
    lines = []
    for line in proc.stderr:
        if first is None:
            first = time.monotonic() - started
        lines.append(line.rstrip("\n"))
        if on_line:
            on_line(line)
        if time.monotonic() - started > 120:
            proc.kill()
    status = proc.wait()
    return status, first, time.monotonic() - started, lines


def main():
    if not os.access(BINARY, os.X_OK):
        sys.exit(f"failure-drills: no tidemark binary at {BINARY}; build it first (swift build)")
    work = tempfile.mkdtemp(prefix="tidemark-drills-")
    project = os.path.join(work, "project")
    os.makedirs(project)
    shutil.copytree(os.path.join(ROOT, "manifests"), os.path.join(project, "manifests"))
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("FCM_", "GOOGLE_", "TIDEMARK_", "GCE_"))}
    base_env["NO_GCE_CHECK"] = "True"

    # The emulator, for its key file: access tokens come from it while FCM_EMULATOR_HOST points elsewhere.
    emulator = subprocess.Popen([BINARY, "emulator", "serve", "--port", "0"], cwd=project, env=base_env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    key = None
    for line in emulator.stdout:
        found = re.search(r"GOOGLE_APPLICATION_CREDENTIALS=(\S+)", line)
        if found:
            key = found.group(1)
            break
    if key is None:
        emulator.kill()
        sys.exit("failure-drills: the emulator did not print its key file")

    silent = Server()
    html200 = Server("200 OK")
    html502 = Server("502 Bad Gateway")
    for server in (silent, html200, html502):
        server.start()

    drills = [
        ("closed-port", f"127.0.0.1:{closed_port()}", ["connection was refused"]),
        ("unknown-host", "no-such-host.invalid:8080", ["could not be resolved"]),
        ("silent", f"127.0.0.1:{silent.port}", ["did not answer"]),
        ("html-200", f"127.0.0.1:{html200.port}", ["not JSON (text/html"]),
        ("html-502", f"127.0.0.1:{html502.port}", ["HTTP 502"]),
    ]
    results = []
    try:
        for name, host, causes in drills:
            env = dict(base_env, FCM_EMULATOR_HOST=host, GOOGLE_APPLICATION_CREDENTIALS=key)
            status, first, total, lines = run(["plan", "--backend", "emulator"], env, project)
            text = "\n".join(lines)
            checks = {
                "non-zero exit": status not in (0, None),
                f"under {LIMIT:.0f} s": total < LIMIT,
                "names the cause": all(c in text for c in causes),
                "names the setting": "FCM_EMULATOR_HOST" in text,
                "no Swift dump": not re.search(r"\w+\(\w+: ", text.replace("(now ", "")),
            }
            results.append((name, status, first, total, lines[-1] if lines else "", checks))
        results.append(state_stopped(work, project, base_env))
    finally:
        for server in (silent, html200, html502):
            server.stop()
        emulator.send_signal(signal.SIGTERM)
        emulator.wait()
        shutil.rmtree(work, ignore_errors=True)

    failed = False
    print(f"{'drill':<14} {'exit':>4} {'first line':>10} {'end':>7}  checks")
    for name, status, first, total, last, checks in results:
        bad = [c for c, ok in checks.items() if not ok]
        failed |= bool(bad)
        first_text = f"{first:.1f} s" if first is not None else "none"
        verdict = "ok" if not bad else "FAILED: " + ", ".join(bad)
        print(f"{name:<14} {status:>4} {first_text:>10} {total:>5.1f} s  {verdict}")
        print(f"{'':<14} {last[:400]}")
    if failed:
        sys.exit(1)


def state_stopped(work, project, base_env):
    """Stops the PostgreSQL state server while an apply waits on a slow backend."""
    # Its own directory under /tmp: the server runs as another user when this runs as root.
    pg_dir = tempfile.mkdtemp(prefix="tidemark-drills-pg-")
    url = subprocess.run(["bash", os.path.join(ROOT, "scripts/postgres.sh"), "start", pg_dir],
                         check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    env = dict(base_env, TIDEMARK_EMBEDDED_LATENCY_MS="3000")
    stopped = {}

    def on_line(line):
        # Once the apply is sending, the state server goes away.
        if "Applying" in line and "at" not in stopped:
            subprocess.run(["bash", os.path.join(ROOT, "scripts/postgres.sh"), "stop", pg_dir],
                           capture_output=True)
            stopped["at"] = time.monotonic()

    try:
        status, first, _, lines = run(["apply", "--auto-approve", "--state", url], env, project, on_line)
    finally:
        subprocess.run(["bash", os.path.join(ROOT, "scripts/postgres.sh"), "stop", pg_dir], capture_output=True)
    ended = time.monotonic()
    total = ended - stopped["at"] if "at" in stopped else float("inf")
    text = "\n".join(lines)
    checks = {
        "the server was stopped mid-apply": "at" in stopped,
        "non-zero exit": status != 0,
        f"under {LIMIT:.0f} s after the stop": total < LIMIT,
        "names the cause": "connection was refused" in text or "closed the connection" in text,
        "names the state": "postgres://" in text,
        "says how to resume": "'tidemark apply' resumes" in text,
        "no Swift dump": "SingleConnectionFailure" not in text and "PSQLError" not in text,
    }
    error = next((line for line in lines if line.startswith("error:")), lines[-1] if lines else "")
    return ("state-stopped", status, first, total, error, checks)


if __name__ == "__main__":
    main()
