//! The server configuration: `--args-json` and the environment variables the
//! frontend reads, every value validated (type, finite, in range) with errors
//! that name the key or variable and never echo a credential.

pub mod error;
pub mod serve_args;

use crate::error::ExitError;
pub use crate::serve_args::chat::ChatOptions;
pub use crate::serve_args::http_layers::{ClientCerts, CorsRules, HttpLayers, TlsFiles};
use crate::serve_args::keys::Keys;
pub use crate::serve_args::model_files::ModelFilesConfig;
use serde_json::Value;
use std::ffi::OsString;
use std::fmt;
use std::time::Duration;
use vllm_rs_zmtp::DEFAULT_MAX_MESSAGE_BYTES;

/// The default for the engine client's stall timeout (`engine_stall_timeout_s`).
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest timeout accepted anywhere (one year, in seconds): larger values are
/// a usage error rather than a timer overflow.
pub const MAX_TIMEOUT_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// The bearer key, as vLLM reads it.
pub const API_KEY_ENV: &str = "VLLM_API_KEY";
/// vLLM's variable for how often throughput is logged, in seconds.
pub const LOG_STATS_INTERVAL_ENV: &str = "VLLM_LOG_STATS_INTERVAL";
/// Seconds to wait for every engine to register, when `--args-json` does not say.
pub const ENGINE_READY_TIMEOUT_ENV: &str = "VLLM_ENGINE_READY_TIMEOUT_S";
/// Seconds without a message from an engine with requests in flight before it counts as hung.
pub const ENGINE_STALL_TIMEOUT_ENV: &str = "VLLM_RS_ENGINE_STALL_TIMEOUT_S";
/// Largest message accepted from an engine (bytes).
pub const MAX_ENGINE_MESSAGE_BYTES_ENV: &str = "VLLM_RS_MAX_ENGINE_MESSAGE_BYTES";
/// Seconds to receive a whole request body.
pub const HTTP_BODY_TIMEOUT_ENV: &str = "VLLM_RS_HTTP_BODY_TIMEOUT_S";
/// Seconds to receive a request head.
pub const HTTP_HEADER_TIMEOUT_ENV: &str = "VLLM_RS_HTTP_HEADER_TIMEOUT_S";
/// Largest request head (bytes).
pub const HTTP_MAX_HEADER_BYTES_ENV: &str = "VLLM_RS_HTTP_MAX_HEADER_BYTES";
/// Most HTTP connections open at once; more wait in the listen backlog.
pub const HTTP_MAX_CONNECTIONS_ENV: &str = "VLLM_RS_HTTP_MAX_CONNECTIONS";

/// Smallest header limit: the HTTP library refuses (panics on) anything below.
const MIN_HEADER_BYTES: u64 = 8192;
/// Largest header limit accepted.
const MAX_HEADER_BYTES: u64 = 16 * 1024 * 1024;
/// Largest header count passed on: more only costs memory per connection.
const MAX_HEADER_COUNT: u64 = 65_536;
/// Smallest engine message cap: below it a registration may not fit.
const MIN_ENGINE_MESSAGE_BYTES: u64 = 1024;
/// Largest engine message cap accepted (64 GiB).
const MAX_ENGINE_MESSAGE_BYTES: u64 = 64 * 1024 * 1024 * 1024;
/// Default connection limit, lowered to half the open-file limit.
const DEFAULT_HTTP_MAX_CONNECTIONS: u64 = 4096;
/// Largest connection limit accepted (more than any open-file limit allows).
const MAX_HTTP_MAX_CONNECTIONS: u64 = 1 << 24;

pub use crate::serve_args::{REFUSED_KEYS, REFUSED_VALUES};

