//! Hugging Face tokenizers: `tokenizer.json` through the `tokenizers` crate,
//! special tokens from `tokenizer_config.json`, and the chat template as
//! transformers finds it: `chat_template.jinja` when the model has one, else
//! `tokenizer_config.json`'s `chat_template`, else `chat_template.json`'s.

use super::chat_template::{special_token, template_source, ChatTemplate};
use super::incremental::{AddedTokens, IncrementalDecoder};
use super::token_bytes::{TokenBytes, TokenBytesDecoder};
use super::{ChatMessage, ChatTemplateError, DecodeOptions, TextDecoder, Tokenizer};
use anyhow::{anyhow, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// A model's Hugging Face tokenizer.
pub struct HfTokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// The same `tokenizer.json` in `fastokens`, which encodes prompts (as vLLM
    /// 0.33's frontend does); `None` where it does not support the file, and
    /// `inner` encodes (as it does while the table is still loading).
    fast: Arc<OnceLock<Option<fastokens::Tokenizer>>>,
    /// Every token's bytes, for a byte-level BPE vocabulary (`None` for other
    /// decoders, which the `tokenizers` decode stream handles).
    token_bytes: Arc<OnceLock<Option<Arc<TokenBytes>>>>,
    /// Tokens in the vocabulary, added tokens included.
    vocab_size: usize,
    added_tokens: AddedTokens,
    eos_token_id: Option<u32>,
    chat_template: Option<ChatTemplate>,
    /// The chat template's text and its BOS/EOS tokens, for a template that replaces it.
    template_parts: (Option<String>, String, String),
    source: PathBuf,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            Ok(Some(serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The chat template of the model in `dir` whose `tokenizer_config.json` is
/// `config`, in transformers' order: a `chat_template.jinja` file (which
/// transformers lets win over the config's), the config's `chat_template`,
/// then a processor's `chat_template.json` (`{"chat_template": ...}`).
fn find_template(dir: &Path, config: &Value) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja) {
        Ok(text) => return Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", jinja.display())),
    }
    if let Some(text) = template_source(config) {
        return Ok(Some(text));
    }
    Ok(read_json(&dir.join("chat_template.json"))?.as_ref().and_then(template_source))
}

/// Run on the tables' thread once a tokenizer's tables are built (see
/// [`on_tables_built`]).
static TABLES_BUILT: OnceLock<fn()> = OnceLock::new();

/// Registers `hook` to run on the tables' thread each time a tokenizer has
/// built its `fastokens` encoder and token bytes: loading them frees tens of
/// MiB of parse garbage for a real vocabulary, which the binary's allocator
/// may keep unless told to return it. The first registration stays; later
/// ones are ignored (one allocator per process).
pub fn on_tables_built(hook: fn()) {
    let _ = TABLES_BUILT.set(hook);
}

/// Table builds on hold (see [`hold_table_builds`]): how many holds are
/// out, and how many builds are started and not finished.
static HOLDS: std::sync::Mutex<TableHolds> = std::sync::Mutex::new(TableHolds { held: 0, pending: 0 });
/// Signalled when the last hold ends.
static HOLDS_ENDED: std::sync::Condvar = std::sync::Condvar::new();

struct TableHolds {
    held: usize,
    pending: usize,
}

/// Holds back the building of every tokenizer's tables (the `fastokens`
/// encoder and the token bytes, built on a thread of their own) until the
/// returned hold ends: a server starting up holds them while it gets to its
/// first response, so that their tens of milliseconds of CPU do not compete
/// with its start-up on a small machine. Until they are built, prompts are
/// encoded by the `tokenizers` crate (same ids) and a decoder builds the
/// token bytes itself, so nothing waits on a hold.
#[must_use = "the builds start when the hold ends"]
pub fn hold_table_builds() -> TableBuildsHold {
    HOLDS.lock().unwrap_or_else(|e| e.into_inner()).held += 1;
    TableBuildsHold { ended: false }
}

/// A hold on table builds (see [`hold_table_builds`]); dropping it ends it too.
pub struct TableBuildsHold {
    ended: bool,
}

impl TableBuildsHold {
    /// Ends the hold; true when a build is still to finish (it calls the
    /// [`on_tables_built`] hook when done), false when no tokenizer had
    /// tables to build or they were built already.
    pub fn end(mut self) -> bool {
        self.end_hold()
    }

    fn end_hold(&mut self) -> bool {
        if std::mem::replace(&mut self.ended, true) {
            return false;
        }
        let mut holds = HOLDS.lock().unwrap_or_else(|e| e.into_inner());
        holds.held -= 1;
        if holds.held == 0 {
            HOLDS_ENDED.notify_all();
        }
        holds.pending > 0
    }
}

impl Drop for TableBuildsHold {
    fn drop(&mut self) {
        self.end_hold();
    }
}

/// Counts a build as pending (before its thread starts, so that a hold
/// ending at once sees it), or as finished (`-1`).
fn count_pending(change: isize) {
    let mut holds = HOLDS.lock().unwrap_or_else(|e| e.into_inner());
    holds.pending = holds.pending.checked_add_signed(change).expect("one finish per pending build");
}

/// Returns once no hold on table builds is out.
fn wait_for_holds() {
    let mut holds = HOLDS.lock().unwrap_or_else(|e| e.into_inner());
    while holds.held > 0 {
        holds = HOLDS_ENDED.wait(holds).unwrap_or_else(|e| e.into_inner());
    }
}

/// `file` in `fastokens`; `None` where it does not support the file. Its
/// padding and truncation are dropped, as for the `tokenizers` one (`load`).
fn load_fastokens(file: &Path) -> Option<fastokens::Tokenizer> {
    let mut tokenizer = fastokens::Tokenizer::from_file(file)
        .inspect_err(|e| tracing::debug!("{}: prompts are encoded without fastokens: {e}", file.display()))
        .ok()?;
    tokenizer.set_padding(None);
    tokenizer.set_truncation(None);
    Some(tokenizer)
}

impl HfTokenizer {
    /// Loads from `location`: a directory holding `tokenizer.json` (and
    /// optionally `tokenizer_config.json`), or a
    /// `tokenizer.json` file itself.
    pub fn load(location: &Path) -> Result<Self> {
        let (dir, file) = if location.is_dir() {
            (location.to_path_buf(), location.join("tokenizer.json"))
        } else {
            (location.parent().unwrap_or(Path::new(".")).to_path_buf(), location.to_path_buf())
        };
        if !file.is_file() {
            return Err(anyhow!("{} does not exist", file.display()));
        }
        let mut inner =
            tokenizers::Tokenizer::from_file(&file).map_err(|e| anyhow!("loading {}: {e}", file.display()))?;
        // A tokenizer.json may pad or cut every encoding (sentence-transformers'
        // all-MiniLM-L6-v2 pads to 128); transformers drops both on load, so
        // prompts are whole and unpadded, as vLLM tokenizes them.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| anyhow!("loading {}: {e}", file.display()))?;
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let token_id = |name: Option<String>| name.and_then(|t| inner.token_to_id(&t));
        let eos_token_id = token_id(special_token(&config, "eos_token"));
        let bos_token = special_token(&config, "bos_token").unwrap_or_default();
        let eos_token = special_token(&config, "eos_token").unwrap_or_default();
        let template_text = find_template(&dir, &config)?;
        let chat_template = match &template_text {
            Some(source) => Some(
                ChatTemplate::new(source.clone(), bos_token.clone(), eos_token.clone())
                    .with_context(|| format!("compiling the chat template of {}", dir.display()))?,
            ),
            None => None,
        };
        let added_tokens =
            Arc::new(inner.get_added_tokens_decoder().into_iter().map(|(id, token)| (id, token.content)).collect());
        let template_parts = (template_text, bos_token, eos_token);
        // Counted once: the library builds the whole vocabulary map to count it.
        let vocab_size = inner.get_vocab_size(true);
        let tokenizer = HfTokenizer {
            vocab_size,
            inner: Arc::new(inner),
            fast: Arc::default(),
            token_bytes: Arc::default(),
            added_tokens,
            eos_token_id,
            chat_template,
            template_parts,
            source: file,
        };
        tokenizer.load_tables_in_background();
        Ok(tokenizer)
    }

    /// Builds the `fastokens` encoder and the token bytes on a thread of
    /// their own, once no [`hold_table_builds`] hold is out: they take tens
    /// of milliseconds and tens of MiB for a real vocabulary, which would
    /// otherwise delay the frontend's start-up. Until they are there,
    /// prompts are encoded by `tokenizers` (same ids) and the first decoder
    /// builds the token bytes (or waits for the thread building them).
    fn load_tables_in_background(&self) {
        let (fast, token_bytes, inner, file, vocab_size) =
            (self.fast.clone(), self.token_bytes.clone(), self.inner.clone(), self.source.clone(), self.vocab_size);
        let load = move || {
            wait_for_holds();
            token_bytes.get_or_init(|| TokenBytes::of(&inner, vocab_size).map(Arc::new));
            fast.get_or_init(|| load_fastokens(&file));
            if let Some(hook) = TABLES_BUILT.get() {
                hook();
            }
            count_pending(-1);
        };
        count_pending(1);
        if let Err(e) = std::thread::Builder::new().name("tokenizer-tables".into()).spawn(load) {
            count_pending(-1);
            tracing::debug!("tokenizer tables are built on first use: {e}");
        }
    }

    /// The token bytes table (built here if the background thread has not yet).
    fn token_bytes(&self) -> Option<&Arc<TokenBytes>> {
        self.token_bytes.get_or_init(|| TokenBytes::of(&self.inner, self.vocab_size).map(Arc::new)).as_ref()
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        if let Some(Some(fast)) = self.fast.get() {
            return fast.encode_with_special_tokens(text, add_special_tokens).map_err(|e| anyhow!("{e}"));
        }
        let encoding = self.inner.encode_fast(text, add_special_tokens).map_err(|e| anyhow!("{e}"))?;
        Ok(encoding.get_ids().to_vec())
    }

    fn encode_pair(&self, first: &str, second: &str) -> Result<(Vec<u32>, usize)> {
        let encoding = self.inner.encode((first, second), true).map_err(|e| anyhow!("{e}"))?;
        let start = encoding.get_type_ids().iter().position(|&t| t == 1).unwrap_or(encoding.len());
        Ok((encoding.get_ids().to_vec(), start))
    }

    fn decoder(&self, prompt: &[u32], options: DecodeOptions) -> Box<dyn TextDecoder> {
        match self.token_bytes() {
            Some(table) => Box::new(TokenBytesDecoder::new(table.clone(), &self.added_tokens, prompt, options)),
            None => Box::new(IncrementalDecoder::new(self.inner.clone(), &self.added_tokens, prompt, options)),
        }
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| anyhow!("{e}"))
    }

    /// An id outside the vocabulary has no token: an empty string.
    fn token_strings(&self, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&id| self.inner.id_to_token(id).unwrap_or_default()).collect()
    }

    fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        match &self.chat_template {
            Some(template) => template.render(messages, add_generation_prompt),
            None => Err(ChatTemplateError::Missing(self.source.clone())),
        }
    }

    fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        match &self.chat_template {
            Some(template) => template.render_with_tools(messages, add_generation_prompt, tools, kwargs),
            None => self.apply_chat_template(messages, add_generation_prompt),
        }
    }

    fn chat_template_source(&self) -> Option<&str> {
        self.template_parts.0.as_deref()
    }

    fn template_tokens(&self) -> (String, String) {
        (self.template_parts.1.clone(), self.template_parts.2.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> HfTokenizer {
        HfTokenizer::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizers/byte-bpe"))
            .unwrap()
    }

    #[test]
    fn loads_ids_stop_tokens_and_template() {
        let t = fixture();
        assert_eq!(t.vocab_size(), 260);
        assert_eq!(t.eos_token_id(), Some(258));
        // "he" merges; " w" merges into "Ġw"; BOS only for raw prompts.
        assert_eq!(t.encode("hello world", true).unwrap(), [259, 256, 108, 108, 111, 257, 111, 114, 108, 100]);
        assert_eq!(t.encode("hi", false).unwrap(), [104, 105]);
        let messages = vec![ChatMessage { role: "user".into(), content: " yo ".into(), extra: None }];
        assert_eq!(t.apply_chat_template(&messages, true).unwrap(), "<|bos|>[user] yo<|eot|>\n[assistant] ");
    }

    /// Texts that exercise pre-tokenization: words, spaces, digits, punctuation,
    /// several scripts, emoji, added tokens inside text, and long runs.
    const ENCODE_SAMPLES: &[&str] = &[
        "hello world",
        "The quick brown fox jumps over the lazy dog. ",
        "  leading and trailing spaces  ",
        "numbers 12345 and 3.14159, 1e-9!",
        "tabs\tand\nnewlines\r\n\n  indented",
        "wörld café naïve €100 😀👍🏽 日本語のテキスト",
        "<|bos|>hi<|eot|> between <|eot|>tokens",
        "it's we're they'll I'd don't",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ];

    #[test]
    fn prompts_are_encoded_as_the_tokenizers_crate_does_with_or_without_fastokens() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizers");
        // fastokens refuses the Metaspace fixture: there `tokenizers` encodes.
        for (name, fast) in [("byte-bpe", true), ("metaspace", false)] {
            let t = HfTokenizer::load(&fixtures.join(name)).unwrap();
            // Waits for the background thread (or loads it here if it has not started).
            assert_eq!(t.fast.get_or_init(|| load_fastokens(&t.source)).is_some(), fast, "{name}: loaded by fastokens");
            for text in ENCODE_SAMPLES {
                for special in [false, true] {
                    let reference = t.inner.encode_fast(*text, special).unwrap().get_ids().to_vec();
                    assert_eq!(t.encode(text, special).unwrap(), reference, "{name} {text:?} special={special}");
                }
            }
        }
    }

    fn metaspace() -> HfTokenizer {
        HfTokenizer::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizers/metaspace"))
            .unwrap()
    }

    /// Decodes `outputs` after `prompt` one id per push, as the engine sends them.
    fn stream(t: &HfTokenizer, prompt: &[u32], outputs: &[u32], options: DecodeOptions) -> Vec<String> {
        let mut decoder = t.decoder(prompt, options);
        let mut pieces: Vec<String> = outputs.iter().map(|&id| decoder.push(&[id])).collect();
        pieces.push(decoder.flush());
        pieces
    }

    const PARIS: u32 = 264;
    const EMOJI_BYTES: [u32; 4] = [245, 164, 157, 133];

    #[test]
    fn streaming_decode_never_splits_characters_and_matches_the_full_decode() {
        let t = fixture();
        let text = "hello wörld 😀 €!";
        let ids = t.encode(text, false).unwrap();
        let pieces = stream(&t, &[], &ids, DecodeOptions::default());
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| !p.contains('\u{fffd}')), "{pieces:?}");
    }

    #[test]
    fn the_first_token_is_decoded_in_the_prompt_context() {
        let t = metaspace();
        let prompt = t.encode("The capital is", true).unwrap();
        assert_eq!(prompt, [1, 261, 262, 263]);
        assert_eq!(stream(&t, &prompt, &[PARIS], DecodeOptions::default()).concat(), " Paris");
        // Without context, SentencePiece drops the first word's space.
        assert_eq!(stream(&t, &[], &[PARIS], DecodeOptions::default()).concat(), "Paris");
    }

    #[test]
    fn a_long_prompt_streams_what_decoding_it_whole_adds() {
        for t in [fixture(), metaspace()] {
            let prompt = t.encode("The capital is a city whose name everyone knows: wörld 😀 café", true).unwrap();
            let outputs = t.encode(" Paris, naïve 😀 €!", false).unwrap();
            assert!(prompt.len() > 2 * super::super::incremental::PROMPT_CONTEXT, "{prompt:?}");
            let whole = |ids: &[u32]| t.decode(ids).unwrap();
            let expected = whole(&[prompt.clone(), outputs.clone()].concat())[whole(&prompt).len()..].to_string();
            let pieces = stream(&t, &prompt, &outputs, DecodeOptions::default());
            assert_eq!(pieces.concat(), expected);
            assert!(pieces.iter().all(|p| !p.contains('\u{fffd}')), "{pieces:?}");
        }
    }

    #[test]
    fn byte_fallback_characters_come_out_whole_once_complete() {
        let t = metaspace();
        let prompt = t.encode("The capital is", true).unwrap();
        let mut outputs = vec![PARIS];
        outputs.extend(EMOJI_BYTES);
        let pieces = stream(&t, &prompt, &outputs, DecodeOptions::default());
        assert_eq!(pieces, [" Paris", "", "", "", "😀", ""]);
    }

    #[test]
    fn a_prompt_ending_inside_a_character_gives_the_character_once() {
        let t = metaspace();
        let mut prompt = t.encode("The capital is", true).unwrap();
        prompt.extend(&EMOJI_BYTES[..2]);
        let pieces = stream(&t, &prompt, &[EMOJI_BYTES[2], EMOJI_BYTES[3], PARIS], DecodeOptions::default());
        assert_eq!(pieces.concat(), "😀 Paris");
    }

    #[test]
    fn special_tokens_are_skipped_or_kept() {
        let t = fixture();
        let keep = DecodeOptions { skip_special_tokens: false, ..DecodeOptions::default() };
        assert_eq!(stream(&t, &[259], &[104, 105, 258], DecodeOptions::default()).concat(), "hi");
        assert_eq!(stream(&t, &[259], &[104, 105, 258], keep).concat(), "hi<|eot|>");
        let joined = DecodeOptions { skip_special_tokens: false, spaces_between_special_tokens: false };
        assert_eq!(stream(&t, &[], &[104, 258, 259, 258], joined).concat(), "h<|eot|><|bos|><|eot|>");
    }

    #[test]
    fn an_incomplete_character_at_the_end_is_dropped_as_vllm_does() {
        let t = fixture();
        let pieces = stream(&t, &[], &[104, 105, 0xe2, 0x82], DecodeOptions::default());
        assert_eq!(pieces.concat(), "hi");
    }

    /// A folder removed when dropped.
    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The byte-bpe fixture's `tokenizer.json`, its `tokenizer_config.json`
    /// (whose template is `[role] content<|eot|>`) when `config` is set, and
    /// `extra` files, in a fresh folder.
    fn model_with(tag: &str, config: bool, extra: &[(&str, &str)]) -> (Dir, HfTokenizer) {
        let dir = Dir(std::env::temp_dir().join(format!("vllm-rs-hf-{tag}-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizers/byte-bpe");
        let names: &[&str] = if config { &["tokenizer.json", "tokenizer_config.json"] } else { &["tokenizer.json"] };
        for name in names {
            std::fs::copy(src.join(name), dir.0.join(name)).unwrap();
        }
        for (name, text) in extra {
            std::fs::write(dir.0.join(name), text).unwrap();
        }
        let t = HfTokenizer::load(&dir.0).unwrap();
        (dir, t)
    }

    const JINJA: &str = "{{ bos_token }}{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}";
    const JSON: &str = r#"{"chat_template": "json:{{ messages[0].content }}"}"#;

    #[test]
    fn chat_template_jinja_wins_then_the_config_then_chat_template_json() {
        let messages = vec![ChatMessage { role: "user".into(), content: "yo".into(), extra: None }];
        let render = |t: &HfTokenizer| t.apply_chat_template(&messages, true).unwrap();
        let (_d, t) = model_with("jinja", true, &[("chat_template.jinja", JINJA), ("chat_template.json", JSON)]);
        assert_eq!(render(&t), "<|bos|>user=yo;");
        assert_eq!(t.chat_template_source(), Some(JINJA));
        let (_d, t) = model_with("config", true, &[("chat_template.json", JSON)]);
        assert_eq!(render(&t), "<|bos|>[user] yo<|eot|>\n[assistant] ");
        let (_d, t) = model_with("json", false, &[("chat_template.json", JSON)]);
        assert_eq!(render(&t), "json:yo");
        let (_d, t) = model_with("none", false, &[]);
        assert!(matches!(t.apply_chat_template(&messages, true), Err(ChatTemplateError::Missing(_))));
    }

    /// Tables built since the hook below was registered, and a signal for each.
    static BUILT: (std::sync::Mutex<usize>, std::sync::Condvar) = (std::sync::Mutex::new(0), std::sync::Condvar::new());

    fn count_built() {
        *BUILT.0.lock().unwrap() += 1;
        BUILT.1.notify_all();
    }

    #[test]
    fn the_registered_hook_runs_once_the_tables_are_built() {
        on_tables_built(count_built);
        let _t = fixture();
        let built = BUILT.0.lock().unwrap();
        let (built, timeout) =
            BUILT.1.wait_timeout_while(built, std::time::Duration::from_secs(60), |n| *n == 0).unwrap();
        assert!(!timeout.timed_out() && *built > 0, "the hook did not run");
    }

    #[test]
    fn held_table_builds_start_when_the_hold_ends_and_prompts_are_encoded_meanwhile() {
        let hold = hold_table_builds();
        let t = fixture();
        // The tables thread is waiting for the hold: nothing is built, and
        // `tokenizers` encodes with the same ids.
        assert!(t.fast.get().is_none() && t.token_bytes.get().is_none());
        assert_eq!(t.encode("hello world", true).unwrap(), [259, 256, 108, 108, 111, 257, 111, 114, 108, 100]);
        assert!(hold.end(), "the fixture's build is pending");
        vllm_rs_test_support::wait_until("the tables to be built", std::time::Duration::from_secs(60), || {
            t.fast.get().is_some() && t.token_bytes.get().is_some()
        });
        assert!(matches!(t.fast.get(), Some(Some(_))), "fastokens supports the byte-level fixture");
        assert_eq!(t.encode("hello world", true).unwrap(), [259, 256, 108, 108, 111, 257, 111, 114, 108, 100]);
    }

    #[test]
    fn missing_tokenizer_is_an_error_naming_the_file() {
        let err = HfTokenizer::load(Path::new("/nonexistent/model")).err().unwrap().to_string();
        assert!(err.contains("/nonexistent/model"), "{err}");
    }
}
