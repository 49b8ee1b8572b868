//! The demo's synthetic clients: sessions over HTTP/SSE and over the Responses WebSocket
//! (with `previous_response_id` continuations), each a run of conversations of a few turns
//! with pauses between them, shaped like Codex's requests.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;

use crate::base::clock;
use crate::upstream::sse::{Piece, SseSplitter};

const MODEL: &str = "gpt-5.5";
/// A turn that has not ended after this long is abandoned (the simulator never hangs unless
/// told to; this only bounds a surprise).
const TURN_TIMEOUT: Duration = Duration::from_secs(90);
/// The largest event a synthetic client reads.
const MAX_EVENT: usize = 4 << 20;

/// The synthetic clients.
#[derive(Clone)]
pub struct Traffic {
    http: reqwest::Client,
    base: String,
    ws_url: String,
    key: String,
    stop: CancellationToken,
}

#[derive(Debug, Clone, Copy)]
enum Transport {
    Sse,
    Ws,
}

/// How a turn ended, as the client saw it.
#[derive(Debug)]
enum Outcome {
    Completed {
        id: String,
        text: String,
    },
    /// An error status, a `response.failed` / `error` event, with its code.
    Failed {
        code: Option<String>,
    },
    /// The stream or the socket ended without a terminal event.
    Dropped,
}

/// Prompts the synthetic users type.
const PROMPTS: [&str; 8] = [
    "Why does the integration test fail on CI but not locally?",
    "Summarise the last build log in three bullet points.",
    "Refactor this function to return a Result instead of panicking.",
    "What does this regex match?",
    "Write a doc comment for the scheduler's pick function.",
    "Is this SQL query safe against injection?",
    "Explain the borrow checker error on line 42.",
    "Suggest a name for a module that pools accounts.",
];

