// What the Python wrapper (tests/test_typescript_client.py) started: the servers' URLs and tokens.
import { randomUUID } from "node:crypto";
import { AnsweringClient, Gateway, NotFoundError, type OpenRequest } from "../src/index.js";

export function env(name: string): string {
  const value = process.env[name];
  if (value === undefined) throw new Error(`$${name} is not set: run tests/test_typescript_client.py`);
  return value;
}

export const GATEWAY_URL = env("TOOLNEXUS_GATEWAY_URL");
export const GATEWAY_TOKEN = env("TOOLNEXUS_GATEWAY_TOKEN");
export const HTTP_URL = env("TOOLNEXUS_HTTP_URL");
export const MINT_URL = env("TOOLNEXUS_MINT_URL");

export const gateway = new Gateway({ url: GATEWAY_URL, token: GATEWAY_TOKEN });
/** alice: may use queue ops, where the gateway's agents ask. */
export const alice = new AnsweringClient({ url: HTTP_URL, token: env("TOOLNEXUS_HTTP_TOKEN") });
/** bob: may use queue billing only. */
export const bob = new AnsweringClient({ url: HTTP_URL, token: env("TOOLNEXUS_HTTP_OTHER_TOKEN") });

export function newId(prefix = "ts"): string {
  return `${prefix}-${randomUUID()}`;
}

/** Request `id` as the answering API shows it, once it does. */
export async function shown(id: string, client: AnsweringClient = alice): Promise<OpenRequest> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      return await client.get(id);
    } catch (error) {
      if (!(error instanceof NotFoundError) || Date.now() > deadline) throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** An answer link to open request `id` of queue ops, sent to `recipient`. */
export async function link(id: string, recipient: string): Promise<string> {
  const response = await fetch(`${MINT_URL}/ops/${id}/${recipient}`);
  const text = await response.text();
  if (!response.ok) throw new Error(text);
  return text;
}