/// The server configuration taken from `--args-json`.
#[derive(Clone)]
pub struct ServerConfig {
    /// The model: a built-in name (`toy`, `echo`) or a model directory.
    pub model_tag: String,
    /// Names clients may use for the model; the first is reported in responses.
    pub served_model_names: Vec<String>,
    /// Accepted bearer tokens; empty means no authentication.
    pub api_keys: Vec<String>,
    /// Upper bound on prompt plus `max_tokens`, on top of what the engines report.
    pub max_model_len: Option<u64>,
    /// Where the tokenizer lives, when not in the model directory.
    pub tokenizer: Option<String>,
    /// How long to wait for every engine to register.
    pub engine_ready_timeout: Duration,
    /// How long an idle keep-alive HTTP connection stays open.
    pub http_timeout_keep_alive: Duration,
    /// Log one line per request received and finished.
    pub enable_log_requests: bool,
    /// Do not log periodic throughput stats.
    pub disable_log_stats: bool,
    /// How often throughput is logged (`VLLM_LOG_STATS_INTERVAL`, 10 s).
    pub log_stats_interval: Duration,
    /// How long a SIGTERM/SIGINT drain may take before in-flight requests are aborted.
    pub shutdown_timeout: Duration,
    /// An engine with requests in flight that sends nothing for this long counts as hung.
    pub engine_stall_timeout: Duration,
    /// Largest message accepted from an engine (bytes).
    pub max_engine_message_bytes: u64,
    /// Time to receive a whole request body.
    pub http_body_timeout: Duration,
    /// Time to receive a request head.
    pub http_header_timeout: Duration,
    /// Largest request head (bytes).
    pub http_max_header_bytes: usize,
    /// Most header lines in a request head (`h11_max_header_count`).
    pub http_max_header_count: Option<usize>,
    /// Most HTTP connections served at once (`VLLM_RS_HTTP_MAX_CONNECTIONS`).
    pub http_max_connections: usize,
    /// What the HTTP layer adds on top of the routes: TLS, CORS, root path, request ids.
    pub http_layers: HttpLayers,
    /// How chat messages become a prompt.
    pub chat: ChatOptions,
    /// Include usage in every stream, whatever `stream_options` says.
    pub enable_force_include_usage: bool,
    /// Report the prompt tokens found in the prefix cache
    /// (`usage.prompt_tokens_details.cached_tokens`), vLLM's `--enable-prompt-tokens-details`.
    pub enable_prompt_tokens_details: bool,
    /// Serve the scale-out routes (render, derender, tokens in / tokens out), vLLM's `--enable-scale-out`.
    pub enable_scale_out: bool,
    /// Most logprobs a request may ask for (-1: the whole vocabulary), vLLM's `--max-logprobs`.
    pub max_logprobs: i64,
    /// Tokens in logprobs as `token_id:N` unless a request says otherwise.
    pub return_tokens_as_token_ids: bool,
    /// vLLM's `--stream-interval`: tokens per streamed delta (1: one delta per engine output).
    pub stream_interval: usize,
    /// Where the model's files are found: `revision`, `tokenizer_revision`,
    /// `download_dir`, `generation_config`, `override_generation_config`.
    pub model_files: ModelFilesConfig,
    /// What the model serves: generation, or a pooling task (`runner`, `convert`).
    pub task: ModelTask,
}

/// What the served model does, from vLLM's `runner` and `convert` keys as
/// `serve` resolves them: generate text, or pool inputs into embeddings or
/// class scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelTask {
    /// `--runner generate` (the default).
    Generate,
    /// `--runner pooling --convert embed`: embeddings, `/pooling`, scores by cosine.
    Embed,
    /// `--runner pooling --convert classify`: class scores, cross-encoder scores.
    Classify,
}

impl ModelTask {
    fn load(keys: &Keys) -> Result<ModelTask, ExitError> {
        match (keys.string("runner")?.as_deref(), keys.string("convert")?.as_deref()) {
            (Some("pooling"), Some("classify")) => Ok(ModelTask::Classify),
            (Some("pooling"), _) => Ok(ModelTask::Embed),
            (None | Some("generate" | "auto"), _) => Ok(ModelTask::Generate),
            (Some(other), _) => {
                Err(ExitError::usage(format!("--args-json: `runner` is {other:?}: use \"generate\" or \"pooling\"")))
            }
        }
    }
}

