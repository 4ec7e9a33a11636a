// A minimal LSP client over stdio built on vscode-languageserver-protocol, the transport
// VS Code's language client uses: spawns the server, answers the requests a server may send
// to its client, records what it publishes, and waits for conditions with a deadline.

import { type ChildProcess, spawn } from "node:child_process";

import { StreamMessageReader, StreamMessageWriter } from "vscode-jsonrpc/node";
import {
  ConfigurationRequest,
  createProtocolConnection,
  type Diagnostic,
  LogMessageNotification,
  type ProtocolConnection,
  PublishDiagnosticsNotification,
  type PublishDiagnosticsParams,
  RegistrationRequest,
  ShowDocumentRequest,
  type ShowDocumentParams,
  ShowMessageNotification,
  UnregistrationRequest,
  WorkDoneProgress,
  WorkDoneProgressCreateRequest,
  type WorkDoneProgressBegin,
  type WorkDoneProgressEnd,
  type WorkDoneProgressReport,
} from "vscode-languageserver-protocol/node";

export interface ProgressEvent {
  token: string | number;
  value: WorkDoneProgressBegin | WorkDoneProgressReport | WorkDoneProgressEnd;
}

export class ServerHarness {
  readonly connection: ProtocolConnection;
  readonly diagnostics: PublishDiagnosticsParams[] = [];
  readonly progress: ProgressEvent[] = [];
  readonly createdTokens: (string | number)[] = [];
  /** `window/showDocument` requests, answered with success as VS Code does. */
  readonly shownDocuments: ShowDocumentParams[] = [];
  readonly serverRequests: string[] = [];
  readonly logs: string[] = [];
  private stderr = "";
  private exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  private readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private readonly listeners = new Set<() => void>();

  private constructor(
    readonly process: ChildProcess,
    readonly commandLine: string,
    private readonly settings: Record<string, unknown>,
  ) {
    if (!process.stdout || !process.stdin || !process.stderr) {
      throw new Error("the server must be spawned with piped stdio");
    }
    process.stderr.setEncoding("utf8");
    process.stderr.on("data", (chunk: string) => {
      this.stderr = (this.stderr + chunk).slice(-20000);
    });
    this.exited = new Promise((resolve) => {
      process.on("exit", (code, signal) => {
        this.exit = { code, signal };
        this.changed();
        resolve(this.exit);
      });
      process.on("error", (e) => {
        this.stderr += `\n[spawn error] ${e.message}`;
        this.exit = { code: null, signal: null };
        this.changed();
        resolve(this.exit);
      });
    });
    this.connection = createProtocolConnection(
      new StreamMessageReader(process.stdout),
      new StreamMessageWriter(process.stdin),
    );
    this.installHandlers();
    this.connection.listen();
  }

  static spawn(command: string, args: string[], cwd: string, settings: Record<string, unknown>): ServerHarness {
    const child = spawn(command, args, { cwd, stdio: ["pipe", "pipe", "pipe"], env: process.env });
    return new ServerHarness(child, [command, ...args].join(" "), settings);
  }

  private installHandlers(): void {
    const c = this.connection;
    const record = (method: string): void => {
      this.serverRequests.push(method);
      this.changed();
    };
    c.onNotification(PublishDiagnosticsNotification.type, (params) => {
      this.diagnostics.push(params);
      this.changed();
    });
    c.onNotification(LogMessageNotification.type, (p) => this.logs.push(`[log ${p.type}] ${p.message}`));
    c.onNotification(ShowMessageNotification.type, (p) => this.logs.push(`[show ${p.type}] ${p.message}`));
    c.onRequest(ConfigurationRequest.type, (params) => {
      record(ConfigurationRequest.method);
      return params.items.map((item) => {
        if (item.section === "partir") return this.settings;
        if (item.section?.startsWith("partir.")) return this.settings[item.section.slice("partir.".length)] ?? null;
        return null;
      });
    });
    c.onRequest(WorkDoneProgressCreateRequest.type, (params) => {
      record(WorkDoneProgressCreateRequest.method);
      this.createdTokens.push(params.token);
      c.onProgress(WorkDoneProgress.type, params.token, (value) => {
        this.progress.push({ token: params.token, value });
        this.changed();
      });
      return null;
    });
    c.onRequest(ShowDocumentRequest.type, (params) => {
      this.shownDocuments.push(params);
      record(ShowDocumentRequest.method);
      return { success: true };
    });
    c.onRequest(RegistrationRequest.type, () => {
      record(RegistrationRequest.method);
    });
    c.onRequest(UnregistrationRequest.type, () => {
      record(UnregistrationRequest.method);
    });
    for (const method of [
      "workspace/codeLens/refresh",
      "workspace/inlayHint/refresh",
      "workspace/diagnostic/refresh",
      "workspace/semanticTokens/refresh",
      "window/showMessageRequest",
    ]) {
      c.onRequest(method, () => {
        record(method);
        return null;
      });
    }
    c.onUnhandledNotification((n) => this.logs.push(`[unhandled notification] ${n.method}`));
    c.onError(([e]) => this.logs.push(`[connection error] ${e.message}`));
  }

