// Drives `capsem mcp` (the host MCP server) with the official TypeScript MCP
// SDK client over stdio, the way Claude Code does: a VM's lifecycle, exec,
// files, inspect and an error, printing one JSON report.
// Usage: node host.mjs <path-to-capsem>
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const capsem = process.argv[2];
const transport = new StdioClientTransport({ command: capsem, args: ["mcp"], env: process.env, stderr: "inherit" });
const client = new Client({ name: "ts-host-e2e", version: "1.0.0" });
await client.connect(transport);
const call = async (name, args) => {
  const r = await client.callTool({ name, arguments: args }, undefined, { timeout: 300000 });
  return { isError: !!r.isError, structured: r.structuredContent ?? null, text: r.content.map((c) => c.text).join("") };
};
const report = { serverVersion: client.getServerVersion(), instructions: client.getInstructions() };
const tools = (await client.listTools()).tools;
report.tools = tools.map((t) => t.name).sort();
report.allHaveOutputSchemas = tools.every((t) => t.outputSchema && t.annotations);
report.version = (await call("capsem_version", {})).structured;
const created = await call("capsem_create", { name: "ts-vm", ramMb: 512, cpuCount: 1 });
report.created = created.structured;
report.exec = (await call("capsem_exec", { id: "ts-vm", command: "echo from-ts; echo oops >&2; exit 7" })).structured;
await call("capsem_write_file", { id: "ts-vm", path: "/root/workspace/ts.txt", content: "ünïcode\n" });
report.read = (await call("capsem_read_file", { id: "ts-vm", path: "/root/workspace/ts.txt" })).structured;
report.rows = (await call("capsem_inspect", { id: "ts-vm", sql: "SELECT command FROM exec_events ORDER BY timestamp" })).structured;
report.unknown = await call("capsem_info", { id: "no-such-vm" });
report.deleted = (await call("capsem_delete", { id: "ts-vm" })).structured;
report.after = (await call("capsem_list", {})).structured;
await client.close();
console.log(JSON.stringify(report));
