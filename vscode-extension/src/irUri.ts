// Virtual IR documents: `partir-ir:/<file> after tactic <n>.<level>.txt?<params>`.
// The path is only for the editor tab; the query carries the `partir/ir` params as base64url
// JSON, so no character of the schedule file's URI can be confused with URI syntax.
// No `vscode` import.

import { IR_LEVEL_LABELS, type IrParams, ProtocolError, validateIrParams } from "./protocol";

export const IR_SCHEME = "partir-ir";

/** Last path segment of a URI, percent-decoded. */
export function uriBasename(uri: string): string {
  const withoutQuery = uri.replace(/[?#].*$/, "");
  const segment = withoutQuery.replace(/\/+$/, "").split("/").pop() ?? "";
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}

export function irTitle(params: IrParams): string {
  const when = params.tactic === 0 ? "traced program" : `after tactic ${params.tactic}`;
  return `${uriBasename(params.uri)} ${when} (${IR_LEVEL_LABELS[params.level]})`;
}

/** The virtual document's path: readable in the tab, and distinct per (file, tactic, level)
 * for files with the same name, because the query differs. */
export function irDocumentPath(params: IrParams): string {
  const name = uriBasename(params.uri).replace(/[\\/]/g, "_") || "schedule";
  const when = params.tactic === 0 ? "traced" : `after tactic ${params.tactic}`;
  return `/${name} ${when}.${params.level}.txt`;
}

export function irQuery(params: IrParams): string {
  const { uri, tactic, level } = validateIrParams(params);
  return Buffer.from(JSON.stringify({ uri, tactic, level }), "utf8").toString("base64url");
}

export function parseIrQuery(query: string): IrParams {
  if (!/^[A-Za-z0-9_-]+$/.test(query)) {
    throw new ProtocolError(`not a ${IR_SCHEME} document query: ${JSON.stringify(query)}`);
  }
  let decoded: unknown;
  try {
    decoded = JSON.parse(Buffer.from(query, "base64url").toString("utf8"));
  } catch {
    throw new ProtocolError(`not a ${IR_SCHEME} document query: ${JSON.stringify(query)}`);
  }
  return validateIrParams(decoded);
}

/** First line of an IR document whose schedule file no longer loads. */
export const STALE_IR_MARK = "// STALE";

/** The last IR shown of a schedule file that no longer loads, marked stale with the reason
 * (the `partir/ir` error) above it. */
export function staleIr(last: string, reason: string): string {
  const body = last.startsWith(STALE_IR_MARK) ? last.slice(last.indexOf("\n") + 1) : last;
  return `${STALE_IR_MARK}: ${reason.replace(/\s+/g, " ")}. The IR below is from the last version that loaded.\n${body}`;
}
