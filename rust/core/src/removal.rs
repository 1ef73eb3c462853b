//! What a guardian removes once its supervisor is gone: the paths registered
//! with `remove_on_exit`, each only while it is still the very file or
//! directory that was registered (same device, inode and file type), so
//! whatever someone else has created at that path since is left alone. (A
//! freed inode number is often handed out again at once; the file type keeps
//! a symlink or file that got a registered directory's number safe. Callers
//! that remove a path themselves cancel its registration.)
//!
//! The rule, in this order:
//!
//! 1. every registered path that is not a directory is unlinked (a symlink
//!    itself, never its target);
//! 2. then every registered directory, deepest first, is removed when empty.
//!    When it is not empty and every entry left in it is a socket, those
//!    sockets are unlinked and the directory removed. When anything else is
//!    left in it (a regular file, a symlink, a subdirectory, ...), the
//!    directory and all it holds stay exactly as they are. Nothing inside a
//!    directory is ever followed.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A path registered for removal, with the identity it had then.
#[derive(Debug)]
struct Registered {
    path: PathBuf,
    dev: u64,
    ino: u64,
    /// `st_mode & S_IFMT`.
    file_type: u32,
}

impl Registered {
    fn is(&self, meta: &fs::Metadata) -> bool {
        meta.dev() == self.dev && meta.ino() == self.ino && meta.mode() & libc::S_IFMT == self.file_type
    }

    /// The path's metadata if it still names the registered file or directory.
    fn current(&self) -> Option<fs::Metadata> {
        fs::symlink_metadata(&self.path).ok().filter(|m| self.is(m))
    }
}

