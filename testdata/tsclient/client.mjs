// Connects the official TypeScript MCP SDK client to capsem-mcp-server (the
// relay) over stdio, exercises the gateway and prints one JSON report.
// Usage: node client.mjs <path-to-capsem-mcp-server>
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const relay = process.argv[2];
const transport = new StdioClientTransport({ command: relay, env: process.env, stderr: "inherit" });
const client = new Client({ name: "ts-e2e", version: "1.0.0" });
await client.connect(transport);
const report = {
  serverVersion: client.getServerVersion(),
  protocolVersion: transport._protocolVersion ?? null,
  instructions: client.getInstructions(),
};
report.tools = (await client.listTools()).tools.map((t) => t.name).sort();
const echo = await client.callTool({ name: "everything__echo", arguments: { message: "from typescript" } });
report.echo = echo.content.map((c) => c.text).join("");
report.prompts = (await client.listPrompts()).prompts.map((p) => p.name).sort();
const resources = (await client.listResources()).resources;
report.resourceCount = resources.length;
const read = await client.readResource({ uri: resources[0].uri });
report.readContents = read.contents.length;
try {
  await client.callTool({ name: "everything__no-such-tool", arguments: {} });
  report.unknownTool = "no error";
} catch (e) {
  report.unknownTool = String(e.message);
}
await client.close();
console.log(JSON.stringify(report));
