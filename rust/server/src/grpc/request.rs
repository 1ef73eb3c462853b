//! A `GenerateRequest` checked and mapped onto an engine request the way
//! vLLM's gRPC servicer maps it onto its `SamplingParams`: its values become
//! the [`SamplingFields`] the HTTP routes read, and the engine's parameters
//! are theirs ([`SamplingFields::engine_params`]).

use crate::http::error::ApiError;
use crate::http::generation::structured::single_constraint;
use crate::http::rules::RULES;
use crate::http::sampling::SamplingFields;
use serde_json::Value;
use tonic::Status;
use vllm_rs_grpc::engine::{generate_request, sampling_params::Constraint, GenerateRequest};
use vllm_rs_wire::protocol::SamplingParams;

/// The prompt of a `GenerateRequest`.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// `tokenized.input_ids`.
    Tokens(Vec<u32>),
    /// `text`, to be tokenized with the model's special tokens.
    Text(String),
}

/// What the servicer needs of a `GenerateRequest`, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct MappedRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Sampling parameters; `max_tokens` and the stop tokens are filled in at submission.
    pub sampling: SamplingParams,
    /// Stop strings, matched on the detokenized output.
    pub stop: Vec<String>,
    /// Stream chunks (true) or answer with one `GenerateComplete` per choice.
    pub stream: bool,
    /// Number of choices (`n`, at least 1).
    pub n: u32,
    /// Engine the request is pinned to.
    pub data_parallel_rank: Option<u32>,
}

/// An INVALID_ARGUMENT status naming `field`.
pub fn invalid(field: &str, why: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {why}"))
}

fn unsupported(field: &str) -> Status {
    invalid(field, "not supported yet by the vllm-rs frontend")
}

/// The INVALID_ARGUMENT status for a request rule the HTTP routes share,
/// its message led by the field: `sampling_params.` and the rule's param
/// unless the param is already the field's whole name.
pub fn rule_status(error: ApiError) -> Status {
    match error.param {
        Some(param) if param.starts_with("sampling_params.") => invalid(&param, error.message),
        Some(param) => invalid(&format!("sampling_params.{param}"), error.message),
        None => Status::invalid_argument(error.message),
    }
}

/// The structured-outputs constraint as vLLM's servicer maps it onto its
/// `StructuredOutputsParams` (`json_schema` is its `json`), checked and
/// encoded as the HTTP routes do it.
#[allow(clippy::result_large_err)]
fn constraint_params(constraint: &Constraint) -> Result<Value, Status> {
    let (field, kind, spec) = match constraint {
        Constraint::JsonSchema(schema) => ("json_schema", "json", Value::from(schema.as_str())),
        Constraint::Regex(regex) => ("regex", "regex", Value::from(regex.as_str())),
        Constraint::Grammar(grammar) => ("grammar", "grammar", Value::from(grammar.as_str())),
        Constraint::StructuralTag(tag) => ("structural_tag", "structural_tag", Value::from(tag.as_str())),
        Constraint::JsonObject(on) => ("json_object", "json_object", Value::from(*on)),
        Constraint::Choice(choice) => ("choice", "choice", Value::from(choice.choices.clone())),
    };
    single_constraint(&format!("sampling_params.{field}"), kind, spec).map_err(rule_status)
}

