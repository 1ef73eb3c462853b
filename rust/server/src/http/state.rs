//! What every handler shares.

use std::sync::Arc;
use vllm_rs_chat::Tokenizer;
use vllm_rs_config::ServerConfig;
use vllm_rs_engine::EngineClient;
use vllm_rs_metrics::Metrics;
use vllm_rs_model_files::class_labels::ClassLabels;
use vllm_rs_model_files::generation_config::GenerationConfig;

/// The server's shared state.
pub struct AppState {
    /// The validated `--args-json`.
    pub config: ServerConfig,
    /// The model's tokenizer.
    pub tokenizer: Arc<dyn Tokenizer>,
    /// Sampling defaults, `max_tokens` cap and extra EOS ids of the model's generation config.
    pub generation_config: Arc<GenerationConfig>,
    /// The class names `/classify` answers (the classifier's `id2label`).
    pub class_labels: ClassLabels,
    /// The engines.
    pub engines: EngineClient,
    /// Request metrics.
    pub metrics: Arc<Metrics>,
    /// Bound on prompt plus `max_tokens`: the minimum of the engines' and the config's.
    pub max_model_len: Option<u64>,
    /// When the server started (unix seconds), reported as the model's `created`.
    pub created: u64,
}

/// The state as handlers receive it.
pub type SharedState = Arc<AppState>;

/// Seconds since the unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Seconds since the unix epoch, as a float.
pub fn unix_now_f64() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