impl fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConfig")
            .field("model_tag", &self.model_tag)
            .field("served_model_names", &self.served_model_names)
            .field("api_keys", &if self.api_keys.is_empty() { "none" } else { "***" })
            .field("max_model_len", &self.max_model_len)
            .field("tokenizer", &self.tokenizer)
            .field("engine_ready_timeout", &self.engine_ready_timeout)
            .field("http_timeout_keep_alive", &self.http_timeout_keep_alive)
            .field("enable_log_requests", &self.enable_log_requests)
            .field("disable_log_stats", &self.disable_log_stats)
            .field("log_stats_interval", &self.log_stats_interval)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("engine_stall_timeout", &self.engine_stall_timeout)
            .field("max_engine_message_bytes", &self.max_engine_message_bytes)
            .field("http_body_timeout", &self.http_body_timeout)
            .field("http_header_timeout", &self.http_header_timeout)
            .field("http_max_header_bytes", &self.http_max_header_bytes)
            .field("http_max_header_count", &self.http_max_header_count)
            .field("http_max_connections", &self.http_max_connections)
            .field("http_layers", &self.http_layers)
            .field("chat", &self.chat)
            .field("enable_force_include_usage", &self.enable_force_include_usage)
            .field("enable_prompt_tokens_details", &self.enable_prompt_tokens_details)
            .field("enable_scale_out", &self.enable_scale_out)
            .field("max_logprobs", &self.max_logprobs)
            .field("return_tokens_as_token_ids", &self.return_tokens_as_token_ids)
            .field("stream_interval", &self.stream_interval)
            .field("model_files", &self.model_files)
            .field("task", &self.task)
            .finish()
    }
}

/// vLLM's default `--max-logprobs`.
pub const DEFAULT_MAX_LOGPROBS: i64 = 20;

/// Reads one environment variable; tests pass a map instead of the process environment.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process environment.
pub fn process_env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

