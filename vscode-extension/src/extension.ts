// The PartIR extension: starts the language server (`python -m partir_lsp` over stdio) for schedule
// files and contributes the restart / show IR / run job commands. See PROTOCOL.md.

import * as vscode from "vscode";
import {
  ExecuteCommandRequest,
  LanguageClient,
  type LanguageClientOptions,
  RevealOutputChannelOn,
  type ServerOptions,
  State,
  TransportKind,
} from "vscode-languageclient/node";

import { IrDocuments } from "./irDocuments";
import { IR_SCHEME, irDocumentPath, irQuery, irTitle, uriBasename } from "./irUri";
import { formatJobMessage, formatJobReport, parseJobResult } from "./jobResult";
import {
  CONFIG_SECTION,
  DOCUMENT_SELECTOR,
  IR_LEVEL_LABELS,
  IR_LEVELS,
  type IrLevel,
  type IrParams,
  initializationOptions,
  isScheduleFile,
  type LensInfo,
  RESTART_COMMAND,
  RUN_JOB_COMMAND,
  type RunJobArgs,
  SHOW_IR_COMMAND,
  type ShowIrArgs,
  parseRunJobArgs,
  parseShowIrArgs,
  tacticChoices,
} from "./protocol";
import { formatCommandLine, interpreterFromPythonApi, resolveServerCommand, type ServerCommand } from "./serverCommand";

const PYTHON_EXTENSION_ID = "ms-python.python";
const STOP_TIMEOUT_MS = 5000;

let extension: PartirExtension | undefined;

export function activate(context: vscode.ExtensionContext): void {
  extension = new PartirExtension();
  context.subscriptions.push(extension);
  void extension.start();
}

export async function deactivate(): Promise<void> {
  await extension?.stop();
  extension = undefined;
}

function errorMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

class PartirExtension implements vscode.Disposable {
  /** Job results and the extension's own messages. */
  private readonly output = vscode.window.createOutputChannel("PartIR");
  /** The language client's log and the server's stderr; kept across restarts. */
  private readonly serverLog = vscode.window.createOutputChannel("PartIR Language Server");
  private readonly irDocuments = new IrDocuments(() => this.client);
  private readonly subscriptions: vscode.Disposable[] = [];
  private client: LanguageClient | undefined;
  private serverCommand: ServerCommand | undefined;
  /** `partir.runJob` registered by the extension itself, while the running server does not
   * list the command in `executeCommandProvider` (vscode-languageclient registers the ones
   * it lists, and a second registration would fail). */
  private fallbackRunJob: vscode.Disposable | undefined;
  /** Serialises start/stop/restart. */
  private lifecycle: Promise<void> = Promise.resolve();
  private pythonApiSubscription: vscode.Disposable | undefined;

  constructor() {
    this.subscriptions.push(
      this.output,
      this.serverLog,
      this.irDocuments,
      vscode.workspace.registerTextDocumentContentProvider(IR_SCHEME, this.irDocuments),
      vscode.commands.registerCommand(RESTART_COMMAND, () => this.restart()),
      vscode.commands.registerCommand(SHOW_IR_COMMAND, (...args: unknown[]) => this.showIr(args)),
      vscode.workspace.onDidChangeConfiguration((e) => {
        if (e.affectsConfiguration(`${CONFIG_SECTION}.pythonPath`) || e.affectsConfiguration(`${CONFIG_SECTION}.serverCommand`)) {
          void this.restart();
        }
      }),
    );
    this.updateFallbackRunJob();
  }

  start(): Promise<void> {
    return this.serialise(() => this.doStart());
  }

  stop(): Promise<void> {
    return this.serialise(() => this.doStop());
  }

  restart(): Promise<void> {
    return this.serialise(async () => {
      await this.doStop();
      await this.doStart();
      this.irDocuments.refreshAll();
    });
  }

  private serialise(step: () => Promise<void>): Promise<void> {
    const next = this.lifecycle.then(step, step);
    this.lifecycle = next.catch(() => undefined);
    return next;
  }

