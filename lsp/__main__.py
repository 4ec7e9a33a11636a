"""`python -m lsp`: the PartIR language server over stdio."""

from lsp.server import main

raise SystemExit(main())
