// The drop-in waitFor for the toolnexus toolkit's JavaScript port, in an agent loop shaped like
// the port's: a tool returns pending(request), the loop waits, the tool runs again with the answer.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { gatewayWaitFor, type Answer, type Request } from "../src/index.js";
import { GATEWAY_TOKEN, GATEWAY_URL, alice, shown } from "./env.js";

type ToolkitAnswer = Omit<Answer, "bridge">;
interface ToolContext {
  answer?: ToolkitAnswer;
}
interface Pending {
  pending: Request;
}
type Tool = (args: Record<string, unknown>, ctx: ToolContext) => Promise<string | Pending>;

function pending(request: Omit<Request, "id"> & { id?: string }): Pending {
  return { pending: { id: request.id ?? `pnd-${randomUUID()}`, ...request } };
}

/** The port's loop for one tool call: a pending result waits; an ok answer runs the tool again. */
async function runToolCall(
  tool: Tool,
  args: Record<string, unknown>,
  waitFor: (request: Request) => Promise<ToolkitAnswer>,
): Promise<string> {
  const first = await tool(args, {});
  if (typeof first === "string") return first;
  const answer = await waitFor(first.pending);
  if (!answer.ok) return `not run: ${answer.reason ?? "declined"}`;
  const again = await tool(args, { answer });
  if (typeof again !== "string") throw new Error("the tool asked again");
  return again;
}

// the toolkit's client takes this as its waitFor:
//   createClient({ ..., waitFor: gatewayWaitFor({ url: GATEWAY_URL, token: GATEWAY_TOKEN }) })
const waitFor = gatewayWaitFor({ url: GATEWAY_URL, token: GATEWAY_TOKEN });

function deployTool(executions: unknown[], ids: string[]): Tool {
  return async (args, ctx) => {
    executions.push(ctx.answer?.data ?? null);
    if (ctx.answer === undefined) {
      const request = pending({
        kind: "approval",
        prompt: `Deploy to ${String(args.environment)}?`,
        expiresAt: new Date(Date.now() + 30_000).toISOString(),
      });
      ids.push(request.pending.id);
      return request;
    }
    const data = ctx.answer.data as { ticket: string };
    return `deployed to ${String(args.environment)} (ticket ${data.ticket})`;
  };
}

test("toolkit loop: an approved tool runs again with the answer", async () => {
  const executions: unknown[] = [];
  const ids: string[] = [];
  const running = runToolCall(deployTool(executions, ids), { environment: "prod" }, async (request) => {
    const answer = await waitFor(request);
    assert.deepEqual(Object.keys(answer), ["id", "ok", "data"]); // the §10 keys only
    return answer;
  });
  while (ids.length === 0) await new Promise((resolve) => setTimeout(resolve, 10));
  const [id] = ids;
  assert.ok(id !== undefined);
  await shown(id);
  await alice.accept(id, { ticket: "CHG-1" });
  assert.equal(await running, "deployed to prod (ticket CHG-1)");
  assert.deepEqual(executions, [null, { ticket: "CHG-1" }]);
});

test("toolkit loop: a declined tool is not run", async () => {
  const executions: unknown[] = [];
  const ids: string[] = [];
  const running = runToolCall(deployTool(executions, ids), { environment: "prod" }, waitFor);
  while (ids.length === 0) await new Promise((resolve) => setTimeout(resolve, 10));
  await shown(ids[0] ?? "");
  await alice.decline(ids[0] ?? "", "not on a Friday");
  assert.equal(await running, "not run: declined");
  assert.deepEqual(executions, [null]);
});
