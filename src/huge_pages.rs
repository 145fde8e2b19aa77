//! Transparent huge pages under a CPU model's weights. A decode step streams
//! every weight once; with 4 KiB pages that is one TLB miss per page (about
//! 28,000 per token for the default model), with 2 MiB pages almost none.
//! Once the weights are in memory, the process's large private mappings are
//! collapsed into huge pages where they are already populated, so thread
//! stacks and spare capacity do not grow.

const HUGE_PAGE: usize = 2 << 20;
const SMALL_PAGE: usize = 4096;
/// Linux's `MADV_COLLAPSE` (6.1 and later): collapse a range into huge pages now.
const MADV_COLLAPSE: libc::c_int = 25;
/// A block is collapsed when at least this share of its small pages is populated.
const MIN_POPULATED: f64 = 0.9;

/// Collapses the populated 2 MiB blocks of the process's private, writable,
/// anonymous mappings (the heap included) into huge pages; returns the bytes
/// collapsed. Where the kernel cannot (older than 6.1, huge pages off), the
/// memory stays as it was and this returns 0.
pub(crate) fn collapse_populated_mappings() -> usize {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return 0;
    };
    maps.lines()
        .filter_map(anonymous_range)
        .map(|(start, end)| collapse_range(start, end))
        .sum()
}

/// The address range of a `/proc/self/maps` line for a private, writable,
/// anonymous mapping (or the heap).
fn anonymous_range(line: &str) -> Option<(usize, usize)> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    let perms = fields.next()?;
    // offset, device, inode, then the path if any
    let path = fields.nth(3);
    if perms != "rw-p" || path.is_some_and(|p| p != "[heap]") {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some((
        usize::from_str_radix(start, 16).ok()?,
        usize::from_str_radix(end, 16).ok()?,
    ))
}

fn collapse_range(start: usize, end: usize) -> usize {
    let mut collapsed = 0;
    let mut block = start.next_multiple_of(HUGE_PAGE);
    while block + HUGE_PAGE <= end {
        if populated_share(block) >= MIN_POPULATED {
            // SAFETY: advice about a block of this process's own mapping; it
            // changes how the pages are backed, never their contents.
            let rc = unsafe { libc::madvise(block as *mut libc::c_void, HUGE_PAGE, MADV_COLLAPSE) };
            if rc == 0 {
                collapsed += HUGE_PAGE;
            } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                // The kernel does not know the advice: nothing more to try.
                return collapsed;
            }
        }
        block += HUGE_PAGE;
    }
    collapsed
}

/// The share of the 2 MiB block at `block` whose small pages are in memory.
fn populated_share(block: usize) -> f64 {
    let mut resident = [0u8; HUGE_PAGE / SMALL_PAGE];
    // SAFETY: `resident` holds one byte per small page of the block.
    let rc = unsafe {
        libc::mincore(
            block as *mut libc::c_void,
            HUGE_PAGE,
            resident.as_mut_ptr() as *mut libc::c_uchar,
        )
    };
    if rc != 0 {
        return 0.0;
    }
    let populated = resident.iter().filter(|&&r| r & 1 == 1).count();
    populated as f64 / resident.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_anonymous_mappings_and_skips_files_and_read_only_ones() {
        assert_eq!(
            anonymous_range("7f00a000-7f20a000 rw-p 00000000 00:00 0 "),
            Some((0x7f00a000, 0x7f20a000))
        );
        assert_eq!(
            anonymous_range("55d0c000-55f0c000 rw-p 00000000 00:00 0    [heap]"),
            Some((0x55d0c000, 0x55f0c000))
        );
        assert_eq!(
            anonymous_range("7f00a000-7f20a000 r--p 00000000 fd:01 42  /usr/lib/libc.so.6"),
            None
        );
        assert_eq!(
            anonymous_range("7f00a000-7f20a000 rw-p 00000000 fd:01 42  /data/model.bin"),
            None
        );
        assert_eq!(
            anonymous_range("7ffd0000-7ffd2000 rw-p 00000000 00:00 0  [stack]"),
            None
        );
    }

    #[test]
    fn populated_memory_is_collapsed_and_untouched_memory_is_left_alone() {
        let size = 8 * HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let start = base as usize;
        let first = start.next_multiple_of(HUGE_PAGE);
        // Touch two whole blocks; leave the rest untouched.
        for offset in (0..2 * HUGE_PAGE).step_by(SMALL_PAGE) {
            // SAFETY: inside the mapping (at most one block of slack before `first`).
            unsafe { *((first + offset) as *mut u8) = 7 };
        }
        assert_eq!(populated_share(first + 2 * HUGE_PAGE), 0.0);
        let collapsed = collapse_range(start, start + size);
        // Kernels without MADV_COLLAPSE collapse nothing; none collapses untouched blocks.
        assert!(collapsed == 0 || collapsed == 2 * HUGE_PAGE, "{collapsed}");
        assert_eq!(populated_share(first + 2 * HUGE_PAGE), 0.0);
        // SAFETY: the values written above, still readable.
        assert_eq!(unsafe { *((first + HUGE_PAGE) as *const u8) }, 7);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(base, size) };
    }
}
