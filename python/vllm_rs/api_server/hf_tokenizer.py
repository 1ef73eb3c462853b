"""Hugging Face tokenizers in the Python API server, as in the Rust frontend:
`tokenizer.json` through the `tokenizers` package, the EOS token and the chat
template from `tokenizer_config.json`, and streaming detokenization as vLLM
0.33's `FastIncrementalDetokenizer` does it (a `DecodeStream` primed with the
prompt's ids, so the first generated token decodes in the prompt's context)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers
from jinja2 import meta
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers.decoders import DecodeStream

from vllm_rs.api_server.template_kwargs import template_variables
from vllm_rs.api_server.tokenizer import ChatMessage, ChatTemplateError, DecodeOptions, TokenizerLoadError
from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: The start of the error `tokenizers` raises when more context changed text
#: it had already returned (its `DecodeStreamError::InvalidPrefix`).
INVALID_PREFIX_ERROR = "Invalid prefix encountered"

#: Most tokens one UTF-8 character can span (one byte each).
MAX_TOKENS_PER_CHAR = 4


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise TokenizerLoadError(f"{path} is not readable JSON: {e}") from None


def _special_token(config: Any, key: str) -> str | None:
    """A special token in `tokenizer_config.json`: a string or `{"content": ...}`."""
    value = config.get(key) if isinstance(config, dict) else None
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template_source(config: Any) -> str | None:
    """The chat template: a string, or the `default` one of a named list."""
    value = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(value, list):
        named = [t for t in value if isinstance(t, dict)]
        chosen = next((t for t in named if t.get("name") == "default"), named[0] if named else {})
        value = chosen.get("template")
    return value if isinstance(value, str) else None


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


class IncrementalDecoder:
    """Decodes one request's generated ids, releasing text once it no longer
    ends in an incomplete character; a character left incomplete at the end
    is never emitted (as in vLLM)."""

    def __init__(self, tokenizer: HfTokenizer, prompt: list[int], options: DecodeOptions):
        self._tokenizer = tokenizer.inner
        self._skip_special_tokens = options.skip_special_tokens
        joined = not options.skip_special_tokens and not options.spaces_between_special_tokens
        self._joined_added_tokens = tokenizer.added_tokens if joined and tokenizer.added_tokens else None
        self._last_was_added = False
        self._stream = self._primed_stream(prompt)

    def _primed_stream(self, prompt: list[int]) -> DecodeStream:
        """A stream whose context is the prompt, like `DecodeStream(ids=prompt)`.
        When the prompt's text ends in an incomplete character, vLLM's stream
        repeats the whole prompt in its first output; here the context's text
        stops before that character, whose tokens are stepped in silently, so
        only the character itself comes out once the output completes it."""
        for end in range(len(prompt), max(len(prompt) - MAX_TOKENS_PER_CHAR, 0) - 1, -1):
            text = self._tokenizer.decode(prompt[:end], skip_special_tokens=self._skip_special_tokens)
            if not text.endswith("\ufffd"):
                stream = DecodeStream(ids=prompt[:end], skip_special_tokens=self._skip_special_tokens)
                for token_id in prompt[end:]:
                    stream.step(self._tokenizer, token_id)
                return stream
        return DecodeStream(skip_special_tokens=self._skip_special_tokens)

    def _step(self, token_id: int) -> str | None:
        try:
            return self._stream.step(self._tokenizer, token_id)
        except (OverflowError, TypeError):
            # An id no tokenizer id can be (an engine's garbage): no text, as in vLLM.
            logger.warning("Encountered invalid token id: %r", token_id)
            return None
        except Exception as e:
            if not str(e).startswith(INVALID_PREFIX_ERROR):
                raise
            # More context changed earlier text (rare non-monotonic decoders):
            # restart without context, as vLLM does.
            logger.warning("Encountered invalid prefix detokenization error, resetting decode stream.")
            self._stream = DecodeStream(skip_special_tokens=self._skip_special_tokens)
            return self._stream.step(self._tokenizer, token_id)

    def push(self, token_ids: list[int]) -> str:
        """The text that is complete after adding `token_ids`."""
        pieces = []
        added = self._joined_added_tokens
        for token_id in token_ids:
            text = self._step(token_id)
            if added is not None:
                content = added.get(token_id)
                if content is not None and self._last_was_added:
                    # Two added tokens in a row: the raw token, without the decoder's space.
                    text = content
                self._last_was_added = content is not None
            if text:
                pieces.append(text)
        return "".join(pieces)

    def flush(self) -> str:
        """Nothing: an incomplete character at the end is dropped, as in vLLM."""
        return ""


class HfTokenizer:
    """A model's Hugging Face tokenizer."""

    def __init__(self, inner: tokenizers.Tokenizer, config: Any, source: Path):
        self.inner = inner
        self.source = source
        self.vocab_size = inner.get_vocab_size(with_added_tokens=True)
        eos = _special_token(config, "eos_token")
        self.eos_token_id = inner.token_to_id(eos) if eos is not None else None
        #: The text of every added token by id, special or not.
        self.added_tokens = {i: t.content for i, t in inner.get_added_tokens_decoder().items()}
        self._bos_token = _special_token(config, "bos_token") or ""
        self._eos_token = eos or ""
        source_text = _template_source(config)
        self._template = None
        #: The variables the template reads without defining them: the only kwargs it gets.
        self._variables: frozenset[str] = frozenset()
        if source_text is not None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_exception
            try:
                self._template = env.from_string(source_text)
                self._variables = frozenset(meta.find_undeclared_variables(env.parse(source_text)))
            except TemplateError as e:
                raise TokenizerLoadError(f"the chat template of {source.parent} does not compile: {e}") from None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` adds BOS and the like
        (true for raw prompts, false for chat prompts, whose template writes them)."""
        return self.inner.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int]) -> str:
        """The whole text of `token_ids` with special tokens kept, as vLLM's
        `tokenizer.decode` gives it (`/detokenize`)."""
        return self.inner.decode(token_ids, skip_special_tokens=False)

    def token_strings(self, token_ids: list[int]) -> list[str]:
        """Each id's token as the vocabulary writes it (vLLM's `convert_ids_to_tokens`)."""
        return [self.inner.id_to_token(t) or "" for t in token_ids]

    def decoder(self, prompt: list[int], options: DecodeOptions) -> IncrementalDecoder:
        """A fresh streaming decoder for one request whose prompt is `prompt`."""
        return IncrementalDecoder(self, prompt, options)

    def apply_chat_template(
        self,
        messages: list[ChatMessage],
        add_generation_prompt: bool,
        tools: list | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt for `messages` (and the request's `tools` and checked
        `chat_template_kwargs`, as vLLM passes them: those the template reads,
        never replacing the messages, tools or `add_generation_prompt`, but
        replacing the special tokens); raises ChatTemplateError when there is
        no template or it refuses the messages."""
        if self._template is None:
            raise ChatTemplateError(f"the tokenizer at {self.source} has no chat template")
        try:
            variables = {"bos_token": self._bos_token, "eos_token": self._eos_token}
            variables |= template_variables(kwargs or {}, self._variables)
            variables |= {
                "messages": [{"role": m.role, "content": m.content, **(m.extra or {})} for m in messages],
                "add_generation_prompt": add_generation_prompt,
                "tools": tools,
            }
            return self._template.render(variables)
        except TemplateError as e:
            raise ChatTemplateError(str(e)) from None


def load_hf_tokenizer(location: str) -> HfTokenizer:
    """Loads from `location`: a directory holding `tokenizer.json` (and
    optionally `tokenizer_config.json`), or a `tokenizer.json` file itself.
    Raises TokenizerLoadError naming the file when that fails."""
    path = Path(location)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise TokenizerLoadError(f"{file} does not exist")
    try:
        inner = tokenizers.Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises plain Exception for a bad file
        raise TokenizerLoadError(f"loading {file}: {e}") from None
    config = _read_json(file.parent / "tokenizer_config.json")
    return HfTokenizer(inner, config, file)
