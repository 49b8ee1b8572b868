//! The daemon's two listeners: the client-facing TCP listener (bound here, or the one systemd
//! passed) and the admin Unix socket.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, UnixListener};

use super::BootError;

/// The bound listeners.
pub struct Listeners {
    pub http: TcpListener,
    pub admin: UnixListener,
    pub admin_path: PathBuf,
}

impl Listeners {
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.local_addr().ok()
    }
}

/// Connections the kernel may hold for the client listener before they are accepted, as the
/// socket unit's `Backlog=` (the kernel caps it at `net.core.somaxconn`). A burst past the
/// backlog has its handshakes dropped and retried a second later, a well-behaved client's
/// among them: a flood of thousands of connections at once is taken in and judged here.
pub const BACKLOG: u32 = 4096;

/// A TCP listener on `addr` with [`BACKLOG`].
fn listen_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Binds the client listener and the admin socket (mode 0660). A stale socket file left by a
/// crash is replaced; one that a live daemon answers on is an error.
pub async fn bind(listen: SocketAddr, admin_path: &Path) -> Result<Listeners, BootError> {
    bind_with(None, listen, admin_path).await
}

/// [`bind`], taking the client listener systemd passed (socket activation) when there is one:
/// it stays open across restarts, so a client connecting meanwhile waits instead of being
/// refused.
pub async fn bind_with(
    activated: Option<std::net::TcpListener>,
    listen: SocketAddr,
    admin_path: &Path,
) -> Result<Listeners, BootError> {
    let http = match activated {
        Some(l) => {
            let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            let taken = l
                .set_nonblocking(true)
                .and_then(|()| TcpListener::from_std(l))
                .map_err(|source| BootError::Listen {
                    addr: addr.clone(),
                    source,
                })?;
            if addr != listen.to_string() {
                tracing::info!(
                    socket = %addr,
                    configured = %listen,
                    "serving on the socket systemd passed; [server] listen is not used"
                );
            }
            taken
        }
        None => listen_tcp(listen).map_err(|source| BootError::Listen {
            addr: listen.to_string(),
            source,
        })?,
    };
    let socket_err = |source| BootError::Socket {
        path: admin_path.to_path_buf(),
        source,
    };
    if admin_path.exists() {
        if tokio::net::UnixStream::connect(admin_path).await.is_ok() {
            return Err(BootError::SocketInUse(admin_path.to_path_buf()));
        }
        std::fs::remove_file(admin_path).map_err(socket_err)?;
    }
    if let Some(parent) = admin_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(socket_err)?;
    }
    let admin = UnixListener::bind(admin_path).map_err(socket_err)?;
    std::fs::set_permissions(admin_path, std::fs::Permissions::from_mode(0o660))
        .map_err(socket_err)?;
    Ok(Listeners {
        http,
        admin,
        admin_path: admin_path.to_path_buf(),
    })
}
