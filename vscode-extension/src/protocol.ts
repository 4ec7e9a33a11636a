// The extension <-> language server protocol (see PROTOCOL.md): method and command names,
// message shapes, and validation of what arrives from the server or from code lenses.
// No `vscode` import: this module is unit-tested under plain Node.

export const IR_REQUEST = "partir/ir";
export const SHOW_IR_COMMAND = "partir.showIr";
export const RUN_JOB_COMMAND = "partir.runJob";
export const RESTART_COMMAND = "partir.restartServer";
export const SHOW_IR_PICKER_COMMAND = "partir.showIrPicker";
export const CONFIG_SECTION = "partir";

/** Commands the server lists in `executeCommandProvider.commands`: vscode-languageclient
 * registers a VS Code command for each, so the extension must never register these names
 * itself (a second registration fails with "command already exists"). */
export const SERVER_COMMANDS = [SHOW_IR_COMMAND, RUN_JOB_COMMAND] as const;

/** Commands the extension registers. Disjoint from `SERVER_COMMANDS`. */
export const CLIENT_COMMANDS = [RESTART_COMMAND, SHOW_IR_PICKER_COMMAND] as const;
export type ClientCommand = (typeof CLIENT_COMMANDS)[number];

/** Context key, true while the language server runs: gates the palette entries of server
 * commands, which exist only then. */
export const SERVER_RUNNING_CONTEXT = "partir.serverRunning";
/** Context key, true once the extension has started the server for schedule files. */
export const ACTIVE_CONTEXT = "partir.active";

export const IR_LEVELS = ["core", "spmd", "hlo"] as const;
export type IrLevel = (typeof IR_LEVELS)[number];

export const IR_LEVEL_LABELS: Readonly<Record<IrLevel, string>> = {
  core: "PartIR:Core",
  spmd: "PartIR:SPMD",
  hlo: "PartIR:HLO",
};

/** Params of the `partir/ir` request: the program after tactic `tactic` (1-based; 0 is the
 * traced program) of the schedule file `uri`, printed at `level`. */
export interface IrParams {
  uri: string;
  tactic: number;
  level: IrLevel;
}

export interface IrResult {
  text: string;
}

/** Arguments of the `partir.showIr` (server) and `partir.showIrPicker` (extension)
 * commands. Missing fields are asked for interactively. */
export interface ShowIrArgs {
  uri: string;
  tactic?: number;
  level?: IrLevel;
}

/** Arguments of the `partir.runJob` command, forwarded unchanged to the server's
 * `workspace/executeCommand`. */
export interface RunJobArgs {
  uri: string;
  steps?: number;
}

/** `initializationOptions` sent with `initialize`; the same keys arrive later under
 * `settings.partir` of `workspace/didChangeConfiguration`. */
export interface InitializationOptions {
  collectiveMarkersInModel: boolean;
  debounceMs: number;
}

export const DEFAULT_DEBOUNCE_MS = 300;

export class ProtocolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ProtocolError";
  }
}

function isRecord(x: unknown): x is Record<string, unknown> {
  return typeof x === "object" && x !== null && !Array.isArray(x);
}

export function isIrLevel(x: unknown): x is IrLevel {
  return typeof x === "string" && (IR_LEVELS as readonly string[]).includes(x);
}

function isTacticIndex(x: unknown): x is number {
  return typeof x === "number" && Number.isInteger(x) && x >= 0;
}

function requireUri(what: string, x: unknown): string {
  if (typeof x !== "string" || x.length === 0) {
    throw new ProtocolError(`${what}: "uri" must be a non-empty string, got ${JSON.stringify(x)}`);
  }
  return x;
}

/** `partir.showIr` / `partir.showIrPicker` arguments: `[]` (palette: undefined) or
 * `[{uri, tactic?, level?}]`. */
export function parseShowIrArgs(args: readonly unknown[]): ShowIrArgs | undefined {
  if (args.length === 0 || args[0] === undefined) {
    return undefined;
  }
  const [arg] = args;
  if (!isRecord(arg)) {
    throw new ProtocolError(`${SHOW_IR_COMMAND}: expected [{uri, tactic, level}], got ${JSON.stringify(args)}`);
  }
  const out: ShowIrArgs = { uri: requireUri(SHOW_IR_COMMAND, arg.uri) };
  if (arg.tactic !== undefined && arg.tactic !== null) {
    if (!isTacticIndex(arg.tactic)) {
      throw new ProtocolError(`${SHOW_IR_COMMAND}: "tactic" must be an integer >= 0, got ${JSON.stringify(arg.tactic)}`);
    }
    out.tactic = arg.tactic;
  }
  if (arg.level !== undefined && arg.level !== null) {
    if (!isIrLevel(arg.level)) {
      throw new ProtocolError(`${SHOW_IR_COMMAND}: "level" must be one of ${IR_LEVELS.join("|")}, got ${JSON.stringify(arg.level)}`);
    }
    out.level = arg.level;
  }
  return out;
}

