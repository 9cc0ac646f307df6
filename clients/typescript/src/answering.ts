// The answering client, for approval screens, through the HTTP answering API
// (`toolnexus worker http`), and its single-use answer links.
import type { components } from "./generated/http.js";
import { errorOf } from "./errors.js";

type Schemas = components["schemas"];
export type OpenRequest = Schemas["OpenRequest"];
export type RequestList = Schemas["RequestList"];
export type AnswerBody = Schemas["AnswerBody"];
export type AnswerResult = Schemas["AnswerResult"];
export type Event = Schemas["Event"];
export type Events = Schemas["Events"];
export type LinkDescription = Schemas["LinkDescription"];

export interface AnsweringOptions {
  /** The API's base URL, e.g. `http://127.0.0.1:8720`. */
  url: string;
  /** The bearer token of the person or system answering (`toolnexus worker http tokens add`). */
  token: string;
  /** The `fetch` to use (the global one by default). */
  fetch?: typeof fetch;
}

export interface CallOptions {
  signal?: AbortSignal;
}

export interface ListFilter extends CallOptions {
  queue?: string;
  kind?: string;
  /** The source's agent, server or tool. */
  source?: string;
}

export interface FollowOptions extends CallOptions {
  /** The cursor to follow from (a list's `cursor`; 0: everything kept). */
  after?: number | undefined;
  /** Only this queue's changes. */
  queue?: string;
  /** How long each long poll waits for a change, in seconds (the server's default: 25). */
  waitS?: number;
}

type Query = Record<string, string | number | undefined>;

async function send<T>(
  fetcher: typeof fetch,
  url: string,
  query: Query,
  init: { method: string; headers: Record<string, string>; body?: unknown; signal?: AbortSignal | undefined },
): Promise<T> {
  const target = new URL(url);
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined) target.searchParams.set(key, String(value));
  }
  const headers: Record<string, string> = { accept: "application/json", ...init.headers };
  const request: RequestInit = { method: init.method, headers };
  if (init.body !== undefined) {
    headers["content-type"] = "application/json";
    request.body = JSON.stringify(init.body);
  }
  if (init.signal !== undefined) request.signal = init.signal;
  const response = await fetcher(target, request);
  if (!response.ok) throw await errorOf(response);
  return (await response.json()) as T;
}

/** A client of the HTTP answering API, as the person its token names (`http:NAME`). */
export class AnsweringClient {
  readonly url: string;
  readonly #token: string;
  readonly #fetch: typeof fetch;

  constructor(options: AnsweringOptions) {
    this.url = options.url.replace(/\/+$/, "");
    this.#token = options.token;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  #call<T>(method: string, path: string, query: Query, body?: unknown, signal?: AbortSignal): Promise<T> {
    const headers = { authorization: `Bearer ${this.#token}` };
    return send<T>(this.#fetch, this.url + path, query, { method, headers, body, signal });
  }

  /** The open requests of the token's queues, newest first, and the cursor to follow from. */
  list(filter: ListFilter = {}): Promise<RequestList> {
    const { queue, kind, source, signal } = filter;
    return this.#call("GET", "/v1/requests", { queue, kind, source }, undefined, signal);
  }

  /** One open request (`queue` picks among queues sharing an id). */
  get(id: string, options: CallOptions & { queue?: string } = {}): Promise<OpenRequest> {
    return this.#call("GET", `/v1/requests/${encodeURIComponent(id)}`, { queue: options.queue }, undefined, options.signal);
  }

  /** Answer request `id` (`{action: "accept", data}`, `{action: "decline", message}`, `{action: "dismiss"}`). */
  answer(id: string, body: AnswerBody, options: CallOptions & { queue?: string } = {}): Promise<AnswerResult> {
    const path = `/v1/requests/${encodeURIComponent(id)}/answer`;
    return this.#call("POST", path, { queue: options.queue }, body, options.signal);
  }

  /** Accept request `id`, with a form's data or a tool call's edited arguments. */
  accept(id: string, data?: unknown, options: CallOptions & { queue?: string } = {}): Promise<AnswerResult> {
    return this.answer(id, data === undefined ? { action: "accept" } : { action: "accept", data }, options);
  }

  /** Decline request `id`, with a message saying why (a tool approval's denial tells the model). */
  decline(id: string, message?: string, options: CallOptions & { queue?: string } = {}): Promise<AnswerResult> {
    return this.answer(id, message === undefined ? { action: "decline" } : { action: "decline", message }, options);
  }

  /** One long poll of `GET /v1/events`: the changes after `after`, waiting up to `waitS` for one. */
  events(options: FollowOptions = {}): Promise<Events> {
    const query = { after: options.after, queue: options.queue, wait: options.waitS };
    return this.#call("GET", "/v1/events", query, undefined, options.signal);
  }

  /**
   * Follow the changes from `after` on, one long poll after another: each page of changes
   * (`reset: true` says some were missed: list again). Ends when `signal` aborts.
   */
  async *follow(options: FollowOptions = {}): AsyncGenerator<Events, void, undefined> {
    let after = options.after;
    for (;;) {
      let page: Events;
      try {
        page = await this.events({ ...options, after });
      } catch (error) {
        if (options.signal?.aborted) return;
        throw error;
      }
      after = page.cursor;
      if (page.events.length > 0 || page.reset) yield page;
    }
  }
}

/** A single-use answer link (`/v1/links/TOKEN`): the link is the authority, no bearer token. */
export class AnswerLink {
  readonly url: string;
  readonly #fetch: typeof fetch;

  constructor(url: string, options: { fetch?: typeof fetch } = {}) {
    this.url = url;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** The request, whom the link was sent to, the one action it takes (or null), when it expires. */
  describe(options: CallOptions = {}): Promise<LinkDescription> {
    return send(this.#fetch, this.url, {}, { method: "GET", headers: {}, signal: options.signal });
  }

  /** Answer through the link, as `link:RECIPIENT`: once (a second time is a `GoneError`). */
  answer(body: AnswerBody, options: CallOptions = {}): Promise<AnswerResult> {
    return send(this.#fetch, this.url, {}, { method: "POST", headers: {}, body, signal: options.signal });
  }

  accept(data?: unknown, options: CallOptions = {}): Promise<AnswerResult> {
    return this.answer(data === undefined ? { action: "accept" } : { action: "accept", data }, options);
  }

  decline(message?: string, options: CallOptions = {}): Promise<AnswerResult> {
    return this.answer(message === undefined ? { action: "decline" } : { action: "decline", message }, options);
  }
}
