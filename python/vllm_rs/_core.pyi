"""Typed stubs of the native module `vllm_rs._core` (rust/python/, the binding of the process core in rust/core/)."""

from collections.abc import Callable, Sequence

#: False on platforms other than Linux, where every function raises NotImplementedError.
SUPPORTED: bool

class Process:
    """A child with the `multiprocessing.BaseProcess` surface; signals go
    through its pid fd; the guardian reaps it (no zombies)."""

    name: str
    @property
    def pid(self) -> int: ...
    @property
    def ident(self) -> int: ...
    @property
    def sentinel(self) -> int:
        """A pid fd, readable once the process has exited."""
    @property
    def exitcode(self) -> int | None:
        """None while running; the exit code, or minus the signal number."""
    def is_alive(self) -> bool: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def send_signal(self, signal: int) -> None: ...
    def join(self, timeout: float | None = None) -> None:
        """Waits without the GIL; KeyboardInterrupt gets through."""
    def close(self) -> None:
        """Releases held fds; ValueError while the process runs."""

def spawn(
    argv: Sequence[str],
    *,
    name: str,
    env: Sequence[tuple[str, str]] | None = None,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
    hold_fds: Sequence[int] = (),
) -> Process:
    """Starts `argv` through this process's guardian with exactly `pass_fds`
    (plus open stdio) inherited. Failures raise the OSError subclass of their
    errno with `errno` set and `filename` naming the program or directory
    (a bad fd: `errno` EBADF, named in the message); ValueError for what exec
    cannot carry."""

class SpawnRequest:
    """One child for `spawn_many`, with the fields of `spawn`'s arguments."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        env: Sequence[tuple[str, str]] | None = None,
        cwd: str | None = None,
        pass_fds: Sequence[int] = (),
        hold_fds: Sequence[int] = (),
    ) -> None: ...
    @property
    def argv(self) -> list[str]: ...
    @property
    def name(self) -> str: ...
    @property
    def env(self) -> list[tuple[str, str]] | None: ...
    @property
    def cwd(self) -> str | None: ...
    @property
    def pass_fds(self) -> list[int]: ...
    @property
    def hold_fds(self) -> list[int]: ...

def spawn_many(requests: Sequence[SpawnRequest]) -> list[Process | BaseException]:
    """Starts many children, pipelined; returns, in order, a Process or the
    exception (as `spawn` raises it) per request."""

def kill_process_tree(pid: int) -> int:
    """SIGKILLs `pid` and all descendants, waits for them; returns how many
    were signalled. A failure raises the OSError subclass of its errno
    (PermissionError, ...), naming the process."""

def wait_fds(fds: Sequence[int], timeout: float | None = None) -> list[int]:
    """The fds of `fds` that are readable (or hung up), after waiting up to `timeout`."""

def set_guardian_command(argv: Sequence[str]) -> None:
    """Command that starts a guardian (control fd and our pid are appended)."""

def remove_on_exit(path: str) -> None:
    """Has the guardian remove `path` (a file, or a directory: see
    docs/process-core.md) once this process is gone (SIGKILL included), if it
    still names the same inode. Returns once the guardian has acknowledged.
    FileNotFoundError (errno, filename) if `path` does not exist."""

def cancel_remove_on_exit(path: str) -> None:
    """Undoes `remove_on_exit(path)`; a no-op if it was never registered."""

def guardian_pid() -> int | None:
    """Pid of this process's guardian, or None before the first spawn."""

def guardian_main(ctrl_fd: int, supervisor_pid: int) -> None:
    """Runs the guardian loop in this interpreter; never returns."""

# Tool-call and reasoning parsers (rust/python/src/parsers.rs over the
# vllm-rs-parsers crate, the same code the `vllm-rs` binary uses).

#: vLLM's `--tool-call-parser` names that `ToolParser` accepts.
TOOL_PARSER_NAMES: list[str]
#: vLLM's `--reasoning-parser` names that `ReasoningParser` accepts.
REASONING_PARSER_NAMES: list[str]

class ToolCall:
    """A complete tool call; `arguments` is JSON text."""

    @property
    def id(self) -> str:
        """`chatcmpl-tool-` + 16 hex digits (mistral: 9 letters and digits)."""
    @property
    def name(self) -> str: ...
    @property
    def arguments(self) -> str: ...

class ExtractedToolCalls:
    """A whole output split into content and tool calls (vLLM's
    ExtractedToolCallInformation)."""

    @property
    def tools_called(self) -> bool: ...
    @property
    def content(self) -> str | None: ...
    @property
    def tool_calls(self) -> list[ToolCall]: ...

