//! The open-file limit: raised at start to what the system allows, and the client connection
//! cap derived from it, so that the cap engages before `accept` runs out of descriptors.
//!
//! A shell's default soft limit is 1,024 while `max_connections` defaults to 4,096: without
//! this, idle sockets exhaust the descriptors, `accept` fails in a loop and every client
//! (`/healthz` included) waits in the kernel's backlog, while the cap — which would have
//! evicted an idle connection to make room — never engages.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Descriptors kept for everything but client connections: the store, the log, the
/// listeners, the admin socket and its clients, the runtime's own, the accounts' usage polls
/// and token refreshes.
pub const RESERVED: u64 = 128;

/// Descriptors each serving thread's runtime holds (`base::cores`): its event queue and its
/// wake-up descriptor.
pub const PER_SERVING_THREAD: u64 = 2;

/// What is kept beyond client connections with `threads` serving threads.
pub fn reserved(threads: usize) -> u64 {
    RESERVED + PER_SERVING_THREAD * threads as u64
}

/// Descriptors one client connection may hold: its own socket and the upstream one it is
/// forwarded on.
pub const PER_CONNECTION: u64 = 2;

/// What the start did to the soft limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimit {
    /// The soft limit the process was started with (`None`: unlimited).
    pub before: Option<u64>,
    /// The soft limit now.
    pub now: Option<u64>,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit. A failure leaves the limit as it was.
pub fn raise_open_file_limit() -> FileLimit {
    let limit = getrlimit(Resource::Nofile);
    let before = limit.current;
    if limit.current == limit.maximum {
        return FileLimit {
            before,
            now: before,
        };
    }
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => FileLimit {
            before,
            now: getrlimit(Resource::Nofile).current,
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            FileLimit {
                before,
                now: before,
            }
        }
    }
}

/// The connection cap under a soft limit of `limit` descriptors: `configured`, or what the
/// limit leaves after `reserved` at [`PER_CONNECTION`] each when that is less (never 0).
pub fn connection_cap(configured: usize, limit: Option<u64>, reserved: u64) -> usize {
    let Some(limit) = limit else {
        return configured;
    };
    let room = limit.saturating_sub(reserved) / PER_CONNECTION;
    configured
        .min(usize::try_from(room).unwrap_or(usize::MAX))
        .max(1)
}

/// Raises the limit, derives the cap from it, and says both once.
pub fn start(configured: usize) -> usize {
    let limit = raise_open_file_limit();
    let cap = connection_cap(configured, limit.now, reserved(crate::base::cores::count()));
    let shown = |l: Option<u64>| l.map_or("unlimited".to_string(), |n| n.to_string());
    if cap < configured {
        tracing::warn!(
            open_file_limit = %shown(limit.now),
            max_connections = configured,
            connection_cap = cap,
            "the open-file limit leaves room for fewer client connections than [server] \
             max_connections: the cap is lowered (raise the limit: LimitNOFILE= in the unit, or \
             `ulimit -n` before `switchyard serve`)"
        );
    } else {
        tracing::info!(
            open_file_limit = %shown(limit.now),
            raised_from = %shown(limit.before),
            connection_cap = cap,
            "open-file limit"
        );
    }
    cap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_the_reserve_and_two_descriptors_a_connection() {
        assert_eq!(reserved(2), 132);
        assert_eq!(reserved(64), 256);
        assert_eq!(connection_cap(4096, Some(1024), reserved(2)), 446);
        assert_eq!(connection_cap(4096, Some(1024), reserved(64)), 384);
        assert_eq!(connection_cap(4096, Some(1_048_576), reserved(2)), 4096);
        assert_eq!(connection_cap(200, Some(1024), reserved(2)), 200);
        assert_eq!(connection_cap(4096, None, reserved(2)), 4096);
        assert_eq!(connection_cap(4096, Some(16), reserved(2)), 1);
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let limit = raise_open_file_limit();
        let now = getrlimit(Resource::Nofile);
        assert_eq!(now.current, now.maximum);
        assert_eq!(limit.now, now.current);
    }
}
