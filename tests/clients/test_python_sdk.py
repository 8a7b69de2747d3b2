"""Real-client tests: the official MCP Python SDK (and raw HTTP) against a running toolgate-proxy.

The proxy must be running with example/proxy.yaml in front of the example REST service
(tests/clients/run.sh sets that up). The MCP endpoint comes from TOOLGATE_MCP_URL, e.g.
http://127.0.0.1:8080/mcp; without it every test fails (never skips).

SDK: mcp 2.3.0 (pinned in requirements.txt). Its API, as used here:
  - mcp.client.streamable_http.streamable_http_client(url) -> (read_stream, write_stream)
  - mcp.ClientSession(read, write); session.initialize() offers
    mcp_types.version.LATEST_HANDSHAKE_VERSION (2025-11-25); the SDK's LATEST_PROTOCOL_VERSION
    is 2026-07-28, which is only reachable through the new server/discover probe, not initialize.
  - to offer an older revision we do the same handshake by hand: send_request(InitializeRequest),
    session.adopt(result), send_notification(InitializedNotification) -- what initialize() does.
  - JSON-RPC errors raise mcp.shared.exceptions.MCPError (.error.code/.message/.data).
  - Typed results use snake_case attributes; assertions here look at the wire (camelCase) form.

Toolgate rules checked here (see the proxy's docs): every tools/call result is one text block
holding a JSON envelope {ok, status, data, errors, nextQuestion, toolName, safety, durationMs},
mirrored in structuredContent. Argument validation errors are JSON-RPC -32602 errors on
2025-03-26/2025-06-18, and tool results with isError true and status "needs_more_info" on
2025-11-25 (where the spec moved input validation errors into tool execution errors).
Unknown tools are -32602 on every version.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import mcp_types.version as mcp_versions
import pytest
from mcp import Client, ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPError

pytestmark = pytest.mark.anyio  # async tests run on asyncio (fixture below); sync tests are unaffected

INVALID_PARAMS = -32602
ENVELOPE_FIELDS = {"ok", "status", "data", "errors", "nextQuestion", "toolName", "safety", "durationMs"}
EXPECTED_TOOLS = {"get_customer", "search_customers", "create_ticket"}
SERVER_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
# The revision the SDK's own initialize() offers (2.x: LATEST_HANDSHAKE_VERSION; 1.x had only
# LATEST_PROTOCOL_VERSION, which was also what it offered).
SDK_OFFERED_VERSION = getattr(mcp_versions, "LATEST_HANDSHAKE_VERSION", types.LATEST_PROTOCOL_VERSION)
REQUEST_TIMEOUT_S = 30


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def mcp_url() -> str:
    url = os.environ.get("TOOLGATE_MCP_URL", "").strip()
    if not url:
        pytest.fail("TOOLGATE_MCP_URL is not set: point it at a running toolgate-proxy, e.g. http://127.0.0.1:8080/mcp")
    return url


# ---------------------------------------------------------------------------------------------
# helpers


@asynccontextmanager
async def mcp_session(offer: str | None = None) -> AsyncIterator[tuple[ClientSession, types.InitializeResult]]:
    """An initialized SDK session. offer=None: the SDK's own handshake; else offer that revision."""
    async with streamable_http_client(mcp_url()) as (read_stream, write_stream):
        async with ClientSession(read_stream, write_stream, read_timeout_seconds=REQUEST_TIMEOUT_S) as session:
            if offer is None:
                init = await session.initialize()
            else:
                init = await session.send_request(
                    types.InitializeRequest(
                        params=types.InitializeRequestParams(
                            protocol_version=offer,
                            capabilities=types.ClientCapabilities(),
                            client_info=types.Implementation(name="toolgate-client-tests", version="0"),
                        )
                    ),
                    types.InitializeResult,
                )
                session.adopt(init)
                await session.send_notification(types.InitializedNotification())
            yield session, init


def wire(model: Any) -> dict[str, Any]:
    """A typed SDK object as it looked on the wire (camelCase keys)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def all_tools(session: ClientSession) -> dict[str, dict[str, Any]]:
    tools: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        for tool in page.tools:
            tools[tool.name] = wire(tool)
        cursor = page.next_cursor
        if not cursor:
            return tools


def single_text_envelope(result: types.CallToolResult) -> dict[str, Any]:
    """The result's only content block: text holding the JSON envelope. Returns it parsed."""
    blocks = [wire(block) for block in result.content]
    assert len(blocks) == 1, f"expected exactly one content block, got {blocks}"
    assert blocks[0]["type"] == "text", blocks[0]
    envelope = json.loads(blocks[0]["text"])
    assert isinstance(envelope, dict), envelope
    assert ENVELOPE_FIELDS <= envelope.keys(), f"envelope lacks {ENVELOPE_FIELDS - envelope.keys()}: {envelope}"
    return envelope


