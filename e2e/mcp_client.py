"""One MCP session with the official Python SDK, for the operator end-to-end test.

usage: python mcp_client.py URL [TOOL ARGUMENTS_JSON]

Initializes, lists every tool and, when TOOL is given, calls it with ARGUMENTS_JSON. Prints one
JSON object on stdout: {"protocolVersion", "serverName", "tools": {name: description},
"call": {"isError", "envelope"}} (call only with TOOL). Exits non-zero on any protocol error.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client


async def main(url: str, tool: str | None, arguments: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with streamable_http_client(url) as (read_stream, write_stream):
        async with ClientSession(read_stream, write_stream, read_timeout_seconds=15) as session:
            init = await session.initialize()
            out["protocolVersion"] = init.protocol_version
            out["serverName"] = init.server_info.name
            tools: dict[str, str] = {}
            cursor = None
            while True:
                page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
                for t in page.tools:
                    tools[t.name] = t.description or ""
                cursor = page.next_cursor
                if not cursor:
                    break
            out["tools"] = tools
            if tool:
                result = await session.call_tool(tool, arguments)
                blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content]
                assert len(blocks) == 1 and blocks[0]["type"] == "text", blocks
                out["call"] = {"isError": bool(result.is_error), "envelope": json.loads(blocks[0]["text"])}
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    tool = sys.argv[2] if len(sys.argv) == 4 else None
    args = json.loads(sys.argv[3]) if tool else {}
    print(json.dumps(asyncio.run(main(sys.argv[1], tool, args))))
