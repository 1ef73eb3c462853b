//! Where a model's files are, found as vLLM finds them: a local directory as
//! given; else a snapshot in the Hugging Face hub cache (`HF_HUB_CACHE`, else
//! `HF_HOME/hub`, else `~/.cache/huggingface/hub`; then `download_dir`) for
//! the requested revision; else, unless `HF_HUB_OFFLINE` is set, the files
//! of `HUB_FILES` are downloaded from the hub (`HF_ENDPOINT`, default
//! `https://huggingface.co`) into the cache, and on request the safetensors
//! weights too (`weights.rs`). A model found in none of these is an error
//! naming it and every place looked in. The built-in models (`toy`, `echo`)
//! have no files: they are never looked for or downloaded. The frontend and
//! `serve` (through `vllm_rs._core`) both find models here.

pub mod class_labels;
pub mod generation_config;
pub mod weights;

use hf_hub::api::sync::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vllm_rs_config::{EnvLookup, ServerConfig};

pub use weights::WeightsError;

/// Model names served with the byte-level tokenizer: they have no files.
pub const BUILTIN_MODELS: &[&str] = &["toy", "echo"];

/// The revision used when none is given.
pub const DEFAULT_REVISION: &str = "main";
/// The hub vLLM downloads from when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The files the frontends and the reference engine read from a model,
/// downloaded when the hub has them (weights only on request: `locate_with_weights`).
pub const HUB_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// Why a model's files could not be found: where it was looked for, and
/// why it was not downloaded or the download failed.
#[derive(Debug)]
pub struct LocateError {
    /// The model name or path as given.
    pub name: String,
    /// The revision looked for.
    pub revision: String,
    /// The cache folders of the model that were looked in.
    pub looked: Vec<PathBuf>,
    /// Why the cache could not be filled from the hub.
    pub why: Unavailable,
}

impl LocateError {
    /// The message, with the name and revision quoted by `quote` (Rust's
    /// `{:?}` in the frontend's log, Python's `repr` in `serve`'s errors).
    pub fn describe(&self, quote: &dyn Fn(&str) -> String) -> String {
        format!(
            "{} is not a directory and revision {} of it is not in the Hugging Face cache (looked in {}){}",
            quote(&self.name),
            quote(&self.revision),
            list(&self.looked),
            self.why
        )
    }
}

impl fmt::Display for LocateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(&|s| format!("{s:?}")))
    }
}

impl std::error::Error for LocateError {}

/// Why a model missing from the cache was not downloaded.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// No download was tried (offline, or not a name the hub could have).
    #[error("; {0}, so nothing was downloaded")]
    NotDownloaded(&'static str),
    /// The hub has none of the files at that revision (no such repo or
    /// revision, or a private or gated one without a token).
    #[error(", and {endpoint} has no such model at that revision{}", if *.refused { " (it refused access: a private or gated model needs HF_TOKEN)" } else { "" })]
    NotOnHub {
        /// The hub asked.
        endpoint: String,
        /// Whether the hub refused access (401/403).
        refused: bool,
    },
    /// The download failed (network, disk, a malformed answer).
    #[error(", and downloading {file} from {endpoint} failed: {reason}")]
    Download {
        /// The hub asked.
        endpoint: String,
        /// The file whose download failed.
        file: &'static str,
        /// What went wrong.
        reason: String,
    },
}

fn list(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "nothing: not a model name".to_owned();
    }
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// How files missing from the cache are fetched.
#[derive(Clone, Debug)]
enum Download {
    /// `HF_HUB_OFFLINE` is set: only the cache is used.
    Offline,
    /// From `hub` into the cache folder `into`.
    From {
        /// The hub asked.
        hub: Hub,
        /// The hub cache the files go to: `download_dir` when given, else the default one.
        into: PathBuf,
    },
}

/// A hub to download from.
#[derive(Clone, Debug)]
struct Hub {
    /// The hub's base URL (`HF_ENDPOINT`).
    endpoint: String,
    /// `HF_TOKEN`, for private and gated models (never logged).
    token: Option<String>,
}