class DeltaToolCall:
    """One call's part of a streamed delta: the first for an index carries
    id, type ("function") and name; later ones argument fragments."""

    @property
    def index(self) -> int: ...
    @property
    def id(self) -> str | None: ...
    @property
    def type(self) -> str | None: ...
    @property
    def name(self) -> str | None: ...
    @property
    def arguments(self) -> str | None: ...

class DeltaMessage:
    """One streamed delta (vLLM's DeltaMessage, `reasoning` as in vLLM 0.33)."""

    @property
    def content(self) -> str | None: ...
    @property
    def reasoning(self) -> str | None: ...
    @property
    def tool_calls(self) -> list[DeltaToolCall]: ...

class ToolParser:
    """A tool-call parser by vLLM's name for one request; `tools_json` is the
    request's `tools` list as JSON text. ValueError for an unknown name or
    tools that are not JSON."""

    def __init__(self, name: str, tools_json: str | None = None) -> None: ...
    @property
    def name(self) -> str:
        """The canonical name (aliases resolved)."""
    def parse(self, text: str) -> ExtractedToolCalls: ...
    def stream(self) -> ChatOutputStream:
        """A streaming reader for one output (a chat reader with only this parser)."""

class ReasoningParser:
    """A reasoning parser by vLLM's name; `thinking` is the chat template's
    `enable_thinking` (qwen3 reads it). ValueError for an unknown name."""

    def __init__(self, name: str, thinking: bool = True) -> None: ...
    @property
    def name(self) -> str: ...
    def parse(self, text: str) -> tuple[str | None, str | None]:
        """`(reasoning, content)` of a whole output."""
    def stream(self) -> ChatOutputStream:
        """A streaming reader for one output (a chat reader with only this parser)."""

class ChatOutputStream:
    """Streams one chat choice's output."""

    def push(self, delta: str) -> DeltaMessage | None: ...
    def finish(self) -> DeltaMessage | None: ...
    @property
    def tools_called(self) -> bool:
        """Whether a tool call was streamed."""

class ChatOutputParser:
    """Reads one chat choice's output as vLLM's chat endpoint does: reasoning
    split off (with `reasoning_parser`), then tool calls by `mode`: `none`,
    `auto` (through `tool_parser`), `named` (`function_name`'s arguments) or
    `required` (a JSON array of `{"name", "parameters"}`). ValueError for an
    unknown mode or parser name."""

    def __init__(
        self,
        mode: str,
        tool_parser: str | None = None,
        function_name: str | None = None,
        tools_json: str | None = None,
        reasoning_parser: str | None = None,
        thinking: bool = True,
        parallel_tool_calls: bool = True,
    ) -> None: ...
    def parse(self, text: str) -> tuple[str | None, str | None, list[ToolCall]]:
        """`(reasoning, content, tool_calls)` of a whole output."""
    def stream(self) -> ChatOutputStream: ...

def required_tools_schema(tools_json: str, parallel_tool_calls: bool = True) -> str:
    """The structured-outputs JSON schema (JSON text) vLLM builds for
    `tool_choice: "required"`; ValueError when the tools' `$defs` clash."""

def int8_runs(rows: int) -> bool:
    """Whether a `DecoderStack` built at `precision="int8"` multiplies a
    product of `rows` activation rows at int8 on this CPU (the others
    multiply exactly): every product where the CPU has AVX-512 VNNI (the
    stack repacks its weights for it), else decode's one or two rows."""

def gguf_matmul(x: object, w: object, out: object, quant_type: int, n: int, k: int, threads: int) -> None:
    """`out[M,N] = x[M,K] @ W[N,K].T` with `x` and `out` C-contiguous float32
    buffers (numpy arrays; torch CPU tensors through `.numpy()`), `w` N rows
    of raw GGUF blocks of ggml type `quant_type` (F16, BF16, Q4_0, Q4_1,
    Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS) as a uint8 buffer, read in
    place; N split across `threads` threads, the GIL released. TypeError
    for a buffer of the wrong type, ValueError for a bad shape, type or
    thread count, a read-only or overlapping `out`."""

def gguf_dequantize(rows: object, out: object, quant_type: int) -> None:
    """`out` (C-contiguous float32) = the weights of `rows` (C-contiguous
    uint8, whole blocks of ggml type `quant_type`, one `gguf_matmul`
    reads), each exactly as the `gguf` package dequantizes it; the GIL
    released. TypeError for a buffer of the wrong type, ValueError for an
    unknown type, a partial block, a misshapen, read-only or overlapping
    `out`."""

class ModelNotFoundError(LookupError):
    """A model that is neither a directory, nor in the hub cache, nor downloaded."""

