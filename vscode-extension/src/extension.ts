// The PartIR extension: starts the language server (`python -m partir_lsp` over stdio) once a
// schedule file is opened or found in the workspace, and contributes the restart and IR
// picker commands; `partir.showIr` and `partir.runJob` are the server's commands, which
// vscode-languageclient registers. See PROTOCOL.md.

import * as vscode from "vscode";
import {
  ExecuteCommandRequest,
  LanguageClient,
  type LanguageClientOptions,
  RevealOutputChannelOn,
  type ServerOptions,
  State,
  TransportKind,
  WorkDoneProgress,
} from "vscode-languageclient/node";

import { IrDocuments } from "./irDocuments";
import { IR_SCHEME, irDocumentPath, irQuery, irTitle, uriBasename } from "./irUri";
import { formatJobMessage, formatJobReport, parseJobResult } from "./jobResult";
import {
  ACTIVE_CONTEXT,
  type ClientCommand,
  CONFIG_SECTION,
  DOCUMENT_SELECTOR,
  IR_LEVEL_LABELS,
  IR_LEVELS,
  type IrLevel,
  type IrParams,
  initializationOptions,
  type LensInfo,
  missingServerCommands,
  RESTART_COMMAND,
  RUN_JOB_COMMAND,
  type RunJobArgs,
  SCHEDULE_GLOB,
  SERVER_RUNNING_CONTEXT,
  SHOW_IR_COMMAND,
  SHOW_IR_PICKER_COMMAND,
  type ShowIrArgs,
  parseRunJobArgs,
  parseShowIrArgs,
  tacticChoices,
} from "./protocol";
import { formatCommandLine, interpreterFromPythonApi, resolveServerCommand, type ServerCommand } from "./serverCommand";
import { isScheduleDocument, StartGate } from "./startGate";

const PYTHON_EXTENSION_ID = "ms-python.python";
const STOP_TIMEOUT_MS = 5000;

let extension: PartirExtension | undefined;

export function activate(context: vscode.ExtensionContext): void {
  extension = new PartirExtension();
  context.subscriptions.push(extension);
  extension.startForScheduleFiles();
}

export async function deactivate(): Promise<void> {
  await extension?.stop();
  extension = undefined;
}

function errorMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

class PartirExtension implements vscode.Disposable {
  /** Job results and the extension's own messages; created with the first server start, so
   * that a Python project without schedule files shows no trace of the extension. */
  private outputChannel: vscode.OutputChannel | undefined;
  /** The language client's log and the server's stderr; kept across restarts. */
  private serverLogChannel: vscode.OutputChannel | undefined;
  private readonly irDocuments = new IrDocuments(() => this.client);
  private readonly subscriptions: vscode.Disposable[] = [];
  /** Listeners that wait for the first schedule file; disposed when the gate opens. */
  private readonly gateListeners: vscode.Disposable[] = [];
  private readonly gate = new StartGate(() => {
    for (const listener of this.gateListeners.splice(0)) {
      listener.dispose();
    }
    void vscode.commands.executeCommand("setContext", ACTIVE_CONTEXT, true);
    void this.start();
  });
  private client: LanguageClient | undefined;
  private serverCommand: ServerCommand | undefined;
  /** Serialises start/stop/restart. */
  private lifecycle: Promise<void> = Promise.resolve();
  private pythonApiSubscription: vscode.Disposable | undefined;

  constructor() {
    // Never `partir.showIr` or `partir.runJob`: the language client registers those (see
    // SERVER_COMMANDS), and a second registration would fail.
    const commands: Record<ClientCommand, (...args: unknown[]) => unknown> = {
      [RESTART_COMMAND]: () => (this.gate.isOpen ? this.restart() : this.gate.open()),
      [SHOW_IR_PICKER_COMMAND]: (...args: unknown[]) => this.showIrPicker(args),
    };
    this.subscriptions.push(
      this.irDocuments,
      vscode.workspace.registerTextDocumentContentProvider(IR_SCHEME, this.irDocuments),
      ...Object.entries(commands).map(([name, run]) => vscode.commands.registerCommand(name, run)),
      vscode.workspace.onDidChangeConfiguration((e) => {
        if (
          this.gate.isOpen &&
          (e.affectsConfiguration(`${CONFIG_SECTION}.pythonPath`) || e.affectsConfiguration(`${CONFIG_SECTION}.serverCommand`))
        ) {
          void this.restart();
        }
      }),
    );
  }