  private async doStart(): Promise<void> {
    const folder = vscode.workspace.workspaceFolders?.[0];
    const config = vscode.workspace.getConfiguration(CONFIG_SECTION, folder?.uri);
    let command: ServerCommand;
    try {
      command = resolveServerCommand(
        { pythonPath: config.get<unknown>("pythonPath"), serverCommand: config.get<unknown>("serverCommand") },
        {
          ...(folder ? { workspaceFolder: folder.uri.fsPath } : {}),
          env: process.env,
          ...(await this.pythonExtensionCommand(folder?.uri)),
        },
      );
    } catch (e) {
      void vscode.window.showErrorMessage(`PartIR: ${errorMessage(e)}`, "Open Settings").then((choice) => {
        if (choice) void vscode.commands.executeCommand("workbench.action.openSettings", CONFIG_SECTION);
      });
      return;
    }
    const cwd = folder?.uri.fsPath;
    const serverOptions: ServerOptions = {
      command: command.command,
      args: command.args,
      transport: TransportKind.stdio,
      options: cwd === undefined ? {} : { cwd },
    };
    const clientOptions: LanguageClientOptions = {
      documentSelector: DOCUMENT_SELECTOR.map((s) => ({ ...s })),
      initializationOptions: initializationOptions({
        collectiveMarkersInModel: config.get<unknown>("collectiveMarkersInModel"),
        debounceMs: config.get<unknown>("debounceMs"),
      }),
      synchronize: { configurationSection: CONFIG_SECTION },
      outputChannel: this.serverLog,
      revealOutputChannelOn: RevealOutputChannelOn.Never,
      middleware: {
        executeCommand: (name, args, next) =>
          name === RUN_JOB_COMMAND ? this.runJob(args, async (a) => next(name, a)) : next(name, args),
      },
    };
    const client = new LanguageClient("partir", "PartIR", serverOptions, clientOptions);
    this.client = client;
    this.serverCommand = command;
    client.onDidChangeState((e) => {
      if (client === this.client) {
        this.updateFallbackRunJob(e.newState);
      }
    });
    this.serverLog.appendLine(`Starting ${formatCommandLine(command)} (from ${command.source})${cwd ? ` in ${cwd}` : ""}`);
    try {
      await client.start();
    } catch (e) {
      this.updateFallbackRunJob();
      const choice = await vscode.window.showErrorMessage(
        `PartIR: the language server did not start (${formatCommandLine(command)}, from ${command.source}): ${errorMessage(e)}. ` +
          `Set "partir.pythonPath" to an interpreter with partir installed, or "partir.serverCommand".`,
        "Open Settings",
        "Show Log",
      );
      if (choice === "Open Settings") {
        void vscode.commands.executeCommand("workbench.action.openSettings", CONFIG_SECTION);
      } else if (choice === "Show Log") {
        this.serverLog.show(true);
      }
    }
  }

