//! The systemd notify protocol: `READY=1`, `STOPPING=1`, `RELOADING=1` and watchdog pings over
//! the datagram socket named by `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket).
//! Without that variable every call is a no-op. And socket activation: the client listener
//! systemd hands over (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`).

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

#[derive(Debug, Clone, Default)]
pub struct Notifier {
    socket: Option<String>,
}

impl Notifier {
    pub fn from_env() -> Self {
        Self {
            socket: std::env::var("NOTIFY_SOCKET")
                .ok()
                .filter(|s| !s.is_empty()),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// Sends one state message (`READY=1`, `STOPPING=1`, `WATCHDOG=1`, `STATUS=...`).
    pub fn notify(&self, state: &str) -> io::Result<()> {
        let Some(name) = &self.socket else {
            return Ok(());
        };
        let addr = match name.strip_prefix('@') {
            Some(abstract_name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(abstract_name.as_bytes())?
            }
            None => SocketAddr::from_pathname(name)?,
        };
        let sock = UnixDatagram::unbound()?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
        Ok(())
    }

    /// Logs instead of failing: the service works without the notify socket.
    pub fn notify_or_log(&self, state: &str) {
        if let Err(e) = self.notify(state) {
            tracing::warn!(error = %e, state, "sd_notify failed");
        }
    }
}

/// How often to ping the watchdog: half of `$WATCHDOG_USEC`, when it is set for this process.
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// The name the socket unit gives the client listener (`FileDescriptorName=`).
pub const LISTENER_NAME: &str = "http";

/// The client listener systemd passed, if it passed one to this process: `LISTEN_PID` must be
/// this process (a variable inherited from a parent that was activated is not ours) and
/// `LISTEN_FDS` count the descriptors from 3. With names (`LISTEN_FDNAMES`), the one named
/// [`LISTENER_NAME`] is taken, else the first. Call it before any thread starts: it unsets the
/// variables, so nothing this process starts inherits them.
pub fn activated_listener() -> Result<Option<std::net::TcpListener>, String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(pid), Some(count)) = (env("LISTEN_PID"), env("LISTEN_FDS")) else {
        return Ok(None);
    };
    if pid.parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    let count: usize = count
        .parse()
        .map_err(|_| format!("LISTEN_FDS={count} is not a number"))?;
    let names: Vec<String> = env("LISTEN_FDNAMES")
        .map(|n| n.split(':').map(str::to_string).collect())
        .unwrap_or_default();
    let index = names.iter().position(|n| n == LISTENER_NAME).unwrap_or(0);
    if count == 0 {
        return Ok(None);
    }
    if count > 1 {
        tracing::warn!(
            count,
            names = %names.join(":"),
            "systemd passed several sockets; only the client listener ({LISTENER_NAME}) is used"
        );
    }
    let mut fds = listenfd::ListenFd::from_env();
    fds.take_tcp_listener(index)
        .map_err(|e| format!("the socket systemd passed (LISTEN_FDS) is not a TCP listener: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_datagrams_to_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            socket: Some(path.to_string_lossy().into_owned()),
        };
        n.notify("READY=1").unwrap();
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
    }

    #[test]
    fn sends_datagrams_to_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("switchyard-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
            .unwrap();
        let n = Notifier {
            socket: Some(format!("@{name}")),
        };
        n.notify("STOPPING=1").unwrap();
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1");
    }

    #[test]
    fn without_a_socket_notify_is_a_no_op() {
        assert!(Notifier::default().notify("READY=1").is_ok());
    }
}
