import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";
import {
  AnswerLink,
  AnsweringClient,
  ConflictError,
  ForbiddenError,
  Gateway,
  GoneError,
  InvalidDataError,
  NotFoundError,
  PayloadTooLargeError,
  UnauthorizedError,
  refusalOf,
  section10,
  type Answer,
  type Event,
  type Request,
} from "../src/index.js";
import { GATEWAY_TOKEN, GATEWAY_URL, HTTP_URL, alice, bob, env, gateway, link, newId, shown } from "./env.js";

const FORM = {
  type: "object",
  properties: { name: { type: "string", minLength: 2 } },
  required: ["name"],
};

test("accept: a form's answer comes back with the §10 keys, answered as the token's person", async () => {
  const id = newId();
  const waiting = gateway.waitFor({ id, kind: "input", prompt: "Name?", data: { schema: FORM } });
  const request = await shown(id);
  assert.equal(request.queue, "ops");
  assert.equal(request.source.agent, "agent-7");
  assert.deepEqual(request.data, { schema: FORM });
  const { requests } = await alice.list({ kind: "input" });
  assert.ok(requests.some((r) => r.id === id));
  await assert.rejects(alice.accept(id, { name: "A" }), (error: unknown) => {
    assert.ok(error instanceof InvalidDataError);
    assert.equal(error.status, 422);
    assert.equal(error.field, "name");
    assert.equal(error.rule, "minLength");
    return true;
  });
  assert.deepEqual(await alice.accept(id, { name: "Ada" }), { outcome: "answered" });
  const answer = await waiting;
  assert.deepEqual(answer, { id, ok: true, data: { name: "Ada" }, bridge: { responder: answer.bridge?.responder, person: "http:alice" } });
  await assert.rejects(alice.decline(id), (error: unknown) => {
    assert.ok(error instanceof ConflictError || error instanceof NotFoundError, String(error));
    assert.ok(error.reason.length > 0);
    return true;
  });
});

test("the §10 Request's keys are exact: expiresAt, not expires_at (checked by tsc)", () => {
  // @ts-expect-error: expires_at is the answering API's key (Unix time), not the §10 Request's
  const wrong: Request = { id: "x", kind: "approval", prompt: "?", expires_at: 1 };
  const right: Request = { id: "x", kind: "approval", prompt: "?", expiresAt: "2030-01-01T00:00:00.000Z" };
  assert.notDeepEqual(wrong, right);
});

test("decline with a message: the agent gets reason declined", async () => {
  const id = newId();
  const waiting = gateway.waitFor({ id, kind: "approval", prompt: "Deploy?" });
  await shown(id);
  assert.deepEqual(await alice.decline(id, "not on a Friday"), { outcome: "answered" });
  const answer = await waiting;
  assert.equal(answer.ok, false);
  assert.equal(answer.reason, "declined");
  assert.equal(answer.data, "not on a Friday"); // the message, as §10 carries a denial's words
  assert.equal(refusalOf(answer), null);
});

