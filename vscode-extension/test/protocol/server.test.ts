// Drives the real Python language server (`python -m partir_lsp`, interpreter from $PARTIR_PYTHON,
// default python3, cwd the repository root) over stdio, as VS Code does, on the MLP schedule
// file. Expected values (tactic lines, collective counts, IR text) come from the `partir`
// CLI run on the same file. See PROTOCOL.md for what the server is held to.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, rmSync } from "node:fs";
import { isAbsolute, join, relative, resolve } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

import {
  type CodeLens,
  CodeLensRequest,
  CodeLensResolveRequest,
  DiagnosticSeverity,
  DidChangeTextDocumentNotification,
  DidCloseTextDocumentNotification,
  DidOpenTextDocumentNotification,
  ExecuteCommandRequest,
  ExitNotification,
  type InitializeResult,
  InitializeRequest,
  InitializedNotification,
  ShutdownRequest,
} from "vscode-languageserver-protocol/node";

import { parseJobResult } from "../../src/jobResult";
import {
  COLLECTIVE_ABBREVIATIONS,
  COLLECTIVE_KINDS,
  type CollectiveKind,
  IR_REQUEST,
  parseCollectiveCounts,
  parseIrResult,
  ProtocolError,
  RUN_JOB_COMMAND,
  SERVER_COMMANDS,
  SHOW_IR_COMMAND,
  shownCollectives,
} from "../../src/protocol";
import { brief, ServerHarness } from "./harness";

// The workspace the server is opened on: a directory holding `examples/` (the Python test
// passes a copy, since one daemon serves a workspace), else this checkout.
const WORKSPACE = process.env.PARTIR_WORKSPACE ?? resolve(__dirname, "..", "..", "..", "..");
const PYTHON = process.env.PARTIR_PYTHON || "python3";
const SCHEDULE = join(WORKSPACE, "examples", "mlp", "bp_mp_z3.partir.py");
const URI = pathToFileURL(SCHEDULE).href;
const VALID = readFileSync(SCHEDULE, "utf8");
// A syntax error on the mesh line: Python reports it on that line.
const MESH_LINE = 'mesh = {"batch": 4, "model": 2}';
const BROKEN = VALID.replace(MESH_LINE, 'mesh = {"batch": 4, "model" 2}');
const BROKEN_LINE = VALID.split("\n").indexOf(MESH_LINE); // 0-based, as in LSP

const SETTINGS = { pythonPath: "", serverCommand: [], collectiveMarkersInModel: false, debounceMs: 50 };

type Counts = Record<CollectiveKind, number>;
interface CliTactic {
  index: number;
  name: string;
  source: { line: number } | null;
  collectives: Counts;
  conflicts: unknown[];
}

/** The result of the server's `partir.showIr`: where it wrote the IR, and the IR. */
function parseShowIrResult(x: unknown): { path: string; text: string } {
  const r = x as { path?: unknown; text?: unknown } | null;
  if (typeof r !== "object" || r === null || typeof r.path !== "string" || typeof r.text !== "string") {
    throw new ProtocolError(`${SHOW_IR_COMMAND}: the server's result must be {path: string, text: string}, got ${JSON.stringify(x)}`);
  }
  return { path: r.path, text: r.text };
}

function cli(args: string[]): string {
  const r = spawnSync(PYTHON, ["-c", "import sys; from partir.cli import main; sys.exit(main(sys.argv[1:]))", ...args], {
    cwd: WORKSPACE,
    encoding: "utf8",
    timeout: 120_000,
  });
  assert.equal(r.status, 0, `partir ${args.join(" ")} failed (${r.error?.message ?? `exit ${r.status}`}):\n${r.stderr}`);
  return r.stdout;
}