impl Traffic {
    /// Starts `sse` sessions over HTTP/SSE and `ws` over the Responses WebSocket against the
    /// gateway at `addr` with client key `key`; they run until `stop`.
    pub fn spawn(
        addr: SocketAddr,
        key: &str,
        (sse, ws): (usize, usize),
        stop: &CancellationToken,
    ) -> Vec<JoinHandle<()>> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default();
        let traffic = Traffic {
            http,
            base: format!("http://{addr}"),
            ws_url: format!("ws://{addr}/v1/responses"),
            key: key.to_string(),
            stop: stop.clone(),
        };
        let sessions = (0..sse)
            .map(|i| (Transport::Sse, i))
            .chain((0..ws).map(|i| (Transport::Ws, i)));
        sessions
            .map(|(transport, i)| {
                let t = traffic.clone();
                tokio::spawn(async move {
                    let stop = t.stop.clone();
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        () = t.client(transport, i) => {}
                    }
                })
            })
            .collect()
    }

    /// One synthetic user: conversations of 3–10 turns, each under a new session id, forever.
    async fn client(self, transport: Transport, n: usize) {
        let mut rng = Rng::new();
        // Staggered starts, so the first seconds already show sessions arriving.
        pause(&mut rng, 100, 1500).await;
        for conversation in 0u64.. {
            let session = format!(
                "demo-{}-{n}-{conversation}-{:04x}",
                match transport {
                    Transport::Sse => "sse",
                    Transport::Ws => "ws",
                },
                rng.below(0x10000)
            );
            let turns = 3 + rng.below(8);
            match transport {
                Transport::Sse => self.sse_conversation(&session, turns, &mut rng).await,
                Transport::Ws => self.ws_conversation(&session, turns, &mut rng).await,
            }
            pause(&mut rng, 500, 2500).await;
        }
    }

    /// Turns over HTTP/SSE; every request carries the whole conversation, as Codex's do.
    async fn sse_conversation(&self, session: &str, turns: u64, rng: &mut Rng) {
        let mut history: Vec<Value> = Vec::new();
        for _ in 0..turns {
            let user = user_message(rng);
            let mut input = history.clone();
            input.push(user.clone());
            let mut body = request_body(session, Value::Array(input));
            body["stream"] = json!(true);
            let outcome = tokio::time::timeout(TURN_TIMEOUT, self.sse_turn(session, &body))
                .await
                .unwrap_or(Outcome::Dropped);
            tracing::debug!(session, ?outcome, "demo: sse turn");
            if let Outcome::Completed { text, .. } = outcome {
                history.push(user);
                history.push(assistant_message(&text));
            }
            pause(rng, 300, 2000).await;
        }
    }

    async fn sse_turn(&self, session: &str, body: &Value) -> Outcome {
        let sent = self
            .http
            .post(format!("{}/v1/responses", self.base))
            .bearer_auth(&self.key)
            .header("session_id", session)
            .json(body)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(_) => return Outcome::Dropped,
        };
        if !resp.status().is_success() {
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            return Outcome::Failed {
                code: body["error"]["code"].as_str().map(str::to_string),
            };
        }
        let mut text = String::new();
        let mut events = SseSplitter::new(MAX_EVENT);
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else {
                return Outcome::Dropped;
            };
            events.push(&chunk);
            loop {
                match events.next_piece() {
                    Ok(Some(Piece::Event(event))) => {
                        if let Some(event) = event.json()
                            && let Some(outcome) = on_event(&event, &mut text)
                        {
                            return outcome;
                        }
                    }
                    Ok(Some(Piece::Comment)) => {}
                    Ok(None) => break,
                    Err(_) => return Outcome::Dropped,
                }
            }
        }
        Outcome::Dropped
    }

    /// Turns on one Responses WebSocket: the first with the whole input, the next ones as
    /// continuations (`previous_response_id` and only the new message). A failed turn is
    /// resent in full; a dropped socket is reopened.
    async fn ws_conversation(&self, session: &str, turns: u64, rng: &mut Rng) {
        let mut ws = None;
        let mut history: Vec<Value> = Vec::new();
        let mut previous: Option<String> = None;
        for _ in 0..turns {
            if ws.is_none() {
                ws = self.ws_connect(session).await;
                previous = None;
            }
            let Some(socket) = ws.as_mut() else {
                pause(rng, 1000, 2000).await;
                continue;
            };
            let user = user_message(rng);
            let mut outcome = self
                .ws_send(socket, session, &history, &user, &previous)
                .await;
            if let Outcome::Failed { code: Some(code) } = &outcome
                && code == "previous_response_not_found"
            {
                // The account that held the conversation is out: resend it in full at once,
                // as Codex does.
                outcome = self.ws_send(socket, session, &history, &user, &None).await;
            }
            match outcome {
                Outcome::Completed { id, text } => {
                    history.push(user);
                    history.push(assistant_message(&text));
                    previous = Some(id);
                }
                Outcome::Failed { .. } => previous = None,
                Outcome::Dropped => ws = None,
            }
            pause(rng, 300, 2000).await;
        }
        if let Some(mut socket) = ws {
            let _ = socket.close(None).await;
        }
    }

    /// One turn: a continuation of `previous` if there is one, else the whole conversation.
    async fn ws_send(
        &self,
        socket: &mut Ws,
        session: &str,
        history: &[Value],
        user: &Value,
        previous: &Option<String>,
    ) -> Outcome {
        let mut frame = request_body(session, Value::Null);
        frame["type"] = json!("response.create");
        match previous {
            Some(id) => {
                frame["previous_response_id"] = json!(id);
                frame["input"] = json!([user]);
            }
            None => {
                let mut input = history.to_vec();
                input.push(user.clone());
                frame["input"] = Value::Array(input);
            }
        }
        let outcome = tokio::time::timeout(TURN_TIMEOUT, ws_turn(socket, &frame))
            .await
            .unwrap_or(Outcome::Dropped);
        tracing::debug!(session, ?outcome, "demo: ws turn");
        outcome
    }

    async fn ws_connect(&self, session: &str) -> Option<Ws> {
        let mut req = self.ws_url.as_str().into_client_request().ok()?;
        let headers = req.headers_mut();
        headers.insert(
            "authorization",
            format!("Bearer {}", self.key).parse().ok()?,
        );
        headers.insert("session_id", session.parse().ok()?);
        match tokio_tungstenite::connect_async(req).await {
            Ok((ws, _)) => Some(ws),
            Err(e) => {
                tracing::debug!(session, error = %e, "demo: websocket refused");
                None
            }
        }
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Sends one `response.create` and reads until its terminal event.
async fn ws_turn(ws: &mut Ws, frame: &Value) -> Outcome {
    if ws
        .send(Message::Text(frame.to_string().into()))
        .await
        .is_err()
    {
        return Outcome::Dropped;
    }
    let mut text = String::new();
    while let Some(msg) = ws.next().await {
        match msg {
            Ok(Message::Text(t)) => {
                let Ok(event) = serde_json::from_str::<Value>(t.as_str()) else {
                    continue;
                };
                if let Some(outcome) = on_event(&event, &mut text) {
                    return outcome;
                }
            }
            Ok(Message::Close(_)) | Err(_) => return Outcome::Dropped,
            Ok(_) => {}
        }
    }
    Outcome::Dropped
}

/// Follows one event; the outcome once it is terminal.
fn on_event(event: &Value, text: &mut String) -> Option<Outcome> {
    match event["type"].as_str()? {
        "response.output_text.delta" => {
            text.push_str(event["delta"].as_str().unwrap_or(""));
            None
        }
        "response.completed" => Some(Outcome::Completed {
            id: event["response"]["id"].as_str().unwrap_or("").to_string(),
            text: std::mem::take(text),
        }),
        "response.failed" | "response.incomplete" => Some(Outcome::Failed {
            code: event["response"]["error"]["code"]
                .as_str()
                .map(str::to_string),
        }),
        "error" => Some(Outcome::Failed {
            code: event["error"]["code"].as_str().map(str::to_string),
        }),
        _ => None,
    }
}

/// The body Codex sends (minus the tools), with `input` as given.
fn request_body(session: &str, input: Value) -> Value {
    json!({
        "model": MODEL,
        "instructions": "You are a coding agent in a switchyard demo.",
        "input": input,
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "low", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": session,
    })
}

fn user_message(rng: &mut Rng) -> Value {
    let prompt = PROMPTS
        .get(usize::try_from(rng.below(PROMPTS.len() as u64)).unwrap_or(0))
        .copied()
        .unwrap_or(PROMPTS[0]);
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]})
}