class GenerationConfigError(ValueError):
    """A generation config that cannot be used; the message names the key and its source."""

def locate_model(
    name: str,
    revision: str | None,
    download_dir: str | None,
    env: dict[str, str],
    weights: bool,
    announce: Callable[[str], object],
) -> str:
    """The directory holding `name`'s files, as the frontend finds it
    (rust/model-files): a directory as given, else the hub cache snapshot
    of `revision` (None: `main`), else downloaded unless `env` has
    `HF_HUB_OFFLINE`; with `weights`, a hub model's safetensors too.
    `announce` is called with a line before each download starts; the GIL
    is released meanwhile. ModelNotFoundError naming the model and every
    place looked in."""

def hub_cache_roots(env: dict[str, str], download_dir: str | None) -> list[str]:
    """The hub cache folders searched, in order: the Hugging Face default
    from `env`, then `download_dir`."""

def load_generation_config(
    mode: str, overrides_json: str, model_dir: str | None, env: dict[str, str]
) -> tuple[dict[str, float | int], int | None, list[int]]:
    """The generation config as the frontend applies it (rust/model-files
    generation_config.rs): `mode` `auto`, `vllm` or a folder (found as
    `locate_model` finds one, with the Hugging Face variables of `env`),
    `overrides_json` a JSON object merged over the sampling defaults;
    `(defaults, max_tokens_cap, eos_token_ids)`. GenerationConfigError
    naming the key (or `serve`'s flag) and where it came from."""

class DecoderStack:
    """A Llama-family model's decoder layers, final norm and output head over
    the GGUF kernels (rust/kernels decoder.rs), with its KV cache written in
    place, run a step at a time. TypeError for a buffer of the wrong type,
    ValueError for shapes that do not fit together."""

    def __init__(
        self,
        shape: tuple[int, int, int, int, int, int, float, float, float, int, float],
        inv_freqs: Sequence[object],
        layers: Sequence[
            tuple[
                object,
                object,
                object | None,
                object | None,
                Sequence[object],
                int | None,
                int | None,
                object | None,
                object | None,
                int,
                tuple[object, Sequence[Sequence[object]], int, bool, tuple[Sequence[object], object] | None] | None,
            ]
        ],
        norm: object,
        head: tuple[int, object, int, int, object | None],
        caches: Sequence[tuple[object, object]],
        cache_dtype: str = "float32",
        precision: str = "exact",
        activation: str = "silu",
        long_inv_freq: object | None = None,
    ) -> None:
        """`shape` is `(hidden, heads, kv_heads, head_dim, intermediate,
        vocab, eps, scale, residual_scale, rotary_dim, rope_scale)`;
        `inv_freqs` the RoPE tables; a layer is `(input_norm,
        post_attention_norm (before the MLP), q_norm, k_norm, [q, k, v, o,
        gate, up, down], window, its RoPE table's index or None,
        attention_output_norm, mlp_output_norm, its KV-cache group, its
        routed experts `(router (float32), [[gate, up, down] per expert],
        top_k, norm_topk_prob, shared expert ([gate, up, down], its gate's
        float32 row) or None)` or None: with experts, the linear layers are
        q, k, v, o only)`; a linear
        is `(ggml type id, rows (uint8), out features, in features, bias or
        None)`; `caches` one `(keys, values)` per layer of `cache_dtype`;
        `activation` the MLP gate's (`silu` or `gelu_tanh`); `long_inv_freq`
        LongRoPE's long factors' table, for the tokens `forward`'s
        `long_rope` marks;
        `precision` `exact` (float32 products of the dequantized weights) or
        `int8` (activations quantized to int8 per block for Q8_0, Q4_0, Q4_1,
        Q5_0, Q4_K, Q5_K and Q6_K weights; its error bound is
        `Precision::Int8Activations`')."""

    def forward(
        self,
        x: object,
        positions: object,
        slot_mapping: object,
        key_starts: object,
        key_slots: object,
        logits_rows: object,
        logits: object,
        threads: int,
        long_rope: object | None = None,
        group_slots: Sequence[tuple[object, object]] = (),
    ) -> None:
        """One step: `x` (float32 `[tokens, hidden]`, overwritten) through
        every layer, keys and values written at `slot_mapping`, the logits of
        `logits_rows` into `logits`; `long_rope` (uint8 per token) marks the
        tokens rotated by `long_inv_freq`; `group_slots` KV-cache groups 1,
        2, ...'s `(slot_mapping, key_slots)`; the GIL released. ValueError for a
        bad shape or index (nothing written then)."""
