#!/usr/bin/env python3
"""Memory of a 1,000-tool proxy: RSS idle after load, after every tool was called, and 5 s later,
for the shared-schema and the distinct-schema configs of bench/config.py, one proxy after the
other in this run, plus the CPU time of `toolgate-proxy check` on each config (5 runs).

    bench/rss-load.py [PROXY_BIN ...]

Each PROXY_BIN (default: the release build in cargo's target directory) is measured in turn, so
two builds compare side by side. The upstream is the example service (release build). Four
threads call every generated tool three times over one 2025-06-18 session; each call passes the
tool's own pattern and reaches the upstream, which answers 404 (`needs_more_info`) for the
made-up record ids. RSS is from /proc/PID/smaps_rollup (anonymous: the heap; the rest is mostly
the binary's code pages).
"""
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

TOOLS = 1000


def target_dir():
    meta = subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--no-deps"])
    return json.loads(meta)["target_directory"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory(pid):
    d = {}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        k, v = line.split(":", 1)
        d[k] = int(v.split()[0])
    return f"RSS {d['Rss'] / 1024:5.1f} MiB (anonymous {d['Anonymous'] / 1024:4.1f})"


def check_cpu_ms(proxy, cfg):
    runs = []
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([proxy, "check", cfg], check=True, stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append(1000 * (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime))
    return "-".join(f"{ms:.0f}" for ms in (min(runs), sorted(runs)[2], max(runs)))


def measure(proxy, service, distinct):
    work = tempfile.mkdtemp(prefix="toolgate-rss-")
    up, mcp, admin = free_port(), free_port(), free_port()
    cfg = f"{work}/proxy.yaml"
    env = dict(os.environ, BENCH_TOOLS=str(TOOLS), BENCH_DISTINCT=distinct)
    subprocess.check_call(["python3", "bench/config.py", cfg, str(up), str(mcp), str(admin)], env=env)
    cpu = check_cpu_ms(proxy, cfg)
    svc = subprocess.Popen([service, "--listen", f"127.0.0.1:{up}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    px = subprocess.Popen([proxy, "--config", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(400):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        else:
            sys.exit("the proxy did not become ready")
        time.sleep(12)  # past jemalloc's decay of the load's transient peak
        rows = [("idle", memory(px.pid))]

        def post(body, sid=None):
            h = {"content-type": "application/json", "accept": "application/json, text/event-stream",
                 "mcp-protocol-version": "2025-06-18"}
            if sid:
                h["mcp-session-id"] = sid
            req = urllib.request.Request(f"http://127.0.0.1:{mcp}/mcp", json.dumps(body).encode(), h)
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.headers.get("mcp-session-id"), json.loads(r.read() or b"null")

        sid, _ = post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "rss-load", "version": "1"}}})
        post({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
        generated = open(cfg).read().count("  - name: lookup_record_")
        wrong = []

        def worker(k):
            for _ in range(3):
                for i in range(k, generated, 4):
                    rid = f"r{i}-abc" if distinct == "1" else "abc"
                    _, reply = post({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                        "name": f"lookup_record_{i:03d}", "arguments": {"recordId": rid, "fields": ["id"]}}}, sid)
                    status = (reply.get("result") or {}).get("structuredContent", {}).get("status")
                    if status != "needs_more_info":
                        wrong.append(reply)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if wrong:
            sys.exit(f"{len(wrong)} calls did not reach the upstream; first: {wrong[0]}")
        rows.append((f"after {3 * generated} calls ({time.time() - t0:.1f} s)", memory(px.pid)))
        time.sleep(5)
        rows.append(("5 s later", memory(px.pid)))
    finally:
        px.terminate()
        svc.terminate()
        px.wait()
        svc.wait()
    name = "distinct schemas" if distinct == "1" else "shared schema"
    print(f"{proxy}: {TOOLS} tools, {name}; `check` CPU {cpu} ms (min-median-max of 5)")
    for what, mem in rows:
        print(f"  {what:<28} {mem}")
    sys.stdout.flush()


def main():
    release = os.path.join(target_dir(), "release")
    proxies = sys.argv[1:] or [os.path.join(release, "toolgate-proxy")]
    service = os.path.join(release, "example-service")
    for distinct in ("0", "1"):
        for proxy in proxies:
            measure(proxy, service, distinct)


if __name__ == "__main__":
    main()