fn assistant_message(text: &str) -> Value {
    json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
}

/// A pause of `lo..hi` ms.
async fn pause(rng: &mut Rng, lo: u64, hi: u64) {
    let ms = lo + rng.below(hi.saturating_sub(lo).max(1));
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// xorshift64*: enough to make the synthetic users differ; not for anything secret.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = getrandom::u64().unwrap_or_else(|_| clock::system().now_ms());
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of a whole SSE text, as the synthetic client splits them.
    fn events(text: &[u8]) -> Vec<Piece> {
        let mut s = SseSplitter::new(MAX_EVENT);
        s.push(text);
        std::iter::from_fn(|| s.next_piece().unwrap()).collect()
    }

    #[test]
    fn sse_blocks_and_events_are_followed_to_the_terminal_one() {
        let mut text = String::new();
        assert_eq!(events(b": keep-alive\n\n"), vec![Piece::Comment]);
        let Piece::Event(delta) = events(b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi \"}\n\n").remove(0) else {
            panic!("not an event");
        };
        assert!(on_event(&delta.json().unwrap(), &mut text).is_none());
        let done = json!({"type": "response.completed", "response": {"id": "resp_1"}});
        match on_event(&done, &mut text) {
            Some(Outcome::Completed { id, text }) => {
                assert_eq!((id.as_str(), text.as_str()), ("resp_1", "hi "))
            }
            other => panic!("{other:?}"),
        }
        let failed = json!({"type": "error", "error": {"code": "previous_response_not_found"}});
        assert!(matches!(
            on_event(&failed, &mut text),
            Some(Outcome::Failed { code: Some(c) }) if c == "previous_response_not_found"
        ));
    }
}
