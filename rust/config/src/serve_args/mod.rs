//! What this frontend does with every key `vllm serve` can put in
//! `--args-json` (docs/frontend.md has the same table for users): a key is
//! honoured, ignored because ignoring it cannot surprise anyone (engine-side
//! arguments the engines receive themselves; server options whose feature is
//! absent here anyway), or refused with exit 2 when serving without it would
//! quietly give clients something else than was asked for.

pub mod chat;
pub mod http_layers;
pub(crate) mod keys;
pub mod model_files;

use crate::error::ExitError;
use serde_json::{Map, Value};

/// Keys this frontend reads (besides engine-side keys it also reads, listed here too).
pub const HONOURED_KEYS: &[&str] = &[
    "model_tag",
    "model",
    "served_model_name",
    "api_key",
    "max_model_len",
    "tokenizer",
    "tokenizer_mode",
    "engine_ready_timeout_secs",
    "http_timeout_keep_alive",
    "enable_log_requests",
    "disable_log_stats",
    "shutdown_timeout",
    "engine_stall_timeout_s",
    "max_engine_message_bytes",
    "root_path",
    "allowed_origins",
    "allowed_methods",
    "allowed_headers",
    "allow_credentials",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_ca_certs",
    "ssl_cert_reqs",
    "chat_template",
    "chat_template_content_format",
    "enable_auto_tool_choice",
    "tool_call_parser",
    "reasoning_parser",
    "default_chat_template_kwargs",
    "reasoning_effort_map",
    "exclude_tools_when_tool_choice_none",
    "trust_request_chat_template",
    "response_role",
    "enable_request_id_headers",
    "enable_force_include_usage",
    "enable_prompt_tokens_details",
    "enable_scale_out",
    "h11_max_incomplete_event_size",
    "h11_max_header_count",
    "generation_config",
    "override_generation_config",
    "revision",
    "tokenizer_revision",
    "download_dir",
    "max_logprobs",
    "return_tokens_as_token_ids",
    "stream_interval",
    "runner",
    "convert",
];

/// Server keys (vLLM's `FrontendArgs` and the `serve` command's own) that are
/// ignored, each with why that is harmless. Engine-side keys (vLLM's
/// `EngineArgs`) that are neither honoured nor refused are ignored too, as a
/// group: the engines get them on their own command line.
pub const IGNORED_KEYS: &[(&str, &str)] = &[
    ("host", "the HTTP socket is inherited (--listen-fd), already bound"),
    ("port", "the HTTP socket is inherited (--listen-fd), already bound"),
    ("uds", "the HTTP socket is inherited (--listen-fd), already bound"),
    ("grpc_port", "the gRPC socket is inherited (--grpc-listen-fd)"),
    ("headless", "a headless deployment starts no frontend"),
    ("config", "vLLM has already merged the config file into the other keys"),
    ("data_parallel_supervisor_port", "the multi-port supervisor runs in vLLM's Python process"),
    ("dp_supervisor_probe_interval_s", "the multi-port supervisor runs in vLLM's Python process"),
    ("dp_supervisor_probe_timeout_s", "the multi-port supervisor runs in vLLM's Python process"),
    ("dp_supervisor_probe_failure_threshold", "the multi-port supervisor runs in vLLM's Python process"),
    ("disable_fastapi_docs", "no OpenAPI schema or docs pages are served"),
    ("enable_offline_docs", "no OpenAPI schema or docs pages are served"),
    ("uvicorn_log_level", "there is no uvicorn; the frontend logs at INFO"),
    ("disable_uvicorn_access_log", "the frontend writes no access log"),
    ("disable_access_log_for_endpoints", "the frontend writes no access log"),
    ("log_error_stack", "error responses carry no Python stack to log"),
    ("max_log_len", "request logs show counts, never prompt text or ids"),
    ("enable_log_deltas", "outputs are not logged (see enable_log_outputs)"),
    ("enable_log_outputs", "outputs are not logged: request logs show counts only"),
    ("trust_request_mm_kwargs", "it only permits more: multimodal input is not served"),
    ("enable_server_load_tracking", "/load always reports the requests in flight"),
    ("enable_flash_late_interaction", "late-interaction (multi-vector) scoring is not served"),
    ("cohere_is_reasoning_model", "the Cohere endpoints are not served"),
    ("cohere_format", "the Cohere endpoints are not served"),
    ("anthropic_disabled_thinking_effort", "the Anthropic endpoints are not served"),
    ("fingerprint_value", "used only with fingerprint_mode custom, which is refused"),
    ("trust_remote_code", "the frontend runs no model code"),
];

