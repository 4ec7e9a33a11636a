import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import {
  ACTIVE_CONTEXT,
  CLIENT_COMMANDS,
  CONFIG_SECTION,
  DOCUMENT_SELECTOR,
  formatCollectiveCounts,
  initializationOptions,
  isScheduleFile,
  type LensInfo,
  missingServerCommands,
  parseCollectiveCounts,
  parseIrResult,
  parseRunJobArgs,
  parseShowIrArgs,
  RESTART_COMMAND,
  RUN_JOB_COMMAND,
  sameUri,
  SCHEDULE_GLOB,
  SERVER_COMMANDS,
  SERVER_RUNNING_CONTEXT,
  SHOW_IR_COMMAND,
  SHOW_IR_PICKER_COMMAND,
  tacticChoices,
} from "../../src/protocol";

const uri = "file:///w/examples/mlp/bp_mp_z3.partir.py";

describe("command arguments", () => {
  it("parses partir.showIr arguments", () => {
    assert.equal(parseShowIrArgs([]), undefined);
    assert.deepEqual(parseShowIrArgs([{ uri }]), { uri });
    assert.deepEqual(parseShowIrArgs([{ uri, tactic: 2, level: "hlo" }]), { uri, tactic: 2, level: "hlo" });
    assert.deepEqual(parseShowIrArgs([{ uri, tactic: 0, level: null }]), { uri, tactic: 0 });
  });

  it("rejects bad partir.showIr arguments", () => {
    assert.throws(() => parseShowIrArgs([uri, 2, "core"]), /partir\.showIr: expected \[\{uri, tactic, level\}\]/);
    assert.throws(() => parseShowIrArgs([{ uri, tactic: "2" }]), /"tactic" must be an integer >= 0/);
    assert.throws(() => parseShowIrArgs([{ uri, tactic: 1, level: "stablehlo" }]), /"level" must be one of/);
    assert.throws(() => parseShowIrArgs([{ tactic: 1 }]), /"uri"/);
  });

  it("parses partir.runJob arguments", () => {
    assert.equal(parseRunJobArgs([]), undefined);
    assert.deepEqual(parseRunJobArgs([{ uri }]), { uri });
    assert.deepEqual(parseRunJobArgs([{ uri, steps: 5 }]), { uri, steps: 5 });
    assert.throws(() => parseRunJobArgs([{ uri, steps: 0 }]), /"steps" must be an integer >= 1/);
    assert.throws(() => parseRunJobArgs(["x"]), /partir\.runJob: expected \[\{uri, steps\}\]/);
  });

  it("validates the partir/ir result", () => {
    assert.deepEqual(parseIrResult({ text: "func @main" }), { text: "func @main" });
    assert.throws(() => parseIrResult({ ir: "x" }), /must be \{text: string\}/);
    assert.throws(() => parseIrResult(null), /must be \{text: string\}/);
  });
});

describe("server commands", () => {
  it("are never the extension's own: the language client registers them", () => {
    assert.deepEqual([...SERVER_COMMANDS].sort(), [RUN_JOB_COMMAND, SHOW_IR_COMMAND].sort());
    assert.deepEqual([...CLIENT_COMMANDS].sort(), [RESTART_COMMAND, SHOW_IR_PICKER_COMMAND].sort());
    assert.deepEqual(
      CLIENT_COMMANDS.filter((c) => (SERVER_COMMANDS as readonly string[]).includes(c)),
      [],
    );
  });

  it("reports the ones a server does not advertise", () => {
    assert.deepEqual(missingServerCommands([RUN_JOB_COMMAND, SHOW_IR_COMMAND, "other"]), []);
    assert.deepEqual(missingServerCommands([RUN_JOB_COMMAND]), [SHOW_IR_COMMAND]);
    assert.deepEqual(missingServerCommands(undefined), [SHOW_IR_COMMAND, RUN_JOB_COMMAND]);
  });
});

describe("initializationOptions", () => {
  it("fills defaults and normalises", () => {
    assert.deepEqual(initializationOptions({}), { collectiveMarkersInModel: false, debounceMs: 300 });
    assert.deepEqual(initializationOptions({ collectiveMarkersInModel: true, debounceMs: 120.4 }), {
      collectiveMarkersInModel: true,
      debounceMs: 120,
    });
    assert.deepEqual(initializationOptions({ collectiveMarkersInModel: "yes", debounceMs: -5 }), {
      collectiveMarkersInModel: false,
      debounceMs: 0,
    });
  });
});

