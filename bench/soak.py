#!/usr/bin/env python3
"""Soak with faults: tools/call after tools/call through a real toolgate-proxy in front of a
fault-injecting upstream, with audit to a file, a config reload every second (valid and
invalid alternately) and SIGHUP storms. A benchmark-style run: it reports figures and fails
(exit 1) only when an invariant breaks.

    bench/soak.py [--calls N] [--concurrency C] [--proxy BIN] [--rss-limit-mib M]
                  [--reload-every S] [--no-faults]

--no-faults: the upstream always answers well, and every call must succeed (with
--reload-every 0.2: 1,000 reloads under load in about 200 s, and 0 failed calls).

Invariants checked after the run:
- every call got an HTTP 200 with the JSON-RPC response of its own id, within the tool's
  timeout plus a margin (no call lost, none answered late, none answered twice);
- the audit file holds exactly one record per call sent, and their JSON-RPC ids are exactly
  the ids sent;
- `toolgate_tool_calls_total` grew by the number of calls;
- every invalid config was refused and every valid one applied, while calls kept succeeding;
- peak RSS stayed under --rss-limit-mib, and the open file descriptors after the run (client
  connections closed) are what they were before it.

The upstream (a raw asyncio HTTP/1.1 server in its own process, on loopback) answers each
request by its `kind` query parameter: ok, slow (120 ms), hang (past the tool's 400 ms
timeout), reset (RST in the middle of the body), 500, 503, truncated (closes before the
announced Content-Length), html (200 with a non-JSON body), huge (past maxResponseBytes).
The proxy binary defaults to the release build (cargo build --release -p toolgate-proxy).
"""
import argparse
import asyncio
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

KINDS = [
    ("ok", 60), ("slow", 8), ("hang", 2), ("reset", 5), ("500", 5), ("503", 5),
    ("truncated", 5), ("html", 5), ("huge", 5),
]
TOOL_TIMEOUT_MS = 400
# A call may take the tool's timeout, plus the proxy's own work and this machine's scheduling
# under load; anything later is a failure.
ANSWER_WITHIN_S = TOOL_TIMEOUT_MS / 1000 + 2.0


def free_ports(n):
    """n distinct free loopback ports: every socket is held until all are chosen, so no two
    picks return the same port."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------------------------
# The fault-injecting upstream
# --------------------------------------------------------------------------------------------

def upstream_main(port):
    body_ok = json.dumps({"id": "r-1", "name": "record", "plan": "pro", "balance": 12}).encode()

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode()
                target = line.split(" ")[1]
                kind = "ok"
                if "kind=" in target:
                    kind = target.split("kind=", 1)[1].split("&", 1)[0]
                length = 0
                for h in head.split(b"\r\n")[1:]:
                    if h.lower().startswith(b"content-length:"):
                        length = int(h.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                if kind == "slow":
                    await asyncio.sleep(0.12)
                elif kind == "hang":
                    await asyncio.sleep(TOOL_TIMEOUT_MS / 1000 * 3)
                if kind in ("ok", "slow", "hang"):
                    resp = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body_ok), body_ok)
                elif kind in ("500", "503"):
                    b = json.dumps({"error": "upstream " + kind}).encode()
                    resp = b"HTTP/1.1 %s Error\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (kind.encode(), len(b), b)
                elif kind == "html":
                    b = b"<html><body>maintenance</body></html>"
                    resp = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n%s" % (len(b), b)
                elif kind == "huge":
                    b = b'{"blob":"' + b"x" * (256 * 1024) + b'"}'
                    resp = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(b), b)
                elif kind == "truncated":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n" + body_ok[:20])
                    await writer.drain()
                    writer.close()
                    return
                elif kind == "reset":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n" + body_ok[:20])
                    await writer.drain()
                    sock = writer.get_extra_info("socket")
                    # SO_LINGER 0: close sends RST, not FIN.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                else:
                    resp = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
                writer.write(resp)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def serve():
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


# --------------------------------------------------------------------------------------------
# Config, proxy process, metrics
# --------------------------------------------------------------------------------------------

def config_text(up, mcp, admin, audit, generation, valid=True):
    tools = f"""