  private async doStop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    if (client !== undefined) {
      try {
        // shutdown + exit, then the process is killed if it has not exited in time
        await client.dispose(STOP_TIMEOUT_MS);
      } catch (e) {
        this.serverLog.appendLine(`Stopping the server failed: ${errorMessage(e)}`);
      }
    }
    this.updateFallbackRunJob();
  }

  /** Whether the name `partir.runJob` belongs to the language client: while it starts (it
   * registers the server's commands during `initialize`) and while it runs a server that
   * lists the command. */
  private runJobReservedForClient(state?: State): boolean {
    const client = this.client;
    if (client === undefined) {
      return false;
    }
    switch (state ?? client.state) {
      case State.Starting:
        return true;
      case State.Running:
        return (client.initializeResult?.capabilities.executeCommandProvider?.commands ?? []).includes(RUN_JOB_COMMAND);
      default:
        return false;
    }
  }

  /** Keeps exactly one `partir.runJob` command: the client's (registered while a running
   * server lists it) or this extension's. */
  private updateFallbackRunJob(state?: State): void {
    if (this.runJobReservedForClient(state)) {
      this.fallbackRunJob?.dispose();
      this.fallbackRunJob = undefined;
    } else if (this.fallbackRunJob === undefined) {
      this.fallbackRunJob = vscode.commands.registerCommand(RUN_JOB_COMMAND, (...args: unknown[]) =>
        this.runJob(args, async (a) => {
          const running = this.client;
          if (running === undefined || !running.isRunning()) {
            throw new Error("the PartIR language server is not running (command: PartIR: Restart Language Server)");
          }
          return running.sendRequest(ExecuteCommandRequest.type, { command: RUN_JOB_COMMAND, arguments: a });
        }),
      );
    }
  }

  private async pythonExtensionCommand(resource: vscode.Uri | undefined): Promise<{ pythonExtensionCommand?: string[] }> {
    const python = vscode.extensions.getExtension(PYTHON_EXTENSION_ID);
    if (python === undefined) {
      return {};
    }
    try {
      const api: unknown = python.isActive ? python.exports : await python.activate();
      this.watchInterpreter(api);
      const command = interpreterFromPythonApi(api, resource);
      return command === undefined ? {} : { pythonExtensionCommand: command };
    } catch (e) {
      this.serverLog.appendLine(`Could not read the Python extension's interpreter: ${errorMessage(e)}`);
      return {};
    }
  }

  /** Restarts the server when the Python extension's interpreter changes and the server
   * runs on it. */
  private watchInterpreter(api: unknown): void {
    if (this.pythonApiSubscription !== undefined || typeof api !== "object" || api === null) {
      return;
    }
    const environments = (api as { environments?: { onDidChangeActiveEnvironmentPath?: unknown } }).environments;
    const event = environments?.onDidChangeActiveEnvironmentPath;
    if (typeof event === "function") {
      this.pythonApiSubscription = (event as vscode.Event<unknown>)(() => {
        if (this.serverCommand?.source === "python extension") {
          void this.restart();
        }
      });
      this.subscriptions.push(this.pythonApiSubscription);
    }
  }

  private activeScheduleDocument(): vscode.TextDocument | undefined {
    const doc = vscode.window.activeTextEditor?.document;
    return doc !== undefined && doc.uri.scheme === "file" && isScheduleFile(doc.uri.path) ? doc : undefined;
  }

  // ---- partir.showIr -----------------------------------------------------------------

  private async showIr(args: readonly unknown[]): Promise<void> {
    let parsed: ShowIrArgs | undefined;
    try {
      parsed = parseShowIrArgs(args);
    } catch (e) {
      void vscode.window.showErrorMessage(`PartIR: ${errorMessage(e)}`);
      return;
    }
    if (parsed === undefined) {
      const doc = this.activeScheduleDocument();
      if (doc === undefined) {
        void vscode.window.showErrorMessage("PartIR: open a schedule file (*.partir.py) to show its IR.");
        return;
      }
      parsed = { uri: doc.uri.toString() };
    }
    const tactic = parsed.tactic ?? (await this.pickTactic(parsed.uri));
    if (tactic === undefined) {
      return;
    }
    const level = parsed.level ?? (await pickLevel());
    if (level === undefined) {
      return;
    }
    const params: IrParams = { uri: parsed.uri, tactic, level };
    const uri = vscode.Uri.from({ scheme: IR_SCHEME, path: irDocumentPath(params), query: irQuery(params) });
    try {
      const doc = await vscode.workspace.openTextDocument(uri);
      await vscode.window.showTextDocument(doc, { viewColumn: vscode.ViewColumn.Beside, preview: false });
    } catch (e) {
      void vscode.window.showErrorMessage(`PartIR: could not show ${irTitle(params)}: ${errorMessage(e)}`);
    }
  }

  /** Offers the tactics of the server's `partir.showIr` code lenses on `uri`. */
  private async pickTactic(uri: string): Promise<number | undefined> {
    let lenses: LensInfo[] = [];
    try {
      const found = await vscode.commands.executeCommand<vscode.CodeLens[] | undefined>(
        "vscode.executeCodeLensProvider",
        vscode.Uri.parse(uri),
        100,
      );
      lenses = (found ?? []).map((lens) => ({
        line: lens.range.start.line,
        title: lens.command?.title ?? "",
        ...(lens.command?.command === undefined ? {} : { command: lens.command.command }),
        ...(lens.command?.arguments === undefined ? {} : { arguments: lens.command.arguments as unknown[] }),
      }));
    } catch (e) {
      this.serverLog.appendLine(`Reading code lenses of ${uri} failed: ${errorMessage(e)}`);
    }
    const choices = tacticChoices(uri, lenses);
    if (choices.length > 1) {
      const picked = await vscode.window.showQuickPick(
        choices.map((c) => ({ label: c.label, ...(c.detail === undefined ? {} : { detail: c.detail }), tactic: c.tactic })),
        { title: `PartIR: show the IR of ${uriBasename(uri)}`, placeHolder: "After which tactic?" },
      );
      return picked?.tactic;
    }
    const typed = await vscode.window.showInputBox({
      title: `PartIR: show the IR of ${uriBasename(uri)}`,
      prompt: "After tactic N (1-based; 0 is the traced program)",
      value: "1",
      validateInput: (v) => (/^\d+$/.test(v.trim()) ? undefined : "a tactic number: 0, 1, 2, ..."),
    });
    return typed === undefined ? undefined : Number(typed.trim());
  }

  // ---- partir.runJob -----------------------------------------------------------------

  /** Runs the job through `send` (the server's `workspace/executeCommand`), reports the
   * result in the "PartIR" channel and a message, and returns the server's result. The
   * server reports work-done progress itself (`window/workDoneProgress/create`), which
   * vscode-languageclient shows as a notification. */
  private async runJob(args: readonly unknown[], send: (args: unknown[]) => Promise<unknown>): Promise<unknown> {
    let parsed: RunJobArgs | undefined;
    try {
      parsed = parseRunJobArgs(args);
    } catch (e) {
      void vscode.window.showErrorMessage(`PartIR: ${errorMessage(e)}`);
      return undefined;
    }
    if (parsed === undefined) {
      const doc = this.activeScheduleDocument();
      if (doc === undefined) {
        void vscode.window.showErrorMessage("PartIR: open a schedule file (*.partir.py) to run its partitioned job.");
        return undefined;
      }
      parsed = { uri: doc.uri.toString() };
    }
    const file = uriBasename(parsed.uri);
    this.output.appendLine(
      `[${new Date().toISOString()}] Running the partitioned job of ${file}${parsed.steps === undefined ? "" : ` (${parsed.steps} steps)`}`,
    );
    const status = vscode.window.setStatusBarMessage(`$(sync~spin) PartIR: running ${file}`);
    try {
      const raw = await send([parsed]);
      const result = parseJobResult(raw);
      this.output.appendLine(formatJobReport(result, file).join("\n"));
      const message = formatJobMessage(result, file);
      const show =
        result.status === "finished"
          ? vscode.window.showInformationMessage
          : result.status === "cancelled"
            ? vscode.window.showWarningMessage
            : vscode.window.showErrorMessage;
      void show(message, "Show Output").then((choice) => {
        if (choice) this.output.show(true);
      });
      return raw;
    } catch (e) {
      this.output.appendLine(`  failed: ${errorMessage(e)}`);
      void vscode.window.showErrorMessage(`PartIR: the job of ${file} failed: ${errorMessage(e)}`, "Show Output").then((choice) => {
        if (choice) this.output.show(true);
      });
      return undefined;
    } finally {
      status.dispose();
    }
  }

  dispose(): void {
    this.fallbackRunJob?.dispose();
    this.fallbackRunJob = undefined;
    for (const s of this.subscriptions) {
      s.dispose();
    }
  }
}

async function pickLevel(): Promise<IrLevel | undefined> {
  const picked = await vscode.window.showQuickPick(
    IR_LEVELS.map((level) => ({ label: IR_LEVEL_LABELS[level], level })),
    { placeHolder: "Which IR?" },
  );
  return picked?.level;
}
