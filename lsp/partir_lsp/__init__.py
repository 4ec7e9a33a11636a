"""The PartIR language server: live partitioning feedback in schedule files (`*.partir.py`)
and the model code they partition, computed by the compiler daemon (`partir_daemon`).

    python -m partir_lsp          # or: partir lsp   (LSP over stdio)

See `lsp/README.md` for what it shows and `vscode-extension/PROTOCOL.md` for the protocol
the VS Code extension relies on.
"""

__version__ = "0.1.0"
