//! Running the simulator: a handle for in-process use (tests, `switchyard demo`) and the
//! standalone `switchyard sim` loop.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{Profile, Sim, SimOptions};

/// A running simulator on 127.0.0.1.
#[derive(Debug)]
pub struct SimHandle {
    pub addr: SocketAddr,
    pub sim: Sim,
    stop: CancellationToken,
}

impl SimHandle {
    pub(crate) fn new(addr: SocketAddr, sim: Sim, stop: CancellationToken) -> Self {
        Self { addr, sim, stop }
    }

    /// `http://ADDR`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://ADDR/backend-api/codex`
    pub fn base_url(&self) -> String {
        format!("{}/backend-api/codex", self.url())
    }

    /// `ws://ADDR/backend-api/codex/responses`, the Responses WebSocket.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/backend-api/codex/responses", self.addr)
    }

    /// `http://ADDR/backend-api/wham/usage`
    pub fn usage_url(&self) -> String {
        format!("{}/backend-api/wham/usage", self.url())
    }

    /// `http://ADDR/oauth/token`
    pub fn oauth_token_url(&self) -> String {
        format!("{}/oauth/token", self.url())
    }

    /// Stops accepting and closes open connections.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// The token `stop` cancels (to tie the simulator to a wider shutdown).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.stop.clone()
    }
}

/// `switchyard sim`: serves on `listen`, writes auth files into `write_auth` if given, prints
/// the three `export SWITCHYARD_…_URL=…` lines (and where the auth files went) to stdout, then
/// runs until `shutdown`. Every other line of the banner starts with `#`, so it can be sourced.
/// A closed stdout (`| head -3`) does not stop the simulator.
pub async fn run_standalone(
    listen: SocketAddr,
    opts: SimOptions,
    write_auth: Option<PathBuf>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let (sim, listener, banner) = prepare(listen, opts, write_auth.as_deref()).await?;
    let mut stdout = std::io::stdout();
    let _ = stdout
        .write_all(banner.as_bytes())
        .and_then(|()| stdout.flush());
    sim.serve(listener, shutdown).await;
    Ok(())
}

/// Binds, writes the auth files and composes the banner.
async fn prepare(
    listen: SocketAddr,
    opts: SimOptions,
    write_auth: Option<&Path>,
) -> std::io::Result<(Sim, TcpListener, String)> {
    let listener = TcpListener::bind(listen).await?;
    let mut addr = listener.local_addr()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    let sim = Sim::new(opts);
    let profile = sim.profile().unwrap_or(Profile::Healthy);
    let root = format!("http://{addr}");
    let mut out = format!(
        "# switchyard sim: {} accounts, profile `{}` ({}), listening on {addr}\n\
         export SWITCHYARD_UPSTREAM_BASE_URL={root}/backend-api/codex\n\
         export SWITCHYARD_UPSTREAM_USAGE_URL={root}/backend-api/wham/usage\n\
         export SWITCHYARD_OAUTH_TOKEN_URL={root}/oauth/token\n",
        sim.account_ids().len(),
        profile.name(),
        profile.description(),
    );
    if let Some(dir) = write_auth {
        let paths = sim.write_auth_files(dir)?;
        out.push_str(&format!(
            "# wrote {} auth files to {} (import: switchyard account import {}/*.json)\n",
            paths.len(),
            dir.display(),
            dir.display()
        ));
        for p in paths {
            out.push_str(&format!("#   {}\n", p.display()));
        }
    }
    out.push_str(&format!("# control API: {root}/sim/accounts\n"));
    Ok((sim, listener, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn banner_exports_the_three_urls_and_lists_the_auth_files() {
        let dir = tempfile::tempdir().unwrap();
        let listen: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let opts = SimOptions {
            accounts: 2,
            profile: Some(Profile::Demo),
            ..SimOptions::default()
        };
        let (sim, listener, banner) = prepare(listen, opts, Some(dir.path())).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let root = format!("http://127.0.0.1:{port}");
        let lines: Vec<&str> = banner.lines().collect();
        assert!(
            lines
                .iter()
                .all(|l| l.starts_with("# ") || l.starts_with("export "))
        );
        for want in [
            format!("export SWITCHYARD_UPSTREAM_BASE_URL={root}/backend-api/codex"),
            format!("export SWITCHYARD_UPSTREAM_USAGE_URL={root}/backend-api/wham/usage"),
            format!("export SWITCHYARD_OAUTH_TOKEN_URL={root}/oauth/token"),
        ] {
            assert!(lines.contains(&want.as_str()), "{want} not in\n{banner}");
        }
        assert!(banner.contains("profile `demo`"));
        for id in sim.account_ids() {
            let path = dir.path().join(format!("{id}.json"));
            assert!(path.exists());
            assert!(banner.contains(&path.display().to_string()));
        }
    }
}