impl Hub {
    /// `name` at `revision` on this hub, its files downloaded into the cache `into`.
    fn repo(&self, name: &str, revision: &str, into: &Path) -> Result<ApiRepo, ApiError> {
        let api: Api = ApiBuilder::from_cache(Cache::new(into.to_path_buf()))
            .with_endpoint(self.endpoint.clone())
            .with_token(self.token.clone())
            .with_progress(false)
            .build()?;
        Ok(api.repo(Repo::with_revision(name.to_owned(), RepoType::Model, revision.to_owned())))
    }
}

/// Where a download is announced before it starts: the frontend logs it
/// (`tracing`), `serve` hands it to Python's logging.
#[derive(Clone)]
pub struct Announce(Arc<dyn Fn(&str) + Send + Sync>);

impl Announce {
    /// Announces with `f`.
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Announce(Arc::new(f))
    }
}

impl Default for Announce {
    /// Logs at info level.
    fn default() -> Self {
        Announce::new(|message| tracing::info!("{message}"))
    }
}

impl fmt::Debug for Announce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Announce")
    }
}

/// The hub cache folders to search, in order, and how to download what they lack.
#[derive(Clone, Debug)]
pub struct HubCache {
    roots: Vec<PathBuf>,
    download: Download,
    announce: Announce,
}

impl Default for HubCache {
    /// A cache with no folders that never downloads.
    fn default() -> Self {
        HubCache { roots: Vec::new(), download: Download::Offline, announce: Announce::default() }
    }
}

/// `HF_HUB_OFFLINE` as `huggingface_hub` reads it: 1, ON, YES or TRUE (any case).
fn truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE")
}

/// A model's folder as found: the folder, and the hub cache holding it
/// (None for a directory given as the model).
struct Found {
    dir: PathBuf,
    cache: Option<PathBuf>,
}

impl HubCache {
    /// The cache as the Hugging Face libraries find it from the environment
    /// (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
    /// else `~/.cache/huggingface/hub`), then `download_dir` when given.
    /// Downloads go to `download_dir` when given (as vLLM's do), else to
    /// the default folder; `HF_HUB_OFFLINE` turns them off.
    pub fn from_env(env: EnvLookup, download_dir: Option<&str>) -> Self {
        let text = |name: &str| env(name).and_then(|v| v.into_string().ok()).filter(|v| !v.is_empty());
        let var = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let default_root = var("HF_HUB_CACHE").or_else(|| var("HF_HOME").map(|home| home.join("hub"))).or_else(|| {
            var("XDG_CACHE_HOME")
                .or_else(|| var("HOME").map(|home| home.join(".cache")))
                .map(|cache| cache.join("huggingface").join("hub"))
        });
        let into = download_dir.map(PathBuf::from).or_else(|| default_root.clone());
        let download = match into {
            _ if text("HF_HUB_OFFLINE").is_some_and(|v| truthy(&v)) => Download::Offline,
            None => Download::Offline,
            Some(into) => Download::From {
                hub: Hub {
                    endpoint: text("HF_ENDPOINT")
                        .map_or_else(|| DEFAULT_ENDPOINT.to_owned(), |e| e.trim_end_matches('/').to_owned()),
                    token: text("HF_TOKEN"),
                },
                into,
            },
        };
        let roots = default_root.into_iter().chain(download_dir.map(PathBuf::from)).collect();
        HubCache { roots, download, announce: Announce::default() }
    }

    /// This cache, its downloads announced by `announce` instead of the log.
    pub fn announcing(self, announce: Announce) -> Self {
        HubCache { announce, ..self }
    }

    /// The hub cache folders searched, in order.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// The directory holding `name`'s files: `name` itself when it is a
    /// directory, else the cached snapshot of `revision` (default `main`,
    /// also when empty): a branch or tag under `refs/`, or a commit hash
    /// under `snapshots/`; else the snapshot the files in `HUB_FILES` are
    /// downloaded into. A built-in model name (`toy`, `echo`) that is not a
    /// directory is an error at once: neither the cache nor the hub is asked for it.
    pub fn locate(&self, name: &str, revision: Option<&str>) -> Result<PathBuf, Box<LocateError>> {
        self.find(name, revision).map(|found| found.dir)
    }