async def invalid_params_error(session: ClientSession, tool: str, arguments: dict[str, Any]) -> types.ErrorData:
    """Calls the tool expecting a JSON-RPC -32602 error (not a tool result); returns the error."""
    with pytest.raises(MCPError) as raised:
        result = await session.call_tool(tool, arguments)
        pytest.fail(f"expected JSON-RPC error {INVALID_PARAMS}, got a result: {wire(result)}")
    error = raised.value.error
    assert error.code == INVALID_PARAMS, f"expected code {INVALID_PARAMS}, got {wire(error)}"
    return error


def error_messages(error: types.ErrorData) -> list[str]:
    messages = [error.message]
    if isinstance(error.data, dict):
        messages += [e.get("message", "") for e in error.data.get("errors", []) if isinstance(e, dict)]
    return messages


# ---------------------------------------------------------------------------------------------
# handshake


async def test_initialize_negotiates_the_version_the_sdk_offers_and_names_toolgate():
    assert SDK_OFFERED_VERSION in SERVER_VERSIONS, f"pinned SDK offers {SDK_OFFERED_VERSION}; update these tests"
    async with mcp_session() as (session, init):
        assert init.protocol_version == SDK_OFFERED_VERSION
        assert session.protocol_version == SDK_OFFERED_VERSION
        assert init.server_info.name == "toolgate"


@pytest.mark.parametrize("version", ["2025-06-18", "2025-03-26"])
async def test_initialize_negotiates_an_older_supported_version_when_offered(version: str):
    async with mcp_session(offer=version) as (_, init):
        assert init.protocol_version == version
        assert init.server_info.name == "toolgate"


async def test_capabilities_are_tools_only():
    async with mcp_session() as (_, init):
        capabilities = wire(init.capabilities)
        assert "tools" in capabilities, capabilities
        for absent in ("resources", "prompts", "logging", "completions"):
            assert absent not in capabilities, f"unexpected capability {absent!r}: {capabilities}"


# ---------------------------------------------------------------------------------------------
# tools/list


async def test_list_tools_includes_the_example_tools_with_object_input_schemas():
    async with mcp_session() as (session, _):
        tools = await all_tools(session)
    assert EXPECTED_TOOLS <= tools.keys(), f"missing {EXPECTED_TOOLS - tools.keys()} in {sorted(tools)}"
    for name, tool in tools.items():
        assert tool["inputSchema"].get("type") == "object", f"{name}: {tool['inputSchema']}"


async def test_get_customer_description_has_a_when_to_use_section():
    async with mcp_session() as (session, _):
        tools = await all_tools(session)
    assert "When to use:" in tools["get_customer"].get("description", ""), tools["get_customer"]


async def test_every_tool_declares_the_envelope_as_output_schema():
    async with mcp_session() as (session, _):
        tools = await all_tools(session)
    for name, tool in tools.items():
        schema = tool.get("outputSchema")
        assert schema is not None, f"{name} has no outputSchema"
        assert schema.get("type") == "object", f"{name}: {schema}"
        missing = ENVELOPE_FIELDS - set(schema.get("properties", {}))
        assert not missing, f"{name}: outputSchema lacks properties {missing}"


# ---------------------------------------------------------------------------------------------
# tools/call: results


async def test_get_customer_returns_a_success_envelope_mirrored_in_structured_content():
    async with mcp_session() as (session, _):
        # The SDK also validates structuredContent against the tool's outputSchema here.
        result = await session.call_tool("get_customer", {"customerId": "42"})
    assert result.is_error is False, wire(result)
    envelope = single_text_envelope(result)
    assert envelope["ok"] is True
    assert envelope["status"] == "success"
    assert envelope["toolName"] == "get_customer"
    assert envelope["safety"] == "read_only"
    assert envelope["data"]["id"] == "42"
    assert "name" in envelope["data"]
    assert result.structured_content == envelope


async def test_get_customer_redacts_internal_notes():
    async with mcp_session() as (session, _):
        result = await session.call_tool("get_customer", {"customerId": "42"})
    envelope = single_text_envelope(result)
    assert "internalNotes" not in envelope["data"], envelope["data"]
    assert "internalNotes" not in json.dumps(result.structured_content)


async def test_get_unknown_customer_is_a_tool_error_asking_a_next_question():
    async with mcp_session() as (session, _):
        result = await session.call_tool("get_customer", {"customerId": "404404"})
    assert result.is_error is True, wire(result)
    envelope = single_text_envelope(result)
    assert envelope["ok"] is False
    assert envelope["status"] == "needs_more_info"
    assert isinstance(envelope["nextQuestion"], str) and envelope["nextQuestion"].strip(), envelope


