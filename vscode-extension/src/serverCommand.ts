// How the language server is started, from the extension's settings. No `vscode` import.

export const DEFAULT_PYTHON = "python3";
export const SERVER_MODULE_ARGS: readonly string[] = ["-m", "partir_lsp"];

export interface ServerSettings {
  /** `partir.pythonPath`: an interpreter; empty means "not set". */
  pythonPath?: unknown;
  /** `partir.serverCommand`: the full command line; empty means "not set". */
  serverCommand?: unknown;
}

export interface ResolveContext {
  /** Path of the workspace folder, for `${workspaceFolder}` and as the server's cwd. */
  workspaceFolder?: string;
  /** For `${env:NAME}`. */
  env: Readonly<Record<string, string | undefined>>;
  /** The Python extension's selected interpreter as a command prefix, when available. */
  pythonExtensionCommand?: readonly string[];
}

export type ServerCommandSource = "partir.serverCommand" | "partir.pythonPath" | "python extension" | "default";

export interface ServerCommand {
  command: string;
  args: string[];
  source: ServerCommandSource;
}

export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ConfigError";
  }
}

/** Expands `${workspaceFolder}`, `${env:NAME}` (empty when unset) and a leading `~/`. */
export function expandVariables(value: string, ctx: ResolveContext): string {
  let out = value.replace(/\$\{([^}]*)\}/g, (whole, name: string) => {
    if (name === "workspaceFolder") {
      if (ctx.workspaceFolder === undefined) {
        throw new ConfigError(`${whole} in ${JSON.stringify(value)} needs an open workspace folder`);
      }
      return ctx.workspaceFolder;
    }
    if (name.startsWith("env:")) {
      return ctx.env[name.slice(4)] ?? "";
    }
    throw new ConfigError(`unknown variable ${whole} in ${JSON.stringify(value)} (supported: \${workspaceFolder}, \${env:NAME})`);
  });
  const home = ctx.env.HOME ?? ctx.env.USERPROFILE;
  if (home !== undefined && (out === "~" || out.startsWith("~/"))) {
    out = home + out.slice(1);
  }
  return out;
}

/** Resolution order: `partir.serverCommand`, then `<python> -m partir_lsp` with `partir.pythonPath`,
 * the Python extension's interpreter, or `python3`. */
export function resolveServerCommand(settings: ServerSettings, ctx: ResolveContext): ServerCommand {
  const { serverCommand, pythonPath } = settings;
  if (serverCommand !== undefined && serverCommand !== null) {
    if (!Array.isArray(serverCommand) || !serverCommand.every((s): s is string => typeof s === "string")) {
      throw new ConfigError(`partir.serverCommand must be an array of strings, got ${JSON.stringify(serverCommand)}`);
    }
    if (serverCommand.length > 0) {
      const [command, ...args] = serverCommand.map((s) => expandVariables(s, ctx));
      if (command === undefined || command.trim() === "") {
        throw new ConfigError("partir.serverCommand: the first element (the program) is empty");
      }
      return { command, args, source: "partir.serverCommand" };
    }
  }
  if (pythonPath !== undefined && pythonPath !== null && typeof pythonPath !== "string") {
    throw new ConfigError(`partir.pythonPath must be a string, got ${JSON.stringify(pythonPath)}`);
  }
  if (typeof pythonPath === "string" && pythonPath.trim() !== "") {
    return {
      command: expandVariables(pythonPath.trim(), ctx),
      args: [...SERVER_MODULE_ARGS],
      source: "partir.pythonPath",
    };
  }
  const fromExtension = ctx.pythonExtensionCommand?.filter((s) => s.length > 0);
  if (fromExtension !== undefined && fromExtension.length > 0) {
    const [command, ...prefix] = fromExtension;
    return { command: command as string, args: [...prefix, ...SERVER_MODULE_ARGS], source: "python extension" };
  }
  return { command: DEFAULT_PYTHON, args: [...SERVER_MODULE_ARGS], source: "default" };
}

/** A shell-like rendering of a command line for messages and logs. */
export function formatCommandLine(cmd: { command: string; args: readonly string[] }): string {
  return [cmd.command, ...cmd.args]
    .map((part) => (/^[\w@%+=:,./-]+$/.test(part) ? part : `'${part.replace(/'/g, `'\\''`)}'`))
    .join(" ");
}

function isRecord(x: unknown): x is Record<string, unknown> {
  return (typeof x === "object" || typeof x === "function") && x !== null;
}

/** The selected interpreter from the Python extension's exported API (`ms-python.python`),
 * whose shape is not typed here: `environments.getActiveEnvironmentPath(resource).path`
 * (current API), else `settings.getExecutionDetails(resource).execCommand` (older API). */
export function interpreterFromPythonApi(api: unknown, resource?: unknown): string[] | undefined {
  if (!isRecord(api)) {
    return undefined;
  }
  const environments = api.environments;
  if (isRecord(environments) && typeof environments.getActiveEnvironmentPath === "function") {
    const env: unknown = (environments.getActiveEnvironmentPath as (r?: unknown) => unknown)(resource);
    if (isRecord(env) && typeof env.path === "string" && env.path.trim() !== "" && env.path !== "python") {
      return [env.path];
    }
  }
  const settings = api.settings;
  if (isRecord(settings) && typeof settings.getExecutionDetails === "function") {
    const details: unknown = (settings.getExecutionDetails as (r?: unknown) => unknown)(resource);
    if (isRecord(details) && Array.isArray(details.execCommand)) {
      const parts = details.execCommand.filter((s): s is string => typeof s === "string" && s !== "");
      if (parts.length > 0) {
        return parts;
      }
    }
  }
  return undefined;
}
