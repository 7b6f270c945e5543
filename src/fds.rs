//! The process's file descriptors: the soft limit raised to the hard one at start, and the
//! message when a plan needs more than the process may open.
//!
//! Every stream to a target is a socket, and so is every connection to the canary's own port;
//! a distribution's default soft limit (1024) is below what a plan of many targets at high
//! concurrency holds at its peak. Out of descriptors, `connect` fails with `EMFILE` and the
//! canary would report a healthy target unreachable, and its own listener could accept nothing.
//! The hard limit is what an unprivileged process may raise itself to, so it does.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Descriptors the process holds besides the streams, the targets' sockets and its port's
/// connections: the runtime's epoll and eventfd, config and output files, the OTLP and
/// Kubernetes clients, a tokenizer. Measured: the demo daemon holds about 30 at rest.
pub const RESERVED: u64 = 64;

/// What a limit reads as when it has none (`RLIM_INFINITY`).
const UNLIMITED: u64 = u64::MAX;

/// The open-file limits of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The limit in force (`ulimit -n`).
    pub soft: u64,
    /// What the process may raise it to (`ulimit -Hn`).
    pub hard: u64,
}

impl Limits {
    /// The limits in force now.
    pub fn now() -> Self {
        let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
        Self {
            soft: current.unwrap_or(UNLIMITED),
            hard: maximum.unwrap_or(UNLIMITED),
        }
    }
}

/// What raising the soft limit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    pub before: u64,
    pub now: Limits,
}

/// Raises the soft open-file limit to the hard one; the limits before and after. Where the
/// hard limit is unlimited (some platforms refuse that as a soft limit), the soft limit stays.
pub fn raise_soft_limit() -> Raised {
    let before = Limits::now();
    if before.soft < before.hard && before.hard != UNLIMITED {
        let wanted = Rlimit {
            current: Some(before.hard),
            maximum: Some(before.hard),
        };
        if let Err(error) = setrlimit(Resource::Nofile, wanted) {
            tracing::debug!(%error, "raising the open-file limit failed");
        }
    }
    Raised {
        before: before.soft,
        now: Limits::now(),
    }
}

/// The sentence that says a plan needing `need` descriptors at its peak does not fit in
/// `limit`, with what to do; `None` when it fits.
pub fn shortfall(need: u64, limit: u64) -> Option<String> {
    (need > limit).then(|| {
        format!(
            "the plan needs ≈{need} file descriptors at its peak but the process may open {limit}: \
             raise the limit (`ulimit -n`, systemd `LimitNOFILE=`, the container runtime's \
             `nofile` ulimit) or lower the peak concurrency (`budget.max_inflight`); out of \
             descriptors, connections to healthy targets fail as `connect` errors and the \
             canary's own port accepts nothing"
        )
    })
}

/// What to add to an error of opening a socket or file: when the process or the system ran out
/// of descriptors (`EMFILE`, `ENFILE`), that the fault is the canary's, not the target's.
pub fn exhausted_advice(error: &std::io::Error) -> &'static str {
    let emfile = rustix::io::Errno::MFILE.raw_os_error();
    let enfile = rustix::io::Errno::NFILE.raw_os_error();
    match error.raw_os_error() {
        Some(code) if code == emfile || code == enfile => {
            " (the canary is out of file descriptors, not the target: raise its open-file limit \
             or lower its peak concurrency; `llm-canary check` shows what the plan needs)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let raised = raise_soft_limit();
        assert!(raised.now.soft >= raised.before, "{raised:?}");
        if raised.now.hard != UNLIMITED {
            assert_eq!(raised.now.soft, raised.now.hard, "{raised:?}");
        }
        assert_eq!(Limits::now(), raised.now);
    }

    #[test]
    fn running_out_of_descriptors_is_said_to_be_the_canarys_fault() {
        let emfile = std::io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error());
        assert!(exhausted_advice(&emfile).contains("not the target"));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(exhausted_advice(&refused), "");
    }

    #[test]
    fn a_plan_within_the_limit_has_no_shortfall() {
        assert_eq!(shortfall(1024, 1024), None);
        let text = shortfall(1025, 1024).unwrap();
        assert!(
            text.contains("≈1025") && text.contains("open 1024"),
            "{text}"
        );
        assert!(text.contains("budget.max_inflight"), "{text}");
    }
}
