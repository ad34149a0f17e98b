//! Whether a rank's process is still alive: what shared-memory peers check while they wait on one another, and what
//! a bootstrap checks to tell a dead rank 0 (or a dead attached rank) from a slow one. Its own room, so that the
//! transport (`shm`), the bootstrap and the descriptor exchange (`fdpass`) all use it without importing each other.

/// Whether a process exists and is not a zombie.
pub(crate) fn process_alive(pid: u32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return true;
    };
    match rustix::process::test_kill_process(p) {
        Ok(()) => {}
        // The process exists but belongs to someone else.
        Err(rustix::io::Errno::PERM) => return true,
        Err(_) => return false,
    }
    // A killed child that its parent has not reaped yet still answers kill(0); its state in /proc says 'Z'.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}
