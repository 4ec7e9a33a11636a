// Read-only `partir-ir:` documents: the program after a tactic, fetched from the server with
// the `partir/ir` request, refreshed when the schedule file changes; while it does not load,
// the last IR shown stays, marked stale.

import * as vscode from "vscode";
import type { LanguageClient } from "vscode-languageclient/node";

import { IR_SCHEME, parseIrQuery, staleIr } from "./irUri";
import { IR_REQUEST, type IrParams, parseIrResult, sameUri } from "./protocol";

const REFRESH_DELAY_MS = 1000;

export class IrDocuments implements vscode.TextDocumentContentProvider, vscode.Disposable {
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.changed.event;
  private readonly subscriptions: vscode.Disposable[] = [this.changed];
  private readonly pending = new Map<string, ReturnType<typeof setTimeout>>();
  /** The last IR fetched for each open document (by URI), shown stale when a refresh fails. */
  private readonly shown = new Map<string, string>();

  constructor(private readonly client: () => LanguageClient | undefined) {
    this.subscriptions.push(
      vscode.workspace.onDidSaveTextDocument((doc) => this.refresh(doc.uri.toString(), 0)),
      vscode.workspace.onDidCloseTextDocument((doc) => this.shown.delete(doc.uri.toString())),
      vscode.workspace.onDidChangeTextDocument((e) => {
        if (e.contentChanges.length > 0 && e.document.uri.scheme === "file") {
          this.refresh(e.document.uri.toString(), REFRESH_DELAY_MS);
        }
      }),
    );
  }

  async provideTextDocumentContent(uri: vscode.Uri, token: vscode.CancellationToken): Promise<string> {
    const params: IrParams = parseIrQuery(uri.query);
    const client = this.client();
    if (client === undefined || !client.isRunning()) {
      throw new Error("the PartIR language server is not running (command: PartIR: Restart Language Server)");
    }
    const key = uri.toString();
    try {
      const result: unknown = await client.sendRequest(IR_REQUEST, params, token);
      const text = parseIrResult(result).text;
      this.shown.set(key, text);
      return text;
    } catch (e) {
      const last = this.shown.get(key);
      if (last === undefined || token.isCancellationRequested) {
        throw e;
      }
      return staleIr(last, e instanceof Error ? e.message : String(e));
    }
  }

  /** Re-fetches the open IR documents of schedule file `sourceUri` after `delayMs`. */
  refresh(sourceUri: string, delayMs: number): void {
    const open = vscode.workspace.textDocuments.filter((doc) => {
      if (doc.uri.scheme !== IR_SCHEME || doc.isClosed) {
        return false;
      }
      try {
        return sameUri(parseIrQuery(doc.uri.query).uri, sourceUri);
      } catch {
        return false;
      }
    });
    if (open.length === 0) {
      return;
    }
    const previous = this.pending.get(sourceUri);
    if (previous !== undefined) {
      clearTimeout(previous);
    }
    this.pending.set(
      sourceUri,
      setTimeout(() => {
        this.pending.delete(sourceUri);
        for (const doc of open) {
          this.changed.fire(doc.uri);
        }
      }, delayMs),
    );
  }

  /** All open IR documents. */
  refreshAll(): void {
    for (const doc of vscode.workspace.textDocuments) {
      if (doc.uri.scheme === IR_SCHEME && !doc.isClosed) {
        this.changed.fire(doc.uri);
      }
    }
  }

  dispose(): void {
    for (const timer of this.pending.values()) {
      clearTimeout(timer);
    }
    this.pending.clear();
    for (const s of this.subscriptions) {
      s.dispose();
    }
  }
}
