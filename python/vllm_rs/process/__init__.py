"""The process layer: every child is started, watched and stopped through the
Rust process core (`core.py`), with vLLM's manager classes on top
(`managers.py`, `shutdown.py`), the one launch of the Rust frontend
(`rust_frontend.py`), and what a child does first (`child_entry.py`,
`child_setup.py`). Nothing here imports the serving stack's modules except
the frontend launch, which renders `serve`'s arguments as `--args-json`.
"""
