"""`python -m partir_lsp`: the PartIR language server over stdio."""

from partir_lsp.server import main

raise SystemExit(main())