/// Keys refused whenever set (not null, not false): serving without them
/// would silently give clients less than the command line asked for.
pub const REFUSED_KEYS: &[(&str, &str)] = &[
    ("ssl_ciphers", "cipher suites cannot be chosen (rustls offers only its own modern TLS 1.2/1.3 suites, named differently from OpenSSL's)"),
    ("enable_ssl_refresh", "reloading certificates when their files change is not supported"),
    ("middleware", "Python ASGI middleware cannot run in this frontend"),
    ("tool_parser_plugin", "Python tool parser plugins cannot run in this frontend"),
    ("tool_server", "built-in tool servers (MCP, demo tools) are not supported"),
    ("tool_strict_level", "structural-tag tool constraints are not supported"),
    ("reasoning_parser_plugin", "Python reasoning parser plugins cannot run in this frontend"),
    ("enable_per_request_metrics", "per-request timing metrics in responses are not supported"),
    ("enable_tokenizer_info_endpoint", "the /tokenizer_info endpoint is not served"),
    ("sse_keep_alive_interval", "SSE keep-alive comments are not sent"),
    ("tokens_only", "the tokens-in/tokens-out endpoints are not served"),
    ("lora_modules", "LoRA adapters are not served"),
    ("skip_tokenizer_init", "the frontend always tokenizes prompts"),
    ("grpc", "the Python gRPC server replaces the HTTP frontend"),
];

/// Keys where only some values are supported: any other value is refused.
pub const REFUSED_VALUES: &[(&str, &[&str], &str)] = &[
    ("tokenizer_mode", &["auto", "hf"], "only Hugging Face fast tokenizers (tokenizer.json) are supported"),
    ("fingerprint_mode", &["full", "none"], "responses carry no system_fingerprint"),
];

/// Refuses the keys this frontend cannot honour (exit 2 naming the key and
/// why), and logs the ignored ones at debug level.
pub fn check_keys(map: &Map<String, Value>) -> Result<(), ExitError> {
    for (key, why) in REFUSED_KEYS {
        if map.get(*key).is_some_and(|v| !v.is_null() && *v != Value::Bool(false)) {
            return Err(ExitError::usage(format!(
                "--args-json: `{key}` is set, but {why} by this frontend; refusing to start rather than serve without it"
            )));
        }
    }
    for (key, allowed, why) in REFUSED_VALUES {
        match map.get(*key) {
            None | Some(Value::Null) => {}
            Some(Value::String(value)) if allowed.contains(&value.as_str()) => {}
            Some(Value::String(value)) => {
                return Err(ExitError::usage(format!(
                    "--args-json: `{key}` is {value:?}, but {why}: use one of {allowed:?}"
                )))
            }
            Some(_) => return Err(ExitError::usage(format!("--args-json: `{key}` must be a string"))),
        }
    }
    for key in map.keys().filter(|key| !HONOURED_KEYS.contains(&key.as_str())) {
        match IGNORED_KEYS.iter().find(|(ignored, _)| ignored == key) {
            Some((_, why)) => tracing::debug!("--args-json: ignoring `{key}`: {why}"),
            None => tracing::debug!("--args-json: ignoring `{key}` (an engine argument: the engines receive it)"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_has_exactly_one_treatment() {
        let mut all: Vec<&str> = HONOURED_KEYS.to_vec();
        all.extend(IGNORED_KEYS.iter().map(|(k, _)| *k));
        all.extend(REFUSED_KEYS.iter().map(|(k, _)| *k));
        all.extend(REFUSED_VALUES.iter().map(|(k, _, _)| *k).filter(|k| !HONOURED_KEYS.contains(k)));
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len(), "a key is listed twice");
    }
}
