//! `vllm-rs serve MODEL [OPTIONS]`: the whole serving stack, as vLLM 0.33's
//! own `vllm-rs serve` starts it. The stack (engines, frontend, supervision)
//! is `python -m vllm_rs serve`; this replaces the process with the Python
//! of the environment the binary is installed in (the `python3` or `python`
//! next to it: pip and `scripts/setup.sh` put both in the same `bin/`), so
//! signals, the exit status and the process tree are exactly `serve`'s.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use vllm_rs_config::error::ExitError;

/// Overrides which Python runs the stack (an environment whose `vllm_rs` matches this binary).
pub const PYTHON_ENV: &str = "VLLM_RS_PYTHON";
/// The frontend `serve` starts (`vllm_rs.frontend_binary`); set to this binary unless already set.
pub const FRONTEND_PATH_ENV: &str = "VLLM_RS_FRONTEND_PATH";
/// The interpreter names looked for next to the binary, in order.
const PYTHON_NAMES: [&str; 2] = ["python3", "python"];

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// The Python that runs the stack: `$VLLM_RS_PYTHON` when set (it must be an
/// executable file), else `python3` or `python` in the folder of `exe` (this
/// binary as invoked, so a venv's `bin/` is found through a symlink too).
/// The error says where it looked and how to fix it.
pub fn find_python(exe: &Path, override_path: Option<OsString>) -> Result<PathBuf, ExitError> {
    if let Some(path) = override_path.filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(ExitError::usage(format!("{PYTHON_ENV}={}: not an executable file", path.display())))
        };
    }
    let dir = exe.parent().unwrap_or(Path::new("."));
    PYTHON_NAMES.iter().map(|name| dir.join(name)).find(|p| is_executable(p)).ok_or_else(|| {
        ExitError::usage(format!(
            "no Python next to {} (looked for {} in {}): run the vllm-rs installed in a Python environment \
             (pip install vllm-rs, or scripts/setup.sh), or set {PYTHON_ENV} to the Python of one",
            exe.display(),
            PYTHON_NAMES.join(" and "),
            dir.display()
        ))
    })
}

/// Replaces this process with `PYTHON -m vllm_rs serve ARGS...`; returns only
/// on failure. The stack's frontend is this very binary unless
/// `VLLM_RS_FRONTEND_PATH` already names one.
pub fn exec_serve(args: Vec<OsString>) -> ExitError {
    // argv[0] as invoked (not /proc/self/exe, which resolves a symlinked venv binary
    // out of its venv), made absolute through PATH the way the shell found it.
    let invoked = std::env::args_os().next().map(PathBuf::from).unwrap_or_default();
    let exe = resolve_invoked(&invoked).unwrap_or_else(|| std::env::current_exe().unwrap_or(invoked));
    let python = match find_python(&exe, std::env::var_os(PYTHON_ENV)) {
        Ok(python) => python,
        Err(e) => return e,
    };
    let mut command = std::process::Command::new(&python);
    command.arg("-m").arg("vllm_rs").arg("serve").args(args);
    if std::env::var_os(FRONTEND_PATH_ENV).is_none() {
        if let Ok(me) = std::env::current_exe() {
            command.env(FRONTEND_PATH_ENV, me);
        }
    }
    let error = command.exec();
    ExitError::usage(format!("cannot run {}: {error}", python.display()))
}

/// `invoked` as a path that exists: as given when it has a `/`, else found on `PATH`.
fn resolve_invoked(invoked: &Path) -> Option<PathBuf> {
    if invoked.components().count() > 1 {
        return invoked.is_file().then(|| invoked.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(invoked)).find(|p| is_executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn bin_dir(tag: &str, executables: &[&str]) -> Dir {
        use std::os::unix::fs::PermissionsExt;
        let dir = Dir(std::env::temp_dir().join(format!("vllm-rs-launcher-{tag}-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).unwrap();
        for name in executables {
            let path = dir.0.join(name);
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    }

    #[test]
    fn the_python_next_to_the_binary_runs_the_stack() {
        let dir = bin_dir("both", &["vllm-rs", "python", "python3"]);
        assert_eq!(find_python(&dir.0.join("vllm-rs"), None).unwrap(), dir.0.join("python3"));
        let dir = bin_dir("python", &["vllm-rs", "python"]);
        assert_eq!(find_python(&dir.0.join("vllm-rs"), Some(OsString::new())).unwrap(), dir.0.join("python"));
    }

    #[test]
    fn no_python_is_a_usage_error_saying_where_it_looked() {
        let dir = bin_dir("none", &["vllm-rs"]);
        let error = find_python(&dir.0.join("vllm-rs"), None).unwrap_err();
        assert!(matches!(error, ExitError::Usage(_)));
        let text = error.to_string();
        assert!(text.contains(&dir.0.display().to_string()) && text.contains(PYTHON_ENV), "{text}");
    }

    #[test]
    fn the_override_must_be_an_executable() {
        let dir = bin_dir("override", &["py"]);
        let exe = dir.0.join("vllm-rs");
        assert_eq!(find_python(&exe, Some(dir.0.join("py").into())).unwrap(), dir.0.join("py"));
        let error = find_python(&exe, Some(dir.0.join("missing").into())).unwrap_err().to_string();
        assert!(error.contains("VLLM_RS_PYTHON=") && error.contains("missing"), "{error}");
    }
}
