//! The one audited syscall module: the two calls the I/O governor needs
//! that rustix does not wrap (`ioprio_set`, `sync_file_range`). Each
//! `unsafe` block passes only integers and a borrowed, live descriptor.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const IOPRIO_WHO_PROCESS: libc::c_int = 1;
const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
/// "Idle": served only when no other class wants the device (honoured by
/// bfq; mq-deadline maps it to its lowest priority).
pub const IOPRIO_CLASS_IDLE: libc::c_int = 3;

/// Puts the calling thread in the idle I/O class. Threads it creates
/// afterwards inherit the class, so call it before starting any runtime.
pub fn set_idle_io_priority() -> io::Result<()> {
    let prio = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT;
    // SAFETY: ioprio_set(2) takes three integers and reads no memory of
    // ours; `who` 0 means the calling thread.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, prio) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's I/O priority class (0 = none/default).
pub fn io_priority_class() -> io::Result<libc::c_int> {
    // SAFETY: ioprio_get(2) takes two integers and reads no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((r as libc::c_int) >> IOPRIO_CLASS_SHIFT)
}

/// Starts writeback of a file's dirty pages, without waiting.
pub const SYNC_START: libc::c_uint = libc::SYNC_FILE_RANGE_WRITE;
/// Writes back a file's dirty pages and waits until they are on the device
/// (not its cache, and no metadata: the final `syncfs` covers those).
pub const SYNC_WAIT: libc::c_uint = libc::SYNC_FILE_RANGE_WAIT_BEFORE
    | libc::SYNC_FILE_RANGE_WRITE
    | libc::SYNC_FILE_RANGE_WAIT_AFTER;

/// `sync_file_range(fd, offset, len, flags)`; `len` 0 means "to the end
/// of the file".
pub fn sync_file_range(
    fd: BorrowedFd<'_>,
    offset: u64,
    len: u64,
    flags: libc::c_uint,
) -> io::Result<()> {
    let offset = libc::off64_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
    let len = libc::off64_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length out of range"))?;
    // SAFETY: `fd` is borrowed, so it stays open for the call; offsets and
    // flags are plain integers.
    let r = unsafe { libc::sync_file_range(fd.as_raw_fd(), offset, len, flags) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
