#!/usr/bin/env python3
"""Hostile clients against a real toolgate-proxy while a well-behaved client keeps calling a
tool: idle connections by the thousand, slowloris headers and bodies, initialize floods from
one address and from many, huge headers, deep JSON nesting, long strings in every field.

    bench/hostile.py [--proxy BIN] [--idle N]

For each attack it reports what the attacker got and how the well-behaved client fared (calls
answered, p50 and p99 latency, on a connection it already had and on new connections), and
the proxy's peak RSS. It fails (exit 1) when the well-behaved client loses a call or waits
more than --max-wait-ms for one, or when RSS passes --rss-limit-mib. The upstream is the
example service (the release build of example-service), on loopback.
"""
import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import exchange, free_port, proc_stats, verdict, wait_for_ports  # noqa: E402

BASE = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def config(up, mcp, admin, max_connections, credentials):
    return f"""apiVersion: toolgate.dev/v1alpha1
kind: ProxyConfig
server:
  listen: 127.0.0.1:{mcp}
  adminListen: 127.0.0.1:{admin}
  maxConnections: {max_connections}
upstream:
  baseUrl: http://127.0.0.1:{up}
policy:
  audit: {{enabled: false}}
  auth: {{mode: apiKey, credentialsFile: '{credentials}'}}
  # 10 requests a second per address and per identity: room for the well-behaved client (5 a
  # second), and the attackers' own address limited.
  rateLimit: {{perIp: {{requests: 600, windowSeconds: 60}}, perIdentity: {{requests: 600, windowSeconds: 60}}}}
tools:
  - name: get_customer
    description: Returns one customer.
    inputSchema:
      type: object
      additionalProperties: false
      required: [customerId]
      properties: {{customerId: {{type: string}}}}
    http: {{method: GET, path: "/customers/{{customerId}}"}}
"""


def modern_call(i):
    return json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
        "name": "get_customer", "arguments": {"customerId": "42"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientInfo": {"name": "good", "version": "1"},
                  "io.modelcontextprotocol/clientCapabilities": {}}}}).encode()


# The well-behaved client authenticates; the attackers do not (or are throttled by address).
GOOD_KEY = "good-client-key-0123456789"
MODERN = dict(BASE, **{"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "get_customer",
                       "x-api-key": GOOD_KEY})


# The well-behaved client's own address: the attackers' per-address limits are what must not
# reach it.
GOOD_SOURCE = ("127.1.0.1", 0)


class Good:
    """The well-behaved client, from its own address and with its own key: a call every 250 ms
    on its kept connection and one a second on a new connection (inside its limits)."""

    def __init__(self, mcp):
        self.mcp = mcp
        self.kept = []
        self.fresh = []
        self.lost = []
        self.stop = asyncio.Event()
        self.n = 0

    async def one(self, reader, writer):
        self.n += 1
        t0 = time.monotonic()
        status, _, body = await asyncio.wait_for(
            exchange(reader, writer, "POST", "/mcp", MODERN, modern_call(self.n)), 10)
        took = time.monotonic() - t0
        if status != 200 or b'"isError":false' not in body:
            raise RuntimeError(f"HTTP {status}: {body[-160:]!r}")
        return took

    async def kept_loop(self):
        reader, writer = await asyncio.open_connection("127.0.0.1", self.mcp, local_addr=GOOD_SOURCE)
        while not self.stop.is_set():
            try:
                self.kept.append(await self.one(reader, writer))
            except Exception as e:  # noqa: BLE001 - every failure is a lost call
                self.lost.append(f"kept connection: {e!r}")
                writer.close()
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", self.mcp, local_addr=GOOD_SOURCE)
                except OSError as e2:
                    self.lost.append(f"reconnect: {e2!r}")
            await asyncio.sleep(0.25)
        writer.close()

    async def fresh_loop(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.mcp, local_addr=GOOD_SOURCE), 10)
                try:
                    await self.one(reader, writer)
                    self.fresh.append(time.monotonic() - t0)
                finally:
                    writer.close()
            except Exception as e:  # noqa: BLE001
                self.lost.append(f"new connection: {e!r}")
            await asyncio.sleep(1.0)


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))] * 1000


