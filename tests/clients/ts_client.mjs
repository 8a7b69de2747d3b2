// Full 2025-era sessions with the official MCP TypeScript SDK (@modelcontextprotocol/sdk,
// pinned in tests/clients/ts-sdk/): connect (initialize + notifications/initialized), list
// tools, call a read and a write tool several times, end the session with DELETE, and check
// that the ended id is refused. Run by tests/clients/replicas.sh against a load balancer in
// front of several proxy replicas, so consecutive requests of one session land on different
// replicas.
//
// Environment: TOOLGATE_MCP_URL (required), TS_SDK_MODULES (the node_modules folder of the
// pinned SDK), ROUNDS (sessions to run, default 3), CALLS (calls of each tool per session,
// default 4).
import { pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const modules = process.env.TS_SDK_MODULES;
const url = process.env.TOOLGATE_MCP_URL;
assert.ok(modules && url, "TS_SDK_MODULES and TOOLGATE_MCP_URL are required");
const sdk = (path) => import(pathToFileURL(`${modules}/@modelcontextprotocol/sdk/dist/esm/${path}`).href);
const { Client } = await sdk("client/index.js");
const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");

const rounds = Number(process.env.ROUNDS ?? 3);
const calls = Number(process.env.CALLS ?? 4);

function envelope(result) {
  assert.equal(result.content.length, 1, "one content block");
  assert.equal(result.content[0].type, "text");
  return JSON.parse(result.content[0].text);
}

let total = 0;
for (let round = 0; round < rounds; round++) {
  const transport = new StreamableHTTPClientTransport(new URL(url));
  const client = new Client({ name: "toolgate-ts-sdk-test", version: "1.0.0" });
  await client.connect(transport);
  const id = transport.sessionId;
  assert.ok(id, "the server issued a session id");
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  assert.ok(names.includes("get_customer") && names.includes("create_ticket"), names.join(","));
  for (let i = 0; i < calls; i++) {
    const read = envelope(await client.callTool({ name: "get_customer", arguments: { customerId: "42" } }));
    assert.equal(read.ok, true, JSON.stringify(read));
    assert.equal(read.status, "success");
    assert.equal(read.data.id, "42");
    const write = envelope(
      await client.callTool({ name: "create_ticket", arguments: { customerId: "42", subject: `ts round ${round} call ${i}` } }),
    );
    assert.equal(write.ok, true, JSON.stringify(write));
    assert.match(String(write.data.ticketId), /\S/, "a verifiable ticket id");
    total += 2;
  }
  await transport.terminateSession();
  assert.equal(transport.sessionId, undefined, "the SDK forgot the ended session");
  await client.close();
  // The ended id is refused wherever the next request lands.
  for (let i = 0; i < 3; i++) {
    const r = await fetch(url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        "mcp-session-id": id,
        "mcp-protocol-version": "2025-06-18",
      },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }),
    });
    assert.equal(r.status, 404, `an ended session answers 404 (got ${r.status})`);
  }
}
console.log(`ts-sdk: ${rounds} sessions, ${total} tool calls, every ended session refused`);
