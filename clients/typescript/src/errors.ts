// One error class per failure the two OpenAPI documents describe, each carrying the
// server's own reason (its JSON "error", with "field" and "rule" where the server names them).

/** A failure the gateway or the HTTP answering API reported: `status` and the server's `reason`. */
export class ToolnexusError extends Error {
  readonly status: number;
  /** The server's reason, word for word (its JSON `error`, else the body's text). */
  readonly reason: string;
  /** The field or parameter at fault, when the server names one. */
  readonly field: string | null;
  /** The JSON Schema keyword that failed (`required`, `minLength`, ...), for a 422. */
  readonly rule: string | null;

  constructor(status: number, reason: string, field: string | null = null, rule: string | null = null) {
    super(`${status}: ${reason}`);
    this.name = new.target.name;
    this.status = status;
    this.reason = reason;
    this.field = field;
    this.rule = rule;
  }
}

/** 400: a body or parameter the server refused; `field` names it when it can. */
export class BadRequestError extends ToolnexusError {}
/** 401: no bearer token, an unknown one or a revoked one. */
export class UnauthorizedError extends ToolnexusError {}
/** 403: a queue the token may not use, an allow-list that does not name its person, or a forged link. */
export class ForbiddenError extends ToolnexusError {}
/** 404: no such request (another queue's or another agent's is one too), or no such link. */
export class NotFoundError extends ToolnexusError {}
/** 409: answered, expired or withdrawn before this answer; a second vote; an id that asks something else. */
export class ConflictError extends ToolnexusError {}
/** 410: an answer link that was used already, expired, or whose request ended. */
export class GoneError extends ToolnexusError {}
/** 413: a body over the server's limit (1 MiB). */
export class PayloadTooLargeError extends ToolnexusError {}
/** 422: the data fails the form's schema: `field` names the field, `rule` the keyword. */
export class InvalidDataError extends ToolnexusError {}
/** 503: Redis cannot be reached, the tokens file cannot be read, or too many waits are open. */
export class UnavailableError extends ToolnexusError {}

const CLASSES: Record<number, typeof ToolnexusError> = {
  400: BadRequestError,
  401: UnauthorizedError,
  403: ForbiddenError,
  404: NotFoundError,
  409: ConflictError,
  410: GoneError,
  413: PayloadTooLargeError,
  422: InvalidDataError,
  503: UnavailableError,
};

/** The error for a response that is not a success, with the server's reason read from its body. */
export async function errorOf(response: Response): Promise<ToolnexusError> {
  const text = await response.text();
  let reason = text.trim() || response.statusText;
  let field: string | null = null;
  let rule: string | null = null;
  try {
    const body: unknown = JSON.parse(text);
    if (isObject(body) && typeof body.error === "string") {
      reason = body.error;
      field = typeof body.field === "string" ? body.field : null;
      rule = typeof body.rule === "string" ? body.rule : null;
    }
  } catch {
    // not JSON (a proxy's page): the text is the reason
  }
  const Class = CLASSES[response.status] ?? ToolnexusError;
  return new Class(response.status, reason, field, rule);
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
