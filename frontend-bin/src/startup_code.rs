//! Lets go of the code pages that only start-up ran.
//!
//! Start-up runs code from all over the binary (argument and configuration
//! parsing, `tokenizer.json` parsing and the `fastokens` table builders, the
//! chat template compiler, the runtime and server set-up), and the kernel maps
//! file pages in windows around every fault, so once the frontend serves
//! nearly all of the executable's code and read-only data is mapped (about 11
//! MiB), while serving runs a fraction of it. Advising those mappings away
//! (`MADV_DONTNEED`) unmaps their pages; what serving runs faults back in from
//! the page cache (minor faults, once), the rest stays unmapped page cache,
//! which the kernel reclaims first under memory pressure. The binary's
//! resident pages after `bench/bench_serve.py`'s load went from 11.6-11.8
//! to 6.9-7.0 MiB, and from 11.2 to 2.1 MiB idle
//! (docs/frontend-performance.md, "Where the memory goes").
//!
//! The same goes for the shared libraries' code (libc, libm, the loader).
//! Only private file mappings that are not writable and hold no private
//! (copy-on-write) page are advised: for those, dropping a page loses nothing,
//! the file has the same bytes. Relocated read-only data (`.data.rel.ro`) and
//! writable data hold private pages and are left alone.

use std::io;

/// One mapping of `/proc/self/smaps`: its address range, and whether it is
/// a private read-only mapping of a file (see the module docs).
struct Mapping {
    start: usize,
    end: usize,
    read_only_file: bool,
}

/// `line` without its first `n` whitespace-separated fields (the rest as
/// written: a path may hold spaces).
fn after_fields(line: &str, n: usize) -> &str {
    let mut rest = line;
    for _ in 0..n {
        let trimmed = rest.trim_start();
        rest = trimmed.find(char::is_whitespace).map_or("", |end| &trimmed[end..]);
    }
    rest.trim_start()
}

/// The mapping a `/proc/self/smaps` header line (`start-end perms offset
/// device inode path`) describes, or `None` for the lines of fields under it.
fn header(line: &str) -> Option<Mapping> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        // A path (not `[vdso]` or an anonymous mapping) still on disk.
        read_only_file: perms.starts_with("r-") && perms.ends_with('p') && {
            let path = after_fields(line, 5);
            path.starts_with('/') && !path.ends_with(" (deleted)")
        },
    })
}

/// The address ranges in `smaps` (the text of `/proc/self/smaps`) that map
/// a file privately and read-only, and hold no private page.
fn clean_ranges_of(smaps: &str) -> Vec<(usize, usize)> {
    let mut ranges = Vec::new();
    let mut current: Option<Mapping> = None;
    for line in smaps.lines() {
        if let Some(anonymous) = line.strip_prefix("Anonymous:") {
            if let Some(mapping) = current.take().filter(|m| m.read_only_file) {
                if anonymous.trim() == "0 kB" {
                    ranges.push((mapping.start, mapping.end));
                }
            }
        } else if let Some(mapping) = header(line) {
            current = Some(mapping);
        }
    }
    ranges
}

/// Unmaps the resident pages of the read-only, never-written file mappings
/// (the code and read-only data of the executable and its shared libraries)
/// and returns how many bytes of mappings were advised; pages run later fault
/// back in from the page cache. Safe to call at any time from any thread:
/// nothing in those mappings differs from the file.
pub fn release_startup_code() -> io::Result<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut advised = 0;
    for (start, end) in clean_ranges_of(&smaps) {
        // SAFETY: the range is a whole private mapping of a file that is not
        // writable and holds no private page: dropping its pages only makes
        // the next access read the same bytes from the file again. It cannot
        // have become another mapping since smaps was read: the frontend
        // never unmaps its executable or a library (no `dlclose`).
        if unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) } != 0 {
            return Err(io::Error::last_os_error());
        }
        advised += end - start;
    }
    Ok(advised)
}

/// [`release_startup_code`], logged: the frontend calls it once, when start-up
/// is over: once the tokenizer's tables are built (which starts when it
/// serves), or once it serves when there are none to build; a failure only
/// costs resident memory.
pub fn release() {
    match release_startup_code() {
        Ok(bytes) => tracing::debug!("start-up code released: {} KiB of read-only file mappings advised", bytes >> 10),
        Err(e) => tracing::debug!("could not release the start-up code's pages: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident KiB of the mappings of the test process that
    /// `clean_ranges_of` selects.
    fn resident_clean_kib() -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let clean = clean_ranges_of(&smaps);
        let mut resident = 0;
        let mut selected = false;
        for line in smaps.lines() {
            if let Some(mapping) = header(line) {
                selected = clean.contains(&(mapping.start, mapping.end));
            } else if let Some(rss) = line.strip_prefix("Rss:").filter(|_| selected) {
                resident += rss.trim().trim_end_matches(" kB").parse::<u64>().unwrap();
            }
        }
        resident
    }

    /// Relocated read-only data: a table of string pointers, which a
    /// position-independent executable fixes up at load time.
    static NAMES: [&str; 3] = ["frontend", "engine", "tokenizer"];

    #[test]
    fn code_pages_are_released_and_the_process_keeps_running() {
        let before = resident_clean_kib();
        assert!(before > 0, "the test binary's code is mapped");
        let advised = release_startup_code().unwrap();
        assert!(advised > 0, "the code and read-only data were advised");
        let after = resident_clean_kib();
        assert!(after < before, "resident {after} KiB after, {before} KiB before");
        // Relocated data and code run after the advice are intact.
        assert_eq!(NAMES.iter().map(|n| n.len()).sum::<usize>(), 23);
        assert_eq!(format!("{:?}", NAMES), r#"["frontend", "engine", "tokenizer"]"#);
    }

    #[test]
    fn only_private_read_only_file_mappings_without_private_pages_are_selected() {
        let smaps = "\
55d0a0000000-55d0a0400000 r--p 00000000 fd:01 42                         /opt/my bin/vllm-rs
Rss:                1024 kB
Anonymous:             0 kB
55d0a0400000-55d0a1000000 r-xp 00400000 fd:01 42 /opt/my bin/vllm-rs
Anonymous:             0 kB
55d0a1000000-55d0a1100000 r--p 01000000 fd:01 42 /opt/my bin/vllm-rs
Anonymous:           700 kB
55d0a1100000-55d0a1110000 rw-p 01100000 fd:01 42 /opt/my bin/vllm-rs
Anonymous:             0 kB
7f0000000000-7f0000100000 r-xp 00000000 fd:01 7 /usr/lib/libc.so.6
Anonymous:             0 kB
7f0000100000-7f0000110000 r--s 00000000 fd:01 9 /dev/shm/shared
Anonymous:             0 kB
7f0000110000-7f0000120000 r-xp 00000000 fd:01 8 /tmp/replaced.so (deleted)
Anonymous:             0 kB
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
Anonymous:            64 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
";
        let ranges = clean_ranges_of(smaps);
        assert_eq!(
            ranges,
            vec![(0x55d0a0000000, 0x55d0a0400000), (0x55d0a0400000, 0x55d0a1000000), (0x7f0000000000, 0x7f0000100000)]
        );
    }
}