describe("lens titles", () => {
  it("reads collective counts", () => {
    assert.deepEqual(parseCollectiveCounts("+AG 2 +AR 1 +RS 0 +A2A 0 · 1.2 ms · 3.4 MiB/device"), {
      all_gather: 2,
      all_reduce: 1,
      reduce_scatter: 0,
      all_to_all: 0,
    });
    assert.deepEqual(parseCollectiveCounts("Z3: +AG 12"), { all_gather: 12 });
    assert.deepEqual(parseCollectiveCounts("PP: +AG 0 +CP 6"), { all_gather: 0, collective_permute: 6 });
    assert.deepEqual(parseCollectiveCounts("Show IR after this tactic"), {});
    assert.throws(() => parseCollectiveCounts("+AG 1 +AG 2"), /names \+AG twice/);
  });

  it("writes what it reads", () => {
    const counts = { all_gather: 2, all_reduce: 1, reduce_scatter: 0, all_to_all: 4 };
    assert.equal(formatCollectiveCounts(counts), "+AG 2 +AR 1 +RS 0 +A2A 4");
    assert.deepEqual(parseCollectiveCounts(formatCollectiveCounts(counts)), counts);
    const permuting = { ...counts, collective_permute: 6 };
    assert.equal(formatCollectiveCounts(permuting), "+AG 2 +AR 1 +RS 0 +A2A 4 +CP 6");
    assert.deepEqual(parseCollectiveCounts(formatCollectiveCounts(permuting)), permuting);
  });
});

describe("tacticChoices", () => {
  const lens = (line: number, title: string, command?: string, args?: unknown[]): LensInfo => ({
    line,
    title,
    ...(command === undefined ? {} : { command }),
    ...(args === undefined ? {} : { arguments: args }),
  });

  it("lists the traced program and each tactic with its summary", () => {
    const lenses = [
      // The summary lens shows the SPMD IR (the server's lenses), or nothing.
      lens(16, "+AG 0 +AR 1 +RS 0 +A2A 0 · 1.2 ms", SHOW_IR_COMMAND, [{ uri, tactic: 2, level: "spmd" }]),
      lens(16, "Show IR after this tactic", SHOW_IR_COMMAND, [{ uri, tactic: 2 }]),
      lens(16, "Run partitioned job", RUN_JOB_COMMAND, [{ uri }]),
      lens(14, "+AG 0 +AR 0 +RS 0 +A2A 0", ""),
      lens(14, "Show IR after this tactic", SHOW_IR_COMMAND, [{ uri, tactic: 1 }]),
      lens(14, "Show HLO", SHOW_IR_COMMAND, [{ uri, tactic: 1, level: "hlo" }]),
      lens(3, "other file", SHOW_IR_COMMAND, [{ uri: "file:///w/other.partir.py", tactic: 5 }]),
      lens(4, "malformed", SHOW_IR_COMMAND, ["x"]),
    ];
    assert.deepEqual(tacticChoices(uri, lenses), [
      { tactic: 0, label: "Traced program (before tactic 1)" },
      { tactic: 1, label: "After tactic 1 (line 15)", detail: "+AG 0 +AR 0 +RS 0 +A2A 0" },
      { tactic: 2, label: "After tactic 2 (line 17)", detail: "+AG 0 +AR 1 +RS 0 +A2A 0 · 1.2 ms" },
    ]);
  });

  it("gives each tactic of a one-line list its own summary", () => {
    // `schedule = [BP, MP]`: every tactic's lenses on line 9, named.
    const lenses = [
      lens(9, "BP: +AG 0 +AR 1 +RS 0 +A2A 0", SHOW_IR_COMMAND, [{ uri, tactic: 1, level: "hlo" }]),
      lens(9, "Show IR after BP", SHOW_IR_COMMAND, [{ uri, tactic: 1 }]),
      lens(9, "MP: +AG 2 +AR 3 +RS 0 +A2A 0", SHOW_IR_COMMAND, [{ uri, tactic: 2, level: "hlo" }]),
      lens(9, "Show IR after MP", SHOW_IR_COMMAND, [{ uri, tactic: 2 }]),
    ];
    assert.deepEqual(tacticChoices(uri, lenses), [
      { tactic: 0, label: "Traced program (before tactic 1)" },
      { tactic: 1, label: "After tactic 1 (line 10)", detail: "BP: +AG 0 +AR 1 +RS 0 +A2A 0" },
      { tactic: 2, label: "After tactic 2 (line 10)", detail: "MP: +AG 2 +AR 3 +RS 0 +A2A 0" },
    ]);
  });

  it("offers only the traced program without lenses", () => {
    assert.deepEqual(tacticChoices(uri, []), [{ tactic: 0, label: "Traced program (before tactic 1)" }]);
  });

  it("matches URIs up to percent-encoding", () => {
    assert.ok(sameUri("file:///a/b%20c.partir.py", "file:///a/b c.partir.py"));
    assert.ok(!sameUri("file:///a/b.partir.py", "file:///a/c.partir.py"));
  });
});

