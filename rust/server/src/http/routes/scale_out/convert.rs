//! Between the scale-out schemas and the routes they reuse: a checked
//! request's sampling parameters as render writes them, a generate body as
//! the completions pipeline's body (prompt token ids in, `return_token_ids`
//! on), and the completions answer as a generate answer.

use super::types::{GenerateBody, GenerateChoice, GenerateResponse};
use crate::http::body::parse_body;
use crate::http::error::ApiError;
use crate::http::routes::openai::completions::types::CompletionBody;
use crate::http::sampling::CommonParams;
use serde_json::{json, Map, Value};
use vllm_rs_engine::ids::random_hex;

/// The `sampling_params` keys `/inference/v1/generate` honours: vLLM's
/// `SamplingParams` fields that the completions route takes under the same name.
pub const SAMPLING_KEYS: &[&str] = &[
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "max_tokens",
    "min_tokens",
    "logprobs",
    "prompt_logprobs",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "logit_bias",
    "bad_words",
    "allowed_token_ids",
];

/// The sampling parameters of a checked request, by vLLM's `SamplingParams`
/// names, as render writes them: what the request set (the model's
/// generation-config defaults are the generating server's to add, as in
/// vLLM's render) and `max_tokens` as it would run.
pub fn sampling_params(common: &CommonParams, max_tokens: Option<u64>) -> Map<String, Value> {
    let mut params = Map::new();
    let sampling = &common.sampling;
    let mut put = |key: &str, value: Value| {
        if !value.is_null() {
            params.insert(key.to_owned(), value);
        }
    };
    put("n", json!(common.n));
    put("temperature", json!(sampling.temperature));
    put("top_p", json!(sampling.top_p));
    put("top_k", json!(sampling.top_k));
    put("min_p", json!(sampling.min_p));
    put("seed", json!(sampling.seed));
    put("presence_penalty", json!(sampling.presence_penalty));
    put("frequency_penalty", json!(sampling.frequency_penalty));
    put("repetition_penalty", json!(sampling.repetition_penalty));
    put("stop", json!(common.stop));
    put("stop_token_ids", json!(common.stop_token_ids));
    put("ignore_eos", json!(sampling.ignore_eos));
    put("max_tokens", json!(sampling.max_tokens.or(max_tokens)));
    put("min_tokens", json!(sampling.min_tokens));
    put("logprobs", json!(sampling.logprobs));
    put("prompt_logprobs", json!(sampling.prompt_logprobs));
    put("skip_special_tokens", json!(common.decode.skip_special_tokens));
    put("spaces_between_special_tokens", json!(common.decode.spaces_between_special_tokens));
    put("include_stop_str_in_output", json!(common.include_stop_str_in_output));
    put("structured_outputs", json!(sampling.structured_outputs));
    params
}

/// A generate body as the completions pipeline's body, and the request's id.
/// `default_max_tokens(prompt_len)` gives `max_tokens` when the body has none.
pub fn completion_body(
    body: GenerateBody,
    default_max_tokens: impl Fn(u64) -> Option<u64>,
) -> Result<(String, CompletionBody), ApiError> {
    let refuse = |param: &str| ApiError::invalid_param(param, format!("`{param}` is not supported"));
    if body.stream == Some(true) {
        return Err(crate::http::rules::RULES.refuse("stream", "generate_stream_unsupported", &[]));
    }
    let refused = [
        ("stream_options", body.stream_options.is_some()),
        ("features", body.features.is_some()),
        ("cache_salt", body.cache_salt.is_some()),
        ("kv_transfer_params", body.kv_transfer_params.is_some()),
        ("priority", body.priority.is_some_and(|p| p != 0)),
    ];
    if let Some((param, _)) = refused.iter().find(|(_, given)| *given) {
        return Err(refuse(param));
    }
    let token_ids = body.token_ids.ok_or_else(|| ApiError::invalid_param("token_ids", "`token_ids` is required"))?;
    if token_ids.is_empty() || token_ids.iter().any(|&t| t < 0) {
        return Err(ApiError::invalid_param("token_ids", "`token_ids` must be a non-empty list of token ids (>= 0)"));
    }
    let sampling = body
        .sampling_params
        .ok_or_else(|| ApiError::invalid_param("sampling_params", "`sampling_params` is required"))?;
    let mut completion = Map::new();
    for (key, value) in sampling {
        if value.is_null() {
            continue;
        }
        if key == "structured_outputs" || !SAMPLING_KEYS.contains(&key.as_str()) {
            return Err(refuse(&format!("sampling_params.{key}")));
        }
        completion.insert(key, value);
    }
    if !completion.contains_key("max_tokens") {
        if let Some(n) = default_max_tokens(token_ids.len() as u64) {
            completion.insert("max_tokens".into(), json!(n));
        }
    }
    let request_id = body.request_id.unwrap_or_else(|| random_hex(32));
    completion.insert("prompt".into(), json!(token_ids));
    completion.insert("model".into(), json!(body.model));
    completion.insert("request_id".into(), json!(request_id));
    completion.insert("return_token_ids".into(), json!(true));
    let body =
        parse_body(&serde_json::to_vec(&completion).expect("a JSON object serializes")).map_err(generate_error)?;
    Ok((request_id, body))
}