  private get output(): vscode.OutputChannel {
    if (this.outputChannel === undefined) {
      this.outputChannel = vscode.window.createOutputChannel("PartIR");
      this.subscriptions.push(this.outputChannel);
    }
    return this.outputChannel;
  }

  private get serverLog(): vscode.OutputChannel {
    if (this.serverLogChannel === undefined) {
      this.serverLogChannel = vscode.window.createOutputChannel("PartIR Language Server");
      this.subscriptions.push(this.serverLogChannel);
    }
    return this.serverLogChannel;
  }

  /** Starts the server at the first schedule file: one open now, one opened later, or one
   * in the workspace folders (searched now and when the folders change). */
  startForScheduleFiles(): void {
    this.gateListeners.push(
      vscode.workspace.onDidOpenTextDocument((doc) => this.gate.documentOpened(doc.uri)),
      vscode.workspace.onDidChangeWorkspaceFolders(() => void this.searchWorkspace()),
    );
    for (const doc of vscode.workspace.textDocuments) {
      this.gate.documentOpened(doc.uri);
    }
    void this.searchWorkspace();
  }

  private async searchWorkspace(): Promise<void> {
    if (this.gate.isOpen || !vscode.workspace.workspaceFolders?.length) {
      return;
    }
    try {
      // The default excludes (files.exclude), as for the workspaceContains activation event.
      this.gate.workspaceSearched((await vscode.workspace.findFiles(SCHEDULE_GLOB, undefined, 1)).length);
    } catch (e) {
      // Not worth a message: opening a schedule file still starts the server.
      console.warn(`PartIR: searching the workspace for schedule files failed: ${errorMessage(e)}`);
    }
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
      // The server's commands, run from its code lenses or (partir.runJob) the palette.
      middleware: {
        executeCommand: (name, args, next) => {
          switch (name) {
            case RUN_JOB_COMMAND:
              return this.runJob(args);
            case SHOW_IR_COMMAND:
              return this.showIrBeside(args);
            default:
              return next(name, args);
          }
        },
      },
    };
    const client = new LanguageClient("partir", "PartIR", serverOptions, clientOptions);
    this.client = client;
    this.serverCommand = command;
    client.onDidChangeState((e) => {
      if (client === this.client) {
        void vscode.commands.executeCommand("setContext", SERVER_RUNNING_CONTEXT, e.newState === State.Running);
      }
    });
    this.serverLog.appendLine(`Starting ${formatCommandLine(command)} (from ${command.source})${cwd ? ` in ${cwd}` : ""}`);
    try {
      await client.start();
      const missing = missingServerCommands(client.initializeResult?.capabilities.executeCommandProvider?.commands);
      if (missing.length > 0) {
        this.serverLog.appendLine(
          `The server does not provide ${missing.join(", ")}: its code lenses invoking ${missing.length > 1 ? "them" : "it"} will fail. ` +
            `Update partir in the server's environment.`,
        );
      }
    } catch (e) {
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
    void vscode.commands.executeCommand("setContext", SERVER_RUNNING_CONTEXT, false);
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
    return doc !== undefined && isScheduleDocument(doc.uri) ? doc : undefined;
  }

  // ---- partir.showIr (server) and partir.showIrPicker --------------------------------

  /** The `partir/ir` params for `args` (`[]`: the active schedule file), asking the user
   * for a missing tactic or level; undefined when there is no schedule file or the user
   * cancels. */
  private async completeIrParams(args: readonly unknown[]): Promise<IrParams | undefined> {
    let parsed: ShowIrArgs | undefined;
    try {
      parsed = parseShowIrArgs(args);
    } catch (e) {
      void vscode.window.showErrorMessage(`PartIR: ${errorMessage(e)}`);
      return undefined;
    }
    if (parsed === undefined) {
      const doc = this.activeScheduleDocument();
      if (doc === undefined) {
        void vscode.window.showErrorMessage("PartIR: open a schedule file (*.partir.py) to show its IR.");
        return undefined;
      }
      parsed = { uri: doc.uri.toString() };
    }
    const tactic = parsed.tactic ?? (await this.pickTactic(parsed.uri));
    if (tactic === undefined) {
      return undefined;
    }
    const level = parsed.level ?? (await pickLevel());
    return level === undefined ? undefined : { uri: parsed.uri, tactic, level };
  }