/// A registered path that was left in place, and why.
#[derive(Debug, thiserror::Error)]
pub enum Kept {
    /// The directory holds something that is not a socket.
    #[error("left the directory {path:?} in place: it holds {entry:?}, which is not a socket")]
    NotOnlySockets {
        /// The registered directory.
        path: PathBuf,
        /// The first entry in it that is not a socket.
        entry: OsString,
    },
    /// Removing it failed.
    #[error("could not remove {path:?}: {source}")]
    Failed {
        /// The registered path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// The paths one guardian removes when its supervisor is gone.
#[derive(Debug, Default)]
pub struct RemovalList {
    entries: Vec<Registered>,
}

impl RemovalList {
    /// Registers `path` (absolute), which had device `dev`, inode `ino` and
    /// file type `file_type` (`st_mode & S_IFMT`); a later registration of
    /// the same path replaces the earlier one.
    pub fn register(&mut self, path: PathBuf, dev: u64, ino: u64, file_type: u32) {
        self.cancel(&path);
        self.entries.push(Registered { path, dev, ino, file_type });
    }

    /// Forgets every registration of `path`.
    pub fn cancel(&mut self, path: &Path) {
        self.entries.retain(|e| e.path != path);
    }

    /// Removes what is registered by the rule in the module docs; returns
    /// what was left in place. Paths that are gone or name something else
    /// now are skipped silently.
    pub fn remove_all(&self) -> Vec<Kept> {
        let mut kept = Vec::new();
        let mut dirs = Vec::new();
        for entry in &self.entries {
            match entry.current() {
                Some(meta) if meta.is_dir() => dirs.push(entry),
                Some(_) => match fs::remove_file(&entry.path) {
                    Err(source) if source.kind() != io::ErrorKind::NotFound => {
                        kept.push(Kept::Failed { path: entry.path.clone(), source })
                    }
                    _ => {}
                },
                None => {}
            }
        }
        // Deepest first, so a registered directory inside another goes first.
        dirs.sort_by_key(|e| std::cmp::Reverse(e.path.components().count()));
        kept.extend(dirs.into_iter().filter_map(|dir| remove_dir(dir).err()));
        kept
    }
}

/// Removes a registered directory: empty, or holding only sockets.
fn remove_dir(dir: &Registered) -> Result<(), Kept> {
    let failed = |source: io::Error| Kept::Failed { path: dir.path.clone(), source };
    match fs::remove_dir(&dir.path) {
        Ok(()) => return Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) if err.raw_os_error() != Some(libc::ENOTEMPTY) => return Err(failed(err)),
        Err(_) => {}
    }
    // Work through an fd of the directory itself (never following a link
    // put in its place), and only if it is still the registered one.
    let handle = File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(&dir.path)
        .map_err(failed)?;
    if !dir.is(&handle.metadata().map_err(failed)?) {
        return Ok(());
    }
    // /proc/self/fd/N resolves to the opened directory; names below it are
    // looked up without following their final component.
    let inside = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
    let mut names = Vec::new();
    for entry in fs::read_dir(&inside).map_err(failed)? {
        let entry = entry.map_err(failed)?;
        if !entry.file_type().map_err(failed)?.is_socket() {
            return Err(Kept::NotOnlySockets { path: dir.path.clone(), entry: entry.file_name() });
        }
        names.push(entry.file_name());
    }
    for name in names {
        let path = inside.join(&name);
        // Checked again right before the unlink: only a socket goes.
        if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
            match fs::remove_file(&path) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(failed(err)),
                _ => {}
            }
        }
    }
    if dir.current().is_some() {
        fs::remove_dir(&dir.path).map_err(failed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;

    /// A fresh private directory for one test, removed with everything in
    /// it when dropped, also when the test fails.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    fn scratch(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("vllm-rs-removal-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        Scratch(dir)
    }

    fn register(list: &mut RemovalList, path: &Path) {
        let meta = fs::symlink_metadata(path).unwrap();
        list.register(path.to_path_buf(), meta.dev(), meta.ino(), meta.mode() & libc::S_IFMT);
    }

    #[test]
    fn a_file_goes_only_while_it_is_the_registered_one() {
        let root = scratch("files");
        let (same, replaced) = (root.join("same.sock"), root.join("replaced.sock"));
        let _a = UnixListener::bind(&same).unwrap();
        let _b = UnixListener::bind(&replaced).unwrap();
        let mut list = RemovalList::default();
        register(&mut list, &same);
        register(&mut list, &replaced);
        fs::remove_file(&replaced).unwrap();
        fs::write(&replaced, "someone else's").unwrap();
        assert!(list.remove_all().is_empty());
        assert!(!same.exists());
        assert_eq!(fs::read_to_string(&replaced).unwrap(), "someone else's");
    }

    #[test]
    fn a_directory_goes_with_the_sockets_left_in_it() {
        let root = scratch("sockets");
        let dir = root.join("engine");
        fs::create_dir(&dir).unwrap();
        let _registered = UnixListener::bind(dir.join("input.sock")).unwrap();
        let _unregistered = UnixListener::bind(dir.join("output.sock")).unwrap();
        let mut list = RemovalList::default();
        register(&mut list, &dir);
        register(&mut list, &dir.join("input.sock"));
        assert!(list.remove_all().is_empty());
        assert!(!dir.exists());
        assert!(fs::read_dir(&*root).unwrap().next().is_none());
    }

    #[test]
    fn a_directory_holding_anything_but_sockets_stays_as_it_is() {
        let root = scratch("mixed");
        let outside = root.join("outside.sock");
        let _outside = UnixListener::bind(&outside).unwrap();
        for (name, extra) in [("with-file", "notes.txt"), ("with-link", "link"), ("with-subdir", "sub")] {
            let dir = root.join(name);
            fs::create_dir(&dir).unwrap();
            let _socket = UnixListener::bind(dir.join("engine.sock")).unwrap();
            match extra {
                "notes.txt" => fs::write(dir.join(extra), "the user's").unwrap(),
                "link" => std::os::unix::fs::symlink(&outside, dir.join(extra)).unwrap(),
                _ => fs::create_dir(dir.join(extra)).unwrap(),
            }
            let mut list = RemovalList::default();
            register(&mut list, &dir);
            let kept = list.remove_all();
            assert!(matches!(&kept[..], [Kept::NotOnlySockets { entry, .. }] if entry == extra), "{name}: {kept:?}");
            assert!(dir.join("engine.sock").exists() && fs::symlink_metadata(dir.join(extra)).is_ok(), "{name}");
        }
        assert!(outside.exists());
    }

    #[test]
    fn nested_directories_go_deepest_first_and_cancelled_ones_stay() {
        let root = scratch("nested");
        let (outer, inner, cancelled) = (root.join("outer"), root.join("outer/inner"), root.join("cancelled"));
        fs::create_dir_all(&inner).unwrap();
        fs::create_dir(&cancelled).unwrap();
        let mut list = RemovalList::default();
        register(&mut list, &outer);
        register(&mut list, &inner);
        register(&mut list, &cancelled);
        list.cancel(&cancelled);
        assert!(list.remove_all().is_empty());
        assert!(!outer.exists() && cancelled.is_dir());
    }

    #[test]
    fn a_symlink_put_in_place_of_a_registered_directory_is_not_followed() {
        let root = scratch("swapped");
        let (dir, target) = (root.join("dir"), root.join("target"));
        fs::create_dir(&dir).unwrap();
        fs::create_dir(&target).unwrap();
        let _socket = UnixListener::bind(target.join("keep.sock")).unwrap();
        let mut list = RemovalList::default();
        register(&mut list, &dir);
        fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&target, &dir).unwrap();
        assert!(list.remove_all().is_empty());
        assert!(target.join("keep.sock").exists() && fs::symlink_metadata(&dir).unwrap().is_symlink());
    }
}