/// An error of the completions pipeline, naming the generate body's field:
/// its sampling fields are under `sampling_params`, its prompt is `token_ids`.
pub fn generate_error(error: ApiError) -> ApiError {
    let param = error.param.as_deref().map(|param| match param {
        "prompt" => "token_ids".to_owned(),
        key if SAMPLING_KEYS.contains(&key) => format!("sampling_params.{key}"),
        other => other.to_owned(),
    });
    ApiError { param, ..error }
}

/// The generate answer of a whole completions answer.
pub fn generate_response(request_id: String, completion: &Value) -> GenerateResponse {
    let choices = completion["choices"].as_array().map(Vec::as_slice).unwrap_or_default();
    GenerateResponse {
        request_id,
        model: completion["model"].as_str().map(str::to_owned),
        created: completion["created"].as_u64(),
        usage: completion.get("usage").cloned(),
        choices: choices
            .iter()
            .map(|choice| GenerateChoice {
                index: choice["index"].as_u64().unwrap_or(0) as u32,
                logprobs: choice.get("logprobs").filter(|l| !l.is_null()).cloned(),
                finish_reason: choice["finish_reason"].as_str().map(str::to_owned),
                token_ids: serde_json::from_value(choice["token_ids"].clone()).ok(),
            })
            .collect(),
        prompt_logprobs: completion.get("prompt_logprobs").filter(|l| !l.is_null()).cloned(),
        kv_transfer_params: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(value: Value) -> GenerateBody {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_generate_body_becomes_a_token_prompt_completion() {
        let (id, mut completion) = completion_body(
            body(json!({"request_id": "r1", "token_ids": [5, 6], "model": "m",
                "sampling_params": {"temperature": 0, "max_tokens": 3, "stop": ["x"], "seed": null}})),
            |_| Some(99),
        )
        .unwrap();
        assert_eq!(id, "r1");
        let sampling = std::mem::take(&mut completion.sampling);
        assert_eq!((sampling.max_tokens, sampling.temperature), (Some(3), Some(0.0)));
        assert_eq!((sampling.return_token_ids, sampling.request_id.as_deref()), (Some(true), Some("r1")));
        let (_, mut defaulted) =
            completion_body(body(json!({"token_ids": [5, 6, 7], "sampling_params": {}})), |len| Some(100 - len))
                .unwrap();
        assert_eq!(std::mem::take(&mut defaulted.sampling).max_tokens, Some(97));
    }

    #[test]
    fn what_it_cannot_serve_is_refused_by_name() {
        for (value, param) in [
            (json!({"token_ids": [1], "sampling_params": {}, "stream": true}), "stream"),
            (json!({"token_ids": [], "sampling_params": {}}), "token_ids"),
            (json!({"token_ids": [-1], "sampling_params": {}}), "token_ids"),
            (json!({"token_ids": [1]}), "sampling_params"),
            (json!({"token_ids": [1], "sampling_params": {"guided_json": {}}}), "sampling_params.guided_json"),
            (json!({"token_ids": [1], "sampling_params": {"top_k": "x"}}), "sampling_params.top_k"),
            (json!({"token_ids": [1], "sampling_params": {}, "priority": 2}), "priority"),
            (json!({"token_ids": [1], "sampling_params": {}, "cache_salt": "s"}), "cache_salt"),
        ] {
            let err = completion_body(body(value.clone()), |_| None).expect_err(&value.to_string());
            assert_eq!(err.param.as_deref(), Some(param), "{value}: {}", err.message);
        }
    }

    #[test]
    fn a_completion_answer_becomes_a_generate_answer() {
        let completion = json!({"model": "m", "created": 5, "choices": [{"index": 0, "text": "x", "logprobs": null,
            "finish_reason": "length", "token_ids": [7, 8]}], "usage": {"prompt_tokens": 1}});
        let answer = serde_json::to_value(generate_response("r".into(), &completion)).unwrap();
        assert_eq!(
            answer,
            json!({"request_id": "r", "model": "m", "created": 5, "choices": [{"index": 0, "logprobs": null,
                "finish_reason": "length", "token_ids": [7, 8]}], "usage": {"prompt_tokens": 1},
                "prompt_logprobs": null, "kv_transfer_params": null})
        );
    }
}
