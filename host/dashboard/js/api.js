// The one way the dashboard reads data: GraphQL at /graphql with the signed-in key.
// Queries go over HTTP POST; subscriptions over a graphql-transport-ws WebSocket
// (graphql-ws's client, vendored). The key lives in sessionStorage: this tab only.

const KEY = "orl.apiKey";

export function savedKey() {
  return sessionStorage.getItem(KEY);
}

export function saveKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

/** An error to show the user, in words. `code` is the API's error code when it gave one. */
export class ApiError extends Error {
  constructor(message, code) {
    super(message);
    this.code = code;
  }
}

/** Runs `query` and returns its data; throws an ApiError saying what went wrong. */
export async function gql(query, variables = {}) {
  const key = savedKey();
  let response;
  try {
    response = await fetch("/graphql", {
      method: "POST",
      headers: {
        "Content-Type": "application/json",
        ...(key ? { Authorization: `Bearer ${key}` } : {}),
      },
      body: JSON.stringify({ query, variables }),
    });
  } catch (e) {
    throw new ApiError(`The server cannot be reached (${e.message}). Is orl serve running?`, "NETWORK");
  }
  let body;
  try {
    body = await response.json();
  } catch {
    throw new ApiError(`The server answered ${response.status} ${response.statusText} without a GraphQL response.`, "HTTP");
  }
  const errors = body.errors || [];
  if (response.status === 401 || errors.some((e) => e.extensions?.code === "UNAUTHENTICATED")) {
    throw new ApiError("This API key is not valid (unknown, revoked or mistyped).", "UNAUTHENTICATED");
  }
  if (!body.data && errors.length) {
    throw new ApiError(describe(errors[0]), errors[0].extensions?.code);
  }
  return { data: body.data, errors };
}

/**
 * Every node of the connection `field` of `query` (which takes `$after`), page after page;
 * and the errors of every page, each with the `node` it is about when it is about one.
 */
export async function gqlAll(query, field, variables = {}) {
  const nodes = [];
  const errors = [];
  let after = null;
  for (;;) {
    const page = await gql(query, { ...variables, after });
    const connection = page.data?.[field];
    // An error inside an item names it by its index in its page: `node` is that item.
    for (const e of page.errors) {
      const at = e.path?.[0] === field && e.path[1] === "edges" ? e.path[2] : undefined;
      errors.push({ ...e, node: at === undefined ? undefined : connection?.edges?.[at]?.node });
    }
    if (!connection) break;
    for (const edge of connection.edges) nodes.push(edge.node);
    if (!connection.pageInfo.hasNextPage) break;
    after = connection.pageInfo.endCursor;
  }
  return { nodes, errors };
}

/** A GraphQL error in words. */
export function describe(error) {
  const code = error.extensions?.code;
  const message = error.message || "unknown error";
  if (code === "NOT_FOUND") return `Not visible to this key: ${message}.`;
  if (code === "INVALID_INPUT") return `The request was refused: ${message}.`;
  return code ? `${message} (${code})` : message;
}

let client = null;

/** The subscription client, made on first use; `onStatus` hears "live", "connecting", "down". */
function socket(onStatus) {
  if (client) return client;
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/graphql`;
  client = window.graphqlWs.createClient({
    url,
    lazy: true,
    retryAttempts: Infinity,
    shouldRetry: () => true,
    retryWait: (n) => new Promise((r) => setTimeout(r, Math.min(1000 * 2 ** n, 15000))),
    connectionParams: () => ({ Authorization: `Bearer ${savedKey()}` }),
    on: {
      connecting: () => onStatus("connecting"),
      connected: () => onStatus("live"),
      closed: () => onStatus("down"),
      error: () => onStatus("down"),
    },
  });
  return client;
}

/** Subscribes to `query`; `onData` gets each payload's data. Returns the unsubscribe function. */
export function subscribe(query, onData, onError, onStatus = () => {}) {
  return socket(onStatus).subscribe(
    { query },
    {
      next: (payload) => {
        if (payload.errors?.length) onError(new ApiError(describe(payload.errors[0])));
        else onData(payload.data);
      },
      error: (e) => onError(new ApiError(e?.message || (e?.reason ? `socket closed: ${e.reason}` : "the live connection failed"))),
      complete: () => {},
    },
  );
}

/** Closes the subscription socket (on sign-out). */
export function closeSocket() {
  if (client) client.dispose();
  client = null;
}
