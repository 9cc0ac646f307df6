// waitFor for agents, through the wait gateway (`toolnexus worker gateway`).
import type { components } from "./generated/gateway.js";
import { NotFoundError, ToolnexusError, errorOf, isObject } from "./errors.js";

type Schemas = components["schemas"];

/** The §10 Request, with its exact keys (`expiresAt`: ISO 8601 with a time zone). */
export type Request = Omit<Schemas["Request"], "data"> & { data?: Record<string, unknown> };

/** What the §10 keys cannot say (a toolkit port ignores it): who answered, a refusal. */
export type Bridge = NonNullable<Schemas["Answer"]["bridge"]>;

/** The §10 Answer as the gateway sends it: its exact keys, and `bridge` beside them. */
export type Answer = Omit<Schemas["Answer"], "data"> & { data?: unknown };

/** A responder's refusal of the request itself, as the gateway reports it. */
export interface Refusal {
  /** The responder's reason: `bad signature`, a key it does not trust, bytes it cannot read. */
  refused: string;
  /** The responder that refused. */
  responder: string | null;
}

export interface GatewayOptions {
  /** The gateway's base URL, e.g. `http://127.0.0.1:8710`. */
  url: string;
  /** The bearer token that names the agent (none: the gateway's `--agent`). */
  token?: string | undefined;
  /**
   * The longest one HTTP call may last here, in seconds: a platform's or a proxy's limit.
   * Given, a wait is created then polled (`?wait=`) in calls a little shorter than it;
   * not given, a wait is one long poll (the gateway's keep-alive spaces hold it open).
   */
  requestTimeoutS?: number | undefined;
  /** The `fetch` to use (the global one by default). */
  fetch?: typeof fetch | undefined;
}

export interface WaitOptions {
  /** Aborting it withdraws the request (`DELETE`) and rejects with the signal's reason. */
  signal?: AbortSignal | undefined;
}

/** `answer`'s refusal, if a responder refused the request itself (then `reason` is `cancelled`). */
export function refusalOf(answer: Answer): Refusal | null {
  const refused = answer.bridge?.refused;
  if (answer.ok || typeof refused !== "string") return null;
  return { refused, responder: answer.bridge?.responder ?? null };
}

/** The §10 Answer keys only (`id`, `ok`, `data`, `reason`), as a toolkit port's Answer holds them. */
export function section10(answer: Answer): Omit<Answer, "bridge"> {
  const { id, ok, data, reason } = answer;
  return { id, ok, ...(data === undefined ? {} : { data }), ...(reason === undefined ? {} : { reason }) };
}

const MARGIN_S = 2; // a polling call ends this much before the client's own limit

/** A client of the wait gateway. */
export class Gateway {
  readonly url: string;
  readonly #token: string | undefined;
  readonly #timeoutS: number | undefined;
  readonly #fetch: typeof fetch;

  constructor(options: GatewayOptions) {
    this.url = options.url.replace(/\/+$/, "");
    this.#token = options.token;
    if (options.requestTimeoutS !== undefined && !(options.requestTimeoutS > 0)) {
      throw new RangeError(`requestTimeoutS must be a number of seconds over 0, not ${options.requestTimeoutS}`);
    }
    this.#timeoutS = options.requestTimeoutS;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /**
   * Ask `request` and wait for its Answer: a decline, an expiry and a responder's refusal
   * (`refusalOf`) are Answers too. Aborting `signal` withdraws the request and rejects
   * with the signal's reason (or with the withdrawal's own failure, if it failed).
   */
  async waitFor(request: Request, options: WaitOptions = {}): Promise<Answer> {
    const { signal } = options;
    signal?.throwIfAborted();
    try {
      if (this.#timeoutS === undefined) {
        try {
          const answer = await this.#call("POST", "/v1/requests", request, undefined, signal);
          if (answer !== null) return answer;
        } catch (error) {
          // the connection dropped (the wait goes on at the gateway): poll it instead
          if (error instanceof ToolnexusError || signal?.aborted) throw error;
        }
        return await this.#poll(request.id, 25, signal);
      }
      const waitS = Math.max(0, this.#timeoutS - MARGIN_S);
      const first = await this.#call("POST", "/v1/requests", request, waitS, signal);
      return first ?? (await this.#poll(request.id, waitS, signal));
    } catch (error) {
      if (signal?.aborted) {
        try {
          await this.withdraw(request.id);
        } catch (failure) {
          // 404: the gateway has no such wait (it never started, or ended): nothing to withdraw
          if (!(failure instanceof NotFoundError)) throw failure;
        }
        throw signal.reason;
      }
      throw error;
    }
  }

  /** Withdraw request `id`: the Answer it ended with (`cancelled`, if it was still open). */
  async withdraw(id: string): Promise<Answer> {
    const answer = await this.#call("DELETE", `/v1/requests/${encodeURIComponent(id)}`);
    if (answer === null) throw new ToolnexusError(202, `request ${id} still open after DELETE`);
    return answer;
  }

  /** Request `id`'s Answer if it has one within `waitS` seconds, else null (still open). */
  async poll(id: string, waitS = 0, options: WaitOptions = {}): Promise<Answer | null> {
    return this.#call("GET", `/v1/requests/${encodeURIComponent(id)}`, undefined, waitS, options.signal);
  }

  async #poll(id: string, waitS: number, signal: AbortSignal | undefined): Promise<Answer> {
    for (;;) {
      const answer = await this.poll(id, waitS, signal === undefined ? {} : { signal });
      if (answer !== null) return answer;
    }
  }

  async #call(
    method: string,
    path: string,
    body?: Request,
    waitS?: number,
    signal?: AbortSignal,
  ): Promise<Answer | null> {
    const url = new URL(this.url + path);
    if (waitS !== undefined) url.searchParams.set("wait", String(waitS));
    const headers: Record<string, string> = {};
    if (this.#token !== undefined) headers.authorization = `Bearer ${this.#token}`;
    if (body !== undefined) headers["content-type"] = "application/json";
    const init: RequestInit = { method, headers };
    if (body !== undefined) init.body = JSON.stringify(body);
    if (signal !== undefined) init.signal = signal;
    const response = await this.#fetch(url, init);
    if (response.status === 202) {
      await response.body?.cancel();
      return null;
    }
    if (!response.ok) throw await errorOf(response);
    const got: unknown = await response.json(); // keep-alive spaces first: JSON skips them
    if (!isObject(got) || typeof got.id !== "string" || typeof got.ok !== "boolean") {
      throw new ToolnexusError(response.status, `not a §10 Answer: ${JSON.stringify(got).slice(0, 200)}`);
    }
    return got as Answer;
  }
}

/**
 * A drop-in `waitFor` for the toolnexus toolkit's JavaScript port: its Request in, its
 * Answer out (the §10 keys only), through the gateway at `options.url`.
 */
export function gatewayWaitFor(
  options: GatewayOptions,
): (request: Request, wait?: WaitOptions) => Promise<Omit<Answer, "bridge">> {
  const gateway = new Gateway(options);
  return async (request, wait) => section10(await gateway.waitFor(request, wait));
}