impl ServerConfig {
    /// Parses and validates `--args-json` and the environment variables read
    /// through `env`. Errors name the offending key or variable.
    pub fn load(args_json: &str, env: EnvLookup) -> Result<Self, ExitError> {
        let value: Value = serde_json::from_str(args_json)
            .map_err(|e| ExitError::usage(format!("--args-json: not valid JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(ExitError::usage("--args-json: expected a JSON object"));
        };
        crate::serve_args::check_keys(&map)?;
        let keys = Keys(&map);
        let env = Vars(env);
        let model_tag = match keys.string("model_tag")? {
            Some(tag) => tag,
            None => keys
                .string("model")?
                .ok_or_else(|| ExitError::usage("--args-json: `model_tag` is required (a string)"))?,
        };
        let served_model_names = keys
            .string_or_list("served_model_name")?
            .filter(|names| !names.is_empty())
            .unwrap_or_else(|| vec![model_tag.clone()]);
        let positive = Bound::Positive;
        Ok(ServerConfig {
            served_model_names,
            api_keys: api_keys(&keys, &env)?,
            max_model_len: keys.positive_int("max_model_len")?,
            tokenizer: keys.string("tokenizer")?,
            engine_ready_timeout: match keys.seconds("engine_ready_timeout_secs", positive)? {
                Some(timeout) => timeout,
                None => env.seconds(ENGINE_READY_TIMEOUT_ENV, positive)?.unwrap_or(Duration::from_secs(600)),
            },
            http_timeout_keep_alive: keys.seconds("http_timeout_keep_alive", positive)?.unwrap_or(Duration::from_secs(5)),
            enable_log_requests: keys.bool("enable_log_requests")?.unwrap_or(false),
            disable_log_stats: keys.bool("disable_log_stats")?.unwrap_or(false),
            log_stats_interval: env.seconds(LOG_STATS_INTERVAL_ENV, positive)?.unwrap_or(Duration::from_secs(10)),
            shutdown_timeout: keys.seconds("shutdown_timeout", Bound::NonNegative)?.unwrap_or(Duration::from_secs(4)),
            engine_stall_timeout: match keys.seconds("engine_stall_timeout_s", positive)? {
                Some(timeout) => timeout,
                None => env.seconds(ENGINE_STALL_TIMEOUT_ENV, positive)?.unwrap_or(DEFAULT_STALL_TIMEOUT),
            },
            max_engine_message_bytes: match keys.positive_int("max_engine_message_bytes")? {
                Some(bytes) if (MIN_ENGINE_MESSAGE_BYTES..=MAX_ENGINE_MESSAGE_BYTES).contains(&bytes) => bytes,
                Some(_) => {
                    return Err(ExitError::usage(format!(
                        "--args-json: `max_engine_message_bytes` must be an integer from {MIN_ENGINE_MESSAGE_BYTES} to {MAX_ENGINE_MESSAGE_BYTES}"
                    )))
                }
                None => env
                    .integer(MAX_ENGINE_MESSAGE_BYTES_ENV, MIN_ENGINE_MESSAGE_BYTES, MAX_ENGINE_MESSAGE_BYTES)?
                    .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES),
            },
            http_body_timeout: env.seconds(HTTP_BODY_TIMEOUT_ENV, positive)?.unwrap_or(Duration::from_secs(30)),
            http_header_timeout: env.seconds(HTTP_HEADER_TIMEOUT_ENV, positive)?.unwrap_or(Duration::from_secs(5)),
            http_max_header_bytes: match keys.positive_int("h11_max_incomplete_event_size")? {
                Some(bytes) if (MIN_HEADER_BYTES..=MAX_HEADER_BYTES).contains(&bytes) => bytes as usize,
                Some(_) => {
                    return Err(ExitError::usage(format!(
                        "--args-json: `h11_max_incomplete_event_size` must be an integer from {MIN_HEADER_BYTES} to {MAX_HEADER_BYTES}"
                    )))
                }
                None => env
                    .integer(HTTP_MAX_HEADER_BYTES_ENV, MIN_HEADER_BYTES, MAX_HEADER_BYTES)?
                    .map_or(64 * 1024, |n| n as usize),
            },
            http_max_header_count: keys.positive_int("h11_max_header_count")?.map(|n| n.min(MAX_HEADER_COUNT) as usize),
            http_max_connections: env
                .integer(HTTP_MAX_CONNECTIONS_ENV, 1, MAX_HTTP_MAX_CONNECTIONS)?
                .unwrap_or_else(default_max_connections) as usize,
            http_layers: HttpLayers::load(&keys)?,
            chat: ChatOptions::load(&keys)?,
            enable_force_include_usage: keys.bool("enable_force_include_usage")?.unwrap_or(false),
            enable_prompt_tokens_details: keys.bool("enable_prompt_tokens_details")?.unwrap_or(false),
            enable_scale_out: keys.bool("enable_scale_out")?.unwrap_or(false),
            max_logprobs: match keys.get("max_logprobs") {
                None => DEFAULT_MAX_LOGPROBS,
                Some(v) => v.as_i64().filter(|&n| n >= -1).ok_or_else(|| {
                    Keys::wrong_type("max_logprobs", "an integer >= -1 (-1: the whole vocabulary)", v)
                })?,
            },
            return_tokens_as_token_ids: keys.bool("return_tokens_as_token_ids")?.unwrap_or(false),
            // Capped where it could not matter: no request streams more tokens.
            stream_interval: keys.positive_int("stream_interval")?.map_or(1, |n| n.min(u32::MAX as u64) as usize),
            model_files: ModelFilesConfig::load(&keys)?,
            task: ModelTask::load(&keys)?,
            model_tag,
        })
    }

    /// The name reported in responses.
    pub fn primary_model_name(&self) -> &str {
        &self.served_model_names[0]
    }
}

/// `DEFAULT_HTTP_MAX_CONNECTIONS`, lowered to half the open-file limit (at
/// least 16): the other half keeps fds for engines, logs and libraries.
fn default_max_connections() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return DEFAULT_HTTP_MAX_CONNECTIONS;
    }
    (limit.rlim_cur / 2).clamp(16, DEFAULT_HTTP_MAX_CONNECTIONS)
}