async def test_create_ticket_returns_the_new_ticket_id():
    async with mcp_session() as (session, _):
        result = await session.call_tool(
            "create_ticket", {"customerId": "42", "subject": "Broken router", "priority": "high"}
        )
    assert result.is_error is False, wire(result)
    envelope = single_text_envelope(result)
    assert envelope["ok"] is True
    assert envelope["status"] == "success"
    assert envelope["toolName"] == "create_ticket"
    assert isinstance(envelope["data"]["ticketId"], str) and envelope["data"]["ticketId"], envelope["data"]
    assert result.structured_content == envelope


# ---------------------------------------------------------------------------------------------
# tools/call: argument errors (protocol 2025-06-18 -> JSON-RPC -32602)


async def test_missing_required_argument_is_invalid_params_naming_the_field():
    async with mcp_session(offer="2025-06-18") as (session, _):
        error = await invalid_params_error(session, "get_customer", {})
    assert isinstance(error.data, dict) and error.data.get("field") == "customerId", wire(error)


async def test_object_where_a_string_is_expected_is_invalid_params():
    async with mcp_session(offer="2025-06-18") as (session, _):
        await invalid_params_error(session, "get_customer", {"customerId": {"a": 1}})


async def test_json_text_where_an_object_is_expected_is_invalid_params_that_says_so():
    async with mcp_session(offer="2025-06-18") as (session, _):
        error = await invalid_params_error(
            session,
            "create_ticket",
            {"customerId": "42", "subject": "Broken router", "priority": "high", "metadata": '{"a":1}'},
        )
    messages = error_messages(error)
    assert any("string" in m.lower() and "json" in m.lower() for m in messages), (
        f"no message says the value is a string containing JSON: {wire(error)}"
    )


@pytest.mark.parametrize("offer", ["2025-06-18", None], ids=["2025-06-18", "sdk-default"])
async def test_unknown_tool_is_invalid_params(offer: str | None):
    async with mcp_session(offer=offer) as (session, _):
        await invalid_params_error(session, "no_such_tool", {})


# ---------------------------------------------------------------------------------------------
# raw Streamable HTTP, protocol 2025-11-25