  private changed(): void {
    for (const listener of [...this.listeners]) {
      listener();
    }
  }

  get hasExited(): boolean {
    return this.exit !== undefined;
  }

  /** What to print when something goes wrong. */
  context(): string {
    const diags = this.diagnostics
      .slice(-6)
      .map((d) => `  ${d.uri} v${d.version ?? "-"}: ${JSON.stringify(d.diagnostics.map(brief))}`)
      .join("\n");
    return [
      `server: ${this.commandLine}${this.exit ? ` (exited: code ${this.exit.code}, signal ${this.exit.signal})` : ""}`,
      `requests from the server: ${this.serverRequests.join(", ") || "none"}`,
      `last diagnostics:\n${diags || "  none"}`,
      `log:\n${this.logs.slice(-20).join("\n") || "  none"}`,
      `stderr (tail):\n${this.stderr.slice(-4000) || "  empty"}`,
    ].join("\n");
  }

  /** Resolves with `check()`'s first defined value, re-checked whenever the server sends
   * something; rejects after `timeoutMs` or when the server exits. */
  waitFor<T>(what: string, timeoutMs: number, check: () => T | undefined): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const finish = (error?: Error, value?: T): void => {
        this.listeners.delete(listener);
        if (timer !== undefined) clearTimeout(timer);
        if (error) reject(error);
        else resolve(value as T);
      };
      const listener = (): void => {
        let value: T | undefined;
        try {
          value = check();
        } catch (e) {
          finish(e instanceof Error ? e : new Error(String(e)));
          return;
        }
        if (value !== undefined) {
          finish(undefined, value);
        } else if (this.hasExited) {
          finish(new Error(`the server exited while waiting for ${what}\n${this.context()}`));
        }
      };
      this.listeners.add(listener);
      timer = setTimeout(() => finish(new Error(`timed out after ${timeoutMs} ms waiting for ${what}\n${this.context()}`)), timeoutMs);
      listener();
    });
  }

  /** `request` (a request to the server), failing after `timeoutMs` or when the server
   * exits, with the server's context in the message. */
  guard<T>(what: string, timeoutMs: number, request: Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const cleanup = (): void => {
        clearTimeout(timer);
        this.listeners.delete(listener);
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}\n${this.context()}`));
      }, timeoutMs);
      const listener = (): void => {
        if (this.hasExited) {
          cleanup();
          reject(new Error(`the server exited while waiting for ${what}\n${this.context()}`));
        }
      };
      this.listeners.add(listener);
      listener();
      request.then(
        (value) => {
          cleanup();
          resolve(value);
        },
        (e: unknown) => {
          cleanup();
          reject(new Error(`${what} failed: ${e instanceof Error ? e.message : String(e)}\n${this.context()}`));
        },
      );
    });
  }

  /** Runs `attempt` every `intervalMs` until it returns a value, the deadline passes or the
   * server exits; for results the server computes in the background (code lenses). */
  async poll<T>(what: string, timeoutMs: number, intervalMs: number, attempt: () => Promise<T | undefined>): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    let last: unknown;
    for (;;) {
      if (this.hasExited) {
        throw new Error(`the server exited while waiting for ${what}\n${this.context()}`);
      }
      const value = await attempt();
      if (value !== undefined) {
        return value;
      }
      last = value;
      if (Date.now() > deadline) {
        throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${JSON.stringify(last)})\n${this.context()}`);
      }
      await new Promise((r) => setTimeout(r, intervalMs));
    }
  }

  waitForExit(timeoutMs: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    return Promise.race([
      this.exited,
      new Promise<never>((_, reject) =>
        setTimeout(() => reject(new Error(`the server did not exit within ${timeoutMs} ms\n${this.context()}`)), timeoutMs).unref(),
      ),
    ]);
  }

  /** Ends the server if it is still running (test cleanup). */
  dispose(): void {
    this.connection.dispose();
    if (!this.hasExited) {
      this.process.kill("SIGKILL");
    }
    this.process.stdin?.destroy();
    this.process.stdout?.destroy();
    this.process.stderr?.destroy();
  }
}

export function brief(d: Diagnostic): string {
  return `${d.range.start.line}:${d.range.start.character} sev${d.severity ?? "?"} ${d.message.split("\n")[0]}`;
}
