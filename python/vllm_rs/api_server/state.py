"""What every handler shares: the settings taken from the `serve` arguments,
the tokenizer, the engine client, the metrics and the model length."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

from vllm_rs import envs
from vllm_rs.api_server.chat_tools import ParserSettings
from vllm_rs.api_server.engine_client import EngineClient
from vllm_rs.api_server.generation_config import GenerationConfig, load_for_model
from vllm_rs.api_server.limits import ServerLimits
from vllm_rs.api_server.metrics import Metrics
from vllm_rs.api_server.tokenizer import ByteLevelTokenizer, Tokenizer

#: Drain time on SIGTERM/SIGINT when `--shutdown-timeout` is not given.
DEFAULT_SHUTDOWN_TIMEOUT_S = 4.0


@dataclass
class ServerSettings:
    """The parts of the `serve` arguments the API server uses."""

    model_tag: str
    served_model_names: list[str]
    #: Where the tokenizer lives, when not in the model directory.
    tokenizer: str | None = None
    api_keys: list[str] = field(default_factory=list)
    max_model_len: int | None = None
    engine_ready_timeout_s: float = 600.0
    keep_alive_timeout_s: float = 5.0
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    enable_log_requests: bool = False
    disable_log_stats: bool = False
    #: Seconds between throughput log lines (`VLLM_LOG_STATS_INTERVAL`).
    log_stats_interval_s: float = 10.0
    engine_count: int = 1
    #: Most logprobs a request may ask for (-1: the whole vocabulary), vLLM's `--max-logprobs`.
    max_logprobs: int = 20
    #: Tokens in logprobs as `token_id:N` unless a request says otherwise.
    return_tokens_as_token_ids: bool = False
    limits: ServerLimits = field(default_factory=ServerLimits)
    #: The tool-call and reasoning parsers chosen by the serve flags.
    parsers: ParserSettings = field(default_factory=ParserSettings)
    #: The `chat_template_kwargs` every chat request starts from (`--default-chat-template-kwargs`).
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: Rewrites of requested reasoning efforts (`--reasoning-effort-map`).
    reasoning_effort_map: dict[str, str] = field(default_factory=dict)
    generation_config: GenerationConfig = field(default_factory=GenerationConfig)

    @property
    def primary_model_name(self) -> str:
        """The name reported in responses."""
        return self.served_model_names[0]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerSettings:
        """From the `serve` namespace and the environment variables (vLLM's
        and the `VLLM_RS_*` limits); raises LimitError for a bad limit and
        GenerationConfigError for a bad generation config."""
        model_tag = getattr(args, "model_tag", None) or args.model
        names = getattr(args, "served_model_name", None) or [model_tag]
        api_key = getattr(args, "api_key", None) or envs.api_key()  # vLLM's order
        shutdown = getattr(args, "shutdown_timeout", None)
        return cls(
            model_tag=model_tag,
            tokenizer=getattr(args, "tokenizer", None),
            served_model_names=[names] if isinstance(names, str) else list(names),
            api_keys=[] if not api_key else [api_key] if isinstance(api_key, str) else list(api_key),
            max_model_len=getattr(args, "max_model_len", None),
            engine_ready_timeout_s=float(envs.engine_ready_timeout_s()),
            keep_alive_timeout_s=float(envs.http_timeout_keep_alive()),
            shutdown_timeout_s=DEFAULT_SHUTDOWN_TIMEOUT_S if shutdown is None else float(shutdown),
            enable_log_requests=bool(getattr(args, "enable_log_requests", False)),
            disable_log_stats=bool(getattr(args, "disable_log_stats", False)),
            log_stats_interval_s=envs.log_stats_interval_s(),
            engine_count=int(getattr(args, "data_parallel_size", 1) or 1),
            max_logprobs=int(getattr(args, "max_logprobs", 20)),
            return_tokens_as_token_ids=bool(getattr(args, "return_tokens_as_token_ids", False)),
            limits=ServerLimits.from_env(),
            parsers=ParserSettings.from_args(args),
            default_chat_template_kwargs=dict(getattr(args, "default_chat_template_kwargs", None) or {}),
            reasoning_effort_map=dict(getattr(args, "reasoning_effort_map", None) or {}),
            generation_config=load_for_model(
                args.model,
                getattr(args, "generation_config", None) or "auto",
                getattr(args, "override_generation_config", None) or {},
                getattr(args, "revision", None),
                getattr(args, "download_dir", None),
            ),
        )


@dataclass
class ServerState:
    """The server's shared state."""

    settings: ServerSettings
    engines: EngineClient
    metrics: Metrics
    max_model_len: int | None
    tokenizer: Tokenizer = field(default_factory=ByteLevelTokenizer)
    created: int = field(default_factory=lambda: int(time.time()))
