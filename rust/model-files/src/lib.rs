//! Where a model's files are, found as vLLM finds them: a local directory as
//! given; else a snapshot in the Hugging Face hub cache (`HF_HUB_CACHE`, else
//! `HF_HOME/hub`, else `~/.cache/huggingface/hub`; then `download_dir`) for
//! the requested revision; else, unless `HF_HUB_OFFLINE` is set, the files
//! this frontend reads are downloaded from the hub (`HF_ENDPOINT`, default
//! `https://huggingface.co`) into the cache. A model found in none of these
//! is an error naming it and every place looked in. The built-in models
//! (`toy`, `echo`) have no files: they are never looked for or downloaded.

pub mod generation_config;

use hf_hub::api::sync::{ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use std::path::{Path, PathBuf};
use vllm_rs_config::EnvLookup;

/// Model names served with the byte-level tokenizer: they have no files.
pub const BUILTIN_MODELS: &[&str] = &["toy", "echo"];

/// The revision used when none is given.
pub const DEFAULT_REVISION: &str = "main";
/// The hub vLLM downloads from when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The files this frontend reads from a model, downloaded when present
/// (weights stay with the engines, which fetch their own).
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
#[derive(Debug, thiserror::Error)]
#[error(
    "{name:?} is not a directory and revision {revision:?} of it is not in the Hugging Face cache \
     (looked in {}){why}",
    list(.looked)
)]
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
    /// From `endpoint` into the cache folder `into`.
    From {
        /// The hub's base URL (`HF_ENDPOINT`).
        endpoint: String,
        /// The hub cache the files go to: `download_dir` when given, else the default one.
        into: PathBuf,
        /// `HF_TOKEN`, for private and gated models (never logged).
        token: Option<String>,
    },
}

/// The hub cache folders to search, in order, and how to download what they lack.
#[derive(Clone, Debug)]
pub struct HubCache {
    roots: Vec<PathBuf>,
    download: Download,
}

impl Default for HubCache {
    /// A cache with no folders that never downloads.
    fn default() -> Self {
        HubCache { roots: Vec::new(), download: Download::Offline }
    }
}

/// `HF_HUB_OFFLINE` as `huggingface_hub` reads it: 1, ON, YES or TRUE (any case).
fn truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE")
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
                endpoint: text("HF_ENDPOINT")
                    .map_or_else(|| DEFAULT_ENDPOINT.to_owned(), |e| e.trim_end_matches('/').to_owned()),
                into,
                token: text("HF_TOKEN"),
            },
        };
        let roots = default_root.into_iter().chain(download_dir.map(PathBuf::from)).collect();
        HubCache { roots, download }
    }

    /// The directory holding `name`'s files: `name` itself when it is a
    /// directory, else the cached snapshot of `revision` (default `main`): a
    /// branch or tag under `refs/`, or a commit hash under `snapshots/`;
    /// else the snapshot the files in `HUB_FILES` are downloaded into. A
    /// built-in model name (`toy`, `echo`) that is not a directory is an
    /// error at once: neither the cache nor the hub is asked for it.
    pub fn locate(&self, name: &str, revision: Option<&str>) -> Result<PathBuf, Box<LocateError>> {
        let revision = revision.unwrap_or(DEFAULT_REVISION);
        if Path::new(name).is_dir() {
            return Ok(PathBuf::from(name));
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
                if let Some(snapshot) = snapshot(&repo, revision) {
                    return Ok(snapshot);
                }
                looked.push(repo);
            }
        }
        let why = match &self.download {
            _ if builtin => Unavailable::NotDownloaded("the name of a built-in model, which has no Hugging Face files"),
            _ if !plausible => Unavailable::NotDownloaded("not a Hugging Face model id"),
            Download::Offline => Unavailable::NotDownloaded("HF_HUB_OFFLINE is set (or there is no cache folder)"),
            Download::From { endpoint, into, token } => match download(name, revision, endpoint, into, token.clone()) {
                Ok(snapshot) => return Ok(snapshot),
                Err(why) => why,
            },
        };
        Err(Box::new(LocateError { name: name.to_owned(), revision: revision.to_owned(), looked, why }))
    }
}

/// `repo/snapshots/<commit>` for `revision`: the commit `refs/<revision>`
/// names, or `revision` itself when it is a cached commit.
fn snapshot(repo: &Path, revision: &str) -> Option<PathBuf> {
    let commit = match std::fs::read_to_string(repo.join("refs").join(revision)) {
        Ok(text) => text.trim().to_owned(),
        Err(_) => revision.to_owned(),
    };
    if commit.is_empty() || commit.contains('/') || commit == ".." {
        return None;
    }
    let dir = repo.join("snapshots").join(commit);
    dir.is_dir().then_some(dir)
}

/// Downloads the files of `HUB_FILES` that the hub at `endpoint` has for
/// `name` at `revision` into the cache `into`, and returns their snapshot
/// folder.
fn download(
    name: &str,
    revision: &str,
    endpoint: &str,
    into: &Path,
    token: Option<String>,
) -> Result<PathBuf, Unavailable> {
    tracing::info!(
        "downloading the tokenizer and config files of {name} (revision {revision}) from {endpoint} into {}",
        into.display()
    );
    let failed = |file: &'static str, e: &ApiError| Unavailable::Download {
        endpoint: endpoint.to_owned(),
        file,
        reason: e.to_string(),
    };
    let api = ApiBuilder::from_cache(Cache::new(into.to_path_buf()))
        .with_endpoint(endpoint.to_owned())
        .with_token(token)
        .with_progress(false)
        .build()
        .map_err(|e| failed("", &e))?;
    let repo = api.repo(Repo::with_revision(name.to_owned(), RepoType::Model, revision.to_owned()));
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
    snapshot.ok_or_else(|| Unavailable::NotOnHub { endpoint: endpoint.to_owned(), refused })
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
            Download::From { endpoint, into, .. } => Some((endpoint, into)),
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