/// The accepted bearer keys: `api_key` from `--args-json` when given (as vLLM,
/// which puts it there itself; it wins), else `VLLM_API_KEY`. A key on the
/// command line is readable by every local user, hence the warning.
fn api_keys(keys: &Keys, env: &Vars) -> Result<Vec<String>, ExitError> {
    let from_args: Vec<String> =
        keys.string_or_list("api_key")?.unwrap_or_default().into_iter().filter(|k| !k.is_empty()).collect();
    if !from_args.is_empty() {
        tracing::warn!(
            "--args-json holds `api_key`: command lines are visible to every local user (ps, /proc); \
             pass the key in the {API_KEY_ENV} environment variable instead"
        );
        return Ok(from_args);
    }
    match env.string(API_KEY_ENV)? {
        Some(key) => Ok(vec![key]),
        None => Ok(Vec::new()),
    }
}

/// Which numbers of seconds a key accepts (always finite and at most a year).
#[derive(Clone, Copy)]
enum Bound {
    /// 0 or more.
    NonNegative,
    /// More than 0.
    Positive,
}

impl Bound {
    fn accepts(self, seconds: f64) -> bool {
        let low = match self {
            Bound::NonNegative => seconds >= 0.0,
            Bound::Positive => seconds > 0.0,
        };
        low && seconds.is_finite() && seconds <= MAX_TIMEOUT_SECONDS
    }

    fn describe(self) -> String {
        let low = match self {
            Bound::NonNegative => "a number of seconds >= 0",
            Bound::Positive => "a number of seconds > 0",
        };
        format!("{low} and <= {MAX_TIMEOUT_SECONDS}")
    }
}

/// Typed access to environment variables; unset or empty counts as absent.
struct Vars<'a>(EnvLookup<'a>);

impl Vars<'_> {
    fn string(&self, name: &str) -> Result<Option<String>, ExitError> {
        match (self.0)(name) {
            None => Ok(None),
            Some(value) if value.is_empty() => Ok(None),
            Some(value) => {
                value.into_string().map(Some).map_err(|_| ExitError::usage(format!("{name} must be valid UTF-8")))
            }
        }
    }

    fn seconds(&self, name: &str, bound: Bound) -> Result<Option<Duration>, ExitError> {
        let Some(text) = self.string(name)? else { return Ok(None) };
        match text.trim().parse::<f64>() {
            Ok(s) if bound.accepts(s) => Ok(Some(Duration::from_secs_f64(s))),
            _ => Err(ExitError::usage(format!("{name} must be {}, got {text:?}", bound.describe()))),
        }
    }

    fn integer(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>, ExitError> {
        let Some(text) = self.string(name)? else { return Ok(None) };
        match text.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(ExitError::usage(format!("{name} must be an integer from {min} to {max}, got {text:?}"))),
        }
    }
}