    /// `locate`, and a hub model's safetensors weights fetched too when its
    /// snapshot lacks them (never with `HF_HUB_OFFLINE`: then that is an
    /// error); a directory given as the model is taken as it is.
    pub fn locate_with_weights(&self, name: &str, revision: Option<&str>) -> Result<PathBuf, ModelFilesError> {
        let Found { dir, cache } = self.find(name, revision).map_err(ModelFilesError::NotFound)?;
        let Some(cache) = cache else { return Ok(dir) };
        let Some(missing) = weights::missing(&dir) else { return Ok(dir) };
        let hub = match &self.download {
            Download::Offline => {
                return Err(WeightsError::Offline { name: name.to_owned(), snapshot: dir, missing }.into())
            }
            Download::From { hub, .. } => hub,
        };
        self.announce(&format!(
            "downloading the weights of {name} (revision {}) from {} into {}",
            revision_or_default(revision),
            hub.endpoint,
            cache.display()
        ));
        weights::download(name, revision_or_default(revision), hub, &cache, missing)?;
        Ok(dir)
    }

    fn announce(&self, message: &str) {
        (self.announce.0)(message);
    }

    fn find(&self, name: &str, revision: Option<&str>) -> Result<Found, Box<LocateError>> {
        let revision = revision_or_default(revision);
        if Path::new(name).is_dir() {
            return Ok(Found { dir: PathBuf::from(name), cache: None });
        }
        let folder = format!("models--{}", name.replace('/', "--"));
        let mut looked = Vec::new();
        // A repo id never has empty parts, `..` or absolute paths: anything
        // else cannot name a cache folder and must not walk out of one.
        // A built-in model has no files anywhere: never look for it, and
        // never ask the hub (an offline machine would wait on it).
        let builtin = BUILTIN_MODELS.contains(&name);
        let plausible = !builtin
            && !name.is_empty()
            && !name.starts_with('/')
            && name.split('/').count() <= 2
            && name.split('/').all(|part| !part.is_empty() && part != "." && part != "..");
        let plausible = plausible && !revision.contains('/') && revision != ".." && revision != ".";
        if plausible {
            for root in &self.roots {
                let repo = root.join(&folder);
                if let Some(dir) = snapshot(&repo, revision) {
                    return Ok(Found { dir, cache: Some(root.clone()) });
                }
                looked.push(repo);
            }
        }
        let why = match &self.download {
            _ if builtin => Unavailable::NotDownloaded("the name of a built-in model, which has no Hugging Face files"),
            _ if !plausible => Unavailable::NotDownloaded("not a Hugging Face model id"),
            Download::Offline => Unavailable::NotDownloaded("HF_HUB_OFFLINE is set (or there is no cache folder)"),
            Download::From { hub, into } => {
                self.announce(&format!(
                    "downloading the tokenizer and config files of {name} (revision {revision}) from {} into {}",
                    hub.endpoint,
                    into.display()
                ));
                match download(name, revision, hub, into) {
                    Ok(dir) => return Ok(Found { dir, cache: Some(into.clone()) }),
                    Err(why) => why,
                }
            }
        };
        Err(Box::new(LocateError { name: name.to_owned(), revision: revision.to_owned(), looked, why }))
    }
}

/// The folder of the server's model (`model` of `--args-json`, else
/// `model_tag`), located as the tokenizer is, at `revision`. None for a
/// built-in model, which has no files, and for one that cannot be found,
/// logged as a warning that its `what` is not read.
pub fn served_model_dir(config: &ServerConfig, hub: &HubCache, what: &str) -> Option<PathBuf> {
    let files = &config.model_files;
    let model = files.model.as_deref().unwrap_or(&config.model_tag);
    match hub.locate(model, files.revision.as_deref()) {
        Ok(dir) => Some(dir),
        Err(_) if BUILTIN_MODELS.contains(&model) => None,
        Err(e) => {
            tracing::warn!("no {what} of the model: {e}");
            None
        }
    }
}

/// `revision`, else `main` (an empty one too).
fn revision_or_default(revision: Option<&str>) -> &str {
    revision.filter(|r| !r.is_empty()).unwrap_or(DEFAULT_REVISION)
}