describe("schedule files", () => {
  it("recognises *.partir.py only", () => {
    assert.ok(isScheduleFile("/w/examples/mlp/bp.partir.py"));
    assert.ok(isScheduleFile("file:///w/bp.partir.py"));
    assert.ok(!isScheduleFile("/w/examples/mlp/model.py"));
    assert.ok(!isScheduleFile("/w/x.partir.pyc"));
  });
});

describe("package.json", () => {
  // out/test/unit -> the extension directory
  const pkg = JSON.parse(readFileSync(join(__dirname, "..", "..", "..", "package.json"), "utf8")) as {
    main: string;
    activationEvents: string[];
    contributes: {
      commands: { command: string }[];
      menus: { commandPalette: { command: string; when: string }[] };
      configuration: { properties: Record<string, { default: unknown }> };
    };
  };
  const palette = new Map(pkg.contributes.menus.commandPalette.map((m) => [m.command, m.when]));

  it("contributes the extension's commands and, for the palette, the server's partir.runJob", () => {
    assert.deepEqual(pkg.contributes.commands.map((c) => c.command).sort(), [...CLIENT_COMMANDS, RUN_JOB_COMMAND].sort());
  });

  it("offers commands in the palette only where they work", () => {
    const clauses = (command: string): string[] => (palette.get(command) ?? "").split("&&").map((c) => c.trim());
    const inScheduleFile = "resourceFilename =~ /\\.partir\\.py$/";
    assert.deepEqual([...palette.keys()].sort(), [...CLIENT_COMMANDS, RUN_JOB_COMMAND].sort());
    // partir.runJob exists only while a server runs (the client registers it).
    assert.deepEqual(clauses(RUN_JOB_COMMAND).sort(), [inScheduleFile, SERVER_RUNNING_CONTEXT].sort());
    assert.deepEqual(clauses(SHOW_IR_PICKER_COMMAND), [inScheduleFile]);
    // Restarting a server that never started would start it in a project without schedule files.
    assert.deepEqual(clauses(RESTART_COMMAND), [ACTIVE_CONTEXT]);
  });

  it("contributes the settings the extension reads, with defaults the code agrees with", () => {
    const props = pkg.contributes.configuration.properties;
    assert.deepEqual(Object.keys(props).sort(), ["collectiveMarkersInModel", "debounceMs", "pythonPath", "serverCommand"].map((k) => `${CONFIG_SECTION}.${k}`).sort());
    assert.deepEqual(
      initializationOptions({
        collectiveMarkersInModel: props["partir.collectiveMarkersInModel"]?.default,
        debounceMs: props["partir.debounceMs"]?.default,
      }),
      initializationOptions({}),
    );
  });

  it("activates on schedule files without claiming a language for them", () => {
    // No file-pattern activation event exists: onLanguage:python sees a schedule file opened
    // outside a workspace that contains one, and StartGate keeps other Python files inert.
    assert.deepEqual([...pkg.activationEvents].sort(), [`workspaceContains:${SCHEDULE_GLOB}`, "onLanguage:python"].sort());
    assert.equal((pkg.contributes as { languages?: unknown }).languages, undefined);
    assert.deepEqual(DOCUMENT_SELECTOR[0], { scheme: "file", language: "python", pattern: "**/*.partir.py" });
    assert.ok(DOCUMENT_SELECTOR.every((s) => s.language === "python" && s.scheme === "file"));
    assert.equal(pkg.main, "./dist/extension.js");
  });
});
