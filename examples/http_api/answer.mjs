// A client of the HTTP answering API (`toolnexus worker http`) in JavaScript. Node 18+
// (global fetch); nothing to install. The token is from
// `toolnexus worker http tokens add NAME --queue QUEUE --tokens tokens.toml`.
//
//   node answer.mjs list                               # the open requests, newest first
//   node answer.mjs follow CURSOR                      # the changes after CURSOR (long poll)
//   node answer.mjs answer ID '{"action": "accept", "data": {"name": "Ada"}}'
//
// with $TOOLNEXUS_HTTP_URL (http://127.0.0.1:8720) and $TOOLNEXUS_HTTP_TOKEN set. Each
// prints one line of JSON: {"status": 200, "body": {...}}.

export function client(url, token) {
  async function call(path, init = {}) {
    const response = await fetch(`${url}${path}`, {
      ...init,
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    });
    return { status: response.status, body: await response.json() };
  }
  return {
    list: (filter = {}) => call(`/v1/requests?${new URLSearchParams(filter)}`),
    read: (id) => call(`/v1/requests/${encodeURIComponent(id)}`),
    follow: (after, wait = 25) => call(`/v1/events?after=${after}&wait=${wait}`),
    answer: (id, body) =>
      call(`/v1/requests/${encodeURIComponent(id)}/answer`, {
        method: "POST",
        body: JSON.stringify(body),
      }),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const api = client(
    process.env.TOOLNEXUS_HTTP_URL ?? "http://127.0.0.1:8720",
    process.env.TOOLNEXUS_HTTP_TOKEN,
  );
  const [command, ...rest] = process.argv.slice(2);
  const result =
    command === "list"
      ? await api.list()
      : command === "follow"
        ? await api.follow(rest[0] ?? 0)
        : command === "answer"
          ? await api.answer(rest[0], JSON.parse(rest[1]))
          : null;
  if (result === null) {
    process.stderr.write("usage: node answer.mjs list | follow CURSOR | answer ID JSON\n");
    process.exit(2);
  }
  process.stdout.write(JSON.stringify(result) + "\n");
}