/// Why a model's files, weights included, could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ModelFilesError {
    /// Its folder is nowhere.
    #[error(transparent)]
    NotFound(Box<LocateError>),
    /// Its folder is there, its weights are not and could not be downloaded.
    #[error(transparent)]
    Weights(Box<WeightsError>),
}

impl From<WeightsError> for ModelFilesError {
    fn from(e: WeightsError) -> Self {
        ModelFilesError::Weights(Box::new(e))
    }
}

impl ModelFilesError {
    /// The message, with names quoted by `quote` (as `LocateError::describe`).
    pub fn describe(&self, quote: &dyn Fn(&str) -> String) -> String {
        match self {
            ModelFilesError::NotFound(e) => e.describe(quote),
            ModelFilesError::Weights(e) => e.describe(quote),
        }
    }
}

/// `repo/snapshots/<commit>` for `revision`: the commit `refs/<revision>`
/// names, or `revision` itself when it is a cached commit.
fn snapshot(repo: &Path, revision: &str) -> Option<PathBuf> {
    let commit = match std::fs::read_to_string(repo.join("refs").join(revision)) {
        Ok(text) => text.trim().to_owned(),
        Err(_) => revision.to_owned(),
    };
    if commit.is_empty() || commit.contains('/') || commit == ".." || commit == "." {
        return None;
    }
    let dir = repo.join("snapshots").join(commit);
    dir.is_dir().then_some(dir)
}

/// Downloads the files of `HUB_FILES` that `hub` has for `name` at
/// `revision` into the cache `into`, and returns their snapshot folder.
fn download(name: &str, revision: &str, hub: &Hub, into: &Path) -> Result<PathBuf, Unavailable> {
    let failed = |file: &'static str, e: &ApiError| Unavailable::Download {
        endpoint: hub.endpoint.clone(),
        file,
        reason: e.to_string(),
    };
    let repo = hub.repo(name, revision, into).map_err(|e| failed("", &e))?;
    let (mut snapshot, mut refused) = (None, false);
    for file in HUB_FILES {
        match repo.download(file) {
            Ok(path) => snapshot = path.parent().map(Path::to_path_buf),
            Err(e) => match status(&e) {
                Some(404) => {}
                Some(401 | 403) => refused = true,
                _ => return Err(failed(file, &e)),
            },
        }
    }
    snapshot.ok_or_else(|| Unavailable::NotOnHub { endpoint: hub.endpoint.clone(), refused })
}