class RawMcp:
    """Minimal hand-written Streamable HTTP client, to see exactly what goes over the wire."""

    def __init__(self, http: httpx.Client, version: str):
        self.http = http
        self.version = version
        self.session_id: str | None = None
        self.next_id = 1

    def headers(self) -> dict[str, str]:
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": self.version,
        }
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        return headers

    def post(self, message: dict[str, Any]) -> httpx.Response:
        return self.http.post(mcp_url(), headers=self.headers(), content=json.dumps(message))

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Sends a request; returns the JSON-RPC response object with the same id."""
        request_id = self.next_id
        self.next_id += 1
        response = self.post({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        assert response.status_code == 200, f"{method}: HTTP {response.status_code} {response.text}"
        for message in self.messages_in(response):
            if message.get("id") == request_id and ("result" in message or "error" in message):
                return message
        pytest.fail(f"{method}: no JSON-RPC response with id {request_id} in {response.text!r}")

    @staticmethod
    def messages_in(response: httpx.Response) -> list[dict[str, Any]]:
        content_type = response.headers.get("content-type", "")
        if content_type.startswith("application/json"):
            body = response.json()
            return body if isinstance(body, list) else [body]
        assert content_type.startswith("text/event-stream"), f"unexpected Content-Type {content_type!r}"
        messages = []
        for event in response.text.replace("\r\n", "\n").split("\n\n"):
            data = "\n".join(line[5:].lstrip(" ") for line in event.split("\n") if line.startswith("data:"))
            if data:
                messages.append(json.loads(data))
        return messages

    def initialize(self) -> dict[str, Any]:
        request_id = self.next_id
        self.next_id += 1
        response = self.post(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "initialize",
                "params": {
                    "protocolVersion": self.version,
                    "capabilities": {},
                    "clientInfo": {"name": "toolgate-raw-http-test", "version": "0"},
                },
            }
        )
        assert response.status_code == 200, f"initialize: HTTP {response.status_code} {response.text}"
        self.session_id = response.headers.get("mcp-session-id")
        assert self.session_id, f"initialize response has no Mcp-Session-Id header: {dict(response.headers)}"
        (message,) = [m for m in self.messages_in(response) if m.get("id") == request_id]
        assert "result" in message, message
        return message["result"]


@pytest.fixture
def http() -> httpx.Client:
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        yield client


def test_raw_2025_11_25_invalid_arguments_are_a_tool_result_with_needs_more_info(http: httpx.Client):
    mcp = RawMcp(http, "2025-11-25")
    init = mcp.initialize()
    assert init["protocolVersion"] == "2025-11-25", init

    initialized = mcp.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert initialized.status_code == 202, f"HTTP {initialized.status_code} {initialized.text!r}"
    assert initialized.content == b"", f"202 must have an empty body, got {initialized.content!r}"

    response = mcp.request("tools/call", {"name": "get_customer", "arguments": {}})
    assert "result" in response, f"expected a result (2025-11-25 reports input errors as tool errors): {response}"
    result = response["result"]
    assert result.get("isError") is True, result
    (block,) = result["content"]
    assert block["type"] == "text", block
    envelope = json.loads(block["text"])
    assert envelope["status"] == "needs_more_info", envelope
    assert envelope["errors"][0]["field"] == "customerId", envelope


def test_raw_get_on_the_mcp_endpoint_is_405(http: httpx.Client):
    mcp = RawMcp(http, "2025-11-25")
    mcp.initialize()
    response = http.get(mcp_url(), headers={**mcp.headers(), "Accept": "text/event-stream"})
    assert response.status_code == 405, f"HTTP {response.status_code} {response.text!r}"


def test_raw_delete_ends_the_session_and_later_requests_get_404(http: httpx.Client):
    mcp = RawMcp(http, "2025-11-25")
    mcp.initialize()
    assert mcp.post({"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
    assert "result" in mcp.request("tools/list", {})

    deleted = http.delete(mcp_url(), headers=mcp.headers())
    assert 200 <= deleted.status_code < 300, f"DELETE: HTTP {deleted.status_code} {deleted.text!r}"

    after = mcp.post({"jsonrpc": "2.0", "id": 99, "method": "tools/list", "params": {}})
    assert after.status_code == 404, f"request on an ended session: HTTP {after.status_code} {after.text!r}"


# ---------------------------------------------------------------------------------------------
# 2026-07-28, the main path: the SDK's Client in mode="auto" probes server/discover and stays
# stateless (no initialize, no Mcp-Session-Id); mode="legacy" is the handshake tested above.

MODERN = "2026-07-28"


@asynccontextmanager
async def modern_client(mode: str = "auto") -> AsyncIterator[Client]:
    async with Client(mcp_url(), mode=mode, read_timeout_seconds=REQUEST_TIMEOUT_S) as client:
        yield client


async def test_auto_mode_negotiates_2026_07_28_through_server_discover():
    async with modern_client() as client:
        assert client.protocol_version == MODERN, client.protocol_version
        assert client.server_info is not None and client.server_info.name == "toolgate"
        capabilities = wire(client.server_capabilities)
        assert capabilities.get("tools", {}).get("listChanged") is True, capabilities


async def test_auto_mode_lists_and_calls_tools_and_sees_the_envelope():
    async with modern_client() as client:
        listed = await client.list_tools()
        names = {t.name for t in listed.tools}
        assert EXPECTED_TOOLS <= names, f"missing {EXPECTED_TOOLS - names}"
        assert wire(listed).get("ttlMs") is not None, wire(listed)
        result = await client.call_tool("get_customer", {"customerId": "42"})
        assert result.is_error is False, wire(result)
        envelope = single_text_envelope(result)
        assert envelope["status"] == "success" and envelope["ok"] is True, envelope
        assert wire(result)["structuredContent"] == envelope


async def test_auto_mode_invalid_arguments_are_a_tool_result_the_model_can_read():
    async with modern_client() as client:
        result = await client.call_tool("get_customer", {"customerId": {"id": "42"}})
    assert result.is_error is True, wire(result)
    envelope = single_text_envelope(result)
    assert envelope["status"] == "needs_more_info", envelope
    assert envelope["errors"][0]["field"] == "customerId", envelope


async def test_a_listener_hears_tools_list_changed_after_a_config_edit():
    path = os.environ.get("TOOLGATE_CONFIG_PATH", "").strip()
    if not path:
        pytest.fail("TOOLGATE_CONFIG_PATH is not set: tests/clients/run.sh points it at the proxy's config file")
    original = open(path, encoding="utf-8").read()
    marker = "description: Returns one customer's profile and balance by customer id."
    assert marker in original, "example/proxy.yaml changed; update this test's marker"
    async with modern_client() as client:
        async with client.listen(tools_list_changed=True) as sub:
            try:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original.replace(marker, marker + " Edited while a client listens."))
                with anyio.fail_after(15):
                    async for event in sub:
                        assert isinstance(event, ToolsListChanged), event
                        break
                listed = await client.list_tools(cache_mode="refresh")
                (edited,) = [t for t in listed.tools if t.name == "get_customer"]
                assert "Edited while a client listens." in (edited.description or ""), edited
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original)


async def test_legacy_mode_still_speaks_a_2025_revision():
    async with modern_client(mode="legacy") as client:
        assert client.protocol_version in SERVER_VERSIONS, client.protocol_version
        result = await client.call_tool("get_customer", {"customerId": "42"})
        assert single_text_envelope(result)["status"] == "success"
