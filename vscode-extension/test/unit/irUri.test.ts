import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { irDocumentPath, irQuery, irTitle, parseIrQuery, STALE_IR_MARK, staleIr, uriBasename } from "../../src/irUri";
import type { IrParams } from "../../src/protocol";

describe("IR document URIs", () => {
  const params: IrParams = { uri: "file:///work/main/examples/mlp/bp_mp_z3.partir.py", tactic: 2, level: "spmd" };

  it("round-trips the partir/ir params through the query", () => {
    assert.deepEqual(parseIrQuery(irQuery(params)), params);
  });

  it("round-trips URIs with characters that are URI syntax", () => {
    for (const uri of [
      "file:///a%20b/c&d=e/x%23y.partir.py",
      "file:///tmp/q?x=1#frag",
      "file:///c%3A/Users/%C3%A9/s.partir.py",
      "untitled:Untitled-1",
    ]) {
      const p: IrParams = { uri, tactic: 0, level: "hlo" };
      const q = irQuery(p);
      assert.match(q, /^[A-Za-z0-9_-]+$/, "the query must not contain URI syntax characters");
      assert.deepEqual(parseIrQuery(q), p);
    }
  });

  it("gives distinct queries for distinct params", () => {
    const qs = new Set([
      irQuery(params),
      irQuery({ ...params, tactic: 3 }),
      irQuery({ ...params, level: "core" }),
      irQuery({ ...params, uri: "file:///other/bp_mp_z3.partir.py" }),
    ]);
    assert.equal(qs.size, 4);
  });

  it("rejects queries that are not IR params", () => {
    assert.throws(() => parseIrQuery(""), /not a partir-ir document query/);
    assert.throws(() => parseIrQuery("uri=x&tactic=1"), /not a partir-ir document query/);
    assert.throws(() => parseIrQuery(Buffer.from("{").toString("base64url")), /not a partir-ir document query/);
    const bad = (x: unknown): string => Buffer.from(JSON.stringify(x)).toString("base64url");
    assert.throws(() => parseIrQuery(bad({ uri: "file:///x", tactic: -1, level: "core" })), /"tactic" must be an integer >= 0/);
    assert.throws(() => parseIrQuery(bad({ uri: "file:///x", tactic: 1, level: "mlir" })), /"level" must be one of core\|spmd\|hlo/);
    assert.throws(() => parseIrQuery(bad({ tactic: 1, level: "core" })), /"uri" must be a non-empty string/);
  });

  it("refuses to encode invalid params", () => {
    assert.throws(() => irQuery({ ...params, tactic: 1.5 }), /"tactic"/);
  });

  it("names the document after the file, tactic and level", () => {
    assert.equal(irDocumentPath(params), "/bp_mp_z3.partir.py after tactic 2.spmd.txt");
    assert.equal(irDocumentPath({ ...params, tactic: 0, level: "core" }), "/bp_mp_z3.partir.py traced.core.txt");
    assert.equal(irTitle(params), "bp_mp_z3.partir.py after tactic 2 (PartIR:SPMD)");
    assert.equal(irTitle({ ...params, tactic: 0, level: "hlo" }), "bp_mp_z3.partir.py traced program (PartIR:HLO)");
  });

  it("decodes the basename and never puts a separator in the path's name", () => {
    assert.equal(uriBasename("file:///a/my%20schedule.partir.py"), "my schedule.partir.py");
    assert.equal(uriBasename("file:///a/b/?q=1"), "b");
    assert.equal(irDocumentPath({ uri: "file:///a/x%2Fy.partir.py", tactic: 1, level: "core" }), "/x_y.partir.py after tactic 1.core.txt");
  });
});

describe("stale IR", () => {
  it("keeps the last IR below a mark saying why, once however often it fails", () => {
    const once = staleIr("func @main\n", "the schedule file does not load (line 3): invalid\nsyntax");
    assert.equal(
      once,
      `${STALE_IR_MARK}: the schedule file does not load (line 3): invalid syntax. The IR below is from the last version that loaded.\nfunc @main\n`,
    );
    assert.equal(staleIr(once, "the schedule file does not load (line 3): invalid syntax"), once);
  });
});