test("expiry: nobody answers, the long poll holds on keep-alive spaces and ends expired", async () => {
  const bodies: string[] = [];
  const recording = new Gateway({
    url: GATEWAY_URL,
    token: GATEWAY_TOKEN,
    fetch: async (input, init) => {
      const response = await fetch(input, init);
      const text = await response.text();
      bodies.push(text);
      return new Response(text, { status: response.status, headers: response.headers });
    },
  });
  const id = newId();
  const expiresAt = new Date(Date.now() + 1500).toISOString();
  const answer = await recording.waitFor({ id, kind: "approval", prompt: "Deploy?", expiresAt });
  assert.deepEqual(answer, { id, ok: false, reason: "expired" });
  assert.equal(bodies.length, 1); // one long poll
  assert.match(bodies[0] ?? "", /^ {3,}\{/); // keep-alive spaces (every 0.2 s here), then the Answer
});

test("a short client timeout creates the wait then polls it (202 and ?wait=)", async () => {
  const seen: string[] = [];
  const recording = new Gateway({
    url: GATEWAY_URL,
    token: GATEWAY_TOKEN,
    requestTimeoutS: 2.5,
    fetch: async (input, init) => {
      const response = await fetch(input, init);
      seen.push(`${init?.method ?? "GET"} ${new URL(String(input)).search} ${response.status}`);
      return response;
    },
  });
  const id = newId();
  const waiting = recording.waitFor({ id, kind: "approval", prompt: "Deploy?" });
  await shown(id);
  await new Promise((resolve) => setTimeout(resolve, 1200)); // past the first call's wait
  await alice.accept(id);
  const answer = await waiting;
  assert.equal(answer.ok, true);
  assert.equal(seen[0], "POST ?wait=0.5 202");
  assert.ok(seen.slice(1).every((call) => call.startsWith("GET ?wait=0.5")), seen.join("; "));
  assert.equal(seen.at(-1), "GET ?wait=0.5 200");
});

test("abort: the AbortSignal withdraws the request, and a responder following events sees it gone", async () => {
  const { cursor } = await alice.list();
  const id = newId();
  const controller = new AbortController();
  const waiting = gateway.waitFor({ id, kind: "approval", prompt: "Deploy?" }, { signal: controller.signal });
  const following = new AbortController();
  const gone = (async (): Promise<Event> => {
    for await (const page of alice.follow({ after: cursor, waitS: 5, signal: following.signal })) {
      for (const event of page.events) {
        if (event.id !== id) continue;
        if (event.event === "shown") controller.abort(new Error("the user went away"));
        if (event.event === "gone") return event;
      }
    }
    throw new Error("the follow ended");
  })();
  await assert.rejects(waiting, { message: "the user went away" });
  const event = await gone;
  following.abort();
  assert.match(event.note, /withdrawn/i);
  await assert.rejects(alice.get(id), NotFoundError);
  const after = await gateway.poll(id);
  assert.equal(after?.reason, "cancelled");
  assert.equal(after?.bridge?.reason, "withdrawn");
});

test("a token scoped to another queue is refused, with the server's reason", async () => {
  const id = newId();
  const controller = new AbortController();
  const waiting = gateway.waitFor({ id, kind: "approval", prompt: "Deploy?" }, { signal: controller.signal });
  await shown(id);
  await assert.rejects(bob.get(id), (error: unknown) => error instanceof NotFoundError && error.status === 404);
  await assert.rejects(bob.accept(id), NotFoundError);
  await assert.rejects(bob.list({ queue: "ops" }), (error: unknown) => {
    assert.ok(error instanceof ForbiddenError);
    assert.match(error.reason, /ops/);
    return true;
  });
  const stranger = new AnsweringClient({ url: HTTP_URL, token: "not-a-token" });
  await assert.rejects(stranger.list(), UnauthorizedError);
  await assert.rejects(
    new Gateway({ url: GATEWAY_URL, token: "not-a-token" }).waitFor({ id: newId(), kind: "approval", prompt: "?" }),
    UnauthorizedError,
  );
  controller.abort();
  await assert.rejects(waiting);
});

test("an answer link answers once; used twice it is gone", async () => {
  const id = newId();
  const waiting = gateway.waitFor({ id, kind: "input", prompt: "Name?", data: { schema: FORM } });
  await shown(id);
  const answerLink = new AnswerLink(await link(id, "ada@example.com"));
  const described = await answerLink.describe();
  assert.equal(described.request.id, id);
  assert.equal(described.recipient, "ada@example.com");
  assert.equal(described.action, null);
  assert.deepEqual(await answerLink.accept({ name: "Ada" }), { outcome: "answered" });
  await assert.rejects(answerLink.decline("changed my mind"), (error: unknown) => {
    assert.ok(error instanceof GoneError);
    assert.match(error.reason, /used already/);
    return true;
  });
  const answer = await waiting;
  assert.deepEqual(answer.data, { name: "Ada" });
  assert.equal(answer.bridge?.person, "link:ada@example.com");
  const forged = new AnswerLink(answerLink.url.slice(0, -4) + "AAAA");
  await assert.rejects(forged.describe(), ForbiddenError);
});

function digest(name: string, args: Record<string, unknown>): string {
  // RFC 8785 canonical JSON of {name, arguments}: sorted keys (strings and integers only here)
  const sorted = Object.fromEntries(Object.entries(args).sort(([a], [b]) => (a < b ? -1 : 1)));
  const canonical = JSON.stringify({ arguments: sorted, name });
  return `sha256:${createHash("sha256").update(canonical).digest("hex")}`;
}

test("a tool-call approval with an edit: the agent runs the edited arguments", async () => {
  const id = newId("tool");
  const proposed = { to: "ACME", amount: 10 };
  const request = {
    id,
    kind: "tool_call",
    prompt: "Run the tool transfer?",
    data: {
      schema: {
        type: "object",
        properties: { to: { type: "string", default: "ACME" }, amount: { type: "integer", default: 10, maximum: 100 } },
      },
      tool_call: { name: "transfer", arguments: proposed, framework: "typescript", digest: digest("transfer", proposed) },
    },
  };
  const waiting = gateway.waitFor(request);
  const shownRequest = await shown(id);
  assert.equal(shownRequest.kind, "tool_call");
  await assert.rejects(alice.accept(id, { to: "ACME", amount: 1000 }), (error: unknown) => {
    assert.ok(error instanceof InvalidDataError);
    assert.equal(error.field, "amount");
    assert.equal(error.rule, "maximum");
    return true;
  });
  assert.deepEqual(await alice.accept(id, { to: "ACME", amount: 3 }), { outcome: "answered" });
  const answer: Answer = await waiting;
  assert.equal(answer.ok, true);
  assert.deepEqual(answer.data, { to: "ACME", amount: 3 });
});

test("a refusal surfaces as the gateway documents it", async () => {
  // agent-9's requests go to a responder that requires signatures: it refuses them unsigned
  const refused = new Gateway({ url: GATEWAY_URL, token: env("TOOLNEXUS_GATEWAY_REFUSED_TOKEN") });
  const id = newId("pnd");
  const expiresAt = new Date(Date.now() + 60_000).toISOString();
  const answer = await refused.waitFor({ id, kind: "approval", prompt: "Deploy?", expiresAt });
  // {"id","ok":false,"reason":"cancelled","bridge":{"reason":"withdrawn","refused":...,"responder":...}}
  assert.deepEqual(Object.keys(answer), ["id", "ok", "reason", "bridge"]);
  assert.deepEqual([answer.id, answer.ok, answer.reason, answer.bridge?.reason], [id, false, "cancelled", "withdrawn"]);
  const refusal = refusalOf(answer);
  assert.ok(refusal !== null);
  assert.match(refusal.refused, /signature|signed/);
  assert.equal(typeof refusal.responder, "string");
  assert.deepEqual(section10(answer), { id, ok: false, reason: "cancelled" });
  assert.equal(refusalOf({ id, ok: false, reason: "cancelled", bridge: { reason: "withdrawn" } }), null);
});

test("the gateway's own failures: another question under a used id (409), a body over 1 MiB (413)", async () => {
  const id = newId();
  const controller = new AbortController();
  const waiting = gateway.waitFor({ id, kind: "approval", prompt: "Deploy?" }, { signal: controller.signal });
  await shown(id);
  await assert.rejects(gateway.waitFor({ id, kind: "approval", prompt: "Delete?" }), (error: unknown) => {
    assert.ok(error instanceof ConflictError);
    assert.match(error.reason, /already being waited for/);
    return true;
  });
  const huge = { id: newId(), kind: "approval", prompt: "x".repeat(1_100_000) };
  await assert.rejects(gateway.waitFor(huge), PayloadTooLargeError);
  controller.abort();
  await assert.rejects(waiting);
});