tools:
  - name: fault
    description: Generation {generation} of the soak tool; the upstream misbehaves on purpose.
    inputSchema:
      type: object
      additionalProperties: false
      required: [kind, n]
      properties:
        kind: {{type: string, enum: {json.dumps([k for k, _ in KINDS])}}}
        n: {{type: integer, minimum: 0}}
    http: {{method: GET, path: /fault, query: {{kind: "{{kind}}", n: "{{n}}"}}, timeoutMs: {TOOL_TIMEOUT_MS}}}
"""
    if not valid:
        # A schema the proxy refuses: the reload must be refused and generation N-1 keep serving.
        tools = tools.replace("type: integer, minimum: 0", "type: integr, minimum: 0")
    return f"""apiVersion: toolgate.dev/v1alpha1
kind: ProxyConfig
server:
  listen: 127.0.0.1:{mcp}
  adminListen: 127.0.0.1:{admin}
  shutdownGraceSeconds: 10
  maxSessions: 100000
upstream:
  baseUrl: http://127.0.0.1:{up}
  timeoutMs: {TOOL_TIMEOUT_MS}
  maxResponseBytes: 65536
  # Idle upstream connections close within a second: the descriptor count after the run is
  # compared with the one before it.
  poolIdleTimeoutMs: 1000