# --------------------------------------------------------------------------------------------
# Attacks: each returns a short description of what the attacker got
# --------------------------------------------------------------------------------------------

async def idle_connections(mcp, n, hold, sources=("127.0.0.1",)):
    socks = []
    refused = 0
    for i in range(n):
        try:
            s = socket.socket()
            s.bind((sources[i % len(sources)], 0))
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", mcp))
            except BlockingIOError:
                pass
            socks.append(s)
        except OSError:
            refused += 1
    await asyncio.sleep(hold)
    # How many the proxy closed while they sat idle.
    closed = 0
    for s in socks:
        try:
            if s.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    return f"{len(socks)} opened ({refused} failed locally), {closed} closed by the proxy within {hold:.0f} s"


async def slowloris(mcp, n, hold, body):
    writers = []
    for _ in range(n):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", mcp)
            writers.append(w)
        except OSError:
            pass
    head = b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
    end = time.monotonic() + hold
    i = 0
    closed = 0
    while time.monotonic() < end and writers:
        for w in list(writers):
            try:
                if body:
                    w.write(head if i == 0 else b" ")
                else:
                    w.write(b"POST /mcp HTTP/1.1\r\n"[i:i + 1] if i < 20 else b"x")
                await w.drain()
            except (ConnectionError, OSError):
                closed += 1
                writers.remove(w)
        i += 1
        await asyncio.sleep(1.0)
    for w in writers:
        w.close()
    return f"{n} dripping {'bodies' if body else 'headers'}; {closed} cut off by the proxy within {hold:.0f} s"


async def post_once(mcp, headers, body, source="127.0.0.1"):
    """One request on a new connection from `source`: the status, or the exception's name."""
    try:
        r, w = await asyncio.open_connection("127.0.0.1", mcp, local_addr=(source, 0))
        try:
            status, _, _ = await asyncio.wait_for(exchange(r, w, "POST", "/mcp", headers, body), 10)
        finally:
            w.close()
    except Exception as e:  # noqa: BLE001 - what the attacker got is the result
        status = type(e).__name__
    return status


async def flood(mcp, total, sources):
    statuses = {}
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "flood", "version": "1"}}}).encode()
    sent = 0

    async def worker(k):
        nonlocal sent
        while sent < total:
            sent += 1
            status = await post_once(mcp, BASE, init, sources[sent % len(sources)])
            statuses[status] = statuses.get(status, 0) + 1

    await asyncio.gather(*(worker(k) for k in range(32)))
    return f"{total} initialize from {len(sources)} address(es): {dict(sorted(statuses.items(), key=str))}"


async def garbage(mcp, label, requests):
    statuses = {}
    for headers, body in requests:
        status = await post_once(mcp, headers, body)
        statuses[status] = statuses.get(status, 0) + 1
    return f"{len(requests)} {label}: {dict(sorted(statuses.items(), key=str))}"


def long_strings():
    big = "x" * 200_000
    out = []
    for field in ["method", "id", "name", "argument", "protocolVersion", "jsonrpc"]:
        msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "get_customer", "arguments": {"customerId": "c-1"}}}
        if field == "method":
            msg["method"] = big
        elif field == "id":
            msg["id"] = big
        elif field == "name":
            msg["params"]["name"] = big
        elif field == "argument":
            msg["params"]["arguments"]["customerId"] = big
        elif field == "protocolVersion":
            msg["params"]["_meta"] = {"io.modelcontextprotocol/protocolVersion": big}
        else:
            msg["jsonrpc"] = big
        out.append((BASE, json.dumps(msg).encode()))
    return out * 20


