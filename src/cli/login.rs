//! `account login`: a device-code or browser login run to its tokens.

use super::CommandError;
use crate::config::Config;

/// Resolves at the first SIGINT, SIGTERM or SIGHUP; the handlers are installed when called.
pub(super) fn stop_signals() -> Result<impl std::future::Future<Output = ()>, CommandError> {
    use crate::daemon::signals::{Signal, listen};
    let mut signals = listen(&[Signal::Interrupt, Signal::Terminate, Signal::Hangup])
        .map_err(|e| CommandError::Usage(format!("cannot handle signals: {e}")))?;
    Ok(async move {
        signals.next().await;
    })
}

/// Runs one login to its tokens: the device-code flow, or the browser flow.
pub(super) async fn login(
    config: &Config,
    browser: bool,
) -> Result<crate::upstream::login::LoginTokens, CommandError> {
    use crate::upstream::login::{self as flow, LoginError};
    crate::upstream::install_crypto_provider();
    let up = &config.upstream;
    let http = crate::upstream::http_client(up)
        .timeout(up.header_timeout)
        .build()
        .map_err(|e| CommandError::Usage(e.to_string()))?;
    let failed = |e: LoginError| CommandError::Usage(format!("login failed: {e}"));
    if !browser {
        let code = flow::request_device_code(&http, &up.auth_base_url, &up.oauth_client_id)
            .await
            .map_err(failed)?;
        eprintln!(
            "To log in, open {} in any browser and enter the code\n\n    {}\n\n(it expires in 15 minutes; \
             waiting for the approval…)",
            code.verification_url, code.user_code
        );
        let deadline = std::time::Instant::now() + flow::DEVICE_CODE_LIFETIME;
        let (auth_code, verifier) =
            flow::poll_device_code(&http, &up.auth_base_url, &code, deadline)
                .await
                .map_err(failed)?;
        let redirect = flow::device_redirect_uri(&up.auth_base_url);
        return flow::exchange_code(
            &http,
            &up.oauth_token_url,
            &up.oauth_client_id,
            (&auth_code, &redirect, &verifier),
        )
        .await
        .map_err(failed);
    }
    let pkce = flow::Pkce::new().map_err(failed)?;
    let redirect = format!("http://localhost:{}/auth/callback", flow::CALLBACK_PORT);
    let url = pkce.authorize_url(&up.auth_base_url, &up.oauth_client_id, &redirect);
    // Listening before the URL is shown: a browser that follows it at once finds the callback.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", flow::CALLBACK_PORT))
        .await
        .ok();
    eprintln!(
        "Open this URL in a browser and log in:\n\n    {url}\n\nOn this machine the login completes by \
         itself. Over SSH, copy the address the browser ends on (http://localhost:{}/auth/callback?code=…) \
         and paste it here:",
        flow::CALLBACK_PORT
    );
    // Read on a thread of its own that nothing waits for: a read blocked on the terminal must
    // neither hold the runtime nor keep the command from exiting once the callback came.
    // Without a terminal (stdin closed) only the callback can complete it.
    let (line_tx, line_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        loop {
            line.clear();
            match std::io::stdin().read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line.trim().is_empty() => continue,
                Ok(_) => {
                    let _ = line_tx.send(line.trim().to_string());
                    return;
                }
            }
        }
    });
    let pasted = async {
        match line_rx.await {
            Ok(l) => Ok::<String, LoginError>(l),
            Err(_) => std::future::pending().await,
        }
    };
    let redirected = tokio::select! {
        r = pasted => r,
        r = callback(listener) => r,
    }
    .map_err(failed)?;
    let code = pkce.code_from_redirect(&redirected).map_err(failed)?;
    flow::exchange_code(
        &http,
        &up.oauth_token_url,
        &up.oauth_client_id,
        (&code, &redirect, &pkce.verifier),
    )
    .await
    .map_err(failed)
}

/// Waits for the browser's redirect on the callback listener and answers it; never resolves
/// without one (the port was taken: the URL can still be pasted).
pub(super) async fn callback(
    listener: Option<tokio::net::TcpListener>,
) -> Result<String, crate::upstream::login::LoginError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(listener) = listener else {
        return std::future::pending().await;
    };
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let mut buf = vec![0u8; 8192];
        let n = sock.read(&mut buf).await.unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        let target = head
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_default()
            .to_string();
        if !target.starts_with("/auth/callback") {
            let _ = sock
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            continue;
        }
        let body = "Switchyard: the login is complete; you can close this tab.";
        let _ = sock
            .write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await;
        return Ok(target);
    }
}