policy:
  readOnly: true
  audit: {{sink: file, path: '{audit}'}}
  rateLimit: {{perIp: {{requests: 1000000000, windowSeconds: 1}}, perIdentity: {{requests: 1000000000, windowSeconds: 1}}}}
{tools}"""


async def wait_for_ports(*ports):
    """Until every loopback port accepts connections (10 s at most)."""
    for _ in range(200):
        try:
            for port in ports:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"ports {ports} did not open")


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def proc_stats(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss, fds


async def http(host, port, method, path, headers=None, body=b""):
    reader, writer = await asyncio.open_connection(host, port)
    try:
        return await exchange(reader, writer, method, path, headers or {}, body)
    finally:
        writer.close()


async def exchange(reader, writer, method, path, headers, body):
    head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()
    status_head = await reader.readuntil(b"\r\n\r\n")
    lines = status_head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    resp_headers = {}
    for h in lines[1:]:
        if b":" in h:
            k, v = h.split(b":", 1)
            resp_headers[k.strip().lower().decode()] = v.strip().decode()
    n = int(resp_headers.get("content-length", "0"))
    data = await reader.readexactly(n) if n else b""
    return status, resp_headers, data


async def scrape(admin):
    _, _, body = await http("127.0.0.1", admin, "GET", "/metrics")
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def metric_sum(m, prefix):
    return sum(v for k, v in m.items() if k.startswith(prefix))


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------

async def run(args):
    work = tempfile.mkdtemp(prefix="toolgate-soak-")
    up, mcp, admin = free_ports(3)
    upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(up)])
    audit = os.path.join(work, "audit.jsonl")
    cfg = os.path.join(work, "proxy.yaml")
    write_atomic(cfg, config_text(up, mcp, admin, audit, 1))
    log = open(os.path.join(work, "proxy.log"), "w")
    proxy = subprocess.Popen([args.proxy, "--config", cfg, "--reload-interval-ms", "200"],
                             stdout=subprocess.DEVNULL, stderr=log)
    failures = []
    try:
        await wait_for_ports(mcp, up)
        base = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        init = json.dumps({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "soak", "version": "1"}}}).encode()
        status, h, _ = await http("127.0.0.1", mcp, "POST", "/mcp", base, init)
        assert status == 200, status
        session = h["mcp-session-id"]
        headers = dict(base, **{"mcp-session-id": session, "mcp-protocol-version": "2025-06-18"})
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
        await http("127.0.0.1", mcp, "POST", "/mcp", headers, note)

        before = await scrape(admin)
        rss0, fds0 = proc_stats(proxy.pid)
        weights = [w for _, w in KINDS]
        names = [k for k, _ in KINDS]
        rng = random.Random(7)
        plan = rng.choices(names, weights, k=args.calls) if args.faults else ["ok"] * args.calls
        next_call = 0
        outcomes = {}
        late = []
        answered = set()
        started = time.monotonic()
        done = asyncio.Event()

        async def worker():
            nonlocal next_call
            reader, writer = await asyncio.open_connection("127.0.0.1", mcp)
            try:
                while next_call < args.calls:
                    i = next_call
                    next_call += 1
                    if i and i % 100_000 == 0:
                        rate = i / (time.monotonic() - started)
                        print(f"  {i} calls sent, {rate:.0f}/s", flush=True)
                    body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                                       "params": {"name": "fault", "arguments": {"kind": plan[i], "n": i}}}).encode()
                    t0 = time.monotonic()
                    try:
                        status, _, data = await exchange(reader, writer, "POST", "/mcp", headers, body)
                    except (ConnectionError, asyncio.IncompleteReadError) as e:
                        failures.append(f"call {i} ({plan[i]}): connection failed: {e!r}")
                        writer.close()
                        reader, writer = await asyncio.open_connection("127.0.0.1", mcp)
                        continue
                    took = time.monotonic() - t0
                    if took > ANSWER_WITHIN_S:
                        late.append((i, plan[i], took))
                    if status != 200:
                        failures.append(f"call {i} ({plan[i]}): HTTP {status}: {data[:200]!r}")
                        continue
                    msg = json.loads(data)
                    if msg.get("id") != i or i in answered:
                        failures.append(f"call {i}: answered with id {msg.get('id')!r}")
                        continue
                    answered.add(i)
                    if "error" in msg:
                        failures.append(f"call {i} ({plan[i]}): JSON-RPC error {msg['error']}")
                        continue
                    env = json.loads(msg["result"]["content"][0]["text"])
                    key = (plan[i], env["status"], (env.get("errors") or [{}])[0].get("code"))
                    outcomes[key] = outcomes.get(key, 0) + 1
            finally:
                writer.close()

        reloads = {"valid": 0, "invalid": 0}

        def reload_counts(m):
            return (m.get('toolgate_config_reloads_total{result="applied"}', 0),
                    m.get('toolgate_config_reloads_total{result="refused"}', 0))

        async def reloader():
            # One write a second, each waited for: the proxy must have applied or refused it
            # before the next, so the counts below are exact.
            generation = 1
            while not done.is_set():
                await asyncio.sleep(args.reload_every)
                generation += 1
                valid = generation % 2 == 0
                seen = reload_counts(await scrape(admin))
                write_atomic(cfg, config_text(up, mcp, admin, audit, generation, valid))
                reloads["valid" if valid else "invalid"] += 1
                deadline = time.monotonic() + 10
                while reload_counts(await scrape(admin)) == seen:
                    if time.monotonic() > deadline:
                        failures.append(f"config generation {generation} was neither applied nor refused in 10 s")
                        break
                    await asyncio.sleep(0.05)

        async def hup_storm():
            while not done.is_set():
                await asyncio.sleep(5.0)
                for _ in range(50):
                    proxy.send_signal(signal.SIGHUP)
                    await asyncio.sleep(0.002)

        peak = {"rss": rss0, "fds": fds0}

        async def sampler():
            while not done.is_set():
                rss, fds = proc_stats(proxy.pid)
                peak["rss"] = max(peak["rss"], rss)
                peak["fds"] = max(peak["fds"], fds)
                await asyncio.sleep(0.5)

        reloading = asyncio.create_task(reloader())
        side = [asyncio.create_task(t()) for t in (hup_storm, sampler)]
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        elapsed = time.monotonic() - started
        done.set()
        for t in side:
            t.cancel()
        await reloading  # its last write is applied or refused before the counts are read
        after = await scrape(admin)
        # Client connections are closed; idle upstream connections close within a second.
        await asyncio.sleep(2.5)
        rss1, fds1 = proc_stats(proxy.pid)

        calls_metric = metric_sum(after, "toolgate_tool_calls_total") - metric_sum(before, "toolgate_tool_calls_total")
        applied = after.get('toolgate_config_reloads_total{result="applied"}', 0) - before.get('toolgate_config_reloads_total{result="applied"}', 0)
        refused = after.get('toolgate_config_reloads_total{result="refused"}', 0) - before.get('toolgate_config_reloads_total{result="refused"}', 0)

        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=30)
        ids = []
        with open(audit) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("tool") == "fault":
                    ids.append(rec["jsonrpcId"])

        # ------------------------------------------------------------------ report
        print(f"calls: {args.calls} at concurrency {args.concurrency} in {elapsed:.1f} s ({args.calls / elapsed:.0f}/s)")
        print("outcomes (upstream kind, envelope status, first error code):")
        for (kind, status, code), n in sorted(outcomes.items()):
            print(f"  {kind:<10} {status:<16} {code or '-':<24} {n}")
        print(f"audit records: {len(ids)}; toolgate_tool_calls_total: +{calls_metric:.0f}")
        print(f"reloads written every {args.reload_every} s: {reloads['valid']} valid, {reloads['invalid']} invalid; applied +{applied:.0f}, refused +{refused:.0f}")
        print(f"RSS: {rss0 / 2**20:.1f} MiB before, peak {peak['rss'] / 2**20:.1f} MiB, {rss1 / 2**20:.1f} MiB after")
        print(f"open fds: {fds0} before, peak {peak['fds']}, {fds1} after")
        print(f"slowest answers over {ANSWER_WITHIN_S:.1f} s: {len(late)}")

        if not args.faults:
            bad = {k: n for k, n in outcomes.items() if k[1] != "success"}
            if bad:
                failures.append(f"calls failed with a well-behaved upstream: {bad}")
        if len(answered) != args.calls:
            failures.append(f"{args.calls - len(answered)} calls got no valid answer")
        if late:
            failures.append(f"{len(late)} calls answered after {ANSWER_WITHIN_S} s, e.g. {late[:3]}")
        if sorted(ids) != list(range(args.calls)):
            missing = set(range(args.calls)) - set(ids)
            failures.append(f"audit: {len(ids)} records for {args.calls} calls; missing {sorted(missing)[:5]}; duplicates {len(ids) - len(set(ids))}")
        if calls_metric != args.calls:
            failures.append(f"toolgate_tool_calls_total grew by {calls_metric}, not {args.calls}")
        if applied != reloads["valid"] or refused != reloads["invalid"]:
            failures.append(f"reloads: {reloads} written, but applied +{applied}, refused +{refused}")
        if peak["rss"] > args.rss_limit_mib * 2**20:
            failures.append(f"peak RSS {peak['rss'] / 2**20:.1f} MiB over {args.rss_limit_mib} MiB")
        if fds1 > fds0:
            failures.append(f"file descriptors: {fds0} before, {fds1} after")
    finally:
        if proxy.poll() is None:
            proxy.kill()
        upstream.kill()
        log.close()
    return verdict(failures, work)


def verdict(failures, work):
    """Prints the failures (or ok) and returns the exit status."""
    if failures:
        print("FAILED:", *(f[:300] for f in failures[:20]), sep="\n  ")
        print(f"(proxy log: {work}/proxy.log)")
        return 1
    print("ok")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rss-limit-mib", type=float, default=64)
    p.add_argument("--reload-every", type=float, default=1.0, help="seconds between config writes")
    p.add_argument("--no-faults", dest="faults", action="store_false", help="a well-behaved upstream")
    here = os.path.dirname(os.path.abspath(__file__))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(here, "..", "target"))
    p.add_argument("--proxy", default=os.path.join(target, "release", "toolgate-proxy"))
    p.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.upstream:
        upstream_main(args.upstream)
        return 0
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