async def main_async(args):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    work = tempfile.mkdtemp(prefix="toolgate-hostile-")
    up, mcp, admin = free_port(), free_port(), free_port()
    example = subprocess.Popen([args.example, "--listen", f"127.0.0.1:{up}"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    cfg = os.path.join(work, "proxy.yaml")
    credentials = os.path.join(work, "credentials.yaml")
    with open(credentials, "w") as f:
        f.write(f"credentials:\n  - {{id: good, key: {GOOD_KEY}, role: viewer}}\n")
    with open(cfg, "w") as f:
        f.write(config(up, mcp, admin, args.max_connections, credentials))
    log = open(os.path.join(work, "proxy.log"), "w")
    proxy = subprocess.Popen([args.proxy, "--config", cfg], stdout=subprocess.DEVNULL, stderr=log)
    failed = []
    try:
        await wait_for_ports(mcp, up)
        attacks = [
            ("none (baseline)", lambda: asyncio.sleep(3, result="-")),
            (f"{args.idle} idle connections, one address", lambda: idle_connections(mcp, args.idle, 15)),
            (f"{args.idle} idle connections, 200 addresses",
             lambda: idle_connections(mcp, args.idle, 15, [f"127.0.{i // 250}.{i % 250 + 2}" for i in range(200)])),
            ("slowloris headers", lambda: slowloris(mcp, 500, 10, body=False)),
            ("slowloris bodies", lambda: slowloris(mcp, 500, 10, body=True)),
            ("initialize flood, one address", lambda: flood(mcp, 5000, ["127.0.0.1"])),
            ("initialize flood, 200 addresses", lambda: flood(mcp, 5000, [f"127.0.{i // 250}.{i % 250 + 2}" for i in range(200)])),
            ("huge headers", lambda: garbage(mcp, "requests with a 1 MiB header", [(dict(BASE, **{"x-big": "a" * (1 << 20)}), b"{}")] * 50)),
            ("deep JSON nesting", lambda: garbage(mcp, "bodies of 500,000 nested arrays", [(BASE, b"[" * 500_000)] * 50)),
            ("long strings in every field", lambda: garbage(mcp, "200 KB strings in method, id, name, arguments, _meta, jsonrpc", long_strings())),
        ]
        print(f"{'attack':<34} {'good calls':>10} {'lost':>5} {'kept p50':>9} {'kept p99':>9} {'new p99':>9} {'peak RSS':>9}  attacker got")
        for name, attack in attacks:
            good = Good(mcp)
            tasks = [asyncio.create_task(good.kept_loop()), asyncio.create_task(good.fresh_loop())]
            peak = 0

            async def sample():
                nonlocal peak
                while not good.stop.is_set():
                    peak = max(peak, proc_stats(proxy.pid)[0])
                    await asyncio.sleep(0.2)

            sampler = asyncio.create_task(sample())
            got = await attack()
            await asyncio.sleep(0.5)
            good.stop.set()
            await asyncio.gather(*tasks, sampler, return_exceptions=True)
            calls = len(good.kept) + len(good.fresh)
            worst = max(good.kept + good.fresh, default=0) * 1000
            print(f"{name:<34} {calls:>10} {len(good.lost):>5} {pct(good.kept, 50):>7.1f}ms {pct(good.kept, 99):>7.1f}ms"
                  f" {pct(good.fresh, 99):>7.1f}ms {peak / 2**20:>7.1f}Mi  {got}", flush=True)
            if good.lost:
                failed.append(f"{name}: the well-behaved client lost {len(good.lost)} calls, e.g. {good.lost[:2]}")
            if worst > args.max_wait_ms:
                failed.append(f"{name}: a well-behaved call took {worst:.0f} ms")
            if peak > args.rss_limit_mib * 2**20:
                failed.append(f"{name}: peak RSS {peak / 2**20:.1f} MiB")
            if proxy.poll() is not None:
                failed.append(f"{name}: the proxy exited ({proxy.returncode})")
                break
    finally:
        if proxy.poll() is None:
            proxy.terminate()
            proxy.wait(timeout=15)
        example.kill()
        log.close()
    return verdict(failed, work)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(here, "..", "target"))
    p.add_argument("--proxy", default=os.path.join(target, "release", "toolgate-proxy"))
    p.add_argument("--example", default=os.path.join(target, "release", "example-service"))
    p.add_argument("--idle", type=int, default=10_000)
    p.add_argument("--max-connections", type=int, default=2048, help="server.maxConnections (the default)")
    p.add_argument("--max-wait-ms", type=float, default=1000)
    p.add_argument("--rss-limit-mib", type=float, default=256)
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
