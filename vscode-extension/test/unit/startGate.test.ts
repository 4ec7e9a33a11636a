import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { isScheduleDocument, StartGate } from "../../src/startGate";

const file = (path: string) => ({ scheme: "file", path });

describe("StartGate", () => {
  const gate = (): { gate: StartGate; starts: () => number } => {
    let n = 0;
    return { gate: new StartGate(() => (n += 1)), starts: () => n };
  };

  it("stays closed for Python files that are not schedule files", () => {
    const { gate: g, starts } = gate();
    g.documentOpened(file("/p/model.py"));
    g.documentOpened(file("/p/setup.py"));
    g.documentOpened(file("/p/x.partir.pyc"));
    g.workspaceSearched(0);
    assert.equal(starts(), 0);
    assert.equal(g.isOpen, false);
  });

  it("opens once, at the first schedule file opened", () => {
    const { gate: g, starts } = gate();
    g.documentOpened(file("/p/model.py"));
    g.documentOpened(file("/elsewhere/bp.partir.py"));
    g.documentOpened(file("/elsewhere/z3.partir.py"));
    g.workspaceSearched(3);
    assert.equal(starts(), 1);
    assert.equal(g.isOpen, true);
  });

  it("opens when the workspace search finds a schedule file", () => {
    const { gate: g, starts } = gate();
    g.workspaceSearched(1);
    g.documentOpened(file("/p/bp.partir.py"));
    assert.equal(starts(), 1);
  });

  it("ignores schedule files that are not on disk (diff views, untitled)", () => {
    const { gate: g, starts } = gate();
    g.documentOpened({ scheme: "git", path: "/p/bp.partir.py" });
    g.documentOpened({ scheme: "untitled", path: "bp.partir.py" });
    assert.equal(starts(), 0);
    assert.ok(isScheduleDocument(file("/p/bp.partir.py")));
  });

  it("opens on request (restart command), once", () => {
    const { gate: g, starts } = gate();
    g.open();
    g.open();
    g.documentOpened(file("/p/bp.partir.py"));
    assert.equal(starts(), 1);
  });
});
