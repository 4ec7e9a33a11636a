// The result of the server's `partir.runJob` command, validated and formatted for the
// information message and the "PartIR" output channel. No `vscode` import.

import { COLLECTIVE_ABBREVIATIONS, COLLECTIVE_KINDS, ProtocolError, RUN_JOB_COMMAND, shownCollectives } from "./protocol";

export const JOB_STATUSES = ["finished", "failed", "cancelled"] as const;
export type JobStatus = (typeof JOB_STATUSES)[number];

export interface JobResult {
  job_id: string;
  status: JobStatus;
  /** Mean wall time of one timed step (after the compiling one), seconds. */
  step_time_s: number | null;
  /** Largest |partitioned - unpartitioned| over all outputs. */
  max_abs_error: number | null;
  steps?: number;
  devices?: number;
  platform?: string;
  compile_s?: number;
  collectives?: Record<string, number>;
  error?: string;
  output?: string;
}

function isRecord(x: unknown): x is Record<string, unknown> {
  return typeof x === "object" && x !== null && !Array.isArray(x);
}

function optionalNumber(o: Record<string, unknown>, key: string): number | undefined {
  const v = o[key];
  if (v === undefined || v === null) {
    return undefined;
  }
  if (typeof v !== "number" || !Number.isFinite(v)) {
    throw new ProtocolError(`${RUN_JOB_COMMAND} result: "${key}" must be a finite number, got ${JSON.stringify(v)}`);
  }
  return v;
}

function optionalString(o: Record<string, unknown>, key: string): string | undefined {
  const v = o[key];
  if (v === undefined || v === null) {
    return undefined;
  }
  if (typeof v !== "string") {
    throw new ProtocolError(`${RUN_JOB_COMMAND} result: "${key}" must be a string, got ${JSON.stringify(v)}`);
  }
  return v;
}

export function parseJobResult(x: unknown): JobResult {
  if (!isRecord(x)) {
    throw new ProtocolError(`${RUN_JOB_COMMAND} result must be an object, got ${JSON.stringify(x)}`);
  }
  const id = x.job_id;
  if (!((typeof id === "string" && id !== "") || (typeof id === "number" && Number.isFinite(id)))) {
    throw new ProtocolError(`${RUN_JOB_COMMAND} result: "job_id" must be a string or number, got ${JSON.stringify(id)}`);
  }
  const status = x.status;
  if (typeof status !== "string" || !(JOB_STATUSES as readonly string[]).includes(status)) {
    throw new ProtocolError(`${RUN_JOB_COMMAND} result: "status" must be one of ${JOB_STATUSES.join("|")}, got ${JSON.stringify(status)}`);
  }
  const result: JobResult = {
    job_id: String(id),
    status: status as JobStatus,
    step_time_s: optionalNumber(x, "step_time_s") ?? null,
    max_abs_error: optionalNumber(x, "max_abs_error") ?? null,
  };
  const steps = optionalNumber(x, "steps");
  const devices = optionalNumber(x, "devices");
  const compile = optionalNumber(x, "compile_s");
  const platform = optionalString(x, "platform");
  const error = optionalString(x, "error");
  const output = optionalString(x, "output");
  if (steps !== undefined) result.steps = steps;
  if (devices !== undefined) result.devices = devices;
  if (compile !== undefined) result.compile_s = compile;
  if (platform !== undefined) result.platform = platform;
  if (error !== undefined) result.error = error;
  if (output !== undefined) result.output = output;
  if (x.collectives !== undefined && x.collectives !== null) {
    if (!isRecord(x.collectives) || !Object.values(x.collectives).every((n) => typeof n === "number")) {
      throw new ProtocolError(`${RUN_JOB_COMMAND} result: "collectives" must map kinds to counts, got ${JSON.stringify(x.collectives)}`);
    }
    result.collectives = x.collectives as Record<string, number>;
  }
  if (result.status === "finished" && result.step_time_s === null) {
    throw new ProtocolError(`${RUN_JOB_COMMAND} result: a finished job needs "step_time_s"`);
  }
  return result;
}

/** Seconds as `850 ns`, `12.3 µs`, `4.56 ms`, `1.23 s` or `2 min 5 s`. */
export function formatSeconds(s: number): string {
  const abs = Math.abs(s);
  if (abs === 0) return "0 s";
  if (abs < 1e-6) return `${trim(s * 1e9)} ns`;
  if (abs < 1e-3) return `${trim(s * 1e6)} µs`;
  if (abs < 1) return `${trim(s * 1e3)} ms`;
  if (abs < 60) return `${trim(s)} s`;
  const minutes = Math.floor(abs / 60);
  return `${s < 0 ? "-" : ""}${minutes} min ${Math.round(abs - minutes * 60)} s`;
}

function trim(v: number): string {
  // three significant digits, no trailing zeros: 1.50 -> 1.5, 12.0 -> 12, 123.4 -> 123
  const fixed = Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2);
  return fixed.includes(".") ? fixed.replace(/\.?0+$/, "") : fixed;
}

export function formatError(e: number): string {
  return e === 0 ? "0" : e.toExponential(1);
}

function where(r: JobResult): string {
  const parts: string[] = [];
  if (r.steps !== undefined) parts.push(`${r.steps} step${r.steps === 1 ? "" : "s"}`);
  if (r.devices !== undefined) parts.push(`${r.devices}${r.platform ? ` ${r.platform}` : ""} device${r.devices === 1 ? "" : "s"}`);
  return parts.length ? ` (${parts.join(" on ")})` : "";
}

/** One line for the information (or error) message. */
export function formatJobMessage(r: JobResult, file?: string): string {
  const subject = `PartIR job ${r.job_id}${file ? ` (${file})` : ""}`;
  if (r.status === "finished") {
    const step = r.step_time_s === null ? "" : ` ${formatSeconds(r.step_time_s)} per step`;
    const err = r.max_abs_error === null ? "" : `, max abs error ${formatError(r.max_abs_error)}`;
    return `${subject} finished:${step}${err}${where(r)}`;
  }
  return `${subject} ${r.status}${r.error ? `: ${r.error}` : ""}`;
}

/** Lines for the output channel. */
export function formatJobReport(r: JobResult, file?: string, now: Date = new Date()): string[] {
  const lines = [`[${now.toISOString()}] ${formatJobMessage(r, file)}`];
  if (r.step_time_s !== null) lines.push(`  step time      ${formatSeconds(r.step_time_s)}`);
  if (r.max_abs_error !== null) lines.push(`  max abs error  ${r.max_abs_error.toExponential(3)}`);
  if (r.compile_s !== undefined) lines.push(`  compile        ${formatSeconds(r.compile_s)}`);
  if (r.steps !== undefined) lines.push(`  steps          ${r.steps}`);
  if (r.devices !== undefined) lines.push(`  devices        ${r.devices}${r.platform ? ` (${r.platform})` : ""}`);
  if (r.collectives !== undefined) {
    const known = shownCollectives(r.collectives).map(([k, n]) => `${COLLECTIVE_ABBREVIATIONS[k]} ${n}`);
    const other = Object.entries(r.collectives)
      .filter(([k]) => !(COLLECTIVE_KINDS as readonly string[]).includes(k))
      .map(([k, n]) => `${k} ${n}`);
    lines.push(`  collectives    ${[...known, ...other].join(", ")}`);
  }
  if (r.error !== undefined) lines.push(`  error          ${r.error}`);
  if (r.output !== undefined && r.output.trim() !== "") {
    lines.push("  output:", ...r.output.replace(/\s+$/, "").split(/\r?\n/).map((l) => `    ${l}`));
  }
  return lines;
}
