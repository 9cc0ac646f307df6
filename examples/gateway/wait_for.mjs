// The toolnexus toolkit's §10 waitFor for its JavaScript port, over the bridge's wait gateway
// (`toolnexus worker gateway`). Node 18+ (global fetch); nothing to install.
//
//   import { gatewayWaitFor } from "./wait_for.mjs";
//   const client = createClient({ ..., waitFor: gatewayWaitFor("http://127.0.0.1:8710", token) });

export function gatewayWaitFor(gateway, token) {
  return async function waitFor(request) {
    const response = await fetch(`${gateway}/v1/requests`, {
      method: "POST", // a long poll: spaces keep it alive until the Answer
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify(request),
    });
    if (!response.ok) throw new Error(`gateway ${response.status}: ${await response.text()}`);
    const { id, ok, data, reason } = await response.json(); // §10 keys; "bridge" is not one
    return { id, ok, data, reason };
  };
}

// node wait_for.mjs GATEWAY < request.json (token in $TOOLNEXUS_GATEWAY_TOKEN): the Answer
if (import.meta.url === `file://${process.argv[1]}`) {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const request = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  const waitFor = gatewayWaitFor(process.argv[2], process.env.TOOLNEXUS_GATEWAY_TOKEN);
  process.stdout.write(JSON.stringify(await waitFor(request)));
}