/// The HTTP status of a hub answer that was an error status.
fn status(e: &ApiError) -> Option<u16> {
    match e {
        ApiError::RequestError(e) => match e.as_ref() {
            ureq::Error::StatusCode(code) => Some(*code),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::fs;

    fn cache(root: &Path) -> HubCache {
        let root = root.to_path_buf();
        // Offline: these tests look at the cache only.
        HubCache::from_env(
            &move |name| match name {
                "HF_HUB_CACHE" => Some(OsString::from(&root)),
                "HF_HUB_OFFLINE" => Some("1".into()),
                _ => None,
            },
            None,
        )
    }

    fn fake_repo(root: &Path, name: &str, refs: &[(&str, &str)], commits: &[&str]) {
        let repo = root.join(format!("models--{}", name.replace('/', "--")));
        fs::create_dir_all(repo.join("refs")).unwrap();
        for (reference, commit) in refs {
            fs::write(repo.join("refs").join(reference), commit).unwrap();
        }
        for commit in commits {
            fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
        }
    }

    #[test]
    fn finds_refs_and_commits_and_prefers_a_directory() {
        let root = std::env::temp_dir().join(format!("vllm-rs-hub-{}", std::process::id()));
        fake_repo(&root, "Org/Name", &[("main", "aaa\n"), ("v2", "bbb")], &["aaa", "bbb", "ccc"]);
        let hub = cache(&root);
        let snapshots = root.join("models--Org--Name/snapshots");
        assert_eq!(hub.locate("Org/Name", None).unwrap(), snapshots.join("aaa"));
        assert_eq!(hub.locate("Org/Name", Some("v2")).unwrap(), snapshots.join("bbb"));
        assert_eq!(hub.locate("Org/Name", Some("ccc")).unwrap(), snapshots.join("ccc"));
        let dir = snapshots.join("ccc");
        assert_eq!(hub.locate(dir.to_str().unwrap(), Some("zzz")).unwrap(), dir);
        for (name, revision) in
            [("Org/Name", Some("v3")), ("Org/Other", None), ("../x", None), ("Org/Name", Some(".."))]
        {
            let err = hub.locate(name, revision).unwrap_err().to_string();
            assert!(
                err.contains(name) && err.contains("Hugging Face cache") && err.contains("nothing was downloaded"),
                "{err}"
            );
        }
        let err = hub.locate("Org/Other", None).unwrap_err().to_string();
        assert!(err.contains(&root.join("models--Org--Other").display().to_string()), "{err}");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn built_in_models_are_never_looked_for_or_downloaded() {
        // A hub that would see any attempt, online, with a cache that has the name.
        let hub = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        hub.set_nonblocking(true).unwrap();
        let endpoint = OsString::from(format!("http://{}", hub.local_addr().unwrap()));
        let root = std::env::temp_dir().join(format!("vllm-rs-hub-builtin-{}", std::process::id()));
        fake_repo(&root, "toy", &[("main", "aaa")], &["aaa"]);
        let env_root = root.clone();
        let hub_cache = HubCache::from_env(
            &move |name| match name {
                "HF_HUB_CACHE" => Some(OsString::from(&env_root)),
                "HF_ENDPOINT" => Some(endpoint.clone()),
                _ => None,
            },
            None,
        );
        for name in BUILTIN_MODELS {
            let err = hub_cache.locate(name, None).unwrap_err();
            assert!(err.looked.is_empty(), "{err}");
            assert!(matches!(err.why, Unavailable::NotDownloaded(_)), "{err}");
            assert!(err.to_string().contains("built-in model"), "{err}");
        }
        assert_eq!(hub.accept().unwrap_err().kind(), std::io::ErrorKind::WouldBlock, "the hub was contacted");
        // A directory of that name is still a directory.
        let dir = root.join("models--toy");
        assert_eq!(hub_cache.locate(dir.to_str().unwrap(), None).unwrap(), dir);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn cache_roots_follow_the_hugging_face_variables() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
        };
        let roots = |h: HubCache| h.roots;
        assert_eq!(
            roots(HubCache::from_env(&env(&[("HF_HUB_CACHE", "/a"), ("HF_HOME", "/b")]), Some("/d"))),
            [PathBuf::from("/a"), PathBuf::from("/d")]
        );
        assert_eq!(
            roots(HubCache::from_env(&env(&[("HF_HOME", "/b"), ("HOME", "/h")]), None)),
            [PathBuf::from("/b/hub")]
        );
        assert_eq!(
            roots(HubCache::from_env(&env(&[("HOME", "/h")]), None)),
            [PathBuf::from("/h/.cache/huggingface/hub")]
        );
        assert_eq!(
            roots(HubCache::from_env(&env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]), None)),
            [PathBuf::from("/x/huggingface/hub")]
        );
    }

    #[test]
    fn downloads_go_to_download_dir_else_the_default_cache_unless_offline() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
        };
        let target = |h: HubCache| match h.download {
            Download::Offline => None,
            Download::From { hub, into } => Some((hub.endpoint, into)),
        };
        assert_eq!(
            target(HubCache::from_env(&env(&[("HF_HOME", "/b"), ("HF_ENDPOINT", "http://hub.test/")]), None)),
            Some(("http://hub.test".to_owned(), PathBuf::from("/b/hub")))
        );
        assert_eq!(
            target(HubCache::from_env(&env(&[("HOME", "/h")]), Some("/d"))),
            Some((DEFAULT_ENDPOINT.to_owned(), PathBuf::from("/d")))
        );
        for offline in ["1", "ON", "yes", "True"] {
            let vars: &'static [(&'static str, &'static str)] =
                Box::leak(Box::new([("HOME", "/h"), ("HF_HUB_OFFLINE", offline)]));
            assert_eq!(target(HubCache::from_env(&env(vars), None)), None, "{offline}");
        }
        assert!(target(HubCache::from_env(&env(&[("HOME", "/h"), ("HF_HUB_OFFLINE", "0")]), None)).is_some());
    }
}