describe("the PartIR language server over stdio", () => {
  let server: ServerHarness;
  let init: InitializeResult;
  let tactics: CliTactic[];

  before(() => {
    assert.ok(existsSync(SCHEDULE), `no ${SCHEDULE}: set PARTIR_WORKSPACE`);
    assert.notEqual(BROKEN, VALID, "the schedule file's mesh line changed: update this test");
    tactics = (JSON.parse(cli(["partition", SCHEDULE, "--json"])) as { tactics: CliTactic[] }).tactics;
    assert.equal(tactics.length, 3);
    server = ServerHarness.spawn(PYTHON, ["-m", "partir_lsp"], WORKSPACE, SETTINGS);
  });

  after(() => {
    server?.dispose();
  });

  it("initializes, advertising what the extension relies on", { timeout: 60_000 }, async () => {
    init = await server.guard(
      "the initialize result",
      60_000,
      server.connection.sendRequest(InitializeRequest.type, {
        processId: process.pid,
        clientInfo: { name: "partir-protocol-test" },
        rootUri: pathToFileURL(WORKSPACE).href,
        workspaceFolders: [{ uri: pathToFileURL(WORKSPACE).href, name: "partir" }],
        initializationOptions: { collectiveMarkersInModel: false, debounceMs: 50 },
        capabilities: {
          textDocument: {
            synchronization: { didSave: true, dynamicRegistration: false },
            publishDiagnostics: { relatedInformation: true, versionSupport: true },
            codeLens: {},
            hover: { contentFormat: ["markdown", "plaintext"] },
            inlayHint: {},
          },
          workspace: {
            configuration: true,
            codeLens: { refreshSupport: true },
            inlayHint: { refreshSupport: true },
            executeCommand: {},
            workspaceFolders: true,
          },
          window: { workDoneProgress: true, showDocument: { support: true } },
        },
      }),
    );
    const caps = init.capabilities;
    assert.ok(caps.textDocumentSync !== undefined, "no textDocumentSync capability");
    assert.ok(caps.codeLensProvider, `no codeLensProvider capability\n${server.context()}`);
    const commands = caps.executeCommandProvider?.commands ?? [];
    for (const command of SERVER_COMMANDS) {
      assert.ok(commands.includes(command), `executeCommandProvider must list ${command}, got ${JSON.stringify(commands)}`);
    }
    await server.connection.sendNotification(InitializedNotification.type, {});
  });

  it("publishes a Python syntax error at its line", { timeout: 60_000 }, async () => {
    assert.ok(BROKEN_LINE > 0);
    await server.connection.sendNotification(DidOpenTextDocumentNotification.type, {
      textDocument: { uri: URI, languageId: "python", version: 1, text: BROKEN },
    });
    const published = await server.waitFor("an error diagnostic for the broken schedule file", 60_000, () =>
      server.diagnostics.find((p) => p.uri === URI && p.diagnostics.some((d) => d.severity === DiagnosticSeverity.Error)),
    );
    if (published.version !== undefined && published.version !== null) {
      assert.equal(published.version, 1);
    }
    const errors = published.diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error);
    assert.deepEqual(
      errors.map((d) => d.range.start.line),
      errors.map(() => BROKEN_LINE),
      `errors must be on line ${BROKEN_LINE} (0-based): ${JSON.stringify(errors.map(brief))}`,
    );
    assert.ok(errors.every((d) => d.message.trim() !== ""), "an error diagnostic without a message");
  });

  it("clears the error when the text is valid, and warns about Z3's conflicts on its tactic", { timeout: 120_000 }, async () => {
    const seen = server.diagnostics.length;
    await server.connection.sendNotification(DidChangeTextDocumentNotification.type, {
      textDocument: { uri: URI, version: 2 },
      contentChanges: [{ text: VALID }],
    });
    const z3 = tactics[2] as CliTactic;
    assert.ok(z3.conflicts.length > 0 && z3.source !== null, "the CLI reports Z3's conflicts: test premise");
    const z3Line = z3.source.line - 1;
    const published = await server.waitFor("diagnostics of the valid schedule file with Z3's conflict warnings", 120_000, () =>
      server.diagnostics
        .slice(seen)
        .reverse()
        .find((p) => p.uri === URI && p.diagnostics.some((d) => d.severity === DiagnosticSeverity.Warning && d.range.start.line === z3Line)),
    );
    if (published.version !== undefined && published.version !== null) {
      assert.equal(published.version, 2);
    }
    const errors = published.diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error);
    assert.deepEqual(errors.map(brief), [], "the valid schedule file has no errors");
    const latest = [...server.diagnostics].reverse().find((p) => p.uri === URI);
    assert.deepEqual(
      latest?.diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error).map(brief),
      [],
      "the latest diagnostics of the valid file still contain an error",
    );
  });

  it("shows a code lens above each tactic with the collective counts of `partir partition`", { timeout: 150_000 }, async () => {
    const lines = tactics.map((t) => {
      assert.ok(t.source !== null, `tactic ${t.index} has no source line`);
      return t.source.line - 1;
    });
    const resolveLens = async (lens: CodeLens): Promise<CodeLens> =>
      lens.command === undefined && init.capabilities.codeLensProvider?.resolveProvider
        ? server.connection.sendRequest(CodeLensResolveRequest.type, lens)
        : lens;
    const summary = (lenses: CodeLens[], line: number): CodeLens | undefined =>
      lenses.find((l) => l.range.start.line === line && Object.keys(parseCollectiveCounts(l.command?.title ?? "")).length > 0);
    const lenses = await server.poll("a counts lens on every tactic line", 150_000, 500, async () => {
      const got = await server.guard("textDocument/codeLens", 60_000, server.connection.sendRequest(CodeLensRequest.type, { textDocument: { uri: URI } }));
      const resolved = await server.guard("codeLens/resolve", 60_000, Promise.all((got ?? []).map(resolveLens)));
      return lines.every((line) => summary(resolved, line) !== undefined) ? resolved : undefined;
    });

    const problems: string[] = [];
    tactics.forEach((t, i) => {
      const line = lines[i] as number;
      const title = summary(lenses, line)?.command?.title ?? "";
      const counts = parseCollectiveCounts(title);
      // The kinds the title shows (a kind after the first four only where non-zero).
      const shown = Object.fromEntries(shownCollectives(t.collectives));
      for (const kind of COLLECTIVE_KINDS) {
        if (counts[kind] !== shown[kind]) {
          problems.push(`tactic ${t.index} (${t.name}): +${COLLECTIVE_ABBREVIATIONS[kind]} is ${counts[kind]}, partir partition says ${t.collectives[kind]} (title ${JSON.stringify(title)})`);
        }
      }
      const onLine = lenses.filter((l) => l.range.start.line === line);
      const showIr = onLine.find((l) => l.command?.command === SHOW_IR_COMMAND);
      const arg = showIr?.command?.arguments?.[0] as { uri?: unknown; tactic?: unknown } | undefined;
      if (arg?.uri !== URI || arg?.tactic !== t.index) {
        problems.push(`tactic ${t.index}: no ${SHOW_IR_COMMAND} lens with arguments [{uri, tactic: ${t.index}}] (got ${JSON.stringify(showIr?.command)})`);
      }
    });
    // One job lens, above the schedule (the statement's first line, before the tactics').
    const runs = lenses.filter((l) => l.command?.command === RUN_JOB_COMMAND);
    if (
      runs.length !== 1 ||
      (runs[0]?.command?.arguments?.[0] as { uri?: unknown } | undefined)?.uri !== URI ||
      (runs[0]?.range.start.line ?? Infinity) >= Math.min(...(lines as number[]))
    ) {
      problems.push(`expected one ${RUN_JOB_COMMAND} lens with arguments [{uri}] above the tactics, got ${JSON.stringify(runs)}`);
    }
    assert.deepEqual(problems, [], `lenses: ${JSON.stringify(lenses.map((l) => [l.range.start.line, l.command?.title]))}`);
  });

  it("answers partir/ir with the text `partir partition --ir` prints", { timeout: 60_000 }, async () => {
    for (const [tactic, level] of [
      [3, "hlo"],
      [2, "spmd"],
      [0, "core"],
    ] as const) {
      const expected = cli(["partition", SCHEDULE, "--ir", level, "--after", String(tactic)]).trim();
      const result = parseIrResult(
        await server.guard(`${IR_REQUEST} ${tactic} ${level}`, 60_000, server.connection.sendRequest(IR_REQUEST, { uri: URI, tactic, level })),
      );
      assert.ok(
        result.text.includes(expected),
        `partir/ir {tactic: ${tactic}, level: ${level}} differs from the CLI's text:\n--- server\n${result.text}\n--- CLI\n${expected}`,
      );
    }
  });

  it("runs partir.showIr: writes the IR under .partir/ir/ and asks the client to show it", { timeout: 60_000 }, async () => {
    const expected = cli(["partition", SCHEDULE, "--ir", "spmd", "--after", "2"]).trim();
    const shownBefore = server.shownDocuments.length;
    const result = parseShowIrResult(
      await server.guard(
        `workspace/executeCommand ${SHOW_IR_COMMAND}`,
        60_000,
        server.connection.sendRequest(ExecuteCommandRequest.type, {
          command: SHOW_IR_COMMAND,
          arguments: [{ uri: URI, tactic: 2, level: "spmd" }],
        }),
      ),
    );
    try {
      const under = relative(join(WORKSPACE, ".partir", "ir"), result.path);
      assert.ok(isAbsolute(result.path) && !under.startsWith("..") && !isAbsolute(under), `${result.path} is not under the workspace's .partir/ir/`);
      assert.ok(result.text.includes(expected), `${SHOW_IR_COMMAND} differs from the CLI's text:\n--- server\n${result.text}\n--- CLI\n${expected}`);
      assert.equal(readFileSync(result.path, "utf8"), result.text, `${result.path} does not hold the text the server returned`);
      const shown = await server.waitFor("a window/showDocument request", 10_000, () => server.shownDocuments[shownBefore]);
      assert.equal(fileURLToPath(shown.uri), result.path, `window/showDocument ${JSON.stringify(shown)}`);
    } finally {
      // The server wrote into the repository's .partir/ (ignored by git): leave no trace.
      rmSync(result.path, { force: true });
    }
  });

  it("runs the partitioned job with work-done progress", { timeout: 180_000 }, async () => {
    const createdBefore = server.createdTokens.length;
    const raw: unknown = await server.guard(
      `workspace/executeCommand ${RUN_JOB_COMMAND}`,
      170_000,
      server.connection.sendRequest(ExecuteCommandRequest.type, { command: RUN_JOB_COMMAND, arguments: [{ uri: URI, steps: 2 }] }),
    );
    const result = parseJobResult(raw);
    assert.equal(result.status, "finished", `job result: ${JSON.stringify(raw)}\n${server.context()}`);
    assert.ok(result.step_time_s !== null && result.step_time_s > 0, `step_time_s: ${result.step_time_s}`);
    assert.ok(result.max_abs_error !== null && result.max_abs_error < 1e-3, `max_abs_error: ${result.max_abs_error}`);
    if (result.steps !== undefined) {
      assert.equal(result.steps, 2);
    }
    const tokens = server.createdTokens.slice(createdBefore);
    assert.ok(tokens.length > 0, `the server created no work-done progress token\n${server.context()}`);
    const kinds = await server.waitFor("the job's progress to end", 10_000, () => {
      const kinds = server.progress.filter((p) => tokens.includes(p.token)).map((p) => p.value.kind);
      return kinds.includes("end") ? kinds : undefined;
    });
    assert.equal(kinds[0], "begin", `progress must begin before it reports or ends: ${kinds.join(", ")}`);
    assert.equal(kinds.at(-1), "end");
  });

  it("shuts down and exits with status 0", { timeout: 30_000 }, async () => {
    await server.connection.sendNotification(DidCloseTextDocumentNotification.type, { textDocument: { uri: URI } });
    await server.guard("shutdown", 20_000, server.connection.sendRequest(ShutdownRequest.type));
    await server.connection.sendNotification(ExitNotification.type);
    const exit = await server.waitForExit(20_000);
    assert.deepEqual(exit, { code: 0, signal: null }, server.context());
  });
});
