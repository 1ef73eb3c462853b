//! Where a model's files are, found as vLLM finds them: a local directory as
//! given, else a snapshot in the Hugging Face hub cache (`HF_HUB_CACHE`, else
//! `HF_HOME/hub`, else `~/.cache/huggingface/hub`; then `download_dir`) for the
//! requested revision. The frontend never downloads: a model that is in
//! neither place is an error naming it and every place looked in.

use crate::config::EnvLookup;
use std::path::{Path, PathBuf};

/// The revision used when none is given.
pub const DEFAULT_REVISION: &str = "main";

/// Why a model's files could not be found.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    /// Not a directory, and no cached snapshot of that revision.
    #[error(
        "{name:?} is not a directory and revision {revision:?} of it is not in the Hugging Face cache \
         (looked in {}); this frontend does not download models: download it first (for example with \
         vLLM, which fetches the model before it starts the frontend), or pass a directory",
        .looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NotFound {
        /// The model name or path as given.
        name: String,
        /// The revision looked for.
        revision: String,
        /// The cache folders of the model that were looked in.
        looked: Vec<PathBuf>,
    },
}

/// The hub cache folders to search, in order.
#[derive(Clone, Debug, Default)]
pub struct HubCache {
    roots: Vec<PathBuf>,
}

impl HubCache {
    /// The cache as the Hugging Face libraries find it from the environment
    /// (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
    /// else `~/.cache/huggingface/hub`), then `download_dir` when given.
    pub fn from_env(env: EnvLookup, download_dir: Option<&str>) -> Self {
        let var = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let default_root = var("HF_HUB_CACHE").or_else(|| var("HF_HOME").map(|home| home.join("hub"))).or_else(|| {
            var("XDG_CACHE_HOME")
                .or_else(|| var("HOME").map(|home| home.join(".cache")))
                .map(|cache| cache.join("huggingface").join("hub"))
        });
        let roots = default_root.into_iter().chain(download_dir.map(PathBuf::from)).collect();
        HubCache { roots }
    }

    /// The directory holding `name`'s files: `name` itself when it is a
    /// directory, else the cached snapshot of `revision` (default `main`): a
    /// branch or tag under `refs/`, or a commit hash under `snapshots/`.
    pub fn locate(&self, name: &str, revision: Option<&str>) -> Result<PathBuf, LocateError> {
        let revision = revision.unwrap_or(DEFAULT_REVISION);
        if Path::new(name).is_dir() {
            return Ok(PathBuf::from(name));
        }
        let folder = format!("models--{}", name.replace('/', "--"));
        let mut looked = Vec::new();
        // A repo id never has empty parts, `..` or absolute paths: anything
        // else cannot name a cache folder and must not walk out of one.
        let plausible = !name.is_empty()
            && !name.starts_with('/')
            && name.split('/').count() <= 2
            && name.split('/').all(|part| !part.is_empty() && part != "." && part != "..");
        if plausible && !revision.contains('/') && revision != ".." && revision != "." {
            for root in &self.roots {
                let repo = root.join(&folder);
                if let Some(snapshot) = snapshot(&repo, revision) {
                    return Ok(snapshot);
                }
                looked.push(repo);
            }
        }
        Err(LocateError::NotFound { name: name.to_owned(), revision: revision.to_owned(), looked })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::fs;

    fn cache(root: &Path) -> HubCache {
        let root = root.to_path_buf();
        HubCache::from_env(&move |name| (name == "HF_HUB_CACHE").then(|| OsString::from(&root)), None)
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
            assert!(err.contains(name) && err.contains("Hugging Face cache"), "{err}");
        }
        let err = hub.locate("Org/Other", None).unwrap_err().to_string();
        assert!(err.contains(&root.join("models--Org--Other").display().to_string()), "{err}");
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
}
