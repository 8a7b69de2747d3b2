#!/usr/bin/env python3
"""The benchmarks' proxy config: example/proxy.yaml on the given loopback ports, limits lifted
out of the way (the load comes from one address and one identity), plus generated tools up to
100 in all (BENCH_TOOLS=N: N), and the `slow_lookup` tool (1 ms of service time).

    bench/config.py OUT UPSTREAM_PORT MCP_PORT ADMIN_PORT
With BENCH_DISTINCT=1 every generated tool's schema differs (its own pattern and enum), so
none share a compiled validator or pattern, as tools with identical schemas do.
With BENCH_POLICY=1: API-key auth over 1,000 keys (`bench-key-N`, role admin) and an audit
record per call written to a file beside OUT; otherwise auth off and audit off.
"""
import os
import re
import sys

out, up, mcp, admin = sys.argv[1:]
text = open("example/proxy.yaml").read()
text = text.replace("baseUrl: http://127.0.0.1:8080", f"baseUrl: http://127.0.0.1:{up}")
text = text.replace("listen: 127.0.0.1:8931", f"listen: 127.0.0.1:{mcp}")
text = text.replace("adminListen: 127.0.0.1:9464", f"adminListen: 127.0.0.1:{admin}")
# The load comes from one address and one identity: lift the limits out of the way, and keep
# audit records off stdout (the policy benchmark measures them separately).
text = text.replace("perIp: {requests: 1200, windowSeconds: 60}", "perIp: {requests: 1000000000, windowSeconds: 1}")
text = text.replace("perIdentity: {requests: 600, windowSeconds: 60}", "perIdentity: {requests: 1000000000, windowSeconds: 1}")
if os.environ.get("BENCH_POLICY") == "1":
    # API-key auth over 1000 keys, and an audit record per call written to a file.
    creds = os.path.join(os.path.dirname(out), "credentials.yaml")
    with open(creds, "w") as f:
        f.write("credentials:\n" + "".join(f"  - {{id: key-{i}, key: bench-key-{i}, role: admin}}\n" for i in range(1000)))
    text = text.replace("audit: {sink: stdout}", f"audit: {{sink: file, path: '{os.path.dirname(out)}/audit.jsonl'}}\n  auth: {{mode: apiKey, credentialsFile: '{creds}'}}")
else:
    text = text.replace("audit: {sink: stdout}", "audit: {enabled: false}")
text += """
  - name: slow_lookup
    description: The example service's endpoint with 1 ms of service time (an I/O-bound upstream).
    inputSchema: {type: object, properties: {ms: {type: integer}}}
    http: {method: GET, path: /slow, query: {ms: "{ms}"}}
"""
have = len(re.findall(r"^  - name: ", text, re.M))
distinct = os.environ.get("BENCH_DISTINCT") == "1"
for i in range(int(os.environ.get("BENCH_TOOLS", "100")) - have):
    pattern = f"^r{i}-[a-z0-9-]+$" if distinct else "^[a-z0-9-]+$"
    extra = f", f{i}" if distinct else ""
    text += f"""
  - name: lookup_record_{i:03d}
    title: Lookup record {i}
    description: Returns record {i} of a generated catalogue, used to load 100 tools.
    whenToUse: Benchmarks only.
    inputSchema:
      type: object
      additionalProperties: false
      required: [recordId]
      properties:
        recordId: {{type: string, pattern: "{pattern}"}}
        fields: {{type: array, items: {{type: string, enum: [id, name, plan, balance{extra}]}}}}
        verbose: {{type: boolean}}
    http: {{method: GET, path: "/customers/{{recordId}}", query: {{fields: "{{fields}}"}}}}
    response: {{pick: [/id, /name], redact: [/internalNotes]}}
"""
open(out, "w").write(text)