/// Checks `request` and maps it. Zero means "unset" for the non-optional
/// proto3 numbers, as in vLLM's servicer: top_p 0 -> 1, top_k 0 -> off,
/// repetition_penalty 0 -> 1, n 0 -> 1; an unset temperature is 1.
/// `logprobs`, `prompt_logprobs` and `n` are checked by the HTTP routes'
/// rules; the `--max-logprobs` limit is checked at submission.
// tonic's Status is large, but it is what every RPC answers with.
#[allow(clippy::result_large_err)]
pub fn map_request(request: &GenerateRequest) -> Result<MappedRequest, Status> {
    let prompt = match &request.input {
        Some(generate_request::Input::Tokenized(t)) => Prompt::Tokens(t.input_ids.clone()),
        Some(generate_request::Input::Text(text)) => Prompt::Text(text.clone()),
        None => return Err(invalid("input", "one of `tokenized` or `text` is required")),
    };
    if request.mm_inputs.is_some() || !request.extra_mm_inputs.is_empty() {
        return Err(unsupported("mm_inputs"));
    }
    if request.media_refs.is_some() {
        return Err(unsupported("media_refs"));
    }
    if request.kv_transfer_params.is_some() || request.kv_transfer_params_json.is_some() {
        return Err(unsupported("kv_transfer_params"));
    }
    let data_parallel_rank = match request.data_parallel_rank {
        None => None,
        Some(rank) => Some(u32::try_from(rank).map_err(|_| invalid("data_parallel_rank", "must not be negative"))?),
    };
    let params = request.sampling_params.clone().unwrap_or_default();
    let n = params.n.max(1);
    RULES.check_int("n", i64::from(n)).map_err(rule_status)?;
    for (param, value) in [("logprobs", params.logprobs), ("prompt_logprobs", params.prompt_logprobs)] {
        if let Some(value) = value {
            RULES.check_int(param, i64::from(value)).map_err(rule_status)?;
        }
    }
    let structured_outputs = params.constraint.as_ref().map(constraint_params).transpose()?;
    if !params.logit_bias.is_empty() {
        return Err(unsupported("sampling_params.logit_bias"));
    }
    if params.truncate_prompt_tokens.is_some() {
        return Err(unsupported("sampling_params.truncate_prompt_tokens"));
    }
    if params.include_stop_str_in_output {
        return Err(unsupported("sampling_params.include_stop_str_in_output"));
    }
    let temperature = params.temperature.unwrap_or(1.0);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(invalid(
            "sampling_params.temperature",
            format!("must be a non-negative number, got {temperature}"),
        ));
    }
    let top_p = if params.top_p == 0.0 { 1.0 } else { params.top_p };
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(invalid("sampling_params.top_p", format!("must be in (0, 1], got {top_p}")));
    }
    if !(0.0..=1.0).contains(&params.min_p) {
        return Err(invalid("sampling_params.min_p", format!("must be in [0, 1], got {}", params.min_p)));
    }
    for (field, value) in
        [("frequency_penalty", params.frequency_penalty), ("presence_penalty", params.presence_penalty)]
    {
        if !(-2.0..=2.0).contains(&value) {
            return Err(invalid(&format!("sampling_params.{field}"), format!("must be in [-2, 2], got {value}")));
        }
    }
    let repetition_penalty = if params.repetition_penalty == 0.0 { 1.0 } else { params.repetition_penalty };
    if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
        return Err(invalid(
            "sampling_params.repetition_penalty",
            format!("must be greater than 0, got {repetition_penalty}"),
        ));
    }
    if params.max_tokens == Some(0) {
        return Err(invalid("sampling_params.max_tokens", "must be at least 1"));
    }
    if let Some(max) = params.max_tokens {
        if params.min_tokens > max {
            return Err(invalid(
                "sampling_params.min_tokens",
                format!("must not exceed max_tokens ({max}), got {}", params.min_tokens),
            ));
        }
    }
    let fields = SamplingFields {
        temperature: Some(f64::from(temperature)),
        top_p: Some(f64::from(top_p)),
        top_k: Some(if params.top_k == 0 { -1 } else { i64::from(params.top_k) }),
        min_p: Some(f64::from(params.min_p)),
        frequency_penalty: Some(f64::from(params.frequency_penalty)),
        presence_penalty: Some(f64::from(params.presence_penalty)),
        repetition_penalty: Some(f64::from(repetition_penalty)),
        max_tokens: params.max_tokens.map(i64::from),
        min_tokens: Some(i64::from(params.min_tokens)),
        seed: params.seed.map(i64::from),
        ignore_eos: Some(params.ignore_eos),
        prompt_logprobs: params.prompt_logprobs.map(i64::from),
        ..SamplingFields::default()
    };
    let sampling = SamplingParams {
        stop_token_ids: params.stop_token_ids.clone(),
        structured_outputs,
        logprobs: params.logprobs.map(i64::from),
        ..fields.engine_params()
    };
    Ok(MappedRequest { prompt, sampling, stop: params.stop, stream: request.stream, n, data_parallel_rank })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vllm_rs_grpc::engine::{ChoiceConstraint, SamplingParams as ProtoParams, TokenizedInput};

    fn tokens_request(params: ProtoParams) -> GenerateRequest {
        GenerateRequest {
            request_id: "r1".into(),
            input: Some(generate_request::Input::Tokenized(TokenizedInput {
                original_text: String::new(),
                input_ids: vec![5, 6, 7],
            })),
            sampling_params: Some(params),
            stream: true,
            ..GenerateRequest::default()
        }
    }

    #[test]
    fn zero_means_unset_like_vllms_servicer() {
        let mapped = map_request(&tokens_request(ProtoParams::default())).unwrap();
        assert_eq!(mapped.prompt, Prompt::Tokens(vec![5, 6, 7]));
        assert!(mapped.stream);
        let s = mapped.sampling;
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.repetition_penalty),
            (Some(1.0), Some(1.0), Some(-1), Some(1.0))
        );
        assert_eq!((s.max_tokens, s.min_tokens, s.seed), (None, Some(0), None));
    }

    #[test]
    fn given_values_are_carried() {
        let params = ProtoParams {
            temperature: Some(0.0),
            top_p: 0.5,
            top_k: 4,
            max_tokens: Some(9),
            min_tokens: 2,
            seed: Some(3),
            stop: vec!["x".into()],
            stop_token_ids: vec![11],
            ignore_eos: true,
            ..ProtoParams::default()
        };
        let mapped = map_request(&tokens_request(params)).unwrap();
        let s = &mapped.sampling;
        assert_eq!((s.temperature, s.top_p, s.top_k), (Some(0.0), Some(0.5), Some(4)));
        assert_eq!((s.max_tokens, s.min_tokens, s.seed), (Some(9), Some(2), Some(3)));
        assert_eq!(s.stop_token_ids, vec![11]);
        assert!(s.ignore_eos);
        assert_eq!(mapped.stop, vec!["x".to_string()]);
    }

    #[test]
    fn choices_logprobs_and_constraints_map_as_vllms_servicer() {
        let params = ProtoParams {
            n: 3,
            logprobs: Some(2),
            prompt_logprobs: Some(0),
            constraint: Some(Constraint::JsonSchema(r#"{"type": "object"}"#.into())),
            ..ProtoParams::default()
        };
        let mapped = map_request(&tokens_request(params)).unwrap();
        assert_eq!((mapped.n, mapped.sampling.logprobs, mapped.sampling.prompt_logprobs), (3, Some(2), Some(0)));
        // The engine gets vLLM's StructuredOutputsParams: the schema as `json`, text as given.
        let structured = mapped.sampling.structured_outputs.unwrap();
        assert_eq!(structured["json"], r#"{"type": "object"}"#);
        assert_eq!(structured["regex"], Value::Null);
        let choice = Constraint::Choice(ChoiceConstraint { choices: vec!["yes".into(), "no".into()] });
        let mapped = map_request(&tokens_request(ProtoParams { constraint: Some(choice), ..ProtoParams::default() }));
        assert_eq!(mapped.unwrap().sampling.structured_outputs.unwrap()["choice"], serde_json::json!(["yes", "no"]));
        let unset = map_request(&tokens_request(ProtoParams::default())).unwrap();
        assert_eq!((unset.n, unset.sampling.logprobs, unset.sampling.structured_outputs), (1, None, None));
    }

    #[test]
    fn bad_input_names_the_field() {
        let cases = [
            (ProtoParams { top_p: 1.5, ..ProtoParams::default() }, "sampling_params.top_p"),
            (
                ProtoParams { max_tokens: Some(2), min_tokens: 3, ..ProtoParams::default() },
                "sampling_params.min_tokens",
            ),
            (ProtoParams { n: 20000, ..ProtoParams::default() }, "sampling_params.n"),
            (ProtoParams { logprobs: Some(-2), ..ProtoParams::default() }, "sampling_params.logprobs"),
            (ProtoParams { prompt_logprobs: Some(-5), ..ProtoParams::default() }, "sampling_params.prompt_logprobs"),
            (
                ProtoParams { constraint: Some(Constraint::JsonSchema("{not json".into())), ..ProtoParams::default() },
                "sampling_params.json_schema",
            ),
            (
                ProtoParams { constraint: Some(Constraint::Regex("a(".into())), ..ProtoParams::default() },
                "sampling_params.regex",
            ),
            (
                ProtoParams {
                    constraint: Some(Constraint::Choice(ChoiceConstraint { choices: vec![] })),
                    ..ProtoParams::default()
                },
                "sampling_params.choice",
            ),
            (
                ProtoParams { constraint: Some(Constraint::JsonObject(false)), ..ProtoParams::default() },
                "sampling_params.json_object",
            ),
        ];
        for (params, field) in cases {
            let status = map_request(&tokens_request(params)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().starts_with(field), "{}", status.message());
        }
        let no_input = GenerateRequest { input: None, ..tokens_request(ProtoParams::default()) };
        assert!(map_request(&no_input).unwrap_err().message().starts_with("input"));
    }
}