impl Keys<'_> {
    /// A duration in seconds within `bound`.
    fn seconds(&self, key: &str, bound: Bound) -> Result<Option<Duration>, ExitError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(s) if bound.accepts(s) => Ok(Some(Duration::from_secs_f64(s))),
                Some(_) => Err(ExitError::usage(format!("--args-json: `{key}` must be {}", bound.describe()))),
                None => Err(Self::wrong_type(key, &bound.describe(), v)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    fn parse(json: &str) -> Result<ServerConfig, ExitError> {
        ServerConfig::load(json, &no_env)
    }

    fn with_env(json: &str, vars: &[(&str, &str)]) -> Result<ServerConfig, ExitError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ServerConfig::load(json, &move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| OsString::from(v)))
    }

    fn usage_message(json: &str) -> String {
        match parse(json) {
            Err(ExitError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse(r#"{"model_tag": "toy", "other": [1]}"#).unwrap();
        assert_eq!(c.served_model_names, vec!["toy"]);
        assert!(c.api_keys.is_empty());
        assert_eq!(c.engine_ready_timeout, Duration::from_secs(600));
        assert_eq!(c.http_timeout_keep_alive, Duration::from_secs(5));
    }

    #[test]
    fn served_model_name_accepts_string_and_list() {
        let c = parse(r#"{"model_tag": "toy", "served_model_name": ["a", "b"]}"#).unwrap();
        assert_eq!(c.served_model_names, vec!["a", "b"]);
        let c = parse(r#"{"model_tag": "toy", "served_model_name": "a"}"#).unwrap();
        assert_eq!(c.primary_model_name(), "a");
    }

    #[test]
    fn errors_name_the_key() {
        assert!(usage_message(r#"{"served_model_name": "x"}"#).contains("`model_tag`"));
        assert!(usage_message(r#"{"model_tag": 3}"#).contains("`model_tag`"));
        assert!(usage_message(r#"{"model_tag": "toy", "max_model_len": "big"}"#).contains("`max_model_len`"));
        assert!(usage_message(r#"{"model_tag": "toy", "max_model_len": -1}"#).contains("`max_model_len`"));
        assert!(usage_message(r#"{"model_tag": "toy", "enable_log_requests": 1}"#).contains("`enable_log_requests`"));
        assert!(usage_message(r#"{"model_tag": "toy", "http_timeout_keep_alive": true}"#)
            .contains("`http_timeout_keep_alive`"));
        assert!(usage_message(r#"{"model_tag": "toy", "served_model_name": [1]}"#).contains("`served_model_name`"));
        assert!(usage_message("[1]").contains("object"));
        assert!(usage_message("{").contains("JSON"));
    }

    #[test]
    fn api_key_never_shows_in_debug_output() {
        let c = parse(r#"{"model_tag": "toy", "api_key": "sekrit-123"}"#).unwrap();
        assert_eq!(c.api_keys, vec!["sekrit-123"]);
        assert!(!format!("{c:?}").contains("sekrit"));
        let m = usage_message(r#"{"model_tag": "toy", "api_key": 12345678}"#);
        assert!(m.contains("`api_key`") && !m.contains("12345678"), "{m}");
    }

    #[test]
    fn huge_or_non_finite_timeouts_are_usage_errors_naming_the_key() {
        for key in
            ["shutdown_timeout", "http_timeout_keep_alive", "engine_ready_timeout_secs", "engine_stall_timeout_s"]
        {
            for bad in ["1e300", "1e19", "-1", "true", "\"5\""] {
                let m = usage_message(&format!(r#"{{"model_tag": "toy", "{key}": {bad}}}"#));
                assert!(m.contains(&format!("`{key}`")), "{key}={bad}: {m}");
            }
        }
        for key in ["http_timeout_keep_alive", "engine_ready_timeout_secs", "engine_stall_timeout_s"] {
            assert!(usage_message(&format!(r#"{{"model_tag": "toy", "{key}": 0}}"#)).contains(key));
        }
        let c = parse(r#"{"model_tag": "toy", "shutdown_timeout": 0, "engine_stall_timeout_s": 2.5}"#).unwrap();
        assert_eq!(c.shutdown_timeout, Duration::ZERO);
        assert_eq!(c.engine_stall_timeout, Duration::from_millis(2500));
    }

    #[test]
    fn environment_variables_are_validated_naming_the_variable() {
        let toy = r#"{"model_tag": "toy"}"#;
        for (name, bad) in [
            (ENGINE_READY_TIMEOUT_ENV, "1e300"),
            (ENGINE_READY_TIMEOUT_ENV, "0"),
            (ENGINE_STALL_TIMEOUT_ENV, "inf"),
            (ENGINE_STALL_TIMEOUT_ENV, "NaN"),
            (ENGINE_STALL_TIMEOUT_ENV, "-3"),
            (HTTP_BODY_TIMEOUT_ENV, "soon"),
            (HTTP_HEADER_TIMEOUT_ENV, "1e19"),
            (HTTP_MAX_HEADER_BYTES_ENV, "100"),
            (HTTP_MAX_HEADER_BYTES_ENV, "99999999999999999999"),
            (MAX_ENGINE_MESSAGE_BYTES_ENV, "12"),
            (MAX_ENGINE_MESSAGE_BYTES_ENV, "1.5"),
            (LOG_STATS_INTERVAL_ENV, "0"),
            (LOG_STATS_INTERVAL_ENV, "often"),
            (HTTP_MAX_CONNECTIONS_ENV, "0"),
            (HTTP_MAX_CONNECTIONS_ENV, "-4"),
            (HTTP_MAX_CONNECTIONS_ENV, "many"),
        ] {
            match with_env(toy, &[(name, bad)]) {
                Err(ExitError::Usage(m)) => assert!(m.contains(name), "{name}={bad}: {m}"),
                other => panic!("{name}={bad}: expected a usage error, got {other:?}"),
            }
        }
        let c = parse(toy).unwrap();
        assert_eq!(
            (
                c.engine_stall_timeout,
                c.max_engine_message_bytes,
                c.http_body_timeout,
                c.http_header_timeout,
                c.http_max_header_bytes
            ),
            (Duration::from_secs(60), 256 * 1024 * 1024, Duration::from_secs(30), Duration::from_secs(5), 64 * 1024)
        );
        let c = with_env(
            toy,
            &[
                (ENGINE_READY_TIMEOUT_ENV, "7"),
                (HTTP_BODY_TIMEOUT_ENV, "0.5"),
                (HTTP_MAX_HEADER_BYTES_ENV, "8192"),
                (ENGINE_STALL_TIMEOUT_ENV, ""),
                (LOG_STATS_INTERVAL_ENV, "2.5"),
                (HTTP_MAX_CONNECTIONS_ENV, "16"),
            ],
        )
        .unwrap();
        assert_eq!(
            (c.engine_ready_timeout, c.http_body_timeout, c.http_max_header_bytes, c.log_stats_interval),
            (Duration::from_secs(7), Duration::from_millis(500), 8192, Duration::from_millis(2500))
        );
        assert_eq!(c.http_max_connections, 16);
        assert_eq!(c.engine_stall_timeout, Duration::from_secs(60), "an empty variable counts as unset");
        let c = with_env(r#"{"model_tag": "toy", "engine_ready_timeout_secs": 3}"#, &[(ENGINE_READY_TIMEOUT_ENV, "7")])
            .unwrap();
        assert_eq!(c.engine_ready_timeout, Duration::from_secs(3), "--args-json wins over the environment");
    }

    #[test]
    fn api_key_comes_from_the_environment_unless_args_json_gives_one() {
        let c = with_env(r#"{"model_tag": "toy"}"#, &[(API_KEY_ENV, "from-env")]).unwrap();
        assert_eq!(c.api_keys, vec!["from-env"]);
        let c = with_env(r#"{"model_tag": "toy", "api_key": "from-args"}"#, &[(API_KEY_ENV, "from-env")]).unwrap();
        assert_eq!(c.api_keys, vec!["from-args"]);
        let c = with_env(r#"{"model_tag": "toy", "api_key": ""}"#, &[(API_KEY_ENV, "")]).unwrap();
        assert!(c.api_keys.is_empty(), "empty keys mean no authentication, never an empty bearer token");
    }
}
