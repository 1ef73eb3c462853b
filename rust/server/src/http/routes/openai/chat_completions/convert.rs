//! A checked chat request to the engine's prompt (the chat template rendered
//! and tokenized), and the engine's output to the answer's role and logprobs.

use super::types::{ChatBody, ChatRequest, PreparedChat};
use crate::http::error::ApiError;
use crate::http::generation::structured::wire_params;
use crate::http::generation::submit::{check_generates, check_model, Endpoint};
use crate::http::generation::template_kwargs::{apply_reasoning_effort, read_template_kwargs};
use crate::http::generation::tools::read_chat_tools;
use crate::http::state::AppState;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use vllm_rs_chat::chat_template::ChatTemplate;
use vllm_rs_chat::{ChatMessage, ChatTemplateError};
use vllm_rs_generate::logprobs::Rendering;

/// The message of a refused untrusted `chat_template`: vLLM's words.
const UNTRUSTED_TEMPLATE: &str = "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.";

/// The prompt text of `request` with its checked `tools` and template kwargs:
/// the request's own template when the server trusts it (400 otherwise),
/// the final message left open with `continue_final_message`.
fn render_prompt(
    state: &AppState,
    request: &ChatRequest,
    tools: Option<&Value>,
    kwargs: &Map<String, Value>,
) -> Result<String, ApiError> {
    let template_error = |e: ChatTemplateError| {
        let param = if request.chat_template.is_some() { "chat_template" } else { "messages" };
        ApiError::invalid_param(param, format!("cannot apply the chat template: {e}"))
    };
    let (messages, add_generation_prompt) = (&request.messages, request.add_generation_prompt);
    let prompt = match &request.chat_template {
        Some(_) if !state.config.chat.trust_request_chat_template => {
            return Err(ApiError::invalid_param("chat_template", UNTRUSTED_TEMPLATE))
        }
        Some(source) => {
            let (bos, eos) = state.tokenizer.template_tokens();
            ChatTemplate::new(source.clone(), bos, eos)
                .map_err(|e| {
                    ApiError::invalid_param("chat_template", format!("the chat template does not compile: {e}"))
                })?
                .render_with_tools(messages, add_generation_prompt, tools, kwargs)
                .map_err(template_error)?
        }
        None => state
            .tokenizer
            .apply_chat_template_with_tools(messages, add_generation_prompt, tools, kwargs)
            .map_err(template_error)?,
    };
    if !request.continue_final_message {
        return Ok(prompt);
    }
    let last = messages.last().map(|m| m.content.as_str()).unwrap_or_default();
    continue_final_message(&prompt, last).ok_or_else(|| {
        ApiError::invalid_param(
            "continue_final_message",
            "continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible.",
        )
    })
}

/// `rendered` cut right after the final message's text, as transformers'
/// `apply_chat_template(continue_final_message=True)` cuts it (which vLLM
/// calls): at its last occurrence, keeping its leading spacing, and its
/// trailing spacing when the template kept it. `None` when the template
/// dropped part of the message.
pub fn continue_final_message(rendered: &str, final_message: &str) -> Option<String> {
    let stripped = final_message.trim();
    let at = rendered.rfind(stripped)?;
    let left_stripped = final_message.trim_start();
    let end = if rendered[at..].starts_with(left_stripped) { at + left_stripped.len() } else { at + stripped.len() };
    Some(rendered[..end].to_owned())
}

/// Checks `body` with the server's options and renders and tokenizes its prompt.
pub fn prepare_chat(state: &AppState, body: ChatBody) -> Result<PreparedChat, ApiError> {
    let mut request = body.validate()?;
    let tools = read_chat_tools(&request.tools, &state.config.chat)?;
    let chat = &state.config.chat;
    let given_kwargs = request.chat_template_kwargs.as_ref();
    let mut template_kwargs = read_template_kwargs(given_kwargs, &chat.default_template_kwargs)?;
    apply_reasoning_effort(
        &mut template_kwargs,
        given_kwargs,
        request.reasoning_effort.as_deref(),
        &chat.reasoning_effort_map,
    );
    if let Some(constraint) = &tools.constraint {
        // A forced tool choice replaces the request's own constraint, as in vLLM.
        request.common.sampling.structured_outputs = Some(wire_params(constraint));
    }
    check_model(state, request.common.model.as_deref())?;
    check_generates(state, Endpoint::Chat)?;
    let prompt = render_prompt(state, &request, tools.tools.as_ref(), &template_kwargs)?;
    let prompt_token_ids = state
        .tokenizer
        .encode(&prompt, false)
        .map_err(|e| ApiError::invalid_param("messages", format!("cannot tokenize the messages: {e}")))?;
    Ok(PreparedChat { request, tools, template_kwargs, prompt_token_ids })
}

/// A whole chat answer's `logprobs` (choice) and `prompt_logprobs`
/// (response), each `None` when not asked for.
pub(super) fn whole_logprobs(
    rendering: Option<&Rendering>,
    whole: &vllm_rs_generate::Whole,
) -> (Option<Box<RawValue>>, Option<Box<RawValue>>) {
    let Some(rendering) = rendering else { return (None, None) };
    let scored = whole.scored.as_deref();
    let prompt = rendering
        .prompt_logprobs
        .then(|| rendering.prompt_logprobs_json(scored.and_then(|s| s.prompt_logprobs.as_deref())));
    (rendering.chat_logprobs(scored), prompt)
}

/// The role of the answer, as vLLM picks it: `response_role` when the prompt
/// ends with the generation prompt, else the last message's role (the model
/// continues that message).
pub(super) fn response_role(configured: &str, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    match messages.last() {
        Some(last) if !add_generation_prompt => last.role.clone(),
        _ => configured.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_final_message_cuts_where_transformers_cuts() {
        let rendered = "<|user|>hi<|end|><|assistant|>Once upon<|end|>";
        assert_eq!(
            continue_final_message(rendered, "Once upon").as_deref(),
            Some("<|user|>hi<|end|><|assistant|>Once upon")
        );
        // Trailing spacing the template kept stays; spacing it trimmed is not restored.
        assert_eq!(continue_final_message("<a>Once upon <e>", "Once upon ").as_deref(), Some("<a>Once upon "));
        assert_eq!(continue_final_message("<a>Once upon<e>", "Once upon ").as_deref(), Some("<a>Once upon"));
        // The last occurrence counts.
        assert_eq!(continue_final_message("x<e>x<e>", "x").as_deref(), Some("x<e>x"));
        assert_eq!(continue_final_message("<a>changed<e>", "Once upon"), None);
    }
}