  /** The server's `partir.showIr` (a code lens, one click): the IR view the picker opens
   * (read-only, beside the schedule file, refreshed as it changes), at the level the lens
   * names, else Core as the server's default, rather than the server's file under
   * `.partir/ir/` (which other editors open). */
  private async showIrBeside(args: unknown[]): Promise<unknown> {
    let parsed: ShowIrArgs | undefined;
    try {
      parsed = parseShowIrArgs(args);
    } catch (e) {
      void vscode.window.showErrorMessage(`PartIR: ${errorMessage(e)}`);
      return undefined;
    }
    return this.showIrPicker(parsed === undefined ? [] : [{ level: "core", ...parsed }]);
  }

  /** `partir.showIrPicker` (palette): a read-only `partir-ir:` document fetched with the
   * `partir/ir` request, refreshed as the schedule file changes. */
  private async showIrPicker(args: readonly unknown[]): Promise<void> {
    const params = await this.completeIrParams(args);
    if (params === undefined) {
      return;
    }
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

  /** Runs the job (the server's `workspace/executeCommand`) under a notification with a
   * Cancel button, which shows the server's progress (reported to a token the extension
   * passes as `progressToken`) and cancels the request, hence the job; reports the result
   * in the "PartIR" channel and a message, and returns the server's result. */
  private async runJob(args: readonly unknown[]): Promise<unknown> {
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
    const client = this.client;
    if (client === undefined || !client.isRunning()) {
      void vscode.window.showErrorMessage("PartIR: the language server is not running (command: PartIR: Restart Language Server).");
      return undefined;
    }
    const job = parsed;
    const file = uriBasename(job.uri);
    this.output.appendLine(
      `[${new Date().toISOString()}] Running the partitioned job of ${file}${job.steps === undefined ? "" : ` (${job.steps} steps)`}`,
    );
    const progressToken = `partir-job-${Date.now()}-${Math.random().toString(36).slice(2)}`;
    const title = `PartIR job (${file})`;
    try {
      const raw = await vscode.window.withProgress(
        { location: vscode.ProgressLocation.Notification, title, cancellable: true },
        async (progress, cancelled) => {
          let done = 0;
          const listening = client.onProgress(WorkDoneProgress.type, progressToken, (value) => {
            if (value.kind === "end") return;
            const increment = value.percentage === undefined ? undefined : Math.max(value.percentage - done, 0);
            done = value.percentage ?? done;
            progress.report({ ...(value.message === undefined ? {} : { message: value.message }), ...(increment ? { increment } : {}) });
          });
          try {
            return await client.sendRequest(
              ExecuteCommandRequest.type,
              { command: RUN_JOB_COMMAND, arguments: [{ ...job, progressToken }] },
              cancelled,
            );
          } finally {
            listening.dispose();
          }
        },
      );
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
      // Cancelling the notification cancels the request: the client stops waiting for its
      // answer, and the server cancels the job.
      const cancelled = e instanceof Error && /cancel/i.test(e.message);
      this.output.appendLine(cancelled ? "  cancelled" : `  failed: ${errorMessage(e)}`);
      const text = cancelled ? `PartIR: the job of ${file} was cancelled` : `PartIR: the job of ${file} failed: ${errorMessage(e)}`;
      void (cancelled ? vscode.window.showWarningMessage : vscode.window.showErrorMessage)(text, "Show Output").then((choice) => {
        if (choice) this.output.show(true);
      });
      return undefined;
    }
  }

  dispose(): void {
    for (const s of [...this.gateListeners.splice(0), ...this.subscriptions]) {
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