/** `partir.runJob` arguments: `[]` (palette: undefined) or `[{uri, steps?}]`. */
export function parseRunJobArgs(args: readonly unknown[]): RunJobArgs | undefined {
  if (args.length === 0 || args[0] === undefined) {
    return undefined;
  }
  const [arg] = args;
  if (!isRecord(arg)) {
    throw new ProtocolError(`${RUN_JOB_COMMAND}: expected [{uri, steps}], got ${JSON.stringify(args)}`);
  }
  const out: RunJobArgs = { uri: requireUri(RUN_JOB_COMMAND, arg.uri) };
  if (arg.steps !== undefined && arg.steps !== null) {
    if (typeof arg.steps !== "number" || !Number.isInteger(arg.steps) || arg.steps < 1) {
      throw new ProtocolError(`${RUN_JOB_COMMAND}: "steps" must be an integer >= 1, got ${JSON.stringify(arg.steps)}`);
    }
    out.steps = arg.steps;
  }
  return out;
}

export function validateIrParams(x: unknown): IrParams {
  if (!isRecord(x)) {
    throw new ProtocolError(`${IR_REQUEST}: params must be {uri, tactic, level}, got ${JSON.stringify(x)}`);
  }
  const uri = requireUri(IR_REQUEST, x.uri);
  if (!isTacticIndex(x.tactic)) {
    throw new ProtocolError(`${IR_REQUEST}: "tactic" must be an integer >= 0, got ${JSON.stringify(x.tactic)}`);
  }
  if (!isIrLevel(x.level)) {
    throw new ProtocolError(`${IR_REQUEST}: "level" must be one of ${IR_LEVELS.join("|")}, got ${JSON.stringify(x.level)}`);
  }
  return { uri, tactic: x.tactic, level: x.level };
}

export function parseIrResult(x: unknown): IrResult {
  if (!isRecord(x) || typeof x.text !== "string") {
    throw new ProtocolError(`${IR_REQUEST}: the server's result must be {text: string}, got ${JSON.stringify(x)}`);
  }
  return { text: x.text };
}

function finiteNumber(x: unknown): number | undefined {
  return typeof x === "number" && Number.isFinite(x) ? x : undefined;
}

export function initializationOptions(settings: {
  collectiveMarkersInModel?: unknown;
  debounceMs?: unknown;
}): InitializationOptions {
  const debounce = finiteNumber(settings.debounceMs);
  return {
    collectiveMarkersInModel: settings.collectiveMarkersInModel === true,
    debounceMs: debounce === undefined ? DEFAULT_DEBOUNCE_MS : Math.max(0, Math.round(debounce)),
  };
}

// ---- code lens titles --------------------------------------------------------------------

export const COLLECTIVE_KINDS = [
  "all_gather",
  "all_reduce",
  "reduce_scatter",
  "all_to_all",
  "collective_permute",
] as const;
export type CollectiveKind = (typeof COLLECTIVE_KINDS)[number];
/** The kinds a lens title always shows (zeros included); the others only where non-zero. */
const ALWAYS_SHOWN = 4;

/** The kinds to show of these counts, each with its count: as `render.lens_title` does. */
export function shownCollectives(counts: Partial<Record<string, number>>): [CollectiveKind, number][] {
  return COLLECTIVE_KINDS.map((k, i): [CollectiveKind, number, number] => [k, counts[k] ?? 0, i])
    .filter(([, n, i]) => i < ALWAYS_SHOWN || n !== 0)
    .map(([k, n]) => [k, n]);
}

export const COLLECTIVE_ABBREVIATIONS: Readonly<Record<CollectiveKind, string>> = {
  all_gather: "AG",
  all_reduce: "AR",
  reduce_scatter: "RS",
  all_to_all: "A2A",
  collective_permute: "CP",
};

/** The collective counts in a summary lens title such as `+AG 2 +AR 1 +RS 0 +A2A 0 · …`.
 * Kinds the title does not mention are absent from the result; a kind given twice is an
 * error. */
