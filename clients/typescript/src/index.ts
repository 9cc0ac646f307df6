export {
  Gateway,
  gatewayWaitFor,
  refusalOf,
  section10,
  type Answer,
  type Bridge,
  type GatewayOptions,
  type Refusal,
  type Request,
  type WaitOptions,
} from "./gateway.js";
export {
  AnswerLink,
  AnsweringClient,
  type AnswerBody,
  type AnswerResult,
  type AnsweringOptions,
  type CallOptions,
  type Event,
  type Events,
  type FollowOptions,
  type LinkDescription,
  type ListFilter,
  type OpenRequest,
  type RequestList,
} from "./answering.js";
export {
  BadRequestError,
  ConflictError,
  ForbiddenError,
  GoneError,
  InvalidDataError,
  NotFoundError,
  PayloadTooLargeError,
  ToolnexusError,
  UnauthorizedError,
  UnavailableError,
} from "./errors.js";
export type { components as GatewaySchemas, paths as GatewayPaths } from "./generated/gateway.js";
export type { components as HttpApiSchemas, paths as HttpApiPaths } from "./generated/http.js";
