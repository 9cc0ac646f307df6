// The generated types must be what openapi-typescript makes of the documents the Python side
// ships: regenerated into a temporary directory and compared.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const PACKAGE = fileURLToPath(new URL("../../", import.meta.url)); // build/test/ -> the package
const WORKERS = join(PACKAGE, "..", "..", "workers", "toolnexus_workers");

for (const name of ["gateway", "http"]) {
  test(`src/generated/${name}.ts is generated from ${name}/openapi.json as shipped`, () => {
    const out = join(mkdtempSync(join(tmpdir(), "toolnexus-types-")), `${name}.ts`);
    const cli = join(PACKAGE, "node_modules", ".bin", "openapi-typescript");
    execFileSync(cli, [join(WORKERS, name, "openapi.json"), "-o", out], { stdio: "pipe" });
    const committed = readFileSync(join(PACKAGE, "src", "generated", `${name}.ts`), "utf8");
    assert.equal(committed, readFileSync(out, "utf8"), `run npm run generate in clients/typescript`);
  });
}
