"""The process layer: every child is started, watched and stopped through the
Rust process core (`core.py`), with vLLM's manager classes on top
(`managers.py`, `shutdown.py`), the one launch of the Rust frontend
(`rust_frontend.py`), and what a child does first (`child_entry.py`,
`child_setup.py`). Only the frontend launch reaches into `serving/`: for
`serve`'s arguments as `--args-json` and for where the binary is.
"""
