"""`python -m vllm_rs serve`: the supervisor (`serve.py`), its options
(`cli_args.py`), the served model (`serve_model.py`), where the frontend
binary is (`frontend_binary.py`) and the data-parallel coordinator process
(`coordinator.py`).
"""
