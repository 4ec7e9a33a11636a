import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  ConfigError,
  expandVariables,
  formatCommandLine,
  interpreterFromPythonApi,
  type ResolveContext,
  resolveServerCommand,
} from "../../src/serverCommand";

const ctx: ResolveContext = { workspaceFolder: "/home/u/proj", env: { HOME: "/home/u", VENV: "/opt/venv" } };

describe("resolveServerCommand", () => {
  it("defaults to python3 -m partir_lsp", () => {
    assert.deepEqual(resolveServerCommand({}, { env: {} }), { command: "python3", args: ["-m", "partir_lsp"], source: "default" });
  });

  it("treats empty settings as unset", () => {
    const r = resolveServerCommand({ pythonPath: "  ", serverCommand: [] }, { env: {} });
    assert.equal(r.source, "default");
    assert.equal(r.command, "python3");
  });

  it("uses partir.pythonPath with -m partir_lsp, expanding variables", () => {
    assert.deepEqual(resolveServerCommand({ pythonPath: "${workspaceFolder}/.venv/bin/python" }, ctx), {
      command: "/home/u/proj/.venv/bin/python",
      args: ["-m", "partir_lsp"],
      source: "partir.pythonPath",
    });
    assert.equal(resolveServerCommand({ pythonPath: "${env:VENV}/bin/python" }, ctx).command, "/opt/venv/bin/python");
    assert.equal(resolveServerCommand({ pythonPath: "~/py/bin/python" }, ctx).command, "/home/u/py/bin/python");
  });

  it("prefers partir.serverCommand over everything", () => {
    const r = resolveServerCommand(
      { pythonPath: "/usr/bin/python3.11", serverCommand: ["partir", "lsp", "--log", "${workspaceFolder}/lsp.log"] },
      { ...ctx, pythonExtensionCommand: ["/x/python"] },
    );
    assert.deepEqual(r, { command: "partir", args: ["lsp", "--log", "/home/u/proj/lsp.log"], source: "partir.serverCommand" });
  });

  it("prefers partir.pythonPath over the Python extension's interpreter", () => {
    const r = resolveServerCommand({ pythonPath: "/usr/bin/python3.11" }, { ...ctx, pythonExtensionCommand: ["/x/python"] });
    assert.equal(r.command, "/usr/bin/python3.11");
  });

  it("uses the Python extension's interpreter, keeping a multi-part command as a prefix", () => {
    assert.deepEqual(resolveServerCommand({}, { env: {}, pythonExtensionCommand: ["/x/bin/python"] }), {
      command: "/x/bin/python",
      args: ["-m", "partir_lsp"],
      source: "python extension",
    });
    assert.deepEqual(resolveServerCommand({}, { env: {}, pythonExtensionCommand: ["conda", "run", "-n", "jax", "python"] }), {
      command: "conda",
      args: ["run", "-n", "jax", "python", "-m", "partir_lsp"],
      source: "python extension",
    });
    assert.equal(resolveServerCommand({}, { env: {}, pythonExtensionCommand: [] }).source, "default");
  });

  it("rejects malformed settings with a message naming the setting", () => {
    assert.throws(() => resolveServerCommand({ serverCommand: "partir lsp" }, ctx), /partir\.serverCommand must be an array of strings/);
    assert.throws(() => resolveServerCommand({ serverCommand: ["partir", 3] }, ctx), ConfigError);
    assert.throws(() => resolveServerCommand({ serverCommand: ["", "lsp"] }, ctx), /first element/);
    assert.throws(() => resolveServerCommand({ pythonPath: 3 }, ctx), /partir\.pythonPath must be a string/);
  });
});

describe("expandVariables", () => {
  it("needs a workspace folder for ${workspaceFolder}", () => {
    assert.throws(() => expandVariables("${workspaceFolder}/x", { env: {} }), /needs an open workspace folder/);
  });
  it("expands unset environment variables to nothing", () => {
    assert.equal(expandVariables("a${env:NOPE}b", { env: {} }), "ab");
  });
  it("rejects unknown variables", () => {
    assert.throws(() => expandVariables("${userHome}/x", ctx), /unknown variable \$\{userHome\}/);
  });
  it("leaves ~ alone inside a path", () => {
    assert.equal(expandVariables("/a/~/b", ctx), "/a/~/b");
  });
});

describe("formatCommandLine", () => {
  it("quotes only what needs quoting", () => {
    assert.equal(formatCommandLine({ command: "/usr/bin/python3", args: ["-m", "partir_lsp"] }), "/usr/bin/python3 -m partir_lsp");
    assert.equal(formatCommandLine({ command: "/My Apps/py", args: ["it's"] }), `'/My Apps/py' 'it'\\''s'`);
  });
});

describe("interpreterFromPythonApi", () => {
  it("reads the current environments API", () => {
    const seen: unknown[] = [];
    const api = {
      environments: {
        getActiveEnvironmentPath: (r: unknown) => {
          seen.push(r);
          return { id: "x", path: "/venv/bin/python" };
        },
      },
    };
    assert.deepEqual(interpreterFromPythonApi(api, "resource"), ["/venv/bin/python"]);
    assert.deepEqual(seen, ["resource"]);
  });

  it("falls back to the older settings API", () => {
    const api = {
      environments: { getActiveEnvironmentPath: () => ({ id: "default", path: "python" }) },
      settings: { getExecutionDetails: () => ({ execCommand: ["conda", "run", "python"] }) },
    };
    assert.deepEqual(interpreterFromPythonApi(api), ["conda", "run", "python"]);
  });

  it("returns undefined for anything else", () => {
    assert.equal(interpreterFromPythonApi(undefined), undefined);
    assert.equal(interpreterFromPythonApi({}), undefined);
    assert.equal(interpreterFromPythonApi({ settings: { getExecutionDetails: () => ({ execCommand: undefined }) } }), undefined);
    assert.equal(interpreterFromPythonApi({ environments: { getActiveEnvironmentPath: () => undefined } }), undefined);
  });
});