export function parseCollectiveCounts(title: string): Partial<Record<CollectiveKind, number>> {
  const byAbbreviation = new Map<string, CollectiveKind>(
    COLLECTIVE_KINDS.map((k) => [COLLECTIVE_ABBREVIATIONS[k], k]),
  );
  const out: Partial<Record<CollectiveKind, number>> = {};
  for (const m of title.matchAll(/\+(A2A|AG|AR|RS|CP)\s*(\d+)\b/g)) {
    const kind = byAbbreviation.get(m[1] ?? "");
    if (kind === undefined) {
      continue;
    }
    if (out[kind] !== undefined) {
      throw new ProtocolError(`lens title names +${m[1]} twice: ${JSON.stringify(title)}`);
    }
    out[kind] = Number(m[2]);
  }
  return out;
}

export function formatCollectiveCounts(counts: Partial<Record<CollectiveKind, number>>): string {
  return shownCollectives(counts)
    .map(([k, n]) => `+${COLLECTIVE_ABBREVIATIONS[k]} ${n}`)
    .join(" ");
}

// ---- choosing a tactic from the server's code lenses --------------------------------------

/** A code lens reduced to what the tactic picker needs (no `vscode` types). */
export interface LensInfo {
  line: number;
  title: string;
  command?: string;
  arguments?: readonly unknown[];
}

export interface TacticChoice {
  tactic: number;
  label: string;
  detail?: string;
}

/** The tactic a `partir.showIr` lens of document `uri` shows the IR after, if it is one. */
function showIrTactic(uri: string, lens: LensInfo): number | undefined {
  if (lens.command !== SHOW_IR_COMMAND) {
    return undefined;
  }
  let args: ShowIrArgs | undefined;
  try {
    args = parseShowIrArgs(lens.arguments ?? []);
  } catch {
    return undefined;
  }
  return args !== undefined && sameUri(args.uri, uri) ? args.tactic : undefined;
}

/** The tactics a schedule file's `partir.showIr` lenses offer, in order, with the summary
 * lens title (the one with collective counts) as detail: the summary of the tactic its
 * own command names, else the one on the same line (a one-line list has every tactic's
 * lenses on one line); tactic 0 (the traced program) comes first. */
export function tacticChoices(uri: string, lenses: readonly LensInfo[]): TacticChoice[] {
  const byTactic = new Map<number, string>();
  const byLine = new Map<number, string>();
  for (const lens of lenses) {
    let counts: Partial<Record<CollectiveKind, number>> = {};
    try {
      counts = parseCollectiveCounts(lens.title);
    } catch {
      continue;
    }
    if (Object.keys(counts).length === 0) {
      continue;
    }
    const tactic = showIrTactic(uri, lens);
    if (tactic !== undefined && !byTactic.has(tactic)) {
      byTactic.set(tactic, lens.title);
    }
    if (!byLine.has(lens.line)) {
      byLine.set(lens.line, lens.title);
    }
  }
  const tactics = new Map<number, TacticChoice>();
  for (const lens of lenses) {
    const tactic = showIrTactic(uri, lens);
    if (tactic === undefined || tactics.has(tactic)) {
      continue;
    }
    const detail = byTactic.get(tactic) ?? byLine.get(lens.line);
    tactics.set(tactic, {
      tactic,
      label: `After tactic ${tactic} (line ${lens.line + 1})`,
      ...(detail === undefined ? {} : { detail }),
    });
  }
  const sorted = [...tactics.values()].sort((a, b) => a.tactic - b.tactic);
  if (!tactics.has(0)) {
    sorted.unshift({ tactic: 0, label: "Traced program (before tactic 1)" });
  }
  return sorted;
}

/** Whether two `file:` URIs name the same document, up to percent-encoding (VS Code and
 * pygls encode some characters differently). */
export function sameUri(a: string, b: string): boolean {
  const norm = (u: string): string => {
    try {
      return decodeURIComponent(u);
    } catch {
      return u;
    }
  };
  return a === b || norm(a) === norm(b);
}

/** The server commands `capabilities.executeCommandProvider.commands` lacks: code lenses
 * invoking them would fail with "command not found". */
export function missingServerCommands(advertised: readonly string[] | undefined): string[] {
  return SERVER_COMMANDS.filter((c) => !(advertised ?? []).includes(c));
}

export const SCHEDULE_GLOB = "**/*.partir.py";

/** Documents the client syncs to the server once it runs (the extension starts it only for
 * schedule files, see `StartGate`): schedule files, which stay Python files (no language of
 * their own), and other Python files, where model-code hovers and collective markers
 * appear. The server answers requests on files it does not know with empty results. */
export const DOCUMENT_SELECTOR = [
  { scheme: "file", language: "python", pattern: SCHEDULE_GLOB },
  { scheme: "file", language: "python" },
] as const;

export function isScheduleFile(pathOrUri: string): boolean {
  return /\.partir\.py$/.test(pathOrUri.replace(/[?#].*$/, ""));
}
