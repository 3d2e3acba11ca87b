// Drives `capsem mcp --http` (the host MCP server over streamable HTTP) with
// the official TypeScript MCP SDK client: the catalog with its schemas, and
// calls that need no VM, printing one JSON report.
// Usage: node http.mjs <url> [<bearer-token>]
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token] = process.argv.slice(2);
const requestInit = token ? { headers: { Authorization: `Bearer ${token}` } } : undefined;
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit });
const client = new Client({ name: "ts-http-e2e", version: "1.0.0" });
await client.connect(transport);
const report = {
  serverVersion: client.getServerVersion(),
  sessionId: transport.sessionId ?? null,
  protocolVersion: transport.protocolVersion ?? null,
  instructions: client.getInstructions(),
};
const tools = (await client.listTools()).tools;
report.tools = tools.map((t) => ({
  name: t.name,
  inputType: t.inputSchema?.type ?? null,
  outputType: t.outputSchema?.type ?? null,
  annotated: !!t.annotations,
}));
const call = async (name, args) => {
  const r = await client.callTool({ name, arguments: args });
  return { isError: !!r.isError, structured: r.structuredContent ?? null, text: r.content.map((c) => c.text).join("") };
};
report.version = (await call("capsem_version", {})).structured;
report.list = (await call("capsem_list", {})).structured;
report.unknown = await call("capsem_info", { id: "no-such-vm" });
// Ends the session on the server (DELETE).
await transport.terminateSession();
await client.close();
console.log(JSON.stringify(report));
