#!/usr/bin/env bash
# Installs code-server 4.100.3 (VS Code 1.100.3, the last release on Node 20) from npm into
# $1 (default ~/.cache/partir-e2e/code-server), for tests/e2e/test_vscode_e2e.py. npm's
# own postinstall downloads nothing but builds native modules with node-gyp, which would
# fetch Node's headers: here every step runs with --ignore-scripts and the native modules
# are rebuilt against the system Node's headers (/usr/include/node) instead. Ripgrep comes
# from Debian (the npm package downloads its binary). Idempotent: a finished install
# (its marker file) is left as it is.
set -euo pipefail
VERSION=4.100.3
DEST=${1:-${HOME}/.cache/partir-e2e/code-server}
mkdir -p "$DEST"
cd "$DEST"
MARKER="$DEST/.installed-$VERSION"
[ -f "$MARKER" ] && { echo "code-server $VERSION already in $DEST"; exit 0; }
command -v rg >/dev/null || { echo "install_code_server: no rg (apt-get install ripgrep)" >&2; exit 1; }
export npm_config_nodedir=/usr npm_config_yes=true npm_config_audit=false npm_config_fund=false
npm install "code-server@$VERSION" --omit=dev --ignore-scripts
CS="$DEST/node_modules/code-server"
npm rebuild argon2  # hoisted to the top node_modules
# What code-server's postinstall.sh does, less its network steps.
(
  cd "$CS/lib/vscode"
  npm install --omit=dev --ignore-scripts
  mkdir -p node_modules/@vscode/ripgrep/bin
  ln -sf "$(command -v rg)" node_modules/@vscode/ripgrep/bin/rg
  npm rebuild
  rm -rf node_modules.asar && ln -s node_modules node_modules.asar
  (cd bin/remote-cli && ln -sf code-linux.sh code-server)
  (cd bin/helpers && ln -sf browser-linux.sh browser.sh)
  cd extensions && npm install --omit=dev --ignore-scripts
)
touch "$MARKER"
echo "code-server $VERSION installed in $DEST"
