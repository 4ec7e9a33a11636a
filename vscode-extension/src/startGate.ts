// When the extension starts the language server. VS Code has no activation event for a
// file pattern, so the extension activates on `onLanguage:python` too (to see a schedule
// file opened outside a workspace that contains one); this gate keeps that activation inert
// in Python projects without schedule files: no server, no output channels, no messages.
// No `vscode` import.

import { isScheduleFile } from "./protocol";

/** The part of a document's URI the gate looks at. */
export interface DocumentUri {
  scheme: string;
  path: string;
}

/** A schedule file on disk: the documents the server analyses. */
export function isScheduleDocument(uri: DocumentUri): boolean {
  return uri.scheme === "file" && isScheduleFile(uri.path);
}

/** Calls `start` once, at the first schedule file opened or found in the workspace. */
export class StartGate {
  private opened = false;

  constructor(private readonly start: () => void) {}

  get isOpen(): boolean {
    return this.opened;
  }

  /** A document was opened (or was open at activation). */
  documentOpened(uri: DocumentUri): void {
    if (isScheduleDocument(uri)) {
      this.open();
    }
  }

  /** A search of the workspace folders for schedule files ended with `found` of them. */
  workspaceSearched(found: number): void {
    if (found > 0) {
      this.open();
    }
  }

  /** Starts regardless of the files (the user asked for the server). */
  open(): void {
    if (!this.opened) {
      this.opened = true;
      this.start();
    }
  }
}
